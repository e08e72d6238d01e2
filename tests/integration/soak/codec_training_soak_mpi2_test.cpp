// Training with each gradient codec on 2 ranks (CTest: mpirun -np 2) reaches the validation loss of
// the uncompressed run on the default corpus within a stated margin.
//
// Setup: configs/model/byte-small.json, configs/train/fortunes.json with 300 steps and batch 8 per
// rank (the config's global batch of 16), 1 thread per rank. Measured on the dev machine
// (2026-12-03, bench/RESULTS.md): none 2.5865; bf16 2.5865; fp16 2.5865; int8 2.5895 (+0.12%);
// int8-sr 2.5876 (+0.04%); sign 2.6928 (+4.1%); topk:0.1 2.8764 (+11.2%); topk:0.01 3.0331 (+17%,
// not run here). Measured again on 2026-12-07 (the same code as on 12-03 gives other figures on this
// machine: none 2.5953, int8 +0.04%, sign +7.47%, topk:0.1 +7.9%). Margins: 16-bit formats 0.5%,
// int8 1%, sign 10%, topk:0.1 15% — about 1.3-1.5x the worst measured for the lossy ones, so a broken
// codec or lost error feedback (which stalls training far above these losses) fails, while
// different CPUs' rounding does not.
#include <mpi.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "engine/data/prepare.h"
#include "engine/trainer.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

TEST(CodecTraining, EveryCodecReachesTheUncompressedValidationLossWithinItsMargin) {
  auto topo = comm::InitProcessGroup();
  ASSERT_TRUE(topo.ok()) << topo.status().ToString();
  ASSERT_EQ(topo->world, 2) << "run me under mpirun -np 2";
  char dir[512] = {};
  if (topo->rank == 0) {
    const fs::path d = fs::path(::testing::TempDir()) / ("codec_training_" + std::to_string(::getpid()));
    PrepareOptions p;
    p.inputs = {"/usr/share/games/fortunes"};
    p.out_dir = d.string();
    p.delimiter = "%";
    p.val_fraction = 0.05;
    auto prepared = PrepareData(p, *MakeByteTokenizer());
    ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
    std::snprintf(dir, sizeof(dir), "%s", d.c_str());
  }
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);

  auto model = LoadModelConfig(std::string(TF_SOURCE_DIR) + "/configs/model/byte-small.json");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto json = ReadJsonFile(std::string(TF_SOURCE_DIR) + "/configs/train/fortunes.json", "training config");
  ASSERT_TRUE(json.ok());
  auto base = ParseTrainConfig(*json, "fortunes.json");
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  base->train_data = std::string(dir) + "/train.bin";
  base->val_data = std::string(dir) + "/val.bin";
  base->max_steps = 300;
  base->batch_size = 8;
  base->eval_interval = 0;
  base->sample_tokens = 0;
  base->threads = 1;
  base->device = "cpu";

  auto val_loss = [&](const char* codec) -> float {
    TrainConfig t = *base;
    t.compression = codec;
    auto trainer = Trainer::Create(*model, t, {.print_progress = false, .write_outputs = false});
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    if (!trainer.ok()) return 1e9f;
    auto result = (*trainer)->Run();
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    if (!result.ok() || result->val_losses.empty()) return 1e9f;
    return result->val_losses.back().second;
  };
  const float none = val_loss("none");
  EXPECT_LT(none, 2.75f) << "the uncompressed run itself did not learn (measured 2.5865)";
  struct Case {
    const char* codec;
    double margin;
  };
  for (const Case& c : {Case{"bf16", 0.005}, Case{"fp16", 0.005}, Case{"int8", 0.01}, Case{"int8-sr", 0.01},
                        Case{"sign", 0.10}, Case{"topk:0.1", 0.15}}) {
    const float v = val_loss(c.codec);
    if (topo->rank == 0) {
      std::printf("[ codec training ] %-9s val loss %.4f (none %.4f, %+.2f%%, margin %.1f%%)\n", c.codec, v, none,
                  100.0 * (v / none - 1.0), 100.0 * c.margin);
    }
    EXPECT_LE(v, none * (1.0 + c.margin)) << c.codec;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (topo->rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace tf
