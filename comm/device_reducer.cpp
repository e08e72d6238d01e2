#if defined(TF_WITH_CUDA)
#include "comm/device_reducer.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <string>

#include <fmt/format.h>

#include "kernels/cuda_runtime.h"
#include "kernels/elementwise.h"

namespace tf::comm {

StatusOr<std::unique_ptr<DeviceGradientReducer>> DeviceGradientReducer::Create(
    NcclCommunicator* comm, void* grads, DataType dt, int64_t n,
    const std::vector<std::pair<int64_t, int64_t>>& ready_order, const ReducerOptions& options,
    cudaStream_t compute_stream) {
  if (comm == nullptr || grads == nullptr) return Status::InvalidArgument("device reducer: null communicator/grads");
  if (dt != DataType::kF32 && dt != DataType::kBF16) {
    return Status::InvalidArgument("device reducer: gradients must be fp32 or bf16");
  }
  TF_RETURN_IF_ERROR(CheckTiles(ready_order, n));
  std::unique_ptr<DeviceGradientReducer> r(new DeviceGradientReducer());
  r->comm_ = comm;
  r->grads_ = static_cast<char*>(grads);
  r->dt_ = dt;
  r->n_ = n;
  r->compute_ = compute_stream;
  r->options_ = options;
  r->buckets_ = PlanBuckets(ready_order, options.bucket_bytes, options.first_bucket_bytes);
  if (options.codec.lossy()) {
    TF_RETURN_IF_ERROR(ValidateCodec(options.codec));
    const int W = comm->world();
    int64_t max_bucket = 0, max_shard = 0;
    size_t most = 0, sparse = 0;
    for (const Bucket& b : r->buckets_) {
      max_bucket = std::max(max_bucket, b.size());
      sparse = std::max(sparse, EncodedBytes(options.codec, b.size()));
      for (int k = 0; k < W; ++k) {
        const auto [s0, e0] = ShardOf(b, k, W, options.codec);
        max_shard = std::max(max_shard, e0 - s0);
        most = std::max(most, EncodedBytes(options.codec, e0 - s0));
      }
    }
    r->most_bytes_ = (most + 7) / 8 * 8;
    const size_t block = options.codec.sparse() ? sparse : r->most_bytes_;
    auto alloc = [](::tf::cuda::DeviceBuffer* buf, size_t bytes) -> Status {
      TF_ASSIGN_OR_RETURN(*buf, ::tf::cuda::DeviceBuffer::Allocate(std::max<size_t>(bytes, 16)));
      TF_CUDA_RETURN_IF_ERROR(cudaMemset(buf->data(), 0, buf->bytes()));
      return Status::OK();
    };
    if (dt == DataType::kBF16) TF_RETURN_IF_ERROR(alloc(&r->work_, static_cast<size_t>(max_bucket) * 4));
    if (options.error_feedback) {
      TF_RETURN_IF_ERROR(alloc(&r->residual_, static_cast<size_t>(n) * 4));
      if (!options.codec.sparse()) TF_RETURN_IF_ERROR(alloc(&r->server_, static_cast<size_t>(n) * 4));
    }
    TF_RETURN_IF_ERROR(alloc(&r->send_, block * static_cast<size_t>(W)));
    TF_RETURN_IF_ERROR(alloc(&r->recv_, block * static_cast<size_t>(W)));
    TF_RETURN_IF_ERROR(alloc(&r->shard_, static_cast<size_t>(max_shard) * 4));
  }
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

void DeviceGradientReducer::BeginStep(int64_t step) {
  step_ = step;
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
  const int W = comm_->world();
  char* g = grads_ + b.begin * static_cast<int64_t>(DataTypeSize(dt_));
  ++launched_;
  if (!options_.codec.lossy()) {
    TF_RETURN_IF_ERROR(comm_->AllReduceAverage(g, b.size(), dt_));
    wire_bytes_ += 2 * b.size() * static_cast<int64_t>(DataTypeSize(dt_)) * (W - 1) / W;
    return Status::OK();
  }
  // Lossy: fp32 view of the bucket (staged for bf16), reduced with the codec, written back.
  float* x = reinterpret_cast<float*>(g);
  if (dt_ == DataType::kBF16) {
    x = work_.as<float>();
    TF_RETURN_IF_ERROR(::tf::cuda::convert(x, ::tf::cuda::DType::kF32, g, ::tf::cuda::DType::kBF16, b.size(), comm));
  }
  const uint64_t seed = MixSeed(options_.seed ^ MixSeed(static_cast<uint64_t>(step_) * 1315423911ULL + i));
  TF_RETURN_IF_ERROR(options_.codec.sparse() ? ReduceSparse(b, x, seed) : ReduceDense(b, x, seed));
  if (dt_ == DataType::kBF16) {
    TF_RETURN_IF_ERROR(::tf::cuda::convert(g, ::tf::cuda::DType::kBF16, x, ::tf::cuda::DType::kF32, b.size(), comm));
  }
  return Status::OK();
}

Status DeviceGradientReducer::ReduceDense(const Bucket& b, float* x, uint64_t seed) {
  const CodecConfig& c = options_.codec;
  const int W = comm_->world(), me = comm_->rank();
  cudaStream_t stream = comm_->stream();
  char* send = send_.as<char>();
  char* recv = recv_.as<char>();
  float* residual = residual_.bytes() > 0 ? residual_.as<float>() : nullptr;
  float* server = server_.bytes() > 0 ? server_.as<float>() : nullptr;
  // Phase 1: encode every shard of (x + residual); all-to-all; the owner averages its shard.
  for (int r = 0; r < W; ++r) {
    const auto [s0, e0] = ShardOf(b, r, W, c);
    TF_RETURN_IF_ERROR(cuda::Encode(c, x + (s0 - b.begin), residual ? residual + s0 : nullptr, e0 - s0,
                                    send + most_bytes_ * static_cast<size_t>(r),
                                    MixSeed(MixSeed(seed ^ (0x5851f42d4c957f2dULL * static_cast<uint64_t>(me + 1))) +
                                            2 * static_cast<uint64_t>(r)),
                                    stream));
  }
  TF_RETURN_IF_ERROR(comm_->AllToAll(send, recv, most_bytes_));
  const auto [ms, me_end] = ShardOf(b, me, W, c);
  const int64_t mine = me_end - ms;
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(shard_.data(), 0, static_cast<size_t>(mine) * 4, stream));
  for (int r = 0; r < W; ++r) {
    TF_RETURN_IF_ERROR(cuda::DecodeAccumulate(c, recv + most_bytes_ * static_cast<size_t>(r), mine,
                                              1.0f / static_cast<float>(W), shard_.as<float>(), stream));
  }
  // Phase 2: the owner re-encodes the average (server residual); all-gather; everyone decodes.
  TF_RETURN_IF_ERROR(cuda::Encode(c, shard_.as<float>(), server ? server + ms : nullptr, mine, send,
                                  MixSeed(seed + 2 * static_cast<uint64_t>(me) + 1), stream));
  TF_RETURN_IF_ERROR(comm_->AllGather(send, recv, most_bytes_));
  for (int r = 0; r < W; ++r) {
    const auto [s0, e0] = ShardOf(b, r, W, c);
    TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x + (s0 - b.begin), 0, static_cast<size_t>(e0 - s0) * 4, stream));
    TF_RETURN_IF_ERROR(cuda::DecodeAccumulate(c, recv + most_bytes_ * static_cast<size_t>(r), e0 - s0, 1.0f,
                                              x + (s0 - b.begin), stream));
  }
  wire_bytes_ += 2 * static_cast<int64_t>(most_bytes_) * (W - 1);
  return Status::OK();
}

Status DeviceGradientReducer::ReduceSparse(const Bucket& b, float* x, uint64_t seed) {
  const CodecConfig& c = options_.codec;
  const int W = comm_->world();
  cudaStream_t stream = comm_->stream();
  const size_t bytes = EncodedBytes(c, b.size());
  float* residual = residual_.bytes() > 0 ? residual_.as<float>() + b.begin : nullptr;
  TF_RETURN_IF_ERROR(cuda::Encode(c, x, residual, b.size(), send_.data(), seed, stream));
  TF_RETURN_IF_ERROR(comm_->AllGather(send_.data(), recv_.data(), bytes));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x, 0, static_cast<size_t>(b.size()) * 4, stream));
  for (int r = 0; r < W; ++r) {
    TF_RETURN_IF_ERROR(cuda::DecodeAccumulate(c, recv_.as<char>() + bytes * static_cast<size_t>(r), b.size(),
                                              1.0f / static_cast<float>(W), x, stream));
  }
  wire_bytes_ += static_cast<int64_t>(bytes) * (W - 1);
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
  return comm_->Synchronize();
}

Status DeviceGradientReducer::GetState(std::vector<float>* residual, std::vector<float>* server) {
  const auto [nr, ns] = state_sizes();
  residual->resize(static_cast<size_t>(nr));
  server->resize(static_cast<size_t>(ns));
  if (nr > 0) TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(residual->data(), residual_.data(), nr * 4, cudaMemcpyDeviceToHost));
  if (ns > 0) TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(server->data(), server_.data(), ns * 4, cudaMemcpyDeviceToHost));
  return Status::OK();
}

Status DeviceGradientReducer::SetState(std::span<const float> residual, std::span<const float> server) {
  const auto [nr, ns] = state_sizes();
  if (static_cast<int64_t>(residual.size()) != nr || static_cast<int64_t>(server.size()) != ns) {
    return Status::InvalidArgument("error-feedback state has {} + {} elements, this reducer ({}) keeps {} + {}",
                                   residual.size(), server.size(), CodecName(options_.codec), nr, ns);
  }
  if (nr > 0) TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(residual_.data(), residual.data(), nr * 4, cudaMemcpyHostToDevice));
  if (ns > 0) TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(server_.data(), server.data(), ns * 4, cudaMemcpyHostToDevice));
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

StatusOr<CodecChoice> ChooseDeviceCodec(NcclCommunicator* nccl, Communicator* host, DataType dt, int64_t grad_elements,
                                        const ReducerOptions& base, cudaStream_t compute_stream) {
  if (nccl->world() == 1) {
    CodecChoice c;
    c.reason = "one rank: nothing to send";
    return c;
  }
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(grad_elements, int64_t{4} << 20));
  std::vector<float> values(static_cast<size_t>(n));
  std::mt19937 rng(1234u + static_cast<unsigned>(nccl->rank()));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float& v : values) v = normal(rng);
  TF_ASSIGN_OR_RETURN(::tf::cuda::DeviceBuffer f32, ::tf::cuda::DeviceBuffer::Allocate(static_cast<size_t>(n) * 4));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(f32.data(), values.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
  ::tf::cuda::DeviceBuffer half;
  void* probe = f32.data();
  if (dt == DataType::kBF16) {
    TF_ASSIGN_OR_RETURN(half, ::tf::cuda::DeviceBuffer::Allocate(static_cast<size_t>(n) * 2));
    TF_RETURN_IF_ERROR(
        ::tf::cuda::convert(half.data(), ::tf::cuda::DType::kBF16, f32.data(), ::tf::cuda::DType::kF32, n, compute_stream));
    probe = half.data();
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t e = n; e > 0; e -= int64_t{1} << 18) ranges.emplace_back(std::max<int64_t>(0, e - (int64_t{1} << 18)), e);
  const std::vector<std::string> candidates = {"none", "bf16", "int8"};
  std::vector<double> ms;
  for (const std::string& name : candidates) {
    ReducerOptions ro = base;
    TF_ASSIGN_OR_RETURN(ro.codec, ParseCodec(name));
    TF_ASSIGN_OR_RETURN(auto reducer, DeviceGradientReducer::Create(nccl, probe, dt, n, ranges, ro, compute_stream));
    std::vector<double> times;
    for (int rep = 0; rep <= 3; ++rep) {  // rep 0 warms up
      TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream));
      const auto t0 = std::chrono::steady_clock::now();
      reducer->BeginStep(rep);
      for (auto [b, e] : ranges) reducer->MarkReady(b, e);
      TF_RETURN_IF_ERROR(reducer->Finish());
      TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream));
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    ms.push_back(times[times.size() / 2] * static_cast<double>(grad_elements) / static_cast<double>(n));
  }
  TF_RETURN_IF_ERROR(host->Broadcast(ms.data(), ms.size() * sizeof(double), 0));
  return DecideCodec(candidates, ms, grad_elements, nccl->world(), "GPU");
}

}  // namespace tf::comm
#endif  // TF_WITH_CUDA
