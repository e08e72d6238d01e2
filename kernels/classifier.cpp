#include "kernels/classifier.h"

#include <cmath>

#include "kernels/math.h"

namespace tf::cpu {

void crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                   float dloss) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    float* row = logits + static_cast<long>(i) * Vp;
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int j = 0; j < V; ++j) maxv = row[j] > maxv ? row[j] : maxv;
    const int target = targets[i];
    const float target_logit = row[target];
    float sum = 0.0f;
    if (dloss == 0.0f) {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) sum += math::fast_exp(row[j] - maxv);
    } else {
      // Exponentials stored in place, then scaled: each loop is a plain vectorisable stream.
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        const float e = math::fast_exp(row[j] - maxv);
        row[j] = e;
        sum += e;
      }
      const float scale = dloss / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) row[j] *= scale;
      row[target] -= dloss;
      for (int j = V; j < Vp; ++j) row[j] = 0.0f;
    }
    losses[i] = maxv + std::log(sum) - target_logit;
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
