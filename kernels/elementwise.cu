#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.h"
#include "kernels/math.h"

namespace tf::cuda {
namespace {

constexpr int kBlock = 256;

// Element-wise maps, out[i] = op(a[i], b[i]) in fp32 (unary ops ignore b). V elements per access
// (one 16-byte access for V = kVec16<T>), then the last n % V elements one by one.
struct GeluOp {
  static constexpr bool kBinary = false;
  __device__ float operator()(float x, float) const { return math::gelu(x); }
};
struct GeluGradOp {  // a = GELU input, b = dout
  static constexpr bool kBinary = true;
  __device__ float operator()(float x, float dy) const { return math::gelu_grad(x) * dy; }
};
struct AddOp {
  static constexpr bool kBinary = true;
  __device__ float operator()(float x, float y) const { return x + y; }
};

template <typename T, int V, typename Op>
__global__ void MapKernel(T* out, const T* a, const T* b, long n, Op op) {
  const long stride = long(gridDim.x) * blockDim.x;
  const long tid = blockIdx.x * long(blockDim.x) + threadIdx.x;
  const long nv = n / V;
  for (long i = tid; i < nv; i += stride) {
    const Vec<T, V> x = LoadVec<V>(a + i * V);
    Vec<T, V> y = x;
    if constexpr (Op::kBinary) y = LoadVec<V>(b + i * V);
    Vec<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = FromFloat<T>(op(ToFloat(x.v[e]), ToFloat(y.v[e])));
    StoreVec<V>(out + i * V, o);
  }
  for (long i = nv * V + tid; i < n; i += stride) {
    out[i] = FromFloat<T>(op(ToFloat(a[i]), Op::kBinary ? ToFloat(b[i]) : 0.0f));
  }
}

template <typename D, typename S, int V>
__global__ void ConvertKernel(D* dst, const S* src, long n) {
  const long stride = long(gridDim.x) * blockDim.x;
  const long tid = blockIdx.x * long(blockDim.x) + threadIdx.x;
  const long nv = n / V;
  for (long i = tid; i < nv; i += stride) {
    const Vec<S, V> x = LoadVec<V>(src + i * V);
    Vec<D, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = FromFloat<D>(ToFloat(x.v[e]));
    StoreVec<V>(dst + i * V, o);
  }
  for (long i = nv * V + tid; i < n; i += stride) dst[i] = FromFloat<D>(ToFloat(src[i]));
}

// Grid-stride loops: at most 64K blocks, enough to fill any current GPU many times over.
unsigned Grid(long n) { return std::min<unsigned>(CeilDiv(n, kBlock), 65535u); }

// Launches MapKernel with 16-byte accesses when out, a and b allow them.
template <typename T, typename Op>
Status LaunchMap(T* out, const T* a, const T* b, long n, Op op, const char* name, cudaStream_t stream) {
  constexpr int kV = kVec16<T>;
  if (VecAligned(sizeof(T) * kV, out, a, b)) {
    MapKernel<T, kV, Op><<<Grid(CeilDiv(n, kV)), kBlock, 0, stream>>>(out, a, b, n, op);
  } else {
    MapKernel<T, 1, Op><<<Grid(n), kBlock, 0, stream>>>(out, a, b, n, op);
  }
  return TF_CHECK_LAUNCH(name);
}

Status CheckN(long n, const char* op) {
  if (n < 0) return InvalidArgument(std::string(op) + ": negative element count " + std::to_string(n));
  return Status::OK();
}

}  // namespace

Status gelu_forward(void* out, const void* inp, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "gelu_forward"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    return LaunchMap(static_cast<T*>(out), static_cast<const T*>(inp), static_cast<const T*>(nullptr), n, GeluOp{},
                     "MapKernel<GeluOp>", stream);
  });
}

Status gelu_backward(void* dinp, const void* inp, const void* dout, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "gelu_backward"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    return LaunchMap(static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n, GeluGradOp{},
                     "MapKernel<GeluGradOp>", stream);
  });
}

Status residual_forward(void* out, const void* a, const void* b, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "residual_forward"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    return LaunchMap(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, AddOp{},
                     "MapKernel<AddOp>", stream);
  });
}

Status accumulate(void* dst, const void* src, long n, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "accumulate"));
  if (n == 0) return Status::OK();
  return DispatchDType(dt, [&]<typename T>() {
    return LaunchMap(static_cast<T*>(dst), static_cast<const T*>(dst), static_cast<const T*>(src), n, AddOp{},
                     "MapKernel<AddOp> (accumulate)", stream);
  });
}

Status convert(void* dst, DType dst_dt, const void* src, DType src_dt, long n, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckN(n, "convert"));
  if (n == 0) return Status::OK();
  return DispatchDType(dst_dt, [&]<typename D>() {
    return DispatchDType(src_dt, [&]<typename S>() {
      constexpr int kV = kVec16<D> < kVec16<S> ? kVec16<D> : kVec16<S>;  // 16 bytes on the wider side
      if (VecAligned(sizeof(D) * kV, dst) && VecAligned(sizeof(S) * kV, src)) {
        ConvertKernel<D, S, kV><<<Grid(CeilDiv(n, kV)), kBlock, 0, stream>>>(static_cast<D*>(dst),
                                                                             static_cast<const S*>(src), n);
      } else {
        ConvertKernel<D, S, 1><<<Grid(n), kBlock, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
      }
      return TF_CHECK_LAUNCH("ConvertKernel");
    });
  });
}

}  // namespace tf::cuda
