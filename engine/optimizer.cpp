#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/optimizer.h"

namespace tf {

AdamW::AdamW(const ParameterLayout& layout, const AdamWConfig& config) : AdamW(layout, config, 0, layout.total()) {}

AdamW::AdamW(const ParameterLayout& layout, const AdamWConfig& config, int64_t begin, int64_t end)
    : config_(config), begin_(begin), end_(end), m_(end - begin), v_(end - begin) {
  for (const DecayRange& r : DecayRanges(layout)) {
    const int64_t lo = std::max(r.begin, begin), hi = std::min(r.end, end);
    if (lo < hi) ranges_.push_back({lo, hi, r.decay});
  }
}

float AdamW::Step(std::span<float> params, std::span<const float> grads, double lr, int64_t t) {
  const double norm = GradNorm(grads);
  Apply(params, grads, lr, t, norm);
  return static_cast<float>(norm);
}

double AdamW::GradNorm(std::span<const float> grads) {
  return std::sqrt(cpu::sum_squares(grads.data(), static_cast<long>(grads.size())));
}

void AdamW::Apply(float* params, const float* grads, double lr, int64_t t, double norm) {
  const float scale = math::grad_clip_scale(norm, config_.grad_clip);
  math::AdamWParams h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(config_.beta1);
  h.beta2 = static_cast<float>(config_.beta2);
  h.eps = static_cast<float>(config_.eps);
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(t)));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(config_.beta2, static_cast<double>(t)));
  for (const DecayRange& r : ranges_) {
    h.weight_decay = r.decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    const int64_t o = r.begin - begin_;
    cpu::adamw_step(params + o, m_.data() + o, v_.data() + o, grads + o, static_cast<long>(r.end - r.begin), scale, h);
  }
}

}  // namespace tf
