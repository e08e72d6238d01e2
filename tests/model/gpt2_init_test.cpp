// GPT-2 initialisation: the distribution of every tensor and determinism for a seed.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "model/gpt2.h"

namespace tf {
namespace {

struct Moments {
  double mean = 0, std = 0;
};
Moments Measure(const float* p, int64_t n) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    s += p[i];
    s2 += double(p[i]) * p[i];
  }
  const double mean = s / n;
  return {mean, std::sqrt(s2 / n - mean * mean)};
}

// Checks every tensor of an initialised buffer against GPT-2's distributions.
void ExpectGPT2Distributions(const GPT2Config& c, const float* base) {
  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  const ParameterLayout layout(c);
  for (const ParamTensor& t : layout.tensors()) {
    const float* p = base + t.offset;
    int64_t n = t.numel;
    if (t.name == "transformer.wte.weight") {
      n = int64_t{c.vocab_size} * c.n_embd;
      for (int64_t i = n; i < t.numel; ++i) ASSERT_EQ(p[i], 0.0f) << "padded wte row";
    }
    const Moments mo = Measure(p, n);
    if (t.name.ends_with("ln_1.weight") || t.name.ends_with("ln_2.weight") || t.name.ends_with("ln_f.weight")) {
      EXPECT_EQ(mo.mean, 1.0) << t.name;
      EXPECT_EQ(mo.std, 0.0) << t.name;
    } else if (t.shape.size() == 1) {
      EXPECT_EQ(mo.mean, 0.0) << t.name;  // biases and LayerNorm biases are zero
      EXPECT_EQ(mo.std, 0.0) << t.name;
    } else {
      const double want = t.name.ends_with("c_proj.weight") ? residual_std : 0.02;
      // n >= 4096 samples: the sample std is within ~3 / sqrt(2n) < 4% of the true value; the
      // mean within 4 standard errors.
      EXPECT_NEAR(mo.std, want, 0.04 * want) << t.name;
      EXPECT_NEAR(mo.mean, 0.0, 4.0 * want / std::sqrt(double(n))) << t.name;
    }
  }
}

TEST(GPT2Init, DistributionsFollowGPT2) {
  GPT2Config c{.n_layer = 4, .n_head = 4, .n_embd = 64, .vocab_size = 1000, .block_size = 128,
               .padded_vocab_size = 1024};
  auto m = GPT2::Create(c, 1, 8);
  ASSERT_TRUE(m.ok());
  (*m)->InitWeights(123);
  ExpectGPT2Distributions(c, (*m)->params().data());
}

// The chunked parallel variant (benchmarks of large models): the same distributions, tensors larger
// than one 2^20 chunk included, deterministic for a seed whatever the thread count, and not the
// sequential stream's values.
TEST(GPT2Init, ParallelVariantSameDistributionsDeterministic) {
  GPT2Config c{.n_layer = 2, .n_head = 4, .n_embd = 256, .vocab_size = 5000, .block_size = 64,
               .padded_vocab_size = 5120};  // wte: 1.28M elements, two chunks
  const size_t P = static_cast<size_t>(ParameterLayout(c).total());
  std::vector<float> a(P), b(P), seq(P);
  InitGPT2Weights(c, 5, a, /*parallel=*/true);
  ExpectGPT2Distributions(c, a.data());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  InitGPT2Weights(c, 5, b, /*parallel=*/true);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), P * sizeof(float)), 0);
  InitGPT2Weights(c, 5, seq);
  EXPECT_NE(std::memcmp(a.data(), seq.data(), P * sizeof(float)), 0);
}

TEST(GPT2Init, DeterministicForASeed) {
  GPT2Config c{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 50, .block_size = 8,
               .padded_vocab_size = 64};
  auto a = GPT2::Create(c, 1, 8), b = GPT2::Create(c, 1, 8), d = GPT2::Create(c, 1, 8);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  (*a)->InitWeights(7);
  (*b)->InitWeights(7);
  (*d)->InitWeights(8);
  const size_t bytes = (*a)->params().size() * sizeof(float);
  EXPECT_EQ(std::memcmp((*a)->params().data(), (*b)->params().data(), bytes), 0);
  EXPECT_NE(std::memcmp((*a)->params().data(), (*d)->params().data(), bytes), 0);
}

// A ZeRO shard initialises only its range, to the values the whole buffer has there, for both
// variants and ranges that start and end inside tensors.
TEST(GPT2Init, ARangeGetsTheWholeBuffersValues) {
  GPT2Config c{.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 50, .block_size = 8,
               .padded_vocab_size = 64};
  const int64_t n = ParameterLayout(c).total();
  for (bool parallel : {false, true}) {
    std::vector<float> whole(static_cast<size_t>(n));
    InitGPT2Weights(c, 11, whole, parallel);
    for (const auto& [first, last] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {1, 77}, {500, n}, {1000, 3001}}) {
      std::vector<float> part(static_cast<size_t>(last - first), -1.0f);
      InitGPT2Weights(c, 11, part, parallel, first);
      EXPECT_EQ(std::memcmp(part.data(), whole.data() + first, part.size() * sizeof(float)), 0)
          << "[" << first << ", " << last << ") parallel " << parallel;
    }
  }
}

}  // namespace
}  // namespace tf
