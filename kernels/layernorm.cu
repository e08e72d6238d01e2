// CUDA LayerNorm over the last dimension (kernels/layernorm.h), fp32 or bf16 storage, fp32 math.
//
// Forward: one warp per row, two fp32 passes (mean, then the centred variance) like the CPU.
// Backward, deterministic (no atomics): LayerNormBackwardKernel writes dinp and, per group of
// kRowsPerBlock rows, partial dweight/dbias sums (warp-private shared-memory accumulators added in
// warp order) to scratch (2, R, C), R = ceil(N / kRowsPerBlock); ParamGradKernel adds the groups
// in a fixed order into dweight/dbias. The summation order is fixed by the shape and by whether
// the 16-byte path is taken (C % 8 == 0 bf16 / C % 4 == 0 fp32 with 16-byte-aligned pointers;
// otherwise the same kernels use scalar accesses). Details: docs/cuda.md, "kernels/layernorm.cu".
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/layernorm.h"
#include "kernels/math.h"

namespace tf::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kForwardBlock = 256;  // 8 rows (warps) per block
constexpr int kRowsPerBlock = 32;   // backward: rows per partial-sum group
constexpr int kMaxWarps = 8;
// Static shared-memory budget per block for the backward accumulators (no opt-in needed):
// W warps x 2 arrays x C floats.
constexpr size_t kSharedBudget = 48 * 1024;
constexpr int kMaxC = static_cast<int>(kSharedBudget / (2 * sizeof(float)));  // 6144 with W = 1

__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// V elements per access (C % V == 0); lane l takes the row's vectors l, l + 32, ...
template <typename T, int V>
__global__ void __launch_bounds__(kForwardBlock)
    LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                           int C) {
  const int lane = threadIdx.x % 32;
  const long row = long(blockIdx.x) * (kForwardBlock / 32) + threadIdx.x / 32;
  if (row >= N) return;  // warp-uniform
  const int CV = C / V;
  const T* x = inp + row * C;
  float sum = 0.0f;
  for (int k = lane; k < CV; k += 32) {
    const Vec<T, V> xv = LoadVec<V>(x + k * V);
#pragma unroll
    for (int e = 0; e < V; ++e) sum += ToFloat(xv.v[e]);
  }
  const float m = WarpSum(sum) / C;
  float var = 0.0f;
  for (int k = lane; k < CV; k += 32) {
    const Vec<T, V> xv = LoadVec<V>(x + k * V);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = ToFloat(xv.v[e]) - m;
      var += d * d;
    }
  }
  const float s = 1.0f / sqrtf(WarpSum(var) / C + math::kLayerNormEps);
  T* o = out + row * C;
  for (int k = lane; k < CV; k += 32) {
    const Vec<T, V> xv = LoadVec<V>(x + k * V), wv = LoadVec<V>(weight + k * V), bv = LoadVec<V>(bias + k * V);
    Vec<T, V> ov;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      ov.v[e] = FromFloat<T>((ToFloat(xv.v[e]) - m) * s * ToFloat(wv.v[e]) + ToFloat(bv.v[e]));
    }
    StoreVec<V>(o + k * V, ov);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = s;
  }
}

// grid R blocks of 32*W threads, dynamic shared memory W*2*C floats; partial (2, R, C).
// V elements per access (C % V == 0); lane l takes vectors l, l + 32, ... of each row. A warp's
// shared accumulators are stored element-major (channel k*V + e at e*(C/V) + k) so that the 32
// lanes touch 32 consecutive words (no bank conflicts) for any V.
template <typename T, int V>
__global__ void __launch_bounds__(32 * kMaxWarps)
    LayerNormBackwardKernel(T* dinp, float* partial, const T* dout, const T* inp, const T* weight, const float* mean,
                            const float* rstd, int N, int C) {
  extern __shared__ float shared[];
  const int W = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int CV = C / V;
  float* dw_acc = shared + 2L * warp * C;
  float* db_acc = dw_acc + C;
  for (int k = lane; k < CV; k += 32) {
#pragma unroll
    for (int e = 0; e < V; ++e) dw_acc[e * CV + k] = db_acc[e * CV + k] = 0.0f;
  }
  // (Each lane only ever touches its own slots of its warp's arrays: no barrier needed here.)

  const long r0 = long(blockIdx.x) * kRowsPerBlock;
  const long r1 = r0 + kRowsPerBlock < N ? r0 + kRowsPerBlock : N;
  for (long i = r0 + warp; i < r1; i += W) {
    const T* x = inp + i * C;
    const T* dy = dout + i * C;
    T* dx = dinp + i * C;
    const float m = mean[i], s = rstd[i];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int k = lane; k < CV; k += 32) {
      const Vec<T, V> dv = LoadVec<V>(dy + k * V), wv = LoadVec<V>(weight + k * V), xv = LoadVec<V>(x + k * V);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = ToFloat(dv.v[e]);
        const float g = ToFloat(wv.v[e]) * d;  // dL/dxhat
        const float xhat = (ToFloat(xv.v[e]) - m) * s;
        sum_g += g;
        sum_gx += g * xhat;
        dw_acc[e * CV + k] += xhat * d;
        db_acc[e * CV + k] += d;
      }
    }
    const float mean_g = WarpSum(sum_g) / C;
    const float mean_gx = WarpSum(sum_gx) / C;
    for (int k = lane; k < CV; k += 32) {
      const Vec<T, V> dv = LoadVec<V>(dy + k * V), wv = LoadVec<V>(weight + k * V), xv = LoadVec<V>(x + k * V);
      Vec<T, V> dxv = LoadVec<V>(dx + k * V);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xhat = (ToFloat(xv.v[e]) - m) * s;
        const float g = ToFloat(wv.v[e]) * ToFloat(dv.v[e]);
        dxv.v[e] = FromFloat<T>(ToFloat(dxv.v[e]) + s * (g - mean_g - xhat * mean_gx));
      }
      StoreVec<V>(dx + k * V, dxv);
    }
  }
  __syncthreads();
  const long R = gridDim.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int slot = (c % V) * CV + c / V;
    float dw = 0.0f, db = 0.0f;
    for (int w = 0; w < W; ++w) {
      dw += shared[2L * w * C + slot];
      db += shared[2L * w * C + C + slot];
    }
    partial[blockIdx.x * long(C) + c] = dw;
    partial[(R + blockIdx.x) * C + c] = db;
  }
}

// grid CeilDiv(C, 32) blocks of (32, 32) threads: x = channel within the tile, y = group stride.
template <typename T>
__global__ void __launch_bounds__(1024) ParamGradKernel(T* dweight, T* dbias, const float* partial, int R, int C) {
  __shared__ float sw[32][33], sb[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (long g = ty; g < R; g += 32) {
      dw += partial[g * C + c];
      db += partial[(R + g) * C + c];
    }
  }
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < 32; ++k) {
      tw += sw[k][tx];
      tb += sb[k][tx];
    }
    dweight[c] = FromFloat<T>(ToFloat(dweight[c]) + tw);
    dbias[c] = FromFloat<T>(ToFloat(dbias[c]) + tb);
  }
}

// Warps per backward block: as many as the shared-memory budget allows for this C (a function of C only).
int BackwardWarps(int C) { return std::min<int>(kMaxWarps, static_cast<int>(kSharedBudget / (2 * sizeof(float) * C))); }

Status CheckShape(const char* op, int N, int C) {
  if (N < 0 || C < 0) {
    return InvalidArgument(std::string(op) + ": negative shape N=" + std::to_string(N) + " C=" + std::to_string(C));
  }
  return Status::OK();
}

}  // namespace

Status layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                         int N, int C, DType dt, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckShape("layernorm_forward", N, C));
  if (N == 0) return Status::OK();
  if (C == 0) return InvalidArgument("layernorm_forward: C = 0 (empty rows have no statistics)");
  if (out == nullptr || inp == nullptr || weight == nullptr || bias == nullptr) {
    return InvalidArgument("layernorm_forward: null pointer");
  }
  return DispatchDType(dt, [&]<typename E>() {
    constexpr int kV = kVec16<E>;
    const unsigned grid = CeilDiv(N, kForwardBlock / 32);
    if (C % kV == 0 && VecAligned(sizeof(E) * kV, out, inp, weight, bias)) {
      LayerNormForwardKernel<E, kV><<<grid, kForwardBlock, 0, stream>>>(
          static_cast<E*>(out), mean, rstd, static_cast<const E*>(inp), static_cast<const E*>(weight),
          static_cast<const E*>(bias), N, C);
    } else {
      LayerNormForwardKernel<E, 1><<<grid, kForwardBlock, 0, stream>>>(
          static_cast<E*>(out), mean, rstd, static_cast<const E*>(inp), static_cast<const E*>(weight),
          static_cast<const E*>(bias), N, C);
    }
    return TF_CHECK_LAUNCH("LayerNormForwardKernel");
  });
}

size_t layernorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return 2 * size_t(CeilDiv(N, kRowsPerBlock)) * size_t(C) * sizeof(float);
}

Status layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C, DType dt,
                          float* scratch, size_t scratch_bytes, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(CheckShape("layernorm_backward", N, C));
  if (N == 0 || C == 0) return Status::OK();
  if (C > kMaxC) {
    return InvalidArgument("layernorm_backward: C = " + std::to_string(C) + " exceeds " + std::to_string(kMaxC) +
                           " (shared-memory accumulators)");
  }
  if (dinp == nullptr || dweight == nullptr || dbias == nullptr || dout == nullptr || inp == nullptr ||
      weight == nullptr || mean == nullptr || rstd == nullptr || scratch == nullptr) {
    return InvalidArgument("layernorm_backward: null pointer");
  }
  if (scratch_bytes < layernorm_backward_scratch_bytes(N, C)) {
    return InvalidArgument("layernorm_backward: scratch holds " + std::to_string(scratch_bytes) + " bytes, needs " +
                           std::to_string(layernorm_backward_scratch_bytes(N, C)));
  }
  const int warps = BackwardWarps(C);
  const unsigned R = CeilDiv(N, kRowsPerBlock);
  const size_t shared_bytes = size_t(warps) * 2 * C * sizeof(float);
  return DispatchDType(dt, [&]<typename E>() -> Status {
    constexpr int kV = kVec16<E>;
    if (C % kV == 0 && VecAligned(sizeof(E) * kV, dinp, dout, inp, weight)) {
      LayerNormBackwardKernel<E, kV><<<R, 32 * warps, shared_bytes, stream>>>(
          static_cast<E*>(dinp), scratch, static_cast<const E*>(dout), static_cast<const E*>(inp),
          static_cast<const E*>(weight), mean, rstd, N, C);
    } else {
      LayerNormBackwardKernel<E, 1><<<R, 32 * warps, shared_bytes, stream>>>(
          static_cast<E*>(dinp), scratch, static_cast<const E*>(dout), static_cast<const E*>(inp),
          static_cast<const E*>(weight), mean, rstd, N, C);
    }
    TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("LayerNormBackwardKernel"));
    ParamGradKernel<E><<<CeilDiv(C, 32), dim3(32, 32), 0, stream>>>(static_cast<E*>(dweight), static_cast<E*>(dbias),
                                                                   scratch, static_cast<int>(R), C);
    return TF_CHECK_LAUNCH("ParamGradKernel");
  });
}

}  // namespace tf::cuda
