// Command-line spelling through the real binary: every flag of every command takes dashes (the
// documented spelling) or underscores (an alias) between words, `train --help` lists the config
// keys, a plain `train` keeps a log, and a non-number where a number belongs is named as such.
#include <string>

#include "engine/cli/cli.h"
#include "engine/train_config.h"
#include "model/config.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::RunResult;

class FlagsCli : public CliFixture {};

TEST_F(FlagsCli, EveryCommandTakesBothSpellings) {
  std::ofstream(Path("text.txt")) << "one two three four five six seven eight nine ten\n";
  const RunResult p = Run({"prepare", "--input", Path("text.txt"), "--out_dir", Path("data"), "--val_fraction", "0"});
  ASSERT_EQ(p.exit_code, 0) << p;
  const RunResult t = Train({"--train_data", Path("data/train.bin"), "--metrics-addr", "off", "--max-steps=2",
                             "--log_interval", "2"});
  ASSERT_EQ(t.exit_code, 0) << t;
  // Both spellings of training keys reached the config: the dashed one documented, the other an alias.
  const nlohmann::json config = nlohmann::json::parse(cli_testing::ReadAll(Path("out/train_config.json")));
  EXPECT_EQ(config["max_steps"], 2) << config;
  EXPECT_EQ(config["log_interval"], 2) << config;
  EXPECT_EQ(config["metrics_addr"], "off") << config;
  const RunResult e = Run({"eval", "--weights", Path("out/model.safetensors"), "--data", Path("data/train.bin"),
                           "--batch_size", "1", "--seq_len", "8", "--batches", "1"});
  EXPECT_EQ(e.exit_code, 0) << e;
  const RunResult s = Run({"sample", "--weights", Path("out/model.safetensors"), "--tokens", "3", "--top_k", "2"});
  EXPECT_EQ(s.exit_code, 0) << s;
}

// The train command `launch` and `slurm` check before they start anything reads its flags as
// `trainflow train` does, in either spelling.
TEST_F(FlagsCli, SupervisedTrainCommandTakesBothSpellings) {
  GPT2Config model;
  TrainConfig train;
  for (const char* init : {"--init-from", "--init_from"}) {
    SCOPED_TRACE(init);
    // No --model: the model comes from the weights, which are not there (not "--model is required").
    const Status s = ResolveTrainCommand({"train", init, Path("none.safetensors")}, &model, &train);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message().find("--model is required"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("none.safetensors"), std::string::npos) << s.ToString();
  }
  for (const char* steps : {"--max-steps", "--max_steps"}) {
    SCOPED_TRACE(steps);
    ASSERT_TRUE(ResolveTrainCommand({"train", "--model", cli_testing::kByteTiny, steps, "7"}, &model, &train).ok());
    EXPECT_EQ(train.max_steps, 7);
  }
}

TEST_F(FlagsCli, TrainHelpListsTheKeys) {
  const RunResult h = Run({"train", "--help"});
  EXPECT_EQ(h.exit_code, 0) << h;
  for (const char* needle : {"docs/configs.md", "--checkpoint-keep-last", "--fresh", "--extend", "--n-layer",
                             "--max_steps, is an alias"}) {
    EXPECT_NE(h.out.find(needle), std::string::npos) << needle << "\n" << h;
  }
}

TEST_F(FlagsCli, TrainKeepsALogOfTheConsole) {
  TokenFile("train.bin", 400);
  const RunResult t = Train({"--train_data", Path("train.bin"), "--metrics_addr", "off"});
  ASSERT_EQ(t.exit_code, 0) << t;
  const std::string log = cli_testing::ReadAll(Path("out/train.log"));
  EXPECT_NE(log.find("step     1/1"), std::string::npos) << log;
  EXPECT_NE(t.out.find("step     1/1"), std::string::npos) << t;  // the console still shows it
  // A second run (refused: out_dir holds the first) appends; its error is there too.
  const RunResult again = Train({"--train_data", Path("train.bin"), "--metrics_addr", "off"});
  EXPECT_EQ(again.exit_code, 2) << again;
  const std::string both = cli_testing::ReadAll(Path("out/train.log"));
  EXPECT_TRUE(both.starts_with(log)) << both;
  EXPECT_NE(both.find("already holds"), std::string::npos) << both;
}

TEST_F(FlagsCli, NumberFlagsNameTheProblem) {
  const RunResult r = Run({"sample", "--weights", Path("none.safetensors"), "--tokens", "abc"});
  ExpectCleanFailure(r, {"--tokens", "whole number", "abc"});
}

}  // namespace
}  // namespace tf
