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
