// CUDA fused softmax + cross-entropy + gradient (kernels/classifier.h), fp32 or bf16 logits.
//
// One block per row, 16-byte accesses when Vp and the row pointer allow (scalar otherwise). Pass 1
// reads the row once with an online (running max, running sum of
// exp(x - max)) pair per thread, in fp32 with math::fast_exp; the pairs are merged by xor-butterfly
// shuffles within each warp (lane 0's result is used: FMA contraction may make the lanes differ in the
// last bit), then lane 0s' pairs are merged in warp order by every thread from shared memory: the
// result is fixed by the row and the launch shape, run to run. The max is
// exact (order-independent), so the exponentials of pass 2, fast_exp(x - max), are bit-identical to
// the CPU's; only the sum differs by summation order.
// Pass 2 (only when dloss != 0) re-reads the row and overwrites it with (softmax - onehot) * dloss,
// computed as the CPU does (e * (dloss / sum), then - dloss at the target), padded columns 0.
//
// Running max starts at -FLT_MAX rather than -inf so that -inf logits give exp(-inf - m) (flushed by
// fast_exp's clamp to ~1e-38, as on the CPU) and never (-inf) - (-inf) = NaN.
#include <cfloat>

#include "kernels/classifier.h"
#include "kernels/cuda_common.cuh"
#include "kernels/math.h"

namespace tf::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBlock = 512;
constexpr int kWarps = kBlock / 32;

// (m, s) <- merge of (m, s) and (m2, s2): the larger max, and both sums rescaled to it.
__device__ __forceinline__ void Merge(float& m, float& s, float m2, float s2) {
  const float mx = m > m2 ? m : m2;
  s = s * math::fast_exp(m - mx) + s2 * math::fast_exp(m2 - mx);
  m = mx;
}

// Online (max, sum) update with one logit.
__device__ __forceinline__ void Accumulate(float& m, float& s, float x) {
  if (x > m) {
    s = s * math::fast_exp(m - x) + 1.0f;
    m = x;
  } else {
    s += math::fast_exp(x - m);  // NaN x lands here and propagates through s
  }
}

// W logits per access (Vp % W == 0 and 16-byte-aligned rows when W > 1): thread t takes the
// W-vectors t, t + kBlock, ... of [0, V - V % W) in pass 1, then the last V % W columns one each;
// pass 2 writes whole vectors over [0, Vp).
template <typename T, int W>
__global__ void __launch_bounds__(kBlock)
    CrossEntropyKernel(T* logits, float* losses, const int32_t* targets, int V, int Vp, float dloss) {
  __shared__ float warp_m[kWarps], warp_s[kWarps];
  const long row = blockIdx.x;
  T* z = logits + row * Vp;
  const int target = targets[row];
  const bool target_ok = target >= 0 && target < V;
  // Read before the barriers below, hence before any thread overwrites the row.
  const float target_logit = threadIdx.x == 0 && target_ok ? ToFloat(z[target]) : NAN;

  float m = -FLT_MAX, s = 0.0f;
  const int full = V / W;  // vectors entirely inside [0, V)
  for (int k = threadIdx.x; k < full; k += kBlock) {
    const Vec<T, W> zv = LoadVec<W>(z + k * W);
#pragma unroll
    for (int e = 0; e < W; ++e) Accumulate(m, s, ToFloat(zv.v[e]));
  }
  for (int j = full * W + threadIdx.x; j < V; j += kBlock) Accumulate(m, s, ToFloat(z[j]));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    Merge(m, s, __shfl_xor_sync(kFullMask, m, offset), __shfl_xor_sync(kFullMask, s, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  float maxv = warp_m[0], sum = warp_s[0];
  for (int w = 1; w < kWarps; ++w) Merge(maxv, sum, warp_m[w], warp_s[w]);

  if (threadIdx.x == 0) losses[row] = maxv + logf(sum) - target_logit;
  if (dloss == 0.0f) return;
  const float scale = dloss / sum;
  for (int k = threadIdx.x; k < Vp / W; k += kBlock) {
    const Vec<T, W> zv = LoadVec<W>(z + k * W);
    Vec<T, W> gv;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const int j = k * W + e;
      float g = 0.0f;
      if (j < V) {
        g = math::fast_exp(ToFloat(zv.v[e]) - maxv) * scale;
        if (j == target) g -= dloss;
      }
      gv.v[e] = FromFloat<T>(g);
    }
    StoreVec<W>(z + k * W, gv);
  }
}

}  // namespace

Status crossentropy_forward_backward(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                     float dloss, DType dt, cudaStream_t stream) {
  if (N < 0 || V <= 0 || Vp < V) {
    return InvalidArgument("crossentropy_forward_backward: bad shape N=" + std::to_string(N) +
                           " V=" + std::to_string(V) + " Vp=" + std::to_string(Vp) + " (need N >= 0, 0 < V <= Vp)");
  }
  if (N == 0) return Status::OK();
  if (logits == nullptr || losses == nullptr || targets == nullptr) {
    return InvalidArgument("crossentropy_forward_backward: null pointer");
  }
  return DispatchDType(dt, [&]<typename E>() {
    constexpr int kW = kVec16<E>;
    if (Vp % kW == 0 && VecAligned(sizeof(E) * kW, logits)) {
      CrossEntropyKernel<E, kW><<<N, kBlock, 0, stream>>>(static_cast<E*>(logits), losses, targets, V, Vp, dloss);
    } else {
      CrossEntropyKernel<E, 1><<<N, kBlock, 0, stream>>>(static_cast<E*>(logits), losses, targets, V, Vp, dloss);
    }
    return TF_CHECK_LAUNCH("CrossEntropyKernel");
  });
}

namespace {

constexpr int kLossBlock = 1024;

// One block: thread t sums losses t, t + 1024, ... in double; then a fixed shared-memory tree.
__global__ void __launch_bounds__(kLossBlock) AccumulateLossKernel(const float* losses, int N, double scale,
                                                                    double* acc) {
  __shared__ double part[kLossBlock];
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += kLossBlock) s += static_cast<double>(losses[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kLossBlock / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *acc += scale * part[0];
}

}  // namespace

Status accumulate_loss(const float* losses, int N, double scale, double* acc_device, cudaStream_t stream) {
  if (N < 0) return InvalidArgument("accumulate_loss: N = " + std::to_string(N) + " < 0");
  if (N == 0) return Status::OK();
  if (losses == nullptr || acc_device == nullptr) return InvalidArgument("accumulate_loss: null pointer");
  AccumulateLossKernel<<<1, kLossBlock, 0, stream>>>(losses, N, scale, acc_device);
  return TF_CHECK_LAUNCH("AccumulateLossKernel");
}

}  // namespace tf::cuda
