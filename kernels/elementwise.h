// Element-wise ops: GELU (tanh approximation) and residual add, CPU implementations.
#pragma once

namespace tf::cpu {
// out[i] = gelu(inp[i]), i < n.
void gelu_forward(float* out, const float* inp, long n);
// dinp[i] = gelu'(inp[i]) * dout[i] (overwrites dinp; dinp may alias dout).
void gelu_backward(float* dinp, const float* inp, const float* dout, long n);
// out[i] = a[i] + b[i].
void residual_forward(float* out, const float* a, const float* b, long n);
// dst[i] += src[i].
void accumulate(float* dst, const float* src, long n);
}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include "kernels/cuda_runtime.h"
namespace tf::cuda {
// Device versions; pointers are device memory of element type `dt` (math in fp32), on `stream`.
Status gelu_forward(void* out, const void* inp, long n, DType dt, cudaStream_t stream);
Status gelu_backward(void* dinp, const void* inp, const void* dout, long n, DType dt, cudaStream_t stream);
Status residual_forward(void* out, const void* a, const void* b, long n, DType dt, cudaStream_t stream);
Status accumulate(void* dst, const void* src, long n, DType dt, cudaStream_t stream);
// dst[i] = src[i] converted between storage types (fp32 <-> bf16 rounds to nearest even; equal
// types copy). For staging bf16 gradients through fp32 code (the data-parallel codecs).
Status convert(void* dst, DType dst_dt, const void* src, DType src_dt, long n, cudaStream_t stream);
}  // namespace tf::cuda
#endif
