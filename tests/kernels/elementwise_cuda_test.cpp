// CUDA elementwise kernels (GELU, residual, accumulate) against the CPU backend, fp32 and bf16.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <utility>

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

// n elements at `shift` elements past the start of a device allocation (shift 1: not 16-byte
// aligned, so the kernels take their scalar path).
struct Shifted {
  Shifted(const std::vector<float>& host, cuda::DType dt, int shift) : shift(shift), size(cuda::DTypeSize(dt)) {
    std::vector<float> padded(shift, 0.0f);
    padded.insert(padded.end(), host.begin(), host.end());
    array = std::make_unique<DeviceArray>(padded, dt);
  }
  void* data() const { return static_cast<char*>(array->data()) + shift * size; }
  std::vector<float> Download() const {
    auto all = array->Download();
    return {all.begin() + shift, all.end()};
  }
  int shift;
  size_t size;
  std::unique_ptr<DeviceArray> array;
};

// The 16-byte path and the scalar path (any pointer misaligned) compute the same formula per
// element, so they agree up to the compiler's FMA contraction of that formula in each loop (fp32
// 1e-6 relative; bf16 one rounding step); additions and conversions, which cannot contract, agree
// bit for bit. n % 8 != 0 exercises the vector path's scalar tail.
TEST_P(ElementwiseCuda, VectorAndScalarPathsAgree) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const long n = 4099;
  const auto a = test::RandomVector(n, 2.0f, 3), b = test::RandomVector(n, 1.0f, 4);
  using Op = std::function<Status(void* out, const void* a, const void* b)>;
  const std::pair<const char*, Op> ops[] = {
      {"gelu_forward", [&](void* o, const void* x, const void*) { return cuda::gelu_forward(o, x, n, dt, nullptr); }},
      {"gelu_backward",
       [&](void* o, const void* x, const void* y) { return cuda::gelu_backward(o, x, y, n, dt, nullptr); }},
      {"residual_forward",
       [&](void* o, const void* x, const void* y) { return cuda::residual_forward(o, x, y, n, dt, nullptr); }},
  };
  for (const auto& [name, op] : ops) {
    std::vector<float> reference;
    for (int mask = 0; mask < 8; ++mask) {  // bit k: pointer k (out, a, b) shifted by one element
      Shifted out(std::vector<float>(n, NAN), dt, mask & 1), x(a, dt, (mask >> 1) & 1), y(b, dt, (mask >> 2) & 1);
      ASSERT_TRUE(op(out.data(), x.data(), y.data()).ok()) << name;
      const auto got = out.Download();
      if (mask == 0) {
        reference = got;
        for (float v : got) ASSERT_FALSE(std::isnan(v)) << name << ": element not written";
      } else {
        test::ExpectClose(got, reference, dt == cuda::DType::kF32 ? 1e-6 : 8e-3,
                          std::string(name) + " shift mask " + std::to_string(mask));
      }
    }
  }
  for (int mask = 0; mask < 4; ++mask) {  // accumulate (dst, src) and convert to fp32 and back
    Shifted dst(a, dt, mask & 1), src(b, dt, (mask >> 1) & 1);
    ASSERT_TRUE(cuda::accumulate(dst.data(), src.data(), n, dt, nullptr).ok());
    std::vector<float> want = dt == cuda::DType::kBF16 ? test::RoundBf16(a) : a;
    cpu::accumulate(want.data(), (dt == cuda::DType::kBF16 ? test::RoundBf16(b) : b).data(), n);
    if (dt == cuda::DType::kBF16) want = test::RoundBf16(want);
    EXPECT_EQ(dst.Download(), want) << "accumulate shift mask " << mask;

    Shifted f32(std::vector<float>(n, NAN), cuda::DType::kF32, mask & 1);
    ASSERT_TRUE(cuda::convert(f32.data(), cuda::DType::kF32, src.data(), dt, n, nullptr).ok());
    const std::vector<float> expect = dt == cuda::DType::kBF16 ? test::RoundBf16(b) : b;
    EXPECT_EQ(f32.Download(), expect) << "convert to fp32, shift mask " << mask;
    Shifted back(std::vector<float>(n, NAN), dt, (mask >> 1) & 1);
    ASSERT_TRUE(cuda::convert(back.data(), dt, f32.data(), cuda::DType::kF32, n, nullptr).ok());
    EXPECT_EQ(back.Download(), expect) << "convert from fp32, shift mask " << mask;
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, ElementwiseCuda, ::testing::Values(cuda::DType::kF32, cuda::DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

}  // namespace
}  // namespace tf
