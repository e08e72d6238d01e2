// Finite-difference gradient checks for the backward kernels with non-trivial derivatives:
// layernorm, attention, GELU and the fused cross-entropy. Two checks per op, on tiny shapes (every
// input element perturbed), of the loss L = sum_i W_i out_i with fixed random W (dL/dout = W, a
// dense, non-uniform upstream gradient):
//  1. Reference: float64 central differences of the reference forward (tests/kernels/reference.h)
//     against its analytic backward, validating the derivations kernels_test.cpp holds the float
//     kernels to. h = 1e-5 (truncation ~1e-10, rounding ~1e-11); allowed 1e-7 + 1e-6 relative.
//  2. Kernel: central differences of the float forward kernel (loss summed in double) against the
//     float backward kernel, tying each backward to its own forward. h = 1e-2: truncation
//     ~2e-5 |f'''|, fp32 loss noise ~3e-5 after dividing by 2h; allowed 2e-4 + 2e-3 relative (the
//     worst observed error is under 1/10 of that). A wrong gradient is off by O(0.1..1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "tests/kernels/reference.h"

namespace tf {
namespace {

constexpr double kRefStep = 1e-5, kRefAtol = 1e-7, kRefRtol = 1e-6;
constexpr float kKernelStep = 1e-2f;
constexpr double kKernelAtol = 2e-4, kKernelRtol = 2e-3;

// Central differences of a double function of x, one coordinate at a time.
template <typename Loss>
std::vector<double> NumericGrad(const Loss& loss, std::vector<double> x, double h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// Same for a function of float inputs; the step actually taken is what survives the rounding of
// x +- h to float, so the quotient uses that exact (double) distance.
template <typename Loss>
std::vector<double> NumericGradFloat(const Loss& loss, std::vector<float> x, float h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = x0 + h, xm = x0 - h;
    x[i] = xp;
    const double lp = loss(x);
    x[i] = xm;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
  }
  return g;
}

// Checks a double gradient against a double reference with |a - b| <= atol + rtol |b|.
::testing::AssertionResult GradClose(const std::vector<double>& got, const std::vector<double>& want, double atol,
                                     double rtol) {
  double worst_ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double bound = atol + rtol * std::fabs(want[i]);
    if (!(err <= bound))
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << want[i] << " (|diff| "
                                           << err << ", atol " << atol << ", rtol " << rtol << ")";
    worst_ratio = std::max(worst_ratio, err / bound);
  }
  if (std::getenv("TF_PRINT_MARGINS") != nullptr) std::printf("  [margin] worst err/bound %.3g\n", worst_ratio);
  return ::testing::AssertionSuccess();
}

double Dot(const std::vector<double>& w, const std::vector<double>& out) {
  double s = 0.0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * out[i];
  return s;
}
double Dot(const std::vector<double>& w, const std::vector<float>& out) {
  double s = 0.0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * out[i];
  return s;
}
std::vector<float> ToFloat(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// ---- LayerNorm ----------------------------------------------------------------------------------

struct LnShape {
  int N, C;
};
const LnShape kLnShapes[] = {{3, 5}, {1, 17}, {2, 1}};

TEST(LayerNormGradCheck, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(101);
  for (const auto& s : kLnShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto x = ref::ToDouble(ref::Normal(rng, static_cast<size_t>(s.N) * s.C, 0.5f, 1.5f));
    const auto w = ref::ToDouble(ref::Normal(rng, s.C, 1.0f, 0.3f));
    const auto b = ref::ToDouble(ref::Normal(rng, s.C, 0.0f, 0.2f));
    const auto W = ref::ToDouble(ref::Normal(rng, x.size()));
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww, const std::vector<double>& bb) {
      std::vector<double> out(xx.size());
      ref::layernorm_forward(out.data(), nullptr, nullptr, xx.data(), ww.data(), bb.data(), s.N, s.C);
      return Dot(W, out);
    };
    std::vector<double> dx(x.size()), dw(s.C), db(s.C);
    ref::layernorm_backward(dx.data(), dw.data(), db.data(), W.data(), x.data(), w.data(), s.N, s.C);
    EXPECT_TRUE(
        GradClose(dx, NumericGrad([&](const auto& v) { return loss(v, w, b); }, x, kRefStep), kRefAtol, kRefRtol));
    EXPECT_TRUE(
        GradClose(dw, NumericGrad([&](const auto& v) { return loss(x, v, b); }, w, kRefStep), kRefAtol, kRefRtol));
    EXPECT_TRUE(
        GradClose(db, NumericGrad([&](const auto& v) { return loss(x, w, v); }, b, kRefStep), kRefAtol, kRefRtol));
  }
}

TEST(LayerNormGradCheck, KernelBackwardMatchesFiniteDifferencesOfKernelForward) {
  std::mt19937 rng(102);
  for (const auto& s : kLnShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto x = ref::Normal(rng, static_cast<size_t>(s.N) * s.C, 0.5f, 1.5f);
    const auto w = ref::Normal(rng, s.C, 1.0f, 0.3f);
    const auto b = ref::Normal(rng, s.C, 0.0f, 0.2f);
    const auto W = ref::ToDouble(ref::Normal(rng, x.size()));
    std::vector<float> out(x.size()), mean(s.N), rstd(s.N);
    auto loss = [&](const std::vector<float>& xx, const std::vector<float>& ww, const std::vector<float>& bb) {
      cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), xx.data(), ww.data(), bb.data(), s.N, s.C);
      return Dot(W, out);
    };
    loss(x, w, b);  // mean/rstd of the unperturbed input, for the backward
    const auto Wf = ToFloat(W);
    std::vector<float> dx(x.size(), 0.0f), dw(s.C, 0.0f), db(s.C, 0.0f);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), Wf.data(), x.data(), w.data(), mean.data(), rstd.data(),
                            s.N, s.C);
    EXPECT_TRUE(GradClose(ref::ToDouble(dx),
                          NumericGradFloat([&](const auto& v) { return loss(v, w, b); }, x, kKernelStep), kKernelAtol,
                          kKernelRtol));
    EXPECT_TRUE(GradClose(ref::ToDouble(dw),
                          NumericGradFloat([&](const auto& v) { return loss(x, v, b); }, w, kKernelStep), kKernelAtol,
                          kKernelRtol));
    EXPECT_TRUE(GradClose(ref::ToDouble(db),
                          NumericGradFloat([&](const auto& v) { return loss(x, w, v); }, b, kKernelStep), kKernelAtol,
                          kKernelRtol));
  }
}

// ---- Attention ----------------------------------------------------------------------------------

struct AttShape {
  int B, T, C, NH;
};
const AttShape kAttShapes[] = {{1, 4, 6, 2}, {2, 3, 4, 1}, {1, 5, 6, 3}, {1, 1, 4, 2}};

TEST(AttentionGradCheck, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(103);
  for (const auto& s : kAttShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const auto qkv = ref::ToDouble(ref::Normal(rng, static_cast<size_t>(s.B) * s.T * 3 * s.C));
    const auto W = ref::ToDouble(ref::Normal(rng, static_cast<size_t>(s.B) * s.T * s.C));
    auto loss = [&](const std::vector<double>& v) {
      std::vector<double> out(W.size()), att(static_cast<size_t>(s.B) * s.NH * s.T * s.T);
      ref::attention_forward(out.data(), att.data(), v.data(), s.B, s.T, s.C, s.NH);
      return Dot(W, out);
    };
    std::vector<double> dqkv(qkv.size());
    ref::attention_backward(dqkv.data(), W.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(GradClose(dqkv, NumericGrad(loss, qkv, kRefStep), kRefAtol, kRefRtol));
  }
}

TEST(AttentionGradCheck, KernelBackwardMatchesFiniteDifferencesOfKernelForward) {
  std::mt19937 rng(104);
  for (const auto& s : kAttShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const auto qkv = ref::Normal(rng, static_cast<size_t>(s.B) * s.T * 3 * s.C);
    const auto W = ref::ToDouble(ref::Normal(rng, static_cast<size_t>(s.B) * s.T * s.C));
    std::vector<float> out(W.size()), att(static_cast<size_t>(s.B) * s.NH * s.T * s.T);
    auto loss = [&](const std::vector<float>& v) {
      cpu::attention_forward(out.data(), att.data(), v.data(), s.B, s.T, s.C, s.NH);
      return Dot(W, out);
    };
    loss(qkv);  // att of the unperturbed input, for the backward
    const auto Wf = ToFloat(W);
    std::vector<float> dqkv(qkv.size()), scratch(static_cast<size_t>(cpu::attention_scratch_floats(s.T)));
    cpu::attention_backward(dqkv.data(), Wf.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH, scratch.data(),
                            static_cast<long>(scratch.size()));
    EXPECT_TRUE(GradClose(ref::ToDouble(dqkv), NumericGradFloat(loss, qkv, kKernelStep), kKernelAtol, kKernelRtol));
  }
}

// ---- GELU ---------------------------------------------------------------------------------------

// A grid over [-5, 5] (step 0.25, shifted off the exact grid so no point sits at 0).
std::vector<float> GeluPoints() {
  std::vector<float> x;
  for (int i = -20; i <= 20; ++i) x.push_back(0.25f * static_cast<float>(i) + 0.0371f);
  return x;
}

TEST(GeluGradCheck, ReferenceDerivativeMatchesFiniteDifferences) {
  for (float xf : GeluPoints()) {
    const double x = xf;
    const double fd = (ref::gelu(x + kRefStep) - ref::gelu(x - kRefStep)) / (2 * kRefStep);
    EXPECT_NEAR(ref::gelu_grad(x), fd, kRefAtol + kRefRtol * std::fabs(fd)) << "x=" << x;
  }
}

TEST(GeluGradCheck, KernelBackwardMatchesFiniteDifferencesOfKernelForward) {
  // Element-wise, so all points are perturbed at once.
  const auto x = GeluPoints();
  const long n = static_cast<long>(x.size());
  std::vector<float> xp(x.size()), xm(x.size()), yp(x.size()), ym(x.size()), dx(x.size());
  for (long i = 0; i < n; ++i) xp[i] = x[i] + kKernelStep, xm[i] = x[i] - kKernelStep;
  cpu::gelu_forward(yp.data(), xp.data(), n);
  cpu::gelu_forward(ym.data(), xm.data(), n);
  const std::vector<float> ones(x.size(), 1.0f);
  cpu::gelu_backward(dx.data(), x.data(), ones.data(), n);
  for (long i = 0; i < n; ++i) {
    const double fd = (static_cast<double>(yp[i]) - ym[i]) / (static_cast<double>(xp[i]) - xm[i]);
    EXPECT_NEAR(dx[i], fd, kKernelAtol + kKernelRtol * std::fabs(fd)) << "x=" << x[i];
  }
}

// ---- Cross-entropy ------------------------------------------------------------------------------

struct CeShape {
  int N, V, Vp;
};
// Padded vocabularies included: the padding must get gradient 0 (and the loss must not depend on it).
const CeShape kCeShapes[] = {{3, 7, 8}, {2, 5, 5}, {4, 11, 16}, {1, 1, 4}};

TEST(CrossEntropyGradCheck, ReferenceGradientMatchesFiniteDifferences) {
  std::mt19937 rng(105);
  for (const auto& s : kCeShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const auto z = ref::ToDouble(ref::Normal(rng, static_cast<size_t>(s.N) * s.Vp, 0.0f, 2.0f));
    const auto targets = ref::Tokens(rng, s.N, s.V);
    const double dloss = 1.0 / s.N;  // mean loss over the rows
    auto loss = [&](const std::vector<double>& v) {
      std::vector<double> losses(s.N);
      ref::crossentropy_forward_backward(losses.data(), nullptr, v.data(), targets.data(), s.N, s.V, s.Vp, 0.0);
      double l = 0.0;
      for (double x : losses) l += dloss * x;
      return l;
    };
    std::vector<double> losses(s.N), dz(z.size());
    ref::crossentropy_forward_backward(losses.data(), dz.data(), z.data(), targets.data(), s.N, s.V, s.Vp, dloss);
    EXPECT_TRUE(GradClose(dz, NumericGrad(loss, z, kRefStep), kRefAtol, kRefRtol));
  }
}

TEST(CrossEntropyGradCheck, KernelGradientMatchesFiniteDifferencesOfKernelLoss) {
  std::mt19937 rng(106);
  for (const auto& s : kCeShapes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const auto z = ref::Normal(rng, static_cast<size_t>(s.N) * s.Vp, 0.0f, 2.0f);  // finite padding here
    const auto targets = ref::Tokens(rng, s.N, s.V);
    const float dloss = 1.0f / static_cast<float>(s.N);
    std::vector<float> work(z.size()), losses(s.N);
    // The loss through the kernel's dloss = 0 (forward only) mode, on a copy of the logits.
    auto loss = [&](const std::vector<float>& v) {
      work = v;
      cpu::crossentropy_forward_backward(work.data(), losses.data(), targets.data(), s.N, s.V, s.Vp, 0.0f);
      double l = 0.0;
      for (float x : losses) l += static_cast<double>(dloss) * x;
      return l;
    };
    auto grad = z;  // overwritten in place with the gradient
    cpu::crossentropy_forward_backward(grad.data(), losses.data(), targets.data(), s.N, s.V, s.Vp, dloss);
    const auto fd = NumericGradFloat(loss, z, kKernelStep);
    EXPECT_TRUE(GradClose(ref::ToDouble(grad), fd, kKernelAtol * dloss, kKernelRtol));
    for (int i = 0; i < s.N; ++i)
      for (int j = s.V; j < s.Vp; ++j) {
        EXPECT_EQ(grad[static_cast<long>(i) * s.Vp + j], 0.0f) << "padding i=" << i << " j=" << j;
        EXPECT_EQ(fd[static_cast<long>(i) * s.Vp + j], 0.0) << "loss depends on padding i=" << i << " j=" << j;
      }
  }
}

}  // namespace
}  // namespace tf
