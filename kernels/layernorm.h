// LayerNorm over the last dimension (eps = math::kLayerNormEps), CPU reference implementation.
#pragma once

namespace tf::cpu {
// out (N,C) = (inp - mean) * rstd * weight + bias; saves mean (N), rstd (N) for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// Accumulates (+=) into dinp (N,C), dweight (C), dbias (C).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);
}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include <cstddef>

#include "kernels/cuda_runtime.h"
namespace tf::cuda {
// Device versions (kernels/layernorm.cu) on `stream`: inp, weight, bias, out, dout, dinp, dweight,
// dbias are device memory of element type `dt` (statistics and math in fp32); mean, rstd (N) are fp32.
// Forward: one warp per row, two-pass statistics like the CPU. mean/rstd may be null (not saved).
Status layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                         int N, int C, DType dt, cudaStream_t stream);
// Backward accumulates (+=) into dinp, dweight, dbias. dweight/dbias are reduced deterministically:
// fixed per-block partial sums into scratch, then a fixed-order reduction. scratch is device memory of
// at least layernorm_backward_scratch_bytes(N, C) bytes. REQUIRES: C <= 6144.
size_t layernorm_backward_scratch_bytes(int N, int C);
Status layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C, DType dt,
                          float* scratch, size_t scratch_bytes, cudaStream_t stream);
}  // namespace tf::cuda
#endif
