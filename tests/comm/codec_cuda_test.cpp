// CUDA gradient codecs (comm/codec.cu) against the CPU codecs (comm/codec.cpp).
//
// Tolerance: none. Both backends evaluate the same comm/codec_math.h functions with correctly
// rounded fp32 operations, a fixed summation order for the sign scale, and explicit fmaf where a
// product meets an addition (codec_math.h states the rules), so the encoded bytes, the updated
// residuals and the accumulated decodes must be bit-identical. Inputs: gradient-like values of
// several odd sizes, with and without a residual; fp16/bf16 edge values (ties, subnormals,
// saturation, inf, NaN); top-k inputs full of ties; blocks that are all zero or hold a NaN.
// Device outputs are poisoned first, and the bytes just past EncodedBytes must stay poisoned.
// The argument checks need no device and run everywhere; the rest skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/codec.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using comm::CodecConfig;
using comm::CodecKind;

constexpr size_t kGuard = 64;  // poisoned bytes past the encoding
const char* const kSpecs[] = {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:0.3", "topk:1"};
const long kSizes[] = {1, 31, 255, 257, 1023, 1025, 4097, 100003, (1L << 20) + 7};

CodecConfig Parse(const std::string& spec) {
  auto c = comm::ParseCodec(spec);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : CodecConfig{};
}

// Gradient-like values whose scale changes every 100 elements, with zeros, an all-zero 256-block
// and (optionally) one NaN block.
std::vector<float> Inputs(long n, uint32_t seed, bool with_nan = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  float s = 1e-2f;
  for (long i = 0; i < n; ++i) {
    if (i % 100 == 0) s = 1e-2f * std::exp2(12.0f * u(rng) - 6.0f);
    v[i] = u(rng) < 0.02f ? 0.0f : s * normal(rng);
  }
  if (n >= 1024) std::fill(v.begin() + 512, v.begin() + 768, 0.0f);
  if (with_nan && n >= 2048) v[1500] = std::numeric_limits<float>::quiet_NaN();
  return v;
}

// Values whose magnitudes come from a set of four (top-k ties everywhere).
std::vector<float> Ties(long n, uint32_t seed) {
  std::mt19937 rng(seed);
  const float mags[] = {0.0f, 0.5f, 1.0f, 2.0f};
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = (rng() & 1 ? -1.0f : 1.0f) * mags[rng() % 4];
  return v;
}

// fp16/bf16 rounding edge cases followed by random bit patterns.
std::vector<float> HalfEdges(long n, uint32_t seed) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          1e9f,
                          0x1p-24f,
                          0x1p-25f,
                          0x1.000002p-25f,
                          0x1.8p-24f,
                          0x1.ffep-15f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min()};
  for (uint32_t base : {0x3f800000u, 0x3f810000u, 0x00010000u, 0x7f7f0000u}) {
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x1000u, 0x0fffu, 0x1001u, 0x3000u}) v.push_back(bits(base | low));
  }
  std::mt19937 rng(seed);
  while (static_cast<long>(v.size()) < n) v.push_back(bits(static_cast<uint32_t>(rng())));
  v.resize(static_cast<size_t>(n));
  return v;
}

// Device bytes: upload / download / fill.
cuda::DeviceBuffer Alloc(size_t bytes) {
  auto b = cuda::DeviceBuffer::Allocate(std::max<size_t>(bytes, 1));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : cuda::DeviceBuffer();
}
template <typename T>
cuda::DeviceBuffer Upload(const std::vector<T>& h) {
  cuda::DeviceBuffer d = Alloc(h.size() * sizeof(T));
  EXPECT_EQ(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <typename T>
std::vector<T> Download(const cuda::DeviceBuffer& d, size_t count) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> h(count);
  EXPECT_EQ(cudaMemcpy(h.data(), d.data(), count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// First differing byte, or -1.
long FirstDifference(const void* a, const void* b, size_t bytes) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < bytes; ++i) {
    if (x[i] != y[i]) return static_cast<long>(i);
  }
  return -1;
}

// Encodes x (with residual r0, or none when r0 is empty) on both backends and compares the bytes and
// residuals; then decode-accumulates the encoding on both and compares the accumulators.
void CompareBackends(const std::string& spec, const CodecConfig& c, const std::vector<float>& x,
                     const std::vector<float>& r0, uint64_t seed) {
  const long n = static_cast<long>(x.size());
  const size_t bytes = comm::EncodedBytes(c, n);
  const bool with_residual = !r0.empty();
  const std::string what = spec + " n=" + std::to_string(n) + (with_residual ? " residual" : "");

  std::vector<float> r_cpu = r0;
  std::vector<uint8_t> enc_cpu(bytes + kGuard, 0xAB);
  comm::Encode(c, x.data(), with_residual ? r_cpu.data() : nullptr, n, enc_cpu.data(), seed);

  cuda::DeviceBuffer dx = Upload(x);
  cuda::DeviceBuffer dr = with_residual ? Upload(r0) : cuda::DeviceBuffer();
  cuda::DeviceBuffer dout = Alloc(bytes + kGuard);
  ASSERT_EQ(cudaMemset(dout.data(), 0xAB, bytes + kGuard), cudaSuccess);
  const Status st =
      comm::cuda::Encode(c, dx.as<float>(), with_residual ? dr.as<float>() : nullptr, n, dout.data(), seed, nullptr);
  ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
  const auto enc_gpu = Download<uint8_t>(dout, bytes + kGuard);
  const long diff = FirstDifference(enc_cpu.data(), enc_gpu.data(), bytes + kGuard);
  ASSERT_EQ(diff, -1) << what << ": encodings differ first at byte " << diff << " of " << bytes << " (cpu "
                      << int(enc_cpu[diff]) << ", gpu " << int(enc_gpu[diff]) << ")";
  if (with_residual) {
    const auto r_gpu = Download<float>(dr, static_cast<size_t>(n));
    const long rd = FirstDifference(r_cpu.data(), r_gpu.data(), n * sizeof(float));
    ASSERT_EQ(rd, -1) << what << ": residuals differ first at element " << rd / 4 << " (cpu " << r_cpu[rd / 4]
                      << ", gpu " << r_gpu[rd / 4] << ")";
  }

  // Decode-accumulate the same bytes into the same random accumulator, scale -0.75.
  const std::vector<float> acc0 = test::RandomVector(static_cast<size_t>(n), 1e-2f, 77);
  std::vector<float> acc_cpu = acc0;
  comm::DecodeAccumulate(c, enc_cpu.data(), n, -0.75f, acc_cpu.data());
  cuda::DeviceBuffer dacc = Upload(acc0);
  const Status st2 = comm::cuda::DecodeAccumulate(c, dout.data(), n, -0.75f, dacc.as<float>(), nullptr);
  ASSERT_TRUE(st2.ok()) << what << ": " << st2.ToString();
  const auto acc_gpu = Download<float>(dacc, static_cast<size_t>(n));
  const long ad = FirstDifference(acc_cpu.data(), acc_gpu.data(), n * sizeof(float));
  ASSERT_EQ(ad, -1) << what << ": decode-accumulate differs first at element " << ad / 4 << " (cpu " << acc_cpu[ad / 4]
                    << ", gpu " << acc_gpu[ad / 4] << ")";
}

TEST(CodecCuda, SameBytesAndResidualsAsCpu) {
  TF_SKIP_WITHOUT_GPU();
  for (const char* spec : kSpecs) {
    const CodecConfig c = Parse(spec);
    for (long n : kSizes) {
      const auto x = Inputs(n, 1 + static_cast<uint32_t>(n));
      CompareBackends(spec, c, x, {}, 42);
      CompareBackends(spec, c, x, Inputs(n, 2 + static_cast<uint32_t>(n)), 43);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CodecCuda, EdgeValuesTiesAndNonFiniteBlocks) {
  TF_SKIP_WITHOUT_GPU();
  for (const char* spec : {"bf16", "fp16"}) {
    for (long n : {100L, 100003L}) CompareBackends(spec, Parse(spec), HalfEdges(n, 5), {}, 0);
  }
  for (const char* spec : {"topk:0.01", "topk:0.3", "topk:0.9"}) {
    for (long n : {1L, 1023L, 1025L, 100003L}) {
      CompareBackends(spec, Parse(spec), Ties(n, 6), {}, 0);
      CompareBackends(spec, Parse(spec), Ties(n, 7), Ties(n, 8), 0);
    }
  }
  for (const char* spec : {"int8", "int8-sr", "sign", "topk:0.05"}) {
    CompareBackends(spec, Parse(spec), Inputs(5000, 9, /*with_nan=*/true), Inputs(5000, 10), 3);
  }
}

TEST(CodecCuda, OtherBlockAndChunkSizes) {
  TF_SKIP_WITHOUT_GPU();
  for (const char* spec : {"int8", "int8-sr", "sign"}) {
    for (int block : {32, 96, 4096}) {
      CodecConfig c = Parse(spec);
      c.block = block;
      for (long n : {1L, 1000L, 100003L}) CompareBackends(spec, c, Inputs(n, 11), Inputs(n, 12), 5);
    }
  }
  for (int chunk : {1, 7, 100, 1000, 4096}) {
    CodecConfig c = Parse("topk:0.2");
    c.topk_chunk = chunk;
    for (long n : {1L, 5L, 1025L, 9000L}) CompareBackends("topk:0.2", c, Inputs(n, 13), Inputs(n, 14), 0);
  }
}

// Error feedback over several steps stays identical on both backends (the residual carries over).
TEST(CodecCuda, ErrorFeedbackStepsStayIdentical) {
  TF_SKIP_WITHOUT_GPU();
  const long n = 100003;
  for (const char* spec : kSpecs) {
    const CodecConfig c = Parse(spec);
    const size_t bytes = comm::EncodedBytes(c, n);
    std::vector<float> r(static_cast<size_t>(n), 0.0f);
    cuda::DeviceBuffer dr = Upload(r);
    cuda::DeviceBuffer dout = Alloc(bytes);
    std::vector<uint8_t> enc(bytes);
    for (int step = 0; step < 4; ++step) {
      const auto x = Inputs(n, 100 + step);
      comm::Encode(c, x.data(), r.data(), n, enc.data(), step);
      cuda::DeviceBuffer dx = Upload(x);
      ASSERT_TRUE(comm::cuda::Encode(c, dx.as<float>(), dr.as<float>(), n, dout.data(), step, nullptr).ok());
    }
    EXPECT_EQ(FirstDifference(enc.data(), Download<uint8_t>(dout, bytes).data(), bytes), -1) << spec;
    EXPECT_EQ(FirstDifference(r.data(), Download<float>(dr, n).data(), n * sizeof(float)), -1) << spec;
  }
}

// Argument checks happen before any CUDA call, so this runs without a device too.
TEST(CodecCuda, RejectsInvalidArguments) {
  float dummy = 0;
  CodecConfig c = Parse("int8");
  c.block = 100;
  EXPECT_EQ(comm::cuda::Encode(c, &dummy, nullptr, 1, &dummy, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm::cuda::DecodeAccumulate(c, &dummy, 1, 1.0f, &dummy, nullptr).code(), StatusCode::kInvalidArgument);
  c = Parse("topk:0.1");
  c.topk_chunk = 5000;
  EXPECT_EQ(comm::cuda::Encode(c, &dummy, nullptr, 1, &dummy, 0, nullptr).code(), StatusCode::kInvalidArgument);
  c = Parse("bf16");
  EXPECT_EQ(comm::cuda::Encode(c, &dummy, nullptr, -1, &dummy, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm::cuda::Encode(c, nullptr, nullptr, 10, &dummy, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm::cuda::DecodeAccumulate(c, &dummy, 10, 1.0f, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  c = Parse("topk:0.1");
  EXPECT_EQ(comm::cuda::Encode(c, &dummy, nullptr, 1L << 33, &dummy, 0, nullptr).code(), StatusCode::kInvalidArgument);
  // n = 0 is a no-op, whatever the pointers.
  EXPECT_TRUE(comm::cuda::Encode(c, nullptr, nullptr, 0, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace tf
