// GPT2Cuda's memory plan, computed on the host (runs without a GPU; needs the CUDA build): what
// attention and recomputation save, and the figures docs/cuda.md quotes — GPT-2 1558M at T = 1024
// fits one 80 GB GPU in bf16 with a useful batch. (gpt2_cuda_test checks on a GPU that the plan is
// exactly what Create() allocates.)
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#if defined(TF_WITH_CUDA)
#include "model/config.h"
#include "model/gpt2_cuda.h"
#endif

namespace tf {
namespace {

#if defined(TF_WITH_CUDA)
using Attention = GPT2CudaOptions::Attention;
using cuda::DType;

constexpr double kGB = 1e9;
// An 80 GB H100 exposes 79.6 GiB = 85.5e9 bytes; keep 80e9 minus 2 GB for the CUDA context, cuBLAS
// internals and allocator slack.
constexpr double kUsable80GB = 78e9;

GPT2Config Load(const std::string& name) {
  auto c = LoadModelConfig(std::string(TF_SOURCE_DIR) + "/configs/model/" + name);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : GPT2Config{};
}

GPT2CudaMemory Estimate(const GPT2Config& c, int B, int T, DType dt, Attention a, int recompute) {
  auto m = GPT2Cuda::EstimateMemory(c, B, T, dt, GPT2CudaOptions{.attention = a, .recompute = recompute});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? *m : GPT2CudaMemory{};
}

void Print(const char* what, const GPT2CudaMemory& m) {
  std::printf("%-34s total %6.2f GB = state %5.2f (params %.2f grads %.2f master %.2f moments %.2f) "
              "+ activations %6.2f + stats %.2f + backward %.2f + scratch %.2f + cublas %.2f\n",
              what, m.total / kGB, (m.params + m.grads + m.master + m.moments) / kGB, m.params / kGB, m.grads / kGB,
              m.master / kGB, m.moments / kGB, m.activations / kGB, m.stats / kGB, m.backward / kGB,
              m.scratch / kGB, m.cublas_workspace / kGB);
}

TEST(GPT2CudaMemory, Gpt2_1558mFitsOn80GB) {
  const GPT2Config c = Load("gpt2-1558m.json");
  ASSERT_EQ(c.n_layer, 48);
  for (int B : {4, 8, 12, 16, 20, 24}) {
    for (int r = 0; r <= 2; ++r) {
      const std::string what = "1558M bf16 T=1024 B=" + std::to_string(B) + " flash r" + std::to_string(r);
      Print(what.c_str(), Estimate(c, B, 1024, DType::kBF16, Attention::kFlash, r));
    }
  }
  // The documented configurations (docs/cuda.md): recompute 2 at B = 24 (24576 tokens per step,
  // 66.7 GB) and recompute 0 at B = 16 (67.6 GB).
  const GPT2CudaMemory r2 = Estimate(c, 24, 1024, DType::kBF16, Attention::kFlash, 2);
  EXPECT_LT(double(r2.total), kUsable80GB);
  EXPECT_LT(double(Estimate(c, 16, 1024, DType::kBF16, Attention::kFlash, 0).total), kUsable80GB);
  // Weights, gradients, master and moments alone: 16 bytes per parameter.
  const size_t P = static_cast<size_t>(ParameterLayout(c).total());
  EXPECT_EQ(r2.params + r2.grads + r2.master + r2.moments, 16 * P);
  // The GEMM attention's (L,B,NH,T,T) probabilities do not fit at all.
  EXPECT_GT(double(Estimate(c, 16, 1024, DType::kBF16, Attention::kGemm, 2).total), 80e9);
}

TEST(GPT2CudaMemory, AttentionAndRecomputeSave) {
  const GPT2Config c = Load("gpt2-124m.json");
  const GPT2CudaMemory gemm = Estimate(c, 16, 1024, DType::kBF16, Attention::kGemm, 0);
  const GPT2CudaMemory r0 = Estimate(c, 16, 1024, DType::kBF16, Attention::kFlash, 0);
  const GPT2CudaMemory r1 = Estimate(c, 16, 1024, DType::kBF16, Attention::kFlash, 1);
  const GPT2CudaMemory r2 = Estimate(c, 16, 1024, DType::kBF16, Attention::kFlash, 2);
  Print("124M bf16 B=16 T=1024 gemm r0", gemm);
  Print("124M bf16 B=16 T=1024 flash r0", r0);
  Print("124M bf16 B=16 T=1024 flash r1", r1);
  Print("124M bf16 B=16 T=1024 flash r2", r2);
  const double N = 16.0 * 1024, L = 12, C = 768, NH = 12, T = 1024;
  // GEMM attention stores L*B*NH*T*T probabilities (bf16); flash stores L*B*NH*T fp32 lse instead.
  EXPECT_NEAR(double(gemm.activations) - double(r0.activations), L * 16 * NH * T * T * 2, 1e6);
  EXPECT_NEAR(double(r0.stats) - double(gemm.stats), L * 16 * NH * T * 4, 1e4);
  // Recompute 1 keeps one layer of GELU output instead of L; recompute 2 also one layer of ln1, ln2.
  EXPECT_NEAR(double(r0.activations) - double(r1.activations), (L - 1) * N * 4 * C * 2, 1e4);
  EXPECT_NEAR(double(r1.activations) - double(r2.activations), 2 * (L - 1) * N * C * 2, 1e4);
  EXPECT_EQ(r0.params, r2.params);
  EXPECT_LT(r2.total, r1.total);
  EXPECT_LT(r1.total, r0.total);
  EXPECT_LT(r0.total, gemm.total);
  EXPECT_EQ(r0.total, r0.buffers + r0.cublas_workspace);
  // The epilogue fusions change no buffer: the plan is the same with and without them.
  const auto unfused = GPT2Cuda::EstimateMemory(
      c, 16, 1024, DType::kBF16, GPT2CudaOptions{.gelu_fusion = 0, .fuse_residual = false});
  ASSERT_TRUE(unfused.ok());
  EXPECT_EQ(unfused->total, r0.total);
  // Besides tokens and two doubles, `other` holds AdamW's decay-run table (9 bytes per run).
  EXPECT_EQ(r0.other, 2 * size_t(N) * 4 + 2 * sizeof(double) + DecayRanges(ParameterLayout(c)).size() * 9);
  // fp32 mode: no separate master copy.
  EXPECT_EQ(Estimate(c, 2, 64, DType::kF32, Attention::kFlash, 0).master, 0u);
}

TEST(GPT2CudaMemory, RejectsBadOptions) {
  const GPT2Config c = Load("gpt2-124m.json");
  EXPECT_FALSE(GPT2Cuda::EstimateMemory(c, 16, 1024, DType::kBF16, GPT2CudaOptions{.recompute = 3}).ok());
  EXPECT_FALSE(GPT2Cuda::EstimateMemory(c, 16, 1024, DType::kBF16, GPT2CudaOptions{.gelu_fusion = 3}).ok());
  EXPECT_FALSE(GPT2Cuda::EstimateMemory(c, 16, 1024, DType::kBF16, GPT2CudaOptions{.gelu_fusion = -2}).ok());
  // cuDNN attention: bf16 only; the same activations as flash (lse, no probabilities) plus its
  // workspace (the deterministic backward's dS tiles: 16*12*16^2*64^2*2 bytes = 403 MB here).
  EXPECT_FALSE(
      GPT2Cuda::EstimateMemory(c, 16, 1024, DType::kF32, GPT2CudaOptions{.attention = Attention::kCudnn}).ok());
  auto cudnn = GPT2Cuda::EstimateMemory(c, 16, 1024, DType::kBF16, GPT2CudaOptions{.attention = Attention::kCudnn});
  ASSERT_TRUE(cudnn.ok()) << cudnn.status().ToString();
  auto flash = GPT2Cuda::EstimateMemory(c, 16, 1024, DType::kBF16, GPT2CudaOptions{});
  ASSERT_TRUE(flash.ok());
  EXPECT_EQ(cudnn->activations, flash->activations);
  EXPECT_EQ(cudnn->stats, flash->stats);
  if (cuda::DeviceCount() == 0) {
    EXPECT_GE(cudnn->scratch, size_t{16} * 12 * 16 * 16 * 64 * 64 * 2);
  }
  EXPECT_FALSE(GPT2Cuda::EstimateMemory(c, 16, 2048, DType::kBF16, GPT2CudaOptions{}).ok());  // > block_size
  GPT2Config wide = c;
  wide.n_head = 3;  // head size 256: flash cannot, GEMM attention can
  EXPECT_FALSE(GPT2Cuda::EstimateMemory(wide, 1, 64, DType::kBF16, GPT2CudaOptions{}).ok());
  EXPECT_TRUE(
      GPT2Cuda::EstimateMemory(wide, 1, 64, DType::kBF16, GPT2CudaOptions{.attention = Attention::kGemm}).ok());
}
#else
TEST(GPT2CudaMemory, NeedsCudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif

}  // namespace
}  // namespace tf
