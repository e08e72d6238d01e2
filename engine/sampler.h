// Autoregressive sampling from a GPT2 (temperature, top-k), deterministic for a seed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/gpt2.h"

namespace tf {

struct SampleOptions {
  int num_tokens = 128;
  double temperature = 0.8;  // >= 0; 0 = greedy (always the most likely token)
  int top_k = 0;             // 0: sample from the whole vocabulary
  uint64_t seed = 42;
};

// Returns the num_tokens generated ids (the prompt is not included). The context window slides: it
// is the last min(model.max_seq(), block_size) tokens, so a model planned for its trained sequence
// length never sees a position it was not trained at. REQUIRES: prompt non-empty, ids < vocab_size,
// model planned for batch >= 1.
std::vector<int32_t> Sample(GPT2& model, std::span<const int32_t> prompt, const SampleOptions& options);

}  // namespace tf
