// Running the same `trainflow train` command again, through the real binary: a stopped run in
// out_dir is resumed (and the stop says so), a finished run or another run's outputs are refused
// unless --fresh or --extend says what to do, a checkpoint_dir holding another run's checkpoints
// needs the same explicit choice, and retention never deletes checkpoints the run did not write.
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/train_state.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::kByteTiny;
using cli_testing::ReadAll;
using cli_testing::RunResult;
using cli_testing::StepRecords;
namespace fs = std::filesystem;

class RerunTest : public CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    ASSERT_TRUE(WriteTokenFile(Path("train.bin"), cli_testing::LcgByteTokens(4000, 7)).ok());
  }
  RunResult Train(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train",        "--model", kByteTiny, "--train_data",
                                     Path("train.bin"), "--seq_len", "8",  "--batch_size", "2", "--max_steps", "4",
                                     "--sample_tokens", "0", "--metrics_addr", "off", "--out_dir", Path("out")};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(args);
  }
  bool Has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }
};

TEST_F(RerunTest, StoppedRunResumesFinishedRunIsRefused) {
  const std::string state = Path("out/train_state.safetensors");
  const RunResult stop = Train({"--stop_at_step", "2", "--threads", "1"});
  ASSERT_EQ(stop.exit_code, 5) << stop;
  EXPECT_TRUE(Has(stop.out, "a clean, resumable stop")) << stop;
  EXPECT_TRUE(Has(stop.out, "run the same command again to resume from " + state)) << stop;

  // The same command (without the planned stop) continues at step 3, and says from where.
  const RunResult again = Train({"--threads", "2"});
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_TRUE(Has(again.out, "resuming the stopped run in out_dir from " + state + " (step 2)")) << again;
  EXPECT_TRUE(Has(again.err, "summation order")) << again;  // 1 thread then, 2 now
  EXPECT_EQ(StepRecords(ReadAll(Path("out/metrics.jsonl"))).size(), 4u);
  EXPECT_FALSE(fs::exists(state));  // no stale state beside the finished run's weights

  // A finished run is not overwritten by accident.
  const RunResult third = Train({});
  EXPECT_EQ(third.exit_code, 2) << third;
  EXPECT_TRUE(Has(third.err, "already holds a run's outputs") && Has(third.err, "--fresh")) << third;
  const RunResult fresh = Train({"--fresh"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh;
  EXPECT_FALSE(Has(fresh.out, "resum")) << fresh;
}

TEST_F(RerunTest, AnotherRunsStateIsRefused) {
  ASSERT_EQ(Train({"--stop_at_step", "2"}).exit_code, 5);
  const RunResult other = Train({"--lr", "0.001"});
  EXPECT_EQ(other.exit_code, 2) << other;
  EXPECT_TRUE(Has(other.err, "cannot resume the training state in out_dir") && Has(other.err, "'lr'") &&
              Has(other.err, "--fresh"))
      << other;
}

TEST_F(RerunTest, ExtendContinuesAFinishedRunAsANewTrajectory) {
  ASSERT_EQ(Train({"--save_state", "true"}).exit_code, 0);
  const RunResult refused = Train({"--save_state", "true", "--max_steps", "6"});
  EXPECT_EQ(refused.exit_code, 2) << refused;
  EXPECT_TRUE(Has(refused.err, "finished run") && Has(refused.err, "--extend")) << refused;
  // Naming the state explicitly: the refusal says how to continue.
  fs::copy_file(Path("out/train_state.safetensors"), Path("state4.safetensors"));
  const RunResult exact = Train({"--max_steps", "6", "--resume_state", Path("state4.safetensors"), "--out_dir",
                                 Path("other")});
  EXPECT_EQ(exact.exit_code, 2) << exact;
  EXPECT_TRUE(Has(exact.err, "'max_steps'") && Has(exact.err, "--extend")) << exact;

  const RunResult extended = Train({"--save_state", "true", "--max_steps", "6", "--extend"});
  ASSERT_EQ(extended.exit_code, 0) << extended;
  EXPECT_TRUE(Has(extended.out, "(step 4)")) << extended;
  EXPECT_EQ(StepRecords(ReadAll(Path("out/metrics.jsonl"))).size(), 6u);
  auto st = ReadTrainStateMeta(Path("out/train_state.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->step, 6);
  EXPECT_EQ(nlohmann::json::parse(st->train_config).at("extended_at"), nlohmann::json::array({4}));
  // Nothing to extend in an empty out_dir.
  const RunResult nothing = Train({"--extend", "--out_dir", Path("empty")});
  EXPECT_EQ(nothing.exit_code, 2) << nothing;
}

TEST_F(RerunTest, CheckpointDirOfAnotherRunNeedsFreshAndKeepsItsCheckpoints) {
  const std::string ck = Path("ck");
  const RunResult a = Train({"--checkpoint_dir", ck, "--checkpoint_interval", "1", "--max_steps", "2", "--out_dir",
                             Path("a")});
  ASSERT_EQ(a.exit_code, 0) << a;
  auto manifest = [&](int step) { return fmt::format("{}/step-{:012}/MANIFEST.json", ck, step); };
  ASSERT_TRUE(fs::exists(manifest(1)) && fs::exists(manifest(2)));
  const std::vector<std::string> b = {"--checkpoint_dir", ck, "--checkpoint_interval", "3", "--checkpoint_keep_last",
                                      "1", "--resume", "none", "--lr", "0.001", "--out_dir", Path("b")};
  const RunResult refused = Train(b);
  EXPECT_EQ(refused.exit_code, 2) << refused;
  EXPECT_TRUE(Has(refused.err, "holds checkpoints of steps 1, 2") && Has(refused.err, "--fresh")) << refused;
  std::vector<std::string> fresh = b;
  fresh.push_back("--fresh");
  const RunResult run = Train(fresh);
  ASSERT_EQ(run.exit_code, 0) << run;
  // Its own step 3 went (keep_last 1), the other run's 1 and 2 stay.
  EXPECT_TRUE(fs::exists(manifest(1)) && fs::exists(manifest(2)) && fs::exists(manifest(4)));
  EXPECT_FALSE(fs::exists(manifest(3)));

  // A stop with checkpoints says the same command resumes.
  const RunResult stop = Train({"--checkpoint_dir", Path("ck2"), "--stop_at_step", "1", "--out_dir", Path("c")});
  ASSERT_EQ(stop.exit_code, 5) << stop;
  EXPECT_TRUE(Has(stop.out, "run the same command to resume")) << stop;
}

}  // namespace
}  // namespace tf
