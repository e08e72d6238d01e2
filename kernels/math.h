// Per-element and per-row math shared by every backend.
//
// Written once as host+device inline functions so that the CPU backend (and therefore the
// CPU tests in CI) exercise exactly the formulas the CUDA kernels run. No state, no I/O.
#pragma once

#include <bit>
#include <cmath>

#if defined(__CUDACC__)
#define TF_HD __host__ __device__ __forceinline__
#else
#define TF_HD inline
#endif

namespace tf::math {

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2's LayerNorm epsilon.
// sqrt(2/pi), the constant of GELU's tanh approximation ("gelu_new" in Hugging Face).
inline constexpr float kGeluScale = 0.7978845608028654f;

// e^x for float, vectorisable (no libm call, no branches): range reduction x = n ln2 + r with
// |r| <= ln2/2, a degree-6 polynomial for e^r (Cephes' expf coefficients), and 2^n assembled in
// the exponent bits. Relative error <= 2 ulp on [-87, 88]; inputs are clamped to that range, so
// e^-inf gives ~1e-38 instead of 0 (callers subtract the row maximum, so arguments are <= 0 and
// such tiny terms do not change a softmax). NaN propagates.
TF_HD float fast_exp(float x_in) {
  // Selects (not fminf/floorf) so that GCC vectorises the function inside loops.
  float x = x_in < -87.0f ? -87.0f : x_in;
  x = x > 88.0f ? 88.0f : x;  // NaN passes both selects unchanged; handled at the end
  // n = round(x / ln2) by the 1.5 * 2^23 trick (|x / ln2| < 2^22, round to nearest even).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;       // ln2 split in a high part exact in float...
  r = r - n * -2.12194440e-4f;          // ...and the low remainder
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int bits = (static_cast<int>(n == n ? n : 0.0f) + 127) << 23;
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(bits);
#else
  const float scale = std::bit_cast<float>(bits);
#endif
  return x_in != x_in ? x_in : p * scale;  // NaN in, NaN out
}

// tanh(u) = 1 - 2 / (e^{2u} + 1) through fast_exp: vectorisable, absolute error ~1e-7 (relative
// error grows for |u| < 1e-3, where tanh(u) ~ u is tiny; GELU multiplies it by x, so its absolute
// error stays ~1e-7 |x|).
TF_HD float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TF_HD float gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + cube)));
}

// d gelu(x) / dx for the tanh approximation.
TF_HD float gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float tanh_arg = kGeluScale * (x + cube);
  float tanh_out = fast_tanh(tanh_arg);
  float sech2 = 1.0f - tanh_out * tanh_out;
  return 0.5f * (1.0f + tanh_out) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// Hyper-parameters of one AdamW step, with the bias corrections precomputed on the host.
struct AdamWParams {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;      // already 0 for tensors that are not decayed
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
};

// Global-norm clipping: the factor every gradient is multiplied by, given the gradients' global L2
// norm and the clip threshold (<= 0: no clipping). PyTorch's clip_grad_norm_ (clip / (norm + 1e-6)).
TF_HD float grad_clip_scale(double norm, double clip) {
  return (clip > 0.0 && norm > clip) ? static_cast<float>(clip / (norm + 1e-6)) : 1.0f;
}

// One AdamW update of a single parameter with PyTorch's semantics (torch.optim.AdamW,
// foreach=False): decoupled weight decay p -= lr*wd*p, then the Adam step with bias
// correction, denominator sqrt(v)/sqrt(bc2) + eps. `grad` is the (already clipped/scaled)
// gradient. Updates p, m, v in place.
TF_HD void adamw_update(float& p, float& m, float& v, float grad, const AdamWParams& h) {
  p -= h.lr * h.weight_decay * p;
  m = h.beta1 * m + (1.0f - h.beta1) * grad;
  v = h.beta2 * v + (1.0f - h.beta2) * grad * grad;
  float denom = sqrtf(v) / sqrtf(h.bias_correction2) + h.eps;
  float step_size = h.lr / h.bias_correction1;
  p -= step_size * (m / denom);
}

}  // namespace tf::math
