#if defined(TF_WITH_CUDA)
#include "comm/device_reducer.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/cuda_runtime.h"

namespace tf::comm {

StatusOr<std::unique_ptr<DeviceGradientReducer>> DeviceGradientReducer::Create(
    NcclCommunicator* comm, void* grads, DataType dt, int64_t n,
    const std::vector<std::pair<int64_t, int64_t>>& ready_order, const ReducerOptions& options,
    cudaStream_t compute_stream) {
  if (comm == nullptr || grads == nullptr) return Status::InvalidArgument("device reducer: null communicator/grads");
  if (dt != DataType::kF32 && dt != DataType::kBF16) {
    return Status::InvalidArgument("device reducer: gradients must be fp32 or bf16");
  }
  if (options.codec.kind != CodecKind::kNone) {
    return Status::Unimplemented("gradient compression ({}) on GPUs is not wired into the GPU reducer yet; use "
                                 "compression none with --device cuda",
                                 CodecName(options.codec));
  }
  // Same validation and plan as the host reducer.
  std::vector<std::pair<int64_t, int64_t>> sorted = ready_order;
  std::sort(sorted.begin(), sorted.end());
  int64_t expect = 0;
  for (auto [b, e] : sorted) {
    if (b != expect || e <= b) return Status::InvalidArgument("device reducer: ready ranges do not tile the gradients");
    expect = e;
  }
  if (expect != n) return Status::InvalidArgument("device reducer: ready ranges cover {} of {} elements", expect, n);
  std::unique_ptr<DeviceGradientReducer> r(new DeviceGradientReducer());
  r->comm_ = comm;
  r->grads_ = static_cast<char*>(grads);
  r->dt_ = dt;
  r->n_ = n;
  r->compute_ = compute_stream;
  r->buckets_ = PlanBuckets(ready_order, options.bucket_bytes, options.first_bucket_bytes);
  r->pending_.assign(r->buckets_.size(), 0);
  r->ready_events_.assign(r->buckets_.size(), nullptr);
  for (cudaEvent_t& e : r->ready_events_) {
    TF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  TF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r->backward_end_));
  TF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r->comm_end_));
  return r;
}

DeviceGradientReducer::~DeviceGradientReducer() {
  for (cudaEvent_t e : ready_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (backward_end_ != nullptr) cudaEventDestroy(backward_end_);
  if (comm_end_ != nullptr) cudaEventDestroy(comm_end_);
}

void DeviceGradientReducer::BeginStep() {
  for (size_t i = 0; i < buckets_.size(); ++i) pending_[i] = buckets_[i].size();
  error_ = Status::OK();
  launched_ = 0;
  wire_bytes_ = 0;
}

Status DeviceGradientReducer::LaunchBucket(size_t i) {
  const Bucket& b = buckets_[i];
  cudaStream_t comm = comm_->stream();
  TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_events_[i], compute_));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm, ready_events_[i], 0));
  TF_RETURN_IF_ERROR(comm_->AllReduceAverage(grads_ + b.begin * static_cast<int64_t>(DataTypeSize(dt_)), b.size(), dt_));
  const int W = comm_->world();
  wire_bytes_ += 2 * b.size() * static_cast<int64_t>(DataTypeSize(dt_)) * (W - 1) / W;
  ++launched_;
  return Status::OK();
}

void DeviceGradientReducer::MarkReady(int64_t begin, int64_t end) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const int64_t lo = std::max(begin, buckets_[i].begin), hi = std::min(end, buckets_[i].end);
    if (hi <= lo || pending_[i] <= 0) continue;
    pending_[i] -= hi - lo;
    if (pending_[i] <= 0 && error_.ok()) error_ = LaunchBucket(i);
  }
}

Status DeviceGradientReducer::Finish() {
  TF_RETURN_IF_ERROR(error_);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (pending_[i] > 0) {
      return Status::Internal("device reducer: bucket {} ([{}, {})) was never completely marked ready", i,
                              buckets_[i].begin, buckets_[i].end);
    }
  }
  TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(backward_end_, compute_));
  TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_end_, comm_->stream()));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, comm_end_, 0));
  return Status::OK();
}

StatusOr<ReducerStats> DeviceGradientReducer::LastStats() {
  ReducerStats s;
  s.buckets = static_cast<int>(buckets_.size());
  s.raw_bytes = n_ * static_cast<int64_t>(DataTypeSize(dt_));
  s.wire_bytes = wire_bytes_;
  TF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(comm_end_));
  float ms = 0;
  TF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, backward_end_, comm_end_));
  s.exposed_ms = std::max(0.0f, ms);
  return s;
}

}  // namespace tf::comm
#endif  // TF_WITH_CUDA
