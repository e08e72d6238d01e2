// Sampling (engine/sampler.h): a model trained at sequence length T < block_size keeps generating
// text it finds likely far past T tokens, because the context window slides within the trained
// length; temperature 0 is greedy; a seed makes sampling reproducible.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/data/token_file.h"
#include "engine/sampler.h"
#include "engine/trainer.h"
#include "model/gpt2.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

class SamplerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("sampler_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // Learnable, varied text: sentences built from a few word lists, in bytes.
    const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "her sister"};
    const char* verbs[] = {"sees", "likes", "finds", "paints", "follows"};
    const char* objects[] = {"the river.", "a red house.", "the moon.", "two birds.", "the garden."};
    std::string text;
    uint64_t x = 7;
    for (int i = 0; i < 3000; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += std::string(subjects[(x >> 33) % 5]) + " " + verbs[(x >> 40) % 5] + " " + objects[(x >> 50) % 5] + "\n";
    }
    const std::vector<uint16_t> tokens(text.begin(), text.end());
    ASSERT_TRUE(WriteTokenFile((dir_ / "train.bin").string(), tokens).ok());

    // byte-tiny's shape with block_size 64, trained at T = 16: positions 16..63 of wpe never train.
    model_ = GPT2Config{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 256, .block_size = 64,
                        .padded_vocab_size = 256};
    TrainConfig train;
    train.batch_size = 16;
    train.seq_len = kTrainedT;
    train.max_steps = 400;
    train.lr = 1e-2;
    train.min_lr = 1e-3;
    train.warmup_steps = 20;
    train.eval_batches = 0;
    train.sample_tokens = 0;
    train.shuffle = true;
    train.device = "cpu";
    train.threads = 1;  // a model this small only waits on a second thread (and CTest runs two tests at once)
    train.train_data = (dir_ / "train.bin").string();
    train.out_dir = (dir_ / "out").string();
    auto trainer = Trainer::Create(model_, train, Trainer::Options{.print_progress = false, .write_outputs = false});
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    auto result = (*trainer)->Run();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    params_ = new std::vector<float>(static_cast<size_t>((*trainer)->backend().layout().total()));
    ASSERT_TRUE((*trainer)->backend().GetParams(*params_).ok());
  }
  static void TearDownTestSuite() {
    delete params_;
    params_ = nullptr;
    fs::remove_all(dir_);
  }

  // The trained model, planned for one sequence of up to max_seq tokens.
  static std::unique_ptr<GPT2> Model(int max_seq) {
    auto m = GPT2::Create(model_, 1, max_seq);
    EXPECT_TRUE(m.ok());
    std::copy(params_->begin(), params_->end(), (*m)->params().begin());
    return std::move(*m);
  }

  // Mean negative log-likelihood of text[begin, end) under the model with a context of the up to
  // kTrainedT - 1 tokens before each (every prediction at a trained position).
  static double MeanNll(GPT2& m, const std::vector<int32_t>& text, size_t begin, size_t end) {
    double sum = 0;
    for (size_t p = begin; p < end; ++p) {
      const size_t from = p >= kTrainedT ? p - kTrainedT + 1 : 0;
      const int T = static_cast<int>(p - from);
      if (T == 0) continue;
      std::vector<int32_t> in(text.begin() + static_cast<ptrdiff_t>(from), text.begin() + static_cast<ptrdiff_t>(p));
      std::vector<int32_t> tg(text.begin() + static_cast<ptrdiff_t>(from) + 1,
                              text.begin() + static_cast<ptrdiff_t>(p) + 1);
      // The window's mean loss weights every position; the last one is text[p]'s.
      const float all = m.Forward(in.data(), tg.data(), 1, T);
      const float rest = T > 1 ? m.Forward(in.data(), tg.data(), 1, T - 1) : 0.0f;
      sum += static_cast<double>(all) * T - static_cast<double>(rest) * (T - 1);
    }
    return sum / static_cast<double>(end - begin);
  }

  static constexpr int kTrainedT = 16;
  static inline fs::path dir_;
  static inline GPT2Config model_;
  static inline std::vector<float>* params_ = nullptr;
};

TEST_F(SamplerTest, SecondHalfOfALongSampleIsAsLikelyAsTheFirst) {
  // 12x the trained length. The sampler's model is planned for the trained T, so its context slides.
  auto sampler = Model(kTrainedT);
  auto scorer = Model(kTrainedT);
  const std::string prompt = "the ";
  const std::vector<int32_t> ids(prompt.begin(), prompt.end());
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<int32_t> out =
        Sample(*sampler, ids, SampleOptions{.num_tokens = 12 * kTrainedT, .temperature = 0.8, .top_k = 0, .seed = seed});
    ASSERT_EQ(out.size(), size_t{12 * kTrainedT});
    std::vector<int32_t> text = ids;
    text.insert(text.end(), out.begin(), out.end());
    const size_t half = ids.size() + out.size() / 2;
    const double first = MeanNll(*scorer, text, ids.size(), half);
    const double second = MeanNll(*scorer, text, half, text.size());
    // Trained text sits far below ln(256) = 5.5 nats a byte; the second half as low as the first.
    EXPECT_LT(first, 1.5) << "seed " << seed << ": " << std::string(text.begin(), text.end());
    EXPECT_LT(second, first + 0.3) << "seed " << seed << ": " << std::string(text.begin(), text.end());
  }
}

TEST_F(SamplerTest, AContextPastTheTrainedLengthIsWhatTheWindowAvoids) {
  // The same model planned for its whole block_size sees untrained positions after kTrainedT
  // tokens: its second half is much less likely. (This is what the sliding window prevents; if the
  // untrained positions happened to work, the test above would prove nothing.)
  auto sampler = Model(model_.block_size);
  auto scorer = Model(kTrainedT);
  const std::string prompt = "the ";
  const std::vector<int32_t> ids(prompt.begin(), prompt.end());
  double first = 0, second = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<int32_t> out =
        Sample(*sampler, ids, SampleOptions{.num_tokens = 60, .temperature = 0.8, .top_k = 0, .seed = seed});
    std::vector<int32_t> text = ids;
    text.insert(text.end(), out.begin(), out.end());
    first += MeanNll(*scorer, text, ids.size(), kTrainedT);
    second += MeanNll(*scorer, text, 2 * kTrainedT, text.size());
  }
  EXPECT_GT(second, first + 0.5) << "first " << first / 3 << ", second " << second / 3;
}

TEST_F(SamplerTest, TemperatureZeroIsGreedyAndIgnoresTheSeed) {
  auto m = Model(kTrainedT);
  const std::vector<int32_t> ids = {'t', 'h', 'e', ' '};
  const SampleOptions a{.num_tokens = 40, .temperature = 0.0, .top_k = 0, .seed = 1};
  SampleOptions b = a;
  b.seed = 99;
  const std::vector<int32_t> x = Sample(*m, ids, a), y = Sample(*m, ids, b);
  EXPECT_EQ(x, y);
  // Each token is the most likely one after its context.
  std::vector<int32_t> text = ids;
  for (int32_t next : x) {
    const size_t from = text.size() > kTrainedT ? text.size() - kTrainedT : 0;
    const int T = static_cast<int>(text.size() - from);
    m->Forward(text.data() + from, nullptr, 1, T);
    const float* last = m->logits() + static_cast<ptrdiff_t>(T - 1) * model_.padded_vocab_size;
    EXPECT_EQ(next, std::max_element(last, last + model_.vocab_size) - last);
    text.push_back(next);
  }
}

TEST_F(SamplerTest, ASeedReproducesASample) {
  auto m = Model(kTrainedT);
  const std::vector<int32_t> ids = {'a', ' '};
  const SampleOptions o{.num_tokens = 50, .temperature = 1.0, .top_k = 10, .seed = 5};
  EXPECT_EQ(Sample(*m, ids, o), Sample(*m, ids, o));
}

}  // namespace
}  // namespace tf
