// CublasContext (kernels/cublas_handle.h): handle creation, stream binding, status conversion.
// Host C++ (fmt formats the messages here; .cu files only call CublasError()).
#if defined(TF_WITH_CUDA)
#include "kernels/cublas_handle.h"

#include <utility>

#include <fmt/format.h>

namespace tf::cuda {

Status CublasError(cublasStatus_t status, const char* expr, const char* file, int line) {
  return Status::Internal("cuBLAS error {} ({}) in {} at {}:{}", cublasGetStatusName(status),
                          cublasGetStatusString(status), expr, file, line);
}

StatusOr<CublasContext> CublasContext::Create(cudaStream_t stream, Options options) {
  // cublasCreate would fail too, but this says why.
  if (DeviceCount() == 0) return Status::Unimplemented("CublasContext: no CUDA device visible");
  CublasContext ctx;
  ctx.options_ = options;
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&ctx.lt_));
  TF_CUBLAS_RETURN_IF_ERROR(cublasCreate(&ctx.blas_));
  // No TF32 (CUBLAS_DEFAULT_MATH, and every call passes CUBLAS_COMPUTE_32F); split-K reductions in
  // the accumulator type, never in bf16.
  TF_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      ctx.blas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  TF_ASSIGN_OR_RETURN(ctx.workspace_, DeviceBuffer::Allocate(kWorkspaceBytes));
  TF_RETURN_IF_ERROR(ctx.SetStream(stream));
  return ctx;
}

Status CublasContext::SetStream(cudaStream_t stream) {
  // cublasSetStream resets the classic handle's workspace to its internal pool, so the workspace
  // is set again after it. (cuBLASLt takes the stream and workspace per call.)
  TF_CUBLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream));
  TF_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(blas_, workspace_.data(), workspace_.bytes()));
  stream_ = stream;
  return Status::OK();
}

CublasContext::~CublasContext() {
  // Destruction errors cannot be reported from a destructor; the handles are gone either way.
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

CublasContext::CublasContext(CublasContext&& o) noexcept
    : lt_(std::exchange(o.lt_, nullptr)),
      blas_(std::exchange(o.blas_, nullptr)),
      stream_(std::exchange(o.stream_, nullptr)),
      workspace_(std::move(o.workspace_)),
      options_(o.options_),
      stats_(o.stats_),
      lt_algo_cache_(std::move(o.lt_algo_cache_)) {}

CublasContext& CublasContext::operator=(CublasContext&& o) noexcept {
  std::swap(lt_, o.lt_);
  std::swap(blas_, o.blas_);
  std::swap(stream_, o.stream_);
  std::swap(workspace_, o.workspace_);
  std::swap(options_, o.options_);
  std::swap(stats_, o.stats_);
  std::swap(lt_algo_cache_, o.lt_algo_cache_);
  return *this;
}

}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
