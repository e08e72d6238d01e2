// Tests for base/system_memory.h: MemAvailable parsed from meminfo texts (well-formed, missing,
// malformed), read through Env from a temporary file and from the real /proc/meminfo; cgroup v1 and
// v2 memory limits found in fake trees (the process's cgroup, an ancestor, a container's mount).
#include "base/system_memory.h"

#include <filesystem>

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

constexpr int64_t kGiB = int64_t{1} << 30;

// A fake /proc and /sys/fs/cgroup: meminfo says 20 GiB are available.
class CgroupTest : public ::testing::Test {
 protected:
  CgroupTest() {
    paths_.meminfo = dir_.path() + "/meminfo";
    paths_.self_cgroup = dir_.path() + "/self_cgroup";
    paths_.cgroup_root = dir_.path() + "/cgroup";
    Write("meminfo", "MemTotal: 33554432 kB\nMemAvailable: 20971520 kB\n");
  }
  void Write(const std::string& relative, const std::string& content) {
    const std::filesystem::path p = std::filesystem::path(dir_.path()) / relative;
    std::filesystem::create_directories(p.parent_path());
    ASSERT_TRUE(Env::Default()->WriteFileAtomically(p.string(), content).ok()) << p;
  }
  HostMemory Available() {
    auto r = AvailableHostMemory(Env::Default(), paths_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : HostMemory{};
  }
  std::string Cgroup(const std::string& relative) const { return paths_.cgroup_root + relative; }

  testing_util::TestDir dir_{"tf_cgroup"};
  SystemMemoryPaths paths_;
};

TEST_F(CgroupTest, NoCgroupIsMemAvailable) {
  const HostMemory m = Available();
  EXPECT_EQ(m.available, 20 * kGiB);
  EXPECT_EQ(m.source, "MemAvailable in " + paths_.meminfo);
}

TEST_F(CgroupTest, V2LimitLessItsUsageAndInactiveCache) {
  Write("self_cgroup", "0::/job\n");
  Write("cgroup/job/memory.max", "8589934592\n");
  Write("cgroup/job/memory.current", "1610612736\n");
  Write("cgroup/job/memory.stat", "anon 1073741824\nactive_file 1\ninactive_file 536870912\n");
  const HostMemory m = Available();
  EXPECT_EQ(m.available, 8 * kGiB - (kGiB + kGiB / 2 - kGiB / 2));
  EXPECT_EQ(m.source, "the room under the memory limit of cgroup " + Cgroup("/job") + " (memory.max 8.00 GiB)");

  Write("cgroup/job/memory.max", "max\n");  // no limit
  EXPECT_EQ(Available().available, 20 * kGiB);
  Write("cgroup/job/memory.max", "34359738368\n");  // a limit above MemAvailable
  EXPECT_EQ(Available().available, 20 * kGiB);
}

TEST_F(CgroupTest, V1AncestorLimitIsFound) {
  Write("self_cgroup", "9:pids:/x\n4:cpu,memory:/slurm/uid_0/job_7\n0::/\n");
  Write("cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes", "9223372036854771712\n");  // unlimited
  Write("cgroup/memory/slurm/uid_0/job_7/memory.usage_in_bytes", "1073741824\n");
  Write("cgroup/memory/slurm/uid_0/memory.limit_in_bytes", "4294967296\n");
  Write("cgroup/memory/slurm/uid_0/memory.usage_in_bytes", "1073741824\n");
  const HostMemory m = Available();
  EXPECT_EQ(m.available, 3 * kGiB);
  EXPECT_EQ(m.source, "the room under the memory limit of cgroup " + Cgroup("/memory/slurm/uid_0") +
                          " (memory.limit_in_bytes 4.00 GiB)");
}

TEST_F(CgroupTest, ContainerMountIsItsOwnCgroup) {
  // The path names the host's view; the container sees its own cgroup at the mount's root.
  Write("self_cgroup", "0::/docker/abc\n");
  Write("cgroup/memory.max", "2147483648\n");
  Write("cgroup/memory.current", "garbage\n");  // unreadable usage: no limit known
  EXPECT_EQ(Available().available, 20 * kGiB);
  Write("cgroup/memory.current", "0\n");
  EXPECT_EQ(Available().available, 2 * kGiB);
}

TEST(SystemMemoryTest, RealProcessMemoryIsAtMostMemAvailable) {
  auto host = HostMemAvailable(Env::Default());
  auto process = AvailableHostMemory(Env::Default());
  ASSERT_TRUE(host.ok() && process.ok());
  EXPECT_GT(process->available, 0);
  // Both read now; MemAvailable moves a little between the reads.
  EXPECT_LE(process->available, *host + (int64_t{256} << 20)) << process->source;
}

}  // namespace
}  // namespace tf
