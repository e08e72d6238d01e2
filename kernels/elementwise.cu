#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.h"
#include "kernels/math.h"

namespace tf::cuda {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(math::gelu(ToFloat(inp[i])));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    dinp[i] = FromFloat<T>(math::gelu_grad(ToFloat(inp[i])) * ToFloat(dout[i]));
  }
}

template <typename T>
__global__ void ResidualKernel(T* out, const T* a, const T* b, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

template <typename T>
__global__ void AccumulateKernel(T* dst, const T* src, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<T>(ToFloat(dst[i]) + ToFloat(src[i]));
  }
}

template <typename D, typename S>
__global__ void ConvertKernel(D* dst, const S* src, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<D>(ToFloat(src[i]));
  }
}

// Grid-stride loops: at most 64K blocks, enough to fill any current GPU many times over.
unsigned Grid(long n) { return std::min<unsigned>(CeilDiv(n, kBlock), 65535u); }

Status CheckN(long n, const char* op) {
  if (n < 0) return InvalidArgument(std::string(op) + ": negative element count " + std::to_string(n));
  return Status::OK();
}

}  // namespace

Status gelu_forward(void* out, const void* inp, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "gelu_forward"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    GeluForwardKernel<T><<<Grid(n), kBlock, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(inp), n);
    return TF_CHECK_LAUNCH("GeluForwardKernel");
  });
}

Status gelu_backward(void* dinp, const void* inp, const void* dout, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "gelu_backward"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    GeluBackwardKernel<T><<<Grid(n), kBlock, 0, stream>>>(static_cast<T*>(dinp), static_cast<const T*>(inp),
                                                          static_cast<const T*>(dout), n);
    return TF_CHECK_LAUNCH("GeluBackwardKernel");
  });
}

Status residual_forward(void* out, const void* a, const void* b, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "residual_forward"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    ResidualKernel<T><<<Grid(n), kBlock, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                      static_cast<const T*>(b), n);
    return TF_CHECK_LAUNCH("ResidualKernel");
  });
}

Status accumulate(void* dst, const void* src, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "accumulate"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    AccumulateKernel<T><<<Grid(n), kBlock, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), n);
    return TF_CHECK_LAUNCH("AccumulateKernel");
  });
}

Status convert(void* dst, DType dst_dt, const void* src, DType src_dt, long n, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "convert"));
  if (n == 0) return Status::OK();
  return DispatchDType(dst_dt, [&]<typename D>() {
    return DispatchDType(src_dt, [&]<typename S>() {
      ConvertKernel<D, S><<<Grid(n), kBlock, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
      return TF_CHECK_LAUNCH("ConvertKernel");
    });
  });
}

}  // namespace tf::cuda
