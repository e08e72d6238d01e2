// Per-element and per-block math of the gradient codecs (comm/codec.h), written once as host+device
// inline functions: the CPU codecs (comm/codec.cpp) and the CUDA kernels (comm/codec.cu) call these
// and nothing else for anything that decides a bit of the encoding, so both produce the same bytes.
// docs/compression.md describes the codecs and their layouts.
//
// Exactness rules that make CPU and GPU agree bit for bit:
//  * only correctly rounded IEEE operations (+, -, *, /, fmaf, rintf, floorf) and integer ops; no
//    reassociation (a summation order is defined below where one is needed);
//  * no product feeds an addition unless the product is exact (int8: the scale has 17 significant
//    bits, so code * scale is exact) or the fusion is written explicitly as fmaf (decode-accumulate),
//    so the result does not depend on whether a compiler contracts a*b+c into an FMA
//    (GCC with -ffp-contract=fast, nvcc with -fmad=true);
//  * non-finite inputs follow fixed rules (per codec below).
// No state, no I/O.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "base/float16.h"
#include "kernels/math.h"  // TF_HD

namespace tf::comm::codec {

// ---- Limits (validated by ValidateCodec, comm/codec.cpp) ------------------------------------------
// int8 / sign: elements per scale block, a multiple of kLanes (so sign words never straddle blocks).
inline constexpr int kLanes = 32;  // the sign-scale summation tree's width (a CUDA warp)
inline constexpr int kMaxBlock = 1 << 16;
// topk: the CUDA kernel sorts a chunk (padded to a power of two) of 8-byte keys in shared memory.
inline constexpr int kMaxTopKChunk = 4096;

// ---- Bits -----------------------------------------------------------------------------------------

TF_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
TF_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

// |x| as an unsigned key ordered like the magnitudes: for non-NaN a, b: |a| < |b| iff key(a) < key(b)
// (+0 and -0 share key 0); every NaN's key exceeds infinity's (0x7f800000).
TF_HD uint32_t MagnitudeKey(float x) { return FloatBits(x) & 0x7fffffffu; }

// The value a codec encodes: y = x + r with error feedback, x itself without (so -0.0 stays -0.0).
TF_HD float Input(const float* x, const float* residual, int64_t i) {
  return residual != nullptr ? x[i] + residual[i] : x[i];
}

// acc + scale * v with one rounding (written as fmaf so both backends round alike).
TF_HD float Accumulate(float acc, float scale, float v) { return fmaf(scale, v, acc); }

// ---- bf16 -----------------------------------------------------------------------------------------
// Round to nearest even on the top 16 bits. Overflow rounds to +-inf (IEEE; bf16 has fp32's
// exponent range, so only |x| >= 0x1.ff8p127 overflows); +-inf stay +-inf; NaN -> sign | 0x7fc0.

TF_HD uint16_t Bf16Encode(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  return ::tf::FloatToBf16(x);  // base/float16.h
}
TF_HD float Bf16Decode(uint16_t h) { return ::tf::Bf16ToFloat(h); }

// ---- fp16 (IEEE binary16) -------------------------------------------------------------------------
// Round to nearest even, subnormals included (|x| <= 2^-25 -> +-0; 2^-25 itself ties to even 0).
// Unlike base/float16.h's FloatToHalf (storage), finite values that would round past the largest
// half saturate: |x| >= 65520 -> +-65504 (0x7bff).
// +-inf stay +-inf (0x7c00) and NaN -> sign | 0x7e00, so overflowed gradients remain detectable.

TF_HD uint16_t Fp16Encode(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Both roundings are computed and the result selected (no branches, so loops vectorise). Each uses
  // the nearest-even trick: add half an ulp minus one plus the kept lsb, then shift; a carry out of
  // the mantissa correctly increments the exponent.
  // Normal half (|x| >= 2^-14): rebias the exponent (127 -> 15), keep 10 of the 23 mantissa bits.
  const uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal half: |x| / 2^-24 rounded to an integer in [1, 1024] (1024 = 0x400, the smallest
  // normal, is reached by rounding up). |x| = m * 2^(e - 150) with the implicit bit in m and
  // e in [102, 112] here, so |x| / 2^-24 = m / 2^(126 - e). (The shift is clamped only to keep it
  // defined for the inputs whose result is not selected.)
  const int e = static_cast<int>(a >> 23);
  const int shift_raw = 126 - e;
  const uint32_t shift = static_cast<uint32_t>(shift_raw < 14 ? 14 : (shift_raw > 24 ? 24 : shift_raw));
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t subnormal = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
  uint32_t h = a > 0x7f800000u    ? 0x7e00u    // NaN
               : a == 0x7f800000u ? 0x7c00u    // inf
               : a >= 0x477ff000u ? 0x7bffu    // |x| >= 65520 = 65504 + half an ulp: saturate
               : a >= 0x38800000u ? normal     // |x| >= 2^-14
               : a > 0x33000000u  ? subnormal  // 2^-25 < |x| < 2^-14
                                  : 0u;         // |x| <= 2^-25 (2^-25 ties to even 0)
  return static_cast<uint16_t>(sign | h);
}

TF_HD float Fp16Decode(uint16_t h) { return ::tf::HalfToFloat(h); }  // exact

// ---- int8 with a per-block scale ------------------------------------------------------------------
// scale = absmax / 127 rounded UP to 17 significant bits (clear the low 7 mantissa bits, carrying
// upwards), so that (a) code * scale is exact for every |code| <= 127 (7 + 17 <= 24 bits) and (b)
// absmax / scale <= 127 never clips. absmax = 0 gives scale 0 and all codes 0. A block holding an
// inf or NaN gets scale NaN and codes 0, so it decodes to NaN (the overflow stays visible).

// `max_key`: the largest MagnitudeKey of the block's inputs.
TF_HD float Int8Scale(uint32_t max_key) {
  if (max_key >= 0x7f800000u) return BitsFloat(0x7fc00000u);
  const float s = BitsFloat(max_key) / 127.0f;
  return BitsFloat((FloatBits(s) + 0x7fu) & ~0x7fu);
}

// Round to nearest even: q = rint(y / scale); |y - q * scale| <= scale / 2 (up to the rounding of
// the division, relative 2^-24).
// REQUIRES: scale > 0 (the branch-free core, vectorisable).
TF_HD int8_t Int8QuantizeNearestPositiveScale(float y, float scale) {
  float t = rintf(y / scale);
  t = t > 127.0f ? 127.0f : t;
  t = t < -127.0f ? -127.0f : t;
  return static_cast<int8_t>(t);
}
TF_HD int8_t Int8QuantizeNearest(float y, float scale) {
  if (!(scale > 0.0f)) return 0;  // zero or NaN scale
  return Int8QuantizeNearestPositiveScale(y, scale);
}

// Stochastic: q = floor(y / scale + u), u uniform in [0, 1) (StochasticUniform), clamped to
// [-127, 127]; E[q * scale] = y up to the fp32 rounding of y / scale + u (bias < 2^-17 scale) and
// |y - q * scale| < scale.
TF_HD int8_t Int8QuantizeStochastic(float y, float scale, float u) {
  if (!(scale > 0.0f)) return 0;
  float t = floorf(y / scale + u);
  t = t > 127.0f ? 127.0f : t;  // y / scale + u can round up to 128
  t = t < -127.0f ? -127.0f : t;
  return static_cast<int8_t>(t);
}

TF_HD float Int8Decode(int8_t q, float scale) { return static_cast<float>(q) * scale; }  // exact

// SplitMix64's output function (a bijection on 64 bits with full avalanche).
TF_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Per-call key for stochastic rounding, computed once on the host from the caller's seed.
inline uint64_t StochasticKey(uint64_t seed) { return Mix64(seed ^ 0x243f6a8885a308d3ull); }
// u in [0, 1) with 24 random bits for element i (its index in the encoded range): the i-th output
// of a SplitMix64 stream started at `key`. Counter-based, so every backend and thread count gives
// the same u for the same (seed, i).
TF_HD float StochasticUniform(uint64_t key, uint64_t i) {
  const uint64_t z = Mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
  return static_cast<float>(static_cast<uint32_t>(z >> 40)) * 0x1p-24f;
}

// ---- sign with a per-block scale ------------------------------------------------------------------
// Bit set <=> y < 0 (so +-0 and NaN send +scale). scale = (sum of |y| over the block) / len, len
// the block's own length (the last block may be partial). The sum has a fixed order, the one a CUDA
// warp computes: lane l (0..31) adds |y[l]|, |y[l+32]|, |y[l+64]|, ... in increasing order (fp32,
// starting from +0), then the 32 lane sums are combined by the xor butterfly
//   for off in 16, 8, 4, 2, 1: s[l] = s[l] + s[l + off]  (l < off),  result s[0].
// A NaN in the block makes the scale NaN (decodes to NaN); an inf makes it inf.

TF_HD bool SignNegative(float y) { return y < 0.0f; }
TF_HD float SignDecode(bool negative, float scale) { return negative ? -scale : scale; }
TF_HD float SignScale(float abs_sum, int64_t len) { return abs_sum / static_cast<float>(len); }
// The butterfly above on an array of kLanes lane sums (destroys it); the CPU's copy of the warp tree.
TF_HD float SumLanes(float* s) {
  for (int off = kLanes / 2; off > 0; off /= 2) {
    for (int l = 0; l < off; ++l) s[l] = s[l] + s[l + off];
  }
  return s[0];
}

// ---- top-k ----------------------------------------------------------------------------------------
// Selection order inside a chunk: a larger |y| wins, equal magnitudes go to the lower index (NaN
// counts as larger than inf; +0 and -0 tie). TopKKey packs that order into one unique integer per
// element (larger key wins), so "the k largest keys" is the selected set; `local` is the element's
// index within its chunk.
TF_HD uint64_t TopKKey(float y, uint32_t local) {
  return (static_cast<uint64_t>(MagnitudeKey(y)) << 32) | (0xffffffffu - local);
}

// Entries sent from a chunk of `len` elements: max(1, round(density * len)), round half away from 0.
inline int64_t TopKPerChunk(double density, int64_t len) {
  const int64_t k = std::llround(density * static_cast<double>(len));
  return k < 1 ? 1 : (k > len ? len : k);
}
// Total pairs for n elements in chunks of `chunk`: full chunks send TopKPerChunk(density, chunk)
// each, a partial last chunk TopKPerChunk(density, its length). Chunk c's pairs start at
// c * TopKPerChunk(density, chunk).
inline int64_t TopKTotal(double density, int64_t chunk, int64_t n) {
  if (n <= 0) return 0;
  const int64_t full = n / chunk, tail = n % chunk;
  return full * TopKPerChunk(density, chunk) + (tail > 0 ? TopKPerChunk(density, tail) : 0);
}

}  // namespace tf::comm::codec
