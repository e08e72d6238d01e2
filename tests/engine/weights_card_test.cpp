// WeightsCard (engine/weights_card.h): what weights record of their run round-trips through the
// safetensors metadata strings, every field is optional, and a malformed value is Corruption naming
// the key and the file.
#include "engine/weights_card.h"

#include <gtest/gtest.h>

namespace tf {
namespace {

WeightsCard FullCard() {
  WeightsCard c;
  c.model = GPT2Config{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 50257, .block_size = 64,
                       .padded_vocab_size = 50304};
  c.tokenizer = "gpt2";
  c.tokenizer_fingerprint = 0xfedcba9876543210ull;
  c.seq_len = 32;
  c.world = 4;
  c.step = 1234;
  c.train_config = {{"batch_size", 8}, {"val_data", "data/x/val.bin"}, {"sample_temperature", 0.7}};
  return c;
}

TEST(WeightsCardTest, RoundTripsThroughMetadata) {
  const WeightsCard c = FullCard();
  const auto meta = c.ToMetadata();
  EXPECT_EQ(meta.at(kMetaTokenizerFingerprint), "fedcba9876543210");
  auto back = WeightsCardFromMetadata(meta, "w.safetensors");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->model.has_value());
  EXPECT_EQ(back->model->vocab_size, 50257);
  EXPECT_EQ(back->model->padded_vocab_size, 50304);
  EXPECT_EQ(back->tokenizer, "gpt2");
  EXPECT_EQ(back->tokenizer_fingerprint, c.tokenizer_fingerprint);
  EXPECT_EQ(back->seq_len, 32);
  EXPECT_EQ(back->world, 4);
  EXPECT_EQ(back->step, 1234);
  EXPECT_EQ(back->train_config, c.train_config);
  EXPECT_EQ(back->RunInt("batch_size"), 8);
  EXPECT_EQ(back->RunString("val_data"), "data/x/val.bin");
  EXPECT_EQ(back->RunNumber("sample_temperature"), 0.7);
  EXPECT_EQ(back->RunInt("val_data"), std::nullopt);  // a string is not an int
  EXPECT_EQ(back->RunInt("absent"), std::nullopt);
}

TEST(WeightsCardTest, EverythingIsOptional) {
  auto c = WeightsCardFromMetadata({{"format", "pt"}}, "hf.safetensors");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->model.has_value());
  EXPECT_EQ(c->tokenizer, "");
  EXPECT_EQ(c->seq_len, 0);
  EXPECT_EQ(c->step, -1);
  EXPECT_TRUE(c->train_config.is_null());
  EXPECT_EQ(c->RunInt("batch_size"), std::nullopt);
  EXPECT_TRUE(WeightsCard{}.ToMetadata().empty());
  // The tokenizer then follows the vocabulary.
  GPT2Config m = *FullCard().model;
  EXPECT_EQ(c->TokenizerFor(m), "gpt2");
  m.vocab_size = m.padded_vocab_size = 256;
  EXPECT_EQ(c->TokenizerFor(m), "byte");
  m.vocab_size = m.padded_vocab_size = 1000;
  EXPECT_EQ(c->TokenizerFor(m), "");
}

TEST(WeightsCardTest, MalformedValuesAreNamed) {
  const auto good = FullCard().ToMetadata();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {kMetaStep, "12x"},
      {kMetaSeqLen, "-"},
      {kMetaWorld, ""},
      {kMetaTokenizer, "sentencepiece"},
      {kMetaTokenizerFingerprint, "not hex"},
      {kMetaModelConfig, "{\"n_layer\": 2"},
      {kMetaTrainConfig, "[1, 2]"},
      {kMetaSeqLen, "65"},  // longer than the model's block_size 64
  };
  for (const auto& [key, value] : bad) {
    auto meta = good;
    meta[key] = value;
    auto c = WeightsCardFromMetadata(meta, "w.safetensors");
    ASSERT_FALSE(c.ok()) << key << " = " << value;
    EXPECT_EQ(c.status().code(), StatusCode::kCorruption) << c.status().ToString();
    EXPECT_NE(c.status().message().find("w.safetensors"), std::string::npos) << c.status().ToString();
  }
}

}  // namespace
}  // namespace tf
