// GPT2Cuda: the GPT-2 model on one CUDA device — parameters, gradients, AdamW state and activations
// in device memory planned once at Create(), forward/backward/AdamW through the tf::cuda kernels on
// one compute stream. Same layout (model/parameters.h), math and data contract as the CPU GPT2; the
// storage dtype is fp32 (for checking against the CPU) or bf16 (mixed precision: bf16 parameters,
// activations and gradients; fp32 master weights and AdamW moments; fp32 accumulation).
//
// Ownership: owns every device buffer, the stream and the cuBLAS context. Not copyable.
// Thread safety: none; one host thread drives it. Only built with the CUDA backend.
#pragma once
#if defined(TF_WITH_CUDA)
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cublas_handle.h"
#include "kernels/cuda_runtime.h"
#include "kernels/optimizer.h"
#include "model/config.h"
#include "model/parameters.h"

namespace tf {

class GPT2Cuda {
 public:
  static StatusOr<std::unique_ptr<GPT2Cuda>> Create(const GPT2Config& config, int max_batch, int max_seq,
                                                    cuda::DType dtype, int device = 0);
  ~GPT2Cuda();
  GPT2Cuda(const GPT2Cuda&) = delete;
  GPT2Cuda& operator=(const GPT2Cuda&) = delete;

  const GPT2Config& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  cuda::DType dtype() const { return dtype_; }
  size_t device_bytes() const { return device_bytes_; }

  // Host fp32 parameters (ParameterLayout order) -> device master weights and the dtype copy.
  Status LoadParams(std::span<const float> host);
  // Device master weights -> host fp32.
  Status StoreParams(std::span<float> host) const;
  // Device gradients -> host fp32 (converted from the storage dtype).
  Status StoreGrads(std::span<float> host) const;

  Status ZeroGrad();
  // Mean loss of the micro-batch (inputs/targets on the host, B*T each); no gradients.
  StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Forward + loss + backward; accumulates the gradient of (mean loss * grad_scale).
  StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale);
  // Global-norm clip + AdamW (decay mask from the layout) at `lr`, step t (1-based). Returns the norm.
  StatusOr<float> Step(const AdamWConfig& config, double lr, int64_t t);

 private:
  GPT2Cuda(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype);
  Status Allocate();
  Status RunForward(int B, int T);
  Status RunBackward(int B, int T);
  StatusOr<float> MeanLoss(int N);
  // Pointer to element `offset` of a buffer holding dtype_ elements.
  void* At(const cuda::DeviceBuffer& b, int64_t offset) const {
    return static_cast<char*>(b.data()) + offset * static_cast<int64_t>(cuda::DTypeSize(dtype_));
  }

  GPT2Config config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_;
  cuda::DType dtype_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CublasContext> blas_;
  size_t device_bytes_ = 0;

  // State: params/grads in dtype_, master/m/v in fp32 (master aliases params in fp32 mode).
  cuda::DeviceBuffer params_, grads_, master_, m_, v_;
  // Activations (dtype_ unless noted), offsets in elements from acts_.
  cuda::DeviceBuffer acts_, stats_ /*fp32: LN mean/rstd, losses*/, tokens_ /*int32 inputs, targets*/;
  cuda::DeviceBuffer scratch_;  // shared by the kernels' scratch needs (used one at a time)
  cuda::DeviceBuffer norm_;     // one double
  size_t scratch_bytes_ = 0;
  struct Acts {
    int64_t encoded, ln1, qkv, atty, att, residual2, ln2, fch, fch_gelu, residual3, lnf, logits, dresidual, dln,
        datty, dqkv, dfch;
  } a_{};
  struct Stats {
    int64_t ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lnf_mean, lnf_rstd, losses;
  } s_{};
  std::vector<float> host_losses_;
};

}  // namespace tf
#endif  // TF_WITH_CUDA
