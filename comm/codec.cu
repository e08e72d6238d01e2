// CUDA gradient codecs (comm/codec.h, namespace tf::comm::cuda): the same bytes and residuals as
// the CPU codecs (comm/codec.cpp), from the same comm/codec_math.h functions.
//
// One fused encode kernel per codec (x and the residual read once; codes and the new residual
// written in the same pass) and one fused decode-and-accumulate kernel per codec: none/bf16/fp16
// one thread per element; int8/sign one warp per scale block (a scale pass, then a codes pass from
// L1/L2, in the reduction order the CPU replays); topk one thread block per chunk (a bitonic sort
// of the chunk's unique keys in shared memory gives exactly the CPU's selection, written in index
// order by a ballot/popc prefix count). Kernel shapes: docs/compression.md, "comm/codec.cu".
#include <algorithm>
#include <string>

#include "comm/codec.h"
#include "comm/codec_math.h"
#include "kernels/cuda_common.cuh"

namespace tf::comm::cuda {
namespace {

using namespace ::tf::comm::codec;  // NOLINT: the codec math

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr long kMaxGrid = 8192;  // grid-stride kernels: enough blocks to fill any current GPU

unsigned GridFor(long items, long per_block) {
  return static_cast<unsigned>(std::min(kMaxGrid, (items + per_block - 1) / per_block));
}
long CeilDiv(long a, long b) { return (a + b - 1) / b; }

// Global warp index and warp count of a grid of kThreads-thread blocks.
__device__ __forceinline__ long WarpId() { return (long(blockIdx.x) * kThreads + threadIdx.x) / 32; }
__device__ __forceinline__ long WarpCount() { return long(gridDim.x) * kWarps; }

// ---- none ----------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) EncodeNoneKernel(const float* x, float* r, long n, float* out) {
  for (long i = blockIdx.x * long(kThreads) + threadIdx.x; i < n; i += long(gridDim.x) * kThreads) {
    out[i] = Input(x, r, i);
    if (r != nullptr) r[i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads) DecodeNoneKernel(const float* in, long n, float scale, float* acc) {
  for (long i = blockIdx.x * long(kThreads) + threadIdx.x; i < n; i += long(gridDim.x) * kThreads) {
    acc[i] = Accumulate(acc[i], scale, in[i]);
  }
}

// ---- bf16 / fp16 ---------------------------------------------------------------------------------

template <bool kFp16>
__device__ __forceinline__ uint16_t HalfEncode(float y) {
  return kFp16 ? Fp16Encode(y) : Bf16Encode(y);
}
template <bool kFp16>
__device__ __forceinline__ float HalfDecode(uint16_t h) {
  return kFp16 ? Fp16Decode(h) : Bf16Decode(h);
}

template <bool kFp16>
__global__ void __launch_bounds__(kThreads) EncodeHalfKernel(const float* x, float* r, long n, uint16_t* out) {
  for (long i = blockIdx.x * long(kThreads) + threadIdx.x; i < n; i += long(gridDim.x) * kThreads) {
    const float y = Input(x, r, i);
    const uint16_t h = HalfEncode<kFp16>(y);
    out[i] = h;
    if (r != nullptr) r[i] = y - HalfDecode<kFp16>(h);
  }
}

template <bool kFp16>
__global__ void __launch_bounds__(kThreads) DecodeHalfKernel(const uint16_t* in, long n, float scale, float* acc) {
  for (long i = blockIdx.x * long(kThreads) + threadIdx.x; i < n; i += long(gridDim.x) * kThreads) {
    acc[i] = Accumulate(acc[i], scale, HalfDecode<kFp16>(in[i]));
  }
}

// ---- int8 ----------------------------------------------------------------------------------------

// codes has `padded` = 4*ceil(n/4) bytes; the bytes past n are zeroed.
template <bool kStochastic>
__global__ void __launch_bounds__(kThreads) EncodeInt8Kernel(const float* x, float* r, long n, int block, long n_blocks,
                                                             uint64_t key, float* scales, int8_t* codes, long padded) {
  const int lane = threadIdx.x % 32;
  for (long b = WarpId(); b < n_blocks; b += WarpCount()) {  // warp-uniform
    const long i0 = b * block;
    const int len = static_cast<int>(min(long(block), n - i0));
    uint32_t max_key = 0;
#pragma unroll 4  // several loads in flight per lane
    for (int j = lane; j < len; j += 32) max_key = max(max_key, MagnitudeKey(Input(x, r, i0 + j)));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) max_key = max(max_key, __shfl_xor_sync(kFullMask, max_key, off));
    const float s = Int8Scale(max_key);
    for (int j = lane; j < len; j += 32) {
      const long i = i0 + j;
      const float y = Input(x, r, i);
      const int8_t q = kStochastic ? Int8QuantizeStochastic(y, s, StochasticUniform(key, static_cast<uint64_t>(i)))
                                   : Int8QuantizeNearest(y, s);
      codes[i] = q;
      if (r != nullptr) r[i] = y - Int8Decode(q, s);
    }
    if (lane == 0) scales[b] = s;
  }
  if (blockIdx.x == 0 && threadIdx.x < padded - n) codes[n + threadIdx.x] = 0;
}

__global__ void __launch_bounds__(kThreads) DecodeInt8Kernel(const float* scales, const int8_t* codes, long n,
                                                             int block, long n_blocks, float scale, float* acc) {
  const int lane = threadIdx.x % 32;
  for (long b = WarpId(); b < n_blocks; b += WarpCount()) {
    const long i0 = b * block;
    const int len = static_cast<int>(min(long(block), n - i0));
    const float s = scales[b];
    for (int j = lane; j < len; j += 32) acc[i0 + j] = Accumulate(acc[i0 + j], scale, Int8Decode(codes[i0 + j], s));
  }
}

// ---- sign ----------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    EncodeSignKernel(const float* x, float* r, long n, int block, long n_blocks, float* scales, uint32_t* words) {
  const int lane = threadIdx.x % 32;
  for (long b = WarpId(); b < n_blocks; b += WarpCount()) {  // warp-uniform
    const long i0 = b * block;
    const int len = static_cast<int>(min(long(block), n - i0));
    float sum = 0.0f;  // lane l: |y[l]| + |y[l+32]| + ... in order (codec_math.h)
#pragma unroll 4
    for (int j = lane; j < len; j += 32) sum += fabsf(Input(x, r, i0 + j));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(kFullMask, sum, off);
    const float s = SignScale(__shfl_sync(kFullMask, sum, 0), len);
    for (int base = 0; base < len; base += 32) {  // warp-uniform: every lane reaches the ballot
      const int j = base + lane;
      const bool valid = j < len;
      const float y = valid ? Input(x, r, i0 + j) : 0.0f;
      const bool neg = valid && SignNegative(y);
      const uint32_t word = __ballot_sync(kFullMask, neg);
      if (valid && r != nullptr) r[i0 + j] = y - SignDecode(neg, s);
      if (lane == 0) words[(i0 + base) / 32] = word;
    }
    if (lane == 0) scales[b] = s;
  }
}

__global__ void __launch_bounds__(kThreads) DecodeSignKernel(const float* scales, const uint32_t* words, long n,
                                                             int block, long n_blocks, float scale, float* acc) {
  const int lane = threadIdx.x % 32;
  for (long b = WarpId(); b < n_blocks; b += WarpCount()) {
    const long i0 = b * block;
    const int len = static_cast<int>(min(long(block), n - i0));
    const float s = scales[b];
    for (int base = 0; base < len; base += 32) {
      const int j = base + lane;
      const uint32_t word = words[(i0 + base) / 32];  // one word per warp: a broadcast load
      if (j < len) acc[i0 + j] = Accumulate(acc[i0 + j], scale, SignDecode(((word >> lane) & 1u) != 0, s));
    }
  }
}

// ---- topk ----------------------------------------------------------------------------------------

// Block c encodes chunk c: elements [c*chunk, min(n, (c+1)*chunk)), sending k_full pairs (k_last
// for a partial last chunk) at pair offset c*k_full. Dynamic shared memory: pow2 uint64 keys,
// pow2 = the chunk length rounded up to a power of two (>= 2).
__global__ void __launch_bounds__(kThreads)
    EncodeTopKKernel(const float* x, float* r, long n, int chunk, int pow2, long k_full, long k_last, uint32_t* indices,
                     float* values) {
  extern __shared__ uint64_t keys[];
  __shared__ int warp_counts[kWarps];
  const long i0 = long(blockIdx.x) * chunk;
  const int len = static_cast<int>(min(long(chunk), n - i0));
  const long k = len == chunk ? k_full : k_last;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  for (int t = threadIdx.x; t < pow2; t += kThreads) {
    keys[t] = t < len ? TopKKey(Input(x, r, i0 + t), static_cast<uint32_t>(t)) : 0;
  }
  __syncthreads();
  // Bitonic sort, descending: in the merge of size `size`, pairs whose lower index has bit `size`
  // clear are ordered descending, the others ascending; the final merge (size = pow2) is descending.
  for (int size = 2; size <= pow2; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int t = threadIdx.x; t < pow2 / 2; t += kThreads) {
        const int lo = 2 * t - (t & (stride - 1));  // t's pair: lo has bit `stride` clear
        const int hi = lo + stride;
        const uint64_t a = keys[lo], b = keys[hi];
        const bool descending = (lo & size) == 0;
        if ((a < b) == descending && a != b) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  const uint64_t threshold = keys[k - 1];  // the k-th largest key: exactly k keys are >= it

  // Compaction in index order, kThreads elements per round.
  const long out0 = long(blockIdx.x) * k_full;
  long written = 0;                                   // the same in every thread
  for (int base = 0; base < len; base += kThreads) {  // block-uniform
    const int j = base + threadIdx.x;
    const bool valid = j < len;
    const float y = valid ? Input(x, r, i0 + j) : 0.0f;
    const bool sent = valid && TopKKey(y, static_cast<uint32_t>(j)) >= threshold;
    const uint32_t ballot = __ballot_sync(kFullMask, sent);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (sent) {
      const long p = out0 + written + before + __popc(ballot & ((1u << lane) - 1u));
      indices[p] = static_cast<uint32_t>(i0 + j);
      values[p] = y;
    }
    if (valid && r != nullptr) r[i0 + j] = sent ? 0.0f : y;
    written += total;
    __syncthreads();  // warp_counts is rewritten next round
  }
}

__global__ void __launch_bounds__(kThreads)
    DecodeTopKKernel(const uint32_t* indices, const float* values, long pairs, float scale, float* acc) {
  for (long p = blockIdx.x * long(kThreads) + threadIdx.x; p < pairs; p += long(gridDim.x) * kThreads) {
    const uint32_t i = indices[p];
    acc[i] = Accumulate(acc[i], scale, values[p]);
  }
}

// ---- Launchers -----------------------------------------------------------------------------------

Status LaunchEncodeInt8(const CodecConfig& c, const float* x, float* r, long n, void* out, uint64_t seed,
                        cudaStream_t stream) {
  const long n_blocks = CeilDiv(n, c.block);
  float* scales = static_cast<float*>(out);
  int8_t* codes = reinterpret_cast<int8_t*>(scales + n_blocks);
  const unsigned grid = GridFor(n_blocks, kWarps);
  const uint64_t key = StochasticKey(seed);
  if (c.stochastic) {
    EncodeInt8Kernel<true>
        <<<grid, kThreads, 0, stream>>>(x, r, n, c.block, n_blocks, key, scales, codes, CeilDiv(n, 4) * 4);
  } else {
    EncodeInt8Kernel<false>
        <<<grid, kThreads, 0, stream>>>(x, r, n, c.block, n_blocks, key, scales, codes, CeilDiv(n, 4) * 4);
  }
  return TF_CHECK_LAUNCH("EncodeInt8Kernel");
}

Status LaunchEncodeTopK(const CodecConfig& c, const float* x, float* r, long n, void* out, cudaStream_t stream) {
  const long chunk = c.topk_chunk;
  const long n_chunks = CeilDiv(n, chunk);
  int pow2 = 2;
  while (pow2 < chunk) pow2 *= 2;
  const long k_full = TopKPerChunk(c.density, chunk);
  const long k_last = TopKPerChunk(c.density, n - (n_chunks - 1) * chunk);
  uint32_t* indices = static_cast<uint32_t*>(out);
  float* values = reinterpret_cast<float*>(indices + TopKTotal(c.density, chunk, n));
  const size_t shared = size_t(pow2) * sizeof(uint64_t);  // <= 32 KiB (chunk <= kMaxTopKChunk)
  EncodeTopKKernel<<<static_cast<unsigned>(n_chunks), kThreads, shared, stream>>>(
      x, r, n, static_cast<int>(chunk), pow2, k_full, k_last, indices, values);
  return TF_CHECK_LAUNCH("EncodeTopKKernel");
}

// Argument checks shared by both entry points.
Status Check(const char* what, const CodecConfig& c, long n, const void* a, const void* b) {
  TF_RETURN_IF_ERROR(ValidateCodec(c));
  if (n < 0) return ::tf::cuda::InvalidArgument(std::string(what) + ": negative element count " + std::to_string(n));
  if (c.kind == CodecKind::kTopK && (n > long(0xffffffffL) || CeilDiv(n, c.topk_chunk) > long(0x7fffffff))) {
    return ::tf::cuda::InvalidArgument(std::string(what) + ": topk indexes elements with uint32 and runs one block " +
                                       "per chunk; n = " + std::to_string(n) + " is too large");
  }
  if (n > 0 && (a == nullptr || b == nullptr)) return ::tf::cuda::InvalidArgument(std::string(what) + ": null pointer");
  return Status::OK();
}

}  // namespace

Status Encode(const CodecConfig& c, const float* x, float* residual, int64_t n, void* out, uint64_t seed,
              cudaStream_t stream) {
  TF_RETURN_IF_ERROR(Check("codec Encode", c, n, x, out));
  if (n == 0) return Status::OK();
  const unsigned elem_grid = GridFor(n, kThreads);
  switch (c.kind) {
    case CodecKind::kNone:
      EncodeNoneKernel<<<elem_grid, kThreads, 0, stream>>>(x, residual, n, static_cast<float*>(out));
      return TF_CHECK_LAUNCH("EncodeNoneKernel");
    case CodecKind::kBF16:
      EncodeHalfKernel<false><<<elem_grid, kThreads, 0, stream>>>(x, residual, n, static_cast<uint16_t*>(out));
      return TF_CHECK_LAUNCH("EncodeHalfKernel<bf16>");
    case CodecKind::kFP16:
      EncodeHalfKernel<true><<<elem_grid, kThreads, 0, stream>>>(x, residual, n, static_cast<uint16_t*>(out));
      return TF_CHECK_LAUNCH("EncodeHalfKernel<fp16>");
    case CodecKind::kInt8: return LaunchEncodeInt8(c, x, residual, n, out, seed, stream);
    case CodecKind::kSign: {
      const long n_blocks = CeilDiv(n, c.block);
      float* scales = static_cast<float*>(out);
      EncodeSignKernel<<<GridFor(n_blocks, kWarps), kThreads, 0, stream>>>(
          x, residual, n, c.block, n_blocks, scales, reinterpret_cast<uint32_t*>(scales + n_blocks));
      return TF_CHECK_LAUNCH("EncodeSignKernel");
    }
    case CodecKind::kTopK: return LaunchEncodeTopK(c, x, residual, n, out, stream);
  }
  return ::tf::cuda::InvalidArgument("codec Encode: unknown codec kind");
}

Status DecodeAccumulate(const CodecConfig& c, const void* in, int64_t n, float scale, float* acc, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(Check("codec DecodeAccumulate", c, n, in, acc));
  if (n == 0) return Status::OK();
  const unsigned elem_grid = GridFor(n, kThreads);
  switch (c.kind) {
    case CodecKind::kNone:
      DecodeNoneKernel<<<elem_grid, kThreads, 0, stream>>>(static_cast<const float*>(in), n, scale, acc);
      return TF_CHECK_LAUNCH("DecodeNoneKernel");
    case CodecKind::kBF16:
      DecodeHalfKernel<false><<<elem_grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(in), n, scale, acc);
      return TF_CHECK_LAUNCH("DecodeHalfKernel<bf16>");
    case CodecKind::kFP16:
      DecodeHalfKernel<true><<<elem_grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(in), n, scale, acc);
      return TF_CHECK_LAUNCH("DecodeHalfKernel<fp16>");
    case CodecKind::kInt8: {
      const long n_blocks = CeilDiv(n, c.block);
      const float* scales = static_cast<const float*>(in);
      DecodeInt8Kernel<<<GridFor(n_blocks, kWarps), kThreads, 0, stream>>>(
          scales, reinterpret_cast<const int8_t*>(scales + n_blocks), n, c.block, n_blocks, scale, acc);
      return TF_CHECK_LAUNCH("DecodeInt8Kernel");
    }
    case CodecKind::kSign: {
      const long n_blocks = CeilDiv(n, c.block);
      const float* scales = static_cast<const float*>(in);
      DecodeSignKernel<<<GridFor(n_blocks, kWarps), kThreads, 0, stream>>>(
          scales, reinterpret_cast<const uint32_t*>(scales + n_blocks), n, c.block, n_blocks, scale, acc);
      return TF_CHECK_LAUNCH("DecodeSignKernel");
    }
    case CodecKind::kTopK: {
      const long pairs = TopKTotal(c.density, c.topk_chunk, n);
      const uint32_t* indices = static_cast<const uint32_t*>(in);
      DecodeTopKKernel<<<GridFor(pairs, kThreads), kThreads, 0, stream>>>(
          indices, reinterpret_cast<const float*>(indices + pairs), pairs, scale, acc);
      return TF_CHECK_LAUNCH("DecodeTopKKernel");
    }
  }
  return ::tf::cuda::InvalidArgument("codec DecodeAccumulate: unknown codec kind");
}

}  // namespace tf::comm::cuda
