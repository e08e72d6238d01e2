// Tests for base/backoff.h: exponential growth to the cap (without overflow for any attempt) and
// full jitter within [0, delay].
#include "base/backoff.h"

#include <climits>
#include <set>

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(BackoffTest, ExponentialDelayGrowsToTheCap) {
  EXPECT_DOUBLE_EQ(ExponentialDelay(0.2, 2, 0, 10), 0.2);
  EXPECT_DOUBLE_EQ(ExponentialDelay(0.2, 2, 1, 10), 0.4);
  EXPECT_DOUBLE_EQ(ExponentialDelay(0.2, 2, 5, 10), 6.4);
  EXPECT_DOUBLE_EQ(ExponentialDelay(0.2, 2, 6, 10), 10);
  EXPECT_DOUBLE_EQ(ExponentialDelay(0.2, 2, INT_MAX, 10), 10);
  EXPECT_DOUBLE_EQ(ExponentialDelay(1, 3, 2, 60), 9);
  EXPECT_DOUBLE_EQ(ExponentialDelay(1, 1, INT_MAX, 60), 1);  // factor 1: constant
  EXPECT_DOUBLE_EQ(ExponentialDelay(5, 2, 0, 1), 1);       // base above the cap
  EXPECT_DOUBLE_EQ(ExponentialDelay(0, 2, INT_MAX, 10), 0);  // base 0: never waits
}

TEST(BackoffTest, FullJitterStaysWithinTheDelay) {
  std::set<double> seen;
  for (int i = 0; i < 1000; ++i) {
    const double d = FullJitter(2.0);
    EXPECT_GE(d, 0.0);
    EXPECT_LE(d, 2.0);
    seen.insert(d);
  }
  EXPECT_GT(seen.size(), 900u);  // spread out, not a constant
  EXPECT_EQ(FullJitter(0), 0);
  EXPECT_EQ(FullJitter(-1), 0);
}

}  // namespace
}  // namespace tf
