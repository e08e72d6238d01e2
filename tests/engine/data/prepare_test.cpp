// PrepareData (engine/data/prepare.h) replaces the train/val pair as a unit: every injected failure
// (a write, a full disk, each rename) leaves the previous pair byte for byte and no staged files;
// a split without validation documents removes an earlier val.bin. A single file, a few large
// files, blank-line documents and nested directories all split into train and validation by the
// requested fraction, every line of the input landing in exactly one split.
#include "engine/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "base/fault_env.h"
#include "engine/data/token_file.h"
#include "tests/test_dir.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ + "/text");
    options_.out_dir = dir_ + "/data";
    options_.delimiter = "%";
    options_.val_fraction = 0.3;
  }

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

  // Writes `lines` numbered lines of text to text/<name> (creating subdirectories); returns the bytes.
  size_t WriteLines(const std::string& name, int lines, const std::string& tag) {
    const fs::path p = fs::path(dir_) / "text" / name;
    fs::create_directories(p.parent_path());
    std::ofstream f(p);
    size_t bytes = 0;
    for (int i = 0; i < lines; ++i) {
      const std::string line = fmt::format("{} line {} of some text to learn from\n", tag, i);
      f << line;
      bytes += line.size();
    }
    return bytes;
  }
  static bool Blank(const std::string& line) { return line.find_first_not_of(" \t") == std::string::npos; }
  // The non-blank lines of a byte-level token file, sorted.
  std::vector<std::string> Lines(const std::string& name) const {
    auto tokens = ReadTokenFile(options_.out_dir + "/" + name);
    EXPECT_TRUE(tokens.ok()) << tokens.status().ToString();
    std::istringstream in(std::string(tokens->begin(), tokens->end()));
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      if (!Blank(line)) out.push_back(line);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // Checks that train.bin and val.bin together hold every non-blank input line exactly once, and
  // returns validation's share of the tokens.
  double CheckSplit(const std::vector<std::string>& inputs, const PrepareResult& r) {
    std::vector<std::string> expected;
    for (const std::string& in : inputs) {
      std::ifstream f(in);
      for (std::string line; std::getline(f, line);) {
        if (!Blank(line) && line != "%") expected.push_back(line);
      }
    }
    std::sort(expected.begin(), expected.end());
    std::vector<std::string> got = Lines("train.bin");
    const std::vector<std::string> val = Lines("val.bin");
    got.insert(got.end(), val.begin(), val.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, expected);
    return static_cast<double>(r.val_tokens) / static_cast<double>(r.train_tokens + r.val_tokens);
  }

  testing_util::TestDir tmp_{"tf_prepare"};
  std::string dir_ = tmp_.path();
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

TEST_F(PrepareTest, OneFileWithoutDelimiterStillGetsAValidationSplit) {
  // nanoGPT's habit: one input.txt, one document. It is cut at line ends into pieces.
  WriteLines("input.txt", 4000, "x");
  options_.inputs = {dir_ + "/text/input.txt"};
  options_.delimiter.reset();
  options_.val_fraction = 0.1;
  auto r = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files, 1);
  EXPECT_EQ(r->documents, 1);
  ASSERT_FALSE(r->val_path.empty());
  EXPECT_EQ(Listing(), (std::vector<std::string>{"train.bin", "val.bin"}));
  const double share = CheckSplit({dir_ + "/text/input.txt"}, *r);
  EXPECT_GT(share, 0.07);
  EXPECT_LT(share, 0.13);
}

TEST_F(PrepareTest, ASmallFileIsCutFinerSoItSplitsToo) {
  WriteLines("small.txt", 40, "s");  // ~1.5 KB: one 16 KiB piece would leave nothing to split
  options_.inputs = {dir_ + "/text/small.txt"};
  options_.delimiter.reset();
  options_.val_fraction = 0.1;
  auto r = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(r->pieces, 10);
  EXPECT_EQ(r->val_pieces, std::llround(0.1 * static_cast<double>(r->pieces)));
  ASSERT_FALSE(r->val_path.empty());
  CheckSplit({dir_ + "/text/small.txt"}, *r);
}

TEST_F(PrepareTest, TwoFilesSplitByTheFractionNotByWholeFiles) {
  // Two files of 65% and 35% of the text: at 0.1 neither goes to validation whole.
  WriteLines("a.txt", 6500, "a");
  WriteLines("b.txt", 3500, "b");
  options_.inputs = {dir_ + "/text/a.txt", dir_ + "/text/b.txt"};
  options_.delimiter.reset();
  options_.val_fraction = 0.1;
  auto r = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->documents, 2);
  const double share = CheckSplit(options_.inputs, *r);
  EXPECT_GT(share, 0.07);
  EXPECT_LT(share, 0.13);
}

TEST_F(PrepareTest, AnEmptyDelimiterSeparatesDocumentsAtBlankLines) {
  {
    std::ofstream f(dir_ + "/text/paragraphs.txt");
    for (int i = 0; i < 30; ++i) f << "paragraph " << i << " first line\nparagraph " << i << " second line\n\n  \n";
  }
  options_.inputs = {dir_ + "/text/paragraphs.txt"};
  options_.delimiter = "";
  auto r = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->documents, 30);
  EXPECT_EQ(r->pieces, 30);
  EXPECT_EQ(r->val_documents, 9);  // round(0.3 * 30)
  CheckSplit(options_.inputs, *r);
}

TEST_F(PrepareTest, DirectoriesAreReadRecursivelySkippingDotFilesAndLinks) {
  WriteLines("top.txt", 50, "top");
  WriteLines("sub/deeper/inner.txt", 50, "inner");
  WriteLines(".hidden/secret.txt", 50, "hidden");
  fs::create_symlink(dir_ + "/text/top.txt", dir_ + "/text/alias.txt");
  options_.inputs = {dir_ + "/text"};
  options_.delimiter.reset();
  auto r = PrepareData(options_, *MakeByteTokenizer());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files, 2);
  EXPECT_EQ(r->skipped_symlinks, 1);
  CheckSplit({dir_ + "/text/top.txt", dir_ + "/text/sub/deeper/inner.txt"}, *r);
}

TEST_F(PrepareTest, TokenFilesRecordTheirTokenizer) {
  WriteCorpus("t", 20);
  ASSERT_TRUE(PrepareData(options_, *MakeByteTokenizer()).ok());
  for (const char* name : {"train.bin", "val.bin"}) {
    TokenFileTokenizer rec;
    auto tokens = ReadTokenFile(options_.out_dir + "/" + name, Env::Default(), &rec);
    ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
    EXPECT_EQ(rec.kind, "byte") << name;
    EXPECT_EQ(rec.vocab_size, 256) << name;
    EXPECT_EQ(rec.fingerprint, 0u) << name;
  }
}

}  // namespace
}  // namespace tf
