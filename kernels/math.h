// Per-element and per-row math shared by every backend.
//
// Written once as host+device inline functions so that the CPU backend (and therefore the
// CPU tests in CI) exercise exactly the formulas the CUDA kernels run. No state, no I/O.
#pragma once

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

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TF_HD float gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
}

// d gelu(x) / dx for the tanh approximation.
TF_HD float gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float tanh_arg = kGeluScale * (x + cube);
  float tanh_out = tanhf(tanh_arg);
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
