// Naive float64 reference implementations of the CPU kernels (kernels/*.h), for the tests.
//
// Written plainly from the math, loop by loop, in double, sharing no code with kernels/ (not even
// kernels/math.h): a bug in a shared formula must show up as a mismatch, not cancel out.
// Backward passes are derived analytically here (each function states the derivation) and are
// themselves checked against central finite differences of the forward references in
// kernels_gradcheck_test.cpp.
//
// Conventions: same shapes and argument order as the kernel they mirror, row-major, shapes in
// comments. Outputs of forward functions are overwritten; backward functions accumulate (+=) into
// their gradient outputs exactly like the kernels whose contract is +=, and overwrite where the
// kernel overwrites (attention). No state; thread-compatible.
//
// The second half of this header holds the comparison helpers the tests share (tolerance check,
// random fills): |got - ref| <= atol + rtol * |ref|, written so that NaN never passes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tf::ref {

// ---- Encoder ------------------------------------------------------------------------------------

// out (B,T,C) = wte[inp] + wpe[t].
inline void encoder_forward(double* out, const int32_t* inp, const double* wte, const double* wpe, int B, int T,
                            int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(static_cast<long>(b) * T + t) * C + c] =
            wte[static_cast<long>(inp[b * T + t]) * C + c] + wpe[static_cast<long>(t) * C + c];
}

// out is linear in wte and wpe with coefficient 1: dwte[tok] += dout, dwpe[t] += dout.
inline void encoder_backward(double* dwte, double* dwpe, const double* dout, const int32_t* inp, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const double d = dout[(static_cast<long>(b) * T + t) * C + c];
        dwte[static_cast<long>(inp[b * T + t]) * C + c] += d;
        dwpe[static_cast<long>(t) * C + c] += d;
      }
}

// ---- LayerNorm ----------------------------------------------------------------------------------

inline constexpr double kLayerNormEps = 1e-5;  // GPT-2's epsilon (same value as math::kLayerNormEps).

// out (N,C) = (x - mu) * rstd * w + b, rstd = 1/sqrt(var + eps), biased variance. mean, rstd (N).
inline void layernorm_forward(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                              const double* bias, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const double* x = inp + static_cast<long>(i) * C;
    double mu = 0.0;
    for (int c = 0; c < C; ++c) mu += x[c];
    mu /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - mu) * (x[c] - mu);
    var /= C;
    const double s = 1.0 / std::sqrt(var + kLayerNormEps);
    for (int c = 0; c < C; ++c) out[static_cast<long>(i) * C + c] = (x[c] - mu) * s * weight[c] + bias[c];
    if (mean != nullptr) mean[i] = mu;
    if (rstd != nullptr) rstd[i] = s;
  }
}

// Accumulates (+=). With xhat = (x - mu) s and g = w * dy (the gradient w.r.t. xhat):
//   d mu/dx_j = 1/C,  d s/dx_j = -s^3 (x_j - mu)/C = -s^2 xhat_j / C (the mu-term sums to 0),
//   d xhat_c/dx_j = s (delta_cj - 1/C) - xhat_c s xhat_j / C, so
//   dx_j = s (g_j - mean_c(g_c) - xhat_j mean_c(g_c xhat_c)),
//   dw_c = sum_rows xhat_c dy_c,  db_c = sum_rows dy_c.
// mean/rstd are recomputed here from inp (not taken from the kernel's forward).
inline void layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                               const double* weight, int N, int C) {
  std::vector<double> xhat(static_cast<size_t>(C));
  for (int i = 0; i < N; ++i) {
    const double* x = inp + static_cast<long>(i) * C;
    const double* dy = dout + static_cast<long>(i) * C;
    double mu = 0.0;
    for (int c = 0; c < C; ++c) mu += x[c];
    mu /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - mu) * (x[c] - mu);
    var /= C;
    const double s = 1.0 / std::sqrt(var + kLayerNormEps);
    double mean_g = 0.0, mean_gx = 0.0;
    for (int c = 0; c < C; ++c) {
      xhat[c] = (x[c] - mu) * s;
      mean_g += weight[c] * dy[c];
      mean_gx += weight[c] * dy[c] * xhat[c];
    }
    mean_g /= C;
    mean_gx /= C;
    for (int c = 0; c < C; ++c) {
      dinp[static_cast<long>(i) * C + c] += s * (weight[c] * dy[c] - mean_g - xhat[c] * mean_gx);
      dweight[c] += xhat[c] * dy[c];
      dbias[c] += dy[c];
    }
  }
}

// ---- Matmul (nn.Linear) -------------------------------------------------------------------------

// out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC); bias may be null.
inline void matmul_forward(double* out, const double* inp, const double* weight, const double* bias, int N, int C,
                           int OC) {
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      double acc = bias != nullptr ? bias[o] : 0.0;
      for (int c = 0; c < C; ++c) acc += inp[static_cast<long>(i) * C + c] * weight[static_cast<long>(o) * C + c];
      out[static_cast<long>(i) * OC + o] = acc;
    }
}

// Accumulates (+=). out_io = sum_c x_ic w_oc + b_o, so dx_ic = sum_o dy_io w_oc,
// dw_oc = sum_i dy_io x_ic, db_o = sum_i dy_io. dinp, dbias may be null.
inline void matmul_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                            const double* weight, int N, int C, int OC) {
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      const double dy = dout[static_cast<long>(i) * OC + o];
      for (int c = 0; c < C; ++c) {
        if (dinp != nullptr) dinp[static_cast<long>(i) * C + c] += dy * weight[static_cast<long>(o) * C + c];
        dweight[static_cast<long>(o) * C + c] += dy * inp[static_cast<long>(i) * C + c];
      }
      if (dbias != nullptr) dbias[o] += dy;
    }
}

// ---- Causal self-attention ----------------------------------------------------------------------

// qkv (B,T,3C): q at [0,C), k at [C,2C), v at [2C,3C); head h uses columns [h*hs, (h+1)*hs).
// att (B,NH,T,T) = causal softmax(q k^T / sqrt(hs)), zero above the diagonal; out (B,T,C) = att v.
inline void attention_forward(double* out, double* att, const double* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const long C3 = 3L * C;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      double* P = att + (static_cast<long>(b) * NH + h) * T * T;
      for (int t = 0; t < T; ++t) {
        const double* q = qkv + (static_cast<long>(b) * T + t) * C3 + h * hs;
        double maxv = -std::numeric_limits<double>::infinity();
        for (int s = 0; s <= t; ++s) {
          const double* k = qkv + (static_cast<long>(b) * T + s) * C3 + C + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          P[static_cast<long>(t) * T + s] = dot * scale;
          maxv = std::max(maxv, dot * scale);
        }
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) {
          P[static_cast<long>(t) * T + s] = std::exp(P[static_cast<long>(t) * T + s] - maxv);
          sum += P[static_cast<long>(t) * T + s];
        }
        for (int s = 0; s <= t; ++s) P[static_cast<long>(t) * T + s] /= sum;
        for (int s = t + 1; s < T; ++s) P[static_cast<long>(t) * T + s] = 0.0;
        for (int d = 0; d < hs; ++d) {
          double acc = 0.0;
          for (int s = 0; s <= t; ++s)
            acc += P[static_cast<long>(t) * T + s] * qkv[(static_cast<long>(b) * T + s) * C3 + 2L * C + h * hs + d];
          out[(static_cast<long>(b) * T + t) * C + h * hs + d] = acc;
        }
      }
    }
}

// Overwrites dqkv (B,T,3C). Per (b,h), with S = scale q k^T (causal), P = softmax_rows(S), O = P v:
//   dv_s = sum_t P_ts dO_t,            dP_ts = dO_t . v_s,
//   dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts')   (softmax Jacobian diag(p) - p p^T, masked P_ts = 0),
//   dq_t = scale sum_s dS_ts k_s,      dk_s = scale sum_t dS_ts q_t.
// The probabilities are recomputed here in double from qkv.
inline void attention_backward(double* dqkv, const double* dout, const double* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const long C3 = 3L * C;
  std::vector<double> out(static_cast<size_t>(B) * T * C), att(static_cast<size_t>(B) * NH * T * T);
  attention_forward(out.data(), att.data(), qkv, B, T, C, NH);
  std::fill(dqkv, dqkv + static_cast<long>(B) * T * C3, 0.0);
  std::vector<double> dP(static_cast<size_t>(T)), dS(static_cast<size_t>(T));
  auto at = [&](int b, int t, long col) { return (static_cast<long>(b) * T + t) * C3 + col; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const double* P = att.data() + (static_cast<long>(b) * NH + h) * T * T;
      for (int t = 0; t < T; ++t) {
        const double* dO = dout + (static_cast<long>(b) * T + t) * C + h * hs;
        double pdp = 0.0;
        for (int s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += dO[d] * qkv[at(b, s, 2L * C + h * hs + d)];
          dP[s] = dot;
          pdp += P[static_cast<long>(t) * T + s] * dot;
          for (int d = 0; d < hs; ++d) dqkv[at(b, s, 2L * C + h * hs + d)] += P[static_cast<long>(t) * T + s] * dO[d];
        }
        for (int s = 0; s <= t; ++s) dS[s] = P[static_cast<long>(t) * T + s] * (dP[s] - pdp);
        for (int s = 0; s <= t; ++s)
          for (int d = 0; d < hs; ++d) {
            dqkv[at(b, t, h * hs + d)] += scale * dS[s] * qkv[at(b, s, C + h * hs + d)];
            dqkv[at(b, s, C + h * hs + d)] += scale * dS[s] * qkv[at(b, t, h * hs + d)];
          }
      }
    }
}

// ---- Element-wise -------------------------------------------------------------------------------

// GELU, tanh approximation ("gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline double gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
// Product rule with u = k (x + 0.044715 x^3), u' = k (1 + 3 * 0.044715 x^2), tanh' = 1 - tanh^2:
//   gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'.
inline double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// ---- Classifier ---------------------------------------------------------------------------------

// losses[i] = logsumexp(logits[i,:V]) - logits[i,target]; padded columns [V,Vp) are never read.
// If dlogits is not null it receives (N,Vp): (softmax - onehot) * dloss, padded columns 0
// (d(-log p_t)/dz_j = p_j - [j == t]).
inline void crossentropy_forward_backward(double* losses, double* dlogits, const double* logits, const int32_t* targets,
                                          int N, int V, int Vp, double dloss) {
  for (int i = 0; i < N; ++i) {
    const double* z = logits + static_cast<long>(i) * Vp;
    double maxv = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < V; ++j) maxv = std::max(maxv, z[j]);
    double sum = 0.0;
    for (int j = 0; j < V; ++j) sum += std::exp(z[j] - maxv);
    losses[i] = maxv + std::log(sum) - z[targets[i]];
    if (dlogits != nullptr) {
      for (int j = 0; j < Vp; ++j) {
        const double p = j < V ? std::exp(z[j] - maxv) / sum : 0.0;
        dlogits[static_cast<long>(i) * Vp + j] = (p - (j == targets[i] ? 1.0 : 0.0)) * dloss;
      }
    }
  }
}

// probs (N,V) = softmax(logits[:, :V] / temperature).
inline void softmax_rows(double* probs, const double* logits, int N, int V, int Vp, double temperature) {
  for (int i = 0; i < N; ++i) {
    const double* z = logits + static_cast<long>(i) * Vp;
    double maxv = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < V; ++j) maxv = std::max(maxv, z[j] / temperature);
    double sum = 0.0;
    for (int j = 0; j < V; ++j) sum += std::exp(z[j] / temperature - maxv);
    for (int j = 0; j < V; ++j) probs[static_cast<long>(i) * V + j] = std::exp(z[j] / temperature - maxv) / sum;
  }
}

// ---- Optimizer ----------------------------------------------------------------------------------

// Sum of squares in long double (each float square is exact in double; the sum is not).
inline long double sum_squares(const float* g, long n) {
  long double s = 0.0L;
  for (long i = 0; i < n; ++i) s += static_cast<long double>(g[i]) * g[i];
  return s;
}

// torch.optim.AdamW (foreach=False), in double, with the bias corrections bc1 = 1 - b1^t and
// bc2 = 1 - b2^t given by the caller (as the kernel receives them):
//   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
inline void adamw(double& p, double& m, double& v, double g, double lr, double b1, double b2, double eps, double wd,
                  double bc1, double bc2) {
  p -= lr * wd * p;
  m = b1 * m + (1.0 - b1) * g;
  v = b2 * v + (1.0 - b2) * g * g;
  p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
}

// =================================================================================================
// Comparison helpers shared by the kernel tests.
// =================================================================================================

inline constexpr double kFloatEps = std::numeric_limits<float>::epsilon();  // 2^-23 = 1.19e-7 = 2u

// Relative tolerance for an fp32 result that went through a reduction of K terms (plus a few
// element-wise roundings). The rigorous worst case for recursive summation is gamma_K * sum|terms|
// ~ K u sum|terms|, far too loose to catch anything; the rounding errors of round-to-nearest are
// independent with random sign, so the actual error grows like sqrt(K) u times the magnitude of
// the partial sums (Higham, "Accuracy and Stability", 4.2; blocked/FMA GEMMs do better still).
// We allow 4 sqrt(K) eps = 8 sqrt(K) u, floored at 1e-6 for the element-wise part:
//   K = 16 -> 1.9e-6, K = 768 -> 1.3e-5, K = 3072 -> 2.6e-5, K = 50257 -> 1.1e-4.
// Callers scale this by the number of chained reductions and say why.
inline double ReductionRtol(long K) {
  return std::max(1e-6, 4.0 * std::sqrt(static_cast<double>(std::max(K, 1L))) * kFloatEps);
}

// Root-mean-square of ref: the scale of "typical" entries, used as the absolute part of the bound
// so that entries that happen to cancel to ~0 are judged against the size of their neighbours.
inline double Rms(const double* ref, long n) {
  long double s = 0.0L;
  for (long i = 0; i < n; ++i) s += static_cast<long double>(ref[i]) * ref[i];
  return n > 0 ? static_cast<double>(std::sqrt(s / n)) : 0.0;
}
inline double Rms(const std::vector<double>& v) { return Rms(v.data(), static_cast<long>(v.size())); }

// Checks |got[i] - ref[i]| <= atol_i + rtol * |ref[i]| for all i, where atol_i = atol, or
// atol_per[i] when given. Written as !(err <= bound) and with an isfinite test, so a NaN or an
// infinity in got never passes. The failure message gives the count, the first bad element and the
// worst ratio err/bound.
inline ::testing::AssertionResult AllClose(const float* got, const double* ref, long n, double atol, double rtol,
                                           const double* atol_per = nullptr) {
  long bad = 0, first_bad = -1;
  double worst_ratio = 0.0;
  for (long i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double bound = (atol_per != nullptr ? atol_per[i] : atol) + rtol * std::fabs(ref[i]);
    const bool ok = err <= bound && std::isfinite(got[i]);
    if (!ok) {
      ++bad;
      if (first_bad < 0) first_bad = i;
      worst_ratio = std::numeric_limits<double>::infinity();
    } else if (bound > 0) {
      worst_ratio = std::max(worst_ratio, err / bound);
    }
  }
  // Diagnostic for tuning tolerances: TF_PRINT_MARGINS=1 prints every comparison's worst ratio.
  if (std::getenv("TF_PRINT_MARGINS") != nullptr)
    std::printf("  [margin] worst err/bound %.3g (n=%ld)\n", worst_ratio, n);
  if (bad == 0) return ::testing::AssertionSuccess();
  const long w = first_bad;
  return ::testing::AssertionFailure() << bad << " of " << n << " elements out of tolerance (atol "
                                       << (atol_per != nullptr ? atol_per[w] : atol) << ", rtol " << rtol
                                       << "); first at [" << w << "]: got " << got[w] << ", want " << ref[w]
                                       << ", |diff| " << std::fabs(static_cast<double>(got[w]) - ref[w]);
}
inline ::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& ref, double atol,
                                           double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size mismatch: " << got.size() << " vs " << ref.size();
  return AllClose(got.data(), ref.data(), static_cast<long>(got.size()), atol, rtol);
}

// ---- Random inputs (fixed seeds; every test constructs its own generator) -----------------------

inline std::vector<float> Uniform(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
inline std::vector<float> Normal(std::mt19937& rng, size_t n, float mean = 0.0f, float stddev = 1.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
inline std::vector<int32_t> Tokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
inline std::vector<double> ToDouble(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
// Buffer poisoned with quiet NaNs, for outputs that must be fully written.
inline std::vector<float> NaNs(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

}  // namespace tf::ref
