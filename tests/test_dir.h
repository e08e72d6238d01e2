// TestDir: a fresh, empty directory for the running test, <TempDir>/<tag>_<test name>_<pid> —
// removed first (leftovers of a crashed earlier run) and again on destruction. Construct it while
// the test is current (a fixture member or a local). Not copyable.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace tf::testing_util {

class TestDir {
 public:
  explicit TestDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string test = info != nullptr ? info->name() : "suite";
    path_ = (std::filesystem::path(::testing::TempDir()) / (tag + "_" + test + "_" + std::to_string(::getpid())))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TestDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tf::testing_util
