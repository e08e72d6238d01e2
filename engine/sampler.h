// Autoregressive sampling from a GPT2 (temperature, top-k), deterministic for a seed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/gpt2.h"

namespace tf {

struct SampleOptions {
  int num_tokens = 128;
  double temperature = 1.0;  // > 0
  int top_k = 0;             // 0: sample from the whole vocabulary
  uint64_t seed = 42;
};

// Returns the num_tokens generated ids (the prompt is not included). The context window is the
// last min(model.max_seq(), block_size) tokens. REQUIRES: prompt non-empty, ids < vocab_size,
// model planned for batch >= 1.
std::vector<int32_t> Sample(GPT2& model, std::span<const int32_t> prompt, const SampleOptions& options);

}  // namespace tf
