// Tests for base/system_memory.h: MemAvailable parsed from meminfo texts (well-formed, missing,
// malformed), read through Env from a temporary file and from the real /proc/meminfo.
#include "base/system_memory.h"

#include <gtest/gtest.h>

#include "tests/test_dir.h"

namespace tf {
namespace {

constexpr char kMeminfo[] =
    "MemTotal:       32780132 kB\n"
    "MemFree:         1048576 kB\n"
    "MemAvailable:   24197176 kB\n"
    "Buffers:          123456 kB\n";

TEST(SystemMemoryTest, ParsesMemAvailableInBytes) {
  auto r = ParseMemAvailable(kMeminfo, "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, int64_t{24197176} * 1024);
}

TEST(SystemMemoryTest, MissingOrMalformedLineIsCorruptionNamingTheSource) {
  auto missing = ParseMemAvailable("MemTotal: 1 kB\nMemFree: 1 kB\n", "'fake/meminfo'");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(missing.status().message(), "'fake/meminfo' has no MemAvailable line (Linux 3.14 or later writes one)");

  for (const char* bad : {"MemAvailable: lots kB\n", "MemAvailable: 12 MB\n", "MemAvailable: -5 kB\n",
                          "MemAvailable: 99999999999999999999 kB\n", "MemAvailable:\n"}) {
    auto r = ParseMemAvailable(bad, "m");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << bad;
    EXPECT_NE(r.status().message().find("expected 'MemAvailable: <n> kB'"), std::string::npos) << r.status().message();
  }
}

TEST(SystemMemoryTest, ReadsAFileThroughEnv) {
  testing_util::TestDir dir("tf_system_memory");
  const std::string path = dir.path() + "/meminfo";
  ASSERT_TRUE(Env::Default()->WriteFileAtomically(path, kMeminfo).ok());
  auto r = HostMemAvailable(Env::Default(), path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, int64_t{24197176} * 1024);

  auto gone = HostMemAvailable(Env::Default(), dir.path() + "/absent");
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("absent"), std::string::npos) << gone.status().message();
}

TEST(SystemMemoryTest, RealMeminfoHasMemAvailable) {
  auto r = HostMemAvailable(Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(*r, 0);
}

}  // namespace
}  // namespace tf
