// CUDA elementwise kernels (GELU, residual, accumulate) against the CPU backend, fp32 and bf16.
#include <gtest/gtest.h>

#include "kernels/elementwise.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::DeviceArray;

class ElementwiseCuda : public ::testing::TestWithParam<cuda::DType> {};

TEST_P(ElementwiseCuda, MatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const bool bf16 = dt == cuda::DType::kBF16;
  for (long n : {1L, 1000L, 1L << 20, (1L << 20) + 7}) {
    auto a = test::RandomVector(n, 2.0f, 1), b = test::RandomVector(n, 1.0f, 2);
    if (bf16) a = test::RoundBf16(a), b = test::RoundBf16(b);  // the device sees rounded inputs
    DeviceArray da(a, dt), db(b, dt);

    std::vector<float> want(n);
    auto out = DeviceArray::Poisoned(n, dt);
    cpu::gelu_forward(want.data(), a.data(), n);
    ASSERT_TRUE(cuda::gelu_forward(out.data(), da.data(), n, dt, nullptr).ok());
    test::ExpectClose(out.Download(), want, test::Tolerance(dt), "gelu_forward n=" + std::to_string(n));

    cpu::gelu_backward(want.data(), a.data(), b.data(), n);
    auto dout = DeviceArray::Poisoned(n, dt);
    ASSERT_TRUE(cuda::gelu_backward(dout.data(), da.data(), db.data(), n, dt, nullptr).ok());
    test::ExpectClose(dout.Download(), want, test::Tolerance(dt), "gelu_backward n=" + std::to_string(n));

    cpu::residual_forward(want.data(), a.data(), b.data(), n);
    auto res = DeviceArray::Poisoned(n, dt);
    ASSERT_TRUE(cuda::residual_forward(res.data(), da.data(), db.data(), n, dt, nullptr).ok());
    test::ExpectClose(res.Download(), want, test::Tolerance(dt), "residual n=" + std::to_string(n));

    std::vector<float> acc = a;
    cpu::accumulate(acc.data(), b.data(), n);
    ASSERT_TRUE(cuda::accumulate(da.data(), db.data(), n, dt, nullptr).ok());
    test::ExpectClose(da.Download(), acc, test::Tolerance(dt), "accumulate n=" + std::to_string(n));

    // convert: to fp32 and back, bit-exact against the host rounding rule.
    auto f32 = DeviceArray::Poisoned(n, cuda::DType::kF32);
    DeviceArray src(b, dt);
    ASSERT_TRUE(cuda::convert(f32.data(), cuda::DType::kF32, src.data(), dt, n, nullptr).ok());
    const std::vector<float> expect = dt == cuda::DType::kBF16 ? test::RoundBf16(b) : b;
    EXPECT_EQ(f32.Download(), expect) << "convert to fp32 n=" << n;
    auto back = DeviceArray::Poisoned(n, dt);
    ASSERT_TRUE(cuda::convert(back.data(), dt, f32.data(), cuda::DType::kF32, n, nullptr).ok());
    EXPECT_EQ(back.Download(), expect) << "convert from fp32 n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, ElementwiseCuda, ::testing::Values(cuda::DType::kF32, cuda::DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

}  // namespace
}  // namespace tf
