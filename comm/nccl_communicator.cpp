#if defined(TF_WITH_CUDA)
#include "comm/nccl_communicator.h"

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/dynlib.h"
#include "base/progress.h"
#include "comm/mpi_util.h"
#include "kernels/cuda_runtime.h"

namespace tf::comm {
namespace {

// The NCCL entry points TrainFlow uses, resolved from libnccl.so.2 at run time.
struct Nccl {
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRank) CommInitRank = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclBroadcast) Broadcast = nullptr;
  decltype(&ncclReduce) Reduce = nullptr;
  decltype(&ncclSend) Send = nullptr;
  decltype(&ncclRecv) Recv = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
  decltype(&ncclGetVersion) GetVersion = nullptr;
  std::string error;  // why loading failed ("" when loaded)
  std::string path;   // what was loaded
};

const Nccl& LoadNccl() {
  static Nccl* nccl = [] {
    auto* n = new Nccl();
    // A loaded NCCL stays open for the process lifetime.
    static DynamicLibrary* lib = nullptr;
    auto resolve = [n](const DynamicLibrary& l) -> Status {
      TF_RETURN_IF_ERROR(l.Resolve(&n->GetUniqueId, "ncclGetUniqueId"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->CommInitRank, "ncclCommInitRank"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->CommDestroy, "ncclCommDestroy"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->CommAbort, "ncclCommAbort"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->CommGetAsyncError, "ncclCommGetAsyncError"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->GetErrorString, "ncclGetErrorString"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->AllReduce, "ncclAllReduce"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->ReduceScatter, "ncclReduceScatter"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->AllGather, "ncclAllGather"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->Broadcast, "ncclBroadcast"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->Reduce, "ncclReduce"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->Send, "ncclSend"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->Recv, "ncclRecv"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->GroupStart, "ncclGroupStart"));
      TF_RETURN_IF_ERROR(l.Resolve(&n->GroupEnd, "ncclGroupEnd"));
      return l.Resolve(&n->GetVersion, "ncclGetVersion");
    };
    LibrarySearch search{.name = "libnccl.so.2",
                         .override_env = "TRAINFLOW_NCCL_LIBRARY",
                         .candidates = NvidiaLibraryCandidates("libnccl.so.2", "NCCL_HOME", "nccl"),
                         .hint = "install NCCL or set TRAINFLOW_NCCL_LIBRARY"};
    search.candidates.insert(search.candidates.begin() + 1, "libnccl.so");
    auto loaded = LoadLibrary(search, resolve);
    if (!loaded.ok()) {
      *n = Nccl();
      n->error = loaded.status().message();
      return n;
    }
    lib = new DynamicLibrary(std::move(loaded).value());
    n->path = lib->path();
    return n;
  }();
  return *nccl;
}

ncclDataType_t ToNccl(DataType t) {
  switch (t) {
    case DataType::kF32: return ncclFloat32;
    case DataType::kF64: return ncclFloat64;
    case DataType::kBF16: return ncclBfloat16;
    case DataType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

}  // namespace

std::string NcclDescription() {
  const Nccl& n = LoadNccl();
  if (n.GetUniqueId == nullptr) return "not available: " + n.error;
  int version = 0;
  if (n.GetVersion(&version) != ncclSuccess) return fmt::format("loaded from {} (version unknown)", n.path);
  return fmt::format("{}.{}.{} from {}", version / 10000, version / 100 % 100, version % 100, n.path);
}

bool NcclAvailable(std::string* why) {
  const Nccl& n = LoadNccl();
  if (why != nullptr) *why = n.error;
  return n.GetUniqueId != nullptr;
}

Status NcclCommunicator::Check(int result, const char* what) {
  if (result == ncclSuccess) return Status::OK();
  failed_ = true;
  const Nccl& n = LoadNccl();
  return Status::Unavailable("NCCL {} failed: {}", what, n.GetErrorString(static_cast<ncclResult_t>(result)));
}

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(const Topology& topology, cudaStream_t stream) {
  const Nccl& n = LoadNccl();
  if (n.GetUniqueId == nullptr) return Status::Unimplemented("NCCL is needed for multi-GPU training: {}", n.error);
  ncclUniqueId id{};
  if (topology.rank == 0) {
    const ncclResult_t r = n.GetUniqueId(&id);
    if (r != ncclSuccess) return Status::Internal("ncclGetUniqueId failed: {}", n.GetErrorString(r));
  }
  if (topology.world > 1) {
    TF_MPI_RETURN_IF_ERROR(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
  }
  int version = 0;
  if (n.GetVersion(&version) != ncclSuccess || version < 21000) {
    return Status::Unimplemented("NCCL {} is too old: TrainFlow needs 2.10 or newer (ncclAvg)", version);
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(topology.rank, topology.world, stream));
  TF_ASSIGN_OR_RETURN(const double timeout, CommTimeoutFromEnvironment());
  c->set_timeout_seconds(timeout);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = n.CommInitRank(&comm, topology.world, id, topology.rank);
  if (r != ncclSuccess) {
    return Status::Unavailable("ncclCommInitRank (rank {} of {}) failed: {}", topology.rank, topology.world,
                            n.GetErrorString(r));
  }
  c->comm_ = comm;
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  const Nccl& n = LoadNccl();
  if (failed_) {
    n.CommAbort(static_cast<ncclComm_t>(comm_));
  } else {
    n.CommDestroy(static_cast<ncclComm_t>(comm_));
  }
}

void NcclCommunicator::AbortNow() {
  failed_ = true;
  if (comm_ != nullptr) LoadNccl().CommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

Status NcclCommunicator::AllReduceSum(void* data, int64_t count, DataType dt) {
  const Nccl& n = LoadNccl();
  return Check(n.AllReduce(data, data, static_cast<size_t>(count), ToNccl(dt), ncclSum,
                           static_cast<ncclComm_t>(comm_), stream_),
               "all-reduce");
}

Status NcclCommunicator::AllReduceAverage(void* data, int64_t count, DataType dt) {
  const Nccl& n = LoadNccl();
  return Check(n.AllReduce(data, data, static_cast<size_t>(count), ToNccl(dt), ncclAvg,
                           static_cast<ncclComm_t>(comm_), stream_),
               "all-reduce (average)");
}

Status NcclCommunicator::ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) {
  if (static_cast<int>(counts.size()) != world_) {
    return Status::InvalidArgument("reduce-scatter: {} counts for a world of {}", counts.size(), world_);
  }
  const Nccl& n = LoadNccl();
  auto* comm = static_cast<ncclComm_t>(comm_);
  bool even = true;
  for (int64_t c : counts) even = even && c == counts[0];
  if (even) {
    return Check(n.ReduceScatter(send, recv, static_cast<size_t>(counts[0]), ToNccl(dt), ncclSum, comm, stream_),
                 "reduce-scatter");
  }
  // Uneven blocks: one reduce per block to its owner, grouped.
  const size_t es = DataTypeSize(dt);
  TF_RETURN_IF_ERROR(Check(n.GroupStart(), "group start"));
  int64_t off = 0;
  for (int r = 0; r < world_; ++r) {
    const int64_t c = counts[static_cast<size_t>(r)];
    n.Reduce(static_cast<const char*>(send) + off * static_cast<int64_t>(es), r == rank_ ? recv : nullptr,
             static_cast<size_t>(c), ToNccl(dt), ncclSum, r, comm, stream_);
    off += c;
  }
  return Check(n.GroupEnd(), "reduce-scatter (grouped reduces)");
}

Status NcclCommunicator::AllGatherV(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) {
  if (static_cast<int>(counts.size()) != world_) {
    return Status::InvalidArgument("all-gather: {} counts for a world of {}", counts.size(), world_);
  }
  const Nccl& n = LoadNccl();
  auto* comm = static_cast<ncclComm_t>(comm_);
  const size_t es = DataTypeSize(dt);
  TF_RETURN_IF_ERROR(Check(n.GroupStart(), "group start"));
  int64_t off = 0;
  for (int r = 0; r < world_; ++r) {
    const int64_t c = counts[static_cast<size_t>(r)];
    n.Broadcast(send, static_cast<char*>(recv) + off * static_cast<int64_t>(es), static_cast<size_t>(c), ToNccl(dt), r,
                comm, stream_);
    off += c;
  }
  return Check(n.GroupEnd(), "all-gather (grouped broadcasts)");
}

Status NcclCommunicator::AllGather(const void* send, void* recv, size_t bytes) {
  const Nccl& n = LoadNccl();
  return Check(n.AllGather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(comm_), stream_), "all-gather");
}

Status NcclCommunicator::AllToAll(const void* send, void* recv, size_t bytes) {
  const Nccl& n = LoadNccl();
  auto* comm = static_cast<ncclComm_t>(comm_);
  TF_RETURN_IF_ERROR(Check(n.GroupStart(), "group start"));
  for (int r = 0; r < world_; ++r) {
    n.Send(static_cast<const char*>(send) + bytes * static_cast<size_t>(r), bytes, ncclUint8, r, comm, stream_);
    n.Recv(static_cast<char*>(recv) + bytes * static_cast<size_t>(r), bytes, ncclUint8, r, comm, stream_);
  }
  return Check(n.GroupEnd(), "all-to-all");
}

Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_) return Status::InvalidArgument("broadcast root {} is not in [0, {})", root, world_);
  const Nccl& n = LoadNccl();
  return Check(n.Broadcast(data, data, bytes, ncclUint8, root, static_cast<ncclComm_t>(comm_), stream_), "broadcast");
}

Status NcclCommunicator::Barrier() {
  // A one-element all-reduce on the stream, then wait for it.
  const Nccl& n = LoadNccl();
  void* scratch = nullptr;
  TF_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&scratch, sizeof(float), stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, sizeof(float), stream_));
  Status s = Check(n.AllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm_), stream_),
                   "barrier");
  TF_CUDA_RETURN_IF_ERROR(cudaFreeAsync(scratch, stream_));
  TF_RETURN_IF_ERROR(s);
  return Synchronize();
}

Status NcclCommunicator::Synchronize() {
  if (failed_) return Status::Unavailable("the NCCL communicator failed earlier and cannot be used");
  const Nccl& n = LoadNccl();
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  bool warned = false;
  auto sleep = std::chrono::microseconds(20);
  while (true) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return Status::OK();
    if (q != cudaErrorNotReady) return cuda::CudaError(q, "cudaStreamQuery(comm stream)", __FILE__, __LINE__);
    ncclResult_t async = ncclSuccess;
    n.CommGetAsyncError(static_cast<ncclComm_t>(comm_), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      failed_ = true;
      return Status::Unavailable("NCCL reported an asynchronous error: {}", n.GetErrorString(async));
    }
    if (AbortRequested()) {
      AbortNow();
      return Status::Unavailable("NCCL collectives on rank {} of {}{} abandoned: {}", rank_, world_, ActivitySuffix(),
                                 AbortReason());
    }
    if (Clock::now() > deadline) {
      // Aborting ends the kernels still waiting for peers, so the device is usable again.
      AbortNow();
      return Status::DeadlineExceeded("NCCL collectives on rank {} of {}{} did not complete within {:.0f} s "
                                      "(TRAINFLOW_COMM_TIMEOUT): a peer rank has probably died, hung or been stopped",
                                      rank_, world_, ActivitySuffix(), timeout_s_);
    }
    if (!warned && Clock::now() - start > std::chrono::seconds(10)) {
      warned = true;
      spdlog::warn("rank {} of {} has been waiting 10 s for its NCCL collectives{} (a peer may be slow, stopped or "
                   "hung); giving up after {:.0f} s (TRAINFLOW_COMM_TIMEOUT)",
                   rank_, world_, ActivitySuffix(), timeout_s_);
    }
    // Poll quickly while the collectives are young, then back off (at most 2 ms between polls).
    std::this_thread::sleep_for(sleep);
    if (Clock::now() - start > std::chrono::milliseconds(200)) {
      sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::microseconds(2000));
    }
  }
}

}  // namespace tf::comm
#endif  // TF_WITH_CUDA
