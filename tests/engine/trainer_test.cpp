// Trainer behaviour: bit-identical runs for one seed, gradient accumulation semantics, and the
// first steps of training actually lowering the loss.
#include <unistd.h>

#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "base/fault_env.h"
#include "engine/cli/test_faults.h"
#include "engine/data/token_file.h"
#include "engine/fault_injection.h"
#include "engine/trainer.h"
#include "tests/test_dir.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("trainer_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // A small learnable corpus: repeated English-like text in bytes.
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + "\n";
    std::vector<uint16_t> tokens(text.begin(), text.end());
    ASSERT_TRUE(WriteTokenFile((dir_ / "train.bin").string(), tokens).ok());
    std::vector<uint16_t> val(tokens.begin(), tokens.begin() + 2000);
    ASSERT_TRUE(WriteTokenFile((dir_ / "val.bin").string(), val).ok());
    model_ = GPT2Config{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 256, .block_size = 32,
                        .padded_vocab_size = 256};
    train_.batch_size = 4;
    train_.seq_len = 16;
    train_.max_steps = 8;
    train_.lr = 3e-3;
    train_.min_lr = 3e-4;
    train_.warmup_steps = 2;
    train_.eval_batches = 2;
    train_.sample_tokens = 0;
    train_.train_data = (dir_ / "train.bin").string();
    train_.device = "cpu";  // these tests pin CPU results (bit-exact determinism, resume)
    train_.val_data = (dir_ / "val.bin").string();
    train_.out_dir = (dir_ / "out").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainResult Run(const TrainConfig& t) {
    auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .write_outputs = false});
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    auto result = (*trainer)->Run();
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    return *result;
  }

  // A finished run of `t` whose outputs are in t.out_dir.
  void WriteOutputs(const TrainConfig& t) {
    auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false});
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    ASSERT_TRUE((*trainer)->Run().ok());
  }

  fs::path dir_;
  GPT2Config model_;
  TrainConfig train_;
};

TEST_F(TrainerTest, SameSeedGivesBitIdenticalLosses) {
  for (bool shuffle : {false, true}) {
    TrainConfig t = train_;
    t.shuffle = shuffle;
    TrainResult a = Run(t), b = Run(t);
    ASSERT_EQ(a.steps.size(), 8u);
    ASSERT_EQ(b.steps.size(), 8u);
    for (size_t i = 0; i < a.steps.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a.steps[i].loss, &b.steps[i].loss, sizeof(float)), 0) << "step " << i;
      EXPECT_EQ(std::memcmp(&a.steps[i].grad_norm, &b.steps[i].grad_norm, sizeof(float)), 0) << "step " << i;
    }
    ASSERT_EQ(a.val_losses.size(), b.val_losses.size());
    EXPECT_EQ(a.val_losses.back().second, b.val_losses.back().second);
  }
}

// One rank: every ZeRO stage runs (its plan has one range), bit-identical to stage 0.
TEST_F(TrainerTest, ZeroStagesOnOneRankMatchStageZero) {
  TrainConfig t = train_;
  t.grad_clip = 0.3;
  auto run = [&](int stage) {
    t.zero_stage = stage;
    auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .write_outputs = false});
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    EXPECT_TRUE((*trainer)->Run().ok());
    auto state = (*trainer)->GetState();
    EXPECT_TRUE(state.ok());
    return state->params;
  };
  const std::vector<float> base = run(0);
  for (int stage : {1, 2, 3}) EXPECT_EQ(run(stage), base) << "zero_stage " << stage;
}

TEST_F(TrainerTest, DifferentSeedsDiffer) {
  TrainConfig t = train_;
  TrainResult a = Run(t);
  t.seed += 1;
  TrainResult b = Run(t);
  EXPECT_NE(a.steps[0].loss, b.steps[0].loss);
}

TEST_F(TrainerTest, LossDecreases) {
  TrainConfig t = train_;
  t.max_steps = 30;
  t.eval_interval = 30;
  TrainResult r = Run(t);
  ASSERT_EQ(r.val_losses.size(), 2u);  // step 0 and the end
  EXPECT_NEAR(r.val_losses.front().second, std::log(256.0), 0.3);  // uniform over bytes at init
  EXPECT_LT(r.val_losses.back().second, r.val_losses.front().second - 2.0);
}

TEST_F(TrainerTest, AccumulationMatchesLargerBatch) {
  // With grad_accum_steps = 2 and batch B, micro-batches 2s and 2s+1 together hold exactly the
  // tokens of micro-batch s of a 2B run (the data contract), so the first step's gradient — and
  // hence the loss and norm — match up to float summation order.
  TrainConfig small = train_, big = train_;
  small.max_steps = big.max_steps = 3;
  small.grad_accum_steps = 2;
  big.batch_size = 2 * train_.batch_size;
  TrainResult a = Run(small), b = Run(big);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, 1e-5f) << "step " << i;
    EXPECT_NEAR(a.steps[i].grad_norm, b.steps[i].grad_norm, 1e-4f * b.steps[i].grad_norm) << "step " << i;
  }
}

TEST_F(TrainerTest, WritesLoadableOutputs) {
  TrainConfig t = train_;
  t.max_steps = 2;
  auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .write_outputs = true});
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  ASSERT_TRUE((*trainer)->Run().ok());
  for (const char* f : {"model.safetensors", "config.json", "model_config.json", "train_config.json", "metrics.jsonl"}) {
    EXPECT_TRUE(fs::exists(fs::path(t.out_dir) / f)) << f;
  }
  // --init-from the written weights reproduces the trained parameters exactly.
  TrainConfig resume = t;
  resume.init_from = (fs::path(t.out_dir) / "model.safetensors").string();
  auto again = Trainer::Create(model_, resume, Trainer::Options{.print_progress = false, .write_outputs = false});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  std::vector<float> a(static_cast<size_t>((*trainer)->backend().layout().total())), b(a.size());
  ASSERT_TRUE((*trainer)->backend().GetParams(a).ok());
  ASSERT_TRUE((*again)->backend().GetParams(b).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A failed final weights write (here: the rename over the previous file) names the file and the
// errno, keeps the previous model.safetensors, and saves the trained weights where the message says.
TEST_F(TrainerTest, FailedWeightsWriteKeepsPreviousFileAndRescuesTheWeights) {
  TrainConfig t = train_;
  t.max_steps = 1;
  WriteOutputs(t);
  const fs::path weights = fs::path(t.out_dir) / "model.safetensors";
  auto previous = Env::Default()->ReadFileToString(weights.string());
  ASSERT_TRUE(previous.ok());

  const fs::path tmp = dir_ / "tmp";
  fs::create_directories(tmp);
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved_tmpdir = old_tmpdir ? old_tmpdir : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  FaultInjectionEnv env(Env::Default(), FaultOptions{.fail_rename_at = 1});
  t.max_steps = 2;
  t.fresh = true;  // over the first run's outputs
  auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .env = &env});
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto result = (*trainer)->Run();
  if (old_tmpdir) ::setenv("TMPDIR", saved_tmpdir.c_str(), 1); else ::unsetenv("TMPDIR");

  ASSERT_FALSE(result.ok());
  const std::string msg = result.status().message();
  EXPECT_EQ(result.status().code(), StatusCode::kIOError) << msg;
  EXPECT_NE(msg.find(weights.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("errno 5"), std::string::npos) << msg;
  const fs::path rescued = tmp / ("trainflow-rescue-" + std::to_string(::getpid())) / "model.safetensors";
  EXPECT_NE(msg.find("saved to " + rescued.string()), std::string::npos) << msg;
  EXPECT_EQ(*Env::Default()->ReadFileToString(weights.string()), *previous);
  // The rescued file holds this run's weights (step 2), loadable with --init-from.
  std::vector<float> trained(static_cast<size_t>((*trainer)->backend().layout().total()));
  ASSERT_TRUE((*trainer)->backend().GetParams(trained).ok());
  TrainConfig from = train_;
  from.init_from = rescued.string();
  auto again = Trainer::Create(model_, from, Trainer::Options{.print_progress = false, .write_outputs = false});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  std::vector<float> loaded(trained.size());
  ASSERT_TRUE((*again)->backend().GetParams(loaded).ok());
  EXPECT_EQ(std::memcmp(trained.data(), loaded.data(), trained.size() * sizeof(float)), 0);
}

// The final files are one set: a failed write of a side file (here: the rename that puts the new
// config.json in place, the second rename of the outputs) leaves every file of the previous run as
// it was, and says where this run's weights are.
TEST_F(TrainerTest, FailedSideFileWriteLeavesThePreviousSetWhole) {
  TrainConfig t = train_;
  t.max_steps = 1;
  WriteOutputs(t);
  std::map<std::string, std::string> before;
  for (const char* f : {"model.safetensors", "config.json", "model_config.json", "train_config.json", "report.html"}) {
    auto text = Env::Default()->ReadFileToString((fs::path(t.out_dir) / f).string());
    ASSERT_TRUE(text.ok()) << f;
    before[f] = *text;
  }
  FaultInjectionEnv env(Env::Default(), FaultOptions{.fail_rename_at = 2});
  t.max_steps = 2;
  t.fresh = true;
  auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .env = &env});
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto result = (*trainer)->Run();
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("files are unchanged"), std::string::npos) << result.status().ToString();
  for (const auto& [f, text] : before) {
    EXPECT_EQ(*Env::Default()->ReadFileToString((fs::path(t.out_dir) / f).string()), text) << f;
  }
}

TEST_F(TrainerTest, CudaDeviceWithoutGpuIsAClearError) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  TrainConfig t = train_;
  t.device = "cuda";
  auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .write_outputs = false});
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("no CUDA GPU is visible"), std::string::npos)
      << trainer.status().ToString();
}

// CUDA-only model options with the CPU backend are named as ignored, not silently dropped.
TEST_F(TrainerTest, CudaOnlyOptionsOnCpuAreNamedAsIgnored) {
  TrainConfig t = train_;
  t.device = "cpu";
  t.attention = "cudnn";
  t.recompute = 2;
  // The warning goes through spdlog: stderr once logging is set up, stdout for its default logger.
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  auto trainer = Trainer::Create(model_, t, Trainer::Options{.print_progress = true, .write_outputs = false});
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string out = testing::internal::GetCapturedStdout() + err;
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  EXPECT_NE(out.find("attention \"cudnn\", recompute 2, gelu_fusion -1, fuse_residual true apply to the CUDA backend only"),
            std::string::npos)
      << out;
}

// Records where the trainer calls it.
class RecordingFaults : public FaultInjection {
 public:
  Status Start(int rank) override {
    starts.push_back(rank);
    return start_status;
  }
  void BeforeForward(int64_t step, int micro) override { calls.emplace_back(step, micro); }
  Status start_status = Status::OK();
  std::vector<int> starts;
  std::vector<std::pair<int64_t, int>> calls;
};

TEST_F(TrainerTest, FaultInjectionIsCalledOnceAtStartAndBeforeEveryForwardPass) {
  TrainConfig t = train_;
  t.max_steps = 2;
  t.grad_accum_steps = 2;
  t.eval_batches = 0;
  t.val_data = "";
  auto faults = std::make_shared<RecordingFaults>();
  auto trainer = Trainer::Create(
      model_, t, Trainer::Options{.print_progress = false, .write_outputs = false, .evaluate = false, .faults = faults});
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  EXPECT_EQ(faults->starts, std::vector<int>{0});
  ASSERT_TRUE((*trainer)->Run().ok());
  EXPECT_EQ(faults->calls, (std::vector<std::pair<int64_t, int>>{{1, 0}, {1, 1}, {2, 0}, {2, 1}}));

  auto refusing = std::make_shared<RecordingFaults>();
  refusing->start_status = Status::InvalidArgument("no faults today");
  auto refused = Trainer::Create(model_, t, Trainer::Options{.print_progress = false, .write_outputs = false,
                                                             .faults = refusing});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "no faults today");
}

TEST(TestFaultsTest, TheEnvironmentVariablesAreReadAndCheckedOutsideTheTrainer) {
  std::map<std::string, std::string> vars;
  auto from = [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  EXPECT_EQ(TestFaults(from), nullptr) << "nothing set: no fault injection";
  for (const auto& [name, value, want] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"TRAINFLOW_TEST_HANG_AT", "x", "TRAINFLOW_TEST_HANG_AT='x': expected RANK:STEP[:FILE]"},
           {"TRAINFLOW_TEST_HANG_AT", "1:0", "TRAINFLOW_TEST_HANG_AT='1:0'"},
           {"TRAINFLOW_TEST_HANG_AT", "1:2x", "TRAINFLOW_TEST_HANG_AT='1:2x'"},
           {"TRAINFLOW_TEST_FAIL_AT_STEP", "0", "TRAINFLOW_TEST_FAIL_AT_STEP='0': expected a whole number >= 1"},
           {"TRAINFLOW_TEST_STEP_DELAY_MS", "5ms", "TRAINFLOW_TEST_STEP_DELAY_MS='5ms'"}}) {
    vars = {{name, value}};
    auto f = TestFaults(from);
    ASSERT_NE(f, nullptr) << name;
    const Status s = f->Start(0);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << "=" << value;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();
  }
  // A hang for another rank, or one whose marker file exists, never happens here; a delay does.
  testing_util::TestDir tmp("test_faults");
  const std::string marker = tmp.path() + "/hung";
  std::ofstream(marker) << "hung\n";
  vars = {{"TRAINFLOW_TEST_HANG_AT", "1:1"}, {"TRAINFLOW_TEST_STEP_DELAY_MS", "30"}};
  auto f = TestFaults(from);
  ASSERT_TRUE(f->Start(0).ok());
  const auto t0 = std::chrono::steady_clock::now();
  f->BeforeForward(1, 0);
  f->BeforeForward(1, 1);
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 30);
  EXPECT_LT(ms, 1000) << "the delay is once per step";
  vars = {{"TRAINFLOW_TEST_HANG_AT", "0:1:" + marker}};
  f = TestFaults(from);
  ASSERT_TRUE(f->Start(0).ok());
  f->BeforeForward(1, 0);  // the marker exists: this rank already hung once
}

}  // namespace
}  // namespace tf
