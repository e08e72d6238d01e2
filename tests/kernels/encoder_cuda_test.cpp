// CUDA encoder (token + position embedding) against the CPU backend, fp32 and bf16.
//
// Both kernels only add, in the CPU's order (see kernels/encoder.cu), so the comparisons are exact:
// fp32 results equal the CPU's bit for bit, and bf16 results equal the CPU's fp32 result (computed
// from the same bf16-rounded inputs) rounded once to bf16. A looser tolerance would hide a wrong
// summation order, which is what the backward's determinism rests on.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/encoder.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::DeviceArray;

// A device copy of host int32s (token ids).
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

// What the device should hold for a CPU fp32 result: itself, or rounded once to bf16.
std::vector<float> Stored(const std::vector<float>& v, cuda::DType dt) {
  return dt == cuda::DType::kBF16 ? test::RoundBf16(v) : v;
}

void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": runs differ";
}

struct Shape {
  int B, T, C, V;
};
std::string Name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " V=" + std::to_string(s.V);
}
// Odd channel counts (partial 128-channel slices), T = 1, a vocabulary smaller than B*T (repeats), GPT-2 C.
const Shape kShapes[] = {{2, 5, 37, 97}, {1, 1, 768, 50}, {3, 17, 64, 11}, {4, 64, 768, 1000}, {2, 33, 130, 7}};

class EncoderCuda : public ::testing::TestWithParam<cuda::DType> {};

TEST_P(EncoderCuda, ForwardMatchesCpu) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  for (const Shape& s : kShapes) {
    const int max_t = s.T + 3;  // wpe has more rows than used
    const auto wte = Stored(test::RandomVector(size_t(s.V) * s.C, 0.02f, 1), dt);
    const auto wpe = Stored(test::RandomVector(size_t(max_t) * s.C, 0.01f, 2), dt);
    const auto inp = Tokens(size_t(s.B) * s.T, s.V, 3);
    DeviceArray dwte(wte, dt), dwpe(wpe, dt);
    DeviceInts dinp(inp);
    auto out = DeviceArray::Poisoned(size_t(s.B) * s.T * s.C, dt);
    ASSERT_TRUE(
        cuda::encoder_forward(out.data(), dinp.data(), dwte.data(), dwpe.data(), s.B, s.T, s.C, dt, nullptr).ok());
    std::vector<float> want(out.size());
    cpu::encoder_forward(want.data(), inp.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    test::ExpectClose(out.Download(), Stored(want, dt), 0.0, "encoder_forward " + Name(s));  // exact (one add)
  }
}

// Accumulates into random dwte/dwpe (the += contract) and matches the CPU exactly (see the top comment).
TEST_P(EncoderCuda, BackwardMatchesCpuAndAccumulates) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  for (const Shape& s : kShapes) {
    const int max_t = s.T + 3;
    auto dwte = Stored(test::RandomVector(size_t(s.V) * s.C, 0.5f, 4), dt);
    auto dwpe = Stored(test::RandomVector(size_t(max_t) * s.C, 0.5f, 5), dt);
    const auto dout = Stored(test::RandomVector(size_t(s.B) * s.T * s.C, 1.0f, 6), dt);
    const auto inp = Tokens(size_t(s.B) * s.T, s.V, 7);
    DeviceArray g_dwte(dwte, dt), g_dwpe(dwpe, dt), g_dout(dout, dt);
    DeviceInts g_inp(inp);
    ASSERT_TRUE(cuda::encoder_backward(g_dwte.data(), g_dwpe.data(), g_dout.data(), g_inp.data(), s.B, s.T, s.C, dt,
                                       nullptr)
                    .ok());
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), s.B, s.T, s.C);
    test::ExpectClose(g_dwte.Download(), Stored(dwte, dt), 0.0, "encoder_backward dwte " + Name(s));
    test::ExpectClose(g_dwpe.Download(), Stored(dwpe, dt), 0.0, "encoder_backward dwpe " + Name(s));
  }
}

// Hot tokens: every position holds one of 3 tokens (runs of thousands, several 32-entry chunks per
// run), or all the same token; a T = 1 batch. Exact match with the CPU, and two runs (one through
// the caller-provided scratch, one through the allocating overload) bit-identical.
TEST_P(EncoderCuda, BackwardRepeatedTokensDeterministic) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  const Shape shapes[] = {{8, 512, 768, 3}, {4, 300, 200, 1}, {64, 1, 37, 2}};
  for (const Shape& s : shapes) {
    const auto dwte0 = Stored(test::RandomVector(size_t(s.V) * s.C, 0.5f, 8), dt);
    const auto dwpe0 = Stored(test::RandomVector(size_t(s.T) * s.C, 0.5f, 9), dt);
    const auto dout = Stored(test::RandomVector(size_t(s.B) * s.T * s.C, 1.0f, 10), dt);
    const auto inp = Tokens(size_t(s.B) * s.T, s.V, 11);
    DeviceArray g_dout(dout, dt);
    DeviceInts g_inp(inp);

    auto bytes = cuda::encoder_backward_scratch_bytes(s.B, s.T);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto scratch = cuda::DeviceBuffer::Allocate(*bytes);
    ASSERT_TRUE(scratch.ok());
    // Too small a scratch is refused before any work (dout stands in for the untouched outputs).
    EXPECT_FALSE(cuda::encoder_backward(g_dout.data(), g_dout.data(), g_dout.data(), g_inp.data(), s.B, s.T, s.C, dt,
                                        scratch->data(), *bytes - 1, nullptr)
                     .ok());

    std::vector<float> runs[2][2];  // [run][dwte, dwpe]
    for (int run = 0; run < 2; ++run) {
      DeviceArray g_dwte(dwte0, dt), g_dwpe(dwpe0, dt);
      const Status st =
          run == 0 ? cuda::encoder_backward(g_dwte.data(), g_dwpe.data(), g_dout.data(), g_inp.data(), s.B, s.T, s.C,
                                            dt, scratch->data(), *bytes, nullptr)
                   : cuda::encoder_backward(g_dwte.data(), g_dwpe.data(), g_dout.data(), g_inp.data(), s.B, s.T, s.C,
                                            dt, nullptr);
      ASSERT_TRUE(st.ok()) << st.ToString();
      runs[run][0] = g_dwte.Download();
      runs[run][1] = g_dwpe.Download();
    }
    ExpectBitIdentical(runs[0][0], runs[1][0], "dwte " + Name(s));
    ExpectBitIdentical(runs[0][1], runs[1][1], "dwpe " + Name(s));

    auto dwte = dwte0, dwpe = dwpe0;
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), s.B, s.T, s.C);
    test::ExpectClose(runs[0][0], Stored(dwte, dt), 0.0, "encoder_backward dwte " + Name(s));
    test::ExpectClose(runs[0][1], Stored(dwpe, dt), 0.0, "encoder_backward dwpe " + Name(s));
  }
}

TEST_P(EncoderCuda, RejectsBadShapes) {
  TF_SKIP_WITHOUT_GPU();
  const cuda::DType dt = GetParam();
  EXPECT_FALSE(cuda::encoder_forward(nullptr, nullptr, nullptr, nullptr, -1, 4, 8, dt, nullptr).ok());
  EXPECT_FALSE(cuda::encoder_backward(nullptr, nullptr, nullptr, nullptr, 2, -4, 8, dt, nullptr).ok());
  EXPECT_FALSE(cuda::encoder_backward(nullptr, nullptr, nullptr, nullptr, 1 << 16, 1 << 16, 8, dt, nullptr).ok());
  // Empty shapes are no-ops.
  EXPECT_TRUE(cuda::encoder_forward(nullptr, nullptr, nullptr, nullptr, 0, 4, 8, dt, nullptr).ok());
  EXPECT_TRUE(cuda::encoder_backward(nullptr, nullptr, nullptr, nullptr, 2, 0, 8, dt, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, EncoderCuda, ::testing::Values(cuda::DType::kF32, cuda::DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

}  // namespace
}  // namespace tf
