// TrainBackend: what the Trainer needs from a device — forward/backward on micro-batches, the
// optimizer step, and fp32 host copies of the parameters — with one implementation per backend:
//   CPU   model/gpt2.h (GPT2) + engine/optimizer.h (AdamW), all in host memory.
//   CUDA  model/gpt2_cuda.h (GPT2Cuda): device memory, bf16 or fp32 storage, fused AdamW.
// The data-parallel reducer works on host gradients (host_grads(), CPU backend) for now.
//
// Ownership: a backend owns its model and optimizer state. Thread safety: one thread drives it.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "comm/auto_codec.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "kernels/optimizer.h"
#include "kernels/status.h"
#include "model/config.h"
#include "model/gpt2.h"
#include "model/parameters.h"

namespace tf {

class TrainBackend {
 public:
  virtual ~TrainBackend() = default;
  // "cpu (2 threads)", "cuda:0 NVIDIA H200 (sm_90, ...), bf16".
  virtual std::string Describe() const = 0;
  virtual const ParameterLayout& layout() const = 0;

  virtual Status ZeroGrad() = 0;
  // Accumulates the gradient of (mean loss * grad_scale); returns the micro-batch's mean loss.
  virtual StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                          float grad_scale) = 0;
  virtual StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  // The training loop's form: as ForwardBackward, with the micro-batch's mean loss added to an
  // accumulator read (and reset) by TakeLossSum() once per step — on a device this avoids a host
  // synchronisation per micro-batch.
  virtual Status ForwardBackwardAccumulate(const int32_t* inputs, const int32_t* targets, int B, int T,
                                           float grad_scale) {
    TF_ASSIGN_OR_RETURN(const float loss, ForwardBackward(inputs, targets, B, T, grad_scale));
    loss_sum_ += loss;
    return Status::OK();
  }
  virtual StatusOr<double> TakeLossSum() { return std::exchange(loss_sum_, 0.0); }
  // Global-norm clip + AdamW on the (already averaged) gradients; returns the norm before clipping.
  virtual StatusOr<float> OptimizerStep(double lr, int64_t t) = 0;

  // fp32 parameters in ParameterLayout order (a device backend copies).
  virtual Status GetParams(std::span<float> out) = 0;
  virtual Status SetParams(std::span<const float> in) = 0;

  // Host gradient/parameter buffers the data-parallel reducer and broadcasts work on in place,
  // and the hook announcing final gradient ranges (model/parameters.h GradReadyRanges). Empty
  // spans / ignored hook where the backend keeps them on a device.
  virtual std::span<float> host_grads() = 0;
  virtual std::span<float> host_params() = 0;
  virtual void SetGradReadyHook(GPT2::GradReadyHook hook) = 0;

  // Data parallelism for backends whose gradients live on a device (CUDA: NCCL communicator and
  // comm/device_reducer.h, owned by the backend). Unimplemented by default.
  virtual Status SetUpDeviceDataParallel(const comm::Topology& topology, const comm::ReducerOptions& options) {
    return Status::Unimplemented("{} keeps gradients on the host", Describe());
  }
  // Per step: Begin, then the last micro-step's backward feeds the reducer (set_reduce_on_backward),
  // then Finish (enqueues the compute stream's wait; no host sync), and after the optimizer step
  // the stats of the reduction.
  // `compression: auto` measured on the device (collective; `host` carries rank 0's timings).
  virtual StatusOr<comm::CodecChoice> ChooseDeviceCodec(const comm::Topology& topology,
                                                        const comm::ReducerOptions& options,
                                                        comm::Communicator* host) {
    return Status::Unimplemented("{} keeps gradients on the host", Describe());
  }
  virtual void BeginDeviceReduction(int64_t step) {}
  virtual void set_reduce_on_backward(bool on) {}
  virtual Status FinishDeviceReduction() { return Status::OK(); }
  virtual StatusOr<comm::ReducerStats> DeviceReductionStats() { return comm::ReducerStats{}; }

 private:
  double loss_sum_ = 0.0;
};

// The CPU backend: plans activations for B x T and initialises nothing (call SetParams or use
// InitGPT2Weights into host_params()).
StatusOr<std::unique_ptr<TrainBackend>> MakeCpuBackend(const GPT2Config& config, int B, int T,
                                                       const AdamWConfig& adamw);
// The CUDA model's options as the training config spells them (engine/train_config.h).
struct CudaBackendOptions {
  std::string dtype = "bf16";        // "bf16" or "fp32"
  std::string attention = "flash";   // "flash", "flash_simt" or "gemm"
  int recompute = 0;                 // 0, 1 or 2
  int gelu_fusion = -1;              // -1 (default), 0, 1 or 2
  bool deterministic = true;         // cuDNN attention's backward without atomics
};
// The CUDA backend on `device`. Unimplemented in CPU-only builds; InvalidArgument naming the device
// when it does not exist, or naming a bad option.
StatusOr<std::unique_ptr<TrainBackend>> MakeCudaBackend(const GPT2Config& config, int B, int T,
                                                        const AdamWConfig& adamw, const CudaBackendOptions& options,
                                                        int device);
// Number of usable CUDA devices (0 in CPU-only builds or without a driver).
int CudaDeviceCount();
// Whether this build has the CUDA backend.
bool TrainBackendHasCuda();

}  // namespace tf
