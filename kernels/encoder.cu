// CUDA token + position embedding (kernels/encoder.h), fp32 or bf16 storage, fp32 math.
//
// encoder_backward is deterministic, with no atomic accumulation and no host synchronisation:
// (token, position) pairs are sorted by token (cub::DeviceRadixSort, stable: the order is unique),
// one warp per (run of equal tokens, 128-channel slice) adds the run's dout rows into dwte in
// position order (one writer per element, the CPU's order: fp32 results bit-identical to
// cpu::encoder_backward), and one thread per (t, c) adds dout over b in order into dwpe.
// Steps, access widths and a hot token's cost: docs/cuda.md, "kernels/encoder.cu".
#if !defined(TRAINFLOW_CUDA_EMULATION)  // tests/emulator provides a stable-sort cub::DeviceRadixSort
#include <cub/device/device_radix_sort.cuh>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/encoder.h"

namespace tf::cuda {
namespace {

constexpr int kBlock = 256;
constexpr unsigned kFullMask = 0xffffffffu;
// WteGradKernel: warps per block, and channels per warp (kChannelsPerLane per lane, lane-interleaved
// so that each load instruction of a warp reads 32 consecutive elements).
constexpr int kWarpsPerBlock = kBlock / 32;
constexpr int kChannelsPerLane = 4;
constexpr int kSlice = 32 * kChannelsPerLane;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// One block per position (b, t); threads stride over the row's V-element vectors (C % V == 0).
template <typename T, int V>
__global__ void EncoderForwardKernel(T* out, const int32_t* inp, const T* wte, const T* wpe, int T_, int C) {
  const long bt = blockIdx.x;
  const int tok = inp[bt];
  if (tok < 0) return;  // invalid id (caller's contract): never read out of bounds
  const T* e = wte + long(tok) * C;
  const T* p = wpe + long(bt % T_) * C;
  T* o = out + bt * C;
  for (int k = threadIdx.x; k < C / V; k += blockDim.x) {
    const Vec<T, V> ev = LoadVec<V>(e + k * V), pv = LoadVec<V>(p + k * V);
    Vec<T, V> ov;
#pragma unroll
    for (int j = 0; j < V; ++j) ov.v[j] = FromFloat<T>(ToFloat(ev.v[j]) + ToFloat(pv.v[j]));
    StoreVec<V>(o + k * V, ov);
  }
}

__global__ void IotaKernel(int32_t* pos, int n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    pos[i] = static_cast<int32_t>(i);
  }
}

// Prefetches row[cs, ce) into L2 (a hint: no fault, no effect on results). REQUIRES: cs < ce.
template <typename T>
__device__ __forceinline__ void PrefetchSlice(const T* row, int cs, int ce) {
  constexpr int kLineElems = 128 / sizeof(T);  // elements per 128-byte line
  // (Generic-address prefetch: PTX "prefetch.L2" without a state space.)
#if !defined(TRAINFLOW_CUDA_EMULATION)  // a hint only: the CPU emulator skips it
  for (int c = cs; c < ce; c += kLineElems) asm volatile("prefetch.L2 [%0];" ::"l"(row + c));
  asm volatile("prefetch.L2 [%0];" ::"l"(row + ce - 1));  // the last line if cs is not line-aligned
#endif
}

// grid (CeilDiv(N, kWarpsPerBlock), CeilDiv(C, kSlice)), kBlock threads. sorted_tok/sorted_pos (N).
// V = 1: lane l owns channels cs + l + 32j (j < kChannelsPerLane); V = kChannelsPerLane (C % V == 0,
// aligned rows): lane l owns the V contiguous channels cs + l*V + j, moved by one access each.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    WteGradKernel(T* dwte, const T* dout, const int32_t* sorted_tok, const int32_t* sorted_pos, int N, int C) {
  static_assert(V == 1 || V == kChannelsPerLane);
  const int lane = threadIdx.x % 32;
  const long i = long(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= N) return;  // warp-uniform
  const int tok = sorted_tok[i];
  if (tok < 0 || (i > 0 && sorted_tok[i - 1] == tok)) return;  // not the first of its run (warp-uniform)
  const int cs = blockIdx.y * kSlice, ce = min(C, cs + kSlice);
  // Channel j of this lane.
  auto channel = [&](int j) { return V == 1 ? cs + lane + 32 * j : cs + lane * V + j; };
  // Adds row[channel(j)] for every j into acc (set = true: assigns).
  auto add_row = [&](float* acc, const T* row, bool set) {
    if constexpr (V == 1) {
#pragma unroll
      for (int j = 0; j < kChannelsPerLane; ++j) {
        const int c = channel(j);
        const float x = c < C ? ToFloat(row[c]) : 0.0f;
        acc[j] = set ? x : acc[j] + x;
      }
    } else {
      if (channel(0) < C) {  // the whole vector is inside the row (C % V == 0)
        const Vec<T, V> xv = LoadVec<V>(row + channel(0));
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = set ? ToFloat(xv.v[j]) : acc[j] + ToFloat(xv.v[j]);
      } else if (set) {
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = 0.0f;
      }
    }
  };

  T* row = dwte + long(tok) * C;
  float acc[kChannelsPerLane];
  add_row(acc, row, true);
  // The run is sorted_tok[i .. i+len); walk it 32 entries ("a chunk") at a time. The entries of the
  // run form a prefix of each chunk (the array is sorted), so the count is the ballot's popcount.
  // Each lane prefetches (to L2) the slice of its entry's dout row, one chunk ahead of the
  // sequential summation, so a hot token's walk is bound by L2 rather than DRAM latency.
  long k0 = i;
  int pos = 0, count = 0;
  {
    const long k = k0 + lane;
    const bool same = k < N && sorted_tok[k] == tok;  // true on lane 0 (entry i itself)
    pos = same ? sorted_pos[k] : 0;
    count = __popc(__ballot_sync(kFullMask, same));
    if (same) PrefetchSlice(dout + long(pos) * C, cs, ce);
  }
  for (;;) {
    // Look ahead one chunk (only if the current one is full, i.e. the run may continue).
    bool next_same = false;
    int next_pos = 0, next_count = 0;
    if (count == 32) {  // warp-uniform
      const long k = k0 + 32 + lane;
      next_same = k < N && sorted_tok[k] == tok;
      next_pos = next_same ? sorted_pos[k] : 0;
      next_count = __popc(__ballot_sync(kFullMask, next_same));
      if (next_same) PrefetchSlice(dout + long(next_pos) * C, cs, ce);
    }
    // Sum the current chunk's rows in position order.
#pragma unroll 8
    for (int l = 0; l < count; ++l) {
      const long p = __shfl_sync(kFullMask, pos, l);
      add_row(acc, dout + p * C, false);
    }
    if (count < 32) break;  // warp-uniform: the run ended in this chunk
    k0 += 32;
    pos = next_pos;
    count = next_count;
  }
  if constexpr (V == 1) {
#pragma unroll
    for (int j = 0; j < kChannelsPerLane; ++j) {
      const int c = channel(j);
      if (c < C) row[c] = FromFloat<T>(acc[j]);
    }
  } else if (channel(0) < C) {
    Vec<T, V> ov;
#pragma unroll
    for (int j = 0; j < V; ++j) ov.v[j] = FromFloat<T>(acc[j]);
    StoreVec<V>(row + channel(0), ov);
  }
}

// One thread per (t, V channels) of dwpe (T, C): dwpe[t, c] += sum_b dout[b, t, c], b ascending.
template <typename T, int V>
__global__ void WpeGradKernel(T* dwpe, const T* dout, int B, int T_, int C) {
  const long tc_count = long(T_) * C;
  for (long q = blockIdx.x * long(blockDim.x) + threadIdx.x; q < tc_count / V; q += long(gridDim.x) * blockDim.x) {
    const long tc = q * V;
    const Vec<T, V> w = LoadVec<V>(dwpe + tc);
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = ToFloat(w.v[e]);
#pragma unroll 4
    for (int b = 0; b < B; ++b) {
      const Vec<T, V> d = LoadVec<V>(dout + b * tc_count + tc);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += ToFloat(d.v[e]);
    }
    Vec<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = FromFloat<T>(acc[e]);
    StoreVec<V>(dwpe + tc, o);
  }
}

unsigned Grid(long n) { return std::min<unsigned>(CeilDiv(n, kBlock), 65535u); }

Status CheckShape(const char* op, int B, int T, int C) {
  if (B < 0 || T < 0 || C < 0) {
    return InvalidArgument(std::string(op) + ": negative shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " C=" + std::to_string(C));
  }
  if (static_cast<long>(B) * T > INT_MAX) {
    return InvalidArgument(std::string(op) + ": B*T = " + std::to_string(static_cast<long>(B) * T) +
                           " positions exceed the int32 range");
  }
  return Status::OK();
}

// Bytes of cub's temporary storage for sorting n (int32 key, int32 value) pairs (host-side query).
Status SortTempBytes(int n, size_t* bytes) {
  *bytes = 0;
  TF_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, *bytes, static_cast<const int32_t*>(nullptr),
                                                          static_cast<int32_t*>(nullptr),
                                                          static_cast<const int32_t*>(nullptr),
                                                          static_cast<int32_t*>(nullptr), n));
  return Status::OK();
}

// Scratch layout: sorted tokens, positions (in), sorted positions, cub temp; each 256-byte aligned.
size_t ScratchBytes(int n, size_t sort_bytes) { return 3 * AlignUp(size_t(n) * sizeof(int32_t)) + AlignUp(sort_bytes); }

}  // namespace

Status encoder_forward(void* out, const int32_t* inp, const void* wte, const void* wpe, int B, int T, int C, DType dt,
                       cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckShape("encoder_forward", B, T, C));
  const long n = static_cast<long>(B) * T * C;
  if (n == 0) return Status::OK();
  if (out == nullptr || inp == nullptr || wte == nullptr || wpe == nullptr) {
    return InvalidArgument("encoder_forward: null pointer");
  }
  return DispatchDType(dt, [&]<typename E>() {
    constexpr int kV = kVec16<E>;
    if (C % kV == 0 && VecAligned(sizeof(E) * kV, out, wte, wpe)) {
      const int threads = std::min<int>(kBlock, static_cast<int>(CeilDiv(C / kV, 32)) * 32);  // no idle warps
      EncoderForwardKernel<E, kV><<<B * T, threads, 0, stream>>>(
          static_cast<E*>(out), inp, static_cast<const E*>(wte), static_cast<const E*>(wpe), T, C);
    } else {
      EncoderForwardKernel<E, 1><<<B * T, kBlock, 0, stream>>>(static_cast<E*>(out), inp, static_cast<const E*>(wte),
                                                                static_cast<const E*>(wpe), T, C);
    }
    return TF_CHECK_LAUNCH("EncoderForwardKernel");
  });
}

StatusOr<size_t> encoder_backward_scratch_bytes(int B, int T) {
  TF_RETURN_IF_ERROR(CheckShape("encoder_backward_scratch_bytes", B, T, 0));
  const int n = B * T;
  size_t sort_bytes = 0;
  TF_RETURN_IF_ERROR(SortTempBytes(n, &sort_bytes));
  return ScratchBytes(n, sort_bytes);
}

Status encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* inp, int B, int T, int C, DType dt,
                        void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckShape("encoder_backward", B, T, C));
  const int n = B * T;
  if (n == 0 || C == 0) return Status::OK();
  if (dwte == nullptr || dwpe == nullptr || dout == nullptr || inp == nullptr || scratch == nullptr) {
    return InvalidArgument("encoder_backward: null pointer");
  }
  if (reinterpret_cast<uintptr_t>(scratch) % kAlign != 0) {
    return InvalidArgument("encoder_backward: scratch is not " + std::to_string(kAlign) + "-byte aligned");
  }
  size_t sort_bytes = 0;
  TF_RETURN_IF_ERROR(SortTempBytes(n, &sort_bytes));
  if (scratch_bytes < ScratchBytes(n, sort_bytes)) {
    return InvalidArgument("encoder_backward: scratch holds " + std::to_string(scratch_bytes) + " bytes, needs " +
                           std::to_string(ScratchBytes(n, sort_bytes)));
  }
  char* s = static_cast<char*>(scratch);
  const size_t ints = AlignUp(size_t(n) * sizeof(int32_t));
  int32_t* sorted_tok = reinterpret_cast<int32_t*>(s);
  int32_t* pos = reinterpret_cast<int32_t*>(s + ints);
  int32_t* sorted_pos = reinterpret_cast<int32_t*>(s + 2 * ints);
  void* sort_temp = s + 3 * ints;

  IotaKernel<<<Grid(n), kBlock, 0, stream>>>(pos, n);
  TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("IotaKernel"));
  TF_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, inp, sorted_tok, pos, sorted_pos, n, 0, 32, stream));
  return DispatchDType(dt, [&]<typename E>() -> Status {
    const dim3 grid(CeilDiv(n, kWarpsPerBlock), CeilDiv(C, kSlice));
    constexpr int kV = kVec16<E>;
    const bool wide = VecAligned(16, dwte, dwpe, dout);  // (then rows are aligned when C % V == 0)
    if (wide && C % kChannelsPerLane == 0) {
      WteGradKernel<E, kChannelsPerLane><<<grid, kBlock, 0, stream>>>(
          static_cast<E*>(dwte), static_cast<const E*>(dout), sorted_tok, sorted_pos, n, C);
    } else {
      WteGradKernel<E, 1><<<grid, kBlock, 0, stream>>>(static_cast<E*>(dwte), static_cast<const E*>(dout), sorted_tok,
                                                       sorted_pos, n, C);
    }
    TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("WteGradKernel"));
    const long tc = static_cast<long>(T) * C;
    if (wide && C % kV == 0) {
      WpeGradKernel<E, kV><<<Grid(tc / kV), kBlock, 0, stream>>>(static_cast<E*>(dwpe), static_cast<const E*>(dout),
                                                                B, T, C);
    } else {
      WpeGradKernel<E, 1><<<Grid(tc), kBlock, 0, stream>>>(static_cast<E*>(dwpe), static_cast<const E*>(dout), B, T, C);
    }
    return TF_CHECK_LAUNCH("WpeGradKernel");
  });
}

Status encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* inp, int B, int T, int C, DType dt,
                        cudaStream_t stream) {
  // Empty or invalid shapes: the overload above validates (and needs no scratch).
  if (B <= 0 || T <= 0 || C <= 0) return encoder_backward(dwte, dwpe, dout, inp, B, T, C, dt, nullptr, 0, stream);
  TF_ASSIGN_OR_RETURN(const size_t bytes, encoder_backward_scratch_bytes(B, T));
  // (Aligned here rather than relying on the pool's alignment guarantee.)
  void* raw = nullptr;
  TF_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&raw, bytes + kAlign, stream));
  void* scratch = reinterpret_cast<void*>(AlignUp(reinterpret_cast<uintptr_t>(raw)));
  const Status status = encoder_backward(dwte, dwpe, dout, inp, B, T, C, dt, scratch, bytes, stream);
  const cudaError_t free_err = cudaFreeAsync(raw, stream);
  TF_RETURN_IF_ERROR(status);
  TF_CUDA_RETURN_IF_ERROR(free_err);
  return Status::OK();
}

}  // namespace tf::cuda
