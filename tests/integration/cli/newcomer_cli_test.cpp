// The path a new user walks, through the real binary: weights carry their model, tokenizer, trained
// length and training config, so `eval` and `sample` without flags reproduce the run; mismatched
// tokenizers and data are refused with what to pass; a GPT-2-BPE run on one text file works from
// any working directory; and the small inconsistencies users met (dtype names, greedy sampling,
// counts, help texts, JSON positions) stay fixed.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/data/token_file.h"
#include "engine/weights_card.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

using cli_testing::CliFixture;
using cli_testing::kByteTiny;
using cli_testing::Quote;
using cli_testing::ReadAll;
using cli_testing::RunResult;

// Where the setup scripts put GPT-2's tokenizer files: beside the build, found by the binary itself.
const fs::path kGpt2Dir = fs::path(TF_SOURCE_DIR) / "third_party" / "gpt2-tokenizer";
bool HaveGpt2Files() { return fs::exists(kGpt2Dir / "encoder.json") && fs::exists(kGpt2Dir / "vocab.bpe"); }

// The last number after `key` in `text` (e.g. "val loss 1.2345"), NaN when there is none.
double LastNumberAfter(const std::string& text, const std::string& key) {
  const auto pos = text.rfind(key);
  if (pos == std::string::npos) return std::nan("");
  return std::stod(text.substr(pos + key.size()));
}

class NewcomerCli : public CliFixture {
 protected:
  // A small English-like corpus in one file: numbered lines, fortune-style "%" documents.
  std::string Corpus(const std::string& name, int docs) {
    const std::string p = Path(name);
    std::ofstream f(p);
    const char* words[] = {"river", "stone", "garden", "lamp", "window", "bird", "letter", "bridge"};
    for (int d = 0; d < docs; ++d) {
      f << "The " << words[d % 8] << " and the " << words[(d * 3 + 1) % 8] << " met again on day " << d << ".\n";
      f << "Nobody said a word about the " << words[(d * 5 + 2) % 8] << ".\n%\n";
    }
    return p;
  }
  // prepare (byte, "%") + a short byte-tiny run at T=16 with validation; returns its weights.
  std::string TrainSmallRun(const std::vector<std::string>& extra = {}) {
    RunResult r = Run({"prepare", "--input", Corpus("corpus.txt", 200), "--out-dir", Path("data"), "--delimiter", "%"});
    EXPECT_EQ(r.exit_code, 0) << r;
    std::vector<std::string> args = {"train", "--model", kByteTiny, "--max_steps", "12", "--batch_size", "4",
                                     "--seq_len", "16", "--eval_batches", "3", "--sample_tokens", "0",
                                     "--train_data", Path("data/train.bin"), "--val_data", Path("data/val.bin"),
                                     "--out_dir", Path("run")};
    args.insert(args.end(), extra.begin(), extra.end());
    r = Run(args);
    EXPECT_EQ(r.exit_code, 0) << r;
    train_out_ = r.out;
    return Path("run/model.safetensors");
  }
  // A model with GPT-2's vocabulary, small enough to run in a test.
  std::string Gpt2VocabModel() {
    const std::string p = Path("gpt2-vocab-tiny.json");
    std::ofstream(p) << R"({"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 50257, "block_size": 32})";
    return p;
  }
  std::string train_out_;
};

TEST_F(NewcomerCli, WeightsCarryTheirModelTokenizerLengthAndRun) {
  const std::string weights = TrainSmallRun();
  auto card = ReadWeightsCard(weights);
  ASSERT_TRUE(card.ok()) << card.status().ToString();
  ASSERT_TRUE(card->model.has_value());
  EXPECT_EQ(card->model->n_layer, 2);
  EXPECT_EQ(card->model->block_size, 64);
  EXPECT_EQ(card->tokenizer, "byte");  // recorded by prepare in the token files, carried by train
  EXPECT_EQ(card->seq_len, 16);
  EXPECT_EQ(card->world, 1);
  EXPECT_EQ(card->step, 12);
  ASSERT_TRUE(card->train_config.is_object());
  EXPECT_EQ(card->train_config.at("batch_size"), 4);
  EXPECT_EQ(card->train_config.at("val_data"), Path("data/val.bin"));
  // export carries the card over, in any dtype.
  const RunResult r = Run({"export", "--weights", weights, "--out", Path("hf"), "--dtype", "bf16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto exported = ReadWeightsCard(Path("hf/model.safetensors"));
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->tokenizer, "byte");
  EXPECT_EQ(exported->seq_len, 16);
  EXPECT_EQ(exported->train_config, card->train_config);
}

TEST_F(NewcomerCli, EvalWithoutFlagsPrintsTheValidationLossTrainingReported) {
  const std::string weights = TrainSmallRun();
  const double trained = LastNumberAfter(train_out_, "val loss ");
  ASSERT_TRUE(std::isfinite(trained)) << train_out_;
  RunResult r = Run({"eval", "--weights", weights});
  ASSERT_EQ(r.exit_code, 0) << r;
  const double evaluated = LastNumberAfter(r.out, "loss ");
  EXPECT_EQ(fmt::format("{:.4f}", evaluated), fmt::format("{:.4f}", trained)) << train_out_ << r;
  EXPECT_NE(r.out.find("from the training run recorded in the weights"), std::string::npos) << r;
  // Run from another directory, with the data named explicitly: the same figure.
  r = Run({"eval", "--weights", weights, "--data", Path("data/val.bin"), "--batch-size", "4", "--seq-len", "16",
           "--batches", "3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(fmt::format("{:.4f}", LastNumberAfter(r.out, "loss ")), fmt::format("{:.4f}", trained)) << r;
}

TEST_F(NewcomerCli, EvalReadsTheWholeFileOnceAndRefusesToWrapSilently) {
  const std::string weights = TrainSmallRun();
  RunResult r = Run({"eval", "--weights", weights, "--batches", "all"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("the whole file once"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("--batches all for"), std::string::npos) << r;  // no hint to do what it did
  EXPECT_TRUE(std::isfinite(LastNumberAfter(r.out, "loss "))) << r;
  // More batches than the file holds: refused, naming both ways out, and quickly (no minutes of work).
  r = Run({"eval", "--weights", weights, "--batches", "100000"});
  ExpectCleanFailure(r, {"--batches all", "--wrap", "read it again"});
  r = Run({"eval", "--weights", weights, "--batches", "400", "--wrap"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("repeat its start"), std::string::npos) << r;
  r = Run({"eval", "--weights", weights, "--batches", "three"});
  ExpectCleanFailure(r, {"--batches", "three"});
}

TEST_F(NewcomerCli, SampleTakesTheRunsTemperatureAndZeroIsGreedy) {
  const std::string weights = TrainSmallRun({"--sample_temperature", "0.5", "--sample_top_k", "7"});
  RunResult r = Run({"sample", "--weights", weights, "--tokens", "20", "--seed", "3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("tokenizer byte, temperature 0.5, top-k 7, context window 16 tokens (the trained length)"),
            std::string::npos)
      << r;
  const RunResult g1 = Run({"sample", "--weights", weights, "--tokens", "30", "--temperature", "0", "--seed", "1"});
  const RunResult g2 = Run({"sample", "--weights", weights, "--tokens", "30", "--temperature", "0", "--seed", "2"});
  ASSERT_EQ(g1.exit_code, 0) << g1;
  EXPECT_NE(g1.err.find("(greedy)"), std::string::npos) << g1;
  EXPECT_EQ(g1.out, g2.out);  // greedy: the seed does not matter
  ExpectCleanFailure(Run({"sample", "--weights", weights, "--temperature", "-1"}), {"--temperature", ">= 0"});
}

TEST_F(NewcomerCli, AGpt2VocabularyModelRefusesTheByteTokenizer) {
  RunResult r = Run({"export", "--init", "--model", Gpt2VocabModel(), "--out", Path("hf"), "--dtype", "fp16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto hf = nlohmann::json::parse(ReadAll(Path("hf/config.json")));
  EXPECT_EQ(hf.at("torch_dtype"), "float16");
  EXPECT_EQ(hf.at("eos_token_id"), 50256);
  r = Run({"sample", "--weights", Path("hf/model.safetensors"), "--tokenizer", "byte", "--tokens", "3"});
  ExpectCleanFailure(r, {"gpt2 tokenizer", "--tokenizer byte", "leave --tokenizer out"});
  if (!HaveGpt2Files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir << " (scripts/fetch_gpt2_tokenizer.sh)";
  // Without --tokenizer the vocabulary decides, and the files are found beside the build.
  r = Run({"sample", "--weights", Path("hf/model.safetensors"), "--tokens", "3", "--prompt", "Hello"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("tokenizer gpt2"), std::string::npos) << r;
}

TEST_F(NewcomerCli, TrainRefusesDataOfAnotherTokenizer) {
  // Byte-range ids, but the file says a GPT-2 tokenizer made them: a byte model must not learn them.
  std::vector<uint16_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>('a' + i % 26);
  ASSERT_TRUE(WriteTokenFile(Path("gpt2.bin"), tokens, true, Env::Default(), TokenFileTokenizer{"gpt2", 50257, 1}).ok());
  RunResult r = Train({"--train_data", Path("gpt2.bin")});
  ExpectCleanFailure(r, {"gpt2.bin", "'gpt2' has 50257 tokens", "vocab_size 256"});
  // The README's old first example: a 50257-vocabulary model on byte data.
  ASSERT_TRUE(WriteTokenFile(Path("byte.bin"), tokens, true, Env::Default(), TokenFileTokenizer{"byte", 256, 0}).ok());
  r = Train({"--train_data", Path("byte.bin")}, Gpt2VocabModel());
  ExpectCleanFailure(r, {"byte.bin", "'byte' has 256 tokens", "vocab_size 50257", "byte-small.json"});
  // Byte data with a config that insists on gpt2.
  r = Train({"--train_data", Path("byte.bin"), "--tokenizer", "gpt2"}, Gpt2VocabModel());
  ExpectCleanFailure(r, {"byte.bin", "was tokenized with the byte tokenizer", "\"tokenizer\": \"gpt2\""});
  // Train and validation from different tokenizers.
  ASSERT_TRUE(WriteTokenFile(Path("val.bin"), tokens, true, Env::Default(), TokenFileTokenizer{"gpt2", 50257, 1}).ok());
  r = Train({"--train_data", Path("byte.bin"), "--val_data", Path("val.bin"), "--eval_batches", "1"});
  ExpectCleanFailure(r, {"byte.bin", "val.bin", "tokenized differently"});
}

TEST_F(NewcomerCli, Gpt2RunOnOneTextFileFromAnyDirectory) {
  if (!HaveGpt2Files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir << " (scripts/fetch_gpt2_tokenizer.sh)";
  // The test runs in its own temporary directory, far from the checkout, with no --tokenizer-dir.
  {
    std::ofstream f(Path("story.txt"));
    for (int i = 0; i < 300; ++i) f << "Once upon a time, in chapter " << i << ", the travellers rested by the sea.\n";
  }
  RunResult r = Run({"prepare", "--input", "story.txt", "--out-dir", "data", "--tokenizer", "gpt2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_TRUE(fs::exists(Path("data/val.bin"))) << r;  // one file still gets a validation split
  TokenFileTokenizer rec;
  ASSERT_TRUE(ReadTokenFile(Path("data/train.bin"), Env::Default(), &rec).ok());
  EXPECT_EQ(rec.kind, "gpt2");
  EXPECT_EQ(rec.vocab_size, 50257);
  EXPECT_NE(rec.fingerprint, 0u);

  r = Run({"train", "--model", Gpt2VocabModel(), "--max_steps", "2", "--batch_size", "2", "--seq_len", "16",
           "--train_data", "data/train.bin", "--val_data", "data/val.bin", "--eval_batches", "1", "--sample_tokens",
           "4", "--out_dir", "out"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("tokenizer gpt2"), std::string::npos) << r;
  auto card = ReadWeightsCard(Path("out/model.safetensors"));
  ASSERT_TRUE(card.ok()) << card.status().ToString();
  EXPECT_EQ(card->tokenizer, "gpt2");
  EXPECT_EQ(card->tokenizer_fingerprint, rec.fingerprint);
  r = Run({"sample", "--weights", "out/model.safetensors", "--tokens", "4", "--prompt", "Once"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out.rfind("Once", 0), 0u) << r;

  // TRAINFLOW_TOKENIZER_DIR is taken as given: a wrong one is named, with how to fetch the files.
  r = RunWith("env TRAINFLOW_TOKENIZER_DIR=" + Path("nowhere"),
              {"prepare", "--input", "story.txt", "--out-dir", "data2", "--tokenizer", "gpt2"});
  ExpectCleanFailure(r, {"TRAINFLOW_TOKENIZER_DIR", Path("nowhere"), "fetch_gpt2_tokenizer.sh"});
  r = RunWith("env TRAINFLOW_TOKENIZER_DIR=" + kGpt2Dir.string(),
              {"prepare", "--input", "story.txt", "--out-dir", "data3", "--tokenizer", "gpt2"});
  EXPECT_EQ(r.exit_code, 0) << r;
  // An explicit --tokenizer-dir without the files names the missing file.
  r = Run({"prepare", "--input", "story.txt", "--out-dir", "data4", "--tokenizer", "gpt2", "--tokenizer-dir", "."});
  ExpectCleanFailure(r, {"encoder.json", "--tokenizer-dir", "fetch_gpt2_tokenizer.sh"});
}

TEST_F(NewcomerCli, PrepareSaysWhatItDidWithValidation) {
  const std::string corpus = Corpus("corpus.txt", 60);
  RunResult r = Run({"prepare", "--input", corpus, "--out-dir", "data", "--delimiter", "%"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("data/val.bin"), std::string::npos) << r;
  r = Run({"prepare", "--input", corpus, "--out-dir", "data", "--delimiter", "%", "--val-fraction", "0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("no validation split (--val-fraction 0); removed the earlier val.bin"), std::string::npos) << r;
  EXPECT_FALSE(fs::exists(Path("data/val.bin")));
  // One file, no delimiter: cut into pieces, still split.
  r = Run({"prepare", "--input", corpus, "--out-dir", "one"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(fs::exists(Path("one/val.bin"))) << r;
  EXPECT_NE(r.out.find("1 file, 1 document in"), std::string::npos) << r;
}

TEST_F(NewcomerCli, ZeroStepsEvaluatesStepZeroOnce) {
  TrainSmallRun();  // for its data
  for (const char* every : {"0", "5"}) {
    const RunResult r = Run({"train", "--model", kByteTiny, "--max_steps", "0", "--eval_interval", every, "--batch_size",
                             "2", "--seq_len", "16", "--train_data", Path("data/train.bin"), "--val_data",
                             Path("data/val.bin"), "--eval_batches", "1", "--sample_tokens", "0", "--out_dir",
                             Path("zero"), "--fresh"});
    ASSERT_EQ(r.exit_code, 0) << r;
    size_t evals = 0;
    for (size_t p = r.out.find("val loss"); p != std::string::npos; p = r.out.find("val loss", p + 1)) ++evals;
    EXPECT_EQ(evals, 1u) << "eval_interval " << every << "\n" << r;
    // No step ran: the one record is the evaluation before it.
    const std::string metrics = ReadAll(Path("zero/metrics.jsonl"));
    EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 1) << metrics;
    EXPECT_NE(metrics.find("\"event\":\"eval\""), std::string::npos) << metrics;
  }
}

TEST_F(NewcomerCli, TrainFromWeightsNeedsNoModelFlag) {
  const std::string weights = TrainSmallRun();
  const RunResult r = Run({"train", "--init-from", weights, "--max_steps", "1", "--batch_size", "2", "--seq_len", "16",
                           "--train_data", Path("data/train.bin"), "--sample_tokens", "0", "--out_dir", Path("more")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("2 layers"), std::string::npos) << r;
  ExpectCleanFailure(Run({"train", "--train_data", Path("data/train.bin")}), {"--model is required", "--init-from"});
}

TEST_F(NewcomerCli, MessagesAndHelpSayWhatIsTrue) {
  // Help: both backends; gelu_fusion's default as documented.
  RunResult r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("CPU and CUDA backends"), std::string::npos) << r;
  r = Run({"bench", "--help"});
  EXPECT_EQ(r.out.find("bf16 2"), std::string::npos) << r;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(--gelu-fusion +-1, 0, 1 or 2, default -1: .*\(-1: the default, )"
                                                  R"(currently 0 for both dtypes\))")))
      << r;
  // Counts in words: "1 thread", parameters in K/M, no MFU or device memory on the CPU.
  r = Train({"--train_data", TokenFile("train.bin"), "--threads", "1", "--device", "cpu"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("cpu (1 thread)"), std::string::npos) << r;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(, \d+\.\dK parameters)"))) << r;
  r = Run({"bench", "--model", kByteTiny, "--steps", "1", "--warmup", "0", "--batch-size", "1", "--seq-len", "8",
           "--device", "cpu"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out.find("mfu="), std::string::npos) << r;
  EXPECT_EQ(r.out.find("device_used_gb="), std::string::npos) << r;
  EXPECT_NE(r.out.find("K params"), std::string::npos) << r;
  // Evaluating more than the validation file holds is said, not done silently.
  r = Train({"--train_data", TokenFile("train.bin"), "--val_data", TokenFile("val.bin", 100), "--eval_batches", "20",
             "--fresh"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("val.bin holds 100 tokens, but each evaluation reads 161"), std::string::npos) << r;
  // A JSON syntax error names the line and column.
  std::ofstream(Path("broken.json")) << "{\"n_layer\": 2,\n  \"n_head\" 2}";
  ExpectCleanFailure(Train({"--train_data", TokenFile("train.bin")}, Path("broken.json")),
                     {"broken.json", "line 2, column"});
  // export's dtype names are train's (the short ones still work).
  r = Run({"export", "--init", "--model", kByteTiny, "--out", Path("hf"), "--dtype", "fp16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto hf = nlohmann::json::parse(ReadAll(Path("hf/config.json")));
  EXPECT_EQ(hf.at("torch_dtype"), "float16");
  EXPECT_TRUE(hf.at("bos_token_id").is_null());  // the byte tokenizer has no special tokens
  EXPECT_TRUE(hf.at("eos_token_id").is_null());
  r = Run({"export", "--init", "--model", kByteTiny, "--out", Path("hf"), "--dtype", "f32"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(nlohmann::json::parse(ReadAll(Path("hf/config.json"))).at("torch_dtype"), "float32");
}

}  // namespace
}  // namespace tf
