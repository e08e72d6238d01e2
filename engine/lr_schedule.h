// The learning-rate schedule: linear warm-up, then cosine / linear / constant decay to min_lr.
//   step < warmup:  lr * (step + 1) / warmup
//   otherwise:      p = (step - warmup) / max(1, max_steps - warmup), clamped to [0, 1]
//                   cosine:   min_lr + 0.5 (1 + cos(pi p)) (lr - min_lr)
//                   linear:   lr - p (lr - min_lr)
//                   constant: lr
// `step` counts optimizer steps from 0.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "engine/train_config.h"

namespace tf {

inline double LearningRate(const TrainConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / c.warmup_steps;
  const double span = static_cast<double>(std::max<int64_t>(1, c.max_steps - c.warmup_steps));
  const double p = std::clamp(static_cast<double>(step - c.warmup_steps) / span, 0.0, 1.0);
  switch (c.lr_decay) {
    case LrDecay::kCosine: return c.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * p)) * (c.lr - c.min_lr);
    case LrDecay::kLinear: return c.lr - p * (c.lr - c.min_lr);
    case LrDecay::kConstant: return c.lr;
  }
  return c.lr;
}

}  // namespace tf
