// libcuemu_nccl.so: the NCCL entry points TrainFlow uses (comm/nccl_communicator.cpp), implemented
// over MPI for the CUDA emulator (tests/emulator/cuemu.h), where "device" buffers are host memory
// and every stream operation runs when it is issued. comm/ loads it like the real library:
// TRAINFLOW_NCCL_LIBRARY=<path of this .so>. With it, the GPU data-parallel path (NcclCommunicator,
// DeviceGradientReducer, the CUDA codecs) runs under `mpirun -np N` on CPU ranks.
//
// Semantics follow NCCL's documentation: every rank gets the same result (reductions gather all
// ranks' contributions and sum them in rank order, in float for fp32/bf16/fp16, then round once),
// ncclAvg divides the sum by the rank count, in-place operations are sendbuff == recvbuff (for
// AllGather/ReduceScatter at the rank's offset), point-to-point operations inside
// ncclGroupStart/End are posted together at ncclGroupEnd (so a group with both a send and a receive
// between two ranks cannot deadlock; outside a group each is its own group, as in NCCL).
// Collectives inside a group run when called (every rank calls them in the same order).
// The communicator is a duplicate of MPI_COMM_WORLD, so nranks must be the world size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <vector>

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0;
  int nranks = 1;
};

namespace {

struct P2p {
  bool send;
  void* buf;
  int bytes;
  int peer;
  MPI_Comm comm;
};
thread_local int t_group_depth = 0;
thread_local std::vector<P2p> t_pending;

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

double Load(const void* p, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return static_cast<const int8_t*>(p)[i];
    case ncclUint8: return static_cast<const uint8_t*>(p)[i];
    case ncclInt32: return static_cast<const int32_t*>(p)[i];
    case ncclUint32: return static_cast<const uint32_t*>(p)[i];
    case ncclInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case ncclUint64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case ncclFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case ncclBfloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ncclFloat32: return static_cast<const float*>(p)[i];
    case ncclFloat64: return static_cast<const double*>(p)[i];
    default: return 0;
  }
}
void Store(void* p, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case ncclUint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case ncclInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case ncclUint32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); break;
    case ncclInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case ncclUint64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); break;
    case ncclFloat16: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); break;
    case ncclBfloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
    case ncclFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case ncclFloat64: static_cast<double*>(p)[i] = v; break;
    default: break;
  }
}
bool IsFloat(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32; }

// out[i] = op over ranks r (in rank order) of all[r * stride + offset + i], i < count.
void ReduceInto(void* out, const std::vector<unsigned char>& all, size_t stride_elems, size_t offset, size_t count,
                ncclDataType_t t, ncclRedOp_t op, int nranks) {
  const size_t es = TypeSize(t);
  for (size_t i = 0; i < count; ++i) {
    // Floating types accumulate in float (NCCL's reduction arithmetic); others in double.
    double acc = 0;
    float facc = 0;
    for (int r = 0; r < nranks; ++r) {
      const double v = Load(all.data() + (r * stride_elems + offset) * es, i, t);
      if (IsFloat(t)) {
        const float f = static_cast<float>(v);
        if (r == 0) facc = f;
        else if (op == ncclSum || op == ncclAvg) facc += f;
        else if (op == ncclProd) facc *= f;
        else if (op == ncclMax) facc = f > facc ? f : facc;
        else if (op == ncclMin) facc = f < facc ? f : facc;
      } else {
        if (r == 0) acc = v;
        else if (op == ncclSum || op == ncclAvg) acc += v;
        else if (op == ncclProd) acc *= v;
        else if (op == ncclMax) acc = v > acc ? v : acc;
        else if (op == ncclMin) acc = v < acc ? v : acc;
      }
    }
    if (IsFloat(t)) {
      if (op == ncclAvg) facc /= static_cast<float>(nranks);
      Store(out, i, t, facc);
    } else {
      if (op == ncclAvg) acc /= nranks;
      Store(out, i, t, acc);
    }
  }
}

ncclResult_t Check(ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op = ncclSum) {
  if (comm == nullptr || comm->mpi == MPI_COMM_NULL) return ncclInvalidArgument;
  if (TypeSize(t) == 0) return ncclInvalidArgument;
  if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin && op != ncclAvg) return ncclInvalidArgument;
  return ncclSuccess;
}

// Every rank's `bytes` from `send`, concatenated in rank order.
std::vector<unsigned char> GatherAll(const void* send, size_t bytes, ncclComm_t comm) {
  std::vector<unsigned char> all(bytes * comm->nranks);
  MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE, comm->mpi);
  return all;
}

ncclResult_t FlushPending() {
  std::vector<MPI_Request> reqs(t_pending.size());
  for (size_t i = 0; i < t_pending.size(); ++i) {
    const P2p& p = t_pending[i];
    if (p.send) {
      MPI_Isend(p.buf, p.bytes, MPI_BYTE, p.peer, 7301, p.comm, &reqs[i]);
    } else {
      MPI_Irecv(p.buf, p.bytes, MPI_BYTE, p.peer, 7301, p.comm, &reqs[i]);
    }
  }
  t_pending.clear();
  const int rc = MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = 22809;  // reports itself as NCCL 2.28.9 (the version the build machine ships)
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error (cuemu NCCL)";
    case ncclInvalidArgument: return "invalid argument (cuemu NCCL)";
    case ncclSystemError: return "MPI call failed (cuemu NCCL)";
    case ncclInvalidUsage: return "invalid usage (cuemu NCCL)";
    default: return "error (cuemu NCCL)";
  }
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, "cuemu-nccl", 10);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init || std::memcmp(id.internal, "cuemu-nccl", 10) != 0) return ncclInvalidUsage;
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (nranks != world || rank != me) return ncclInvalidArgument;
  auto* c = new ncclComm();
  MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
  c->rank = rank;
  c->nranks = nranks;
  *comm = c;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  if (comm == nullptr) return ncclInvalidArgument;
  *err = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t) {
  if (ncclResult_t r = Check(comm, t, op); r != ncclSuccess) return r;
  const auto all = GatherAll(send, count * TypeSize(t), comm);
  ReduceInto(recv, all, count, 0, count, t, op, comm->nranks);
  return ncclSuccess;
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t) {
  if (ncclResult_t r = Check(comm, t, op); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  const auto all = GatherAll(send, count * TypeSize(t), comm);
  if (comm->rank == root) ReduceInto(recv, all, count, 0, count, t, op, comm->nranks);
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t) {
  if (ncclResult_t r = Check(comm, t, op); r != ncclSuccess) return r;
  const size_t n = recvcount * comm->nranks;
  const auto all = GatherAll(send, n * TypeSize(t), comm);
  ReduceInto(recv, all, n, recvcount * comm->rank, recvcount, t, op, comm->nranks);
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t) {
  if (ncclResult_t r = Check(comm, t); r != ncclSuccess) return r;
  const size_t bytes = sendcount * TypeSize(t);
  const auto all = GatherAll(send, bytes, comm);  // (in place: send is recv + rank * bytes)
  std::memcpy(recv, all.data(), all.size());
  return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t) {
  if (ncclResult_t r = Check(comm, t); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  const size_t bytes = count * TypeSize(t);
  if (comm->rank == root && send != recv) std::memmove(recv, send, bytes);
  MPI_Bcast(recv, static_cast<int>(bytes), MPI_BYTE, root, comm->mpi);
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t) {
  if (ncclResult_t r = Check(comm, t); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
  t_pending.push_back(P2p{true, const_cast<void*>(send), static_cast<int>(count * TypeSize(t)), peer, comm->mpi});
  return t_group_depth > 0 ? ncclSuccess : FlushPending();
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t) {
  if (ncclResult_t r = Check(comm, t); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
  t_pending.push_back(P2p{false, recv, static_cast<int>(count * TypeSize(t)), peer, comm->mpi});
  return t_group_depth > 0 ? ncclSuccess : FlushPending();
}
ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth > 0) return ncclSuccess;
  return FlushPending();
}

}  // extern "C"
