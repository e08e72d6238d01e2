// Linear layers: the CPU GEMM entry points. Weights are stored (OC, C) row-major, as
// torch.nn.Linear does (Hugging Face's Conv1D [in,out] layout is converted at import/export).
// The GEMM engine is chosen at build time (CMake TRAINFLOW_CPU_GEMM): OpenBLAS's OpenMP build
// (default) or Eigen; both are multi-threaded over OpenMP's thread count.
#pragma once

namespace tf::cpu {

// out (N,OC) = inp (N,C) @ weight^T (C,OC) + bias (OC); bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
// Accumulates (+=): dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += colsum(dout).
// dinp and dbias may be null (not needed).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);
// "openblas" or "eigen".
const char* gemm_engine_name();

}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include "kernels/cublas_handle.h"
namespace tf::cuda {
// Device versions (kernels/matmul.cu): same shapes, layouts and += contracts as tf::cpu above; every
// pointer is device memory of element type `dt` (math and accumulation in fp32), issued on
// ctx.stream(). Validates the shape once; returns InvalidArgument for bad shapes or null pointers.
//
// out (N,OC) = inp (N,C) @ weight^T + bias; bias may be null. With pre_gelu (N,OC) non-null, the
// GELU is fused: pre_gelu = inp @ weight^T + bias and out = gelu(pre_gelu) (cuBLASLt's GELU, see
// matmul.cu for how it compares with math::gelu). REQUIRES: pre_gelu does not alias out.
// With residual (N,OC) non-null: out = inp @ weight^T + bias + residual, the residual add folded
// into the GEMM (cuBLASLt's C matrix with beta = 1: one rounding of the sum in bf16 instead of two;
// the classic fallback accumulates onto a copy of the residual and adds the bias after).
// residual may equal out (in place); it cannot be combined with pre_gelu.
Status matmul_forward(CublasContext& ctx, void* out, const void* inp, const void* weight, const void* bias, int N,
                      int C, int OC, DType dt, void* pre_gelu = nullptr, const void* residual = nullptr);

struct MatmulBackwardOptions {
  // true: dinp += dout @ weight (the CPU contract); false: dinp = dout @ weight (overwritten, so the
  // caller needs no zeroing pass and the GEMM does not read dinp).
  bool accumulate_dinp = true;
  // Non-null (N,C): the layer's input was gelu(dgelu_pre) and dinp receives the gradient with
  // respect to dgelu_pre, dinp = (dout @ weight) * gelu'(dgelu_pre), overwritten (REQUIRES
  // accumulate_dinp false, dinp non-null, not aliasing dgelu_pre): cuBLASLt's DGELU epilogue, or the
  // GEMM then math::gelu_grad where cuBLASLt has no algorithm. Pairs with the fused forward GELU.
  const void* dgelu_pre = nullptr;
};
// Accumulates (+=) into dinp (N,C), dweight (OC,C) and dbias (OC); dinp and dbias may be null.
// dbias_scratch: matmul_dbias_scratch_floats(N, OC) floats of device memory when dbias is non-null
// (the deterministic column sum's partials), else may be null. `options` changes dinp (above).
Status matmul_backward(CublasContext& ctx, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int C, int OC, DType dt, float* dbias_scratch,
                       const MatmulBackwardOptions& options = {});
long matmul_dbias_scratch_floats(int N, int OC);
}  // namespace tf::cuda
#endif
