// Paths through the real binary: a training config's paths are relative to the config file, what
// a run records (weights card, train_config.json) is absolute, so `eval` works from any directory,
// and a recorded file that is gone is named with the flag that replaces it.
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/weights_card.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::kByteTiny;
using cli_testing::Quote;
using cli_testing::ReadAll;
using cli_testing::RunResult;
namespace fs = std::filesystem;

class PathsTest : public CliFixture {
 protected:
  // `trainflow args` run in directory `cwd`.
  RunResult RunIn(const std::string& cwd, const std::vector<std::string>& args) {
    fs::create_directories(cwd);
    return RunWith("env -C " + Quote(cwd), args);
  }
};

TEST_F(PathsTest, ConfigFilePathsAreRelativeToTheFile) {
  fs::create_directories(Path("project/configs"));
  fs::create_directories(Path("project/data"));
  ASSERT_TRUE(WriteTokenFile(Path("project/data/train.bin"), cli_testing::LcgByteTokens(2000, 3)).ok());
  std::ofstream(Path("project/configs/run.json"))
      << R"({"train_data": "../data/train.bin", "out_dir": "../out", "max_steps": 1, "batch_size": 1,
            "seq_len": 8, "sample_tokens": 0, "metrics_addr": "off"})";
  // From a directory that is neither the project nor the config's.
  const RunResult r = RunIn(Path("elsewhere"), {"train", "--model", kByteTiny, "--train", Path("project/configs/run.json")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(fs::exists(Path("project/out/model.safetensors"))) << r;
  // A command-line path stays relative to the current directory.
  const RunResult o = RunIn(Path("elsewhere"), {"train", "--model", kByteTiny, "--train",
                                                Path("project/configs/run.json"), "--out_dir", "here"});
  ASSERT_EQ(o.exit_code, 0) << o;
  EXPECT_TRUE(fs::exists(Path("elsewhere/here/model.safetensors"))) << o;
}

TEST_F(PathsTest, EvalFromAnotherDirectoryFindsTheRecordedData) {
  ASSERT_TRUE(WriteTokenFile(Path("train.bin"), cli_testing::LcgByteTokens(2000, 3)).ok());
  ASSERT_TRUE(WriteTokenFile(Path("val.bin"), cli_testing::LcgByteTokens(500, 4)).ok());
  const RunResult t = Run({"train", "--model", kByteTiny, "--train_data", "train.bin", "--val_data", "val.bin",
                           "--out_dir", "out", "--max_steps", "1", "--batch_size", "1", "--seq_len", "8",
                           "--eval_batches", "1", "--sample_tokens", "0", "--metrics_addr", "off"});
  ASSERT_EQ(t.exit_code, 0) << t;
  auto card = ReadWeightsCard(Path("out/model.safetensors"));
  ASSERT_TRUE(card.ok()) << card.status().ToString();
  EXPECT_EQ(card->RunString("val_data").value_or(""), Path("val.bin"));
  const auto saved = nlohmann::json::parse(ReadAll(Path("out/train_config.json")));
  EXPECT_EQ(saved.at("train_data"), Path("train.bin"));
  EXPECT_EQ(saved.at("out_dir"), Path("out"));

  const RunResult e = RunIn(Path("elsewhere"), {"eval", "--weights", Path("out/model.safetensors")});
  EXPECT_EQ(e.exit_code, 0) << e;
  fs::rename(Path("val.bin"), Path("moved.bin"));
  const RunResult gone = RunIn(Path("elsewhere"), {"eval", "--weights", Path("out/model.safetensors")});
  ExpectCleanFailure(gone, {Path("val.bin"), "is not there", "--data"});
}

}  // namespace
}  // namespace tf
