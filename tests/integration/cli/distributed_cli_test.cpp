// The trainflow binary under mpirun, for failures that only a real multi-process launch shows:
// a rank that fails alone (here: its data file is missing on its "node") must end the whole job
// with its error message, not leave the other ranks waiting in a collective forever; ranks started
// with different configs stop with an error naming the ranks; a rank that is stopped (SIGSTOP) makes
// the others say what they wait for, wait without burning a core, and give up after
// TRAINFLOW_COMM_TIMEOUT with the retryable exit code 3. `eval` on one process reproduces a 2-rank
// run's validation loss from what the weights record.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engine/data/token_file.h"

extern char** environ;

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

constexpr const char* kMpirun = TF_MPIRUN " ";  // on loopback only (tests/CMakeLists.txt)

TEST_F(DistributedCli, RankFailingAloneEndsTheJobWithItsError) {
  // Rank 0 alone checks out_dir (it alone writes the outputs); rank 1 goes on to the next collective.
  const std::string bad_out = "--out_dir /proc/trainflow-no-such-dir";
  const Result r =
      Shell(std::string(kMpirun) + Rank("node_a", bad_out) + " : " + Rank("node_a", bad_out), dir_ / "log1.txt");
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("/proc/trainflow-no-such-dir"), std::string::npos) << r.out;
}

TEST_F(DistributedCli, RanksResolvingPathsToDifferentFilesAreNamed) {
  // Relative paths are resolved against each rank's working directory: node_a's and node_b's
  // d/train.bin are different files.
  const Result r = Shell(std::string(kMpirun) + Rank("node_a") + " : " + Rank("node_b"), dir_ / "log5.txt");
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("key 'train_data' is \"" + (dir_ / "node_a/d/train.bin").string()), std::string::npos)
      << r.out;
}

TEST_F(DistributedCli, DifferentConfigsAreNamed) {
  const Result r =
      Shell(std::string(kMpirun) + Rank("node_a") + " : " + Rank("node_a", "--lr 1e-3"), dir_ / "log2.txt");
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 has a different training config than rank 0 (key 'lr' is"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("and 0.001 on rank 1)"), std::string::npos) << r.out;
}

TEST_F(DistributedCli, TwoRanksTrain) {
  const std::string val = "--val_data d/train.bin --eval_batches 2";
  const Result r = Shell(std::string(kMpirun) + Rank("node_a", val) + " : " + Rank("node_a", val), dir_ / "log3.txt");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 ranks on 1 node"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step     3/3"), std::string::npos) << r.out;
  // Counts read as words: the tiny model's gradients fit one bucket.
  EXPECT_NE(r.out.find("gradient reduction: 1 bucket ("), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" 1 buckets"), std::string::npos) << r.out;
  // `eval` on one process reproduces the 2-rank run's validation loss (each rank read 2 batches).
  const auto at = r.out.rfind("val loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const Result e = Shell("env -C " + (dir_ / "node_a").string() + " " + std::string(TF_BINARY_DIR) +
                             "/trainflow eval --device cpu --weights " + (dir_ / "out" / "model.safetensors").string(),
                         dir_ / "log4.txt");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("eval: 4 batches x 2 x 16 tokens of " + (dir_ / "node_a/d/train.bin").string()),
            std::string::npos)
      << e.out;
  const auto loss = e.out.find(": loss ");
  ASSERT_NE(loss, std::string::npos) << e.out;
  EXPECT_EQ(r.out.substr(at + 9, 6), fmt::format("{:.4f}", std::stod(e.out.substr(loss + 7)))) << r.out << e.out;
}


// The pid of the process whose environment holds all of `vars` (0 if none).
pid_t FindProcess(const std::vector<std::string>& vars) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string env = ss.str();
    std::vector<std::string> entries;
    for (size_t at = 0; at < env.size();) {
      const size_t end = env.find('\0', at);
      entries.push_back(env.substr(at, end == std::string::npos ? std::string::npos : end - at));
      if (end == std::string::npos) break;
      at = end + 1;
    }
    bool all = true;
    for (const std::string& v : vars) all = all && std::find(entries.begin(), entries.end(), v) != entries.end();
    if (all) return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// User + system CPU seconds a process has used (/proc/<pid>/stat fields 14 and 15).
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  long ticks = 0;
  for (int k = 3; k <= 15 && rest >> field; ++k) {
    if (k >= 14) ticks += std::stol(field);
  }
  return static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

TEST_F(DistributedCli, StoppedPeerIsReportedAndTimesOutRetryably) {
  const std::string marker = "TF_TEST_MARKER=stopped_peer_" + std::to_string(::getpid());
  const fs::path log = dir_ / "log4.txt";
  const std::string long_run = "--max_steps 1000000 --out_dir " + (dir_ / "stopped").string();
  const std::string cmd = "exec timeout 120 " + std::string(kMpirun) + "-x TRAINFLOW_COMM_TIMEOUT=14 -x " + marker +
                          " " + Rank("node_a", long_run) + " : " + Rank("node_a", long_run) +
                          " >" + log.string() + " 2>&1";
  const std::string env_marker = marker;
  ::setenv("TF_TEST_MARKER", marker.substr(marker.find('=') + 1).c_str(), 1);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t job = -1;
  ASSERT_EQ(posix_spawn(&job, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  ::unsetenv("TF_TEST_MARKER");
  pid_t rank0 = 0, rank1 = 0;
  auto cleanup = [&] {
    if (rank1 > 0) {
      ::kill(rank1, SIGCONT);
      ::kill(rank1, SIGKILL);
    }
    ::kill(job, SIGTERM);
  };
  // Both ranks running and a few steps done (bounded: 60 s).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t lines = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    rank0 = FindProcess({env_marker, "OMPI_COMM_WORLD_RANK=0"});
    rank1 = FindProcess({env_marker, "OMPI_COMM_WORLD_RANK=1"});
    std::ifstream m(dir_ / "stopped" / "metrics.jsonl");
    std::string line;
    for (lines = 0; std::getline(m, line);) ++lines;
    if (rank0 > 0 && rank1 > 0 && lines >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (rank0 <= 0 || rank1 <= 0 || lines < 3) {
    cleanup();
    ::waitpid(job, nullptr, 0);
    FAIL() << "the job did not start training (rank pids " << rank0 << ", " << rank1 << ")";
  }
  ASSERT_EQ(::kill(rank1, SIGSTOP), 0);
  // After the first 200 ms of polling, the survivor sleeps between polls: over 4 s it uses well
  // under a core (the old loop used all of one).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu_before = CpuSeconds(rank0);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const double cpu_used = CpuSeconds(rank0) - cpu_before;
  int status = 0;
  const auto exit_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(job, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > exit_deadline) {
      cleanup();
      ::waitpid(job, &status, 0);
      FAIL() << "the job did not give up on the stopped rank";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  cleanup();
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string out = ss.str();
  EXPECT_LT(cpu_used, 1.0) << "rank 0 used " << cpu_used << " CPU s in 4 s while waiting\n" << out;
  EXPECT_NE(out.find("has been waiting"), std::string::npos) << out;
  EXPECT_NE(out.find("(while step "), std::string::npos) << out;  // what it was waiting for
  EXPECT_NE(out.find("TRAINFLOW_COMM_TIMEOUT"), std::string::npos) << out;
  EXPECT_NE(out.find("did not complete within 14 s"), std::string::npos) << out;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 3) << out;  // retryable: a peer failed
}

}  // namespace
}  // namespace tf
