// Causal multi-head self-attention (GPT-2), CPU reference implementation.
#pragma once

namespace tf::cpu {
// qkv (B,T,3C) holds q, k, v side by side per token, each split into NH heads of C/NH.
// out (B,T,C): heads concatenated. att (B,NH,T,T): softmax probabilities saved for backward
// (entries above the diagonal are written as 0). Scale 1/sqrt(C/NH).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) is overwritten (not accumulated). scratch holds scratch_floats floats; the kernel
// uses at most scratch_floats / (T*T) threads (size it with attention_scratch_floats()).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH, float* scratch, long scratch_floats);
// Floats of scratch attention_backward needs for sequence length T with the current thread count.
long attention_scratch_floats(int T);
}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include "kernels/cublas_handle.h"
namespace tf::cuda {
// Device versions (kernels/attention.cu) of the contracts above: qkv (B,T,3C), out (B,T,C),
// att (B,NH,T,T) softmax probabilities (upper triangle written 0), dout (B,T,C), dqkv (B,T,3C)
// overwritten; all device memory of element type `dt` (math in fp32), issued on ctx.stream().
// scratch: attention_scratch_bytes(B, T, C, NH, dt) bytes of device memory (256-byte aligned, as
// cudaMalloc returns), clobbered by both calls. REQUIRES: C % NH == 0.
Status attention_forward(CublasContext& ctx, void* out, void* att, const void* qkv, int B, int T, int C, int NH,
                         DType dt, void* scratch);
Status attention_backward(CublasContext& ctx, void* dqkv, const void* dout, const void* qkv, const void* att, int B,
                          int T, int C, int NH, DType dt, void* scratch);
size_t attention_scratch_bytes(int B, int T, int C, int NH, DType dt);
}  // namespace tf::cuda
#endif
