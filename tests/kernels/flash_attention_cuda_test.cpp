// The fused flash attention (kernels/flash_attention.cu) against the CPU attention
// (kernels/attention.cpp) and a float64 log-sum-exp, for fp32 storage (SIMT kernels), bf16 on
// tensor cores (hs 64 and 128; other head sizes take the SIMT kernels) and bf16 forced onto SIMT.
//  * fp32: test::ExpectClose at 1e-4: only summation order (~2e-6 relative) and exp2f vs
//    math::fast_exp (a few ulp) differ; a TF32-like loss would show as ~1e-3.
//  * bf16: normwise relative error < 1e-2 and every element within 2e-2 (forward) / 5e-2
//    (backward) of the RMS-floored bound. Rounding the outputs, P and dS before their second
//    product, and the bf16 O in D = rowsum(dO * O) keeps the normwise error ~3e-3, but cancelling
//    dK/dQ entries reach ~2.5e-2 of the floor; layout or masking bugs (O(1) errors) fail both.
//  * lse: 1e-4 fp32, 1e-3 bf16. Every output (out, lse, dqkv) is NaN-poisoned first.
//  * Shapes: T = 1, 17, 64, 100, 130 (below, at and above a tile), 256, 1024; hs = 64 with 4 and
//    12 heads, hs = 128, and SIMT-only head sizes 16, 32, 80.
// Numerics behind the bounds: docs/cuda.md, "Flash attention".
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::ReferenceLse;

using cuda::DType;
using cuda::FlashImpl;
using test::DeviceArray;

using Shape = test::AttentionShape;
using test::Name;

const std::vector<Shape> kSmallShapes = {
    {2, 1, 256, 4},  {2, 17, 256, 4}, {2, 64, 256, 4},  {2, 100, 768, 12},  // hs 64
    {2, 100, 256, 2}, {1, 130, 512, 4},                                   // hs 128
    {2, 33, 48, 3},  {3, 50, 96, 3},  {1, 40, 240, 3},                    // hs 16, 32, 80 (SIMT only)
};
const std::vector<Shape> kLongShapes = {{2, 256, 768, 12}, {2, 1024, 256, 4}};

struct Variant {
  DType dt;
  FlashImpl impl;
  const char* name;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }
const Variant kVariants[] = {{DType::kF32, FlashImpl::kAuto, "fp32"},
                             {DType::kBF16, FlashImpl::kAuto, "bf16"},
                             {DType::kBF16, FlashImpl::kSimt, "bf16_simt"}};

double LseTol(DType dt) { return dt == DType::kF32 ? 1e-4 : 1e-3; }

// The rule above: fp32 per element at 1e-4; bf16 normwise under 1e-2 and per element under bf16_elem.
void ExpectMatches(const std::vector<float>& got, const std::vector<float>& want, DType dt, double bf16_elem,
                   const std::string& what) {
  test::ExpectAttentionClose(got, want, dt == DType::kBF16, 1e-4, bf16_elem, what);
}

std::vector<float> Random(size_t n, float scale, uint32_t seed, DType dt) {
  auto v = test::RandomVector(n, scale, seed);
  return dt == DType::kBF16 ? test::RoundBf16(v) : v;
}


StatusOr<cuda::DeviceBuffer> Scratch(const Shape& s) {
  return cuda::DeviceBuffer::Allocate(cuda::flash_attention_backward_scratch_bytes(s.B, s.T, s.NH));
}

class FlashAttentionCuda : public ::testing::TestWithParam<Variant> {
 protected:
  // Forward and backward on `s` against the CPU reference.
  void CheckShape(const Shape& s) {
    const Variant v = GetParam();
    const DType dt = v.dt;
    const std::string what = std::string(v.name) + " " + Name(s) +
                             (cuda::flash_attention_uses_tensor_cores(s.C, s.NH, dt, v.impl) ? " (tensor cores)"
                                                                                             : " (SIMT)");
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const size_t n_att = size_t(s.B) * s.NH * s.T * s.T, n_lse = size_t(s.B) * s.NH * s.T;
    const auto qkv = Random(n_qkv, 1.0f, 1, dt);  // scores q.k / sqrt(hs) ~ N(0, 1)
    const auto dout = Random(n_out, 1.0f, 2, dt);

    std::vector<float> want_out(n_out), want_att(n_att);
    cpu::attention_forward(want_out.data(), want_att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    DeviceArray d_qkv(qkv, dt), d_dout(dout, dt);
    auto out = DeviceArray::Poisoned(n_out, dt);
    auto lse = DeviceArray::Poisoned(n_lse, DType::kF32);
    Status st = cuda::flash_attention_forward(out.data(), static_cast<float*>(lse.data()), d_qkv.data(), s.B, s.T,
                                              s.C, s.NH, dt, nullptr, v.impl);
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    ExpectMatches(out.Download(), want_out, dt, 2e-2, "flash forward out " + what);
    test::ExpectClose(lse.Download(), ReferenceLse(qkv, s.B, s.T, s.C, s.NH), LseTol(dt), "flash forward lse " + what);

    std::vector<float> want_dqkv(n_qkv);
    std::vector<float> cpu_scratch(static_cast<size_t>(cpu::attention_scratch_floats(s.T)));
    cpu::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), want_att.data(), s.B, s.T, s.C, s.NH,
                            cpu_scratch.data(), long(cpu_scratch.size()));
    auto scratch = Scratch(s);
    ASSERT_TRUE(scratch.ok()) << scratch.status().ToString();
    ASSERT_EQ(cudaMemset(scratch->data(), 0xff, scratch->bytes()), cudaSuccess);
    auto dqkv = DeviceArray::Poisoned(n_qkv, dt);
    st = cuda::flash_attention_backward(dqkv.data(), d_dout.data(), d_qkv.data(), out.data(),
                                        static_cast<const float*>(lse.data()), s.B, s.T, s.C, s.NH, dt,
                                        scratch->data(), scratch->bytes(), nullptr, v.impl);
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    ExpectMatches(dqkv.Download(), want_dqkv, dt, 5e-2, "flash backward dqkv " + what);
  }
};

TEST_P(FlashAttentionCuda, SmallShapesMatchCpu) {
  TF_SKIP_WITHOUT_GPU();
  for (const Shape& s : kSmallShapes) {
    CheckShape(s);
    if (HasFatalFailure()) return;
  }
}

TEST_P(FlashAttentionCuda, LongShapesMatchCpu) {
  TF_SKIP_WITHOUT_GPU();
  for (const Shape& s : kLongShapes) {
    CheckShape(s);
    if (HasFatalFailure()) return;
  }
}

// Two forward and two backward runs give bit-identical results (no atomics, fixed order).
TEST_P(FlashAttentionCuda, Deterministic) {
  TF_SKIP_WITHOUT_GPU();
  const Variant v = GetParam();
  for (const Shape& s : {Shape{2, 200, 768, 12}, Shape{1, 150, 256, 2}}) {
    const std::string what = std::string(v.name) + " " + Name(s);
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const size_t n_lse = size_t(s.B) * s.NH * s.T;
    DeviceArray qkv(Random(n_qkv, 1.0f, 3, v.dt), v.dt), dout(Random(n_out, 1.0f, 4, v.dt), v.dt);
    auto scratch = Scratch(s);
    ASSERT_TRUE(scratch.ok());
    std::vector<float> outs[2], lses[2], grads[2];
    for (int run = 0; run < 2; ++run) {
      auto out = DeviceArray::Poisoned(n_out, v.dt);
      auto lse = DeviceArray::Poisoned(n_lse, DType::kF32);
      auto dqkv = DeviceArray::Poisoned(n_qkv, v.dt);
      ASSERT_TRUE(cuda::flash_attention_forward(out.data(), static_cast<float*>(lse.data()), qkv.data(), s.B, s.T,
                                                s.C, s.NH, v.dt, nullptr, v.impl)
                      .ok());
      ASSERT_TRUE(cuda::flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                                 static_cast<const float*>(lse.data()), s.B, s.T, s.C, s.NH, v.dt,
                                                 scratch->data(), scratch->bytes(), nullptr, v.impl)
                      .ok());
      outs[run] = out.Download();
      lses[run] = lse.Download();
      grads[run] = dqkv.Download();
    }
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(outs[0], outs[1])) << "forward out differs between runs: " << what;
    EXPECT_TRUE(same(lses[0], lses[1])) << "forward lse differs between runs: " << what;
    EXPECT_TRUE(same(grads[0], grads[1])) << "backward dqkv differs between runs: " << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, FlashAttentionCuda, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// The fp32 backward against central finite differences of the device forward: loss = sum(w * out)
// (float64 on the host), d loss / d qkv[i] ~ (loss(x + eps e_i) - loss(x - eps e_i)) / (2 eps).
// eps = 1e-2 on N(0,1) inputs: truncation ~eps^2 relative, fp32 round-off ~1e-6 / (2 eps) absolute;
// bound 2e-2 of max(|grad|, grad RMS).
TEST(FlashAttentionCudaGrad, MatchesFiniteDifferences) {
  TF_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{1, 9, 128, 2}, Shape{1, 5, 96, 3}}) {
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const size_t n_lse = size_t(s.B) * s.NH * s.T;
    std::vector<float> x = test::RandomVector(n_qkv, 1.0f, 5);
    const std::vector<float> w = test::RandomVector(n_out, 1.0f, 6);
    DeviceArray d_qkv(x, DType::kF32), d_w(w, DType::kF32);
    auto out = DeviceArray::Poisoned(n_out, DType::kF32);
    auto lse = DeviceArray::Poisoned(n_lse, DType::kF32);
    auto loss = [&]() -> double {
      EXPECT_TRUE(cuda::flash_attention_forward(out.data(), static_cast<float*>(lse.data()), d_qkv.data(), s.B, s.T,
                                                s.C, s.NH, DType::kF32, nullptr)
                      .ok());
      const auto o = out.Download();
      double sum = 0;
      for (size_t i = 0; i < n_out; ++i) sum += double(o[i]) * w[i];
      return sum;
    };
    loss();  // out and lse of x for the backward
    auto scratch = Scratch(s);
    ASSERT_TRUE(scratch.ok());
    auto dqkv = DeviceArray::Poisoned(n_qkv, DType::kF32);
    ASSERT_TRUE(cuda::flash_attention_backward(dqkv.data(), d_w.data(), d_qkv.data(), out.data(),
                                               static_cast<const float*>(lse.data()), s.B, s.T, s.C, s.NH,
                                               DType::kF32, scratch->data(), scratch->bytes(), nullptr)
                    .ok());
    const auto grad = dqkv.Download();
    double ss = 0;
    for (float g : grad) ss += double(g) * g;
    const double rms = std::sqrt(ss / grad.size());
    const float eps = 1e-2f;
    // Coordinates in q, k and v of the first, a middle and the last token, several heads/dims.
    for (int t : {0, s.T / 2, s.T - 1}) {
      for (int part = 0; part < 3; ++part) {
        for (int c : {0, s.C / 2 + 1, s.C - 1}) {
          const size_t i = size_t(t) * 3 * s.C + size_t(part) * s.C + size_t(c);
          const float x0 = x[i];
          x[i] = x0 + eps;
          d_qkv.Upload(x);
          const double up = loss();
          x[i] = x0 - eps;
          d_qkv.Upload(x);
          const double down = loss();
          x[i] = x0;
          d_qkv.Upload(x);
          const double fd = (up - down) / (2.0 * eps);
          EXPECT_NEAR(grad[i], fd, 2e-2 * std::max(std::fabs(fd), rms))
              << Name(s) << " t=" << t << " part=" << part << " c=" << c;
        }
      }
    }
  }
}

TEST(FlashAttentionCudaArgs, RejectsBadArguments) {
  TF_SKIP_WITHOUT_GPU();
  DeviceArray buf(std::vector<float>(4096, 0.0f), DType::kF32);
  void* p = buf.data();
  float* f = static_cast<float*>(p);
  const size_t scratch = cuda::flash_attention_backward_scratch_bytes(1, 4, 2);
  auto fwd = [&](void* out, float* lse, const void* qkv, int B, int T, int C, int NH, DType dt) {
    return cuda::flash_attention_forward(out, lse, qkv, B, T, C, NH, dt, nullptr).code();
  };
  EXPECT_EQ(fwd(p, f, p, 1, 4, 9, 2, DType::kF32), StatusCode::kInvalidArgument);    // C % NH != 0
  EXPECT_EQ(fwd(p, f, p, 1, 0, 8, 2, DType::kF32), StatusCode::kInvalidArgument);    // T = 0
  EXPECT_EQ(fwd(p, f, p, 1, 2, 256, 1, DType::kF32), StatusCode::kInvalidArgument);  // hs = 256
  EXPECT_EQ(fwd(nullptr, f, p, 1, 4, 8, 2, DType::kF32), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(p, nullptr, p, 1, 4, 8, 2, DType::kF32), StatusCode::kInvalidArgument);
  // The tensor-core path needs 16-byte aligned rows.
  void* misaligned = static_cast<char*>(p) + 2;
  EXPECT_EQ(fwd(p, f, misaligned, 1, 2, 128, 2, DType::kBF16), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::flash_attention_backward(p, p, p, p, f, 1, 4, 8, 2, DType::kF32, p, scratch - 1, nullptr).code(),
            StatusCode::kInvalidArgument);  // scratch too small
  EXPECT_EQ(cuda::flash_attention_backward(p, p, p, p, nullptr, 1, 4, 8, 2, DType::kF32, p, scratch, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::flash_attention_backward(p, p, p, p, f, 1, 4, 8, 2, DType::kF32, nullptr, scratch, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing was launched with bad arguments
}

// Host-only (runs without a GPU).
TEST(FlashAttentionCudaHost, ScratchAndDispatch) {
  EXPECT_EQ(cuda::flash_attention_backward_scratch_bytes(2, 7, 3), 256u);  // 42 floats, 256-byte aligned
  EXPECT_EQ(cuda::flash_attention_backward_scratch_bytes(16, 1024, 12), 16u * 12 * 1024 * 4);
  EXPECT_EQ(cuda::flash_attention_backward_scratch_bytes(0, 7, 3), 0u);
  EXPECT_TRUE(cuda::flash_attention_uses_tensor_cores(768, 12, DType::kBF16));   // GPT-2: hs 64
  EXPECT_TRUE(cuda::flash_attention_uses_tensor_cores(256, 2, DType::kBF16));    // hs 128
  EXPECT_FALSE(cuda::flash_attention_uses_tensor_cores(768, 12, DType::kF32));   // fp32: SIMT
  EXPECT_FALSE(cuda::flash_attention_uses_tensor_cores(96, 3, DType::kBF16));    // hs 32: SIMT
  EXPECT_FALSE(cuda::flash_attention_uses_tensor_cores(768, 12, DType::kBF16, FlashImpl::kSimt));
  EXPECT_FALSE(cuda::flash_attention_uses_tensor_cores(768, 7, DType::kBF16));   // C % NH != 0
}

}  // namespace
}  // namespace tf
