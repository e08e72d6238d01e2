// bf16 and IEEE fp16 <-> fp32 conversions on raw 16-bit patterns: the one definition used by the
// host code (safetensors, host copies of device buffers, tests, the CPU emulator) and callable from
// device code. Round to nearest even; overflow goes to infinity; NaN becomes the canonical quiet
// NaN that the hardware conversions produce (bf16 0x7fff, fp16 0x7fff), so host and device agree
// bit for bit. Pure functions; thread-safe.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TF_HOST_DEVICE __host__ __device__
#else
#define TF_HOST_DEVICE
#endif

namespace tf {

TF_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
TF_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

TF_HOST_DEVICE inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

TF_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Exact (subnormals, infinities and NaN payloads included).
TF_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));  // 112 = 127 - 15
  if (mant == 0) return BitsToFloat(sign);
  int e = -1;  // subnormal: value = mant * 2^-24; normalise
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return BitsToFloat(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13));
}

TF_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7fffu;                               // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs >= 0x38800000u) {                                            // normal (>= 2^-14)
    uint32_t v = abs - (112u << 23);
    v += 0xfffu + ((v >> 13) & 1u);
    return static_cast<uint16_t>(sign | (v >> 13));  // a carry may bump into the next binade
  }
  if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 ties to 0)
  const uint32_t e = abs >> 23;        // subnormal half: m * 2^-24, m in [1, 1023]
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

}  // namespace tf
