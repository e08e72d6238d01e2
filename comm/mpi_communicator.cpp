#include "comm/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/format.h"
#include "base/progress.h"

#include "comm/mpi_util.h"

namespace tf::comm {

Status MpiError(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof(text), "MPI error %d", code);
  if (file != nullptr) return Status::Unavailable("{} failed: {} ({}:{})", expr, text, file, line);
  return Status::Unavailable("{} failed: {}", expr, text);
}

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kF32: return 4;
    case DataType::kF64: return 8;
    case DataType::kBF16: return 2;
    case DataType::kU8: return 1;
  }
  return 1;
}

// ---- SingleProcessCommunicator -------------------------------------------------------------

Status SingleProcessCommunicator::ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts,
                                                   DataType dt) {
  if (counts.size() != 1) return Status::InvalidArgument("reduce-scatter: {} counts for 1 rank", counts.size());
  if (send != recv) std::memmove(recv, send, static_cast<size_t>(counts[0]) * DataTypeSize(dt));
  return Status::OK();
}
Status SingleProcessCommunicator::AllGatherV(const void* send, void* recv, std::span<const int64_t> counts,
                                             DataType dt) {
  return ReduceScatterSum(send, recv, counts, dt);
}
Status SingleProcessCommunicator::AllGather(const void* send, void* recv, size_t bytes) {
  if (send != recv) std::memmove(recv, send, bytes);
  return Status::OK();
}
Status SingleProcessCommunicator::AllToAll(const void* send, void* recv, size_t bytes) {
  return AllGather(send, recv, bytes);
}
Status SingleProcessCommunicator::Broadcast(void*, size_t, int root) {
  if (root != 0) return Status::InvalidArgument("broadcast root {} is not a rank of a 1-rank group", root);
  return Status::OK();
}

StatusOr<std::unique_ptr<Communicator>> MakeHostCommunicator(const Topology& topology) {
  std::unique_ptr<Communicator> c;
  if (topology.world == 1 && !topology.mpi) {
    c = std::make_unique<SingleProcessCommunicator>();
  } else {
    TF_ASSIGN_OR_RETURN(auto mpi, MpiCommunicator::Create(MPI_COMM_WORLD));
    c = std::move(mpi);
  }
  TF_ASSIGN_OR_RETURN(const double timeout, CommTimeoutFromEnvironment());
  c->set_timeout_seconds(timeout);
  return c;
}

StatusOr<std::unique_ptr<Communicator>> MakeSplitCommunicator(const Topology& topology, int color) {
  if (color < 0) return Status::InvalidArgument("communicator split: negative color {}", color);
  if (!topology.mpi) {
    if (topology.world != 1) return Status::Internal("a {}-rank topology without MPI", topology.world);
    return MakeHostCommunicator(topology);
  }
  MPI_Comm split = MPI_COMM_NULL;
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_split(MPI_COMM_WORLD, color, topology.rank, &split));
  // MpiCommunicator::Create duplicates the split; this handle is freed either way.
  int size = 0;
  const int rc = MPI_Comm_size(split, &size);
  Status s = rc == MPI_SUCCESS ? Status::OK() : MpiError(rc, "MPI_Comm_size");
  std::unique_ptr<Communicator> c;
  if (s.ok() && size == 1) {
    c = std::make_unique<SingleProcessCommunicator>();
  } else if (s.ok()) {
    StatusOr<std::unique_ptr<MpiCommunicator>> mpi = MpiCommunicator::Create(split);
    if (mpi.ok()) c = std::move(*mpi);
    s = mpi.status();
  }
  MPI_Comm_free(&split);
  TF_RETURN_IF_ERROR(s);
  TF_ASSIGN_OR_RETURN(const double timeout, CommTimeoutFromEnvironment());
  c->set_timeout_seconds(timeout);
  return c;
}

StatusOr<int64_t> AllReduceSumIdentical(Communicator& comm, float* data, int64_t n, std::vector<float>* scratch) {
  const int W = comm.world(), me = comm.rank();
  if (W == 1 || n == 0) return int64_t{0};
  std::vector<int64_t> counts(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) counts[static_cast<size_t>(r)] = n * (r + 1) / W - n * r / W;
  const int64_t mine = counts[static_cast<size_t>(me)];
  if (static_cast<int64_t>(scratch->size()) < mine) scratch->resize(static_cast<size_t>(mine));
  TF_RETURN_IF_ERROR(comm.ReduceScatterSum(data, scratch->data(), counts, DataType::kF32));
  TF_RETURN_IF_ERROR(comm.AllGatherV(scratch->data(), data, counts, DataType::kF32));
  return ((n - mine) + mine * (W - 1)) * int64_t{4};
}

namespace {
std::mutex activity_mu;
std::string& ActivityLabel() {
  static std::string label;
  return label;
}
}  // namespace

void SetActivity(std::string what) {
  std::lock_guard<std::mutex> lock(activity_mu);
  ActivityLabel() = std::move(what);
}

std::string CurrentActivity() {
  std::lock_guard<std::mutex> lock(activity_mu);
  return ActivityLabel();
}

std::string ActivitySuffix() {
  const std::string a = CurrentActivity();
  return a.empty() ? "" : " (while " + a + ")";
}

StatusOr<double> CommTimeoutFromEnvironment() {
  const char* t = std::getenv("TRAINFLOW_COMM_TIMEOUT");
  if (t == nullptr || *t == '\0') return 300.0;
  char* end = nullptr;
  const double s = std::strtod(t, &end);
  if (end == t || *end != '\0' || !(s > 0)) {
    return Status::InvalidArgument("TRAINFLOW_COMM_TIMEOUT='{}' is not a positive number of seconds", t);
  }
  return s;
}

// ---- MpiCommunicator -------------------------------------------------------------------------

namespace {

MPI_Datatype ToMpi(DataType t) {
  switch (t) {
    case DataType::kF32: return MPI_FLOAT;
    case DataType::kF64: return MPI_DOUBLE;
    case DataType::kBF16: return MPI_UINT16_T;  // moved, never summed by MPI
    case DataType::kU8: return MPI_BYTE;
  }
  return MPI_BYTE;
}

}  // namespace

StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(MPI_Comm base) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return Status::Internal("MpiCommunicator needs MPI to be initialised (InitProcessGroup)");
  MPI_Comm comm = MPI_COMM_NULL;
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_dup(base, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank));
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &world));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(comm, rank, world));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A failed communicator may have a collective in flight; freeing it then could block.
  if (!finalized && !failed_.load() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiCommunicator::CheckUsable(const char* what) const {
  if (failed_.load()) {
    return Status::Unavailable("{}: the MPI communicator failed earlier (timeout or error) and cannot be used", what);
  }
  return Status::OK();
}

Status MpiCommunicator::Wait(MPI_Request* req, const char* what, size_t bytes) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  // Open MPI progresses transfers only inside MPI calls (TCP especially: a sleeping poller lets
  // socket buffers run dry), so poll continuously — yielding the core to compute threads — while a
  // collective is young; one that is still waiting after kSpin is waiting for a slow or stopped
  // peer, so poll with growing sleeps (at most 2 ms) instead of burning a core, and say so.
  constexpr auto kSpin = std::chrono::milliseconds(200);
  constexpr auto kWarnAfter = std::chrono::seconds(10);
  auto sleep = std::chrono::microseconds(50);
  bool warned = false;
  while (true) {
    int done = 0;
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      failed_ = true;
      return MpiError(rc, what);
    }
    if (done) return Status::OK();
    if (AbortRequested()) {
      failed_ = true;
      return Status::Unavailable("{} on rank {} of {}{} abandoned: {}", what, rank_, world_, ActivitySuffix(),
                                 AbortReason());
    }
    const auto now = Clock::now();
    if (now - start < kSpin) {
      std::this_thread::yield();
      continue;
    }
    if (now > deadline) {
      failed_ = true;
      return Status::DeadlineExceeded(
          "{} of {} on rank {} of {}{} did not complete within {:.0f} s (TRAINFLOW_COMM_TIMEOUT): a peer rank "
          "has probably died, hung or been stopped, or is running a different configuration",
          what, FormatBytes(bytes), rank_, world_, ActivitySuffix(), timeout_s_);
    }
    if (!warned && now - start > kWarnAfter) {
      warned = true;
      spdlog::warn("rank {} of {} has been waiting {:.0f} s for the other ranks to join the {} of {}{} (a peer may "
                   "be slow, stopped or hung); giving up after {:.0f} s (TRAINFLOW_COMM_TIMEOUT)",
                   rank_, world_, std::chrono::duration<double>(now - start).count(), what, FormatBytes(bytes),
                   ActivitySuffix(), timeout_s_);
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::microseconds(2000));
  }
}

Status MpiCommunicator::AllReduceSum(void* data, int64_t n, DataType dt) {
  TF_RETURN_IF_ERROR(CheckUsable("all-reduce"));
  if (dt == DataType::kBF16 || dt == DataType::kU8) {
    return Status::Unimplemented("MPI all-reduce sums fp32/fp64 only (bf16 is reduced by the reducer's codecs)");
  }
  const size_t es = DataTypeSize(dt);
  // MPI counts are int: reduce in chunks of at most 2^30 elements.
  for (int64_t off = 0; off < n; off += int64_t{1} << 30) {
    const int count = static_cast<int>(std::min<int64_t>(n - off, int64_t{1} << 30));
    MPI_Request req;
    TF_MPI_RETURN_IF_ERROR(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + off * es, count, ToMpi(dt),
                                          MPI_SUM, comm_, &req));
    TF_RETURN_IF_ERROR(Wait(&req, "all-reduce", static_cast<size_t>(count) * es));
  }
  return Status::OK();
}

namespace {

// int counts and displacements for the v-collectives; errors when a count exceeds MPI's int.
Status IntCounts(std::span<const int64_t> counts, int world, const char* what, std::vector<int>* c,
                 std::vector<int>* displs) {
  if (static_cast<int>(counts.size()) != world) {
    return Status::InvalidArgument("{}: {} counts for a world of {}", what, counts.size(), world);
  }
  int64_t off = 0;
  for (int64_t n : counts) {
    if (n < 0 || n > INT_MAX || off > INT_MAX || off + n > INT_MAX) {
      return Status::OutOfRange("{}: block of {} elements at {} exceeds MPI's int counts", what, n, off);
    }
    c->push_back(static_cast<int>(n));
    displs->push_back(static_cast<int>(off));
    off += n;
  }
  return Status::OK();
}

}  // namespace

namespace {

// out[i] = blocks[0][i] + blocks[1][i] + ... + blocks[W-1][i], added in that order, tile by tile
// (a tile stays in cache while each block is added; the adds vectorise across i, never across
// ranks). `out` may be one of the blocks: a tile is read completely before it is written.
template <typename T>
void SumInRankOrder(const std::vector<const T*>& blocks, int64_t n, T* out) {
  constexpr int64_t kTile = 2048;
  T acc[kTile];
  for (int64_t off = 0; off < n; off += kTile) {
    const int64_t len = std::min(kTile, n - off);
    const T* first = blocks[0] + off;
    for (int64_t i = 0; i < len; ++i) acc[i] = first[i];
    for (size_t r = 1; r < blocks.size(); ++r) {
      const T* x = blocks[r] + off;
      for (int64_t i = 0; i < len; ++i) acc[i] += x[i];
    }
    std::memcpy(out + off, acc, static_cast<size_t>(len) * sizeof(T));
  }
}

}  // namespace

Status MpiCommunicator::ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) {
  TF_RETURN_IF_ERROR(CheckUsable("reduce-scatter"));
  if (dt != DataType::kF32 && dt != DataType::kF64) {
    return Status::InvalidArgument("MPI reduce-scatter sums fp32/fp64 only");
  }
  if (static_cast<int>(counts.size()) != world_) {
    return Status::InvalidArgument("reduce-scatter: {} counts for a world of {}", counts.size(), world_);
  }
  // All-to-all-v: block r of send goes to rank r; this rank receives its block from every other
  // rank into scratch_ (its own stays in send) and adds the W blocks in rank order, so every
  // element's sum is x_0 + x_1 + ... + x_{W-1} whatever the partition. In rounds of at most
  // kScratchBytes of receive buffer: block r's elements [j*slice, (j+1)*slice) in round j, so a
  // large block owned by one rank (a ZeRO unit) needs no (W-1) x block buffer.
  constexpr size_t kScratchBytes = size_t{16} << 20;
  const size_t es = DataTypeSize(dt);
  const int64_t mine = counts[static_cast<size_t>(rank_)];
  std::vector<int64_t> offset(static_cast<size_t>(world_));
  int64_t total = 0, longest = 0;
  for (int r = 0; r < world_; ++r) {
    const int64_t n = counts[static_cast<size_t>(r)];
    if (n < 0) return Status::InvalidArgument("reduce-scatter: negative count {} for rank {}", n, r);
    offset[static_cast<size_t>(r)] = total;
    total += n;
    longest = std::max(longest, n);
  }
  if (total > INT_MAX) {
    return Status::InvalidArgument("reduce-scatter: {} elements exceed MPI's int displacements (reduce-scatter in "
                                   "pieces of under 2^31 elements)",
                                   total);
  }
  const int64_t slice =
      std::max<int64_t>(1024, static_cast<int64_t>(kScratchBytes / es / static_cast<size_t>(std::max(1, world_ - 1))));
  const int64_t rounds = longest == 0 ? 0 : (longest + slice - 1) / slice;
  const size_t scratch_bytes = static_cast<size_t>(std::min(mine, slice)) * static_cast<size_t>(world_ - 1) * es;
  if (scratch_.size() * sizeof(double) < scratch_bytes) {
    try {
      scratch_.resize((scratch_bytes + sizeof(double) - 1) / sizeof(double));
    } catch (const std::bad_alloc&) {
      return Status::InvalidArgument("reduce-scatter: out of memory for {} of receive buffers",
                                     FormatBytes(scratch_bytes));
    }
  }
  const auto slot = [&](int r) -> int64_t { return r < rank_ ? r : r - 1; };  // no slot for this rank
  std::vector<int> send_counts(static_cast<size_t>(world_)), send_displs(static_cast<size_t>(world_));
  std::vector<int> recv_counts(static_cast<size_t>(world_)), recv_displs(static_cast<size_t>(world_));
  for (int64_t j = 0; j < rounds; ++j) {
    const auto part = [&](int r) {  // round j's elements of block r
      return std::clamp<int64_t>(counts[static_cast<size_t>(r)] - j * slice, 0, slice);
    };
    const int64_t here = part(rank_);
    for (int r = 0; r < world_; ++r) {
      const bool self = r == rank_;
      send_counts[static_cast<size_t>(r)] = self ? 0 : static_cast<int>(part(r));
      send_displs[static_cast<size_t>(r)] = static_cast<int>(offset[static_cast<size_t>(r)] + std::min(j * slice, counts[static_cast<size_t>(r)]));
      recv_counts[static_cast<size_t>(r)] = self ? 0 : static_cast<int>(here);
      recv_displs[static_cast<size_t>(r)] = self ? 0 : static_cast<int>(slot(r) * here);
    }
    MPI_Request req;
    TF_MPI_RETURN_IF_ERROR(MPI_Ialltoallv(send, send_counts.data(), send_displs.data(), ToMpi(dt), scratch_.data(),
                                          recv_counts.data(), recv_displs.data(), ToMpi(dt), comm_, &req));
    TF_RETURN_IF_ERROR(Wait(&req, "reduce-scatter", static_cast<size_t>(total) * es));
    const auto sum = [&](auto* typed_recv) {
      using T = std::remove_pointer_t<decltype(typed_recv)>;
      std::vector<const T*> blocks(static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r) {
        blocks[static_cast<size_t>(r)] =
            r == rank_ ? static_cast<const T*>(send) + offset[static_cast<size_t>(rank_)] + j * slice
                       : reinterpret_cast<const T*>(scratch_.data()) + slot(r) * here;
      }
      SumInRankOrder(blocks, here, typed_recv + j * slice);
    };
    if (here == 0) continue;
    if (dt == DataType::kF32) {
      sum(static_cast<float*>(recv));
    } else {
      sum(static_cast<double*>(recv));
    }
  }
  return Status::OK();
}

Status MpiCommunicator::AllGatherV(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) {
  TF_RETURN_IF_ERROR(CheckUsable("all-gather"));
  std::vector<int> c, displs;
  TF_RETURN_IF_ERROR(IntCounts(counts, world_, "all-gather", &c, &displs));
  // In place (send is this rank's block of recv, as a ZeRO shard is): MPI wants MPI_IN_PLACE there.
  const bool in_place =
      send == static_cast<const char*>(recv) + static_cast<size_t>(displs[static_cast<size_t>(rank_)]) * DataTypeSize(dt);
  MPI_Request req;
  TF_MPI_RETURN_IF_ERROR(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, c[static_cast<size_t>(rank_)], ToMpi(dt),
                                         recv, c.data(), displs.data(), ToMpi(dt), comm_, &req));
  return Wait(&req, "all-gather",
              (static_cast<size_t>(displs.back()) + static_cast<size_t>(c.back())) * DataTypeSize(dt));
}

Status MpiCommunicator::AllGather(const void* send, void* recv, size_t bytes) {
  TF_RETURN_IF_ERROR(CheckUsable("all-gather"));
  if (bytes > INT_MAX) return Status::OutOfRange("all-gather of {} bytes per rank exceeds MPI's int count", bytes);
  MPI_Request req;
  TF_MPI_RETURN_IF_ERROR(
      MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, comm_, &req));
  return Wait(&req, "all-gather", bytes * static_cast<size_t>(world_));
}

Status MpiCommunicator::AllToAll(const void* send, void* recv, size_t bytes) {
  TF_RETURN_IF_ERROR(CheckUsable("all-to-all"));
  if (bytes > INT_MAX) return Status::OutOfRange("all-to-all of {} bytes per rank exceeds MPI's int count", bytes);
  MPI_Request req;
  TF_MPI_RETURN_IF_ERROR(
      MPI_Ialltoall(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, comm_, &req));
  return Wait(&req, "all-to-all", bytes * static_cast<size_t>(world_));
}

Status MpiCommunicator::Broadcast(void* data, size_t bytes, int root) {
  TF_RETURN_IF_ERROR(CheckUsable("broadcast"));
  if (root < 0 || root >= world_) return Status::InvalidArgument("broadcast root {} is not in [0, {})", root, world_);
  for (size_t off = 0; off < bytes; off += size_t{1} << 30) {
    const int count = static_cast<int>(std::min<size_t>(bytes - off, size_t{1} << 30));
    MPI_Request req;
    TF_MPI_RETURN_IF_ERROR(MPI_Ibcast(static_cast<char*>(data) + off, count, MPI_BYTE, root, comm_, &req));
    TF_RETURN_IF_ERROR(Wait(&req, "broadcast", static_cast<size_t>(count)));
  }
  return Status::OK();
}

Status MpiCommunicator::Barrier() {
  TF_RETURN_IF_ERROR(CheckUsable("barrier"));
  MPI_Request req;
  TF_MPI_RETURN_IF_ERROR(MPI_Ibarrier(comm_, &req));
  return Wait(&req, "barrier", 0);
}

}  // namespace tf::comm
