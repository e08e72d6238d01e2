#include "engine/optimizer.h"

#include <cmath>

#include "kernels/optimizer.h"

namespace tf {

AdamW::AdamW(const ParameterLayout& layout, const AdamWConfig& config)
    : config_(config), m_(layout.total()), v_(layout.total()), ranges_(DecayRanges(layout)) {}

float AdamW::Step(std::span<float> params, std::span<const float> grads, double lr, int64_t t) {
  const double norm = GradNorm(grads);
  Apply(params, grads, lr, t, norm);
  return static_cast<float>(norm);
}

double AdamW::GradNorm(std::span<const float> grads) {
  return std::sqrt(cpu::sum_squares(grads.data(), static_cast<long>(grads.size())));
}

void AdamW::Apply(std::span<float> params, std::span<const float> grads, double lr, int64_t t, double norm) {
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
    cpu::adamw_step(params.data() + r.begin, m_.data() + r.begin, v_.data() + r.begin, grads.data() + r.begin,
                    static_cast<long>(r.end - r.begin), scale, h);
  }
}

}  // namespace tf
