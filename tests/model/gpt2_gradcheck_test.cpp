// Full-model gradient check: the analytic gradient of ForwardBackward against central finite
// differences of Forward's loss, for every parameter tensor, on a tiny config that exercises
// padding (V=11, Vp=16), several heads and layers, and T < block_size.
#include <cmath>

#include <gtest/gtest.h>

#include "kernels/random.h"
#include "model/gpt2.h"

namespace tf {
namespace {

TEST(GPT2GradCheck, AnalyticMatchesFiniteDifferences) {
  GPT2Config c{.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 11, .block_size = 8, .padded_vocab_size = 16};
  const int B = 2, T = 5;
  auto created = GPT2::Create(c, B, T);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  GPT2& m = **created;
  // Larger-than-GPT-2 random weights so every path (attention scores, LN affine, biases)
  // contributes visibly to the loss; padded vocabulary rows stay zero.
  Rng rng(5);
  for (const ParamTensor& t : m.layout().tensors()) {
    float* p = m.params().data() + t.offset;
    const bool ln_w = t.name.ends_with("ln_1.weight") || t.name.ends_with("ln_2.weight") ||
                      t.name.ends_with("ln_f.weight");
    int64_t n = t.numel;
    if (t.name == "transformer.wte.weight") n = int64_t{c.vocab_size} * c.n_embd;
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(ln_w ? 1.0 + 0.2 * rng.Normal() : 0.3 * rng.Normal());
  }
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = static_cast<int32_t>(rng.Below(c.vocab_size));
    tg[i] = static_cast<int32_t>(rng.Below(c.vocab_size));
  }
  m.ZeroGrad();
  m.ForwardBackward(in.data(), tg.data(), B, T, 1.0f);
  std::vector<float> grads(m.grads().begin(), m.grads().end());

  // Step h = 1e-2 in float32: the loss (~3) carries ~3e-7 rounding, so the difference quotient has
  // ~3e-5 noise; truncation error is O(h^2 f''') ~ 1e-4 relative for these smooth functions.
  const float h = 1e-2f;
  int checked = 0;
  for (const ParamTensor& t : m.layout().tensors()) {
    int64_t n = t.numel;
    if (t.name == "transformer.wte.weight") n = int64_t{c.vocab_size} * c.n_embd;
    for (int k = 0; k < 6; ++k) {
      const int64_t i = t.offset + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n)));
      float& p = m.params()[static_cast<size_t>(i)];
      const float saved = p;
      p = saved + h;
      const double up = m.Forward(in.data(), tg.data(), B, T);
      p = saved - h;
      const double down = m.Forward(in.data(), tg.data(), B, T);
      p = saved;
      const double numeric = (up - down) / (2.0 * h);
      const double analytic = grads[static_cast<size_t>(i)];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << t.name << " flat index " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(m.layout().tensors().size()) * 6);
  // Padded vocabulary rows never receive gradient.
  for (int64_t i = int64_t{c.vocab_size} * c.n_embd; i < int64_t{c.padded_vocab_size} * c.n_embd; ++i) {
    ASSERT_EQ(grads[static_cast<size_t>(i)], 0.0f);
  }
}

TEST(GPT2GradCheck, AccumulationAveragesMicroBatches) {
  // Two half-scaled ForwardBackward calls on the same batch equal one full call.
  GPT2Config c{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 13, .block_size = 4, .padded_vocab_size = 16};
  auto created = GPT2::Create(c, 1, 4);
  ASSERT_TRUE(created.ok());
  GPT2& m = **created;
  m.InitWeights(3);
  std::vector<int32_t> in = {1, 2, 3, 4}, tg = {2, 3, 4, 5};
  m.ZeroGrad();
  m.ForwardBackward(in.data(), tg.data(), 1, 4, 1.0f);
  std::vector<float> once(m.grads().begin(), m.grads().end());
  m.ZeroGrad();
  m.ForwardBackward(in.data(), tg.data(), 1, 4, 0.5f);
  m.ForwardBackward(in.data(), tg.data(), 1, 4, 0.5f);
  for (size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(m.grads()[i], once[i], 1e-6f + 1e-5f * std::fabs(once[i]));
}

TEST(GPT2GradCheck, GradReadyHookCoversEveryGradientOnce) {
  GPT2Config c{.n_layer = 3, .n_head = 2, .n_embd = 8, .vocab_size = 13, .block_size = 4, .padded_vocab_size = 16};
  auto created = GPT2::Create(c, 1, 4);
  ASSERT_TRUE(created.ok());
  GPT2& m = **created;
  m.InitWeights(3);
  std::vector<int> seen(static_cast<size_t>(m.layout().total()), 0);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  m.set_grad_ready_hook([&](int64_t b, int64_t e) {
    ranges.emplace_back(b, e);
    for (int64_t i = b; i < e; ++i) ++seen[static_cast<size_t>(i)];
  });
  std::vector<int32_t> in = {1, 2, 3, 4}, tg = {2, 3, 4, 5};
  m.ForwardBackward(in.data(), tg.data(), 1, 4, 1.0f);
  for (int s : seen) ASSERT_EQ(s, 1);
  ASSERT_EQ(ranges.size(), 5u);  // ln_f, blocks 2, 1, 0, then the embeddings
  EXPECT_EQ(ranges.front().second, m.layout().total());
  EXPECT_EQ(ranges.back().first, 0);
}

}  // namespace
}  // namespace tf
