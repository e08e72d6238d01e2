// Tests for engine/lr_schedule.h against values computed by hand (the arithmetic is in the
// comments): linear warm-up, cosine / linear / constant decay, the clamp after max_steps, and the
// edge cases warmup_steps = 0 and warmup_steps == max_steps.
#include "engine/lr_schedule.h"

#include <cmath>

#include <gtest/gtest.h>

namespace tf {
namespace {

// Double arithmetic on numbers of order 1e-3: a few ulps of error at most.
constexpr double kTol = 1e-15;

// lr 1e-3, min_lr 1e-4, warm-up 10 steps, 110 steps in all: the decay spans 110 - 10 = 100 steps.
TrainConfig Schedule(LrDecay decay, int warmup = 10, int max_steps = 110) {
  TrainConfig c;
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup_steps = warmup;
  c.max_steps = max_steps;
  c.lr_decay = decay;
  return c;
}

TEST(LrScheduleTest, WarmupIsLinearFromLrOverWarmup) {
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    const TrainConfig c = Schedule(d);
    EXPECT_NEAR(LearningRate(c, 0), 1e-4, kTol);  // 1e-3 * (0 + 1) / 10
    EXPECT_NEAR(LearningRate(c, 4), 5e-4, kTol);  // 1e-3 * (4 + 1) / 10
    EXPECT_NEAR(LearningRate(c, 9), 1e-3, kTol);  // 1e-3 * (9 + 1) / 10: the peak on the last warm-up step
  }
}

TEST(LrScheduleTest, CosineDecay) {
  const TrainConfig c = Schedule(LrDecay::kCosine);
  // Step 10: p = (10 - 10) / 100 = 0 -> min_lr + 0.5 * (1 + cos 0) * (lr - min_lr) = lr.
  EXPECT_NEAR(LearningRate(c, 10), 1e-3, kTol);
  // Step 35: p = 25 / 100 = 0.25 -> 1e-4 + 0.5 * (1 + cos(pi/4)) * 9e-4
  //        = 1e-4 + 0.5 * (1 + 0.70710678118654752) * 9e-4 = 1e-4 + 7.6819805153394639e-4.
  EXPECT_NEAR(LearningRate(c, 35), 8.6819805153394639e-4, kTol);
  // Step 60: p = 0.5 -> cos(pi/2) = 0 -> min_lr + 0.5 * (lr - min_lr) = (lr + min_lr) / 2 = 5.5e-4.
  EXPECT_NEAR(LearningRate(c, 60), 5.5e-4, kTol);
  // Step 110: p = 1 -> cos(pi) = -1 -> min_lr.
  EXPECT_NEAR(LearningRate(c, 110), 1e-4, kTol);
  // Past max_steps p is clamped to 1: still min_lr.
  EXPECT_NEAR(LearningRate(c, 1000), 1e-4, kTol);
}

TEST(LrScheduleTest, CosineIsMonotoneAfterWarmup) {
  const TrainConfig c = Schedule(LrDecay::kCosine);
  for (int s = 10; s < 110; ++s) EXPECT_GE(LearningRate(c, s), LearningRate(c, s + 1)) << "step " << s;
}

TEST(LrScheduleTest, LinearDecay) {
  const TrainConfig c = Schedule(LrDecay::kLinear);
  EXPECT_NEAR(LearningRate(c, 10), 1e-3, kTol);     // p = 0
  EXPECT_NEAR(LearningRate(c, 35), 7.75e-4, kTol);  // p = 0.25: 1e-3 - 0.25 * 9e-4 = 1e-3 - 2.25e-4
  EXPECT_NEAR(LearningRate(c, 60), 5.5e-4, kTol);   // p = 0.5:  1e-3 - 0.5 * 9e-4 = 1e-3 - 4.5e-4
  EXPECT_NEAR(LearningRate(c, 101), 1.81e-4, kTol);  // p = 0.91: 1e-3 - 0.91 * 9e-4 = 1e-3 - 8.19e-4
  EXPECT_NEAR(LearningRate(c, 110), 1e-4, kTol);    // p = 1
  EXPECT_NEAR(LearningRate(c, 500), 1e-4, kTol);    // clamped
}

TEST(LrScheduleTest, ConstantKeepsLrAfterWarmup) {
  const TrainConfig c = Schedule(LrDecay::kConstant);
  for (int s : {10, 35, 60, 109, 110, 1000}) EXPECT_EQ(LearningRate(c, s), 1e-3) << "step " << s;
}

TEST(LrScheduleTest, NoWarmupStartsAtLr) {
  TrainConfig c = Schedule(LrDecay::kCosine, /*warmup=*/0, /*max_steps=*/100);
  EXPECT_NEAR(LearningRate(c, 0), 1e-3, kTol);    // p = 0 / 100 = 0
  EXPECT_NEAR(LearningRate(c, 50), 5.5e-4, kTol);  // p = 0.5: (1e-3 + 1e-4) / 2
  EXPECT_NEAR(LearningRate(c, 100), 1e-4, kTol);   // p = 1
  c.lr_decay = LrDecay::kLinear;
  EXPECT_NEAR(LearningRate(c, 0), 1e-3, kTol);
  EXPECT_NEAR(LearningRate(c, 20), 8.2e-4, kTol);  // p = 0.2: 1e-3 - 0.2 * 9e-4 = 1e-3 - 1.8e-4
}

TEST(LrScheduleTest, WarmupEqualToMaxSteps) {
  // warmup 10 == max_steps 10: every step the trainer runs (0..9) is warm-up, the last at the peak.
  // After it the span is max(1, 10 - 10) = 1 step, so there is no division by zero.
  const TrainConfig c = Schedule(LrDecay::kCosine, /*warmup=*/10, /*max_steps=*/10);
  EXPECT_NEAR(LearningRate(c, 0), 1e-4, kTol);  // 1e-3 * 1 / 10
  EXPECT_NEAR(LearningRate(c, 9), 1e-3, kTol);  // 1e-3 * 10 / 10
  EXPECT_NEAR(LearningRate(c, 10), 1e-3, kTol);  // p = 0 / 1 = 0
  EXPECT_NEAR(LearningRate(c, 11), 1e-4, kTol);  // p = 1 / 1 = 1
  for (int s = 0; s < 20; ++s) EXPECT_TRUE(std::isfinite(LearningRate(c, s))) << "step " << s;
}

TEST(LrScheduleTest, WarmupLongerThanRunStaysFinite) {
  // warmup 20 > max_steps 10: the run never leaves warm-up; afterwards span = max(1, -10) = 1.
  const TrainConfig c = Schedule(LrDecay::kLinear, /*warmup=*/20, /*max_steps=*/10);
  EXPECT_NEAR(LearningRate(c, 9), 5e-4, kTol);   // 1e-3 * 10 / 20
  EXPECT_NEAR(LearningRate(c, 20), 1e-3, kTol);  // p = 0
  EXPECT_NEAR(LearningRate(c, 25), 1e-4, kTol);  // p clamped to 1
}

}  // namespace
}  // namespace tf
