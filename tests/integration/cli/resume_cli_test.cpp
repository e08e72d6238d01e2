// Exact resume through the real binary, each run a fresh process: a run stopped after step N
// (stop_at_step) and resumed from its train_state reaches step 2N with the same per-step losses,
// gradient norms, learning rates, validation losses and samples, and bit-identical weights and
// training state, as one uninterrupted 2N-step run — on one rank with shuffling, on 2 MPI ranks
// with int8 compression and error feedback, and (as emu.resume_cli_test, with trainflow_emu) on
// the emulated GPU. A SIGTERM'd run finishes its step, exits 5 and leaves loadable outputs whose
// metrics.jsonl ends at the last finished step, and resumes exactly too.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/train_state.h"
#include "model/gpt2_weights.h"
#include "model/safetensors.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::kBinary;
using cli_testing::kByteTiny;
using cli_testing::Quote;
using cli_testing::ReadAll;
using cli_testing::RunResult;
using cli_testing::Spawn;
using cli_testing::StepRecords;
using cli_testing::WaitExit;
namespace fs = std::filesystem;

// The samples printed after `after_step`: "sample step K" header line -> the escaped sample line.
std::map<int64_t, std::string> Samples(const std::string& out, int64_t after_step) {
  std::map<int64_t, std::string> samples;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.starts_with("sample step ")) continue;
    const int64_t step = std::stoll(line.substr(12));
    std::string text;
    std::getline(lines, text);
    if (step > after_step) samples[step] = text;
  }
  return samples;
}

class ResumeTest : public CliFixture {
 protected:
  static constexpr int kHalf = 4, kSteps = 2 * kHalf;

  void SetUp() override {
    CliFixture::SetUp();
    // Bytes from a fixed LCG: shuffled windows of it differ (a periodic text would repeat them).
    ASSERT_TRUE(WriteTokenFile(Path("train.bin"), cli_testing::LcgByteTokens(6000, 12345)).ok());
    ASSERT_TRUE(WriteTokenFile(Path("val.bin"), cli_testing::LcgByteTokens(1000, 12346)).ok());
  }

  std::vector<std::string> TrainArgs(const std::string& out_dir, const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {
        "train",          "--model",   kByteTiny,  "--train_data",      Path("train.bin"), "--val_data",
        Path("val.bin"),  "--seq_len", "16",       "--batch_size",      "2",               "--max_steps",
        std::to_string(kSteps), "--shuffle", "true", "--warmup_steps", "2",         "--eval_interval",
        "2",              "--eval_batches", "2",   "--sample_interval", "3",               "--sample_tokens",
        "6",              "--save_state", "true",  "--out_dir",         Path(out_dir)};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // The uninterrupted run in "full" and the stopped-then-resumed one in "resumed" agree exactly.
  void ExpectSameRun(const RunResult& full, const RunResult& resumed, int64_t stopped_at) {
    const auto a = StepRecords(ReadAll(Path("full/metrics.jsonl")));
    const auto b = StepRecords(ReadAll(Path("resumed/metrics.jsonl")));
    ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(b.size(), static_cast<size_t>(kSteps - stopped_at)) << resumed;
    for (const auto& [step, record] : b) EXPECT_EQ(record, a.at(step)) << "step " << step;
    const auto sa = Samples(full.out, stopped_at), sb = Samples(resumed.out, stopped_at);
    EXPECT_FALSE(sb.empty()) << resumed;
    EXPECT_EQ(sa, sb);
    // The weights bit for bit, and what they record of the run (the training config's out_dir and
    // resume_state name the runs' own files, so they differ).
    auto wa = ReadSafetensors(Path("full/model.safetensors"));
    auto wb = ReadSafetensors(Path("resumed/model.safetensors"));
    ASSERT_TRUE(wa.ok() && wb.ok());
    ASSERT_EQ(wa->tensors.size(), wb->tensors.size());
    for (size_t i = 0; i < wa->tensors.size(); ++i) {
      EXPECT_EQ(wa->tensors[i].name, wb->tensors[i].name);
      const auto& x = wa->tensors[i].data;
      const auto& y = wb->tensors[i].data;
      EXPECT_TRUE(x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0)
          << wa->tensors[i].name;
    }
    auto run_a = nlohmann::json::parse(wa->metadata.at("trainflow.train_config"));
    auto run_b = nlohmann::json::parse(wb->metadata.at("trainflow.train_config"));
    for (const char* own : {"out_dir", "resume_state"}) run_a.erase(own), run_b.erase(own);
    EXPECT_EQ(run_a, run_b);
    wa->metadata.erase("trainflow.train_config");
    wb->metadata.erase("trainflow.train_config");
    EXPECT_EQ(wa->metadata, wb->metadata);
    // Every rank's state: weights, moments, residuals, data position, bit for bit (the run ids
    // name two different runs).
    for (const std::string& name : StateFiles("full")) {
      auto sa = ReadSafetensors(Path("full/" + name));
      auto sb = ReadSafetensors(Path("resumed/" + name));
      ASSERT_TRUE(sa.ok() && sb.ok()) << name;
      ASSERT_EQ(sa->tensors.size(), sb->tensors.size()) << name;
      for (size_t i = 0; i < sa->tensors.size(); ++i) {
        const auto& x = sa->tensors[i].data;
        const auto& y = sb->tensors[i].data;
        EXPECT_TRUE(x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0)
            << name << ": " << sa->tensors[i].name;
      }
      sa->metadata.erase("run_id");
      sb->metadata.erase("run_id");
      EXPECT_EQ(sa->metadata, sb->metadata) << name;
    }
  }

  std::vector<std::string> StateFiles(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(Path(dir))) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("train_state")) names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    return names;
  }
};

TEST_F(ResumeTest, StopAtStepThenResumeIsBitIdentical) {
  const RunResult full = Run(TrainArgs("full", {}));
  ASSERT_EQ(full.exit_code, 0) << full;
  const RunResult first = Run(TrainArgs("first", {"--stop_at_step", std::to_string(kHalf)}));
  ASSERT_EQ(first.exit_code, 5) << first;  // stopped before max_steps: resumable
  EXPECT_NE(first.out.find("stopping after step 4 of 8 (stop_at_step)"), std::string::npos) << first;
  const RunResult resumed = Run(TrainArgs("resumed", {"--resume_state", Path("first/train_state.safetensors")}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed;
  EXPECT_NE(resumed.out.find("resumed at step 4"), std::string::npos) << resumed;
  ExpectSameRun(full, resumed, kHalf);
  // The stopped run's weights say where it stopped.
  auto st = ReadSafetensors(Path("first/model.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->metadata.at("trainflow.step"), "4");
}

// Resuming into the same out_dir from a state older than the last recorded step (the run went on
// and died) drops the later records, so metrics.jsonl holds every step exactly once.
TEST_F(ResumeTest, ResumeIntoSameDirKeepsOneRecordPerStep) {
  const RunResult full = Run(TrainArgs("full", {}));
  ASSERT_EQ(full.exit_code, 0) << full;
  ASSERT_EQ(Run(TrainArgs("same", {"--stop_at_step", "3"})).exit_code, 5);
  fs::copy_file(Path("same/train_state.safetensors"), Path("state3.safetensors"));
  const RunResult on = Run(TrainArgs("same", {"--resume_state", Path("state3.safetensors"), "--stop_at_step", "6"}));
  ASSERT_EQ(on.exit_code, 5) << on;
  std::ofstream(Path("same/metrics.jsonl"), std::ios::app) << "{\"step\": 7, \"loss\"";  // torn by a crash
  const RunResult resumed = Run(TrainArgs("same", {"--resume_state", Path("state3.safetensors")}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed;
  const std::string text = ReadAll(Path("same/metrics.jsonl"));
  // One record per step, and the evaluation before the first step (eval_interval > 0).
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), kSteps + 1) << text;
  EXPECT_EQ(StepRecords(text), StepRecords(ReadAll(Path("full/metrics.jsonl"))));
}

TEST_F(ResumeTest, ResumeRefusesAChangedTrajectory) {
  ASSERT_EQ(Run(TrainArgs("first", {"--stop_at_step", "2"})).exit_code, 5);
  const std::string state = Path("first/train_state.safetensors");
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"--lr", "1e-3"}, {"--max_steps", "20"}, {"--shuffle", "false"}, {"--batch_size", "3"}}) {
    const RunResult r = Run(TrainArgs("again", {"--resume_state", state, key, value}));
    ExpectCleanFailure(r, {key.substr(2), state});
  }
  // Another model, or other training data, is refused too.
  ASSERT_TRUE(WriteTokenFile(Path("other.bin"), std::vector<uint16_t>(6000, 7)).ok());
  ExpectCleanFailure(Run(TrainArgs("again", {"--resume_state", state, "--train_data", Path("other.bin")})),
                     {"data", state});
  // A damaged state file is refused, naming it.
  std::string bytes = ReadAll(state);
  bytes.resize(bytes.size() / 2);
  std::ofstream(Path("torn.safetensors"), std::ios::binary) << bytes;
  ExpectCleanFailure(Run(TrainArgs("again", {"--resume_state", Path("torn.safetensors")})), {"torn.safetensors"});
}

TEST_F(ResumeTest, TwoMpiRanksWithInt8AndErrorFeedbackResumeBitIdentically) {
  // Each run is `mpirun -np 2 trainflow ...` (on loopback only); the emulated GPU build needs an
  // emulated device per rank and NCCL over MPI, passed on from the test's environment.
  auto mpirun = [&](const std::vector<std::string>& args) {
    std::string launcher = std::string(TF_MPIRUN) + " -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE";
    for (const char* var : {"CUEMU_DEVICES", "TRAINFLOW_NCCL_LIBRARY"}) {
      if (std::getenv(var) != nullptr) launcher += fmt::format(" -x {}", var);
    }
    std::vector<std::string> with = args;
    with.insert(with.end(), {"--compression", "int8", "--error_feedback", "true", "--bucket_mb", "0.01",
                             "--threads", "1"});
    return RunWith(launcher, with);
  };
  const RunResult full = mpirun(TrainArgs("full", {}));
  ASSERT_EQ(full.exit_code, 0) << full;
  ASSERT_NE(full.out.find("compression int8"), std::string::npos) << full;
  EXPECT_EQ(StateFiles("full"), (std::vector<std::string>{"train_state.rank1.safetensors", "train_state.safetensors"}));
  // The residuals are real state: they differ between the ranks and are not all zero.
  auto r0 = ReadTrainState(Path("full/train_state.safetensors"));
  auto r1 = ReadTrainState(Path("full/train_state.rank1.safetensors"));
  ASSERT_TRUE(r0.ok() && r1.ok()) << r0.status().ToString() << r1.status().ToString();
  ASSERT_FALSE(r0->ef_residual.empty());
  EXPECT_NE(r0->ef_residual, r1->ef_residual);

  const RunResult first = mpirun(TrainArgs("first", {"--stop_at_step", std::to_string(kHalf)}));
  ASSERT_EQ(first.exit_code, 5) << first;
  const RunResult resumed = mpirun(TrainArgs("resumed", {"--resume_state", Path("first/train_state.safetensors")}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed;
  ExpectSameRun(full, resumed, kHalf);
  // The same command again in the stopped run's out_dir resumes it by itself, each rank from its
  // own file (rank 1's residuals are its own), to the same weights.
  const RunResult again = mpirun(TrainArgs("first", {}));
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("resuming the stopped run in out_dir from " + Path("first/train_state.safetensors") +
                           " (step 4)"),
            std::string::npos)
      << again;
  cli_testing::ExpectSameWeights(Path("full"), Path("first"));
}

TEST_F(ResumeTest, SigtermStopsAfterTheStepWithLoadableOutputs) {
  for (const int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(strsignal(sig));
    fs::remove_all(Path("run"));
    // Many steps, so the signal lands mid-run; eval and samples off, so steps follow each other.
    std::vector<std::string> args = TrainArgs("run", {"--max_steps", "1000000", "--eval_interval", "0",
                                                      "--sample_tokens", "0", "--save_state", "false"});
    const pid_t pid = Spawn(dir_.string(), args);
    ASSERT_GT(pid, 0);
    // Signal once a few steps are on disk (bounded: 120 s).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (StepRecords(ReadAll(Path("run/metrics.jsonl"))).size() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(::kill(pid, sig), 0);
    const int code = WaitExit(pid, std::chrono::seconds(120));
    const std::string out = ReadAll(Path("stdout.txt")), err = ReadAll(Path("stderr.txt"));
    ASSERT_EQ(code, 5) << out << err;
    EXPECT_NE(out.find("a stop was requested"), std::string::npos) << out;

    // The weights load and record the step reached; metrics.jsonl ends with that step.
    auto st = ReadSafetensors(Path("run/model.safetensors"));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    const int64_t step = std::stoll(st->metadata.at("trainflow.step"));
    const auto records = StepRecords(ReadAll(Path("run/metrics.jsonl")));
    ASSERT_FALSE(records.empty());
    EXPECT_EQ(records.rbegin()->first, step);
    EXPECT_EQ(static_cast<int64_t>(records.size()), step);
    std::string last_line = ReadAll(Path("run/metrics.jsonl"));
    last_line.pop_back();
    last_line = last_line.substr(last_line.rfind('\n') + 1);
    EXPECT_EQ(nlohmann::json::parse(last_line).at("step").get<int64_t>(), step);
    // A stopped run always leaves its training state, and `eval` reads its weights.
    ASSERT_TRUE(fs::exists(Path("run/train_state.safetensors")));
    auto state = ReadTrainState(Path("run/train_state.safetensors"));
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    EXPECT_EQ(state->step, step);
    const RunResult ev = Run({"eval", "--weights", Path("run/model.safetensors"), "--data", Path("val.bin"),
                              "--batches", "1", "--seq-len", "16"});
    EXPECT_EQ(ev.exit_code, 0) << ev;
  }
}

}  // namespace
}  // namespace tf
