#if defined(TF_WITH_CUDA)
#include "kernels/cuda_profiler.h"

#include <cstring>

#include "kernels/cuda_runtime.h"

namespace tf::cuda {

StatusOr<std::unique_ptr<RangeProfiler>> RangeProfiler::Create(cudaStream_t stream, int max_ranges) {
  if (max_ranges <= 0) return Status::InvalidArgument("RangeProfiler: max_ranges must be positive, got {}", max_ranges);
  std::unique_ptr<RangeProfiler> p(new RangeProfiler(stream));
  p->events_.resize(2 * static_cast<size_t>(max_ranges), nullptr);
  for (cudaEvent_t& e : p->events_) TF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  p->names_.reserve(static_cast<size_t>(max_ranges));
  return p;
}

RangeProfiler::~RangeProfiler() {
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

void RangeProfiler::Begin(const char* name) {
  if (open_ >= 0) End();  // ranges do not nest: close the previous one
  if (names_.size() * 2 >= events_.size()) {
    ++dropped_;
    return;
  }
  open_ = static_cast<int>(names_.size());
  names_.push_back(name);
  const cudaError_t err = cudaEventRecord(events_[2 * static_cast<size_t>(open_)], stream_);
  if (err != cudaSuccess && error_ == cudaSuccess) error_ = err;
}

void RangeProfiler::End() {
  if (open_ < 0) return;
  const cudaError_t err = cudaEventRecord(events_[2 * static_cast<size_t>(open_) + 1], stream_);
  if (err != cudaSuccess && error_ == cudaSuccess) error_ = err;
  open_ = -1;
}

StatusOr<std::vector<RangeProfiler::Total>> RangeProfiler::Collect() {
  End();
  std::vector<Total> totals;
  const cudaError_t recorded = error_;
  error_ = cudaSuccess;
  const std::vector<const char*> names = names_;  // (a copy: names_ keeps its capacity)
  names_.clear();
  dropped_ = 0;
  if (recorded != cudaSuccess) return CudaError(recorded, "cudaEventRecord (profiler)", __FILE__, __LINE__);
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  for (size_t r = 0; r < names.size(); ++r) {
    float ms = 0;
    TF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[2 * r], events_[2 * r + 1]));
    Total* t = nullptr;
    for (Total& x : totals) {
      if (std::strcmp(x.name.c_str(), names[r]) == 0) t = &x;
    }
    if (t == nullptr) {
      totals.push_back({names[r], 0.0, 0});
      t = &totals.back();
    }
    t->ms += ms;
    ++t->count;
  }
  return totals;
}

}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
