#include "kernels/optimizer.h"

#include <algorithm>
#include <vector>

namespace tf::cpu {

double sum_squares(const float* g, long n) {
  // Fixed-size blocks, each summed in order, then the block sums added in order: the result does
  // not depend on the thread count (needed for bit-identical runs and for later data-parallel checks).
  constexpr long kBlock = 1 << 14;
  const long n_blocks = (n + kBlock - 1) / kBlock;
  // Reused across calls (grows once), so a training step does not allocate.
  // (thread_local: each calling thread owns one; workers below write through a plain pointer to the
  // caller's, never naming the thread_local themselves.)
  thread_local std::vector<double> partial_storage;
  partial_storage.assign(static_cast<size_t>(n_blocks), 0.0);
  double* partial = partial_storage.data();
#pragma omp parallel for schedule(static)
  for (long blk = 0; blk < n_blocks; ++blk) {
    const long i0 = blk * kBlock, i1 = std::min(n, i0 + kBlock);
    double s = 0.0;
    // Vectorised in double: the lane split and final horizontal sum are fixed by the binary, so the
    // result is still independent of the thread count.
#pragma omp simd reduction(+ : s)
    for (long i = i0; i < i1; ++i) s += static_cast<double>(g[i]) * g[i];
    partial[blk] = s;
  }
  double total = 0.0;
  for (long blk = 0; blk < n_blocks; ++blk) total += partial[blk];
  return total;
}

void adamw_step(float* params, float* m, float* v, const float* grads, long n, float grad_scale,
                const math::AdamWParams& h) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) math::adamw_update(params[i], m[i], v[i], grads[i] * grad_scale, h);
}

}  // namespace tf::cpu
