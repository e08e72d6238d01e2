#include "kernels/encoder.h"

#include <algorithm>

#include <omp.h>

namespace tf::cpu {

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<long>(b) * T + t) * C;
      const float* e = wte + static_cast<long>(inp[b * T + t]) * C;
      const float* p = wpe + static_cast<long>(t) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C) {
  // Each thread owns a fixed slice of channels and visits every (b, t) in order, so hot tokens never
  // race and the summation order (hence the result) does not depend on the thread count.
  constexpr int kChunk = 16;
  const int n_chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int c0 = chunk * kChunk;
    const int c1 = std::min(C, c0 + kChunk);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const float* d = dout + (static_cast<long>(b) * T + t) * C;
        float* e = dwte + static_cast<long>(inp[b * T + t]) * C;
        float* p = dwpe + static_cast<long>(t) * C;
        for (int c = c0; c < c1; ++c) {
          e[c] += d[c];
          p[c] += d[c];
        }
      }
    }
  }
}

}  // namespace tf::cpu
