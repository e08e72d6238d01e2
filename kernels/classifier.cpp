#include "kernels/classifier.h"

#include <cmath>

namespace tf::cpu {

void crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                   float dloss) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    float* row = logits + static_cast<long>(i) * Vp;
    float maxv = -INFINITY;
    for (int j = 0; j < V; ++j) maxv = std::fmax(maxv, row[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) sum += std::exp(row[j] - maxv);
    const float log_z = maxv + std::log(sum);
    const int target = targets[i];
    losses[i] = log_z - row[target];
    if (dloss != 0.0f) {
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) row[j] = std::exp(row[j] - maxv) * inv * dloss;
      row[target] -= dloss;
      for (int j = V; j < Vp; ++j) row[j] = 0.0f;
    }
  }
}

void softmax_rows(float* probs, const float* logits, int N, int V, int Vp, float temperature) {
  const float inv_t = 1.0f / temperature;
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<long>(i) * Vp;
    float* p = probs + static_cast<long>(i) * V;
    float maxv = -INFINITY;
    for (int j = 0; j < V; ++j) maxv = std::fmax(maxv, row[j] * inv_t);
    double sum = 0.0;
    for (int j = 0; j < V; ++j) {
      p[j] = std::exp(row[j] * inv_t - maxv);
      sum += p[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < V; ++j) p[j] *= inv;
  }
}

}  // namespace tf::cpu
