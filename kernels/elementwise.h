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
