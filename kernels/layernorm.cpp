#include "kernels/layernorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/math.h"

namespace tf::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<long>(i) * C;
    float* o = out + static_cast<long>(i) * C;
    // Two-pass statistics in float: mean first, then the centred variance (no cancellation).
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += x[c];
    const float m = sum / C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(var / C + math::kLayerNormEps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  // dinp: rows are independent.
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<long>(i) * C;
    const float* dy = dout + static_cast<long>(i) * C;
    float* dx = dinp + static_cast<long>(i) * C;
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; ++c) {
      const float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      dx[c] += s * (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean);
    }
  }
  // dweight, dbias: each thread owns a slice of channels and sums over all rows in order
  // (deterministic whatever the thread count).
  constexpr int kChunk = 32;
  const int n_chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int c0 = chunk * kChunk;
    const int c1 = std::min(C, c0 + kChunk);
    float dw[kChunk] = {}, db[kChunk] = {};
    for (int i = 0; i < N; ++i) {
      const float* x = inp + static_cast<long>(i) * C;
      const float* dy = dout + static_cast<long>(i) * C;
      const float m = mean[i], s = rstd[i];
      for (int c = c0; c < c1; ++c) {
        dw[c - c0] += (x[c] - m) * s * dy[c];
        db[c - c0] += dy[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dweight[c] += dw[c - c0];
      dbias[c] += db[c - c0];
    }
  }
}

}  // namespace tf::cpu
