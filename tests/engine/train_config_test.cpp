// Tests for model/config.h and engine/train_config.h: valid configs parse; every malformed value
// (unknown key, wrong type, missing key, impossible shape, out-of-range number) is
// InvalidArgument whose message names the key and the source; ApplyOverrides routes keys to the
// right JSON and types values; ValidateRun cross-checks the two configs; every shipped config in
// configs/ parses; docs/configs.md's keys table is the one the table of keys generates.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/train_config.h"
#include "model/config.h"

namespace tf {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* kSource = "test_source.json";

// A valid byte-level model config to mutate.
json ValidModelJson() {
  return {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 64}};
}

// Asserts `s` is InvalidArgument and its message contains every needle.
void ExpectInvalid(const Status& s, const std::vector<std::string>& needles) {
  ASSERT_FALSE(s.ok()) << "expected an error containing '" << needles.front() << "'";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const std::string& n : needles) {
    EXPECT_NE(s.message().find(n), std::string::npos) << "expected '" << n << "' in: " << s.ToString();
  }
}

// ---- model config ----------------------------------------------------------------------------

TEST(ModelConfigTest, ValidConfigParses) {
  auto c = ParseModelConfig(ValidModelJson(), kSource);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->n_head, 2);
  EXPECT_EQ(c->n_embd, 32);
  EXPECT_EQ(c->vocab_size, 256);
  EXPECT_EQ(c->block_size, 64);
  EXPECT_EQ(c->head_size(), 16);
  // 256 is already a multiple of 64, so the default padding keeps it.
  EXPECT_EQ(c->padded_vocab_size, 256);
}

TEST(ModelConfigTest, DefaultPaddingRoundsUpTo64AndExplicitPaddingIsKept) {
  json j = ValidModelJson();
  j["vocab_size"] = 50257;  // 50257 / 64 = 785.27 -> 786 * 64 = 50304
  auto c = ParseModelConfig(j, kSource);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->padded_vocab_size, 50304);
  j["padded_vocab_size"] = 50260;  // any value >= vocab_size is accepted as given
  c = ParseModelConfig(j, kSource);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->padded_vocab_size, 50260);
}

TEST(ModelConfigTest, CommentKeysAreIgnoredAndJsonRoundTrips) {
  json j = ValidModelJson();
  j["_comment"] = "anything";
  auto c = ParseModelConfig(j, kSource);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = ParseModelConfig(ModelConfigToJson(*c), kSource);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *c);
}

TEST(ModelConfigTest, UnknownKeyIsRejected) {
  json j = ValidModelJson();
  j["n_layers"] = 2;  // typo of n_layer
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"n_layers", kSource});
}

TEST(ModelConfigTest, WrongTypesAreRejected) {
  json j = ValidModelJson();
  j["n_layer"] = "2";
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"n_layer", kSource});
  j = ValidModelJson();
  j["n_head"] = 2.5;
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"n_head", kSource});
  j = ValidModelJson();
  j["n_head"] = 2.0;  // a float, even an integral one, is not an integer
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"n_head", kSource});
  j = ValidModelJson();
  j["block_size"] = true;
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"block_size", kSource});
  ExpectInvalid(ParseModelConfig(json::array({1, 2}), kSource).status(), {kSource});
}

TEST(ModelConfigTest, MissingKeysAreRejected) {
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"}) {
    SCOPED_TRACE(key);
    json j = ValidModelJson();
    j.erase(key);
    ExpectInvalid(ParseModelConfig(j, kSource).status(), {key, kSource});
  }
}

TEST(ModelConfigTest, NonPositiveValuesAreRejected) {
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "block_size", "padded_vocab_size"}) {
    for (int v : {0, -3}) {
      SCOPED_TRACE(std::string(key) + "=" + std::to_string(v));
      json j = ValidModelJson();
      j[key] = v;
      ExpectInvalid(ParseModelConfig(j, kSource).status(), {key, kSource});
    }
  }
}

TEST(ModelConfigTest, EmbeddingNotDivisibleByHeadsIsRejected) {
  json j = ValidModelJson();
  j["n_head"] = 3;  // 32 % 3 == 2
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"n_embd", "n_head", kSource});
}

TEST(ModelConfigTest, PaddedVocabSmallerThanVocabIsRejected) {
  json j = ValidModelJson();
  j["padded_vocab_size"] = 255;
  ExpectInvalid(ParseModelConfig(j, kSource).status(), {"padded_vocab_size", "vocab_size", kSource});
}

TEST(ModelConfigTest, LoadModelConfigMissingFileIsNotFound) {
  const std::string path = (fs::path(::testing::TempDir()) / "tf_config_test_no_such_model.json").string();
  auto c = LoadModelConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << c.status().ToString();
  EXPECT_NE(c.status().message().find(path), std::string::npos) << c.status().ToString();
}

// ---- training config -------------------------------------------------------------------------

TEST(TrainConfigTest, EmptyObjectGivesDefaultsAndValuesAreRead) {
  auto d = ParseTrainConfig(json::object(), kSource);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const TrainConfig defaults;
  EXPECT_EQ(d->batch_size, defaults.batch_size);
  EXPECT_EQ(d->lr, defaults.lr);

  json j = {{"batch_size", 3},       {"seq_len", 7},          {"lr", 1e-3},    {"min_lr", 1e-4},
            {"lr_decay", "linear"},  {"shuffle", true},       {"seed", 42},    {"tokenizer", "gpt2"},
            {"train_data", "a.bin"}, {"_comment", "ignored"}, {"beta1", 0.5}};
  auto c = ParseTrainConfig(j, kSource);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->batch_size, 3);
  EXPECT_EQ(c->seq_len, 7);
  EXPECT_EQ(c->lr, 1e-3);
  EXPECT_EQ(c->min_lr, 1e-4);
  EXPECT_EQ(c->lr_decay, LrDecay::kLinear);
  EXPECT_TRUE(c->shuffle);
  EXPECT_EQ(c->seed, 42u);
  EXPECT_EQ(c->tokenizer, "gpt2");
  EXPECT_EQ(c->train_data, "a.bin");
  EXPECT_EQ(c->beta1, 0.5);
  EXPECT_EQ(c->tokens_per_step(), 3 * 7 * 1);

  // TrainConfigToJson is the inverse of the parser.
  auto again = ParseTrainConfig(TrainConfigToJson(*c), kSource);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(TrainConfigToJson(*again), TrainConfigToJson(*c));
}

TEST(TrainConfigTest, UnknownKeyIsRejected) {
  ExpectInvalid(ParseTrainConfig(json{{"learning_rate", 1e-3}}, kSource).status(), {"learning_rate", kSource});
}

TEST(TrainConfigTest, WrongTypesAreRejected) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"lr", "0.001"},      {"batch_size", 2.5}, {"batch_size", "4"}, {"tokenizer", 1},
      {"shuffle", 1},       {"out_dir", 7},      {"seed", -1},        {"seed", 1.5},
      {"lr_decay", 0},      {"max_steps", true},
  };
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key + " = " + value.dump());
    ExpectInvalid(ParseTrainConfig(json{{key, value}}, kSource).status(), {key, kSource});
  }
  ExpectInvalid(ParseTrainConfig(json::array(), kSource).status(), {kSource});
}

TEST(TrainConfigTest, OutOfRangeValuesAreRejected) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"lr", -1e-3},        {"beta1", 1.0},      {"beta1", 1.5},         {"beta2", 1.0},
      {"batch_size", 0},    {"seq_len", -1},     {"grad_accum_steps", 0}, {"max_steps", -1},
      {"eps", 0.0},         {"weight_decay", -0.1}, {"grad_clip", -1.0}, {"log_interval", 0},
      {"sample_temperature", -0.5}, {"device", "tpu"}, {"dtype", "fp8"}, {"compression", "int4"},
      {"compression", "topk:0"}, {"compression", "topk:1.5"}, {"bucket_mb", 0.0}, {"first_bucket_mb", -1.0},
      {"error_feedback", 1},  {"attention", "sdpa"}, {"recompute", 3}, {"recompute", -1},
      {"gelu_fusion", 3}, {"gelu_fusion", -2}, {"deterministic", 1}, {"zero_stage", 4}, {"zero_stage", -1},
      {"shard_group_size", -1}, {"shard_group_size", 1.5},
  };
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key + " = " + value.dump());
    ExpectInvalid(ParseTrainConfig(json{{key, value}}, kSource).status(), {key, kSource});
  }
}

TEST(TrainConfigTest, ZeroStagesReduceExactly) {
  for (const char* codec : {"none", "auto"}) {
    auto c = ParseTrainConfig(json{{"zero_stage", 3}, {"compression", codec}}, kSource);
    EXPECT_TRUE(c.ok()) << codec << ": " << c.status().ToString();
  }
  ExpectInvalid(ParseTrainConfig(json{{"zero_stage", 2}, {"compression", "int8"}}, kSource).status(),
                {"zero_stage 2", "compression", "int8", kSource});
}

TEST(TrainConfigTest, ShardGroupsNeedAShardedStageAndADivisorOfTheWorld) {
  auto c = ParseTrainConfig(json{{"zero_stage", 3}, {"shard_group_size", 2}}, kSource);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->shard_group_size, 2);
  EXPECT_TRUE(CheckShardGroupSize(*c, 4).ok());
  EXPECT_TRUE(CheckShardGroupSize(*c, 2).ok());
  ExpectInvalid(CheckShardGroupSize(*c, 3), {"shard_group_size", "2", "3 ranks", "divisor"});
  ExpectInvalid(ParseTrainConfig(json{{"shard_group_size", 2}}, kSource).status(),
                {"shard_group_size", "zero_stage is 0", kSource});
  EXPECT_TRUE(ParseTrainConfig(json{{"shard_group_size", 0}}, kSource).ok());
}

TEST(TrainConfigTest, LrDecayMustBeAKnownSchedule) {
  for (const char* ok : {"cosine", "linear", "constant"}) {
    auto c = ParseTrainConfig(json{{"lr_decay", ok}}, kSource);
    EXPECT_TRUE(c.ok()) << ok << ": " << c.status().ToString();
  }
  ExpectInvalid(ParseTrainConfig(json{{"lr_decay", "exponential"}}, kSource).status(),
                {"lr_decay", "exponential", kSource});
}

TEST(TrainConfigTest, MinLrAboveLrIsRejected) {
  ExpectInvalid(ParseTrainConfig(json{{"lr", 1e-4}, {"min_lr", 1e-3}}, kSource).status(), {"min_lr", "lr", kSource});
  // Equal is allowed (a flat schedule).
  auto c = ParseTrainConfig(json{{"lr", 1e-4}, {"min_lr", 1e-4}}, kSource);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
}

TEST(TrainConfigTest, TokenizerMustBeByteOrGpt2) {
  ExpectInvalid(ParseTrainConfig(json{{"tokenizer", "sentencepiece"}}, kSource).status(),
                {"tokenizer", "sentencepiece", kSource});
}

// ---- overrides and cross-checks --------------------------------------------------------------

TEST(OverridesTest, ModelKeysGoToModelOthersToTrain) {
  json model = ValidModelJson();
  json train = json::object();
  ApplyOverrides({{"n_layer", "4"}, {"lr", "1e-3"}, {"padded_vocab_size", "320"}, {"no_such_key", "1"}}, &model,
                 &train);
  EXPECT_EQ(model["n_layer"], json(4));
  EXPECT_TRUE(model["n_layer"].is_number_integer());
  EXPECT_EQ(model["padded_vocab_size"], json(320));
  EXPECT_FALSE(model.contains("lr"));
  EXPECT_FALSE(model.contains("no_such_key"));
  EXPECT_TRUE(train["lr"].is_number_float());
  EXPECT_DOUBLE_EQ(train["lr"].get<double>(), 1e-3);
  EXPECT_FALSE(train.contains("n_layer"));
  // Unknown keys are routed to the training JSON, so its parser rejects them.
  ExpectInvalid(ParseTrainConfig(train, "overrides").status(), {"no_such_key"});
}

TEST(OverridesTest, ValuesParseAsJsonElseStrings) {
  json model = json::object();
  json train = json::object();
  ApplyOverrides({{"shuffle", "true"},
                  {"max_steps", "50"},
                  {"lr_decay", "linear"},
                  {"train_data", "data/x/train.bin"},
                  {"sample_prompt", "[1, 2]"},  // a JSON array is not a config value: kept as text
                  {"out_dir", "{not json"}},
                 &model, &train);
  EXPECT_EQ(train["shuffle"], json(true));
  EXPECT_EQ(train["max_steps"], json(50));
  EXPECT_EQ(train["lr_decay"], json("linear"));
  EXPECT_EQ(train["train_data"], json("data/x/train.bin"));
  EXPECT_EQ(train["sample_prompt"], json("[1, 2]"));
  EXPECT_EQ(train["out_dir"], json("{not json"));
  auto c = ParseTrainConfig(train, "overrides");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->shuffle);
  EXPECT_EQ(c->max_steps, 50);
  EXPECT_EQ(c->lr_decay, LrDecay::kLinear);
  EXPECT_EQ(c->sample_prompt, "[1, 2]");
}

TEST(OverridesTest, LaterOverrideWinsAndReplacesFileValue) {
  json model = ValidModelJson();
  json train = {{"lr", 3e-3}};
  ApplyOverrides({{"lr", "1e-3"}, {"lr", "2e-3"}, {"n_head", "4"}}, &model, &train);
  EXPECT_DOUBLE_EQ(train["lr"].get<double>(), 2e-3);
  EXPECT_EQ(model["n_head"], json(4));
}

TEST(ValidateRunTest, SeqLenLongerThanBlockSizeIsRejected) {
  auto model = ParseModelConfig(ValidModelJson(), kSource);  // block_size 64
  ASSERT_TRUE(model.ok());
  TrainConfig train;
  train.seq_len = 64;
  EXPECT_TRUE(ValidateRun(*model, train).ok());
  train.seq_len = 65;
  ExpectInvalid(ValidateRun(*model, train), {"seq_len", "block_size", "65", "64"});
}

TEST(ValidateRunTest, TokenizerMustMatchTheVocabulary) {
  auto model = ParseModelConfig(ValidModelJson(), kSource);  // vocab 256
  ASSERT_TRUE(model.ok());
  TrainConfig train;
  train.seq_len = 16;
  EXPECT_TRUE(ValidateRun(*model, train).ok());  // "auto": decided from the data
  train.tokenizer = "gpt2";
  ExpectInvalid(ValidateRun(*model, train), {"gpt2", "50257", "vocab_size 256", "--tokenizer byte"});
  GPT2Config big = *model;
  big.vocab_size = 50257;
  big.padded_vocab_size = 50304;
  train.tokenizer = "byte";
  ExpectInvalid(ValidateRun(big, train), {"byte", "256 tokens", "vocab_size 50257", "byte-small.json"});
  train.tokenizer = "gpt2";
  EXPECT_TRUE(ValidateRun(big, train).ok());
}

// ---- shipped configs -------------------------------------------------------------------------

TEST(ShippedConfigsTest, EveryConfigParses) {
  const fs::path root = fs::path(TF_SOURCE_DIR) / "configs";
  int models = 0, trains = 0;
  for (const auto& e : fs::directory_iterator(root / "model")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    auto c = LoadModelConfig(e.path().string());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    ++models;
  }
  for (const auto& e : fs::directory_iterator(root / "train")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    auto j = ReadJsonFile(e.path().string(), "training config");
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    auto c = ParseTrainConfig(*j, e.path().string());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    ++trains;
  }
  EXPECT_GE(models, 1);
  EXPECT_GE(trains, 1);
}

TEST(ShippedConfigsTest, FortunesJobFitsByteSmall) {
  const fs::path root = fs::path(TF_SOURCE_DIR) / "configs";
  auto j = ReadJsonFile((root / "train" / "fortunes.json").string(), "training config");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  auto train = ParseTrainConfig(*j, "fortunes.json");
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  auto small = LoadModelConfig((root / "model" / "byte-small.json").string());
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_TRUE(ValidateRun(*small, *train).ok()) << ValidateRun(*small, *train).ToString();
}

TEST(ShippedConfigsTest, GPT2SmallHasHuggingFaceParameterCount) {
  auto c = LoadModelConfig(std::string(TF_SOURCE_DIR) + "/configs/model/gpt2-124m.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // Hugging Face's GPT2LMHeadModel "gpt2": 124,439,808 parameters (tied lm_head not counted twice).
  EXPECT_EQ(NumParameters(*c), 124439808);
}

// ---- docs ------------------------------------------------------------------------------------

// docs/configs.md holds TrainConfigKeysMarkdown() between these two lines. With
// TRAINFLOW_WRITE_DOCS=1 the test rewrites that section instead of failing.
constexpr const char* kTableBegin =
    "<!-- The keys table comes from engine/train_config.cpp (TrainConfigKeysMarkdown); "
    "tests/engine/train_config_test.cpp checks it. -->\n";
constexpr const char* kTableEnd = "<!-- End of the keys table. -->\n";

TEST(TrainConfigDocsTest, KeysTableInDocsIsTheGeneratedOne) {
  const fs::path path = fs::path(TF_SOURCE_DIR) / "docs" / "configs.md";
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::string docs = text.str();
  const size_t begin = docs.find(kTableBegin);
  const size_t end = docs.find(kTableEnd);
  ASSERT_NE(begin, std::string::npos) << path << " lacks the line " << kTableBegin;
  ASSERT_NE(end, std::string::npos) << path << " lacks the line " << kTableEnd;
  ASSERT_LT(begin, end);
  const size_t from = begin + std::string(kTableBegin).size();
  const std::string generated = TrainConfigKeysMarkdown();
  if (const char* w = std::getenv("TRAINFLOW_WRITE_DOCS"); w != nullptr && std::string(w) == "1") {
    docs.replace(from, end - from, generated);
    std::ofstream(path) << docs;
  }
  EXPECT_EQ(docs.substr(from, end - from), generated)
      << path << "'s keys table differs from the table of keys in engine/train_config.cpp; rerun with "
      << "TRAINFLOW_WRITE_DOCS=1 to rewrite it";
}

TEST(TrainConfigDocsTest, EveryKeyIsReadWrittenAndDocumented) {
  const json defaults = TrainConfigToJson(TrainConfig{});
  const std::string table = TrainConfigKeysMarkdown();
  for (const auto& [key, value] : defaults.items()) {
    SCOPED_TRACE(key);
    EXPECT_NE(table.find("| `" + key + "` |"), std::string::npos);
    auto c = ParseTrainConfig(json{{key, value}}, kSource);  // every default is accepted as given
    EXPECT_TRUE(c.ok()) << c.status().ToString();
  }
  EXPECT_GE(defaults.size(), 60u);
}

}  // namespace
}  // namespace tf
