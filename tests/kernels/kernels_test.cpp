// Tests for the CPU kernels (kernels/*.h): every entry point, forward and backward, against the naive
// float64 reference in tests/kernels/reference.h, on fixed-seed random inputs of several shapes
// (odd sizes included: C not a multiple of 16, T = 1, T = 7, NH = 3, padded vocabularies).
//
// What is checked besides the values:
//  * outputs that must be fully written are poisoned with NaN first (NaN never passes AllClose);
//  * += contracts (encoder/layernorm/matmul backward, accumulate) start from random gradients, so
//    an overwrite instead of an add fails;
//  * AdamW against numbers computed by hand, the determinism promises (bit-identical with 1 and 2
//    OpenMP threads), and the dloss = 0 / padded-vocabulary modes of the classifier.
// Tolerances: see ref::ReductionRtol (reference.h) for the error model; each test says which
// reduction lengths feed its outputs. Finite-difference checks live in kernels_gradcheck_test.cpp.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/math.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "tests/kernels/reference.h"

namespace tf {
namespace {

using ref::AllClose;
using ref::kFloatEps;
using ref::ReductionRtol;
using ref::Rms;

constexpr double kU = kFloatEps / 2;  // unit roundoff of fp32, 2^-24

// prefill + delta in double: the expected value of a += contract.
std::vector<double> Plus(const std::vector<float>& prefill, const std::vector<double>& delta) {
  std::vector<double> r(prefill.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<double>(prefill[i]) + delta[i];
  return r;
}

// Elements [begin, begin+len) of each of the rows of width `width` (e.g. the q third of qkv).
template <typename T>
std::vector<T> Columns(const std::vector<T>& v, long width, long begin, long len) {
  std::vector<T> r;
  for (size_t row = 0; row * width < v.size(); ++row)
    for (long j = 0; j < len; ++j) r.push_back(v[row * width + begin + j]);
  return r;
}

// ---- Encoder ------------------------------------------------------------------------------------

struct EncoderShape {
  int B, T, C, V, maxT;
};
// V small relative to B*T so tokens repeat and dwte rows receive several contributions.
const EncoderShape kEncoderShapes[] = {{1, 1, 1, 1, 1}, {2, 7, 13, 5, 9}, {3, 16, 48, 11, 16}, {4, 64, 100, 50, 80}};

TEST(EncoderTest, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for (const auto& s : kEncoderShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
    auto wte = ref::Normal(rng, static_cast<size_t>(s.V) * s.C);
    auto wpe = ref::Normal(rng, static_cast<size_t>(s.maxT) * s.C);
    auto inp = ref::Tokens(rng, static_cast<size_t>(s.B) * s.T, s.V);
    auto out = ref::NaNs(static_cast<size_t>(s.B) * s.T * s.C);
    cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    std::vector<double> want(out.size());
    ref::encoder_forward(want.data(), inp.data(), ref::ToDouble(wte).data(), ref::ToDouble(wpe).data(), s.B, s.T, s.C);
    // One fp32 addition of two floats: correctly rounded, |err| <= u |ref|; one ulp (2u) allowed
    // so that exact ties are not decided by the check's own double arithmetic.
    EXPECT_TRUE(AllClose(out, want, 0.0, kFloatEps));
  }
}

TEST(EncoderTest, BackwardAccumulatesAndMatchesReference) {
  std::mt19937 rng(2);
  for (const auto& s : kEncoderShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
    auto dout = ref::Normal(rng, static_cast<size_t>(s.B) * s.T * s.C);
    auto inp = ref::Tokens(rng, static_cast<size_t>(s.B) * s.T, s.V);
    auto dwte = ref::Normal(rng, static_cast<size_t>(s.V) * s.C);  // += contract: start non-zero
    auto dwpe = ref::Normal(rng, static_cast<size_t>(s.maxT) * s.C);
    const auto dwte0 = dwte, dwpe0 = dwpe;
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), s.B, s.T, s.C);
    std::vector<double> ddwte(dwte.size()), ddwpe(dwpe.size());
    ref::encoder_backward(ddwte.data(), ddwpe.data(), ref::ToDouble(dout).data(), inp.data(), s.B, s.T, s.C);
    // dwte rows sum up to B*T+1 terms (prefill included), dwpe rows B+1.
    const double rt_wte = ReductionRtol(static_cast<long>(s.B) * s.T + 1), rt_wpe = ReductionRtol(s.B + 1);
    EXPECT_TRUE(AllClose(dwte, Plus(dwte0, ddwte), rt_wte * Rms(ddwte), rt_wte));
    EXPECT_TRUE(AllClose(dwpe, Plus(dwpe0, ddwpe), rt_wpe * Rms(ddwpe), rt_wpe));
    // Positions t >= T are not touched at all.
    EXPECT_EQ(0, std::memcmp(dwpe.data() + static_cast<long>(s.T) * s.C, dwpe0.data() + static_cast<long>(s.T) * s.C,
                             sizeof(float) * (s.maxT - s.T) * s.C));
  }
}

// ---- LayerNorm ----------------------------------------------------------------------------------

struct LnShape {
  int N, C;
};
const LnShape kLnShapes[] = {{1, 1}, {1, 3}, {5, 17}, {7, 100}, {64, 768}, {3, 1001}};

struct LnInputs {
  std::vector<float> inp, weight, bias;
};
LnInputs MakeLnInputs(std::mt19937& rng, const LnShape& s) {
  // A non-zero mean (0.5) and spread (1.5) exercise the centring; weights around 1 as after init.
  return {ref::Normal(rng, static_cast<size_t>(s.N) * s.C, 0.5f, 1.5f), ref::Normal(rng, s.C, 1.0f, 0.3f),
          ref::Normal(rng, s.C, 0.0f, 0.2f)};
}

TEST(LayerNormTest, ForwardMatchesReference) {
  std::mt19937 rng(3);
  for (const auto& s : kLnShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto in = MakeLnInputs(rng, s);
    auto out = ref::NaNs(in.inp.size());
    auto mean = ref::NaNs(s.N), rstd = ref::NaNs(s.N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), in.inp.data(), in.weight.data(), in.bias.data(), s.N,
                           s.C);
    std::vector<double> want(out.size()), want_mean(s.N), want_rstd(s.N);
    ref::layernorm_forward(want.data(), want_mean.data(), want_rstd.data(), ref::ToDouble(in.inp).data(),
                           ref::ToDouble(in.weight).data(), ref::ToDouble(in.bias).data(), s.N, s.C);
    // mean: one length-C reduction; rstd: a second one on top of it; out: both (x3 for the
    // element-wise chain (x-m)*s*w+b). Near-zero means are judged against the input scale.
    const double rt = ReductionRtol(s.C);
    EXPECT_TRUE(AllClose(mean, want_mean, rt * Rms(ref::ToDouble(in.inp)), rt));
    EXPECT_TRUE(AllClose(rstd, want_rstd, 0.0, 2 * rt));
    EXPECT_TRUE(AllClose(out, want, 3 * rt * Rms(want), 3 * rt));
  }
}

TEST(LayerNormTest, BackwardAccumulatesAndMatchesReference) {
  std::mt19937 rng(4);
  for (const auto& s : kLnShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto in = MakeLnInputs(rng, s);
    std::vector<float> out(in.inp.size()), mean(s.N), rstd(s.N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), in.inp.data(), in.weight.data(), in.bias.data(), s.N,
                           s.C);
    const auto dout = ref::Normal(rng, in.inp.size());
    auto dinp = ref::Normal(rng, in.inp.size()), dweight = ref::Normal(rng, s.C), dbias = ref::Normal(rng, s.C);
    const auto dinp0 = dinp, dweight0 = dweight, dbias0 = dbias;
    cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), in.inp.data(), in.weight.data(),
                            mean.data(), rstd.data(), s.N, s.C);
    std::vector<double> ddinp(dinp.size()), ddweight(s.C), ddbias(s.C);
    ref::layernorm_backward(ddinp.data(), ddweight.data(), ddbias.data(), ref::ToDouble(dout).data(),
                            ref::ToDouble(in.inp).data(), ref::ToDouble(in.weight).data(), s.N, s.C);
    // dinp: the saved statistics (2 length-C reductions) and two more length-C reductions
    // (mean of g, mean of g*xhat) -> 4x. dinp_c = s (g_c - mean(g) - xhat_c mean(g xhat)) can
    // cancel to ~0 (exactly 0 for C = 1), so its absolute slack is scaled by the terms that
    // cancel, rms(s * g), not by the result (the kernel's FMA-contracted g_c - mean(g) leaves
    // s * (rounding of g_c) behind, e.g. 5e-6 at C = 1, s = 316). dweight: a length-N sum of
    // xhat*dy, where xhat carries the statistics' error; dbias: a plain length-N sum.
    std::vector<double> sg(dinp.size());
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c)
        sg[static_cast<long>(i) * s.C + c] =
            static_cast<double>(rstd[i]) * in.weight[c] * dout[static_cast<long>(i) * s.C + c];
    const double rt_c = ReductionRtol(s.C), rt_n = ReductionRtol(s.N + 1);
    EXPECT_TRUE(AllClose(dinp, Plus(dinp0, ddinp), 4 * rt_c * Rms(sg), 4 * rt_c));
    EXPECT_TRUE(AllClose(dweight, Plus(dweight0, ddweight), (rt_n + 3 * rt_c) * Rms(ddweight), rt_n + 3 * rt_c));
    EXPECT_TRUE(AllClose(dbias, Plus(dbias0, ddbias), rt_n * Rms(ddbias), rt_n));
  }
}

// ---- Matmul -------------------------------------------------------------------------------------

struct MatmulShape {
  int N, C, OC;
};
const MatmulShape kMatmulShapes[] = {{1, 1, 1}, {3, 5, 7}, {7, 37, 53}, {33, 64, 96}, {32, 768, 3072}, {17, 3072, 768}};

TEST(MatmulTest, ForwardMatchesReferenceWithAndWithoutBias) {
  std::mt19937 rng(5);
  for (const auto& s : kMatmulShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      const auto inp = ref::Normal(rng, static_cast<size_t>(s.N) * s.C);
      const auto weight = ref::Normal(rng, static_cast<size_t>(s.OC) * s.C, 0.0f, 0.1f);
      const auto bias = ref::Normal(rng, s.OC);
      auto out = ref::NaNs(static_cast<size_t>(s.N) * s.OC);
      cpu::matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, s.N, s.C, s.OC);
      std::vector<double> want(out.size());
      const auto bias_d = ref::ToDouble(bias);
      ref::matmul_forward(want.data(), ref::ToDouble(inp).data(), ref::ToDouble(weight).data(),
                          with_bias ? bias_d.data() : nullptr, s.N, s.C, s.OC);
      // Dot products of length C, plus the bias add.
      const double rt = ReductionRtol(s.C + 1);
      EXPECT_TRUE(AllClose(out, want, rt * Rms(want), rt));
    }
  }
}

TEST(MatmulTest, BackwardAccumulatesAndMatchesReference) {
  std::mt19937 rng(6);
  for (const auto& s : kMatmulShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const auto inp = ref::Normal(rng, static_cast<size_t>(s.N) * s.C);
    const auto weight = ref::Normal(rng, static_cast<size_t>(s.OC) * s.C, 0.0f, 0.1f);
    const auto dout = ref::Normal(rng, static_cast<size_t>(s.N) * s.OC);
    auto dinp = ref::Normal(rng, inp.size()), dweight = ref::Normal(rng, weight.size()), dbias = ref::Normal(rng, s.OC);
    const auto dinp0 = dinp, dweight0 = dweight, dbias0 = dbias;
    cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), s.N, s.C,
                         s.OC);
    std::vector<double> ddinp(dinp.size()), ddweight(dweight.size()), ddbias(s.OC);
    ref::matmul_backward(ddinp.data(), ddweight.data(), ddbias.data(), ref::ToDouble(dout).data(),
                         ref::ToDouble(inp).data(), ref::ToDouble(weight).data(), s.N, s.C, s.OC);
    // dinp: length-OC dot products; dweight and dbias: length-N sums (+1 for the prefill).
    const double rt_oc = ReductionRtol(s.OC + 1), rt_n = ReductionRtol(s.N + 1);
    EXPECT_TRUE(AllClose(dinp, Plus(dinp0, ddinp), rt_oc * Rms(ddinp), rt_oc));
    EXPECT_TRUE(AllClose(dweight, Plus(dweight0, ddweight), rt_n * Rms(ddweight), rt_n));
    EXPECT_TRUE(AllClose(dbias, Plus(dbias0, ddbias), rt_n * Rms(ddbias), rt_n));

    // dinp = dbias = null: only dweight is produced (and still accumulated).
    std::vector<float> dweight2 = dweight0;
    cpu::matmul_backward(nullptr, dweight2.data(), nullptr, dout.data(), inp.data(), weight.data(), s.N, s.C, s.OC);
    EXPECT_TRUE(AllClose(dweight2, Plus(dweight0, ddweight), rt_n * Rms(ddweight), rt_n));
  }
}

// ---- Attention ----------------------------------------------------------------------------------

struct AttShape {
  int B, T, C, NH;
};
// hs = C/NH: 4, 4, 16, 16, 48, 2; T = 1 and 7 and a T not a power of two.
const AttShape kAttShapes[] = {{1, 1, 8, 2},   {2, 7, 12, 3},  {1, 16, 48, 3},
                               {2, 33, 64, 4}, {1, 64, 96, 2}, {3, 5, 6, 3}};

// Error budget for attention outputs, relative to their RMS: the scores are length-hs dot products,
// and an absolute score error d changes exp(score) by a relative d; with |scores| up to ~4 here
// (unit-normal q, k scaled by 1/sqrt(hs)) that is 4*ReductionRtol(hs) absolute. The softmax sum
// (length T) and the P v product (length T) add one ReductionRtol(T) each.
double AttentionRtol(const AttShape& s) { return 4 * ReductionRtol(s.C / s.NH) + 2 * ReductionRtol(s.T); }

TEST(AttentionTest, ForwardMatchesReference) {
  std::mt19937 rng(7);
  for (const auto& s : kAttShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const auto qkv = ref::Normal(rng, static_cast<size_t>(s.B) * s.T * 3 * s.C);
    auto out = ref::NaNs(static_cast<size_t>(s.B) * s.T * s.C);
    auto att = ref::NaNs(static_cast<size_t>(s.B) * s.NH * s.T * s.T);  // upper triangle must be written too
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    std::vector<double> want(out.size()), want_att(att.size());
    ref::attention_forward(want.data(), want_att.data(), ref::ToDouble(qkv).data(), s.B, s.T, s.C, s.NH);
    const double rt = AttentionRtol(s);
    // Probabilities: the P v product is not in their error; absolute floor relative to their
    // typical size 1/T.
    EXPECT_TRUE(AllClose(att, want_att, rt / s.T, rt));
    EXPECT_TRUE(AllClose(out, want, rt * Rms(want), rt));
    for (long bh = 0; bh < static_cast<long>(s.B) * s.NH; ++bh)
      for (int t = 0; t < s.T; ++t)
        for (int u = t + 1; u < s.T; ++u) ASSERT_EQ(att[(bh * s.T + t) * s.T + u], 0.0f) << "t=" << t << " u=" << u;
  }
}

TEST(AttentionTest, BackwardOverwritesAndMatchesReference) {
  std::mt19937 rng(8);
  for (const auto& s : kAttShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const auto qkv = ref::Normal(rng, static_cast<size_t>(s.B) * s.T * 3 * s.C);
    std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C), att(static_cast<size_t>(s.B) * s.NH * s.T * s.T);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    const auto dout = ref::Normal(rng, out.size());
    auto dqkv = ref::NaNs(qkv.size());  // overwritten, not accumulated: every element must be written
    std::vector<float> scratch(static_cast<size_t>(cpu::attention_scratch_floats(s.T)));
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH, scratch.data(),
                            static_cast<long>(scratch.size()));
    std::vector<double> want(dqkv.size());
    ref::attention_backward(want.data(), ref::ToDouble(dout).data(), ref::ToDouble(qkv).data(), s.B, s.T, s.C, s.NH);
    // On top of the forward's error in P: dP (length hs), the row dot P.dP (length T) and the
    // final products (length T) -> 2x the forward budget. dq, dk and dv have different scales, so
    // each third is judged against its own RMS.
    const double rt = 2 * AttentionRtol(s);
    const long C3 = 3L * s.C;
    for (int part = 0; part < 3; ++part) {
      const char* const kPartNames[] = {"dq", "dk", "dv"};
      SCOPED_TRACE(kPartNames[part]);
      const auto got = Columns(dqkv, C3, static_cast<long>(part) * s.C, s.C);
      const auto exp = Columns(want, C3, static_cast<long>(part) * s.C, s.C);
      EXPECT_TRUE(AllClose(got, exp, rt * Rms(exp), rt));
    }
  }
}

// ---- Element-wise -------------------------------------------------------------------------------

const long kElementwiseSizes[] = {1, 7, 1000, (1 << 16) + 3};

// Inputs over [-6, 6] plus edge points: zero and far tails (where tanh rounds to +-1).
std::vector<float> GeluInputs(std::mt19937& rng, long n) {
  auto x = ref::Uniform(rng, static_cast<size_t>(n), -6.0f, 6.0f);
  const float edges[] = {0.0f, -0.0f, 1e-20f, -1e-3f, 10.0f, -10.0f, 30.0f, -30.0f};
  for (size_t i = 0; i < std::size(edges) && i < x.size(); ++i) x[i] = edges[i];
  return x;
}

// gelu = 0.5 x (1 + tanh(u)). tanhf is accurate to ~2 ulp (<= 2.4e-7 absolute) and the float
// argument u carries a relative rounding of ~3u, which moves tanh by at most |u| sech^2(u) * 3u
// <= 0.45 * 1.8e-7. So 1 + tanh is off by <= ~3.2e-7 absolute (large *relative* error for x << 0,
// where 1 + tanh cancels), times 0.5|x| <= 3 here: 1e-6 absolute; 4 ulp relative for the products.
constexpr double kGeluAtol = 3e-6, kGeluRtol = 4 * kFloatEps;
// gelu' adds 0.5 x sech^2(u) u': 1 - tanh^2 is off by ~2.4e-7 absolute and the factor
// 0.5|x| k (1 + 0.134 x^2) is <= ~7 where sech^2 is not already below float resolution, plus the
// dout multiply: ~2e-6; x3 margin.
constexpr double kGeluGradAtol = 6e-6, kGeluGradRtol = 8 * kFloatEps;

TEST(GeluTest, ForwardMatchesReference) {
  std::mt19937 rng(9);
  for (long n : kElementwiseSizes) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = GeluInputs(rng, n);
    auto out = ref::NaNs(x.size());
    cpu::gelu_forward(out.data(), x.data(), n);
    std::vector<double> want(x.size());
    for (long i = 0; i < n; ++i) want[i] = ref::gelu(x[i]);
    EXPECT_TRUE(AllClose(out, want, kGeluAtol, kGeluRtol));
  }
}

TEST(GeluTest, BackwardMatchesReferenceAndMayAliasDout) {
  std::mt19937 rng(10);
  for (long n : kElementwiseSizes) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = GeluInputs(rng, n);
    const auto dout = ref::Uniform(rng, x.size(), -2.0f, 2.0f);
    std::vector<double> want(x.size());
    for (long i = 0; i < n; ++i) want[i] = ref::gelu_grad(x[i]) * dout[i];
    auto dinp = ref::NaNs(x.size());
    cpu::gelu_backward(dinp.data(), x.data(), dout.data(), n);
    EXPECT_TRUE(AllClose(dinp, want, 2 * kGeluGradAtol, kGeluGradRtol));  // x2: |dout| <= 2
    // dinp aliasing dout gives the same result.
    auto inplace = dout;
    cpu::gelu_backward(inplace.data(), x.data(), inplace.data(), n);
    EXPECT_EQ(0, std::memcmp(inplace.data(), dinp.data(), sizeof(float) * n));
  }
}

TEST(ResidualTest, ForwardAndAccumulateAreCorrectlyRounded) {
  std::mt19937 rng(11);
  for (long n : kElementwiseSizes) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto a = ref::Normal(rng, static_cast<size_t>(n)), b = ref::Normal(rng, static_cast<size_t>(n));
    std::vector<double> want(static_cast<size_t>(n));
    for (long i = 0; i < n; ++i) want[i] = static_cast<double>(a[i]) + b[i];  // exact in double
    // A single fp32 addition: correctly rounded, |err| <= u |exact|; we allow one ulp (2u) so
    // that a tie case (err == u |exact| exactly, which does occur) is not decided by the last bit
    // of the double arithmetic in the check.
    auto out = ref::NaNs(static_cast<size_t>(n));
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    EXPECT_TRUE(AllClose(out, want, 0.0, kFloatEps));
    auto acc = a;
    cpu::accumulate(acc.data(), b.data(), n);
    EXPECT_TRUE(AllClose(acc, want, 0.0, kFloatEps));
    EXPECT_EQ(0, std::memcmp(acc.data(), out.data(), sizeof(float) * n));
  }
}

// ---- Classifier ---------------------------------------------------------------------------------

struct CeShape {
  int N, V, Vp;
};
const CeShape kCeShapes[] = {{1, 1, 1}, {3, 5, 8}, {7, 37, 48}, {4, 1000, 1024}, {2, 50257, 50304}};

// Logits (N,Vp): N(0, 2) in the real columns, NaN in the padding (which must never be read).
std::vector<float> Logits(std::mt19937& rng, const CeShape& s) {
  auto z = ref::Normal(rng, static_cast<size_t>(s.N) * s.Vp, 0.0f, 2.0f);
  for (int i = 0; i < s.N; ++i)
    for (int j = s.V; j < s.Vp; ++j) z[static_cast<long>(i) * s.Vp + j] = std::numeric_limits<float>::quiet_NaN();
  return z;
}

TEST(CrossEntropyTest, LossAndGradientMatchReference) {
  std::mt19937 rng(12);
  for (const auto& s : kCeShapes) {
    for (float dloss : {1.0f / s.N, -0.37f}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss);
      auto logits = Logits(rng, s);
      const auto targets = ref::Tokens(rng, s.N, s.V);
      std::vector<double> want_loss(s.N), want_grad(logits.size());
      ref::crossentropy_forward_backward(want_loss.data(), want_grad.data(), ref::ToDouble(logits).data(),
                                         targets.data(), s.N, s.V, s.Vp, dloss);
      auto losses = ref::NaNs(s.N);
      cpu::crossentropy_forward_backward(logits.data(), losses.data(), targets.data(), s.N, s.V, s.Vp, dloss);
      // log_z = max + log(sum of V exps): the sum has relative error ~ReductionRtol(V) plus the
      // exps' own (ulp-level, and u*|z - max| from the float argument, |z - max| <= ~20): that is
      // the absolute error of log_z, hence of the loss; 4 ulp relative for the final roundings.
      const double rt_v = ReductionRtol(s.V) + 20 * kU;
      EXPECT_TRUE(AllClose(losses, want_loss, 2 * rt_v, 4 * kFloatEps));
      // Gradient p_j * dloss - [j == t] dloss: relative error rt_v on p_j (plus the 1/sum and the
      // dloss multiply); the target entry also carries the rounding of "-= dloss", u |dloss|,
      // and cancels when p_t ~ 1, so it gets rt_v |dloss| of absolute slack. Padding must be 0.
      std::vector<double> atol(logits.size(), 0.0);
      for (int i = 0; i < s.N; ++i) atol[static_cast<long>(i) * s.Vp + targets[i]] = 2 * rt_v * std::fabs(dloss);
      EXPECT_TRUE(
          AllClose(logits.data(), want_grad.data(), static_cast<long>(logits.size()), 0.0, 2 * rt_v, atol.data()));
    }
  }
}

TEST(CrossEntropyTest, ZeroDlossComputesLossOnlyAndLeavesLogitsUntouched) {
  std::mt19937 rng(13);
  for (const auto& s : kCeShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    auto logits = Logits(rng, s);
    const auto before = logits;
    const auto targets = ref::Tokens(rng, s.N, s.V);
    std::vector<double> want_loss(s.N);
    ref::crossentropy_forward_backward(want_loss.data(), nullptr, ref::ToDouble(logits).data(), targets.data(), s.N,
                                       s.V, s.Vp, 0.0);
    auto losses = ref::NaNs(s.N);
    cpu::crossentropy_forward_backward(logits.data(), losses.data(), targets.data(), s.N, s.V, s.Vp, 0.0f);
    EXPECT_TRUE(AllClose(losses, want_loss, 2 * (ReductionRtol(s.V) + 20 * kU), 4 * kFloatEps));
    EXPECT_EQ(0, std::memcmp(logits.data(), before.data(), sizeof(float) * logits.size()));  // NaN bits included
  }
}

TEST(SoftmaxRowsTest, MatchesReferenceAtSeveralTemperatures) {
  std::mt19937 rng(14);
  for (const auto& s : kCeShapes) {
    for (float temperature : {1.0f, 0.7f, 2.5f}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " temp=" << temperature);
      const auto logits = Logits(rng, s);
      auto probs = ref::NaNs(static_cast<size_t>(s.N) * s.V);
      cpu::softmax_rows(probs.data(), logits.data(), s.N, s.V, s.Vp, temperature);
      std::vector<double> want(probs.size());
      ref::softmax_rows(want.data(), ref::ToDouble(logits).data(), s.N, s.V, s.Vp, temperature);
      // The kernel sums in double, so the error is in each exp: its ulp-level error plus the
      // rounding of its float argument z/T - max (|.| <= ~30 for N(0,2) logits at T = 0.7),
      // u * 30 relative; then the normalisation. No absolute part: every p_j is relative-accurate.
      EXPECT_TRUE(AllClose(probs, want, 0.0, 4 * kFloatEps + 30 * kU));
      // Rows sum to 1.
      for (int i = 0; i < s.N; ++i) {
        double sum = 0.0;
        for (int j = 0; j < s.V; ++j) sum += probs[static_cast<long>(i) * s.V + j];
        EXPECT_NEAR(sum, 1.0, 1e-5);
      }
    }
  }
}

// ---- Optimizer ----------------------------------------------------------------------------------

TEST(SumSquaresTest, MatchesLongDoubleReference) {
  std::mt19937 rng(15);
  // Around the kernel's 16384-element blocks, and several blocks.
  for (long n : {0L, 1L, 17L, 16384L, 16385L, 100003L}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto g = ref::Normal(rng, static_cast<size_t>(n), 0.0f, 3.0f);
    const double got = cpu::sum_squares(g.data(), n);
    const long double want = ref::sum_squares(g.data(), n);
    // Each float square is exact in double; summing n positive terms in double has relative
    // error <= (n-1) u_double < n * DBL_EPSILON.
    EXPECT_LE(std::fabs(got - static_cast<double>(want)),
              static_cast<double>(n) * std::numeric_limits<double>::epsilon() * static_cast<double>(want));
    EXPECT_TRUE(std::isfinite(got));
  }
  EXPECT_EQ(cpu::sum_squares(nullptr, 0), 0.0);
}

math::AdamWParams Hyper(float lr, float b1, float b2, float eps, float wd, int t) {
  return {lr, b1, b2, eps, wd, 1.0f - std::pow(b1, static_cast<float>(t)), 1.0f - std::pow(b2, static_cast<float>(t))};
}

TEST(AdamWTest, MatchesHandComputedSteps) {
  // p = 1, m = v = 0; lr = 0.1, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1.
  // The gradient is stored as 2x and passed with grad_scale = 0.5 (so grad_scale is exercised).
  // Step 1, g = 0.5:  p = 1 - 0.1*0.1*1 = 0.99;  m = 0.1*0.5 = 0.05;  v = 0.001*0.25 = 0.00025;
  //   bc1 = 0.1, bc2 = 0.001: m/bc1 = 0.5, sqrt(v/bc2) = 0.5, step = 0.1 * 0.5/0.5 = 0.1 -> p = 0.89.
  // Step 2, g = 0.5:  p = 0.89 - 0.01*0.89 = 0.8811;  m = 0.045 + 0.05 = 0.095;
  //   v = 0.999*0.00025 + 0.00025 = 0.00049975;  bc1 = 0.19, bc2 = 0.001999:
  //   m/bc1 = 0.5, v/bc2 = 0.25 -> step 0.1 -> p = 0.7811.
  // Step 3, g = -1:   p = 0.7811 - 0.007811 = 0.773289;  m = 0.0855 - 0.1 = -0.0145;
  //   v = 0.999*0.00049975 + 0.001 = 0.00149925025;  bc1 = 0.271, bc2 = 0.002997001:
  //   m/bc1 = -0.0535055351, v/bc2 = 0.5002501668, sqrt = 0.7072836..., step = -0.0075649...
  //   -> p = 0.7808539 (the eps = 1e-8 in the denominator moves p by ~1e-9 only).
  const float grads_x2[] = {1.0f, 1.0f, -2.0f};
  const float want_p[] = {0.89f, 0.7811f, 0.7808539f};
  const float want_m[] = {0.05f, 0.095f, -0.0145f};
  const float want_v[] = {0.00025f, 0.00049975f, 0.00149925025f};
  float p = 1.0f, m = 0.0f, v = 0.0f;
  for (int t = 1; t <= 3; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    cpu::adamw_step(&p, &m, &v, &grads_x2[t - 1], 1, 0.5f, Hyper(0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, t));
    // The hyper-parameters are floats: 0.999f = 0.99900001287, so 1 - beta2 (exact in fp32) is
    // 0.00099998713, 1.3e-5 relative below 0.001, and v carries that offset: 2e-5 relative for v.
    // In p it cancels (v and bias_correction2 share it; exactly so at constant g): p only sees
    // a handful of fp32 roundings on O(1) values and the 7 significant digits of the hand values.
    EXPECT_NEAR(p, want_p[t - 1], 1e-6);
    EXPECT_NEAR(m, want_m[t - 1], 1e-6 * std::fabs(want_m[t - 1]));
    EXPECT_NEAR(v, want_v[t - 1], 2e-5 * want_v[t - 1]);
  }
}

TEST(AdamWTest, MatchesDoubleReferenceOverSeveralSteps) {
  std::mt19937 rng(16);
  const long n = 1003;
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, grad_scale = 0.25f;
  for (float wd : {0.0f, 0.1f}) {
    SCOPED_TRACE(testing::Message() << "wd=" << wd);
    auto p = ref::Normal(rng, n, 0.0f, 0.02f);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    std::vector<double> pd = ref::ToDouble(p), md(n, 0.0), vd(n, 0.0);
    for (int t = 1; t <= 3; ++t) {
      const auto g = ref::Normal(rng, n);
      const auto h = Hyper(lr, b1, b2, eps, wd, t);
      cpu::adamw_step(p.data(), m.data(), v.data(), g.data(), n, grad_scale, h);
      // The reference takes the same (float) hyper-parameters and bias corrections, so only the
      // update's own roundings differ: ~10 fp32 operations, each <= u relative.
      for (long i = 0; i < n; ++i)
        ref::adamw(pd[i], md[i], vd[i], static_cast<double>(g[i]) * grad_scale, lr, b1, b2, eps, wd, h.bias_correction1,
                   h.bias_correction2);
    }
    // The update is lr * O(1) per step; |p| ~ 0.02: judge p against the step size too.
    EXPECT_TRUE(AllClose(p, pd, 1e-5 * lr, 16 * kFloatEps));
    EXPECT_TRUE(AllClose(m, md, 1e-6 * Rms(md), 16 * kFloatEps));
    EXPECT_TRUE(AllClose(v, vd, 1e-6 * Rms(vd), 16 * kFloatEps));
  }
}

// The clip factor (shared by the CPU optimizer and the GPU AdamW kernel): torch's clip_grad_norm_.
TEST(AdamWTest, GradClipScale) {
  EXPECT_EQ(math::grad_clip_scale(0.5, 1.0), 1.0f);    // under the threshold: untouched
  EXPECT_EQ(math::grad_clip_scale(1.0, 1.0), 1.0f);    // at it: untouched (strictly greater clips)
  EXPECT_EQ(math::grad_clip_scale(100.0, 0.0), 1.0f);  // clip 0 disables
  EXPECT_EQ(math::grad_clip_scale(100.0, -1.0), 1.0f);
  EXPECT_FLOAT_EQ(math::grad_clip_scale(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  // After scaling, the norm is the threshold (to the 1e-6 guard).
  EXPECT_NEAR(123.0 * math::grad_clip_scale(123.0, 0.5), 0.5, 1e-6);
}

// ---- Determinism: results do not depend on the OpenMP thread count --------------------------------

class ThreadCount {  // Sets omp_set_num_threads for a scope and restores the previous value.
 public:
  explicit ThreadCount(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

TEST(DeterminismTest, BitIdenticalWithOneAndTwoThreads) {
  std::mt19937 rng(17);
  // Several channel chunks (16 for the encoder, 32 for layernorm) and sum_squares blocks (16384).
  const int B = 4, T = 64, C = 100, V = 20, N = B * T;
  const auto dout = ref::Normal(rng, static_cast<size_t>(N) * C);
  const auto inp_tok = ref::Tokens(rng, N, V);
  const auto x = ref::Normal(rng, static_cast<size_t>(N) * C, 0.5f, 1.5f);
  const auto w = ref::Normal(rng, C, 1.0f, 0.3f), bias = ref::Normal(rng, C);
  const auto g = ref::Normal(rng, 100003);
  std::vector<float> mean(N), rstd(N), out(static_cast<size_t>(N) * C);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);

  struct Result {
    std::vector<float> dwte, dwpe, dinp, dw, db;
    double ss;
  };
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    EXPECT_EQ(omp_get_max_threads(), threads);
    Result r{std::vector<float>(static_cast<size_t>(V) * C, 0.25f),
             std::vector<float>(static_cast<size_t>(T) * C),
             std::vector<float>(static_cast<size_t>(N) * C),
             std::vector<float>(C),
             std::vector<float>(C),
             0.0};
    cpu::encoder_backward(r.dwte.data(), r.dwpe.data(), dout.data(), inp_tok.data(), B, T, C);
    cpu::layernorm_backward(r.dinp.data(), r.dw.data(), r.db.data(), dout.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    r.ss = cpu::sum_squares(g.data(), static_cast<long>(g.size()));
    return r;
  };
  const Result one = run(1), two = run(2);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
  };
  EXPECT_TRUE(same(one.dwte, two.dwte));
  EXPECT_TRUE(same(one.dwpe, two.dwpe));
  EXPECT_TRUE(same(one.dinp, two.dinp));
  EXPECT_TRUE(same(one.dw, two.dw));
  EXPECT_TRUE(same(one.db, two.db));
  EXPECT_EQ(std::memcmp(&one.ss, &two.ss, sizeof(double)), 0) << one.ss << " vs " << two.ss;
}

}  // namespace
}  // namespace tf
