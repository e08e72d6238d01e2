// Gradient compression codecs: how a bucket of fp32 gradients is encoded before it travels and
// decoded (and accumulated) after. One definition of each codec's math (comm/codec_math.h,
// __host__ __device__) with a CPU implementation here and a CUDA implementation (namespace
// tf::comm::cuda, comm/codec.cu) that produce the same bytes for the same inputs.
//
// Codecs (`--compression` specs): none (fp32), bf16, fp16 (nearest even; fp16 saturates), int8 /
// int8-sr (per-block fp32 scale + int8 codes, nearest or stochastic rounding), sign (1 bit plus a
// per-block scale = mean |y|), topk:D (the largest fraction D of each chunk as (index, value)
// pairs; sparse: gathered, never summed in encoded form). Rounding rules, encoded layouts, ratios:
// docs/compression.md. Dense codecs encode any contiguous sub-range independently (EncodedBytes
// depends on the element count only). Error feedback: with a residual r, Encode() encodes
// y = x + r and stores r = y - Decode(Encode(y)): nothing is lost, only delayed.
//
// Thread safety: all functions are pure over their arguments (CPU ones parallelise with OpenMP).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

#if defined(TF_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace tf::comm {

enum class CodecKind { kNone, kBF16, kFP16, kInt8, kSign, kTopK };

struct CodecConfig {
  CodecKind kind = CodecKind::kNone;
  int block = 256;            // int8 / sign: elements per scale block
  bool stochastic = false;    // int8: stochastic rounding
  double density = 0.01;      // topk: fraction of elements sent, in (0, 1]
  int topk_chunk = 1024;      // topk: selection chunk
  bool lossy() const { return kind != CodecKind::kNone; }
  bool sparse() const { return kind == CodecKind::kTopK; }
};

// Parses "none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01" (density in (0,1]).
// Errors name the spec and the accepted forms.
StatusOr<CodecConfig> ParseCodec(std::string_view spec);
// Canonical spec string ("topk:0.01", ...), the inverse of ParseCodec.
std::string CodecName(const CodecConfig& c);

// OK when c's fields are in range: density in (0, 1]; block (int8, sign) a multiple of 32 in
// [32, 65536]; topk_chunk in [1, 4096]. Every other function REQUIRES a valid config (the CUDA
// entry points check and return this Status).
Status ValidateCodec(const CodecConfig& c);

// Bytes of the encoded form of n elements (layouts: docs/compression.md):
//   none 4n; bf16, fp16 2n; int8 4*ceil(n/block) + 4*ceil(n/4) (scales, then codes padded with zero
//   bytes to a multiple of 4); sign 4*ceil(n/block) + 4*ceil(n/32) (scales, then bit words);
//   topk 8*TopKPairs(c, n) (all uint32 indices, then all fp32 values).
size_t EncodedBytes(const CodecConfig& c, int64_t n);
// topk: the number of (index, value) pairs encoding n elements (0 for the other codecs).
int64_t TopKPairs(const CodecConfig& c, int64_t n);
// Uncompressed bytes / encoded bytes for n elements.
double CompressionRatio(const CodecConfig& c, int64_t n);

// Encodes x[0..n) (plus residual, when non-null) into out (EncodedBytes(c, n) bytes, all written,
// padding included), updating the residual as described above. `seed` feeds stochastic rounding
// (callers pass a per-step, per-bucket value so runs repeat exactly, mixed with the rank so that
// ranks round independently). For kNone, copies the fp32 values (y = x + r, and r = 0).
// REQUIRES: ValidateCodec(c).ok(); n >= 0 (topk: n < 2^32); out does not alias x or residual.
void Encode(const CodecConfig& c, const float* x, float* residual, int64_t n, void* out, uint64_t seed);
// acc[0..n) += scale * Decode(in), where in is the encoding of n elements (each element as one
// fmaf(scale, decoded, acc)). REQUIRES: in does not alias acc.
void DecodeAccumulate(const CodecConfig& c, const void* in, int64_t n, float scale, float* acc);

#if defined(TF_WITH_CUDA)
namespace cuda {
// Device versions on `stream`; same bytes as the CPU versions for the same inputs. Pointers are
// device pointers. Return errors only for launch failures.
Status Encode(const CodecConfig& c, const float* x, float* residual, int64_t n, void* out, uint64_t seed,
              cudaStream_t stream);
Status DecodeAccumulate(const CodecConfig& c, const void* in, int64_t n, float scale, float* acc,
                        cudaStream_t stream);
}  // namespace cuda
#endif

}  // namespace tf::comm
