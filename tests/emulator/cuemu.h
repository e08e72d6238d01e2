// cuemu: a CPU emulator for TrainFlow's CUDA kernels, so that the kernels and the GPU model code
// run (slowly) in CI, which has the CUDA toolkit but no GPU. It is a test tool, not a backend.
//
// tests/emulator/cu_to_cpp rewrites each kernels/*.cu and comm/*.cu into C++ that g++ compiles
// with this header included first: `kernel<<<grid, block, smem, stream>>>(args)` becomes
// `::cuemu::Launch(grid, block, smem, stream).Run(kernel)(args)` and `extern __shared__ T x[]` a
// pointer to the block's dynamic shared memory. Blocks run one after another; a block's threads
// are fibers on one host thread, switched only at synchronisation points (__syncthreads, warp
// intrinsics, ldmatrix/mma); warp collectives compute the PTX result from all 32 lanes; cp.async
// copies complete at the wait_group that covers them. Device memory is host memory, 0xFF (NaN)
// on allocation, dynamic shared memory 0xFF per block; streams execute at once. cuBLAS(Lt) and
// NCCL are emulated (cublas_emu.cpp, nccl_emu.cpp), cuDNN is not. What it checks and cannot:
// docs/cuda.md, "The CPU emulator" and "tests/emulator/cuemu.h".
//
// Thread safety: launches from different host threads are serialised (one emulated GPU).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---- Keywords the host compiler does not know ----------------------------------------------------
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__ static  // one object per kernel instantiation; blocks run one at a time
#undef __constant__
#define __constant__ static

namespace cuemu {

struct ThreadState {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  int linear = 0;  // thread index within the block
  int lane = 0;
  int warp = 0;
};
// The CUDA thread being executed on this host thread (only valid inside a kernel).
ThreadState& Current();

// ---- Launches ------------------------------------------------------------------------------------
using KernelBody = void (*)(void* closure);
// Runs closure(body) once per thread of every block. Returns false (and sets the error returned by
// cudaGetLastError) when the configuration is invalid; the kernel then does not run.
void RunGrid(const void* kernel_id, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, KernelBody body,
             void* closure);

class Launch {
 public:
  Launch(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr)
      : grid_(grid), block_(block), smem_(smem), stream_(stream) {}
  template <typename... P>
  auto Run(void (*kernel)(P...)) {
    return [this, kernel](auto&&... args) {
      // Arguments are converted to the parameter types once, on the host, as cudaLaunchKernel does.
      struct Closure {
        void (*k)(P...);
        std::tuple<std::decay_t<P>...> a;
      } c{kernel, std::tuple<std::decay_t<P>...>(std::forward<decltype(args)>(args)...)};
      RunGrid(reinterpret_cast<const void*>(kernel), grid_, block_, smem_, stream_,
              [](void* p) {
                auto* cl = static_cast<Closure*>(p);
                std::apply([cl](auto... a) { cl->k(a...); }, cl->a);
              },
              &c);
    };
  }

 private:
  dim3 grid_, block_;
  size_t smem_;
  cudaStream_t stream_;
};

void* DynamicShared();

// Host-side checks shared with the cuBLAS emulation: [p, p + bytes) lies inside one live
// cudaMalloc allocation; s is the default stream or a live stream.
bool InAllocation(const void* p, size_t bytes);
bool ValidStream(cudaStream_t s);

// ---- Synchronisation and warp collectives (all called from inside a kernel) -----------------------
void SyncThreads();
// Waits until every live lane in `mask` reached a warp collective; `payload` (bytes <= 64) is this
// lane's operand. Returns the 32 lanes' payloads (64 bytes each); valid until WarpRelease().
const unsigned char* WarpGather(unsigned mask, const void* payload, size_t bytes);
void WarpRelease(unsigned mask);

template <typename T>
T ShuffleFrom(unsigned mask, T value, int (*src)(int lane, int arg, int width), int arg, int width) {
  static_assert(sizeof(T) <= 64);
  const unsigned char* all = WarpGather(mask, &value, sizeof(T));
  const int lane = Current().lane;
  int from = src(lane, arg, width);
  T out;
  std::memcpy(&out, all + 64 * from, sizeof(T));
  WarpRelease(mask);
  return out;
}
inline int SrcIdx(int lane, int arg, int width) { return (lane / width) * width + ((arg % width + width) % width); }
inline int SrcXor(int lane, int arg, int width) {
  const int s = lane ^ arg;
  return (s / width == lane / width) ? s : lane;
}
inline int SrcDown(int lane, int arg, int width) {
  const int s = lane + arg;
  return (s / width == lane / width) ? s : lane;
}
inline int SrcUp(int lane, int arg, int width) {
  const int s = lane - arg;
  return (s >= 0 && s / width == lane / width) ? s : lane;
}
unsigned Ballot(unsigned mask, bool pred);

// Tensor-core instructions used by kernels/flash_attention.cu (PTX ISA semantics).
void LdMatrixX4(uint32_t (&r)[4], const void* row_address, bool trans);
void MmaM16N8K16Bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// cp.async: queued in the current group; performed by CpAsyncWait when at most `pending` newer
// committed groups may stay in flight. valid_bytes < bytes zero-fills the rest.
void CpAsync(void* smem, const void* gmem, int bytes, int valid_bytes);
void CpAsyncCommit();
void CpAsyncWait(int pending);

}  // namespace cuemu

// ---- Built-in variables -----------------------------------------------------------------------------
#define threadIdx (::cuemu::Current().thread_idx)
#define blockIdx (::cuemu::Current().block_idx)
#define blockDim (::cuemu::Current().block_dim)
#define gridDim (::cuemu::Current().grid_dim)
#ifndef warpSize
#define warpSize 32
#endif

// ---- Intrinsics (host definitions of the device functions the kernels call) ----------------------
inline void __syncthreads() { ::cuemu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuemu::WarpRelease(mask); }
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return ::cuemu::ShuffleFrom(mask, v, ::cuemu::SrcIdx, src, width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::cuemu::ShuffleFrom(mask, v, ::cuemu::SrcXor, lane_mask, width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::cuemu::ShuffleFrom(mask, v, ::cuemu::SrcDown, static_cast<int>(delta), width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::cuemu::ShuffleFrom(mask, v, ::cuemu::SrcUp, static_cast<int>(delta), width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return ::cuemu::Ballot(mask, pred != 0); }
inline int __any_sync(unsigned mask, int pred) { return ::cuemu::Ballot(mask, pred != 0) != 0; }
inline int __all_sync(unsigned mask, int pred) { return ::cuemu::Ballot(mask, pred != 0) == ::cuemu::Ballot(mask, true); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float __frcp_rn(float x) { return 1.f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
// CUDA's global min/max overloads for integer and floating-point arguments.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}
// cuda_runtime.h's typed overload (declared only for nvcc).
template <typename... P>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
// Atomics: fibers switch only at synchronisation points, so a plain read-modify-write is atomic.
template <typename T>
inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <typename T>
inline T atomicMax(T* p, T v) { T old = *p; *p = std::max(old, v); return old; }
template <typename T>
inline T atomicMin(T* p, T v) { T old = *p; *p = std::min(old, v); return old; }
template <typename T>
inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
template <typename T>
inline T atomicCAS(T* p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }

// ---- cub::DeviceRadixSort (kernels/encoder.cu): a stable sort by key, as LSD radix sort is --------
namespace cub {
struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, int n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 256;  // any non-zero size: the caller must allocate and pass it back
      return cudaSuccess;
    }
    if (n < 0 || keys_in == nullptr || keys_out == nullptr || values_in == nullptr || values_out == nullptr) {
      return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
    }
    using U = std::make_unsigned_t<K>;
    const U bits = end_bit - begin_bit >= int(sizeof(K) * 8) ? U(~U(0)) : U((U(1) << (end_bit - begin_bit)) - 1);
    auto key_of = [&](int i) {
      U u = static_cast<U>(keys_in[i]);
      if constexpr (std::is_signed_v<K>) u ^= U(1) << (sizeof(K) * 8 - 1);  // radix order of signed keys
      return static_cast<U>((u >> begin_bit) & bits);
    };
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key_of(a) < key_of(b); });
    std::vector<K> k(n);
    std::vector<V> v(n);
    for (int i = 0; i < n; ++i) {
      k[i] = keys_in[order[i]];
      v[i] = values_in[order[i]];
    }
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), values_out);
    return cudaSuccess;
  }
};
}  // namespace cub
