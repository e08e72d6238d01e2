#include "kernels/elementwise.h"

#include "kernels/math.h"

namespace tf::cpu {

void gelu_forward(float* out, const float* inp, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) out[i] = math::gelu(inp[i]);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) dinp[i] = math::gelu_grad(inp[i]) * dout[i];
}

void residual_forward(float* out, const float* a, const float* b, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate(float* dst, const float* src, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace tf::cpu
