#include "engine/sampler.h"

#include <algorithm>
#include <numeric>

#include "kernels/classifier.h"
#include "kernels/random.h"

namespace tf {

std::vector<int32_t> Sample(GPT2& model, std::span<const int32_t> prompt, const SampleOptions& options) {
  const GPT2Config& c = model.config();
  const int window = std::min(model.max_seq(), c.block_size);
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  std::vector<float> probs(static_cast<size_t>(c.vocab_size));
  std::vector<int> order(static_cast<size_t>(c.vocab_size));
  Rng rng(options.seed);
  for (int n = 0; n < options.num_tokens; ++n) {
    const int T = std::min<int>(window, static_cast<int>(context.size()));
    const int32_t* inputs = context.data() + context.size() - T;
    model.Forward(inputs, nullptr, 1, T);
    const float* last = model.logits() + int64_t{T - 1} * c.padded_vocab_size;
    if (options.temperature == 0.0) {  // greedy: the most likely token (the lowest id on a tie)
      const int32_t next = static_cast<int32_t>(std::max_element(last, last + c.vocab_size) - last);
      out.push_back(next);
      context.push_back(next);
      continue;
    }
    cpu::softmax_rows(probs.data(), last, 1, c.vocab_size, c.padded_vocab_size,
                      static_cast<float>(options.temperature));
    if (options.top_k > 0 && options.top_k < c.vocab_size) {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + options.top_k, order.end(),
                        [&](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
      std::vector<float> kept(probs.size(), 0.0f);
      for (int k = 0; k < options.top_k; ++k) kept[order[k]] = probs[order[k]];
      probs.swap(kept);
    }
    double total = 0.0;
    for (float p : probs) total += p;
    double u = rng.Uniform() * total, acc = 0.0;
    int32_t next = 0;
    for (int v = 0; v < c.vocab_size; ++v) {
      if (probs[v] <= 0.0f) continue;
      next = v;  // last token with mass: guards against rounding at the top of the range
      acc += probs[v];
      if (u < acc) break;
    }
    out.push_back(next);
    context.push_back(next);
  }
  return out;
}

}  // namespace tf
