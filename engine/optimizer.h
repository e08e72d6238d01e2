// AdamW over a flat parameter buffer, with PyTorch's semantics (torch.optim.AdamW): bias
// correction, decoupled weight decay applied only to tensors the layout marks (>= 2 dims), and
// global-norm gradient clipping as torch.nn.utils.clip_grad_norm_ (scale = max_norm /
// (norm + 1e-6) when norm > max_norm). Owns the moments m and v (same layout as the parameters).
// Not thread-safe.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "base/aligned_buffer.h"
#include "kernels/optimizer.h"
#include "model/parameters.h"

namespace tf {

class AdamW {
 public:
  AdamW(const ParameterLayout& layout, const AdamWConfig& config);
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate `lr`; `t` is the 1-based step count for bias correction.
  // Returns the global gradient norm before clipping.
  float Step(std::span<float> params, std::span<const float> grads, double lr, int64_t t);
  // Step in two halves: the global norm of `grads`, then the update clipped by that norm.
  static double GradNorm(std::span<const float> grads);
  void Apply(std::span<float> params, std::span<const float> grads, double lr, int64_t t, double norm);

  std::span<float> m() { return m_.span(); }
  std::span<float> v() { return v_.span(); }

 private:
  AdamWConfig config_;
  AlignedBuffer m_, v_;
  std::vector<DecayRange> ranges_;  // maximal runs of consecutive tensors with one decay flag
};

}  // namespace tf
