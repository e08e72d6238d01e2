#include "engine/optimizer.h"

#include <cmath>

#include "kernels/optimizer.h"

namespace tf {

AdamW::AdamW(const ParameterLayout& layout, const AdamWConfig& config)
    : config_(config), m_(layout.total()), v_(layout.total()) {
  for (const ParamTensor& t : layout.tensors()) {
    if (!ranges_.empty() && ranges_.back().decay == t.weight_decay && ranges_.back().end == t.offset) {
      ranges_.back().end = t.offset + t.numel;
    } else {
      ranges_.push_back({t.offset, t.offset + t.numel, t.weight_decay});
    }
  }
}

float AdamW::Step(std::span<float> params, std::span<const float> grads, double lr, int64_t t) {
  const double norm = std::sqrt(cpu::sum_squares(grads.data(), static_cast<long>(grads.size())));
  float scale = 1.0f;
  if (config_.grad_clip > 0.0 && norm > config_.grad_clip) {
    scale = static_cast<float>(config_.grad_clip / (norm + 1e-6));
  }
  math::AdamWParams h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(config_.beta1);
  h.beta2 = static_cast<float>(config_.beta2);
  h.eps = static_cast<float>(config_.eps);
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(t)));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(config_.beta2, static_cast<double>(t)));
  for (const Range& r : ranges_) {
    h.weight_decay = r.decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    cpu::adamw_step(params.data() + r.begin, m_.data() + r.begin, v_.data() + r.begin, grads.data() + r.begin,
                    static_cast<long>(r.end - r.begin), scale, h);
  }
  return static_cast<float>(norm);
}

}  // namespace tf
