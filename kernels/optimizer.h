// Fused AdamW update and the global gradient norm, CPU implementations.
#pragma once
#include "kernels/math.h"

namespace tf::cpu {
// Sum of squares of g[0..n), accumulated in double.
double sum_squares(const float* g, long n);
// Applies math::adamw_update to n parameters with gradient grad[i] * grad_scale.
void adamw_step(float* params, float* m, float* v, const float* grads, long n, float grad_scale,
                const math::AdamWParams& h);
}  // namespace tf::cpu
