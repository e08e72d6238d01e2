// DeviceGradientReducer: the GPU counterpart of GradientReducer (comm/reducer.h) — averages a flat
// device gradient buffer (fp32 or bf16) over the ranks of an NcclCommunicator, bucket by bucket,
// overlapping with the backward pass. CUDA builds only.
//
// Buckets are planned as on the CPU. MarkReady() is called on the host once the kernels that
// finish a range are *enqueued*; a complete bucket is reduced on the communication stream after an
// event on the compute stream (none: one ncclAvg all-reduce in the gradients' dtype; lossy codecs:
// the host reducer's algorithms with the fused CUDA codec kernels, bf16 staged through fp32).
// Finish() makes the compute stream wait for the communication stream: no host synchronisation.
// LastStats() (exposed communication time, from CUDA events) is valid once the compute stream has
// passed Finish()'s wait, and synchronises on the events.
// Ordering and codecs: docs/distributed.md, "comm/device_reducer.h".
//
// Thread safety: one host thread. Not copyable.
#pragma once
#if defined(TF_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "comm/auto_codec.h"
#include "comm/nccl_communicator.h"
#include "comm/grad_sync.h"
#include "comm/reducer.h"
#include "kernels/cuda_runtime.h"

namespace tf::comm {

class DeviceGradientReducer final : public GradientSync {
 public:
  // grads: device buffer of n elements of `dt` (kF32 or kBF16), outliving the reducer.
  static StatusOr<std::unique_ptr<DeviceGradientReducer>> Create(
      NcclCommunicator* comm, void* grads, DataType dt, int64_t n,
      const std::vector<std::pair<int64_t, int64_t>>& ready_order, const ReducerOptions& options,
      cudaStream_t compute_stream);
  ~DeviceGradientReducer() override;
  DeviceGradientReducer(const DeviceGradientReducer&) = delete;
  DeviceGradientReducer& operator=(const DeviceGradientReducer&) = delete;

  // The reducer owns `comm` from now on (and is destroyed before it).
  void AdoptCommunicator(std::unique_ptr<NcclCommunicator> comm) { owned_comm_ = std::move(comm); }

  void BeginStep(int64_t step) override;
  // [begin, end) is final once the compute-stream work enqueued so far has run.
  void MarkReady(int64_t begin, int64_t end) override;
  // Enqueues the compute stream's wait for every bucket, then waits for the reduction with the
  // communicator's deadline and NCCL's asynchronous errors (the optimizer that follows synchronises
  // on the gradient norm anyway). Errors: an NCCL/CUDA call failed or timed out, or a range was never
  // marked ready.
  Status Finish() override;
  // Stats of the last finished step (synchronises on its events).
  StatusOr<ReducerStats> LastStats() override;
  const std::vector<Bucket>& buckets() const override { return buckets_; }
  const ReducerOptions& options() const override { return options_; }
  std::pair<int64_t, int64_t> state_sizes() const override {
    return {static_cast<int64_t>(residual_.bytes() / 4), static_cast<int64_t>(server_.bytes() / 4)};
  }
  // Device <-> host copies of the fp32 residuals (synchronous).
  Status GetState(std::vector<float>* residual, std::vector<float>* server) override;
  Status SetState(std::span<const float> residual, std::span<const float> server) override;

 private:
  DeviceGradientReducer() = default;
  Status LaunchBucket(size_t i);
  Status ReduceDense(const Bucket& b, float* x, uint64_t seed);
  Status ReduceSparse(const Bucket& b, float* x, uint64_t seed);

  ReducerOptions options_;
  int64_t step_ = 0;
  // Lossy codecs only (device memory): fp32 staging for bf16 gradients, error-feedback residuals,
  // encoded send/receive buffers, the owner's fp32 shard.
  ::tf::cuda::DeviceBuffer work_, residual_, server_, send_, recv_, shard_;
  size_t most_bytes_ = 0;  // per-rank encoded block size for the dense all-to-all/all-gather

  std::unique_ptr<NcclCommunicator> owned_comm_;  // when adopted (AdoptCommunicator)
  NcclCommunicator* comm_ = nullptr;
  char* grads_ = nullptr;
  DataType dt_ = DataType::kF32;
  int64_t n_ = 0;
  cudaStream_t compute_ = nullptr;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> pending_;
  std::vector<cudaEvent_t> ready_events_;  // one per bucket (compute stream)
  cudaEvent_t backward_end_ = nullptr, comm_end_ = nullptr;  // timing
  Status error_;
  int launched_ = 0;
  int64_t wire_bytes_ = 0;
};

// `compression: auto` on GPUs: times none, bf16 and int8 through a DeviceGradientReducer on a
// probe of min(grad_elements, 4M) elements (median of 3 after a warm-up, scaled), rank 0's
// timings broadcast over `host`, then comm::DecideCodec (comm/auto_codec.h). Collective.
StatusOr<CodecChoice> ChooseDeviceCodec(NcclCommunicator* nccl, Communicator* host, DataType dt, int64_t grad_elements,
                                        const ReducerOptions& base, cudaStream_t compute_stream);

}  // namespace tf::comm
#endif  // TF_WITH_CUDA
