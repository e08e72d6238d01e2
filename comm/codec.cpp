// CPU gradient codecs (comm/codec.h): spec parsing, sizes, and Encode / DecodeAccumulate. Every
// decision that shapes a byte of the encoding is a comm/codec_math.h function shared with the CUDA
// kernels (comm/codec.cu); this file only loops. OpenMP over elements (bf16, fp16, none), scale
// blocks (int8, sign) or chunks (topk), skipped for small ranges where starting threads costs more
// than the work. The results never depend on the thread count (each output is computed by one
// thread in a fixed order).
#include "comm/codec.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "comm/codec_math.h"

namespace tf::comm {
namespace {

using namespace codec;  // NOLINT: the codec math

// Elements below which the loops run on the calling thread.
constexpr int64_t kParallelMin = int64_t(1) << 15;

constexpr const char* kAcceptedSpecs = "none, bf16, fp16, int8, int8-sr, sign, topk:D with D in (0, 1]";

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- none: y = x + r copied as fp32 -----------------------------------------------------------

void EncodeNone(const float* x, float* r, int64_t n, float* out) {
  if (r == nullptr) {
    std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    out[i] = x[i] + r[i];
    r[i] = 0.0f;
  }
}

void DecodeNone(const float* in, int64_t n, float scale, float* acc) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) acc[i] = Accumulate(acc[i], scale, in[i]);
}

// ---- bf16 / fp16: one 16-bit code per element ------------------------------------------------

template <uint16_t (*Enc)(float), float (*Dec)(uint16_t)>
void EncodeHalf(const float* x, float* r, int64_t n, uint16_t* out) {
  if (r == nullptr) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = Enc(x[i]);
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] + r[i];
    const uint16_t h = Enc(y);
    out[i] = h;
    r[i] = y - Dec(h);
  }
}

template <float (*Dec)(uint16_t)>
void DecodeHalf(const uint16_t* in, int64_t n, float scale, float* acc) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) acc[i] = Accumulate(acc[i], scale, Dec(in[i]));
}

// ---- int8: per block, the scale from the largest magnitude, then the codes -------------------

template <bool kStochastic>
void EncodeInt8(const float* x, float* r, int64_t n, int block, uint64_t seed, float* scales, int8_t* codes) {
  const int64_t n_blocks = CeilDiv(n, block);
  const uint64_t key = StochasticKey(seed);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t i0 = b * block, i1 = std::min(n, i0 + block);
    uint32_t max_key = 0;
#pragma omp simd reduction(max : max_key)
    for (int64_t i = i0; i < i1; ++i) max_key = std::max(max_key, MagnitudeKey(Input(x, r, i)));
    const float s = Int8Scale(max_key);
    scales[b] = s;
    if (!kStochastic && s > 0.0f) {
      // The common case, vectorised: the same formula as Int8QuantizeNearest with its zero/NaN
      // scale test hoisted out of the loop (bit-identical codes and residuals).
      if (r != nullptr) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) {
          const float y = x[i] + r[i];
          const int8_t q = Int8QuantizeNearestPositiveScale(y, s);
          codes[i] = q;
          r[i] = y - Int8Decode(q, s);
        }
      } else {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) codes[i] = Int8QuantizeNearestPositiveScale(x[i], s);
      }
      continue;
    }
    for (int64_t i = i0; i < i1; ++i) {
      const float y = Input(x, r, i);
      const int8_t q = kStochastic ? Int8QuantizeStochastic(y, s, StochasticUniform(key, static_cast<uint64_t>(i)))
                                   : Int8QuantizeNearest(y, s);
      codes[i] = q;
      if (r != nullptr) r[i] = y - Int8Decode(q, s);  // exact product: contraction cannot change it
    }
  }
  for (int64_t i = n; i < CeilDiv(n, 4) * 4; ++i) codes[i] = 0;  // padding to 4 bytes
}

void DecodeInt8(const float* scales, const int8_t* codes, int64_t n, int block, float scale, float* acc) {
  const int64_t n_blocks = CeilDiv(n, block);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t i0 = b * block, i1 = std::min(n, i0 + block);
    const float s = scales[b];
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) acc[i] = Accumulate(acc[i], scale, Int8Decode(codes[i], s));
  }
}

// ---- sign: per block, mean |y| in the warp's summation order, then one bit per element -------

void EncodeSign(const float* x, float* r, int64_t n, int block, float* scales, uint32_t* words) {
  const int64_t n_blocks = CeilDiv(n, block);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t i0 = b * block, i1 = std::min(n, i0 + block);
    float lanes[kLanes] = {};
    for (int64_t base = i0; base < i1; base += kLanes) {
      const int len = static_cast<int>(std::min<int64_t>(kLanes, i1 - base));
      for (int l = 0; l < len; ++l) lanes[l] += std::fabs(Input(x, r, base + l));
    }
    const float s = SignScale(SumLanes(lanes), i1 - i0);
    scales[b] = s;
    for (int64_t base = i0; base < i1; base += kLanes) {  // i0 is a multiple of 32: whole words
      const int len = static_cast<int>(std::min<int64_t>(kLanes, i1 - base));
      uint32_t word = 0;
      for (int l = 0; l < len; ++l) {
        const float y = Input(x, r, base + l);
        const bool neg = SignNegative(y);
        word |= static_cast<uint32_t>(neg) << l;
        if (r != nullptr) r[base + l] = y - SignDecode(neg, s);
      }
      words[base / kLanes] = word;
    }
  }
}

void DecodeSign(const float* scales, const uint32_t* words, int64_t n, int block, float scale, float* acc) {
  const int64_t n_blocks = CeilDiv(n, block);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t i0 = b * block, i1 = std::min(n, i0 + block);
    const float s = scales[b];
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const bool neg = ((words[i / kLanes] >> (i % kLanes)) & 1u) != 0;
      acc[i] = Accumulate(acc[i], scale, SignDecode(neg, s));
    }
  }
}

// ---- topk: per chunk, the k largest TopKKeys, written in index order --------------------------

void EncodeTopK(const CodecConfig& c, const float* x, float* r, int64_t n, uint32_t* indices, float* values) {
  const int64_t chunk = c.topk_chunk;
  const int64_t n_chunks = CeilDiv(n, chunk);
  const int64_t k_full = TopKPerChunk(c.density, chunk);
#pragma omp parallel if (n > kParallelMin)
  {
    std::vector<uint64_t> keys;
    keys.reserve(static_cast<size_t>(chunk));
    const std::greater<uint64_t> later;  // "a > b": as a heap order, front() is the smallest
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      const int64_t i0 = ch * chunk, len = std::min(chunk, n - i0);
      const size_t k = static_cast<size_t>(TopKPerChunk(c.density, len));
      keys.clear();
      if (k * 16 <= static_cast<size_t>(len)) {
        // Small k (the common densities): a min-heap of the k largest keys seen so far. On
        // gradient-like data few elements beat its front, so a chunk costs ~len comparisons plus
        // O(k log(len/k)) heap updates: ~2.5x faster than nth_element at k = len/100, slower
        // above ~len/20 (measured on 1024-element chunks).
        for (int64_t j = 0; j < len; ++j) {
          const uint64_t key = TopKKey(Input(x, r, i0 + j), static_cast<uint32_t>(j));
          if (keys.size() < k) {
            keys.push_back(key);
            if (keys.size() == k) std::make_heap(keys.begin(), keys.end(), later);
          } else if (key > keys.front()) {
            std::pop_heap(keys.begin(), keys.end(), later);
            keys.back() = key;
            std::push_heap(keys.begin(), keys.end(), later);
          }
        }
      } else {
        for (int64_t j = 0; j < len; ++j) keys.push_back(TopKKey(Input(x, r, i0 + j), static_cast<uint32_t>(j)));
        std::nth_element(keys.begin(), keys.begin() + static_cast<int64_t>(k - 1), keys.end(), later);
        std::swap(keys.front(), keys[k - 1]);
      }
      // keys.front(): the k-th largest key. Keys are unique, so exactly k elements have a key >= it.
      const uint64_t threshold = keys.front();
      int64_t out = ch * k_full;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = i0 + j;
        const float y = Input(x, r, i);
        const bool sent = TopKKey(y, static_cast<uint32_t>(j)) >= threshold;
        if (sent) {
          indices[out] = static_cast<uint32_t>(i);
          values[out] = y;
          ++out;
        }
        if (r != nullptr) r[i] = sent ? 0.0f : y;
      }
      assert(out == ch * k_full + static_cast<int64_t>(k));
    }
  }
}

void DecodeTopK(const uint32_t* indices, const float* values, int64_t pairs, float scale, float* acc) {
  // Indices are distinct within one encoding: no two iterations touch the same element.
#pragma omp parallel for schedule(static) if (pairs > kParallelMin)
  for (int64_t p = 0; p < pairs; ++p) acc[indices[p]] = Accumulate(acc[indices[p]], scale, values[p]);
}

}  // namespace

// ---- Specs and sizes -------------------------------------------------------------------------

StatusOr<CodecConfig> ParseCodec(std::string_view spec) {
  CodecConfig c;
  if (spec == "none") return c;
  if (spec == "bf16") {
    c.kind = CodecKind::kBF16;
    return c;
  }
  if (spec == "fp16") {
    c.kind = CodecKind::kFP16;
    return c;
  }
  if (spec == "int8" || spec == "int8-sr") {
    c.kind = CodecKind::kInt8;
    c.stochastic = spec == "int8-sr";
    return c;
  }
  if (spec == "sign") {
    c.kind = CodecKind::kSign;
    return c;
  }
  constexpr std::string_view kTopK = "topk:";
  if (spec.starts_with(kTopK)) {
    const std::string_view d = spec.substr(kTopK.size());
    double density = 0.0;
    // from_chars accepts no sign, spaces, "0x" or leading '+'; "nan"/"inf" fail the range check.
    const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), density, std::chars_format::general);
    if (d.empty() || ec != std::errc() || end != d.data() + d.size()) {
      return Status::InvalidArgument("compression spec '{}': density '{}' is not a number (accepted: {})", spec, d,
                                     kAcceptedSpecs);
    }
    if (!(density > 0.0 && density <= 1.0)) {
      return Status::InvalidArgument("compression spec '{}': density {} is outside (0, 1] (accepted: {})", spec,
                                     density, kAcceptedSpecs);
    }
    c.kind = CodecKind::kTopK;
    c.density = density;
    return c;
  }
  return Status::InvalidArgument("unknown compression spec '{}' (accepted: {})", spec, kAcceptedSpecs);
}

std::string CodecName(const CodecConfig& c) {
  switch (c.kind) {
    case CodecKind::kNone: return "none";
    case CodecKind::kBF16: return "bf16";
    case CodecKind::kFP16: return "fp16";
    case CodecKind::kInt8: return c.stochastic ? "int8-sr" : "int8";
    case CodecKind::kSign: return "sign";
    case CodecKind::kTopK: return fmt::format("topk:{}", c.density);  // shortest form that parses back exactly
  }
  return "unknown";
}

Status ValidateCodec(const CodecConfig& c) {
  switch (c.kind) {
    case CodecKind::kNone:
    case CodecKind::kBF16:
    case CodecKind::kFP16: return Status::OK();
    case CodecKind::kInt8:
    case CodecKind::kSign:
      if (c.block < kLanes || c.block > kMaxBlock || c.block % kLanes != 0) {
        return Status::InvalidArgument("codec {}: block {} must be a multiple of {} in [{}, {}]", CodecName(c), c.block,
                                       kLanes, kLanes, kMaxBlock);
      }
      return Status::OK();
    case CodecKind::kTopK:
      if (!(c.density > 0.0 && c.density <= 1.0)) {
        return Status::InvalidArgument("codec topk: density {} is outside (0, 1]", c.density);
      }
      if (c.topk_chunk < 1 || c.topk_chunk > kMaxTopKChunk) {
        return Status::InvalidArgument("codec {}: topk_chunk {} is outside [1, {}]", CodecName(c), c.topk_chunk,
                                       kMaxTopKChunk);
      }
      return Status::OK();
  }
  return Status::InvalidArgument("codec: unknown kind {}", static_cast<int>(c.kind));
}

int64_t TopKPairs(const CodecConfig& c, int64_t n) {
  return c.kind == CodecKind::kTopK ? TopKTotal(c.density, c.topk_chunk, n) : 0;
}

size_t EncodedBytes(const CodecConfig& c, int64_t n) {
  if (n <= 0) return 0;
  int64_t bytes = 0;
  switch (c.kind) {
    case CodecKind::kNone: bytes = 4 * n; break;
    case CodecKind::kBF16:
    case CodecKind::kFP16: bytes = 2 * n; break;
    case CodecKind::kInt8: bytes = 4 * CeilDiv(n, c.block) + 4 * CeilDiv(n, 4); break;
    case CodecKind::kSign: bytes = 4 * CeilDiv(n, c.block) + 4 * CeilDiv(n, kLanes); break;
    case CodecKind::kTopK: bytes = 8 * TopKPairs(c, n); break;
  }
  return static_cast<size_t>(bytes);
}

double CompressionRatio(const CodecConfig& c, int64_t n) {
  const size_t bytes = EncodedBytes(c, n);
  return bytes == 0 ? 1.0 : 4.0 * static_cast<double>(n) / static_cast<double>(bytes);
}

// ---- Encode / decode -------------------------------------------------------------------------

void Encode(const CodecConfig& c, const float* x, float* residual, int64_t n, void* out, uint64_t seed) {
  assert(ValidateCodec(c).ok() && n >= 0);
  if (n <= 0) return;
  switch (c.kind) {
    case CodecKind::kNone: EncodeNone(x, residual, n, static_cast<float*>(out)); return;
    case CodecKind::kBF16: EncodeHalf<Bf16Encode, Bf16Decode>(x, residual, n, static_cast<uint16_t*>(out)); return;
    case CodecKind::kFP16: EncodeHalf<Fp16Encode, Fp16Decode>(x, residual, n, static_cast<uint16_t*>(out)); return;
    case CodecKind::kInt8: {
      float* scales = static_cast<float*>(out);
      int8_t* codes = reinterpret_cast<int8_t*>(scales + CeilDiv(n, c.block));
      if (c.stochastic) {
        EncodeInt8<true>(x, residual, n, c.block, seed, scales, codes);
      } else {
        EncodeInt8<false>(x, residual, n, c.block, seed, scales, codes);
      }
      return;
    }
    case CodecKind::kSign: {
      float* scales = static_cast<float*>(out);
      EncodeSign(x, residual, n, c.block, scales, reinterpret_cast<uint32_t*>(scales + CeilDiv(n, c.block)));
      return;
    }
    case CodecKind::kTopK: {
      assert(n <= int64_t{0xffffffff});
      uint32_t* indices = static_cast<uint32_t*>(out);
      EncodeTopK(c, x, residual, n, indices, reinterpret_cast<float*>(indices + TopKPairs(c, n)));
      return;
    }
  }
}

void DecodeAccumulate(const CodecConfig& c, const void* in, int64_t n, float scale, float* acc) {
  assert(ValidateCodec(c).ok() && n >= 0);
  if (n <= 0) return;
  switch (c.kind) {
    case CodecKind::kNone: DecodeNone(static_cast<const float*>(in), n, scale, acc); return;
    case CodecKind::kBF16: DecodeHalf<Bf16Decode>(static_cast<const uint16_t*>(in), n, scale, acc); return;
    case CodecKind::kFP16: DecodeHalf<Fp16Decode>(static_cast<const uint16_t*>(in), n, scale, acc); return;
    case CodecKind::kInt8: {
      const float* scales = static_cast<const float*>(in);
      DecodeInt8(scales, reinterpret_cast<const int8_t*>(scales + CeilDiv(n, c.block)), n, c.block, scale, acc);
      return;
    }
    case CodecKind::kSign: {
      const float* scales = static_cast<const float*>(in);
      DecodeSign(scales, reinterpret_cast<const uint32_t*>(scales + CeilDiv(n, c.block)), n, c.block, scale, acc);
      return;
    }
    case CodecKind::kTopK: {
      const int64_t pairs = TopKPairs(c, n);
      const uint32_t* indices = static_cast<const uint32_t*>(in);
      DecodeTopK(indices, reinterpret_cast<const float*>(indices + pairs), pairs, scale, acc);
      return;
    }
  }
}

}  // namespace tf::comm
