// The trainflow binary under mpirun, for failures that only a real multi-process launch shows:
// a rank that fails alone (here: its data file is missing on its "node") must end the whole job
// with its error message, not leave the other ranks waiting in a collective forever; ranks started
// with different configs stop with an error naming the ranks.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "engine/token_file.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;
};

// Runs a shell command with a 90 s limit (`timeout` exits 124 when it fires).
Result Shell(const std::string& cmd, const fs::path& log) {
  const int status = std::system(("timeout 90 " + cmd + " >" + log.string() + " 2>&1").c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.out = ss.str();
  return r;
}

class DistributedCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("dist_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "node_a" / "d");
    fs::create_directories(dir_ / "node_b");
    std::vector<uint16_t> tokens(5000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>('a' + i % 26);
    ASSERT_TRUE(WriteTokenFile((dir_ / "node_a" / "d" / "train.bin").string(), tokens).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Rank(const std::string& wdir, const std::string& extra = "") const {
    return "-np 1 -wdir " + (dir_ / wdir).string() + " " + std::string(TF_BINARY_DIR) +
           "/trainflow train --model " + std::string(TF_SOURCE_DIR) +
           "/configs/model/byte-tiny.json --train_data d/train.bin --seq_len 16 --batch_size 2 --max_steps 3 "
           "--device cpu --threads 1 --sample_tokens 0 --eval_interval 0 --out_dir " +
           (dir_ / "out").string() + " " + extra;
  }
  fs::path dir_;
};

constexpr const char* kMpirun = "mpirun --allow-run-as-root --oversubscribe ";

TEST_F(DistributedCli, RankFailingAloneEndsTheJobWithItsError) {
  // Rank 0 finds d/train.bin in node_a; rank 1's working directory node_b has no such file.
  const Result r = Shell(std::string(kMpirun) + Rank("node_a") + " : " + Rank("node_b"), dir_ / "log1.txt");
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("d/train.bin: no such token file"), std::string::npos) << r.out;
}

TEST_F(DistributedCli, DifferentConfigsAreNamed) {
  const Result r =
      Shell(std::string(kMpirun) + Rank("node_a") + " : " + Rank("node_a", "--lr 1e-3"), dir_ / "log2.txt");
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 has a different training config than rank 0"), std::string::npos) << r.out;
}

TEST_F(DistributedCli, TwoRanksTrain) {
  const Result r = Shell(std::string(kMpirun) + Rank("node_a") + " : " + Rank("node_a"), dir_ / "log3.txt");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 ranks on 1 node"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step     3/3"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tf
