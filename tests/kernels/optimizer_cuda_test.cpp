// CUDA sum of squares and AdamW step against the CPU backend, fp32 and bf16 gradients/parameters.
//
// Tolerances: both sides see the same (rounded) inputs and compute in fp32 with the same formulas
// (math::adamw_update), so fp32 results agree to 1e-5 relative (they can differ by a few ulps where
// the compilers contract multiply-adds differently). sum_squares: the CPU sums in double, the GPU in
// fp32 per thread (<= 128 non-negative terms here) then double: relative error ~sqrt(128) * 2^-24 ~
// 1e-6, checked at 1e-5 in both dtypes (the bf16 inputs are exact in fp32). A bf16 params_out must be
// exactly the device's fp32 master rounded to nearest even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/optimizer.h"
#include "model/parameters.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::DeviceArray;
constexpr cuda::DType kF32 = cuda::DType::kF32;

std::vector<float> Stored(const std::vector<float>& v, cuda::DType dt) {
  return dt == cuda::DType::kBF16 ? test::RoundBf16(v) : v;
}

// Runs the device sum_squares over n elements from element `shift` of g and returns *result_device.
double DeviceSumSquares(const DeviceArray& g, long n, cuda::DType dt, int shift = 0) {
  const size_t bytes = cuda::sum_squares_scratch_bytes(n);
  auto scratch = cuda::DeviceBuffer::Allocate(bytes);
  auto result = cuda::DeviceBuffer::Allocate(sizeof(double));
  EXPECT_TRUE(scratch.ok() && result.ok());
  const double poison = NAN;
  EXPECT_EQ(cudaMemcpy(result->data(), &poison, sizeof(double), cudaMemcpyHostToDevice), cudaSuccess);
  const void* data = static_cast<const char*>(g.data()) + shift * cuda::DTypeSize(dt);
  const Status st = cuda::sum_squares(data, n, dt, result->as<double>(), scratch->data(), bytes, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  double got = NAN;
  EXPECT_EQ(cudaMemcpy(&got, result->data(), sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
  return got;
}

class OptimizerCuda : public ::testing::TestWithParam<cuda::DType> {};

TEST_P(OptimizerCuda, SumSquaresMatchesCpuDeterministically) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  // One element, one partial block, a partial last block, the 1024-block cap with a ragged grid
  // stride, and 128 elements per thread.
  for (long n : {1L, 1000L, 256L * 1024 + 3, (1L << 22) + 5, 1L << 25}) {
    const auto g = Stored(test::RandomVector(n, 1e-2f, 1), dt);
    DeviceArray dg(g, dt);
    const double got = DeviceSumSquares(dg, n, dt);
    const double want = cpu::sum_squares(g.data(), n);
    EXPECT_NEAR(got, want, 1e-5 * want) << "n=" << n;
    const double again = DeviceSumSquares(dg, n, dt);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0) << "n=" << n << ": runs differ " << got << " " << again;
    // From a pointer one element off 16-byte alignment (the one-element-per-access path).
    std::vector<float> shifted = {1e3f};
    shifted.insert(shifted.end(), g.begin(), g.end());
    EXPECT_NEAR(DeviceSumSquares(DeviceArray(shifted, dt), n, dt, 1), want, 1e-5 * want) << "n=" << n << " shifted";
  }
  // n = 0 writes 0 (over a NaN poison).
  DeviceArray empty(std::vector<float>(1, 1.0f), dt);
  EXPECT_EQ(DeviceSumSquares(empty, 0, dt), 0.0);
}

TEST_P(OptimizerCuda, SumSquaresRejectsSmallScratch) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const long n = 100000;
  DeviceArray g(std::vector<float>(n, 1.0f), dt);
  auto scratch = cuda::DeviceBuffer::Allocate(cuda::sum_squares_scratch_bytes(n));
  auto result = cuda::DeviceBuffer::Allocate(sizeof(double));
  ASSERT_TRUE(scratch.ok() && result.ok());
  EXPECT_FALSE(
      cuda::sum_squares(g.data(), n, dt, result->as<double>(), scratch->data(), scratch->bytes() - 1, nullptr).ok());
  EXPECT_FALSE(
      cuda::sum_squares(g.data(), -1, dt, result->as<double>(), scratch->data(), scratch->bytes(), nullptr).ok());
}

// How params_out is passed to adamw_step.
enum class Out { kSeparate, kAliasMaster, kNone };

// One step from random state on the device and on the CPU; compares master, m, v and params_out.
void CheckAdamW(long n, cuda::DType grad_dt, cuda::DType param_dt, Out out_mode) {
  const std::string what = "adamw n=" + std::to_string(n) + " grads " + cuda::DTypeName(grad_dt) + " params " +
                           cuda::DTypeName(param_dt) + " out mode " + std::to_string(static_cast<int>(out_mode));
  auto master = test::RandomVector(n, 0.02f, 1);
  auto m = test::RandomVector(n, 1e-3f, 2);
  auto v = test::RandomVector(n, 1e-3f, 3);
  for (float& x : v) x *= x;  // second moments are non-negative
  const auto grads = Stored(test::RandomVector(n, 1e-2f, 4), grad_dt);
  const float grad_scale = 0.5f;
  const int t = 3;  // step number for the bias corrections
  const math::AdamWParams h{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f - static_cast<float>(std::pow(0.9, t)),
                                 1.0f - static_cast<float>(std::pow(0.95, t))};

  DeviceArray d_master(master, kF32), d_m(m, kF32), d_v(v, kF32), d_grads(grads, grad_dt);
  auto d_out = DeviceArray::Poisoned(n, param_dt);
  void* out = out_mode == Out::kSeparate ? d_out.data() : out_mode == Out::kAliasMaster ? d_master.data() : nullptr;
  const Status st = cuda::adamw_step(static_cast<float*>(d_master.data()), static_cast<float*>(d_m.data()),
                                     static_cast<float*>(d_v.data()), d_grads.data(), out, n, grad_scale, h, grad_dt,
                                     param_dt, nullptr);
  ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();

  cpu::adamw_step(master.data(), m.data(), v.data(), grads.data(), n, grad_scale, h);
  const auto got_master = d_master.Download();
  test::ExpectClose(got_master, master, test::Tolerance(kF32), what + " master");
  test::ExpectClose(d_m.Download(), m, test::Tolerance(kF32), what + " m");
  test::ExpectClose(d_v.Download(), v, test::Tolerance(kF32), what + " v");
  if (out_mode == Out::kSeparate) {
    // Exactly the device master rounded to param_dt (tolerance 0).
    test::ExpectClose(d_out.Download(), Stored(got_master, param_dt), 0.0, what + " params_out");
  } else if (out_mode == Out::kNone) {
    const auto untouched = d_out.Download();
    EXPECT_TRUE(std::isnan(untouched[0]) && std::isnan(untouched[n - 1])) << what << ": params_out written";
  }
}

TEST_P(OptimizerCuda, AdamWMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const cuda::DType other = dt == kF32 ? cuda::DType::kBF16 : kF32;
  for (long n : {1L, 1000L, (1L << 20) + 3}) {
    CheckAdamW(n, dt, dt, Out::kSeparate);     // plain fp32, or bf16 gradients and bf16 working copy
    CheckAdamW(n, dt, other, Out::kSeparate);  // mixed storage types
    CheckAdamW(n, dt, kF32, Out::kAliasMaster);
    CheckAdamW(n, dt, dt, Out::kNone);
  }
}

TEST_P(OptimizerCuda, AdamWRejectsBadArguments) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const long n = 16;
  DeviceArray a(std::vector<float>(n, 1.0f), kF32), b(std::vector<float>(n, 1.0f), kF32),
      c(std::vector<float>(n, 1.0f), kF32), g(std::vector<float>(n, 1.0f), dt);
  float* pa = static_cast<float*>(a.data());
  const math::AdamWParams h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.001f};
  // A bf16 params_out cannot alias the fp32 master.
  EXPECT_FALSE(cuda::adamw_step(pa, static_cast<float*>(b.data()), static_cast<float*>(c.data()), g.data(), pa, n,
                                1.0f, h, dt, cuda::DType::kBF16, nullptr)
                   .ok());
  EXPECT_FALSE(cuda::adamw_step(pa, static_cast<float*>(b.data()), static_cast<float*>(c.data()), g.data(), nullptr,
                                -1, 1.0f, h, dt, kF32, nullptr)
                   .ok());
}

// The one-launch AdamW over decay runs with the clip factor computed on the device, against the
// CPU AdamW (the same runs, clip formula and per-element math), clipping on and off; runs of odd
// lengths (1, chunk-straddling, many per chunk) and a bf16 working copy.
// shift = 1 offsets every device pointer by one element (not 16-byte aligned: the scalar path).
void CheckAdamWRanges(cuda::DType dt, const std::vector<int64_t>& lengths, double clip, int shift = 0) {
  std::vector<DecayRange> runs;
  int64_t n = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    runs.push_back({n, n + lengths[r], r % 2 == 0});
    n += lengths[r];
  }
  const std::string what = std::string("adamw_ranges ") + cuda::DTypeName(dt) + " n=" + std::to_string(n) +
                           " runs=" + std::to_string(runs.size()) + " clip=" + std::to_string(clip) +
                           " shift=" + std::to_string(shift);
  auto master = test::RandomVector(n, 0.02f, 5);
  auto m = test::RandomVector(n, 1e-3f, 6);
  auto v = test::RandomVector(n, 1e-3f, 7);
  for (float& x : v) x *= x;
  const auto grads = Stored(test::RandomVector(n, 1e-2f, 8), dt);
  const int t = 4;
  const math::AdamWParams h{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f - static_cast<float>(std::pow(0.9, t)),
                            1.0f - static_cast<float>(std::pow(0.95, t))};
  std::vector<uint8_t> table(runs.size() * 9);
  for (size_t r = 0; r < runs.size(); ++r) {
    std::memcpy(table.data() + r * 8, &runs[r].end, 8);
    table[runs.size() * 8 + r] = runs[r].decay ? 1 : 0;
  }
  auto d_table = cuda::DeviceBuffer::Allocate(table.size());
  ASSERT_TRUE(d_table.ok());
  ASSERT_EQ(cudaMemcpy(d_table->data(), table.data(), table.size(), cudaMemcpyHostToDevice), cudaSuccess);
  auto pad = [&](const std::vector<float>& x, float fill) {
    std::vector<float> p(size_t(shift), fill);
    p.insert(p.end(), x.begin(), x.end());
    return p;
  };
  auto unpad = [&](const std::vector<float>& x) { return std::vector<float>(x.begin() + shift, x.end()); };
  auto at = [&](const DeviceArray& a, cuda::DType t) {
    return static_cast<void*>(static_cast<char*>(a.data()) + shift * cuda::DTypeSize(t));
  };
  DeviceArray d_master(pad(master, 0.0f), kF32), d_m(pad(m, 0.0f), kF32), d_v(pad(v, 0.0f), kF32),
      d_grads(pad(grads, 0.0f), dt);
  auto d_out = DeviceArray::Poisoned(n + shift, dt);
  const double sum_sq = DeviceSumSquares(d_grads, n + shift, dt);  // (the padding is 0)
  auto d_sum = cuda::DeviceBuffer::Allocate(sizeof(double));
  ASSERT_TRUE(d_sum.ok());
  ASSERT_EQ(cudaMemcpy(d_sum->data(), &sum_sq, sizeof(double), cudaMemcpyHostToDevice), cudaSuccess);
  void* out = dt == kF32 ? at(d_master, kF32) : at(d_out, dt);
  const Status st = cuda::adamw_step_ranges(
      static_cast<float*>(at(d_master, kF32)), static_cast<float*>(at(d_m, kF32)), static_cast<float*>(at(d_v, kF32)),
      at(d_grads, dt), out, n, static_cast<const int64_t*>(d_table->data()),
      static_cast<const uint8_t*>(d_table->data()) + runs.size() * 8, static_cast<int>(runs.size()),
      d_sum->as<double>(), clip, h, dt, dt, nullptr);
  ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();

  const float scale = math::grad_clip_scale(std::sqrt(sum_sq), clip);
  for (const DecayRange& r : runs) {
    math::AdamWParams hr = h;
    hr.weight_decay = r.decay ? h.weight_decay : 0.0f;
    cpu::adamw_step(master.data() + r.begin, m.data() + r.begin, v.data() + r.begin, grads.data() + r.begin,
                    r.end - r.begin, scale, hr);
  }
  const auto got_master = unpad(d_master.Download());
  test::ExpectClose(got_master, master, test::Tolerance(kF32), what + " master");
  test::ExpectClose(unpad(d_m.Download()), m, test::Tolerance(kF32), what + " m");
  test::ExpectClose(unpad(d_v.Download()), v, test::Tolerance(kF32), what + " v");
  if (dt != kF32) test::ExpectClose(unpad(d_out.Download()), Stored(got_master, dt), 0.0, what + " params_out");
}

TEST_P(OptimizerCuda, AdamWRangesMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const std::vector<int64_t> odd = {1, 4095, 2, 4097, 768, 768, 3 * 768, 1, 100000, 7};
  for (double clip : {0.0, 1e-3, 1e9}) CheckAdamWRanges(dt, odd, clip);  // off, active, inactive
  CheckAdamWRanges(dt, {(1 << 20) + 3}, 1e-3);
  std::vector<int64_t> many(300, 5);  // many runs inside one chunk
  CheckAdamWRanges(dt, many, 1e-3);
  CheckAdamWRanges(dt, odd, 1e-3, /*shift=*/1);  // misaligned pointers: the one-element-per-access path
}

INSTANTIATE_TEST_SUITE_P(DTypes, OptimizerCuda, ::testing::Values(cuda::DType::kF32, cuda::DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

}  // namespace
}  // namespace tf
