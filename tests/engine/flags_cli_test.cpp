// Command-line spelling through the real binary: every flag of every command takes dashes or
// underscores between words.
#include <string>

#include "tests/engine/cli_fixture.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::RunResult;

TEST_F(CliFixture, EveryCommandTakesBothSpellings) {
  std::ofstream(Path("text.txt")) << "one two three four five six seven eight nine ten\n";
  const RunResult p = Run({"prepare", "--input", Path("text.txt"), "--out_dir", Path("data"), "--val_fraction", "0"});
  ASSERT_EQ(p.exit_code, 0) << p;
  const RunResult t = Train({"--train_data", Path("data/train.bin"), "--metrics-addr", "off"});
  ASSERT_EQ(t.exit_code, 0) << t;
  const RunResult e = Run({"eval", "--weights", Path("out/model.safetensors"), "--data", Path("data/train.bin"),
                           "--batch_size", "1", "--seq_len", "8", "--batches", "1"});
  EXPECT_EQ(e.exit_code, 0) << e;
  const RunResult s = Run({"sample", "--weights", Path("out/model.safetensors"), "--tokens", "3", "--top_k", "2"});
  EXPECT_EQ(s.exit_code, 0) << s;
}

}  // namespace
}  // namespace tf
