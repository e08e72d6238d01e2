// Tests for base/format.h: byte counts in IEC units at each boundary.
#include "base/format.h"

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(FormatTest, BytesInIecUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(2048 + 512), "2.5 KiB");
  EXPECT_EQ(FormatBytes((uint64_t{1} << 20) - 1), "1024.0 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{1} << 20), "1.0 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{12} << 20), "12.0 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{1} << 30), "1.00 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{1300} << 20), "1.27 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 40), "3072.00 GiB");
}

}  // namespace
}  // namespace tf
