// CublasContext: the cuBLAS state the CUDA GEMM kernels (kernels/matmul.cu, kernels/attention.cu)
// run with: a cuBLASLt handle, a classic cuBLAS handle and one workspace, all bound to one stream.
//
// Ownership: the context owns both handles and the workspace (cudaMalloc'd, kWorkspaceBytes); it
// does not own the stream. Not copyable (a resource owner), movable.
// Thread safety: none. A context is used by one host thread, and every operation issued through it
// runs on its stream; that serialisation is what lets the two handles share one workspace. Use one
// context per stream.
//
// Numerics (both handles): fp32 accumulation, no TF32 (cuBLASLt is always given CUBLAS_COMPUTE_32F,
// the classic handle runs CUBLAS_DEFAULT_MATH with CUBLAS_COMPUTE_32F), and split-K partial sums
// are never reduced in bf16 (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION here; a reduction
// scheme mask on the cuBLASLt side, kernels/matmul.cu). fp32 GEMMs therefore match the CPU SGEMM
// up to summation order.
//
// Only compiled with the CUDA backend (TF_WITH_CUDA).
#pragma once
#include <cstddef>
#include <string>
#include <unordered_map>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda_runtime.h"
#include "base/status.h"

namespace tf::cuda {

// Converts a cuBLAS / cuBLASLt status into a Status naming the call site ("CUBLAS_STATUS_... in
// <expr> at file:line").
Status CublasError(cublasStatus_t status, const char* expr, const char* file, int line);

// The cudaDataType cuBLAS uses for elements stored as `dt`.
inline cudaDataType_t CudaDataType(DType dt) { return dt == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

class CublasContext {
 public:
  // 32 MiB: what NVIDIA recommends for Hopper (4 MiB suffices before it); shared by both handles.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  struct Options {
    // true: linear layers run through cuBLASLt with the bias / GELU epilogues fused into the GEMM.
    // false: classic cuBLAS GEMMs plus separate bias / GELU kernels (the simple path; the tests run
    // both). cuBLASLt shapes it has no algorithm for fall back to the classic path either way.
    bool use_lt_epilogues = true;
  };

  // Creates both handles and the workspace and binds them to `stream` (nullptr: the legacy default
  // stream). Fails (never aborts) without a device or on any cuBLAS / CUDA error.
  static StatusOr<CublasContext> Create(cudaStream_t stream, Options options);
  static StatusOr<CublasContext> Create(cudaStream_t stream) { return Create(stream, Options{}); }

  ~CublasContext();
  CublasContext(const CublasContext&) = delete;
  CublasContext& operator=(const CublasContext&) = delete;
  CublasContext(CublasContext&& o) noexcept;
  CublasContext& operator=(CublasContext&& o) noexcept;

  // Rebinds the context to another stream (the workspace follows it).
  // REQUIRES: all work issued on the previous stream through this context has completed or is
  // ordered before the next use (the workspace is reused immediately).
  Status SetStream(cudaStream_t stream);

  cublasLtHandle_t lt() const { return lt_; }
  cublasHandle_t blas() const { return blas_; }
  cudaStream_t stream() const { return stream_; }
  void* workspace() const { return workspace_.data(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }
  const Options& options() const { return options_; }

  // How the GEMMs issued through this context ran (for tests and benchmarks; not thread-safe,
  // like the rest of the context).
  struct Stats {
    long lt_gemms = 0;       // cuBLASLt calls (with or without an epilogue)
    long classic_gemms = 0;  // classic cuBLAS calls (cublasGemmEx, cublasGemmStridedBatchedEx)
    long lt_fallbacks = 0;   // cuBLASLt had no algorithm; the classic path ran instead
    long lt_heuristic_queries = 0;  // cuBLASLt heuristic queries (the rest came from the cache)
  };
  Stats& stats() { return stats_; }

  // cuBLASLt's algorithm choice per GEMM configuration (types, transposes, shape, leading
  // dimensions, epilogue, alignments: everything the heuristic query sees; kernels/matmul.cu builds
  // the key), so that a training step asks the heuristic once per distinct GEMM instead of on every
  // call — host time that would otherwise be spent on every step, and the same algorithm every step.
  // (The compute and scale types, the split-K reduction preference and the workspace size are the
  // same for every GEMM of a context; they would have to join the key if they ever varied.)
  struct LtAlgo {
    bool found = false;  // false: cuBLASLt has none (the caller falls back)
    cublasLtMatmulAlgo_t algo{};
  };
  std::unordered_map<std::string, LtAlgo>& lt_algo_cache() { return lt_algo_cache_; }

 private:
  CublasContext() = default;

  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer workspace_;
  Options options_;
  Stats stats_;
  std::unordered_map<std::string, LtAlgo> lt_algo_cache_;
};

}  // namespace tf::cuda

// Evaluates a cublasStatus_t expression (cuBLAS or cuBLASLt); returns a Status naming it from the
// current function on failure.
#define TF_CUBLAS_RETURN_IF_ERROR(expr)                                                            \
  do {                                                                                             \
    cublasStatus_t tf_cublas_st_ = (expr);                                                         \
    if (tf_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      return ::tf::cuda::CublasError(tf_cublas_st_, #expr, __FILE__, __LINE__);                   \
  } while (0)
