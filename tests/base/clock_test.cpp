// Tests for base/clock.h: the two clocks agree with the system's, and UTC strings are formatted
// to the second and to the millisecond.
#include "base/clock.h"

#include <ctime>

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(ClockTest, UnixSecondsIsTheWallClock) {
  const double before = static_cast<double>(std::time(nullptr));
  const double now = UnixSeconds();
  EXPECT_GE(now, before);
  EXPECT_LT(now, before + 5);
}

TEST(ClockTest, MonotonicSecondsNeverGoBack) {
  double last = MonotonicSeconds();
  for (int i = 0; i < 1000; ++i) {
    const double t = MonotonicSeconds();
    EXPECT_GE(t, last);
    last = t;
  }
}

TEST(ClockTest, UtcStrings) {
  const double t = 1796526652.125;  // 2026-12-06T03:10:52.125Z
  EXPECT_EQ(IsoUtc(t), "2026-12-06T03:10:52Z");
  EXPECT_EQ(IsoUtcMillis(t), "2026-12-06T03:10:52.125Z");
  EXPECT_EQ(IsoUtcMillis(1796526652.9999), "2026-12-06T03:10:52.999Z");
  EXPECT_EQ(FormatUtc(t, "%Y%m%d-%H%M%S"), "20261206-031052");
  EXPECT_EQ(IsoUtc(0), "1970-01-01T00:00:00Z");
}

}  // namespace
}  // namespace tf
