// The rescue exchange's target over a real trainer (engine/cli/rescue_target.h over
// engine/checkpointing.h): what Write puts into the checkpoint directory, Discard removes, leaving
// it as it was, so a rescue that failed its cross-check cannot be committed later; a committed
// rescue cannot be discarded.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cli/rescue_target.h"
#include "engine/data/token_file.h"
#include "engine/trainer.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Files(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(d)) {
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), d).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TrainerRescueTest, DiscardRemovesTheUncommittedRescueAndCommitThenFails) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("rescue_target_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog\n";
  const std::vector<uint16_t> tokens(text.begin(), text.end());
  ASSERT_TRUE(WriteTokenFile((dir / "train.bin").string(), tokens).ok());
  const GPT2Config model{
      .n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 256, .block_size = 32, .padded_vocab_size = 256};
  TrainConfig t;
  t.batch_size = 4;
  t.seq_len = 16;
  t.max_steps = 10;
  t.sample_tokens = 0;
  t.eval_batches = 0;
  t.train_data = (dir / "train.bin").string();
  t.device = "cpu";
  t.out_dir = (dir / "out").string();
  t.checkpoint_dir = (dir / "ckpt").string();
  t.checkpoint_interval = 100;
  auto trainer = Trainer::Create(model, t, Trainer::Options{.print_progress = false, .write_outputs = false});
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*trainer)->Step().ok());

  TrainerRescue target(**trainer);
  ASSERT_TRUE(target.rescuable());
  EXPECT_EQ(target.step(), 3);
  const std::vector<std::string> before = Files(dir / "ckpt");
  auto written = target.Write();
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->step, 3);
  EXPECT_FALSE(written->already);
  EXPECT_GT(Files(dir / "ckpt").size(), before.size());

  ASSERT_TRUE(target.Discard().ok());
  EXPECT_EQ(Files(dir / "ckpt"), before);
  EXPECT_FALSE(target.Commit().ok()) << "nothing is left to commit after a discard";
  EXPECT_TRUE(target.Discard().ok()) << "a second discard has nothing to do";

  ASSERT_TRUE(target.Write().ok());
  ASSERT_TRUE(target.Commit().ok());
  const Status late = target.Discard();
  EXPECT_FALSE(late.ok()) << "a committed rescue is a checkpoint: it is not discarded";
  trainer->reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tf
