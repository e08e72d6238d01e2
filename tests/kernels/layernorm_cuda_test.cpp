// CUDA LayerNorm forward/backward against the CPU backend, fp32 and bf16.
//
// Tolerance: test::Tolerance(dt). In fp32 the kernels differ from the CPU only in summation order
// (row sums of C terms; dweight/dbias sums over N rows), ~sqrt(K) * 6e-8 relative, far under 1e-5 for
// the shapes here. In bf16 every input is the same rounded value on both sides and each output is
// rounded once (2^-9 relative), under 1e-2. mean/rstd are fp32 in both dtypes.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/layernorm.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::DeviceArray;

std::vector<float> Stored(const std::vector<float>& v, cuda::DType dt) {
  return dt == cuda::DType::kBF16 ? test::RoundBf16(v) : v;
}
std::vector<float> Shifted(std::vector<float> v, float shift) {
  for (float& x : v) x += shift;
  return v;
}

struct Shape {
  int N, C;
};
std::string Name(const Shape& s) { return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C); }
// Odd C, a single row, GPT-2's C with a partial last row group (100 = 3*32 + 4), more row groups than
// the final reduction's 32 strides (N=2048 -> 64 groups), and the shared-memory limits of the
// backward (C = 1600: 3 warps per block; C = 6144: 1 warp).
const Shape kShapes[] = {{3, 37}, {1, 768}, {100, 768}, {2048, 64}, {33, 1600}, {5, 6144}, {7, 1}};

struct Inputs {
  std::vector<float> inp, weight, bias;
};
Inputs MakeInputs(const Shape& s, cuda::DType dt) {
  // Offset inputs (mean 0.5) so that the two-pass statistics matter.
  return {Stored(Shifted(test::RandomVector(size_t(s.N) * s.C, 1.0f, 1), 0.5f), dt),
          Stored(Shifted(test::RandomVector(s.C, 0.2f, 2), 1.0f), dt), Stored(test::RandomVector(s.C, 0.1f, 3), dt)};
}

class LayerNormCuda : public ::testing::TestWithParam<cuda::DType> {};

TEST_P(LayerNormCuda, ForwardMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  for (const Shape& s : kShapes) {
    const Inputs in = MakeInputs(s, dt);
    DeviceArray g_inp(in.inp, dt), g_w(in.weight, dt), g_b(in.bias, dt);
    auto out = DeviceArray::Poisoned(in.inp.size(), dt);
    auto mean = DeviceArray::Poisoned(s.N, cuda::DType::kF32), rstd = DeviceArray::Poisoned(s.N, cuda::DType::kF32);
    ASSERT_TRUE(cuda::layernorm_forward(out.data(), static_cast<float*>(mean.data()), static_cast<float*>(rstd.data()),
                                        g_inp.data(), g_w.data(), g_b.data(), s.N, s.C, dt, nullptr)
                    .ok());
    std::vector<float> want(in.inp.size()), want_mean(s.N), want_rstd(s.N);
    cpu::layernorm_forward(want.data(), want_mean.data(), want_rstd.data(), in.inp.data(), in.weight.data(),
                           in.bias.data(), s.N, s.C);
    test::ExpectClose(out.Download(), want, test::Tolerance(dt), "layernorm_forward out " + Name(s));
    test::ExpectClose(mean.Download(), want_mean, test::Tolerance(dt), "layernorm_forward mean " + Name(s));
    test::ExpectClose(rstd.Download(), want_rstd, test::Tolerance(dt), "layernorm_forward rstd " + Name(s));

    // mean/rstd are optional on the device.
    auto out2 = DeviceArray::Poisoned(in.inp.size(), dt);
    ASSERT_TRUE(cuda::layernorm_forward(out2.data(), nullptr, nullptr, g_inp.data(), g_w.data(), g_b.data(), s.N, s.C,
                                        dt, nullptr)
                    .ok());
    test::ExpectClose(out2.Download(), want, test::Tolerance(dt), "layernorm_forward (no stats) " + Name(s));
  }
}

// Accumulates (+=) into random dinp/dweight/dbias; mean/rstd come from the CPU forward so that the
// backward is judged on its own. Two runs are bit-identical.
TEST_P(LayerNormCuda, BackwardMatchesCpuAndAccumulatesDeterministically) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  for (const Shape& s : kShapes) {
    const Inputs in = MakeInputs(s, dt);
    const size_t nc = size_t(s.N) * s.C;
    const auto dout = Stored(test::RandomVector(nc, 1.0f, 4), dt);
    const auto dinp0 = Stored(test::RandomVector(nc, 0.5f, 5), dt);
    const auto dw0 = Stored(test::RandomVector(s.C, 0.5f, 6), dt), db0 = Stored(test::RandomVector(s.C, 0.5f, 7), dt);
    std::vector<float> out(nc), mean(s.N), rstd(s.N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), in.inp.data(), in.weight.data(), in.bias.data(), s.N,
                           s.C);

    DeviceArray g_inp(in.inp, dt), g_w(in.weight, dt), g_dout(dout, dt);
    DeviceArray g_mean(mean, cuda::DType::kF32), g_rstd(rstd, cuda::DType::kF32);
    const size_t bytes = cuda::layernorm_backward_scratch_bytes(s.N, s.C);
    auto scratch = cuda::DeviceBuffer::Allocate(bytes);
    ASSERT_TRUE(scratch.ok());
    std::vector<float> got[2][3];  // [run][dinp, dweight, dbias]
    for (int run = 0; run < 2; ++run) {
      DeviceArray g_dinp(dinp0, dt), g_dw(dw0, dt), g_db(db0, dt);
      const Status st = cuda::layernorm_backward(
          g_dinp.data(), g_dw.data(), g_db.data(), g_dout.data(), g_inp.data(), g_w.data(),
          static_cast<const float*>(g_mean.data()), static_cast<const float*>(g_rstd.data()), s.N, s.C, dt,
          scratch->as<float>(), bytes, nullptr);
      ASSERT_TRUE(st.ok()) << st.ToString();
      got[run][0] = g_dinp.Download();
      got[run][1] = g_dw.Download();
      got[run][2] = g_db.Download();
    }
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(std::memcmp(got[0][k].data(), got[1][k].data(), got[0][k].size() * sizeof(float)), 0)
          << "layernorm_backward output " << k << " differs between runs, " << Name(s);
    }
    auto dinp = dinp0, dw = dw0, db = db0;
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), in.inp.data(), in.weight.data(),
                            mean.data(), rstd.data(), s.N, s.C);
    test::ExpectClose(got[0][0], dinp, test::Tolerance(dt), "layernorm_backward dinp " + Name(s));
    test::ExpectClose(got[0][1], dw, test::Tolerance(dt), "layernorm_backward dweight " + Name(s));
    test::ExpectClose(got[0][2], db, test::Tolerance(dt), "layernorm_backward dbias " + Name(s));
  }
}

TEST_P(LayerNormCuda, RejectsBadArguments) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const Shape s{4, 8};
  const Inputs in = MakeInputs(s, dt);
  DeviceArray a(in.inp, dt), w(in.weight, dt);
  DeviceArray stats(std::vector<float>(s.N, 1.0f), cuda::DType::kF32);
  const float* st = static_cast<const float*>(stats.data());
  auto scratch = cuda::DeviceBuffer::Allocate(cuda::layernorm_backward_scratch_bytes(s.N, s.C));
  ASSERT_TRUE(scratch.ok());
  EXPECT_FALSE(
      cuda::layernorm_forward(a.data(), nullptr, nullptr, a.data(), w.data(), w.data(), -1, s.C, dt, nullptr).ok());
  // Scratch one byte short.
  EXPECT_FALSE(cuda::layernorm_backward(a.data(), w.data(), w.data(), a.data(), a.data(), w.data(), st, st, s.N, s.C,
                                        dt, scratch->as<float>(), scratch->bytes() - 1, nullptr)
                   .ok());
  // C beyond the shared-memory accumulators.
  EXPECT_FALSE(cuda::layernorm_backward(a.data(), w.data(), w.data(), a.data(), a.data(), w.data(), st, st, 1, 6145,
                                        dt, scratch->as<float>(), size_t(1) << 40, nullptr)
                   .ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, LayerNormCuda, ::testing::Values(cuda::DType::kF32, cuda::DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

}  // namespace
}  // namespace tf
