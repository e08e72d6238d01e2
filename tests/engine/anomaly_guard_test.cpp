// Anomaly guards: the guard's statistics on their own, then real training runs with an injected NaN
// loss and a real loss spike (a batch of random bytes after a corpus the model has learned), under
// each action: warn applies the update, skip leaves the weights exactly as they were, stop ends the
// run with the step named, rollback returns to the newest checkpoint and skips the offending data.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "engine/anomaly_guard.h"
#include "engine/checkpointing.h"
#include "engine/trainer.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

TEST(AnomalyGuardTest, FlagsNonFiniteAndSpikesOnlyAfterHistory) {
  AnomalyGuard g({.nonfinite = AnomalyAction::kSkip, .spike = AnomalyAction::kWarn, .zscore = 6.0, .window = 20});
  // Too little history: even a huge value is not a spike.
  EXPECT_FALSE(g.Check(2.0, 1.0));
  EXPECT_FALSE(g.Check(100.0, 1.0));
  g.Reset();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(g.Check(2.0 + 0.01 * (i % 3), 1.0 + 0.01 * (i % 2))) << i;
  auto nan = g.Check(std::nan(""), 1.0);
  ASSERT_TRUE(nan);
  EXPECT_EQ(nan->kind, "nonfinite_loss");
  EXPECT_EQ(nan->action, AnomalyAction::kSkip);
  auto inf = g.Check(2.0, INFINITY);
  ASSERT_TRUE(inf);
  EXPECT_EQ(inf->kind, "nonfinite_grad_norm");
  auto spike = g.Check(5.0, 1.0);
  ASSERT_TRUE(spike);
  EXPECT_EQ(spike->kind, "loss_spike");
  EXPECT_EQ(spike->action, AnomalyAction::kWarn);
  EXPECT_NE(spike->Describe(7).find("step 7: loss 5 is"), std::string::npos) << spike->Describe(7);
  auto norm_spike = g.Check(2.0, 9.0);
  ASSERT_TRUE(norm_spike);
  EXPECT_EQ(norm_spike->kind, "grad_norm_spike");
  // A dip is not a spike, and ordinary noise is not either.
  EXPECT_FALSE(g.Check(0.5, 1.0));
  EXPECT_FALSE(g.Check(2.02, 1.01));
}

TEST(AnomalyGuardTest, MostSevereActionWins) {
  AnomalyGuard g({.nonfinite = AnomalyAction::kStop, .spike = AnomalyAction::kRollback, .zscore = 3.0, .window = 8});
  for (int i = 0; i < 8; ++i) g.Check(1.0 + 0.001 * i, 1.0);
  auto a = g.Check(50.0, NAN);  // a loss spike (rollback) and a non-finite norm (stop)
  ASSERT_TRUE(a);
  EXPECT_EQ(a->action, AnomalyAction::kStop);
  EXPECT_EQ(a->kind, "nonfinite_grad_norm");
}

TEST(AnomalyGuardTest, OffDisablesSpikes) {
  AnomalyGuard g({.nonfinite = AnomalyAction::kWarn, .spike = AnomalyAction::kOff, .zscore = 1.0, .window = 4});
  for (int i = 0; i < 4; ++i) g.Check(1.0, 1.0);
  EXPECT_FALSE(g.Check(1e6, 1e6));
  EXPECT_EQ(g.LabelPairs().size(), 2u);  // the non-finite kinds only
}

class AnomalyRunTest : public ::testing::Test {
 protected:
  static constexpr int kB = 4, kT = 16;
  static constexpr int64_t kSpikeStep = 45;  // 1-based: the step whose batch is random bytes

  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("anomaly_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A 16-token cycle the model learns within a few dozen steps; step kSpikeStep's rows are random.
    tokens_.resize(static_cast<size_t>(200) * kB * kT + 1);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = static_cast<uint16_t>('a' + i % 16);
    std::mt19937 rng(7);
    const size_t begin = static_cast<size_t>(kSpikeStep - 1) * kB * kT;
    for (size_t i = begin; i < begin + kB * kT; ++i) tokens_[i] = static_cast<uint16_t>(rng() % 256);
    model_ = GPT2Config{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 256, .block_size = 32,
                        .padded_vocab_size = 256};
    train_.batch_size = kB;
    train_.seq_len = kT;
    train_.max_steps = 60;
    train_.lr = 1e-2;
    train_.min_lr = 1e-2;
    train_.warmup_steps = 0;
    train_.eval_batches = 0;
    train_.sample_tokens = 0;
    train_.device = "cpu";
    train_.metrics_addr = "off";
    train_.anomaly_window = 20;
    train_.out_dir = (dir_ / "out").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Trainer> Make(const TrainConfig& t, int64_t nan_at = 0) {
    Trainer::Options o{.print_progress = false, .write_outputs = false, .evaluate = false, .monitor = false};
    o.train_tokens = tokens_;
    o.inject_nan_loss_at_step = nan_at;
    auto trainer = Trainer::Create(model_, t, o);
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    return trainer.ok() ? std::move(trainer).value() : nullptr;
  }
  std::vector<float> Params(Trainer& t) {
    std::vector<float> p(static_cast<size_t>(t.backend().layout().total()));
    EXPECT_TRUE(t.backend().GetParams(p).ok());
    return p;
  }

  fs::path dir_;
  std::vector<uint16_t> tokens_;
  GPT2Config model_;
  TrainConfig train_;
};

TEST_F(AnomalyRunTest, SkipLeavesTheWeightsAsTheyWereAndTrainingGoesOn) {
  TrainConfig t = train_;
  t.anomaly_nonfinite = "skip";
  auto trainer = Make(t, /*nan_at=*/5);
  ASSERT_TRUE(trainer);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(trainer->Step().ok());
  const std::vector<float> before = Params(*trainer);
  auto s = trainer->Step();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->step, 5);
  ASSERT_TRUE(s->anomaly);
  EXPECT_EQ(s->anomaly->kind, "nonfinite_loss");
  EXPECT_TRUE(s->update_skipped);
  EXPECT_EQ(Params(*trainer), before) << "a skipped update changed the weights";
  auto next = trainer->Step();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->update_skipped);
  EXPECT_NE(Params(*trainer), before);
}

TEST_F(AnomalyRunTest, NanStopsTheRunNamingTheStep) {
  auto trainer = Make(train_, /*nan_at=*/7);  // anomaly_nonfinite defaults to stop
  ASSERT_TRUE(trainer);
  auto r = trainer->Run();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("loss became nan at step 7"), std::string::npos) << r.status().ToString();
  for (float p : Params(*trainer)) ASSERT_TRUE(std::isfinite(p)) << "the NaN step's update was applied";
}

TEST_F(AnomalyRunTest, LossSpikeIsSeenAndActedOn) {
  for (const std::string action : {"warn", "skip"}) {
    TrainConfig t = train_;
    t.anomaly_spike = action;
    auto trainer = Make(t);
    ASSERT_TRUE(trainer);
    auto r = trainer->Run();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    int spikes = 0;
    for (const StepStats& s : r->steps) {
      if (!s.anomaly) continue;
      ++spikes;
      EXPECT_EQ(s.step, kSpikeStep) << action << ": " << s.anomaly->Describe(s.step);
      EXPECT_EQ(s.anomaly->kind, "loss_spike");
      EXPECT_EQ(s.update_skipped, action == "skip");
    }
    EXPECT_EQ(spikes, 1) << action;
  }
}

TEST_F(AnomalyRunTest, RollbackReturnsToTheCheckpointAndSkipsTheData) {
  TrainConfig t = train_;
  t.anomaly_spike = "rollback";
  t.checkpoint_dir = (dir_ / "ckpt").string();
  t.checkpoint_interval = 10;
  t.checkpoint_async = false;
  t.checkpoint_keep_last = 0;
  auto trainer = Make(t);
  ASSERT_TRUE(trainer);
  auto r = trainer->Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->final_step, 60);
  // Back to step 40, and step 41 onwards read the data after step 45's: 5 steps of data skipped.
  EXPECT_EQ(trainer->data_offset(), kSpikeStep - 40);
  ASSERT_EQ(r->steps.size(), 60u) << "the rolled-back steps are not in the result";
  for (const StepStats& s : r->steps) {
    EXPECT_FALSE(s.anomaly) << s.anomaly->Describe(s.step);
    if (s.step > 20) {
      EXPECT_LT(s.loss, 3.0f) << "step " << s.step << " saw the random batch again";
    }
  }
  // The skip is part of the state: the final checkpoint resumes with the same data position.
  auto resumed = Make(t);
  ASSERT_TRUE(resumed);
  EXPECT_EQ(resumed->step(), 60);
  EXPECT_EQ(resumed->data_offset(), kSpikeStep - 40);
}

TEST_F(AnomalyRunTest, RollbackWithoutACheckpointYetStops) {
  TrainConfig t = train_;
  t.anomaly_nonfinite = "rollback";
  t.checkpoint_dir = (dir_ / "ckpt").string();
  t.checkpoint_interval = 50;
  auto trainer = Make(t, /*nan_at=*/3);
  ASSERT_TRUE(trainer);
  auto r = trainer->Run();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no checkpoint"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace tf
