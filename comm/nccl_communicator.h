// NcclCommunicator: the GPU implementation of Communicator (comm/communicator.h) — device buffers,
// NCCL collectives enqueued on a communication stream (which the caller synchronises with compute
// through events). CUDA builds only.
//
// NCCL is loaded at run time (dlopen of libnccl.so.2: TRAINFLOW_NCCL_LIBRARY, NCCL_HOME/lib, the
// loader's search path, CUDA_HOME/lib, then PyTorch's nvidia-nccl wheel directories), so a binary
// without NCCL still trains on one GPU. Rank 0 creates the unique id and broadcasts it over MPI;
// uneven v-collectives are grouped point-to-point operations. A call returns when the collective
// is enqueued on stream(); Synchronize() waits for everything enqueued, polling with the timeout
// and aborting the NCCL communicator (ncclCommAbort) instead of hanging when a peer is gone.
// Bootstrap and loading: docs/distributed.md, "Communicators".
// Ownership: owns the NCCL communicator; the stream is borrowed. Thread safety: one thread.
#pragma once
#if defined(TF_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <memory>

#include "comm/communicator.h"

namespace tf::comm {

// True when libnccl.so.2 can be loaded; `why` says what was tried otherwise.
bool NcclAvailable(std::string* why = nullptr);
// "2.27.3 from /path/libnccl.so.2", or "not available: <what was tried>" (for `trainflow env`).
std::string NcclDescription();

class NcclCommunicator final : public Communicator {
 public:
  // REQUIRES: cudaSetDevice(device) was called by this thread; MPI initialised when world > 1.
  static StatusOr<std::unique_ptr<NcclCommunicator>> Create(const Topology& topology, cudaStream_t stream);
  ~NcclCommunicator() override;

  const char* name() const override { return "nccl"; }
  cudaStream_t stream() const { return stream_; }
  Status AllReduceSum(void* data, int64_t n, DataType dt) override;
  // In place: data = mean over ranks (ncclAvg), the same on every rank.
  Status AllReduceAverage(void* data, int64_t n, DataType dt);
  Status ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) override;
  Status AllGatherV(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) override;
  Status AllGather(const void* send, void* recv, size_t bytes) override;
  Status AllToAll(const void* send, void* recv, size_t bytes) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;
  // Waits for every operation enqueued so far (timeout_seconds(); aborts NCCL on timeout).
  Status Synchronize();

 private:
  // Marks the communicator failed and aborts NCCL (its kernels waiting for peers end); idempotent.
  void AbortNow();
  NcclCommunicator(int rank, int world, cudaStream_t stream) : Communicator(rank, world), stream_(stream) {}
  Status Check(int result, const char* what);

  void* comm_ = nullptr;  // ncclComm_t
  cudaStream_t stream_;
  bool failed_ = false;
};

}  // namespace tf::comm
#endif  // TF_WITH_CUDA
