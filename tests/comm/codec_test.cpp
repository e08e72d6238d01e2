// Tests for the CPU gradient codecs (comm/codec.h) against float64 references written here from the
// documented definitions (docs/compression.md), sharing no code with comm/codec_math.h: the encoded
// buffers are parsed with the documented layouts, and every decoded value is checked against a
// reference computed in double.
//
// What is checked, for every codec and odd sizes (n = 1, 255, 257, 1023, 1025, 100003):
//  * bf16 / fp16: bit-exact rounding (nearest even, subnormals, saturation, inf/NaN rules) on edge
//    cases and on random bit patterns; fp16 decode of all 65536 codes.
//  * int8: the scale rule, |y - dec| <= scale/2 (nearest) and < scale (stochastic), zero and
//    non-finite blocks, stochastic rounding unbiased over many seeds.
//  * sign: bits and scales (mean |y| of each block, its own length for the last one).
//  * topk: the selected indices equal a brute-force sort's (ties, partial last chunk), values are y.
//  * error feedback: sum of decoded values + final residual == sum of inputs (see ErrorFeedback).
//  * DecodeAccumulate accumulates with a scale; Encode writes exactly EncodedBytes bytes (all of
//    them, and nothing past them); ParseCodec / CodecName / ValidateCodec; results independent of
//    the OpenMP thread count.
#include "comm/codec.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace tf::comm {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of fp32
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::vector<int64_t> kSizes = {1, 255, 257, 1023, 1025, 100003};

CodecConfig Parse(const std::string& spec) {
  auto c = ParseCodec(spec);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : CodecConfig{};
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool SameFloat(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Gradient-like values: normal with a scale that changes every 100 elements (so int8/sign blocks
// see different ranges), some exact zeros.
std::vector<float> Gradients(int64_t n, uint32_t seed, float scale = 1e-2f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  float s = scale;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 100 == 0) s = scale * std::exp2(8.0f * u(rng) - 4.0f);
    v[i] = u(rng) < 0.02f ? 0.0f : s * normal(rng);
  }
  return v;
}

// ---- References (float64) --------------------------------------------------------------------

// x rounded to a binary format with `mant` fraction bits and smallest normal exponent `emin`
// (unbounded exponent above), nearest, ties to even, computed exactly in double.
double RoundToFormat(double x, int mant, int emin) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 1, emin) - mant);
  const double r = std::fabs(x) / quantum;  // exact: power-of-two scaling
  double q = std::floor(r);
  const double frac = r - q;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(q, 2.0) == 1.0)) q += 1.0;
  return std::copysign(q * quantum, x);
}
// bf16: overflow past the largest finite value goes to inf.
double Bf16Ref(float x) {
  const double v = RoundToFormat(x, 7, -126);
  const double max = std::ldexp(2.0 - std::ldexp(1.0, -7), 127);
  return std::fabs(v) > max ? std::copysign(INFINITY, v) : v;
}
// fp16: finite values saturate at +-65504; inf stays inf.
double Fp16Ref(float x) {
  if (std::isinf(x)) return x;
  const double v = RoundToFormat(x, 10, -14);
  return std::fabs(v) > 65504.0 ? std::copysign(65504.0, v) : v;
}
double Fp16DecodeRef(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m == 0 ? s * INFINITY : NAN;
  if (e == 0) return s * m * std::ldexp(1.0, -24);
  return s * (1.0 + m / 1024.0) * std::ldexp(1.0, e - 15);
}

std::vector<uint8_t> EncodeBytes(const CodecConfig& c, const std::vector<float>& x, std::vector<float>* r,
                                 uint64_t seed = 0) {
  std::vector<uint8_t> out(EncodedBytes(c, static_cast<int64_t>(x.size())), 0xAB);
  Encode(c, x.data(), r != nullptr ? r->data() : nullptr, static_cast<int64_t>(x.size()), out.data(), seed);
  return out;
}
// Decoded values through DecodeAccumulate with scale 1 into -0.0, the additive identity that keeps
// the sign of zero (fmaf(1, v, -0) = v for every v, -0 included).
std::vector<float> DecodeBytes(const CodecConfig& c, const std::vector<uint8_t>& in, int64_t n) {
  std::vector<float> acc(static_cast<size_t>(n), -0.0f);
  DecodeAccumulate(c, in.data(), n, 1.0f, acc.data());
  return acc;
}

// The documented layouts, read back.
template <typename T>
T Read(const std::vector<uint8_t>& b, size_t offset) {
  T v;
  std::memcpy(&v, b.data() + offset, sizeof(T));
  return v;
}
struct ScaledLayout {  // int8, sign: fp32 scales (one per block), then the codes
  std::vector<float> scales;
  size_t codes_offset;
};
ScaledLayout ReadScales(const CodecConfig& c, const std::vector<uint8_t>& b, int64_t n) {
  ScaledLayout l;
  const int64_t nb = CeilDiv(n, c.block);
  for (int64_t i = 0; i < nb; ++i) l.scales.push_back(Read<float>(b, 4 * i));
  l.codes_offset = 4 * nb;
  return l;
}
// Reference decode of an int8 / sign / topk buffer from the layout (double).
std::vector<double> ReferenceDecode(const CodecConfig& c, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<double> d(static_cast<size_t>(n), 0.0);
  if (c.kind == CodecKind::kTopK) {
    const int64_t pairs = static_cast<int64_t>(b.size() / 8);
    for (int64_t p = 0; p < pairs; ++p) d[Read<uint32_t>(b, 4 * p)] = Read<float>(b, 4 * (pairs + p));
    return d;
  }
  const ScaledLayout l = ReadScales(c, b, n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = l.scales[i / c.block];
    if (c.kind == CodecKind::kInt8) {
      d[i] = static_cast<int8_t>(b[l.codes_offset + i]) * s;
    } else {
      const bool neg = (Read<uint32_t>(b, l.codes_offset + 4 * (i / 32)) >> (i % 32)) & 1u;
      d[i] = neg ? -s : s;
    }
  }
  return d;
}

// Entries sent from a chunk of len elements: max(1, round(D len)), half away from zero.
int64_t KRef(double density, int64_t len) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::round(density * len)));
}

// Brute force: indices of the sent entries, in increasing order.
std::vector<uint32_t> TopKRef(const std::vector<float>& y, double density, int64_t chunk) {
  std::vector<uint32_t> sent;
  const int64_t n = static_cast<int64_t>(y.size());
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t len = std::min(chunk, n - i0);
    std::vector<int64_t> idx(static_cast<size_t>(len));
    std::iota(idx.begin(), idx.end(), i0);
    std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
      const double ma = std::fabs(double(y[a])), mb = std::fabs(double(y[b]));
      return ma != mb ? ma > mb : a < b;
    });
    idx.resize(static_cast<size_t>(KRef(density, len)));
    std::sort(idx.begin(), idx.end());
    for (int64_t i : idx) sent.push_back(static_cast<uint32_t>(i));
  }
  return sent;
}

// ---- ParseCodec / CodecName / sizes --------------------------------------------------------

TEST(CodecSpec, ParsesDocumentedForms) {
  EXPECT_EQ(Parse("none").kind, CodecKind::kNone);
  EXPECT_EQ(Parse("bf16").kind, CodecKind::kBF16);
  EXPECT_EQ(Parse("fp16").kind, CodecKind::kFP16);
  EXPECT_EQ(Parse("int8").kind, CodecKind::kInt8);
  EXPECT_FALSE(Parse("int8").stochastic);
  EXPECT_TRUE(Parse("int8-sr").stochastic);
  EXPECT_EQ(Parse("sign").kind, CodecKind::kSign);
  EXPECT_EQ(Parse("topk:0.01").kind, CodecKind::kTopK);
  EXPECT_EQ(Parse("topk:0.01").density, 0.01);
  EXPECT_EQ(Parse("topk:1").density, 1.0);
  EXPECT_EQ(Parse("topk:1e-3").density, 1e-3);
  EXPECT_EQ(Parse("topk:.25").density, 0.25);
  EXPECT_FALSE(Parse("none").lossy());
  EXPECT_TRUE(Parse("topk:0.5").sparse());
  for (const char* spec :
       {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:1", "topk:0.001", "topk:0.3"}) {
    EXPECT_EQ(CodecName(Parse(spec)), spec);
  }
  // CodecName is the inverse of ParseCodec for densities that print in any form.
  for (double d : {1e-5, 0.1 + 0.2, 1.0 / 3.0}) {
    CodecConfig c;
    c.kind = CodecKind::kTopK;
    c.density = d;
    EXPECT_EQ(Parse(CodecName(c)).density, d) << CodecName(c);
  }
}

TEST(CodecSpec, RejectsBadFormsNamingTheSpec) {
  for (const char* spec : {"topk:0", "topk:1.5", "topk:abc", "int4", "", "topk", "topk:", "topk:-0.1", "topk:nan",
                           "topk:inf", "topk:0.1x", "topk: 0.1", " bf16", "BF16", "int8-SR", "sign "}) {
    auto c = ParseCodec(spec);
    ASSERT_FALSE(c.ok()) << "'" << spec << "' was accepted";
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    const std::string quoted =
        fmt::format("'{}'", spec);  // (not "'" + std::string: GCC 12's -Wrestrict false positive)
    EXPECT_NE(c.status().message().find(quoted), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("topk:D"), std::string::npos) << c.status().message();
  }
}

TEST(CodecSpec, ValidateCodec) {
  for (const char* spec : {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01"}) {
    EXPECT_TRUE(ValidateCodec(Parse(spec)).ok()) << spec;
  }
  CodecConfig c = Parse("int8");
  for (int block : {0, 16, 100, -32, (1 << 16) + 32}) {
    c.block = block;
    EXPECT_FALSE(ValidateCodec(c).ok()) << block;
  }
  for (int block : {32, 64, 96, 1 << 16}) {
    c.block = block;
    EXPECT_TRUE(ValidateCodec(c).ok()) << block;
  }
  c = Parse("topk:0.1");
  for (int chunk : {0, -1, 4097}) {
    c.topk_chunk = chunk;
    EXPECT_FALSE(ValidateCodec(c).ok()) << chunk;
  }
  c.topk_chunk = 1024;
  c.density = 0.0;
  EXPECT_FALSE(ValidateCodec(c).ok());
}

TEST(CodecSpec, EncodedBytesAndRatios) {
  for (int64_t n : kSizes) {
    const int64_t nb = CeilDiv(n, 256);
    EXPECT_EQ(EncodedBytes(Parse("none"), n), size_t(4 * n));
    EXPECT_EQ(EncodedBytes(Parse("bf16"), n), size_t(2 * n));
    EXPECT_EQ(EncodedBytes(Parse("fp16"), n), size_t(2 * n));
    EXPECT_EQ(EncodedBytes(Parse("int8"), n), size_t(4 * nb + 4 * CeilDiv(n, 4)));
    EXPECT_EQ(EncodedBytes(Parse("sign"), n), size_t(4 * nb + 4 * CeilDiv(n, 32)));
    const int64_t pairs = (n / 1024) * KRef(0.01, 1024) + (n % 1024 ? KRef(0.01, n % 1024) : 0);
    EXPECT_EQ(TopKPairs(Parse("topk:0.01"), n), pairs);
    EXPECT_EQ(EncodedBytes(Parse("topk:0.01"), n), size_t(8 * pairs));
  }
  EXPECT_EQ(EncodedBytes(Parse("int8"), 0), 0u);
  EXPECT_EQ(TopKPairs(Parse("int8"), 100), 0);
  const int64_t n = 1 << 20;
  EXPECT_DOUBLE_EQ(CompressionRatio(Parse("none"), n), 1.0);
  EXPECT_DOUBLE_EQ(CompressionRatio(Parse("bf16"), n), 2.0);
  EXPECT_DOUBLE_EQ(CompressionRatio(Parse("int8"), n), 4.0 / (1.0 + 4.0 / 256));
  EXPECT_DOUBLE_EQ(CompressionRatio(Parse("sign"), n), 32.0 / (1.0 + 32.0 / 256));
  EXPECT_DOUBLE_EQ(CompressionRatio(Parse("topk:0.01"), n), 4.0 * 1024 / (8.0 * 10));
  EXPECT_DOUBLE_EQ(CompressionRatio(Parse("bf16"), 0), 1.0);
}

// ---- bf16 / fp16 ---------------------------------------------------------------------------

// Edge cases: ties (both parities), values next to ties, subnormals of both formats, the largest
// finite values, overflow, inf, NaN, signed zeros.
std::vector<float> HalfEdgeCases() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          kInf,
                          -kInf,
                          kNaN,
                          -kNaN,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          65504.0f,
                          65519.0f,
                          65519.996f,
                          65520.0f,
                          -65520.0f,
                          65536.0f,
                          1e5f,
                          -1e9f,
                          0x1p-14f,
                          0x1p-24f,
                          0x1p-25f,
                          -0x1p-25f,
                          0x1.000002p-25f,
                          0x1.8p-24f,
                          0x1.4p-23f,
                          0x1.ffcp-15f,
                          0x1.ffep-15f,
                          0x1.fffp-15f,
                          3e-8f,
                          6e-8f,
                          1e-30f};
  // Ties and their neighbours at bf16 (bit 15) and fp16 (bit 12) rounding positions, odd and even.
  for (uint32_t base : {0x3f800000u, 0x3f810000u, 0x40490000u, 0x7f7f0000u, 0x00010000u, 0x3c000000u}) {
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x1000u, 0x0fffu, 0x1001u, 0x3000u, 0xffffu}) {
      v.push_back(FromBits(base | low));
      v.push_back(-FromBits(base | low));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(FromBits(static_cast<uint32_t>(rng())));  // all exponents
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 50000; ++i) v.push_back(small(rng) * std::exp2(-static_cast<float>(rng() % 40)));
  return v;
}

void CheckHalfCodec(const char* spec, double (*ref)(float), uint16_t nan_bits) {
  const CodecConfig c = Parse(spec);
  const std::vector<float> x = HalfEdgeCases();
  const auto enc = EncodeBytes(c, x, nullptr);
  const auto dec = DecodeBytes(c, enc, static_cast<int64_t>(x.size()));
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = Read<uint16_t>(enc, 2 * i);
    if (std::isnan(x[i])) {
      EXPECT_EQ(h, nan_bits | (std::signbit(x[i]) ? 0x8000 : 0)) << spec << " NaN";
      EXPECT_TRUE(std::isnan(dec[i]));
      continue;
    }
    const double want = ref(x[i]);
    if (!SameFloat(dec[i], want) && bad++ < 10) {
      ADD_FAILURE() << spec << ": x = " << x[i] << " (0x" << std::hex << Bits(x[i]) << std::dec << ") -> " << dec[i]
                    << " (0x" << std::hex << h << std::dec << "), want " << want;
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(CodecHalf, Bf16RoundsToNearestEvenBitExact) {
  CheckHalfCodec("bf16", Bf16Ref, 0x7fc0);
  // A few encodings by hand.
  const CodecConfig c = Parse("bf16");
  const std::vector<float> x = {1.0f,
                                FromBits(0x3f808000u),
                                FromBits(0x3f818000u),
                                FromBits(0x3f808001u),
                                kInf,
                                std::numeric_limits<float>::max()};
  const auto enc = EncodeBytes(c, x, nullptr);
  const std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x7f80};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(Read<uint16_t>(enc, 2 * i), want[i]) << i;
}

TEST(CodecHalf, Fp16RoundsToNearestEvenSaturatesBitExact) {
  CheckHalfCodec("fp16", Fp16Ref, 0x7e00);
  const CodecConfig c = Parse("fp16");
  const std::vector<float> x = {1.0f,     65504.0f,        65519.0f,   65520.0f,   1e30f,    -kInf, 0x1p-24f,
                                0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f, 0x1.4p-23f, 0x1p-14f, -0.0f, 0x1.ffep-15f};
  const std::vector<uint16_t> want = {0x3c00, 0x7bff, 0x7bff, 0x7bff, 0x7bff, 0xfc00, 0x0001,
                                      0x0000, 0x0001, 0x0002, 0x0002, 0x0400, 0x8000, 0x0400};
  const auto enc = EncodeBytes(c, x, nullptr);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(Read<uint16_t>(enc, 2 * i), want[i]) << "x = " << x[i];
}

TEST(CodecHalf, Fp16DecodesEveryCodeAndRoundTrips) {
  const CodecConfig c = Parse("fp16");
  std::vector<uint8_t> enc(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) std::memcpy(enc.data() + 2 * h, &h, 2);
  const auto dec = DecodeBytes(c, enc, 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_TRUE(SameFloat(dec[h], Fp16DecodeRef(static_cast<uint16_t>(h)))) << std::hex << h;
  }
  // Every non-NaN code is a fixed point of encode(decode(.)).
  const auto again = EncodeBytes(c, dec, nullptr);
  for (uint32_t h = 0; h < 65536; ++h) {
    if (!std::isnan(dec[h])) {
      ASSERT_EQ(Read<uint16_t>(again, 2 * h), h) << std::hex << h;
    }
  }
}

// ---- int8 ------------------------------------------------------------------------------------

void CheckInt8(const CodecConfig& c, const std::vector<float>& x, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(x.size());
  const auto enc = EncodeBytes(c, x, nullptr, seed);
  const ScaledLayout l = ReadScales(c, enc, n);
  const auto dec = DecodeBytes(c, enc, n);
  const auto ref = ReferenceDecode(c, enc, n);
  for (int64_t b = 0; b < CeilDiv(n, c.block); ++b) {
    const int64_t i0 = b * c.block, i1 = std::min(n, i0 + c.block);
    double absmax = 0;
    for (int64_t i = i0; i < i1; ++i) absmax = std::max(absmax, std::fabs(double(x[i])));
    const double s = l.scales[b];
    // scale = absmax / 127 rounded up to 17 significant bits: in [absmax/127, absmax/127 (1 + 2^-16)].
    ASSERT_GE(s, absmax / 127 * (1 - kU)) << "block " << b;
    ASSERT_LE(s, absmax / 127 * (1 + 0x1p-16) * (1 + kU)) << "block " << b;
    ASSERT_EQ(Bits(l.scales[b]) & 0x7f, 0u) << "scale has more than 17 significant bits";
    for (int64_t i = i0; i < i1; ++i) {
      const int code = static_cast<int8_t>(enc[l.codes_offset + i]);
      ASSERT_LE(std::abs(code), 127);
      ASSERT_EQ(dec[i], ref[i]) << "i = " << i;  // code * scale is exact in fp32
      // Error bounds; the slack covers the fp32 rounding of y / scale (relative 2^-24 of <= 127).
      const double err = std::fabs(double(x[i]) - ref[i]);
      if (c.stochastic) {
        ASSERT_LT(err, s * (1 + 1e-5)) << "i = " << i << " x = " << x[i] << " code " << code;
      } else {
        ASSERT_LE(err, s * (0.5 + 1e-5)) << "i = " << i << " x = " << x[i] << " code " << code;
      }
    }
    if (absmax == 0) {
      EXPECT_EQ(s, 0.0);
      for (int64_t i = i0; i < i1; ++i) EXPECT_EQ(enc[l.codes_offset + i], 0);
    }
  }
  for (size_t p = l.codes_offset + n; p < enc.size(); ++p) EXPECT_EQ(enc[p], 0) << "padding byte " << p;
}

TEST(CodecInt8, NearestWithinHalfAScale) {
  for (int64_t n : kSizes) {
    auto x = Gradients(n, 10 + static_cast<uint32_t>(n));
    if (n > 600) std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
    CheckInt8(Parse("int8"), x, 0);
  }
  // The extreme element of a block encodes to +-127 exactly (the scale never clips it).
  CodecConfig c = Parse("int8");
  c.block = 32;
  std::vector<float> x(32, 0.25f);
  x[5] = -3.0f;
  const auto enc = EncodeBytes(c, x, nullptr);
  EXPECT_EQ(static_cast<int8_t>(enc[4 + 5]), -127);
  EXPECT_EQ(static_cast<int8_t>(enc[4 + 0]), 11);  // 0.25 / (3/127) = 10.58
}

TEST(CodecInt8, StochasticWithinAScaleAndDeterministicPerSeed) {
  for (int64_t n : kSizes) CheckInt8(Parse("int8-sr"), Gradients(n, 20 + static_cast<uint32_t>(n)), 1234);
  const auto x = Gradients(5000, 3);
  const CodecConfig c = Parse("int8-sr");
  EXPECT_EQ(EncodeBytes(c, x, nullptr, 7), EncodeBytes(c, x, nullptr, 7));
  EXPECT_NE(EncodeBytes(c, x, nullptr, 7), EncodeBytes(c, x, nullptr, 8));
}

TEST(CodecInt8, StochasticRoundingIsUnbiased) {
  // One block of 256 values spread over (-1, 1) and its max 1; over S seeds the mean decoded value
  // of each element must approach x: the rounding error of one draw has mean 0 and standard
  // deviation <= scale/2, so the mean over S draws is within 5 (scale/2)/sqrt(S) with overwhelming
  // probability (a failure would be a ~6e-7 event per element). The average signed error over all
  // elements (no cancellation expected from a biased rounding) must be within 5 sigma / sqrt(256 S).
  const CodecConfig c = Parse("int8-sr");
  const int64_t n = 256;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  x[0] = 1.0f;
  const int S = 4000;
  std::vector<double> mean(n, 0.0);
  double scale = 0;
  for (int s = 0; s < S; ++s) {
    const auto enc = EncodeBytes(c, x, nullptr, static_cast<uint64_t>(s) * 7919 + 1);
    scale = Read<float>(enc, 0);
    const auto dec = DecodeBytes(c, enc, n);
    for (int64_t i = 0; i < n; ++i) mean[i] += dec[i] / S;
  }
  const double sigma = scale / 2 / std::sqrt(double(S));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(mean[i], x[i], 5 * sigma) << "i = " << i;
    total += mean[i] - x[i];
  }
  EXPECT_NEAR(total / n, 0.0, 5 * sigma / std::sqrt(double(n)));
  // Nearest rounding, by contrast, is deterministic: its error is the same for every seed.
}

TEST(CodecInt8, NonFiniteInputPoisonsOnlyItsBlock) {
  for (float bad : {kNaN, kInf, -kInf}) {
    auto x = Gradients(600, 4);
    x[300] = bad;
    const CodecConfig c = Parse("int8");
    const auto enc = EncodeBytes(c, x, nullptr);
    const ScaledLayout l = ReadScales(c, enc, 600);
    EXPECT_TRUE(std::isnan(l.scales[1]));
    EXPECT_FALSE(std::isnan(l.scales[0]) || std::isnan(l.scales[2]));
    const auto dec = DecodeBytes(c, enc, 600);
    for (int i = 256; i < 512; ++i) {
      EXPECT_EQ(enc[l.codes_offset + i], 0);
      EXPECT_TRUE(std::isnan(dec[i]));
    }
    EXPECT_TRUE(std::isfinite(dec[0]) && std::isfinite(dec[599]));
  }
}

// ---- sign ------------------------------------------------------------------------------------

TEST(CodecSign, BitsAndBlockMeanScales) {
  for (int64_t n : kSizes) {
    auto x = Gradients(n, 30 + static_cast<uint32_t>(n));
    x[0] = -0.0f;  // zeros (of either sign) send +scale
    const CodecConfig c = Parse("sign");
    const auto enc = EncodeBytes(c, x, nullptr);
    const ScaledLayout l = ReadScales(c, enc, n);
    const auto dec = DecodeBytes(c, enc, n);
    for (int64_t b = 0; b < CeilDiv(n, c.block); ++b) {
      const int64_t i0 = b * c.block, i1 = std::min(n, i0 + c.block);
      double sum = 0;
      for (int64_t i = i0; i < i1; ++i) sum += std::fabs(double(x[i]));
      const double mean = sum / double(i1 - i0);
      // fp32 summation: 8 sequential terms per lane then a 5-level tree, and one division.
      EXPECT_NEAR(l.scales[b], mean, 16 * kU * mean) << "block " << b;
      for (int64_t i = i0; i < i1; ++i) {
        const double want = x[i] < 0 ? -double(l.scales[b]) : double(l.scales[b]);
        ASSERT_EQ(dec[i], want) << "i = " << i;
      }
    }
    // Bits past n in the last word are zero.
    const uint32_t last = Read<uint32_t>(enc, l.codes_offset + 4 * ((n - 1) / 32));
    if (n % 32 != 0) {
      EXPECT_EQ(last >> (n % 32), 0u);
    }
  }
}

// ---- topk ------------------------------------------------------------------------------------

void CheckTopK(const CodecConfig& c, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const auto enc = EncodeBytes(c, x, nullptr);
  const auto want = TopKRef(x, c.density, c.topk_chunk);
  const int64_t pairs = static_cast<int64_t>(want.size());
  ASSERT_EQ(enc.size(), size_t(8 * pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    ASSERT_EQ(Read<uint32_t>(enc, 4 * p), want[p]) << "pair " << p << " n = " << n;
    ASSERT_EQ(Bits(Read<float>(enc, 4 * (pairs + p))), Bits(x[want[p]])) << "pair " << p;
  }
  const auto dec = DecodeBytes(c, enc, n);
  const auto ref = ReferenceDecode(c, enc, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dec[i], ref[i]);
}

TEST(CodecTopK, SelectsTheLargestMagnitudesLowerIndexOnTies) {
  for (const char* spec : {"topk:0.01", "topk:0.1", "topk:0.5", "topk:1", "topk:0.0001"}) {
    for (int64_t n : kSizes) CheckTopK(Parse(spec), Gradients(n, 40 + static_cast<uint32_t>(n)));
  }
  // Ties everywhere: magnitudes from a set of 4, signs random, and signed zeros.
  std::mt19937 rng(9);
  for (int64_t n : {1L, 100L, 1023L, 3000L, 100003L}) {
    std::vector<float> x(static_cast<size_t>(n));
    const float mags[] = {0.0f, 0.5f, 1.0f, 2.0f};
    for (float& v : x) v = (rng() & 1 ? -1.0f : 1.0f) * mags[rng() % 4];
    for (const char* spec : {"topk:0.01", "topk:0.3", "topk:0.9"}) CheckTopK(Parse(spec), x);
  }
  // Other chunk sizes, including a chunk of 1 and a partial last chunk shorter than k_full.
  for (int chunk : {1, 7, 100, 4096}) {
    CodecConfig c = Parse("topk:0.2");
    c.topk_chunk = chunk;
    for (int64_t n : {1L, 5L, 1025L, 9000L}) CheckTopK(c, Gradients(n, 50 + chunk));
  }
}

TEST(CodecTopK, KPerChunkRoundsHalfAwayFromZero) {
  // density 0.25 on a chunk of 10: 2.5 -> 3; the partial last chunk of 2: 0.5 -> 1; of 1: 0.25 -> 1.
  CodecConfig c = Parse("topk:0.25");
  c.topk_chunk = 10;
  EXPECT_EQ(TopKPairs(c, 10), 3);
  EXPECT_EQ(TopKPairs(c, 12), 4);
  EXPECT_EQ(TopKPairs(c, 21), 7);
  EXPECT_EQ(TopKPairs(c, 26), 3 + 3 + 2);  // chunk of 6: 1.5 -> 2
}

// ---- Error feedback ----------------------------------------------------------------------------

// Over S steps with a residual, the decoded values sent plus the final residual equal the sum of
// the inputs: r_t = y_t - dec_t with y_t = x_t + r_{t-1}, so sum_t dec_t + r_S = sum_t x_t exactly
// in real arithmetic. In fp32 two roundings per step can break it: y_t = fl(x_t + r_{t-1})
// (<= u |y_t|) and r_t = fl(y_t - dec_t) (<= u |r_t|; exact by Sterbenz's lemma when dec_t is
// within a factor 2 of y_t, which holds for none, bf16, fp16, int8-nearest and topk). So per
// element |sum dec + r_S - sum x| <= u sum_t (|y_t| + |r_t|), checked with a 1% margin; for the
// codecs above each step's r_t + dec_t == y_t is also checked exactly.
TEST(CodecErrorFeedback, NothingIsLostOnlyDelayed) {
  const int kSteps = 6;
  for (const char* spec : {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:0.2"}) {
    for (int64_t n : {257L, 1025L, 100003L}) {
      const CodecConfig c = Parse(spec);
      const bool exact_step = !(c.kind == CodecKind::kSign || (c.kind == CodecKind::kInt8 && c.stochastic));
      std::vector<float> r(static_cast<size_t>(n), 0.0f);
      std::vector<double> sum_x(n, 0.0), sum_dec(n, 0.0), bound(n, 0.0);
      for (int t = 0; t < kSteps; ++t) {
        const auto x = Gradients(n, 100 * t + static_cast<uint32_t>(n));
        std::vector<float> y(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] + r[i];
        const auto enc = EncodeBytes(c, x, &r, 99 + t);
        const auto dec = DecodeBytes(c, enc, n);
        for (int64_t i = 0; i < n; ++i) {
          sum_x[i] += x[i];
          sum_dec[i] += dec[i];
          bound[i] += kU * (std::fabs(double(y[i])) + std::fabs(double(r[i])));
          if (exact_step) {
            ASSERT_EQ(double(dec[i]) + double(r[i]), double(y[i])) << spec << " i = " << i;
          }
        }
      }
      size_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double err = std::fabs(sum_dec[i] + r[i] - sum_x[i]);
        if (!(err <= 1.01 * bound[i]) && bad++ < 5) {
          ADD_FAILURE() << spec << " n = " << n << " i = " << i << ": error " << err << " > bound " << bound[i];
        }
      }
      EXPECT_EQ(bad, 0u) << spec;
    }
  }
}

TEST(CodecErrorFeedback, NoneZeroesTheResidual) {
  const auto x = Gradients(1000, 1);
  auto r = Gradients(1000, 2);
  const auto r0 = r;
  const CodecConfig c = Parse("none");
  const auto enc = EncodeBytes(c, x, &r);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(Read<float>(enc, 4 * i), x[i] + r0[i]);
    EXPECT_EQ(r[i], 0.0f);
  }
}

// ---- DecodeAccumulate, buffer bounds, threads ----------------------------------------------------

const char* const kAllSpecs[] = {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:0.3"};

TEST(CodecDecode, AccumulatesWithAScale) {
  for (const char* spec : kAllSpecs) {
    for (int64_t n : kSizes) {
      const CodecConfig c = Parse(spec);
      const auto x = Gradients(n, 60 + static_cast<uint32_t>(n));
      const auto enc = EncodeBytes(c, x, nullptr, 3);
      const auto dec = DecodeBytes(c, enc, n);
      auto acc = Gradients(n, 70 + static_cast<uint32_t>(n), 1.0f);
      const auto acc0 = acc;
      DecodeAccumulate(c, enc.data(), n, -0.375f, acc.data());
      for (int64_t i = 0; i < n; ++i) {
        const double want = double(acc0[i]) - 0.375 * double(dec[i]);  // one fp32 rounding
        ASSERT_LE(std::fabs(acc[i] - want), kU * std::fabs(want)) << spec << " n = " << n << " i = " << i;
      }
    }
  }
}

TEST(CodecEncode, WritesExactlyEncodedBytes) {
  for (const char* spec : kAllSpecs) {
    for (int64_t n : kSizes) {
      const CodecConfig c = Parse(spec);
      const auto x = Gradients(n, 80 + static_cast<uint32_t>(n));
      const size_t bytes = EncodedBytes(c, n);
      std::vector<uint8_t> out[2];
      for (int k = 0; k < 2; ++k) {
        // Two different poisons: every byte inside must be overwritten identically, none outside.
        const uint8_t poison = k == 0 ? 0xAB : 0x5C;
        out[k].assign(bytes + 64, poison);
        std::vector<float> r(static_cast<size_t>(n), 0.0f);
        Encode(c, x.data(), r.data(), n, out[k].data(), 11);
        for (size_t p = bytes; p < bytes + 64; ++p) ASSERT_EQ(out[k][p], poison) << spec << " n = " << n;
        out[k].resize(bytes);
      }
      EXPECT_EQ(out[0], out[1]) << spec << " n = " << n << ": some encoded bytes were not written";
    }
  }
}

TEST(CodecEncode, IndependentOfThreadCount) {
  const int64_t n = 100003;
  const auto x = Gradients(n, 90);
  const auto r0 = Gradients(n, 91, 1e-3f);
  const int threads = omp_get_max_threads();
  for (const char* spec : kAllSpecs) {
    const CodecConfig c = Parse(spec);
    std::vector<uint8_t> enc[2];
    std::vector<float> r[2] = {r0, r0}, acc[2] = {r0, r0};
    for (int k = 0; k < 2; ++k) {
      omp_set_num_threads(k == 0 ? 1 : std::max(2, threads));
      enc[k] = EncodeBytes(c, x, &r[k], 5);
      DecodeAccumulate(c, enc[k].data(), n, 0.5f, acc[k].data());
    }
    omp_set_num_threads(threads);
    EXPECT_EQ(enc[0], enc[1]) << spec;
    EXPECT_EQ(0, std::memcmp(r[0].data(), r[1].data(), n * sizeof(float))) << spec;
    EXPECT_EQ(0, std::memcmp(acc[0].data(), acc[1].data(), n * sizeof(float))) << spec;
  }
}

TEST(CodecEncode, ZeroElementsIsANoOp) {
  for (const char* spec : kAllSpecs) {
    const CodecConfig c = Parse(spec);
    uint8_t out[4] = {1, 2, 3, 4};
    Encode(c, nullptr, nullptr, 0, out, 0);
    DecodeAccumulate(c, out, 0, 1.0f, nullptr);
    EXPECT_EQ(out[0], 1);
  }
}

}  // namespace
}  // namespace tf::comm
