// Helpers for the CUDA-vs-CPU kernel tests (*_cuda_test.cpp): skip without a GPU, host<->device
// copies with fp32<->bf16 conversion, NaN-poisoned device outputs, and the comparison rule.
//
// Tolerances (STYLE.md rule 1): fp32 kernels must match the CPU backend to a relative error far
// under 1e-3 (they run the same math:: formulas; differences come from summation order and
// fast-math intrinsics); bf16 storage rounds every stored value to 8 bits of mantissa (relative
// up to 2^-8 = 3.9e-3 per rounding), so bf16 results must stay under 1e-2 relative. NaN never passes.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "base/float16.h"
#include "kernels/cuda_runtime.h"

namespace tf::test {

#define TF_SKIP_WITHOUT_GPU()                                          \
  do {                                                                 \
    if (::tf::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

using ::tf::Bf16ToFloat;
using ::tf::FloatToBf16;
// Rounds through bf16 (what the device sees when inputs are stored in bf16).
inline std::vector<float> RoundBf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = Bf16ToFloat(FloatToBf16(v[i]));
  return r;
}

// A device copy of host floats stored as `dt`.
class DeviceArray {
 public:
  DeviceArray(const std::vector<float>& host, cuda::DType dt) : dt_(dt), n_(host.size()) {
    auto b = cuda::DeviceBuffer::Allocate(n_ * cuda::DTypeSize(dt));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    buf_ = std::move(*b);
    Upload(host);
  }
  // n elements filled with NaN: any element the kernel fails to write shows up.
  static DeviceArray Poisoned(size_t n, cuda::DType dt) { return DeviceArray(std::vector<float>(n, NAN), dt); }

  void Upload(const std::vector<float>& host) {
    if (dt_ == cuda::DType::kF32) {
      EXPECT_EQ(cudaMemcpy(buf_.data(), host.data(), n_ * 4, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      std::vector<uint16_t> h(n_);
      for (size_t i = 0; i < n_; ++i) h[i] = FloatToBf16(host[i]);
      EXPECT_EQ(cudaMemcpy(buf_.data(), h.data(), n_ * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<float> Download() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> out(n_);
    if (dt_ == cuda::DType::kF32) {
      EXPECT_EQ(cudaMemcpy(out.data(), buf_.data(), n_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::vector<uint16_t> h(n_);
      EXPECT_EQ(cudaMemcpy(h.data(), buf_.data(), n_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n_; ++i) out[i] = Bf16ToFloat(h[i]);
    }
    return out;
  }
  void* data() const { return buf_.data(); }
  size_t size() const { return n_; }

 private:
  cuda::DType dt_;
  size_t n_;
  cuda::DeviceBuffer buf_;
};

inline std::vector<float> RandomVector(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// |got - want| <= rtol * (|want| + rms(want)): relative to the value, with the tensor's RMS as a
// floor so that entries that cancel to ~0 are judged against their neighbours' scale.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double ss = 0;
  for (float w : want) ss += double(w) * w;
  const double rms = want.empty() ? 0 : std::sqrt(ss / want.size());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double bound = rtol * (std::fabs(want[i]) + rms);
    if (!(err <= bound)) {  // NaN fails
      if (bad++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
    }
    worst = std::max(worst, err / (std::fabs(want[i]) + rms + 1e-30));
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " out of tolerance; worst relative " << worst;
}

// The bf16 rule for attention (whose probabilities P and dS are rounded to bf16 before their second
// product): normwise relative error ||got - want|| / ||want|| under 1e-2, and every element within
// ExpectClose(elem_rtol). Roundings independent per term keep the normwise error ~3e-3, while single
// entries whose sum cancels (small dQ/dK) reach a few 1e-2 of the RMS-floored bound; layout or
// masking bugs (errors of O(1)) fail both. fp32 uses ExpectClose(fp32_rtol) per element.
inline void ExpectAttentionClose(const std::vector<float>& got, const std::vector<float>& want, bool bf16,
                                 double fp32_rtol, double elem_rtol, const std::string& what) {
  if (!bf16) {
    ExpectClose(got, want, fp32_rtol, what);
    return;
  }
  ASSERT_EQ(got.size(), want.size()) << what;
  double se = 0, ss = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = double(got[i]) - want[i];
    se += e * e;
    ss += double(want[i]) * want[i];
  }
  const double normwise = std::sqrt(se / std::max(ss, 1e-300));
  EXPECT_LE(normwise, 1e-2) << what << ": normwise relative error";  // NaN fails
  ExpectClose(got, want, elem_rtol, what);
}

inline double Tolerance(cuda::DType dt) { return dt == cuda::DType::kF32 ? 1e-5 : 1e-2; }

// log sum_{s<=t} exp(q_t . k_s / sqrt(hs)), (B,NH,T), in float64.
inline std::vector<float> ReferenceLse(const std::vector<float>& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<float> lse(size_t(B) * NH * T);
  std::vector<double> s(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv.data() + (size_t(b) * T + t) * 3 * C + size_t(h) * hs;
        double mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          const float* k = qkv.data() + (size_t(b) * T + u) * 3 * C + C + size_t(h) * hs;
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += double(q[d]) * k[d];
          s[size_t(u)] = dot * scale;
          mx = std::max(mx, s[size_t(u)]);
        }
        double sum = 0;
        for (int u = 0; u <= t; ++u) sum += std::exp(s[size_t(u)] - mx);
        lse[(size_t(b) * NH + h) * T + t] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
  return lse;
}

// An attention test shape: batch, sequence, channels, heads (head size C / NH).
struct AttentionShape {
  int B, T, C, NH;
};
inline std::string Name(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " NH=" + std::to_string(s.NH) + " hs=" + std::to_string(s.C / s.NH);
}

}  // namespace tf::test
