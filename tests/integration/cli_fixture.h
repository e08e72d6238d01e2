// A fixture for tests that run the real `trainflow` binary: each test gets its own directory, runs
// the binary inside it with stdout/stderr captured (or in the background, to signal it), and
// checks failures are clean: the documented exit code, never a signal, the offending key or file
// named on stderr. TRAINFLOW_CLI_BINARY selects another build of the binary (emu.*: trainflow_emu,
// whose --device auto takes the emulated GPU).
#pragma once
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/data/token_file.h"
#include "model/safetensors.h"
#include "tests/test_dir.h"

extern char** environ;

namespace tf::cli_testing {

namespace fs = std::filesystem;

inline const std::string kBinary = std::getenv("TRAINFLOW_CLI_BINARY") != nullptr ? std::getenv("TRAINFLOW_CLI_BINARY")
                                                                          : std::string(TF_BINARY_DIR) + "/trainflow";
inline const std::string kByteTiny = std::string(TF_SOURCE_DIR) + "/configs/model/byte-tiny.json";

inline std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out.push_back('\'');
  return out;
}

inline std::string ReadAll(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct RunResult {
  int exit_code = -1;  // the shell's status: 128 + n when the binary died of signal n
  std::string out, err;
};

inline std::ostream& operator<<(std::ostream& os, const RunResult& r) {
  return os << "exit " << r.exit_code << "\n--- stdout ---\n" << r.out << "\n--- stderr ---\n" << r.err;
}

// What must repeat exactly: each step's record in metrics.jsonl without its timings.
inline std::map<int64_t, nlohmann::json> StepRecords(const std::string& metrics) {
  std::map<int64_t, nlohmann::json> records;
  std::istringstream lines(metrics);
  std::string line;
  while (std::getline(lines, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;  // a line torn by a kill
    if (j.contains("event")) continue;  // anomaly and rollback records
    for (const char* timing : {"ms", "tokens_per_s", "comm_exposed_ms", "comm_ms", "codec_ms", "comm_GBps",
                               "checkpoint_stall_ms", "data_ms", "compute_ms", "optimizer_ms", "mfu", "rss_bytes", "peak_rss_bytes"}) {
      j.erase(timing);
    }
    records[j.at("step").get<int64_t>()] = j;
  }
  return records;
}

// Starts `launcher trainflow args` in the background in its own process group (so that a test can
// kill the whole job, mpirun and its ranks, with kill(-pid, ...)); stdout/stderr to files in dir.
inline pid_t Spawn(const std::string& dir, const std::vector<std::string>& args, const std::string& launcher = "") {
  std::string cmd = fmt::format("cd {} && exec {} {}", Quote(dir), launcher, Quote(kBinary));
  for (const std::string& a : args) cmd.append(" ").append(Quote(a));
  cmd += fmt::format(" >{} 2>{}", Quote(dir + "/stdout.txt"), Quote(dir + "/stderr.txt"));
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char**>(argv), environ);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

// Waits up to `limit` for the child; kills its process group (and fails) if it is still running.
inline int WaitExit(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "trainflow did not exit within " << limit.count() << " s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// SIGKILLs every other process whose command line contains `text` (a test's own directory):
// ranks a killed mpirun left behind in process groups of their own. Returns how many.
inline int KillProcessesNaming(const std::string& text) {
  int killed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == ::getpid()) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(text) != std::string::npos && ::kill(pid, SIGKILL) == 0) ++killed;
  }
  return killed;
}

// n byte-level tokens from a fixed LCG seeded with `seed`: windows of it differ, so shuffled runs
// read distinguishable data (a periodic text would repeat them).
inline std::vector<uint16_t> LcgByteTokens(int n, uint64_t seed) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (auto& v : t) {
    v = static_cast<uint16_t>(((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 256);
  }
  return t;
}

// model.safetensors of two out_dirs: every tensor bit for bit, and the same step (the rest of the
// metadata names the runs' own directories).
inline void ExpectSameWeights(const std::string& dir_a, const std::string& dir_b) {
  auto wa = ReadSafetensors(dir_a + "/model.safetensors");
  auto wb = ReadSafetensors(dir_b + "/model.safetensors");
  ASSERT_TRUE(wa.ok() && wb.ok()) << wa.status().ToString() << wb.status().ToString();
  ASSERT_EQ(wa->tensors.size(), wb->tensors.size());
  for (size_t i = 0; i < wa->tensors.size(); ++i) {
    const auto& x = wa->tensors[i].data;
    const auto& y = wb->tensors[i].data;
    EXPECT_TRUE(x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0)
        << wa->tensors[i].name;
  }
  EXPECT_EQ(wa->metadata.at("trainflow.step"), wb->metadata.at("trainflow.step"));
}

class CliFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is not built";
  }
  // Nothing a test started outlives it: a rank that a SIGKILLed mpirun left behind (in a process
  // group of its own, so the kill of mpirun's group missed it) is killed here, and named.
  void TearDown() override {
    if (const int n = KillProcessesNaming(dir_.string()); n > 0) {
      std::printf("[ cleanup ] killed %d process(es) left running in %s\n", n, dir_.c_str());
    }
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `trainflow <args>` inside the test's directory (so a default out_dir cannot litter the
  // build tree), capturing stdout and stderr.
  RunResult Run(const std::vector<std::string>& args) { return RunWith("", args); }
  // The same, started by `launcher` (for example mpirun and its flags).
  RunResult RunWith(const std::string& launcher, const std::vector<std::string>& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    std::string cmd =
        fmt::format("cd {} && OMP_NUM_THREADS=2 exec {} {}", Quote(dir_.string()), launcher, Quote(kBinary));
    for (const std::string& a : args) cmd += fmt::format(" {}", Quote(a));
    cmd += fmt::format(" >{} 2>{}", Quote(out.string()), Quote(err.string()));
    const int status = std::system(cmd.c_str());
    RunResult r;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    return r;
  }

  // A clean failure: exit code 2 (bad input or configuration) or 4 (the OS refused a file), never
  // 1 (internal error) or a signal, and every needle on stderr.
  void ExpectCleanFailure(const RunResult& r, const std::vector<std::string>& needles) {
    EXPECT_TRUE(r.exit_code == 2 || r.exit_code == 4) << r;
    for (const std::string& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in\n" << r;
  }

  // A valid byte-level token file of n tokens.
  std::string TokenFile(const std::string& name, int n = 200) {
    std::vector<uint16_t> t(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) t[static_cast<size_t>(k)] = static_cast<uint16_t>('a' + k % 26);
    const std::string p = Path(name);
    EXPECT_TRUE(WriteTokenFile(p, t).ok());
    return p;
  }

  // `trainflow train` on byte-tiny with a tiny valid batch, plus `extra` arguments.
  RunResult Train(const std::vector<std::string>& extra, const std::string& model = kByteTiny) {
    std::vector<std::string> args = {"train",        "--model",        model, "--max_steps",  "1",
                                     "--batch_size", "1",              "--seq_len", "8", "--sample_tokens",
                                     "0",            "--eval_batches", "0",   "--out_dir",     Path("out")};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(args);
  }

  testing_util::TestDir tmp_{"tf_cli"};
  fs::path dir_ = tmp_.path();
};

}  // namespace tf::cli_testing
