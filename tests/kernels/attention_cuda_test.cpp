// CUDA causal self-attention (kernels/attention.cu) against the CPU backend (kernels/attention.cpp),
// fp32 and bf16 (test::ExpectClose: relative, with the tensor's RMS as a floor).
//  * fp32, 1e-4: fp32 GEMMs over at most 256 terms differ only in summation order (~1e-6) and the
//    softmax runs the same math::fast_exp; still catches TF32 (~5e-4).
//  * bf16: inputs, outputs, P (att) and dS are stored in bf16 (2^-9 per rounding); the CPU gets the
//    same rounded inputs and the device's att for its backward. att: 1e-2 per element. out and
//    dqkv: test::ExpectAttentionClose, the flash tests' rule (normwise < 1e-2; per element 2e-2
//    forward, 5e-2 backward), since sums with bf16-rounded P and cancelling dS rows push single
//    small entries past 1e-2 (seen in the emulator: 2 of 49k dqkv entries at 2.0e-2 at B=2 T=64
//    C=128, 5 of 197k outputs above 1e-2 at B=1 T=256 C=768).
// Outputs are NaN-poisoned: every element of out, att (upper triangle included) and dqkv must be
// written.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using cuda::DType;
using test::DeviceArray;

struct Shape {
  int B, T, C, NH;
};
std::string Name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " NH=" + std::to_string(s.NH);
}

// T = 1 (a single key), odd T and head sizes (hs = 1, 4, 32), T not a multiple of a warp, and
// GPT-2's head size 64 with 12 heads.
const std::vector<Shape> kShapes = {{1, 1, 3, 3},    {2, 1, 12, 3},  {2, 7, 12, 3},    {1, 7, 6, 3},
                                    {3, 33, 96, 3},  {2, 64, 128, 2}, {1, 256, 768, 12}};

double Tol(DType dt) { return dt == DType::kF32 ? 1e-4 : 1e-2; }

std::vector<float> Random(size_t n, float scale, uint32_t seed, DType dt) {
  auto v = test::RandomVector(n, scale, seed);
  return dt == DType::kBF16 ? test::RoundBf16(v) : v;
}

class AttentionCuda : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionCuda, ForwardAndBackwardMatchCpu) {
  TF_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto ctx = cuda::CublasContext::Create(nullptr);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  for (const Shape& s : kShapes) {
    const std::string what = Name(s);
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const size_t n_att = size_t(s.B) * s.NH * s.T * s.T;
    const auto qkv = Random(n_qkv, 1.0f, 1, dt);  // scores q.k / sqrt(hs) ~ N(0, 1)
    const auto dout = Random(n_out, 1.0f, 2, dt);

    auto scratch = cuda::DeviceBuffer::Allocate(cuda::attention_scratch_bytes(s.B, s.T, s.C, s.NH, dt));
    ASSERT_TRUE(scratch.ok()) << scratch.status().ToString();
    ASSERT_EQ(cudaMemset(scratch->data(), 0xff, scratch->bytes()), cudaSuccess);  // NaN in fp32 and bf16

    // Forward.
    std::vector<float> want_out(n_out), want_att(n_att);
    cpu::attention_forward(want_out.data(), want_att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    DeviceArray d_qkv(qkv, dt), d_dout(dout, dt);
    auto out = DeviceArray::Poisoned(n_out, dt), att = DeviceArray::Poisoned(n_att, dt);
    Status st = cuda::attention_forward(*ctx, out.data(), att.data(), d_qkv.data(), s.B, s.T, s.C, s.NH, dt,
                                        scratch->data());
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    const auto got_att = att.Download();
    test::ExpectAttentionClose(out.Download(), want_out, dt == DType::kBF16, Tol(dt), 2e-2,
                               "attention_forward out " + what);
    test::ExpectClose(got_att, want_att, Tol(dt), "attention_forward att " + what);

    // Backward, both sides from the device's probabilities.
    std::vector<float> want_dqkv(n_qkv);
    std::vector<float> cpu_scratch(cpu::attention_scratch_floats(s.T));
    cpu::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), got_att.data(), s.B, s.T, s.C, s.NH,
                            cpu_scratch.data(), long(cpu_scratch.size()));
    auto dqkv = DeviceArray::Poisoned(n_qkv, dt);
    st = cuda::attention_backward(*ctx, dqkv.data(), d_dout.data(), d_qkv.data(), att.data(), s.B, s.T, s.C, s.NH, dt,
                                  scratch->data());
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    test::ExpectAttentionClose(dqkv.Download(), want_dqkv, dt == DType::kBF16, Tol(dt), 5e-2,
                               "attention_backward dqkv " + what);
  }
}

TEST_P(AttentionCuda, RejectsBadArguments) {
  TF_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto ctx = cuda::CublasContext::Create(nullptr);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto scratch = cuda::DeviceBuffer::Allocate(cuda::attention_scratch_bytes(1, 4, 8, 2, dt));
  ASSERT_TRUE(scratch.ok());
  DeviceArray buf(std::vector<float>(1024, 0.0f), dt);
  void* p = buf.data();
  EXPECT_EQ(cuda::attention_forward(*ctx, p, p, p, 1, 4, 9, 2, dt, scratch->data()).code(),
            StatusCode::kInvalidArgument);  // C % NH != 0
  EXPECT_EQ(cuda::attention_forward(*ctx, p, p, p, 1, 0, 8, 2, dt, scratch->data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::attention_forward(*ctx, p, p, p, 1, 4, 8, 2, dt, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::attention_backward(*ctx, p, p, p, nullptr, 1, 4, 8, 2, dt, scratch->data()).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(DTypes, AttentionCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(cuda::DTypeName(info.param)); });

// Host-only (runs without a GPU): the scratch covers the regions the kernels use.
TEST(AttentionCudaScratch, Size) {
  // fp32, B=2 T=7 C=12 NH=3: seven (B,T,C) regions of 168 floats (672 B -> 768 B aligned) and the
  // (B,NH,T,T) fp32 scores (294 floats, 1176 B -> 1280 B).
  EXPECT_EQ(cuda::attention_scratch_bytes(2, 7, 12, 3, DType::kF32), 7u * 768 + 1280);
  // bf16 adds the bf16 dS region (588 B -> 768 B) and halves the head regions (336 B -> 512 B).
  EXPECT_EQ(cuda::attention_scratch_bytes(2, 7, 12, 3, DType::kBF16), 7u * 512 + 1280 + 768);
  EXPECT_EQ(cuda::attention_scratch_bytes(0, 7, 12, 3, DType::kF32), 0u);
}

}  // namespace
}  // namespace tf
