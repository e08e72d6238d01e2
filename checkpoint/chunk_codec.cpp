#include "checkpoint/chunk_codec.h"

// For ZSTD_c_literalCompressionMode, in zstd's experimental section (ZSTD_ps_enable: 1.5.1+).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <memory>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tf::checkpoint {
namespace {

static_assert(std::endian::native == std::endian::little,
              "chunk codecs copy little-endian bytes straight into memory");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

constexpr size_t kNumPlanes = 4;
enum PlaneStorage : uint8_t { kStored = 0, kZstd = 1 };
// Offsets in the header (layout in chunk_codec.h).
constexpr size_t kVersionAt = 4, kEncodingAt = 5, kReservedAt = 6, kCountAt = 8;
constexpr size_t kStorageAt = 16, kPlaneReservedAt = 20, kPlaneSizeAt = 24;
static_assert(kPlaneSizeAt + kNumPlanes * sizeof(uint64_t) == kChunkPlanesHeaderBytes);

struct ZstdFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// A growable uninitialised byte buffer (std::vector would zero what it grows).
class Scratch {
 public:
  uint8_t* Get(size_t bytes) {
    if (bytes > capacity_) {
      data_.reset(new uint8_t[bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

// One per thread; contexts are null only when zstd could not allocate (then planes stay stored).
struct ThreadState {
  std::unique_ptr<ZSTD_CCtx, ZstdFree> cctx{ZSTD_createCCtx()};
  std::unique_ptr<ZSTD_DCtx, ZstdFree> dctx{ZSTD_createDCtx()};
  Scratch planes;  // 4n: the split planes (encode) or the decompressed ones (decode)
  Scratch packed;  // 4 ZSTD_compressBound(n): the compressed planes (encode)
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

uint32_t Bits(const float* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// planes[k n + i] = byte k of bits(data[i]) (^ bits(base[i]) when kXor).
template <bool kXor>
void Split(const float* data, const float* base, size_t n, uint8_t* planes) {
  uint8_t* p0 = planes;
  uint8_t* p1 = p0 + n;
  uint8_t* p2 = p1 + n;
  uint8_t* p3 = p2 + n;
  for (size_t i = 0; i < n; ++i) {
    uint32_t w = Bits(data + i);
    if constexpr (kXor) w ^= Bits(base + i);
    p0[i] = static_cast<uint8_t>(w);
    p1[i] = static_cast<uint8_t>(w >> 8);
    p2[i] = static_cast<uint8_t>(w >> 16);
    p3[i] = static_cast<uint8_t>(w >> 24);
  }
}

// The inverse of Split. Reads base[i] before writing out[i], so out may be base.
template <bool kXor>
void Merge(const uint8_t* const* p, const float* base, size_t n, float* out) {
  const uint8_t* p0 = p[0];
  const uint8_t* p1 = p[1];
  const uint8_t* p2 = p[2];
  const uint8_t* p3 = p[3];
  for (size_t i = 0; i < n; ++i) {
    uint32_t w = uint32_t{p0[i]} | uint32_t{p1[i]} << 8 | uint32_t{p2[i]} << 16 | uint32_t{p3[i]} << 24;
    if constexpr (kXor) w ^= Bits(base + i);
    std::memcpy(out + i, &w, sizeof(w));
  }
}

// A planes encoding, its bytes still in the thread's scratch buffers.
struct PlaneSet {
  uint8_t storage[kNumPlanes];
  uint64_t size[kNumPlanes];
  const uint8_t* bytes[kNumPlanes];
  size_t total = kChunkPlanesHeaderBytes;
};

// REQUIRES: base is null or holds data.size() floats.
PlaneSet EncodePlanes(std::span<const float> data, const float* base, int level, ThreadState& ts) {
  const size_t n = data.size();
  uint8_t* planes = ts.planes.Get(kNumPlanes * n);
  if (base != nullptr) {
    Split<true>(data.data(), base, n, planes);
  } else {
    Split<false>(data.data(), nullptr, n, planes);
  }
  const size_t bound = ZSTD_compressBound(n);
  uint8_t* packed = ts.packed.Get(kNumPlanes * bound);
  // Without a usable context every plane is stored: valid, only larger.
  ZSTD_CCtx* cctx = ts.cctx.get();
  const bool ready =
      cctx != nullptr && !ZSTD_isError(ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters)) &&
      !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel,
                                           std::clamp(level, ZSTD_minCLevel(), ZSTD_maxCLevel())));
  if (ready) {
    // Huffman-coded literals at every level (zstd drops them at negative ones). A zstd build that
    // refused the parameter would still write valid frames, only larger: its result is not needed.
    (void)ZSTD_CCtx_setParameter(cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  }
  PlaneSet set;
  for (size_t k = 0; k < kNumPlanes; ++k) {
    const uint8_t* src = planes + k * n;
    uint8_t* dst = packed + k * bound;
    size_t r = 0;
    if (ready && n > 0) r = ZSTD_compress2(cctx, dst, bound, src, n);
    const bool zstd = r > 0 && !ZSTD_isError(r) && r < n;  // else store it: no smaller, or zstd failed
    set.storage[k] = zstd ? kZstd : kStored;
    set.size[k] = zstd ? r : n;
    set.bytes[k] = zstd ? dst : src;
    set.total += set.size[k];
  }
  return set;
}

template <class Out>  // std::string or ByteBuffer
void AppendU64(Out& out, uint64_t v) {
  char b[sizeof(v)];
  std::memcpy(b, &v, sizeof(v));
  out.append(b, sizeof(b));
}

template <class Out>
void AppendHeader(Out& out, ChunkEncoding e, uint64_t n) {
  out.append(kChunkMagic, sizeof(kChunkMagic));
  out.push_back(static_cast<char>(kChunkFormatVersion));
  out.push_back(static_cast<char>(e));
  out.append(2, '\0');
  AppendU64(out, n);
}

// The Serialize functions overwrite out, keeping its capacity (a reused buffer is not faulted in
// again: on some VMs fresh pages cost as much as the disk write they feed).
template <class Out>
void SerializeRaw(std::span<const float> data, Out& out) {
  out.clear();
  out.reserve(kChunkHeaderBytes + data.size_bytes());
  AppendHeader(out, ChunkEncoding::kRaw, data.size());
  if (!data.empty()) out.append(reinterpret_cast<const char*>(data.data()), data.size_bytes());
}

template <class Out>
void SerializePlanes(ChunkEncoding e, size_t n, const PlaneSet& set, Out& out) {
  out.clear();
  out.reserve(set.total);
  AppendHeader(out, e, n);
  for (size_t k = 0; k < kNumPlanes; ++k) out.push_back(static_cast<char>(set.storage[k]));
  out.append(4, '\0');
  for (size_t k = 0; k < kNumPlanes; ++k) AppendU64(out, set.size[k]);
  for (size_t k = 0; k < kNumPlanes; ++k) {
    if (set.size[k] > 0) out.append(reinterpret_cast<const char*>(set.bytes[k]), set.size[k]);
  }
  assert(out.size() == set.total);
}

uint64_t LoadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

std::string_view EncodingName(ChunkEncoding e) {
  switch (e) {
    case ChunkEncoding::kRaw: return "raw";
    case ChunkEncoding::kPlanes: return "planes";
    case ChunkEncoding::kXorPlanes: return "xor-planes";
  }
  return "unknown";
}

StatusOr<ChunkEncoding> ParseEncoding(std::string_view name) {
  for (ChunkEncoding e : {ChunkEncoding::kRaw, ChunkEncoding::kPlanes, ChunkEncoding::kXorPlanes}) {
    if (name == EncodingName(e)) return e;
  }
  return Status::InvalidArgument("unknown chunk encoding '{}' (expected raw, planes or xor-planes)", name);
}

StatusOr<std::string> EncodeChunkAs(ChunkEncoding encoding, std::span<const float> data,
                                    std::span<const float> base, const ChunkCodecOptions& o) {
  std::string out;
  switch (encoding) {
    case ChunkEncoding::kRaw: SerializeRaw(data, out); return out;
    case ChunkEncoding::kPlanes:
      SerializePlanes(encoding, data.size(), EncodePlanes(data, nullptr, o.zstd_level, State()), out);
      return out;
    case ChunkEncoding::kXorPlanes:
      if (base.size() != data.size()) {
        return Status::InvalidArgument("xor-planes needs a base of the chunk's size ({} floats), got {}", data.size(),
                                       base.size());
      }
      SerializePlanes(encoding, data.size(), EncodePlanes(data, base.data(), o.zstd_level, State()), out);
      return out;
  }
  return Status::InvalidArgument("unknown chunk encoding {}", static_cast<int>(encoding));
}

namespace {

template <class Out>
ChunkEncoding EncodeInto(std::span<const float> data, std::span<const float> base, const ChunkCodecOptions& o,
                         Out& out) {
  assert(base.empty() || base.size() == data.size());
  const size_t n = data.size();
  ThreadState& ts = State();
  // Each candidate overwrites the thread's scratch, so the best so far is serialised into out. The
  // delta, the usual winner when there is a base, goes first; ties go to raw, then planes.
  size_t best_size = kChunkHeaderBytes + 4 * n;
  ChunkEncoding best = ChunkEncoding::kRaw;
  if (!base.empty() && base.size() == n) {
    const PlaneSet set = EncodePlanes(data, base.data(), o.zstd_level, ts);
    if (set.total < best_size) {
      best_size = set.total;
      best = ChunkEncoding::kXorPlanes;
      SerializePlanes(best, n, set, out);
    }
  }
  if (o.try_planes) {
    const PlaneSet set = EncodePlanes(data, nullptr, o.zstd_level, ts);
    if (set.total < best_size || (set.total == best_size && best == ChunkEncoding::kXorPlanes)) {
      best_size = set.total;
      best = ChunkEncoding::kPlanes;
      SerializePlanes(best, n, set, out);
    }
  }
  if (best == ChunkEncoding::kRaw) SerializeRaw(data, out);
  return best;
}

}  // namespace

ChunkEncoding EncodeChunkInto(std::span<const float> data, std::span<const float> base, const ChunkCodecOptions& o,
                              ByteBuffer& out) {
  return EncodeInto(data, base, o, out);
}

EncodedChunk EncodeChunk(std::span<const float> data, std::span<const float> base, const ChunkCodecOptions& o) {
  EncodedChunk result;
  result.encoding = EncodeInto(data, base, o, result.bytes);
  return result;
}

Status DecodeChunk(std::string_view bytes, std::span<const float> base, std::span<float> out) {
  const size_t n = out.size();
  if (bytes.size() < kChunkHeaderBytes) {
    return Status::Corruption("encoded chunk is {} bytes, shorter than its {}-byte header", bytes.size(),
                              kChunkHeaderBytes);
  }
  if (std::memcmp(bytes.data(), kChunkMagic, sizeof(kChunkMagic)) != 0) {
    return Status::Corruption("encoded chunk: bad magic {:02x} {:02x} {:02x} {:02x} (expected \"TFCK\")",
                              static_cast<uint8_t>(bytes[0]), static_cast<uint8_t>(bytes[1]),
                              static_cast<uint8_t>(bytes[2]), static_cast<uint8_t>(bytes[3]));
  }
  if (const auto version = static_cast<uint8_t>(bytes[kVersionAt]); version != kChunkFormatVersion) {
    return Status::Corruption("encoded chunk: format version {} is not the one this build reads ({})", version,
                              kChunkFormatVersion);
  }
  const auto code = static_cast<uint8_t>(bytes[kEncodingAt]);
  if (code > static_cast<uint8_t>(ChunkEncoding::kXorPlanes)) {
    return Status::Corruption("encoded chunk: unknown encoding {}", code);
  }
  const auto encoding = static_cast<ChunkEncoding>(code);
  if (bytes[kReservedAt] != 0 || bytes[kReservedAt + 1] != 0) {
    return Status::Corruption("encoded chunk: reserved header bytes are not zero");
  }
  if (const uint64_t count = LoadU64(bytes.data() + kCountAt); count != n) {
    return Status::Corruption("encoded {} chunk holds {} floats, but out has room for {}", EncodingName(encoding),
                              count, n);
  }

  if (encoding == ChunkEncoding::kRaw) {
    if (bytes.size() - kChunkHeaderBytes != 4 * n) {
      return Status::Corruption("raw chunk of {} floats has {} payload bytes, expected {}", n,
                                bytes.size() - kChunkHeaderBytes, 4 * n);
    }
    if (n > 0) std::memcpy(out.data(), bytes.data() + kChunkHeaderBytes, 4 * n);
    return Status::OK();
  }

  const bool xor_base = encoding == ChunkEncoding::kXorPlanes;
  const std::string_view name = EncodingName(encoding);
  if (xor_base && base.size() != n) {
    return Status::Corruption("xor-planes chunk of {} floats needs a base of that size, got {} floats", n,
                              base.size());
  }
  if (bytes.size() < kChunkPlanesHeaderBytes) {
    return Status::Corruption("{} chunk is {} bytes, shorter than its {}-byte header", name, bytes.size(),
                              kChunkPlanesHeaderBytes);
  }
  for (size_t k = 0; k < 4; ++k) {
    if (bytes[kPlaneReservedAt + k] != 0) return Status::Corruption("{} chunk: reserved header bytes are not zero", name);
  }
  // Validate the whole plane table before touching out.
  uint8_t storage[kNumPlanes];
  uint64_t size[kNumPlanes];
  uint64_t left = bytes.size() - kChunkPlanesHeaderBytes;
  for (size_t k = 0; k < kNumPlanes; ++k) {
    storage[k] = static_cast<uint8_t>(bytes[kStorageAt + k]);
    size[k] = LoadU64(bytes.data() + kPlaneSizeAt + 8 * k);
    if (storage[k] != kStored && storage[k] != kZstd) {
      return Status::Corruption("{} chunk: plane {} has unknown storage {}", name, k, storage[k]);
    }
    if (size[k] > left) {
      return Status::Corruption("{} chunk: plane {} is {} bytes but only {} remain (truncated?)", name, k, size[k],
                                left);
    }
    if (storage[k] == kStored && size[k] != n) {
      return Status::Corruption("{} chunk: stored plane {} is {} bytes, expected {}", name, k, size[k], n);
    }
    left -= size[k];
  }
  if (left != 0) return Status::Corruption("{} chunk: {} bytes after the last plane", name, left);

  ThreadState& ts = State();
  uint8_t* scratch = ts.planes.Get(std::max<size_t>(kNumPlanes * n, 1));
  const uint8_t* planes[kNumPlanes];
  size_t at = kChunkPlanesHeaderBytes;
  for (size_t k = 0; k < kNumPlanes; ++k) {
    const char* src = bytes.data() + at;
    at += size[k];
    if (storage[k] == kStored) {
      planes[k] = reinterpret_cast<const uint8_t*>(src);
      continue;
    }
    if (ts.dctx == nullptr) return Status::Internal("{} chunk: cannot allocate a zstd context", name);
    uint8_t* dst = scratch + k * n;
    const size_t r = ZSTD_decompressDCtx(ts.dctx.get(), dst, n, src, size[k]);
    if (ZSTD_isError(r)) return Status::Corruption("{} chunk: plane {}: zstd: {}", name, k, ZSTD_getErrorName(r));
    if (r != n) return Status::Corruption("{} chunk: plane {} decompresses to {} bytes, expected {}", name, k, r, n);
    planes[k] = dst;
  }
  if (xor_base) {
    Merge<true>(planes, base.data(), n, out.data());
  } else {
    Merge<false>(planes, nullptr, n, out.data());
  }
  return Status::OK();
}

uint64_t ChunkHash(std::span<const float> data) { return XXH64(data.data(), data.size_bytes(), 0); }

}  // namespace tf::checkpoint
