// Device-side helpers shared by the .cu kernel files (not a public header): fp32/bf16 loads and
// stores (math is always fp32), launch checking, and grid sizing. Kernel files follow STYLE.md:
// a static __global__ kernel, a static launcher taking a stream, one exported entry point that
// validates arguments once and returns a Status.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda_runtime.h"

namespace tf::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// V consecutive elements of T moved by one load/store instruction (sizeof(T) * V = 2, 4, 8 or 16
// bytes: the widest global access is 16 bytes). Memory-bound kernels take kVec16<T> elements per
// access when their pointers allow (VecAligned), else V = 1, the same code with scalar accesses.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  static_assert(V >= 1 && (V & (V - 1)) == 0 && sizeof(T) * V <= 16, "Vec: 1, 2, 4, ... elements, at most 16 bytes");
  T v[V];
};
template <typename T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

template <int V, typename T>
__device__ __forceinline__ Vec<T, V> LoadVec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}
template <int V, typename T>
__device__ __forceinline__ void StoreVec(T* p, const Vec<T, V>& x) {
  *reinterpret_cast<Vec<T, V>*>(p) = x;
}

// Whether every pointer (nullptr allowed) is a multiple of `bytes`.
template <typename... P>
bool VecAligned(size_t bytes, const P*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}

// Status with a plain-string message (the fmt-based factories are for host C++ files).
inline Status Error(StatusCode code, const std::string& message) { return Status(code, message); }
inline Status InvalidArgument(const std::string& message) { return Status(StatusCode::kInvalidArgument, message); }

inline unsigned CeilDiv(long a, long b) { return static_cast<unsigned>((a + b - 1) / b); }

// Checks the last launch; returns its error as a Status naming the kernel.
inline Status CheckLaunch(const char* kernel, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return CudaError(err, kernel, file, line);
  return Status::OK();
}
#define TF_CHECK_LAUNCH(name) ::tf::cuda::CheckLaunch(name, __FILE__, __LINE__)

// Calls f.template operator()<T>() with T = float or __nv_bfloat16 for `dt`.
template <typename F>
Status DispatchDType(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: return f.template operator()<float>();
    case DType::kBF16: return f.template operator()<__nv_bfloat16>();
  }
  return InvalidArgument("unknown dtype");
}

}  // namespace tf::cuda
