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
