// Fused causal self-attention for the CUDA backend (kernels/flash_attention.cu), FlashAttention-2
// style: the (T,T) score and probability matrices are never stored; the forward keeps one running
// row maximum and sum per query (online softmax) and saves only the log-sum-exp of each row, from
// which the backward recomputes the probabilities tile by tile. Same contract and math as the CPU
// reference tf::cpu::attention_forward/backward (kernels/attention.h), which the tests compare with.
//
// Layouts: qkv (B,T,3C) holds q, k, v side by side per token, each split into NH heads of
// hs = C/NH (q of head h at columns [h*hs, (h+1)*hs), k at C + ..., v at 2C + ...); out, dout (B,T,C)
// heads concatenated; dqkv like qkv; lse (B,NH,T) fp32. Scale 1/sqrt(hs), causal (key <= query).
// Storage fp32 or bf16 (`dt`), math fp32. Everything runs on `stream`; no host synchronisation.
// Deterministic: no atomics; every output element is written by one thread in a fixed order.
//
// Kernels: bf16 with hs = 64 or 128 runs on tensor cores (mma.sync m16n8k16, fp32 accumulation);
// fp32, other head sizes up to 128, and FlashImpl::kSimt run plain-FMA (SIMT) kernels. hs > 128
// is rejected. Only built with the CUDA backend (TF_WITH_CUDA).
#pragma once
#if defined(TF_WITH_CUDA)
#include <cstddef>

#include "kernels/cuda_runtime.h"

namespace tf::cuda {

enum class FlashImpl {
  kAuto,  // tensor cores for bf16 with hs 64/128, SIMT kernels otherwise
  kSimt,  // always the SIMT kernels (reference path and fallback)
};

// out (B,T,C) = causal softmax(q k^T / sqrt(hs)) v per head; lse (B,NH,T) = natural log of each
// row's softmax denominator, sum_{s<=t} exp(q_t.k_s / sqrt(hs)) (kept for the backward).
// REQUIRES: C % NH == 0, C/NH <= 128; device pointers; for the tensor-core path qkv and out are
// 16-byte aligned (InvalidArgument otherwise).
Status flash_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH, DType dt,
                               cudaStream_t stream, FlashImpl impl = FlashImpl::kAuto);

// dqkv (B,T,3C) is overwritten (not accumulated) with the gradient of the forward above, given
// dout (B,T,C), the forward's input qkv, output out and lse. scratch: device memory of at least
// flash_attention_backward_scratch_bytes(B, T, NH) bytes (the row sums D = rowsum(dout * out),
// (B,NH,T) fp32), 256-byte aligned as cudaMalloc returns. Two passes: dK,dV per key tile, then dQ
// per query tile. REQUIRES: as the forward, plus dout and dqkv 16-byte aligned on tensor cores.
Status flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                int B, int T, int C, int NH, DType dt, void* scratch, size_t scratch_bytes,
                                cudaStream_t stream, FlashImpl impl = FlashImpl::kAuto);
size_t flash_attention_backward_scratch_bytes(int B, int T, int NH);

// Whether (C, NH, dt, impl) runs on the tensor-core kernels (for logs and benchmarks).
bool flash_attention_uses_tensor_cores(int C, int NH, DType dt, FlashImpl impl = FlashImpl::kAuto);

}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
