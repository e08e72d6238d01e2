// The data-parallel tests' fixture (run under mpirun): rank 0 writes a small learnable byte corpus
// that every rank reads, a 2-layer model, and a training config for `device_` ("cpu" or "cuda").
// Used by data_parallel_mpi_test.cpp (CPU ranks) and data_parallel_cuda_mpi_test.cpp (GPU ranks).
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/process_group.h"
#include "engine/data/token_file.h"
#include "engine/trainer.h"

namespace tf::test {

namespace fs = std::filesystem;

class DataParallelFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = comm::InitProcessGroup();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    topo_ = *t;
    ASSERT_GE(topo_.world, 2) << "run me under mpirun -np N (N >= 2)";
    // Rank 0 writes the data; every rank uses the same path (it is part of the checked config).
    char path[512] = {};
    if (topo_.rank == 0) {
      const fs::path dir = fs::path(::testing::TempDir()) / ("dp_test_" + std::to_string(::getpid()));
      fs::create_directories(dir);
      std::vector<uint16_t> tokens;
      // Learnable bytes: a few sentences repeated with a varying counter.
      const std::string text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ";
      for (int rep = 0; tokens.size() < 60000; ++rep) {
        for (char ch : text + std::to_string(rep % 97) + "\n") tokens.push_back(static_cast<unsigned char>(ch));
      }
      const std::string file = (dir / "train.bin").string();
      ASSERT_TRUE(WriteTokenFile(file, tokens).ok());
      std::snprintf(path, sizeof(path), "%s", file.c_str());
    }
    MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
    data_ = path;
    model_.n_layer = 2, model_.n_head = 2, model_.n_embd = 32, model_.vocab_size = 256;
    model_.padded_vocab_size = 256, model_.block_size = 32;
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (topo_.rank == 0 && !data_.empty()) fs::remove_all(fs::path(data_).parent_path());
  }
  TrainConfig Config(int batch, int accum, bool shuffle) const {
    TrainConfig t;
    t.batch_size = batch;
    t.seq_len = 16;
    t.grad_accum_steps = accum;
    t.max_steps = 12;
    t.lr = 3e-3;
    t.min_lr = 3e-4;
    t.warmup_steps = 2;
    t.train_data = data_;
    t.eval_interval = 0;
    t.sample_tokens = 0;
    t.shuffle = shuffle;
    t.seed = 5;
    t.threads = 1;
    t.device = device_;
    return t;
  }
  std::vector<float> Losses(const TrainConfig& t, bool distributed) {
    auto trainer = Trainer::Create(model_, t,
                                   {.print_progress = false, .write_outputs = false, .distributed = distributed});
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    if (!trainer.ok()) return {};
    auto result = (*trainer)->Run();
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    std::vector<float> losses;
    if (result.ok()) {
      for (const StepStats& s : result->steps) losses.push_back(s.loss);
    }
    return losses;
  }
  comm::Topology topo_;
  std::string data_;
  GPT2Config model_;
  std::string device_ = "cpu";
};

}  // namespace tf::test
