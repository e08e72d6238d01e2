// Fused AdamW update and the global gradient norm, CPU implementations.
#pragma once
#include "kernels/math.h"

namespace tf {
// AdamW hyper-parameters that stay fixed during a run (lr comes from the schedule each step).
struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
};
}  // namespace tf

namespace tf::cpu {
// Sum of squares of g[0..n), accumulated in double.
double sum_squares(const float* g, long n);
// Applies math::adamw_update to n parameters with gradient grad[i] * grad_scale.
void adamw_step(float* params, float* m, float* v, const float* grads, long n, float grad_scale,
                const math::AdamWParams& h);
}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_runtime.h"
namespace tf::cuda {
// Device versions (kernels/optimizer.cu) on `stream`; no host synchronisation.
// *result_device (one device double) = sum of squares of g[0..n) (element type dt). Deterministic:
// a fixed number of blocks (a function of n only) each sums a fixed grid-stride subset (fp32 per
// thread, double across the block), then one block adds the partials in a fixed order. scratch is
// device memory of at least sum_squares_scratch_bytes(n) bytes.
size_t sum_squares_scratch_bytes(long n);
Status sum_squares(const void* g, long n, DType dt, double* result_device, void* scratch, size_t scratch_bytes,
                   cudaStream_t stream);
// math::adamw_update on the fp32 master weights with gradient grads[i] * grad_scale (grads of type
// grad_dt); m, v fp32. Then params_out[i] = master[i] rounded to param_dt (the bf16 working copy), or
// nothing if params_out is null. params_out may equal master (only with param_dt == kF32); it must not
// otherwise overlap master, m, v or grads.
Status adamw_step(float* master, float* m, float* v, const void* grads, void* params_out, long n, float grad_scale,
                  const math::AdamWParams& h, DType grad_dt, DType param_dt, cudaStream_t stream);

// The whole parameter buffer in one launch, without a host round trip for the clip factor:
// elements [0, n) form `ranges` consecutive runs, run r ending (exclusive) at range_ends[r] (device
// int64, increasing, range_ends[ranges - 1] == n) with weight decay h.weight_decay where
// range_decay[r] (device bytes) is non-zero and 0 elsewhere (model/parameters.h DecayRanges). The
// gradient is grads[i] * math::grad_clip_scale(sqrt(*grad_sum_squares), grad_clip), the clip factor
// computed on the device from sum_squares' result (grad_sum_squares null: no clipping). Otherwise
// as adamw_step (same per-element math, params_out rules).
Status adamw_step_ranges(float* master, float* m, float* v, const void* grads, void* params_out, long n,
                         const int64_t* range_ends, const uint8_t* range_decay, int ranges,
                         const double* grad_sum_squares, double grad_clip, const math::AdamWParams& h,
                         DType grad_dt, DType param_dt, cudaStream_t stream);
}  // namespace tf::cuda
#endif
