// Data-parallel training on GPU ranks (NCCL, comm/device_reducer.h, the CUDA codecs), run by CTest
// under `mpirun -np 2` and `-np 3`: a W-rank fp32 run with batch B per rank follows the loss curve
// of a 1-rank run with batch W*B; bf16 stays close to it; each lossy codec's run repeats bit for
// bit and still learns.
//
// Where it runs: on a machine with one GPU per local rank and NCCL (skipped otherwise, naming why),
// and in CI on the CUDA emulator (tests/emulator: kernels on the CPU, NCCL over MPI), where it is
// registered as emu.data_parallel_cuda_mpi_test_np2/np3.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/mpi/data_parallel_fixture.h"
#if defined(TF_WITH_CUDA)
#include "comm/nccl_communicator.h"
#include "engine/train_backend.h"
#endif

namespace tf {
namespace {

class DataParallelCudaTest : public test::DataParallelFixture {
 protected:
  void SetUp() override {
#if !defined(TF_WITH_CUDA)
    GTEST_SKIP() << "built without the CUDA backend";
#else
    test::DataParallelFixture::SetUp();
    if (HasFatalFailure()) return;
    device_ = "cuda";
    // Every rank decides the same way (a skip on one rank only would leave the others waiting).
    std::string why;
    int ok = CudaDeviceCount() >= topo_.local_world && comm::NcclAvailable(&why) ? 1 : 0;
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all == 0) {
      GTEST_SKIP() << "needs one GPU per local rank (" << topo_.local_world << ") and NCCL"
                   << (why.empty() ? "" : ": " + why);
    }
#endif
  }
  TrainConfig CudaConfig(int batch, int accum, const std::string& dtype, const std::string& codec) const {
    TrainConfig t = Config(batch, accum, /*shuffle=*/accum > 1);
    t.dtype = dtype;
    t.compression = codec;
    return t;
  }
};

double WorstRelative(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t s = 0; s < a.size() && s < b.size(); ++s) {
    worst = std::max(worst, std::abs(static_cast<double>(a[s]) - b[s]) / b[s]);
  }
  return worst;
}

TEST_F(DataParallelCudaTest, Fp32LossCurveEqualsSingleRankWithGlobalBatch) {
  for (const int accum : {1, 2}) {
    SCOPED_TRACE("accum=" + std::to_string(accum));
    const int B = 2;
    const std::vector<float> single = Losses(CudaConfig(B * topo_.world, accum, "fp32", "none"), false);
    const std::vector<float> dp = Losses(CudaConfig(B, accum, "fp32", "none"), true);
    ASSERT_EQ(single.size(), dp.size());
    // Float rounding only (the same per-example gradients summed in another order); a wrong
    // average or a missed bucket moves the loss by ~1e-2 or more.
    for (size_t s = 0; s < dp.size(); ++s) EXPECT_NEAR(dp[s], single[s], 1e-4 * single[s]) << "step " << s;
    if (topo_.rank == 0) {
      std::printf("[ dp cuda ] fp32 accum %d: largest relative loss difference vs 1 rank %.2e\n", accum,
                  WorstRelative(dp, single));
    }
    EXPECT_LT(dp.back(), dp.front() - 0.5f) << "the model should learn";
  }
}

TEST_F(DataParallelCudaTest, Bf16StaysCloseToSingleRank) {
  const int B = 2;
  const std::vector<float> single = Losses(CudaConfig(B * topo_.world, 1, "bf16", "none"), false);
  const std::vector<float> dp = Losses(CudaConfig(B, 1, "bf16", "none"), true);
  ASSERT_EQ(single.size(), dp.size());
  // bf16 gradients are averaged in bf16 (NCCL ncclAvg) instead of summed per example in fp32
  // accumulators: differences of bf16 rounding (2^-9 relative) per step, compounding over 12 steps.
  const double worst = WorstRelative(dp, single);
  if (topo_.rank == 0) std::printf("[ dp cuda ] bf16: largest relative loss difference vs 1 rank %.2e\n", worst);
  EXPECT_LT(worst, 2e-2);
  EXPECT_LT(dp.back(), dp.front() - 0.5f) << "the model should learn";
}

TEST_F(DataParallelCudaTest, LossyCodecsRepeatExactlyAndLearn) {
  const std::vector<float> exact = Losses(CudaConfig(2, 1, "fp32", "none"), true);
  ASSERT_FALSE(exact.empty());
  for (const char* codec : {"bf16", "int8", "int8-sr", "sign", "topk:0.1"}) {
    SCOPED_TRACE(codec);
    TrainConfig t = CudaConfig(2, 1, "fp32", codec);
    const std::vector<float> a = Losses(t, true), b = Losses(t, true);
    ASSERT_EQ(a.size(), exact.size());
    EXPECT_EQ(a, b) << "a fixed seed repeats bit for bit";
    EXPECT_LT(a.back(), a.front() - 0.3f) << "still learns";
    if (topo_.rank == 0) {
      std::printf("[ dp cuda ] %-8s final loss %.4f (none %.4f)\n", codec, a.back(), exact.back());
    }
  }
}

}  // namespace
}  // namespace tf
