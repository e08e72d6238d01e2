// End-to-end training on the default corpus (Debian's fortunes, installed by
// scripts/install_deps.sh): prepare -> train the default model shape for a bounded number of steps
// -> the validation loss must fall below a threshold set from a measured run.
//
// Measured (bench/RESULTS.md, "Training on the default corpus"): with this exact configuration
// (byte-small, configs/train/fortunes.json with max_steps 500, 2 threads, OpenBLAS) the validation
// loss after 500 steps was 2.4097 on the dev machine (2026-12-03; 56 s). The threshold 2.55 leaves
// 0.14 of margin for other CPUs and thread counts (different GEMM blocking changes rounding and so
// the trajectory slightly), and is still well below what a model that fails to learn reaches
// (uniform bytes: ln 256 = 5.55; the bigram plateau every run passes through: ~2.65).
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/data/prepare.h"
#include "engine/trainer.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCorpus = "/usr/share/games/fortunes";
constexpr int kSteps = 500;
constexpr float kThreshold = 2.55f;

TEST(FortunesTraining, ValidationLossFallsBelowMeasuredThreshold) {
  ASSERT_TRUE(fs::is_directory(kCorpus)) << kCorpus << " missing: install Debian's fortunes and fortunes-min "
                                         << "(scripts/install_deps.sh)";
  const fs::path dir = fs::path(::testing::TempDir()) / ("fortunes_test_" + std::to_string(::getpid()));
  PrepareOptions p;
  p.inputs = {kCorpus};
  p.out_dir = dir.string();
  p.delimiter = "%";
  p.val_fraction = 0.05;
  auto tok = MakeByteTokenizer();
  auto prepared = PrepareData(p, *tok);
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  EXPECT_GT(prepared->train_tokens, 1'000'000);
  EXPECT_GT(prepared->val_tokens, 50'000);

  // configs/model/byte-small.json and configs/train/fortunes.json, with fewer steps.
  auto model = LoadModelConfig(std::string(TF_SOURCE_DIR) + "/configs/model/byte-small.json");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto train_json = ReadJsonFile(std::string(TF_SOURCE_DIR) + "/configs/train/fortunes.json", "training config");
  ASSERT_TRUE(train_json.ok()) << train_json.status().ToString();
  auto train = ParseTrainConfig(*train_json, "fortunes.json");
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  train->train_data = prepared->train_path;
  train->val_data = prepared->val_path;
  train->max_steps = kSteps;
  train->eval_interval = 0;
  train->sample_tokens = 0;
  train->device = "cpu";  // the threshold was measured on the CPU backend
  auto trainer = Trainer::Create(*model, *train, Trainer::Options{.print_progress = false, .write_outputs = false});
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_FALSE(result->val_losses.empty());
  const float val = result->val_losses.back().second;
  std::printf("validation loss after %d steps: %.4f (threshold %.2f)\n", kSteps, val, kThreshold);
  EXPECT_LT(val, kThreshold);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tf
