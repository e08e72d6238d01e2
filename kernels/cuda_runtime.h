// CUDA runtime helpers for the CUDA backend: error conversion to Status (with file and line),
// device discovery that never fails on machines without a GPU or driver, an owning device buffer,
// and the element types the kernels store (fp32, or bf16 in mixed precision).
//
// Only compiled with the CUDA backend (TF_WITH_CUDA). Thread safety: DeviceBuffer is a plain
// resource owner (not copyable); the free functions are thread-safe as the CUDA runtime is.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "base/status.h"

namespace tf::cuda {

// Storage type of parameters, activations and gradients on the device. Math is always fp32.
enum class DType { kF32, kBF16 };
inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) { return t == DType::kF32 ? "fp32" : "bf16"; }

// Converts a CUDA runtime error into a Status naming the call site.
Status CudaError(cudaError_t err, const char* expr, const char* file, int line);

// Number of visible CUDA devices; 0 (not an error) without a driver or device.
int DeviceCount();
// "NVIDIA H200 (sm_90, 139.8 GiB, 132 SMs)" for logs.
std::string DeviceDescription(int device);

// Device-to-device copy bandwidth of the current device in bytes per second (bytes read + written):
// the best of `reps` cudaMemcpyAsync copies of `bytes`, after one warm-up copy, timed with events on
// the legacy default stream. The practical ceiling of bandwidth-bound kernels.
StatusOr<double> MeasureCopyBandwidth(size_t bytes = size_t{1} << 30, int reps = 5);

// Owns cudaMalloc'd memory. Allocate() returns an error Status on failure instead of throwing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tf::cuda

// Evaluates a cudaError_t expression; returns a Status naming it from the current function on error.
#define TF_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                 \
    cudaError_t tf_cuda_err_ = (expr);                                                 \
    if (tf_cuda_err_ != cudaSuccess) return ::tf::cuda::CudaError(tf_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)
