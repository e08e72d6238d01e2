// CUDA fused softmax + cross-entropy (+ in-place gradient) against the CPU backend, fp32 and bf16.
//
// Tolerances: losses and gradients use test::Tolerance(dt) against the CPU backend, except the fp32
// gradient, which is checked against a float64 softmax instead: the softmax's denominator is a sum
// of V fp32 exponentials, and how the CPU rounds it depends on how the compiler vectorises its loop
// (8 or 16 SIMD partial sums at -O3 -march=native; one sequential sum in a sanitizer build, 6e-5
// off at V = 50257 — seen on the CPU emulator), while the GPU's (<= 99 terms per thread, then a
// tree) stays within ~1e-6. The float64 reference takes exp() exactly; math::fast_exp is within a
// few ulp, so 1e-5 (test::Tolerance) holds with a wide margin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/classifier.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::DeviceArray;

class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<int32_t>& host) {
    auto b = cuda::DeviceBuffer::Allocate(host.size() * sizeof(int32_t));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    buf_ = std::move(*b);
    EXPECT_EQ(cudaMemcpy(buf_.data(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  const int32_t* data() const { return buf_.as<int32_t>(); }

 private:
  cuda::DeviceBuffer buf_;
};

std::vector<int32_t> Tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Shape {
  int N, V, Vp;
};
std::string Name(const Shape& s, float dloss) {
  return "N=" + std::to_string(s.N) + " V=" + std::to_string(s.V) + " Vp=" + std::to_string(s.Vp) +
         " dloss=" + std::to_string(dloss);
}
// Odd vocabularies with and without padding, V = 1 (loss 0, gradient 0), GPT-2's padded vocabulary.
const Shape kShapes[] = {{3, 97, 128}, {5, 97, 97}, {2, 1, 8}, {64, 1000, 1024}, {4, 50257, 50304}};

// The gradient (softmax - one_hot(target)) * dloss of each row in float64; padded columns 0.
std::vector<float> ReferenceDlogits(const std::vector<float>& logits, const std::vector<int32_t>& targets, int N,
                                    int V, int Vp, float dloss) {
  std::vector<float> out(logits.size());
  for (int i = 0; i < N; ++i) {
    const float* row = logits.data() + size_t(i) * Vp;
    const double m = *std::max_element(row, row + V);
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(row[j]) - m);
    for (int j = 0; j < Vp; ++j) {
      const double g = j < V ? std::exp(double(row[j]) - m) / sum * dloss - (j == targets[i] ? dloss : 0.0) : 0.0;
      out[size_t(i) * Vp + j] = static_cast<float>(g);
    }
  }
  return out;
}

class CrossEntropyCuda : public ::testing::TestWithParam<cuda::DType> {};

TEST_P(CrossEntropyCuda, MatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  for (const Shape& s : kShapes) {
    for (const float dloss : {1.0f / s.N, 0.0f}) {
      // Padded columns hold garbage (they are never read; with a gradient they are overwritten with 0).
      auto logits = test::RandomVector(size_t(s.N) * s.Vp, 3.0f, 1);
      if (dt == cuda::DType::kBF16) logits = test::RoundBf16(logits);  // the device sees rounded logits
      const auto targets = Tokens(s.N, s.V, 2);
      DeviceArray g_logits(logits, dt);
      DeviceInts g_targets(targets);
      auto losses = DeviceArray::Poisoned(s.N, cuda::DType::kF32);
      ASSERT_TRUE(cuda::crossentropy_forward_backward(g_logits.data(), static_cast<float*>(losses.data()),
                                                      g_targets.data(), s.N, s.V, s.Vp, dloss, dt, nullptr)
                      .ok());
      auto want = logits;
      std::vector<float> want_losses(s.N);
      cpu::crossentropy_forward_backward(want.data(), want_losses.data(), targets.data(), s.N, s.V, s.Vp, dloss);
      test::ExpectClose(losses.Download(), want_losses, test::Tolerance(dt), "losses " + Name(s, dloss));
      if (dloss == 0.0f) {
        // Logits untouched, bit for bit (want == logits here).
        test::ExpectClose(g_logits.Download(), want, 0.0, "logits untouched " + Name(s, dloss));
      } else {
        if (dt == cuda::DType::kF32) {
          test::ExpectClose(g_logits.Download(), ReferenceDlogits(logits, targets, s.N, s.V, s.Vp, dloss),
                            test::Tolerance(dt), "dlogits (float64 reference) " + Name(s, dloss));
        } else {
          test::ExpectClose(g_logits.Download(), want, test::Tolerance(dt), "dlogits " + Name(s, dloss));
        }
      }
    }
  }
}

// Large logits (softmax saturates to one-hot), a -inf logit, and a row of equal logits.
TEST_P(CrossEntropyCuda, ExtremeRows) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const Shape s{3, 97, 128};
  std::vector<float> logits(size_t(s.N) * s.Vp, 0.0f);
  for (int j = 0; j < s.V; ++j) logits[j] = (j % 7) * 20.0f;  // row 0: spread of 120
  logits[s.Vp + 5] = -INFINITY;                              // row 1: zeros and one -inf
  for (int j = 0; j < s.V; ++j) logits[2L * s.Vp + j] = 1.5f;  // row 2: uniform
  const std::vector<int32_t> targets = {6, 5, 42};
  DeviceArray g_logits(logits, dt);
  DeviceInts g_targets(targets);
  auto losses = DeviceArray::Poisoned(s.N, cuda::DType::kF32);
  ASSERT_TRUE(cuda::crossentropy_forward_backward(g_logits.data(), static_cast<float*>(losses.data()),
                                                  g_targets.data(), s.N, s.V, s.Vp, 1.0f, dt, nullptr)
                  .ok());
  auto want = logits;
  std::vector<float> want_losses(s.N);
  cpu::crossentropy_forward_backward(want.data(), want_losses.data(), targets.data(), s.N, s.V, s.Vp, 1.0f);
  // Row 1's target is the -inf logit: an infinite loss on both sides; the others are finite.
  const auto got_losses = losses.Download();
  EXPECT_TRUE(std::isinf(got_losses[1]) && got_losses[1] > 0) << got_losses[1];
  EXPECT_TRUE(std::isinf(want_losses[1]) && want_losses[1] > 0) << want_losses[1];
  for (int i : {0, 2}) EXPECT_NEAR(got_losses[i], want_losses[i], 1e-5 * (1 + std::fabs(want_losses[i]))) << i;
  test::ExpectClose(g_logits.Download(), want, test::Tolerance(dt), "dlogits extreme rows");
}

TEST_P(CrossEntropyCuda, RejectsBadShapes) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  EXPECT_FALSE(cuda::crossentropy_forward_backward(nullptr, nullptr, nullptr, 2, 10, 8, 1.0f, dt, nullptr).ok());
  EXPECT_FALSE(cuda::crossentropy_forward_backward(nullptr, nullptr, nullptr, 2, 0, 8, 1.0f, dt, nullptr).ok());
  EXPECT_FALSE(cuda::crossentropy_forward_backward(nullptr, nullptr, nullptr, -1, 4, 8, 1.0f, dt, nullptr).ok());
  EXPECT_TRUE(cuda::crossentropy_forward_backward(nullptr, nullptr, nullptr, 0, 4, 8, 1.0f, dt, nullptr).ok());
}

// The device loss accumulator equals a float64 host sum (it sums in double too; only the order
// differs) and accumulates across calls.
TEST(AccumulateLossCuda, MatchesHostSumAndAccumulates) {
  TF_SKIP_WITHOUT_GPU();
  for (int n : {1, 7, 1023, 1024, 1025, 16 * 1024 + 3}) {
    std::vector<float> losses(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) losses[static_cast<size_t>(i)] = 0.5f + 0.001f * static_cast<float>(i % 977);
    double want = 0;
    for (float x : losses) want += x;
    test::DeviceArray d(losses, cuda::DType::kF32);
    double* acc = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&acc), sizeof(double)), cudaSuccess);
    ASSERT_EQ(cudaMemset(acc, 0, sizeof(double)), cudaSuccess);
    ASSERT_TRUE(cuda::accumulate_loss(static_cast<const float*>(d.data()), n, 0.25, acc, nullptr).ok());
    ASSERT_TRUE(cuda::accumulate_loss(static_cast<const float*>(d.data()), n, 0.5, acc, nullptr).ok());
    double got = 0;
    ASSERT_EQ(cudaMemcpy(&got, acc, sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_NEAR(got, 0.75 * want, 1e-12 * want) << n;
    cudaFree(acc);
  }
  EXPECT_FALSE(cuda::accumulate_loss(nullptr, 3, 1.0, nullptr, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, CrossEntropyCuda, ::testing::Values(cuda::DType::kF32, cuda::DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

}  // namespace
}  // namespace tf
