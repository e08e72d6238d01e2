#include "kernels/matmul.h"

#include <algorithm>

#include <Eigen/Core>
#if TF_GEMM_OPENBLAS
#include <cblas.h>
#endif

#ifndef TF_GEMM_OPENBLAS
#define TF_GEMM_OPENBLAS 0
#endif

namespace tf::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRow = Eigen::Map<RowMat>;
using ConstMapRow = Eigen::Map<const RowMat>;

}  // namespace

const char* gemm_engine_name() { return TF_GEMM_OPENBLAS ? "openblas" : "eigen"; }

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
#if TF_GEMM_OPENBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
#else
  ConstMapRow x(inp, N, C);
  ConstMapRow w(weight, OC, C);
  MapRow y(out, N, OC);
  y.noalias() = x * w.transpose();  // Eigen's blocked GEMM, OpenMP-parallel over the output.
#endif
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
      float* row = out + static_cast<long>(i) * OC;
#pragma omp simd
      for (int o = 0; o < OC; ++o) row[o] += bias[o];
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
#if TF_GEMM_OPENBLAS
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
#else
  ConstMapRow dy(dout, N, OC);
  ConstMapRow x(inp, N, C);
  ConstMapRow w(weight, OC, C);
  if (dinp != nullptr) {
    MapRow dx(dinp, N, C);
    dx.noalias() += dy * w;
  }
  MapRow dw(dweight, OC, C);
  dw.noalias() += dy.transpose() * x;
#endif
  if (dbias != nullptr) {
    // Column sums; each thread owns a slice of output channels (deterministic).
    constexpr int kChunk = 64;
    const int n_chunks = (OC + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
      const int o0 = chunk * kChunk, o1 = std::min(OC, o0 + kChunk);
      float acc[kChunk] = {};
      for (int i = 0; i < N; ++i) {
        const float* row = dout + static_cast<long>(i) * OC;
        for (int o = o0; o < o1; ++o) acc[o - o0] += row[o];
      }
      for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
    }
  }
}

}  // namespace tf::cpu
