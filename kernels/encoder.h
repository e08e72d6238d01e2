// Token + position embedding (GPT-2's wte + wpe), CPU reference implementation.
#pragma once
#include <cstdint>

namespace tf::cpu {
// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
// out (B,T,C), inp (B,T) token ids < V (validated by the caller), wte (V,C), wpe (maxT,C), T <= maxT.
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);
// dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. Deterministic (fixed summation order).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C);
}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include <cstddef>

#include "kernels/cuda_runtime.h"
namespace tf::cuda {
// Device versions (kernels/encoder.cu) on `stream`: out, wte, wpe, dout, dwte, dwpe are device
// memory of element type `dt` (math in fp32); inp is device int32.
// REQUIRES: 0 <= inp[i] < rows of wte/dwte (device memory: not checked on the host; negative ids are
// skipped by the kernels).
Status encoder_forward(void* out, const int32_t* inp, const void* wte, const void* wpe, int B, int T, int C, DType dt,
                       cudaStream_t stream);
// Accumulates (+=) exactly like cpu::encoder_backward, summing in the same order (bit-identical to the
// CPU in fp32; in bf16 each touched row is read, summed in fp32 and rounded once). Deterministic, no
// atomic accumulation: positions are stably sorted by token on the device and one warp per (distinct
// token, 128-channel slice) adds that token's rows in position order. scratch (device, 256-byte
// aligned) holds at least encoder_backward_scratch_bytes(B, T) bytes (a query of cub's sort for the
// current device: an error without one).
StatusOr<size_t> encoder_backward_scratch_bytes(int B, int T);
Status encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* inp, int B, int T, int C, DType dt,
                        void* scratch, size_t scratch_bytes, cudaStream_t stream);
// Same, with the scratch taken from the device's stream-ordered allocator (cudaMallocAsync) for the call.
Status encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* inp, int B, int T, int C, DType dt,
                        cudaStream_t stream);
}  // namespace tf::cuda
#endif
