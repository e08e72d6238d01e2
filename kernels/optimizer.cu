// CUDA global gradient norm (sum of squares) and fused AdamW step (kernels/optimizer.h).
//
// sum_squares: deterministic two-stage reduction without atomics or host synchronisation
// (SumSquaresPartialKernel: a grid sized by n only, fp32 sums per thread, double across the block
// by a fixed shuffle tree; SumSquaresFinalKernel: one block adds the partials in double in a fixed
// order). adamw_step: one thread per parameter, math::adamw_update on the fp32 master.
// adamw_step_ranges: the same update over the whole flat buffer in one launch; each block finds
// its chunk's first decay run by binary search over range_ends, and the clip factor is evaluated
// on the device from the sum of squares, so no host sync sits between the norm and the update.
// Precision argument and the chunk layout: docs/cuda.md, "kernels/optimizer.cu".
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/math.h"
#include "kernels/optimizer.h"

namespace tf::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr long kMaxPartials = 1024;

// Sum of x over the block (kBlock threads), a fixed tree; the result is valid in thread 0.
__device__ double BlockSum(double x) {
  __shared__ double warp_sums[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  }
  return total;
}

// V elements per access (16-byte-aligned g): thread k sums vectors k, k + P*kBlock, ..., then the
// last n % V elements go one each to the first threads of the grid.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock) SumSquaresPartialKernel(const T* g, long n, double* partial) {
  const long stride = long(gridDim.x) * kBlock;
  const long tid = blockIdx.x * long(kBlock) + threadIdx.x;
  float acc = 0.0f;
#pragma unroll 4
  for (long q = tid; q < n / V; q += stride) {
    const Vec<T, V> x = LoadVec<V>(g + q * V);
#pragma unroll
    for (int e = 0; e < V; ++e) acc += ToFloat(x.v[e]) * ToFloat(x.v[e]);
  }
  for (long i = n / V * V + tid; i < n; i += stride) acc += ToFloat(g[i]) * ToFloat(g[i]);
  const double total = BlockSum(static_cast<double>(acc));
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kBlock) SumSquaresFinalKernel(const double* partial, int count, double* result) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kBlock) acc += partial[i];
  const double total = BlockSum(acc);
  if (threadIdx.x == 0) *result = total;
}

// P (blocks of stage 1) for n elements, n > 0.
int Partials(long n) { return static_cast<int>(std::min<long>(kMaxPartials, (n + kBlock - 1) / kBlock)); }

// One parameter: math::adamw_update of master[i], m[i], v[i] with gradient grads[i] * grad_scale,
// then the working copy params_out[i] (if any) rounded from the new master.
template <typename G, typename P>
__device__ __forceinline__ void AdamWElement(float* master, float* m, float* v, const G* grads, P* params_out, long i,
                                             float grad_scale, const math::AdamWParams& h) {
  float p = master[i], mi = m[i], vi = v[i];
  math::adamw_update(p, mi, vi, ToFloat(grads[i]) * grad_scale, h);
  master[i] = p;
  m[i] = mi;
  v[i] = vi;
  if (params_out != nullptr) params_out[i] = FromFloat<P>(p);
}

// master, m, v fp32; grads of type G; params_out of type P (nullptr: not written).
template <typename G, typename P>
__global__ void AdamWKernel(float* master, float* m, float* v, const G* grads, P* params_out, long n, float grad_scale,
                            math::AdamWParams h) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    AdamWElement(master, m, v, grads, params_out, i, grad_scale, h);
  }
}

constexpr long kAdamChunk = 4096;

// V parameters per access (V = 4: 16-byte fp32 loads of master/m/v) when the pointers allow; the
// chunk start is a multiple of kAdamChunk, so every thread's vectors are aligned too. Each element
// still finds its own run (runs need not start on a vector boundary).
template <typename G, typename P, int V>
__global__ void __launch_bounds__(kBlock)
    AdamWRangesKernel(float* master, float* m, float* v, const G* grads, P* params_out, long n,
                      const int64_t* range_ends, const uint8_t* range_decay, int ranges, const double* grad_sum_squares,
                      double grad_clip, math::AdamWParams h) {
  const long begin = long(blockIdx.x) * kAdamChunk;
  const long end = min(n, begin + kAdamChunk);
  int lo = 0, hi = ranges - 1;  // first run whose end is past `begin`
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (range_ends[mid] > begin) hi = mid;
    else lo = mid + 1;
  }
  const float scale =
      grad_sum_squares != nullptr ? math::grad_clip_scale(sqrt(*grad_sum_squares), grad_clip) : 1.0f;
  const float decay = h.weight_decay;
  int r = lo;
  long run_end = range_ends[r];
  h.weight_decay = range_decay[r] ? decay : 0.0f;
  // Moves to the run holding element i (i never decreases within a thread).
  auto seek = [&](long i) {
    while (i >= run_end && r < ranges - 1) {
      ++r;
      run_end = range_ends[r];
      h.weight_decay = range_decay[r] ? decay : 0.0f;
    }
  };
  for (long i = begin + long(threadIdx.x) * V; i < end; i += long(kBlock) * V) {
    if (i + V > end) {  // the buffer's last, partial vector
      for (long j = i; j < end; ++j) {
        seek(j);
        AdamWElement(master, m, v, grads, params_out, j, scale, h);
      }
      break;
    }
    Vec<float, V> pv = LoadVec<V>(master + i), mv = LoadVec<V>(m + i), vv = LoadVec<V>(v + i);
    const Vec<G, V> gv = LoadVec<V>(grads + i);
    Vec<P, V> ov;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      seek(i + e);
      math::adamw_update(pv.v[e], mv.v[e], vv.v[e], ToFloat(gv.v[e]) * scale, h);
      ov.v[e] = FromFloat<P>(pv.v[e]);
    }
    StoreVec<V>(master + i, pv);
    StoreVec<V>(m + i, mv);
    StoreVec<V>(v + i, vv);
    if (params_out != nullptr) StoreVec<V>(params_out + i, ov);
  }
}

unsigned Grid(long n) { return std::min<unsigned>(CeilDiv(n, kBlock), 65535u); }

}  // namespace

size_t sum_squares_scratch_bytes(long n) { return n > 0 ? size_t(Partials(n)) * sizeof(double) : 0; }

Status sum_squares(const void* g, long n, DType dt, double* result_device, void* scratch, size_t scratch_bytes,
                   cudaStream_t stream) {
  if (n < 0) return InvalidArgument("sum_squares: negative element count " + std::to_string(n));
  if (result_device == nullptr) return InvalidArgument("sum_squares: null result pointer");
  if (n == 0) {  // 0.0 is all-zero bits
    TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(result_device, 0, sizeof(double), stream));
    return Status::OK();
  }
  if (g == nullptr || scratch == nullptr) return InvalidArgument("sum_squares: null pointer");
  if (scratch_bytes < sum_squares_scratch_bytes(n)) {
    return InvalidArgument("sum_squares: scratch holds " + std::to_string(scratch_bytes) + " bytes, needs " +
                           std::to_string(sum_squares_scratch_bytes(n)));
  }
  if (reinterpret_cast<uintptr_t>(scratch) % alignof(double) != 0) {
    return InvalidArgument("sum_squares: scratch is not 8-byte aligned");
  }
  double* partial = static_cast<double*>(scratch);
  const int count = Partials(n);
  return DispatchDType(dt, [&]<typename E>() -> Status {
    if (VecAligned(16, g)) {
      SumSquaresPartialKernel<E, kVec16<E>><<<count, kBlock, 0, stream>>>(static_cast<const E*>(g), n, partial);
    } else {
      SumSquaresPartialKernel<E, 1><<<count, kBlock, 0, stream>>>(static_cast<const E*>(g), n, partial);
    }
    TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("SumSquaresPartialKernel"));
    SumSquaresFinalKernel<<<1, kBlock, 0, stream>>>(partial, count, result_device);
    return TF_CHECK_LAUNCH("SumSquaresFinalKernel");
  });
}

Status adamw_step(float* master, float* m, float* v, const void* grads, void* params_out, long n, float grad_scale,
                  const math::AdamWParams& h, DType grad_dt, DType param_dt, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("adamw_step: negative element count " + std::to_string(n));
  if (n == 0) return Status::OK();
  if (master == nullptr || m == nullptr || v == nullptr || grads == nullptr) {
    return InvalidArgument("adamw_step: null pointer");
  }
  if (params_out == master) {
    if (param_dt != DType::kF32) return InvalidArgument("adamw_step: bf16 params_out aliases the fp32 master");
    params_out = nullptr;  // the master already is the fp32 copy
  }
  return DispatchDType(grad_dt, [&]<typename G>() {
    return DispatchDType(param_dt, [&]<typename P>() {
      AdamWKernel<G, P><<<Grid(n), kBlock, 0, stream>>>(master, m, v, static_cast<const G*>(grads),
                                                         static_cast<P*>(params_out), n, grad_scale, h);
      return TF_CHECK_LAUNCH("AdamWKernel");
    });
  });
}

Status adamw_step_ranges(float* master, float* m, float* v, const void* grads, void* params_out, long n,
                         const int64_t* range_ends, const uint8_t* range_decay, int ranges,
                         const double* grad_sum_squares, double grad_clip, const math::AdamWParams& h,
                         DType grad_dt, DType param_dt, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("adamw_step_ranges: negative element count " + std::to_string(n));
  if (n == 0) return Status::OK();
  if (master == nullptr || m == nullptr || v == nullptr || grads == nullptr || range_ends == nullptr ||
      range_decay == nullptr) {
    return InvalidArgument("adamw_step_ranges: null pointer");
  }
  if (ranges <= 0) return InvalidArgument("adamw_step_ranges: no ranges for " + std::to_string(n) + " elements");
  if (params_out == master) {
    if (param_dt != DType::kF32) return InvalidArgument("adamw_step_ranges: bf16 params_out aliases the fp32 master");
    params_out = nullptr;
  }
  const long blocks = (n + kAdamChunk - 1) / kAdamChunk;
  if (blocks > 0x7fffffffL) return InvalidArgument("adamw_step_ranges: too many elements");
  return DispatchDType(grad_dt, [&]<typename G>() {
    return DispatchDType(param_dt, [&]<typename P>() {
      constexpr int kV = 4;
      if (VecAligned(sizeof(float) * kV, master, m, v) && VecAligned(sizeof(G) * kV, grads) &&
          VecAligned(sizeof(P) * kV, params_out)) {
        AdamWRangesKernel<G, P, kV><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
            master, m, v, static_cast<const G*>(grads), static_cast<P*>(params_out), n, range_ends, range_decay,
            ranges, grad_sum_squares, grad_clip, h);
      } else {
        AdamWRangesKernel<G, P, 1><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
            master, m, v, static_cast<const G*>(grads), static_cast<P*>(params_out), n, range_ends, range_decay,
            ranges, grad_sum_squares, grad_clip, h);
      }
      return TF_CHECK_LAUNCH("AdamWRangesKernel");
    });
  });
}

}  // namespace tf::cuda
