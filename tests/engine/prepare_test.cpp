// PrepareData (engine/prepare.h) replaces the train/val pair as a unit: every injected failure
// (a write, a full disk, each rename) leaves the previous pair byte for byte and no staged files;
// a split without validation documents removes an earlier val.bin.
#include "engine/prepare.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/fault_env.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) / ("tf_prepare_" + std::string(info->name()) + "_" +
                                              std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/text");
    options_.out_dir = dir_ + "/data";
    options_.delimiter = "%";
    options_.val_fraction = 0.3;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A corpus of `docs` documents whose text depends on `tag` (so two corpora give different files).
  void WriteCorpus(const std::string& tag, int docs) {
    std::ofstream f(dir_ + "/text/corpus.txt");
    for (int i = 0; i < docs; ++i) f << tag << " document number " << i << " with some words\n%\n";
    options_.inputs = {dir_ + "/text"};
  }
  std::string Read(const std::string& name) const {
    auto r = Env::Default()->ReadFileToString(options_.out_dir + "/" + name);
    return r.ok() ? *r : "<" + r.status().ToString() + ">";
  }
  std::vector<std::string> Listing() const { return *Env::Default()->ListDir(options_.out_dir); }

  std::string dir_;
  PrepareOptions options_;
};

TEST_F(PrepareTest, FailedReplacementKeepsThePreviousPair) {
  WriteCorpus("old", 40);
  auto first = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_GT(first->val_documents, 0);
  const std::string old_train = Read("train.bin"), old_val = Read("val.bin");

  WriteCorpus("new", 60);
  // Renames: staged train, staged val (each written atomically), old val aside, val, train.
  std::vector<FaultOptions> faults;
  for (int64_t n = 1; n <= 5; ++n) faults.push_back(FaultOptions{.fail_rename_at = n});
  for (int64_t n = 1; n <= 2; ++n) faults.push_back(FaultOptions{.fail_write_at = n});
  faults.push_back(FaultOptions{.fail_sync_at = 2});
  faults.push_back(FaultOptions{.enospc_after_bytes = static_cast<int64_t>(old_train.size())});
  for (const FaultOptions& fault : faults) {
    const std::string what = fmt::format("rename {} write {} sync {} enospc {}", fault.fail_rename_at,
                                         fault.fail_write_at, fault.fail_sync_at, fault.enospc_after_bytes);
    FaultInjectionEnv env(Env::Default(), fault);
    auto r = PrepareData(options_, *MakeByteTokenizer(), &env);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kIOError) << what << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(options_.out_dir), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("errno"), std::string::npos) << r.status().ToString();
    EXPECT_EQ(Read("train.bin"), old_train) << what;
    EXPECT_EQ(Read("val.bin"), old_val) << what;
    EXPECT_EQ(Listing(), (std::vector<std::string>{"train.bin", "val.bin"})) << what;
  }
  // Without faults the new pair replaces the old one.
  auto second = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_NE(Read("train.bin"), old_train);
  EXPECT_NE(Read("val.bin"), old_val);
  EXPECT_EQ(Listing(), (std::vector<std::string>{"train.bin", "val.bin"}));
}

TEST_F(PrepareTest, NoValidationSplitRemovesAStaleValBin) {
  WriteCorpus("a", 20);
  ASSERT_TRUE(PrepareData(options_, *MakeByteTokenizer()).ok());
  ASSERT_TRUE(fs::exists(options_.out_dir + "/val.bin"));
  options_.val_fraction = 0;
  for (int run = 0; run < 2; ++run) {  // the second time there is no val.bin to remove
    auto r = PrepareData(options_, *MakeByteTokenizer());
    ASSERT_TRUE(r.ok()) << run << ": " << r.status().ToString();
    EXPECT_TRUE(r->val_path.empty());
    EXPECT_EQ(Listing(), std::vector<std::string>{"train.bin"}) << run;
  }
}

}  // namespace
}  // namespace tf
