// The per-piece work model of a GPU training step (model/step_work.h): its FLOPs against the
// closed-form counts, its pieces against the options that create or remove them, and the roofline.
// (That its piece names are exactly the ranges GPT2Cuda marks is checked in gpt2_cuda_test.cpp.)
#include "model/step_work.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "model/parameters.h"

namespace tf {
namespace {

const GPT2Config k124M{.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024,
                       .padded_vocab_size = 50304};

const PieceWork* Find(const std::vector<PieceWork>& work, const std::string& name) {
  auto it = std::find_if(work.begin(), work.end(), [&](const PieceWork& p) { return p.name == name; });
  return it == work.end() ? nullptr : &*it;
}

std::set<std::string> Names(const std::vector<PieceWork>& work) {
  std::set<std::string> names;
  for (const PieceWork& p : work) EXPECT_TRUE(names.insert(p.name).second) << "piece listed twice: " << p.name;
  return names;
}

TEST(StepWork, GemmFlopsAreSixPerParameterPerToken) {
  // Every weight matrix (the tied wte as the LM head) does one multiply-add per token forward and
  // two backward: 6 * N * (12 L C^2 + C Vp) FLOPs; attention separately.
  for (int elem : {2, 4}) {
    const StepWorkOptions o{.batch = 16, .seq = 1024, .elem_bytes = elem};
    const auto work = GPT2StepWork(k124M, o);
    const double N = 16.0 * 1024, C = 768, L = 12, Vp = 50304;
    double gemm = 0, attention = 0, other = 0;
    for (const PieceWork& p : work) {
      if (p.name.starts_with("attention")) attention += p.flops;
      else if (p.name.ends_with(" fwd") || p.name.ends_with(" bwd")) gemm += p.flops;
      else other += p.flops;
    }
    EXPECT_DOUBLE_EQ(gemm, 6 * N * (12 * L * C * C + C * Vp));
    EXPECT_EQ(other, 0.0);
    // Causal: T(T+1)/2 scores per head, 4 hs FLOPs each forward, 10 hs backward (FlashAttention-2's 5 products).
    const double scores = 16.0 * 12 * 1024 * 1025 / 2;
    EXPECT_DOUBLE_EQ(Find(work, "attention fwd")->flops, L * 4 * 64 * scores);
    EXPECT_DOUBLE_EQ(Find(work, "attention bwd")->flops, L * 10 * 64 * scores);
  }
}

TEST(StepWork, PiecesFollowTheOptions) {
  const StepWorkOptions base{.batch = 4, .seq = 256, .elem_bytes = 2};
  const auto names = Names(GPT2StepWork(k124M, base));
  for (const char* n : {"gelu fwd", "gelu bwd", "layernorm fwd", "layernorm bwd", "adamw", "embedding bwd"}) {
    EXPECT_TRUE(names.contains(n)) << n;
  }
  for (const char* n : {"residual add", "recompute"}) EXPECT_FALSE(names.contains(n)) << n;

  StepWorkOptions o = base;
  o.gelu_fusion = 1;
  auto got = Names(GPT2StepWork(k124M, o));
  EXPECT_FALSE(got.contains("gelu fwd"));
  EXPECT_TRUE(got.contains("gelu bwd"));
  o.gelu_fusion = 2;
  got = Names(GPT2StepWork(k124M, o));
  EXPECT_FALSE(got.contains("gelu bwd"));
  o = base;
  o.fuse_residual = false;
  o.recompute = 1;
  got = Names(GPT2StepWork(k124M, o));
  EXPECT_TRUE(got.contains("residual add"));
  EXPECT_TRUE(got.contains("recompute"));

  // Recompute 2 re-runs the GELU and both LayerNorms of every layer (without statistics).
  const double N = 4.0 * 256, C = 768, L = 12;
  o = base;
  o.recompute = 2;
  EXPECT_DOUBLE_EQ(Find(GPT2StepWork(k124M, o), "recompute")->bytes, L * (2 * 8 * N * C + 2 * 2 * (2 * N * C + 2 * C)));
}

TEST(StepWork, FusionsRemoveTraffic) {
  const StepWorkOptions base{.batch = 16, .seq = 1024, .elem_bytes = 2};
  auto total = [](const std::vector<PieceWork>& w) {
    double bytes = 0;
    for (const PieceWork& p : w) bytes += p.bytes;
    return bytes;
  };
  const double fused = total(GPT2StepWork(k124M, base));
  StepWorkOptions o = base;
  o.fuse_residual = false;
  // Unfused: the GEMMs no longer read the residual (2 N C per layer) but two adds read 2 and write 1.
  const double NC = 16.0 * 1024 * 768;
  EXPECT_DOUBLE_EQ(total(GPT2StepWork(k124M, o)) - fused, 12 * 2 * (3 * NC - NC) * 2);
  o = base;
  o.gelu_fusion = 1;  // the GEMM writes the GELU too (+4NC) instead of a kernel reading and writing it (-8NC)
  EXPECT_DOUBLE_EQ(fused - total(GPT2StepWork(k124M, o)), 12 * 4 * NC * 2);
}

TEST(StepWork, OptimizerAndDtype) {
  const double P = static_cast<double>(ParameterLayout(k124M).total());
  const auto bf16 = GPT2StepWork(k124M, {.batch = 1, .seq = 64, .elem_bytes = 2});
  const auto fp32 = GPT2StepWork(k124M, {.batch = 1, .seq = 64, .elem_bytes = 4});
  EXPECT_DOUBLE_EQ(Find(bf16, "adamw")->bytes, 2 * P + 24 * P + 2 * P);  // + the bf16 working copy
  EXPECT_DOUBLE_EQ(Find(fp32, "adamw")->bytes, 4 * P + 24 * P);
  EXPECT_DOUBLE_EQ(Find(bf16, "grad norm")->bytes, 2 * P);
  EXPECT_DOUBLE_EQ(Find(fp32, "zero grads")->bytes, 4 * P);
  EXPECT_EQ(Find(bf16, "tokens to device")->bytes, 0.0);  // host copies are not device-memory work
}

TEST(StepWork, GemmAttentionCountsFullProductsAndProbabilities) {
  StepWorkOptions o{.batch = 2, .seq = 128, .elem_bytes = 2};
  const auto flash = GPT2StepWork(k124M, o);
  o.gemm_attention = true;
  const auto gemm = GPT2StepWork(k124M, o);
  EXPECT_GT(Find(gemm, "attention fwd")->flops, Find(flash, "attention fwd")->flops);
  EXPECT_GT(Find(gemm, "attention bwd")->bytes, Find(flash, "attention bwd")->bytes + 12.0 * 2 * 12 * 128 * 128 * 2);
}

TEST(StepWork, RooflineIsTheSlowerCeiling) {
  const PieceWork compute{"x", 2e12, 1e9};  // 2 ms at 1 PFLOP/s, 0.5 ms at 2 TB/s
  EXPECT_DOUBLE_EQ(RooflineMs(compute, 1e15, 2e12), 2.0);
  const PieceWork memory{"y", 0, 4e9};
  EXPECT_DOUBLE_EQ(RooflineMs(memory, 1e15, 2e12), 2.0);
}

}  // namespace
}  // namespace tf
