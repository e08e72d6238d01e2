// End-to-end tests of the `trainflow` binary (engine/cli/cli.cpp): every user mistake exits with code
// 2 or 4 (never 1, a crash or a signal) and a message on stderr naming the offending key or file; a
// tiny prepare -> train -> eval -> sample -> export -> bench session succeeds, writes its files,
// and is deterministic. Each run is a few milliseconds to a second on the byte-tiny model.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/data/token_file.h"
#include "model/config.h"
#include "model/gpt2_weights.h"
#include "model/safetensors.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

using cli_testing::CliFixture;
using cli_testing::kBinary;
using cli_testing::kByteTiny;
using cli_testing::ReadAll;
using cli_testing::RunResult;
using CliTest = CliFixture;

// ---- failures --------------------------------------------------------------------------------

TEST_F(CliTest, ValidTinyRunSucceeds) {
  // The baseline the failure cases below differ from in one argument each.
  const RunResult r = Train({"--train_data", TokenFile("train.bin")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(fs::exists(Path("out/model.safetensors"))) << r;
}

TEST_F(CliTest, UnknownOverrideKey) {
  const RunResult r = Train({"--train_data", TokenFile("train.bin"), "--learning_rate", "1e-3"});
  ExpectCleanFailure(r, {"learning_rate"});
}

TEST_F(CliTest, OverrideWithoutValue) {
  const RunResult r = Train({"--train_data", TokenFile("train.bin"), "--lr"});
  ExpectCleanFailure(r, {"--lr"});
}

TEST_F(CliTest, WrongOverrideType) {
  const RunResult r = Train({"--train_data", TokenFile("train.bin"), "--batch_size", "two"});
  ExpectCleanFailure(r, {"batch_size", "two"});
}

TEST_F(CliTest, ModelConfigWithEmbeddingNotDivisibleByHeads) {
  const std::string model = Path("bad_model.json");
  std::ofstream(model) << R"({"n_layer": 1, "n_head": 3, "n_embd": 32, "vocab_size": 256, "block_size": 64})";
  const RunResult r = Train({"--train_data", TokenFile("train.bin")}, model);
  ExpectCleanFailure(r, {"n_embd", "n_head", model});
}

TEST_F(CliTest, ModelOverrideIsValidatedToo) {
  const RunResult r = Train({"--train_data", TokenFile("train.bin"), "--n_head", "3"});
  ExpectCleanFailure(r, {"n_embd", "n_head", kByteTiny});
}

TEST_F(CliTest, SeqLenLongerThanBlockSize) {
  const RunResult r = Train({"--train_data", TokenFile("train.bin"), "--seq_len", "65"});  // block_size 64
  ExpectCleanFailure(r, {"seq_len", "65", "block_size", "64"});
}

TEST_F(CliTest, MissingTrainDataFile) {
  const std::string missing = Path("no_such_train.bin");
  const RunResult r = Train({"--train_data", missing});
  ExpectCleanFailure(r, {missing});
}

TEST_F(CliTest, NoTrainDataGiven) {
  const RunResult r = Train({});
  ExpectCleanFailure(r, {"train_data"});
}

TEST_F(CliTest, MissingValDataFile) {
  const std::string missing = Path("no_such_val.bin");
  const RunResult r = Train({"--train_data", TokenFile("train.bin"), "--val_data", missing});
  ExpectCleanFailure(r, {missing});
}

TEST_F(CliTest, TruncatedTokenFile) {
  const std::string path = TokenFile("truncated.bin", 100);
  fs::resize_file(path, fs::file_size(path) - 10);
  const RunResult r = Train({"--train_data", path});
  ExpectCleanFailure(r, {path, "truncated"});
}

TEST_F(CliTest, TokenIdOutsideVocabulary) {
  const std::string path = Path("big_ids.bin");
  std::vector<uint16_t> t(50, 'x');
  t[17] = 300;  // byte-tiny has vocab_size 256
  ASSERT_TRUE(WriteTokenFile(path, t).ok());
  const RunResult r = Train({"--train_data", path});
  ExpectCleanFailure(r, {path, "300", "17", "256"});
}

TEST_F(CliTest, MissingModelFile) {
  const std::string missing = Path("no_such_model.json");
  const RunResult r = Train({"--train_data", TokenFile("train.bin")}, missing);
  ExpectCleanFailure(r, {missing});
}

TEST_F(CliTest, ModelFlagIsRequired) {
  const RunResult r = Run({"train", "--train_data", TokenFile("train.bin")});
  ExpectCleanFailure(r, {"--model"});
}

TEST_F(CliTest, MissingTrainConfigFile) {
  const std::string missing = Path("no_such_train.json");
  const RunResult r = Train({"--train", missing, "--train_data", TokenFile("train.bin")});
  ExpectCleanFailure(r, {missing});
}

TEST_F(CliTest, UnknownSubcommand) {
  const RunResult r = Run({"fly"});
  ExpectCleanFailure(r, {"unknown command 'fly'"});
}

// `trainflow env` reports the build and what it finds, and never fails for lack of a GPU, NCCL or
// cuDNN (it says what was tried instead).
TEST_F(CliTest, EnvReportsBuildAndLibraries) {
  const RunResult r = Run({"env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  for (const char* key : {"build:", "CPU:", "CUDA:", "MPI:"}) EXPECT_NE(r.out.find(key), std::string::npos) << key << r;
  if (r.out.find("CUDA backend yes") != std::string::npos) {
    for (const char* key : {"GPUs:", "cuBLASLt:", "NCCL:", "cuDNN:"}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << key << r;
    }
  }
}

TEST_F(CliTest, EvalOnMissingWeights) {
  const std::string missing = Path("no_such.safetensors");
  const RunResult r = Run({"eval", "--weights", missing, "--data", TokenFile("val.bin")});
  ExpectCleanFailure(r, {missing});
}

// ---- the happy path --------------------------------------------------------------------------

TEST_F(CliTest, PrepareTrainEvalSampleExportBench) {
  // A small fortune-style corpus: documents separated by lines holding only "%".
  const std::string corpus = Path("corpus.txt");
  {
    std::ofstream f(corpus);
    for (int d = 0; d < 20; ++d) {
      f << "Fortune number " << d << ": the quick brown fox jumps over the lazy dog.\n";
      f << "A second line, so that documents have some length to them.\n%\n";
    }
  }
  const std::string data = Path("data");
  RunResult r = Run({"prepare", "--input", corpus, "--out-dir", data, "--delimiter", "%", "--val-fraction", "0.2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string train_bin = data + "/train.bin", val_bin = data + "/val.bin";
  ASSERT_TRUE(fs::exists(train_bin)) << r;
  ASSERT_TRUE(fs::exists(val_bin)) << r;
  auto train_tokens = ReadTokenFile(train_bin);
  auto val_tokens = ReadTokenFile(val_bin);
  ASSERT_TRUE(train_tokens.ok() && val_tokens.ok());
  // Every document (~120 bytes) lands in exactly one split: the two hold all the text.
  EXPECT_GT(train_tokens->size(), 1000u);
  EXPECT_GT(val_tokens->size(), 100u);

  const std::string out = Path("run");
  r = Run({"train", "--model", kByteTiny, "--max_steps", "3", "--batch_size", "2", "--seq_len", "16", "--out_dir", out,
           "--train_data", train_bin, "--val_data", val_bin, "--sample_tokens", "8", "--eval_batches", "1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string weights = out + "/model.safetensors";
  ASSERT_TRUE(fs::exists(weights)) << r;
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_TRUE(fs::exists(out + "/metrics.jsonl"));
  {
    // metrics.jsonl: one line per step; the last also has the final validation loss.
    std::istringstream lines(ReadAll(out + "/metrics.jsonl"));
    std::string line;
    int steps = 0, vals = 0;
    while (std::getline(lines, line)) {
      const auto j = nlohmann::json::parse(line);
      steps += j.contains("loss");
      vals += j.contains("val_loss");
      if (j.contains("loss")) {
        EXPECT_TRUE(std::isfinite(j.at("loss").get<double>())) << line;
      }
    }
    EXPECT_EQ(steps, 3);
    EXPECT_EQ(vals, 1);
  }
  // The weights are a valid Hugging Face file for the model.
  auto config = LoadModelConfig(kByteTiny);
  ASSERT_TRUE(config.ok());
  auto file = ReadSafetensors(weights);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(file->metadata.contains("trainflow.model_config"));

  // eval: a finite loss, the same twice. An untrained byte model sits near ln(256) = 5.55.
  const std::vector<std::string> eval_args = {"eval", "--weights", weights, "--data", val_bin, "--batch-size", "2",
                                              "--seq-len", "16", "--batches", "2"};
  r = Run(eval_args);
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto pos = r.out.find("loss ");
  ASSERT_NE(pos, std::string::npos) << r;
  const double loss = std::stod(r.out.substr(pos + 5));
  EXPECT_GT(loss, 0.0) << r;
  EXPECT_LT(loss, 8.0) << r;
  EXPECT_EQ(Run(eval_args).out, r.out);

  // sample: deterministic for a seed; 5 byte tokens and a newline.
  const std::vector<std::string> sample_args = {"sample", "--weights", weights, "--tokens", "5", "--seed", "1"};
  const RunResult s1 = Run(sample_args);
  ASSERT_EQ(s1.exit_code, 0) << s1;
  const RunResult s2 = Run(sample_args);
  ASSERT_EQ(s2.exit_code, 0) << s2;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_EQ(s1.out.size(), 6u) << s1;

  // export to bf16: model.safetensors + config.json, within bf16 rounding of the f32 weights.
  const std::string exported = Path("hf");
  r = Run({"export", "--weights", weights, "--out", exported, "--dtype", "bf16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_TRUE(fs::exists(exported + "/model.safetensors")) << r;
  ASSERT_TRUE(fs::exists(exported + "/config.json")) << r;
  const auto hf = nlohmann::json::parse(ReadAll(exported + "/config.json"));
  EXPECT_EQ(hf.at("vocab_size"), 256);
  EXPECT_EQ(hf.at("n_layer"), config->n_layer);
  std::vector<float> f32(static_cast<size_t>(ParameterLayout(*config).total()));
  std::vector<float> bf16(f32.size());
  ASSERT_TRUE(ImportHFWeights(weights, *config, f32).ok());
  Status st = ImportHFWeights(exported + "/model.safetensors", *config, bf16);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t k = 0; k < f32.size(); ++k) {
    // bf16 round-to-nearest: relative error at most 2^-8.
    ASSERT_LE(std::fabs(bf16[k] - f32[k]), std::ldexp(std::fabs(f32[k]), -8)) << k;
  }

  // A bad --dtype is a clean error naming the flag.
  r = Run({"export", "--weights", weights, "--out", Path("hf2"), "--dtype", "f64"});
  ExpectCleanFailure(r, {"--dtype", "f64"});

  // bench: a machine-readable result line.
  r = Run({"bench", "--model", kByteTiny, "--steps", "2", "--warmup", "1", "--batch-size", "2", "--seq-len", "16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("BENCH_RESULT ms_per_step="), std::string::npos) << r;
  if (r.out.find("device=cuda") != std::string::npos) {
    // On a GPU (or the emulated one): the per-piece profile with each piece's roofline.
    r = Run({"bench", "--model", kByteTiny, "--steps", "1", "--warmup", "1", "--batch-size", "2", "--seq-len", "16",
             "--profile-steps", "1"});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_NE(r.out.find("PROFILE qkv fwd"), std::string::npos) << r;
    EXPECT_NE(r.out.find("roofline"), std::string::npos) << r;
    EXPECT_NE(r.out.find("bench: roofline step"), std::string::npos) << r;
  }
  // --device defaults to auto (the GPU when one is visible, as for train); others are refused by name.
  r = Run({"bench", "--model", kByteTiny, "--device", "tpu", "--steps", "1"});
  ExpectCleanFailure(r, {"'device'", "tpu"});
}

}  // namespace
}  // namespace tf
