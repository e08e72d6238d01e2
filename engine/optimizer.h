// AdamW over a flat parameter buffer, with PyTorch's semantics (torch.optim.AdamW): bias
// correction, decoupled weight decay applied only to tensors the layout marks (>= 2 dims), and
// global-norm gradient clipping as torch.nn.utils.clip_grad_norm_ (scale = max_norm /
// (norm + 1e-6) when norm > max_norm). Owns the moments m and v of the range of the buffer it
// updates: all of it, or one rank's ZeRO shard [begin, end) (the per-element arithmetic is the
// same either way, so a sharded update is bit-identical to the whole one). Not thread-safe.
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
  // The whole buffer.
  AdamW(const ParameterLayout& layout, const AdamWConfig& config);
  // Elements [begin, end) of the buffer (a ZeRO shard): m() and v() hold end - begin values.
  AdamW(const ParameterLayout& layout, const AdamWConfig& config, int64_t begin, int64_t end);
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate `lr`; `t` is the 1-based step count for bias correction.
  // Returns the global gradient norm before clipping. (Whole-buffer optimizers only.)
  float Step(std::span<float> params, std::span<const float> grads, double lr, int64_t t);
  // Step in two halves: the global norm of `grads`, then the update clipped by that norm.
  static double GradNorm(std::span<const float> grads);
  // params and grads hold the optimizer's range (end - begin values, element begin first).
  void Apply(float* params, const float* grads, double lr, int64_t t, double norm);
  void Apply(std::span<float> params, std::span<const float> grads, double lr, int64_t t, double norm) {
    Apply(params.data(), grads.data(), lr, t, norm);
  }

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  std::span<float> m() { return m_.span(); }
  std::span<float> v() { return v_.span(); }

 private:
  AdamWConfig config_;
  int64_t begin_ = 0, end_ = 0;
  AlignedBuffer m_, v_;
  std::vector<DecayRange> ranges_;  // runs of one decay flag, clipped to [begin, end)
};

}  // namespace tf
