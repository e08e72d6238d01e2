// CUDA linear layers (kernels/matmul.cu) against the CPU backend (kernels/matmul.cpp), in fp32 and
// bf16, through both GEMM paths of a CublasContext: cuBLASLt with fused bias / GELU / residual /
// DGELU epilogues, and classic cuBLAS with separate epilogue kernels.
// Tolerances (|got - want| <= rtol (|want| + rms(want)), test::ExpectClose):
//  * fp32 GEMMs, 1e-4: summation order only (~sqrt(K) 2^-24 ~ 3e-6 at K = 3072; the worst case
//    K 2^-24 = 2e-4 needs every rounding to go one way): a 30x margin that still catches TF32 (10
//    mantissa bits, errors of a few 1e-4).
//  * bf16, 1e-2: every stored value rounded to 8 mantissa bits (2^-9 = 2e-3), fp32 accumulation;
//    the CPU reference gets the same bf16-rounded inputs.
//  * Fused GELU output (fp32), 2e-3: cuBLASLt's own GELU; erf vs tanh GELU differ by ~5e-4 on O(1)
//    activations. Fused DGELU (fp32), 5e-3: the derivative forms differ by up to 8.7e-4, times
//    |dout W| up to ~4.
// NaN never passes; outputs are NaN-poisoned so that an unwritten element fails.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/matmul.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using cuda::DType;
using test::DeviceArray;

struct Shape {
  int N, C, OC;
};
std::string Name(const Shape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC);
}

// Odd shapes (no dimension a multiple of anything), OC % 8 == 0 shapes (the fused GELU epilogue),
// the GPT-2 124M layer shapes at small N (K up to 3072), and long N (several dbias slices, and the
// 64-slice cap with OC narrower than one 32-channel tile).
const std::vector<Shape> kShapes = {{3, 37, 5},       {1, 1, 1},        {7, 64, 40},    {64, 768, 2304},
                                    {128, 3072, 768}, {33, 768, 3072},  {1500, 48, 24}, {40000, 8, 3}};

double GemmTol(DType dt) { return dt == DType::kF32 ? 1e-4 : 1e-2; }
double FusedGeluTol(DType dt) { return dt == DType::kF32 ? 2e-3 : 1e-2; }
// The derivative forms differ more: max |erf-GELU'(x) - tanh-GELU'(x)| ~ 8.7e-4, times |dout W| up to ~4.
double FusedDgeluTol(DType dt) { return dt == DType::kF32 ? 5e-3 : 1e-2; }

// Inputs scaled so that every output is O(1): x ~ N(0,1), w ~ N(0, 1/C), bias ~ N(0, 1/4).
std::vector<float> Random(size_t n, float scale, uint32_t seed, DType dt) {
  auto v = test::RandomVector(n, scale, seed);
  return dt == DType::kBF16 ? test::RoundBf16(v) : v;  // the device sees exactly these values
}

std::optional<cuda::CublasContext> MakeContext(bool use_lt) {
  cuda::CublasContext::Options options;
  options.use_lt_epilogues = use_lt;
  auto ctx = cuda::CublasContext::Create(nullptr, options);
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  if (!ctx.ok()) return std::nullopt;
  return std::move(ctx).value();
}

class MatmulCuda : public ::testing::TestWithParam<std::tuple<DType, bool>> {
 protected:
  DType dt() const { return std::get<0>(GetParam()); }
  bool use_lt() const { return std::get<1>(GetParam()); }
};

TEST_P(MatmulCuda, ForwardMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  for (const Shape& s : kShapes) {
    for (bool with_bias : {true, false}) {
      const std::string what = "forward " + Name(s) + (with_bias ? " bias" : " no bias");
      const auto inp = Random(size_t(s.N) * s.C, 1.0f, 1, dt());
      const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 2, dt());
      const auto b = Random(s.OC, 0.5f, 3, dt());
      std::vector<float> want(size_t(s.N) * s.OC);
      cpu::matmul_forward(want.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.N, s.C, s.OC);

      DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_b(b, dt());
      auto out = DeviceArray::Poisoned(want.size(), dt());
      Status st = cuda::matmul_forward(*ctx, out.data(), d_inp.data(), d_w.data(), with_bias ? d_b.data() : nullptr,
                                       s.N, s.C, s.OC, dt());
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
      test::ExpectClose(out.Download(), want, GemmTol(dt()), what);
    }
  }
}

// out = gelu(x W^T + b) with pre_gelu = x W^T + b, against cpu::matmul_forward + cpu::gelu_forward.
TEST_P(MatmulCuda, GeluFusedForwardMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  for (const Shape& s : kShapes) {
    for (bool with_bias : {true, false}) {
      const std::string what = "gelu forward " + Name(s) + (with_bias ? " bias" : " no bias");
      const size_t n = size_t(s.N) * s.OC;
      const auto inp = Random(size_t(s.N) * s.C, 1.0f, 4, dt());
      const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 5, dt());
      const auto b = Random(s.OC, 0.5f, 6, dt());
      std::vector<float> want_pre(n), want_out(n);
      cpu::matmul_forward(want_pre.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.N, s.C, s.OC);
      cpu::gelu_forward(want_out.data(), want_pre.data(), long(n));

      DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_b(b, dt());
      auto out = DeviceArray::Poisoned(n, dt()), pre = DeviceArray::Poisoned(n, dt());
      const auto before = ctx->stats();
      Status st = cuda::matmul_forward(*ctx, out.data(), d_inp.data(), d_w.data(), with_bias ? d_b.data() : nullptr,
                                       s.N, s.C, s.OC, dt(), pre.data());
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
      const auto got_pre = pre.Download(), got_out = out.Download();
      test::ExpectClose(got_pre, want_pre, GemmTol(dt()), what + " pre_gelu");
      const bool fused_expected = use_lt() && s.OC % 8 == 0;
      test::ExpectClose(got_out, want_out, fused_expected ? FusedGeluTol(dt()) : GemmTol(dt()), what + " out");

      const auto& after = ctx->stats();
      const bool fused = after.lt_gemms > before.lt_gemms && after.lt_fallbacks == before.lt_fallbacks;
      // llm.c runs this epilogue in bf16 at these shapes; in fp32 it is only reported.
      if (fused_expected && dt() == DType::kBF16) {
        EXPECT_TRUE(fused) << what << ": cuBLASLt fell back to unfused";
      }
      if (fused && s.N * s.OC >= 1000) {
        // Which GELU does cuBLASLt compute? Measured against its own pre_gelu (no GEMM difference).
        double dev_tanh = 0, dev_erf = 0;
        for (size_t i = 0; i < n; ++i) {
          const double x = got_pre[i];
          dev_tanh = std::max(dev_tanh, std::fabs(got_out[i] - double(math::gelu(got_pre[i]))));
          dev_erf = std::max(dev_erf, std::fabs(got_out[i] - 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)))));
        }
        std::printf("[cuBLASLt GELU, %s, %s] max |out - tanh-GELU(pre)| = %.3g, max |out - erf-GELU(pre)| = %.3g\n",
                    cuda::DTypeName(dt()), what.c_str(), dev_tanh, dev_erf);
      }
    }
  }
}

// dinp, dweight, dbias accumulate (+=) into pre-filled gradients, like the CPU; null dinp / dbias.
TEST_P(MatmulCuda, BackwardAccumulatesLikeCpu) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool with_dinp = variant != 1, with_dbias = variant != 2;
      const std::string what = "backward " + Name(s) + (with_dinp ? "" : " no dinp") + (with_dbias ? "" : " no dbias");
      const auto inp = Random(size_t(s.N) * s.C, 1.0f, 7, dt());
      const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 8, dt());
      const auto dout = Random(size_t(s.N) * s.OC, 1.0f, 9, dt());
      // Pre-filled gradients on the scale of what is added to them.
      auto dinp = Random(size_t(s.N) * s.C, 1.0f, 10, dt());
      auto dweight = Random(size_t(s.OC) * s.C, std::sqrt(float(s.N)), 11, dt());
      auto dbias = Random(s.OC, std::sqrt(float(s.N)), 12, dt());

      DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_dout(dout, dt());
      DeviceArray d_dinp(dinp, dt()), d_dweight(dweight, dt()), d_dbias(dbias, dt());
      // Scratch poisoned too: every partial the reduction reads must have been written.
      DeviceArray scratch = DeviceArray::Poisoned(cuda::matmul_dbias_scratch_floats(s.N, s.OC), DType::kF32);
      float* scratch_ptr = with_dbias ? static_cast<float*>(scratch.data()) : nullptr;
      Status st = cuda::matmul_backward(*ctx, with_dinp ? d_dinp.data() : nullptr, d_dweight.data(),
                                        with_dbias ? d_dbias.data() : nullptr, d_dout.data(), d_inp.data(), d_w.data(),
                                        s.N, s.C, s.OC, dt(), scratch_ptr);
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();

      cpu::matmul_backward(with_dinp ? dinp.data() : nullptr, dweight.data(), with_dbias ? dbias.data() : nullptr,
                           dout.data(), inp.data(), w.data(), s.N, s.C, s.OC);
      if (with_dinp) test::ExpectClose(d_dinp.Download(), dinp, GemmTol(dt()), what + " dinp");
      test::ExpectClose(d_dweight.Download(), dweight, GemmTol(dt()), what + " dweight");
      // Untouched when null: still the pre-filled values, which the CPU left alone too.
      test::ExpectClose(d_dbias.Download(), dbias, GemmTol(dt()), what + " dbias");
    }
  }
}

// Same inputs, same gradients, bit for bit (the dbias reduction's order depends only on N).
TEST_P(MatmulCuda, BackwardIsDeterministic) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  const Shape s{4096, 768, 3072};
  const auto inp = Random(size_t(s.N) * s.C, 1.0f, 13, dt());
  const auto w = Random(size_t(s.OC) * s.C, 0.03f, 14, dt());
  const auto dout = Random(size_t(s.N) * s.OC, 1.0f, 15, dt());
  DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_dout(dout, dt());
  DeviceArray scratch = DeviceArray::Poisoned(cuda::matmul_dbias_scratch_floats(s.N, s.OC), DType::kF32);
  std::vector<float> first[3];
  for (int run = 0; run < 2; ++run) {
    DeviceArray dinp(std::vector<float>(size_t(s.N) * s.C, 0.0f), dt());
    DeviceArray dweight(std::vector<float>(size_t(s.OC) * s.C, 0.0f), dt());
    DeviceArray dbias(std::vector<float>(s.OC, 0.0f), dt());
    Status st = cuda::matmul_backward(*ctx, dinp.data(), dweight.data(), dbias.data(), d_dout.data(), d_inp.data(),
                                      d_w.data(), s.N, s.C, s.OC, dt(), static_cast<float*>(scratch.data()));
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<float> got[3] = {dinp.Download(), dweight.Download(), dbias.Download()};
    if (run == 0) {
      for (int i = 0; i < 3; ++i) first[i] = got[i];
    } else {
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(got[i] == first[i]) << "gradient " << i << " differs between runs";
    }
  }
}

// out = x W^T + b + residual (the residual folded into the GEMM), out of place and in place.
TEST_P(MatmulCuda, ResidualFusedForwardMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  for (const Shape& s : kShapes) {
    for (bool in_place : {false, true}) {
      const std::string what = "residual forward " + Name(s) + (in_place ? " in place" : " out of place");
      const size_t n = size_t(s.N) * s.OC;
      const auto inp = Random(size_t(s.N) * s.C, 1.0f, 21, dt());
      const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 22, dt());
      const auto b = Random(s.OC, 0.5f, 23, dt());
      const auto res = Random(n, 1.0f, 24, dt());
      std::vector<float> want(n);
      cpu::matmul_forward(want.data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC);
      for (size_t i = 0; i < n; ++i) want[i] += res[i];

      DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_b(b, dt()), d_res(res, dt());
      auto out = in_place ? DeviceArray(res, dt()) : DeviceArray::Poisoned(n, dt());
      Status st = cuda::matmul_forward(*ctx, out.data(), d_inp.data(), d_w.data(), d_b.data(), s.N, s.C, s.OC, dt(),
                                       nullptr, in_place ? out.data() : d_res.data());
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
      test::ExpectClose(out.Download(), want, GemmTol(dt()), what);
      if (!in_place) test::ExpectClose(d_res.Download(), res, 0.0, what + " (residual untouched)");
    }
  }
}

// accumulate_dinp = false: dinp is overwritten (poisoned before), dweight/dbias still accumulate.
TEST_P(MatmulCuda, BackwardOverwritesDinpWhenAsked) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  for (const Shape& s : kShapes) {
    const std::string what = "backward overwrite " + Name(s);
    const auto inp = Random(size_t(s.N) * s.C, 1.0f, 25, dt());
    const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 26, dt());
    const auto dout = Random(size_t(s.N) * s.OC, 1.0f, 27, dt());
    auto dweight = Random(size_t(s.OC) * s.C, std::sqrt(float(s.N)), 28, dt());
    auto dbias = Random(s.OC, std::sqrt(float(s.N)), 29, dt());
    DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_dout(dout, dt()), d_dweight(dweight, dt()), d_dbias(dbias, dt());
    auto d_dinp = DeviceArray::Poisoned(size_t(s.N) * s.C, dt());
    DeviceArray scratch = DeviceArray::Poisoned(cuda::matmul_dbias_scratch_floats(s.N, s.OC), DType::kF32);
    cuda::MatmulBackwardOptions o;
    o.accumulate_dinp = false;
    Status st = cuda::matmul_backward(*ctx, d_dinp.data(), d_dweight.data(), d_dbias.data(), d_dout.data(),
                                      d_inp.data(), d_w.data(), s.N, s.C, s.OC, dt(),
                                      static_cast<float*>(scratch.data()), o);
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    std::vector<float> dinp(size_t(s.N) * s.C, 0.0f);
    cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), w.data(), s.N, s.C,
                         s.OC);
    test::ExpectClose(d_dinp.Download(), dinp, GemmTol(dt()), what + " dinp");
    test::ExpectClose(d_dweight.Download(), dweight, GemmTol(dt()), what + " dweight");
    test::ExpectClose(d_dbias.Download(), dbias, GemmTol(dt()), what + " dbias");
  }
}

// dgelu_pre: dinp = (dout W) * gelu'(pre), against cpu::matmul_backward + cpu::gelu_backward.
TEST_P(MatmulCuda, DgeluFusedBackwardMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  for (const Shape& s : kShapes) {
    const std::string what = "dgelu backward " + Name(s);
    const size_t nin = size_t(s.N) * s.C;
    const auto inp = Random(nin, 1.0f, 30, dt());  // the layer input, gelu(pre)
    const auto pre = Random(nin, 1.5f, 31, dt());
    const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 32, dt());
    const auto dout = Random(size_t(s.N) * s.OC, 1.0f, 33, dt());
    auto dweight = Random(size_t(s.OC) * s.C, std::sqrt(float(s.N)), 34, dt());
    DeviceArray d_inp(inp, dt()), d_pre(pre, dt()), d_w(w, dt()), d_dout(dout, dt()), d_dweight(dweight, dt());
    auto d_dinp = DeviceArray::Poisoned(nin, dt());
    cuda::MatmulBackwardOptions o;
    o.accumulate_dinp = false;
    o.dgelu_pre = d_pre.data();
    const auto before = ctx->stats();
    Status st = cuda::matmul_backward(*ctx, d_dinp.data(), d_dweight.data(), nullptr, d_dout.data(), d_inp.data(),
                                      d_w.data(), s.N, s.C, s.OC, dt(), nullptr, o);
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    std::vector<float> dgelu_out(nin, 0.0f), want(nin);
    cpu::matmul_backward(dgelu_out.data(), dweight.data(), nullptr, dout.data(), inp.data(), w.data(), s.N, s.C, s.OC);
    cpu::gelu_backward(want.data(), pre.data(), dgelu_out.data(), long(nin));
    const bool fused_expected = use_lt() && s.C % 8 == 0;
    const auto got = d_dinp.Download();
    test::ExpectClose(got, want, fused_expected ? FusedDgeluTol(dt()) : GemmTol(dt()), what + " dinp");
    test::ExpectClose(d_dweight.Download(), dweight, GemmTol(dt()), what + " dweight");
    const auto& after = ctx->stats();
    if (fused_expected && after.lt_fallbacks == before.lt_fallbacks && nin >= 1000) {
      double max_err = 0;
      for (size_t i = 0; i < nin; ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
      std::printf("[cuBLASLt DGELU, %s, %s] max |dinp - (dout W) gelu_grad(pre)| = %.3g\n", cuda::DTypeName(dt()),
                  what.c_str(), max_err);
    }
  }
}

// cuBLASLt's heuristic is asked once per GEMM configuration; repeated calls reuse the cached
// algorithm and give bit-identical results.
TEST_P(MatmulCuda, HeuristicAskedOncePerConfiguration) {
  TF_SKIP_WITHOUT_GPU();
  if (!use_lt()) GTEST_SKIP() << "classic path: no heuristic";
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  const Shape s{256, 768, 2304};
  const auto inp = Random(size_t(s.N) * s.C, 1.0f, 40, dt());
  const auto w = Random(size_t(s.OC) * s.C, 1.0f / std::sqrt(float(s.C)), 41, dt());
  const auto b = Random(s.OC, 0.5f, 42, dt());
  DeviceArray d_inp(inp, dt()), d_w(w, dt()), d_b(b, dt());
  auto out1 = DeviceArray::Poisoned(size_t(s.N) * s.OC, dt()), out2 = DeviceArray::Poisoned(size_t(s.N) * s.OC, dt());
  const long q0 = ctx->stats().lt_heuristic_queries;
  ASSERT_TRUE(cuda::matmul_forward(*ctx, out1.data(), d_inp.data(), d_w.data(), d_b.data(), s.N, s.C, s.OC, dt()).ok());
  const long q1 = ctx->stats().lt_heuristic_queries;
  EXPECT_GE(q1, q0 + 1);  // (+2 if the bias epilogue fell back to a plain cuBLASLt GEMM)
  ASSERT_TRUE(cuda::matmul_forward(*ctx, out2.data(), d_inp.data(), d_w.data(), d_b.data(), s.N, s.C, s.OC, dt()).ok());
  EXPECT_EQ(ctx->stats().lt_heuristic_queries, q1) << "the same configuration asked the heuristic again";
  EXPECT_TRUE(out1.Download() == out2.Download());
  // A pointer of another alignment class is another configuration: asked once, then cached too.
  DeviceArray d_inp_off(std::vector<float>(size_t(s.N) * s.C + 8, 0.5f), dt());
  const size_t elem = cuda::DTypeSize(dt());
  const void* shifted = static_cast<const char*>(d_inp_off.data()) + elem;  // 2 or 4 bytes off
  ASSERT_TRUE(cuda::matmul_forward(*ctx, out2.data(), shifted, d_w.data(), nullptr, s.N, s.C, s.OC, dt()).ok());
  const long q2 = ctx->stats().lt_heuristic_queries;
  EXPECT_GT(q2, q1);
  ASSERT_TRUE(cuda::matmul_forward(*ctx, out2.data(), shifted, d_w.data(), nullptr, s.N, s.C, s.OC, dt()).ok());
  EXPECT_EQ(ctx->stats().lt_heuristic_queries, q2);
}

TEST_P(MatmulCuda, RejectsBadArguments) {
  TF_SKIP_WITHOUT_GPU();
  auto ctx = MakeContext(use_lt());
  ASSERT_TRUE(ctx.has_value());
  DeviceArray a(std::vector<float>(64, 1.0f), dt()), b(std::vector<float>(64, 1.0f), dt()),
      c(std::vector<float>(64, 1.0f), dt());
  auto code = [](const Status& st) { return st.code(); };
  EXPECT_EQ(code(cuda::matmul_forward(*ctx, a.data(), b.data(), b.data(), nullptr, -1, 4, 4, dt())),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::matmul_forward(*ctx, a.data(), b.data(), b.data(), nullptr, 4, 0, 4, dt())),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::matmul_forward(*ctx, a.data(), b.data(), nullptr, nullptr, 4, 4, 4, dt())),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cuda::matmul_forward(*ctx, a.data(), b.data(), b.data(), nullptr, 4, 4, 4, dt(), a.data())),
            StatusCode::kInvalidArgument);  // pre_gelu aliasing out
  EXPECT_EQ(code(cuda::matmul_backward(*ctx, nullptr, a.data(), a.data(), b.data(), b.data(), b.data(), 4, 4, 4, dt(),
                                       nullptr)),
            StatusCode::kInvalidArgument);  // dbias without scratch
  EXPECT_EQ(code(cuda::matmul_backward(*ctx, a.data(), a.data(), nullptr, b.data(), b.data(), nullptr, 4, 4, 4, dt(),
                                       nullptr)),
            StatusCode::kInvalidArgument);  // dinp without weight
  cuda::MatmulBackwardOptions dgelu;  // DGELU needs an overwritten, separate dinp
  dgelu.dgelu_pre = b.data();
  EXPECT_EQ(code(cuda::matmul_backward(*ctx, a.data(), a.data(), nullptr, b.data(), b.data(), b.data(), 4, 4, 4, dt(),
                                       nullptr, dgelu)),
            StatusCode::kInvalidArgument);  // accumulate_dinp still true
  dgelu.accumulate_dinp = false;
  EXPECT_EQ(code(cuda::matmul_backward(*ctx, nullptr, a.data(), nullptr, b.data(), b.data(), b.data(), 4, 4, 4, dt(),
                                       nullptr, dgelu)),
            StatusCode::kInvalidArgument);  // no dinp
  EXPECT_EQ(code(cuda::matmul_forward(*ctx, a.data(), b.data(), b.data(), nullptr, 4, 4, 4, dt(), c.data(), b.data())),
            StatusCode::kInvalidArgument);  // residual with the fused GELU
  // N = 0 is a no-op, not an error.
  EXPECT_TRUE(cuda::matmul_forward(*ctx, a.data(), b.data(), b.data(), nullptr, 0, 4, 4, dt()).ok());
}

INSTANTIATE_TEST_SUITE_P(DTypesAndPaths, MatmulCuda,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(cuda::DTypeName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_cublaslt" : "_classic");
                         });

// Runs without a GPU: creating a context fails with a Status (no abort), and the dbias scratch
// stays bounded (at most 64 partial rows).
TEST(CublasContextNoGpu, CreateFailsCleanly) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  auto ctx = cuda::CublasContext::Create(nullptr);
  EXPECT_FALSE(ctx.ok());
}

TEST(MatmulCudaScratch, DbiasScratchIsBounded) {
  EXPECT_EQ(cuda::matmul_dbias_scratch_floats(1, 5), 5);
  EXPECT_EQ(cuda::matmul_dbias_scratch_floats(512, 768), 768);
  EXPECT_EQ(cuda::matmul_dbias_scratch_floats(16384, 768), 32 * 768);
  EXPECT_EQ(cuda::matmul_dbias_scratch_floats(1 << 24, 768), 64 * 768);
}

}  // namespace
}  // namespace tf
