#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

#include <Eigen/Core>
#include <omp.h>

#include "kernels/math.h"

namespace tf::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
// A (T, hs) head slice inside a (T, ld) row-major buffer.
using HeadMap = Eigen::Map<RowMat, 0, Stride>;
using ConstHeadMap = Eigen::Map<const RowMat, 0, Stride>;
using SquareMap = Eigen::Map<RowMat>;
using ConstSquareMap = Eigen::Map<const RowMat>;

}  // namespace

long attention_scratch_floats(int T) { return static_cast<long>(T) * T * omp_get_max_threads(); }

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const long C3 = 3L * C;
  // One (batch, head) pair per task; inside a parallel region Eigen runs single-threaded.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* base = qkv + static_cast<long>(b) * T * C3 + static_cast<long>(h) * hs;
      ConstHeadMap q(base, T, hs, Stride(C3));
      ConstHeadMap k(base + C, T, hs, Stride(C3));
      ConstHeadMap v(base + 2L * C, T, hs, Stride(C3));
      SquareMap p(att + (static_cast<long>(b) * NH + h) * T * T, T, T);
      p.noalias() = (q * k.transpose()) * scale;
      for (int t = 0; t < T; ++t) {
        float* row = p.data() + static_cast<long>(t) * T;
        float maxv = -INFINITY;
        for (int s = 0; s <= t; ++s) maxv = std::fmax(maxv, row[s]);
        float sum = 0.0f;
        for (int s = 0; s <= t; ++s) {
          row[s] = math::fast_exp(row[s] - maxv);
          sum += row[s];
        }
        const float inv = 1.0f / sum;
        for (int s = 0; s <= t; ++s) row[s] *= inv;
        for (int s = t + 1; s < T; ++s) row[s] = 0.0f;
      }
      HeadMap o(out + static_cast<long>(b) * T * C + static_cast<long>(h) * hs, T, hs, Stride(C));
      o.noalias() = p * v;
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH, float* scratch, long scratch_floats) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const long C3 = 3L * C;
  // Never more threads than scratch slices, even if the thread count grew since it was sized.
  const int threads = static_cast<int>(std::max(1L, std::min<long>(omp_get_max_threads(), scratch_floats / (long(T) * T))));
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const long off = static_cast<long>(b) * T * C3 + static_cast<long>(h) * hs;
      ConstHeadMap q(qkv + off, T, hs, Stride(C3));
      ConstHeadMap k(qkv + off + C, T, hs, Stride(C3));
      ConstHeadMap v(qkv + off + 2L * C, T, hs, Stride(C3));
      HeadMap dq(dqkv + off, T, hs, Stride(C3));
      HeadMap dk(dqkv + off + C, T, hs, Stride(C3));
      HeadMap dv(dqkv + off + 2L * C, T, hs, Stride(C3));
      ConstHeadMap dy(dout + static_cast<long>(b) * T * C + static_cast<long>(h) * hs, T, hs, Stride(C));
      ConstSquareMap p(att + (static_cast<long>(b) * NH + h) * T * T, T, T);
      SquareMap dp(scratch + static_cast<long>(omp_get_thread_num()) * T * T, T, T);

      dv.noalias() = p.transpose() * dy;  // (T,hs)
      dp.noalias() = dy * v.transpose();  // (T,T) d(probabilities)
      // Softmax backward, row by row: dS = P * (dP - sum_s P dP), then the 1/sqrt(hs) scale.
      for (int t = 0; t < T; ++t) {
        const float* prow = p.data() + static_cast<long>(t) * T;
        float* drow = dp.data() + static_cast<long>(t) * T;
        float dot = 0.0f;
        for (int s = 0; s <= t; ++s) dot += prow[s] * drow[s];
        for (int s = 0; s <= t; ++s) drow[s] = prow[s] * (drow[s] - dot) * scale;
        for (int s = t + 1; s < T; ++s) drow[s] = 0.0f;
      }
      dq.noalias() = dp * k;
      dk.noalias() = dp.transpose() * q;
    }
  }
}

}  // namespace tf::cpu
