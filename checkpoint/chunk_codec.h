// Lossless codecs for one chunk of fp32 checkpoint data (weights, AdamW moments, residuals),
// optionally as a delta against the same chunk of an earlier (base) checkpoint. An encoded chunk
// is self-describing: DecodeChunk needs nothing but its bytes and, for kXorPlanes, the base.
//
// Byte layout (all integers little-endian; the host must be little-endian, static_assert'ed):
//   offset 0   4 bytes  magic "TFCK" (kChunkMagic)
//          4   u8       format version (kChunkFormatVersion = 1)
//          5   u8       ChunkEncoding
//          6   u16      reserved, 0
//          8   u64      n, the element count
//   kRaw:  16  4n bytes the floats' bytes as they are                (total kChunkHeaderBytes + 4n)
//   kPlanes, kXorPlanes (word w_i = bits(data[i]), or bits(data[i]) ^ bits(base[i]) for XOR):
//         16   u8[4]    plane k's storage: 0 = stored as is, 1 = one or more zstd frames
//         20   u8[4]    reserved, 0
//         24   u64[4]   plane k's stored size in bytes (a stored plane is exactly n bytes)
//         56   planes 0..3 back to back; plane k is byte k of every w_i: (w_i >> 8k) & 0xff
// EncodeChunk's result is at most kChunkHeaderBytes + 4n bytes (raw is always a candidate).
//
// Thread safety: functions are reentrant. Each thread keeps its own zstd contexts and scratch
// buffers (thread_local, about 8 bytes per element of the largest chunk it has coded), reused
// across calls and freed when the thread exits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/byte_buffer.h"
#include "base/status.h"

namespace tf::checkpoint {

enum class ChunkEncoding : uint8_t { kRaw = 0, kPlanes = 1, kXorPlanes = 2 };

inline constexpr char kChunkMagic[4] = {'T', 'F', 'C', 'K'};
inline constexpr uint8_t kChunkFormatVersion = 1;
inline constexpr size_t kChunkHeaderBytes = 16;        // every encoding
inline constexpr size_t kChunkPlanesHeaderBytes = 56;  // kPlanes and kXorPlanes, plane table included

// "raw", "planes", "xor-planes".
std::string_view EncodingName(ChunkEncoding e);
// The inverse of EncodingName; InvalidArgument naming `name` otherwise.
StatusOr<ChunkEncoding> ParseEncoding(std::string_view name);

// zstd's fastest level: next to no match search, which fp32 planes barely reward.
inline constexpr int kChunkFastestZstdLevel = -131072;

struct ChunkCodecOptions {
  // zstd level for the planes, with Huffman-coded literals kept at every level (plain zstd drops
  // them at negative levels, and they are nearly all that planes gain). The default encodes
  // 1.4-2.4x faster than level 1, its ratio within 0.5% of level 1's or better, and beats level 3
  // on both (bench/chunk_codec_bench.cpp). 0 means zstd's default (3); clamped to zstd's range.
  int zstd_level = kChunkFastestZstdLevel;
  // Also try kPlanes (without it: raw, and kXorPlanes when there is a base).
  bool try_planes = true;
};

struct EncodedChunk {
  ChunkEncoding encoding;
  std::string bytes;
};

// The smallest of kRaw, kPlanes (if o.try_planes) and, when base is non-empty, kXorPlanes; ties go
// to raw, then planes. With a base and try_planes, both plane encodings are computed (twice the
// time of one). Deterministic: the same inputs, options and zstd version give the same bytes.
// REQUIRES: base empty or base.size() == data.size() (otherwise base is ignored; asserts in debug).
EncodedChunk EncodeChunk(std::span<const float> data, std::span<const float> base,
                         const ChunkCodecOptions& o = {});
// As EncodeChunk, into out (overwritten; its memory is kept, so a buffer reused chunk after chunk
// is allocated and faulted in once, and is aligned for direct I/O). Returns the encoding chosen.
ChunkEncoding EncodeChunkInto(std::span<const float> data, std::span<const float> base, const ChunkCodecOptions& o,
                              ByteBuffer& out);

// data in exactly the given encoding (for tests and benchmarks; EncodeChunk picks for callers).
// InvalidArgument for kXorPlanes when base.size() != data.size().
StatusOr<std::string> EncodeChunkAs(ChunkEncoding encoding, std::span<const float> data,
                                    std::span<const float> base, const ChunkCodecOptions& o = {});

// Decodes an EncodeChunk result into out, bit-exactly. base is read only for kXorPlanes. Corruption
// naming what is wrong for any malformed input, never a crash: short or truncated bytes, bad magic,
// version, encoding or reserved bytes, an element count other than out.size(), plane sizes that
// do not add up, zstd errors, a kXorPlanes chunk with base.size() != out.size(). out is written
// only on success, and may be base itself (in-place delta application).
Status DecodeChunk(std::string_view bytes, std::span<const float> base, std::span<float> out);

// xxh64 (seed 0) of data's bytes: equal hashes mark a chunk unchanged since the base.
uint64_t ChunkHash(std::span<const float> data);

}  // namespace tf::checkpoint
