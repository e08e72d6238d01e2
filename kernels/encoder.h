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
