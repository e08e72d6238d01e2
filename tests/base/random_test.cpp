// Tests for base/random.h: the length and alphabet of RandomHex, and that draws differ.
#include "base/random.h"

#include <set>

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(RandomTest, HexOfTheAskedLength) {
  for (int n : {0, 1, 2, 3, 4, 5, 16, 32}) {
    const std::string h = RandomHex(n);
    EXPECT_EQ(h.size(), static_cast<size_t>(2 * n)) << n;
    EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos) << h;
  }
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(RandomHex(16));
  EXPECT_EQ(seen.size(), 100u);
}

}  // namespace
}  // namespace tf
