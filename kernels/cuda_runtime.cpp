// Host-side CUDA runtime helpers (compiled by the C++ compiler, so fmt formats messages here;
// .cu files build their messages with plain strings, see cuda_common.cuh).
#if defined(TF_WITH_CUDA)
#include "kernels/cuda_runtime.h"

#include <utility>

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace tf::cuda {

Status CudaError(cudaError_t err, const char* expr, const char* file, int line) {
  return Status::Internal("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), expr,
                          file, line);
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver"/"no device" error
    return 0;
  }
  return n;
}

std::string DeviceDescription(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return fmt::format("device {} (unavailable)", device);
  return fmt::format("{} (sm_{}{}, {:.1f} GiB, {} SMs)", p.name, p.major, p.minor,
                     static_cast<double>(p.totalGlobalMem) / (1 << 30), p.multiProcessorCount);
}

StatusOr<double> MeasureCopyBandwidth(size_t bytes, int reps) {
  if (bytes == 0 || reps < 1) return Status::InvalidArgument("MeasureCopyBandwidth: bytes and reps must be positive");
  TF_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Allocate(bytes));
  TF_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes));
  cudaEvent_t start = nullptr, stop = nullptr;
  TF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  const cudaError_t created = cudaEventCreate(&stop);
  if (created != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaError(created, "cudaEventCreate(&stop)", __FILE__, __LINE__);
  }
  float best_ms = 0;
  cudaError_t err = cudaSuccess;
  for (int r = 0; r <= reps && err == cudaSuccess; ++r) {  // r = 0: warm-up
    float ms = 0;
    if ((err = cudaEventRecord(start, nullptr)) != cudaSuccess ||
        (err = cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr)) != cudaSuccess ||
        (err = cudaEventRecord(stop, nullptr)) != cudaSuccess || (err = cudaEventSynchronize(stop)) != cudaSuccess ||
        (err = cudaEventElapsedTime(&ms, start, stop)) != cudaSuccess) {
      break;
    }
    if (r > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (err != cudaSuccess) return CudaError(err, "copy bandwidth measurement", __FILE__, __LINE__);
  if (!(best_ms > 0)) return Status::Internal("MeasureCopyBandwidth: the copies took no measurable time");
  return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes > 0) {
    cudaError_t err = cudaMalloc(&b.ptr_, bytes);
    if (err != cudaSuccess) {
      return Status::Internal("cudaMalloc of {:.2f} GiB failed: {}", static_cast<double>(bytes) / (1 << 30),
                              cudaGetErrorString(err));
    }
  }
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
