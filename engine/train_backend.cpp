#include "engine/train_backend.h"

#include <omp.h>

#include <cmath>

#include <fmt/format.h>

#include "engine/optimizer.h"
#include "engine/sharded_backend.h"
#if defined(TF_WITH_CUDA)
#include "kernels/cuda_runtime.h"
#include "model/gpt2_cuda.h"
#endif

namespace tf {
namespace {

Status CheckSizes(const ParameterLayout& layout, size_t a, size_t b, const char* what) {
  const auto n = static_cast<size_t>(layout.total());
  if (a != n || b != n) return Status::InvalidArgument("{}: {} and {} values for {} parameters", what, a, b, n);
  return Status::OK();
}

Status CheckRange(const ParameterLayout& layout, int64_t begin, int64_t end) {
  if (begin < 0 || begin > end || end > layout.total()) {
    return Status::InvalidArgument("SnapshotState: elements [{}, {}) of {} parameters", begin, end, layout.total());
  }
  return Status::OK();
}

class CpuBackend final : public TrainBackend {
 public:
  CpuBackend(std::unique_ptr<GPT2> model, std::unique_ptr<AdamW> optimizer, const comm::ShardPlan& plan)
      : model_(std::move(model)), optimizer_(std::move(optimizer)), plan_(plan) {}

  std::string Describe() const override {
    const int n = omp_get_max_threads();
    return fmt::format("cpu ({} thread{})", n, n == 1 ? "" : "s");
  }
  const ParameterLayout& layout() const override { return model_->layout(); }
  Status ZeroGrad() override {
    model_->ZeroGrad();
    return Status::OK();
  }
  StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                  float grad_scale) override {
    return model_->ForwardBackward(inputs, targets, B, T, grad_scale);
  }
  StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    return model_->Forward(inputs, targets, B, T);
  }
  StatusOr<float> GradNorm() override {
    norm_ = std::sqrt(PlannedSumSquares(model_->grads().data(), plan_));
    return static_cast<float>(norm_);
  }
  Status ApplyUpdate(double lr, int64_t t) override {
    optimizer_->Apply(model_->params(), model_->grads(), lr, t, norm_);
    return Status::OK();
  }
  std::pair<int64_t, std::span<float>> HostParams() override { return {0, model_->params()}; }
  Status GetParams(std::span<float> out) override {
    TF_RETURN_IF_ERROR(CheckSizes(layout(), out.size(), out.size(), "GetParams"));
    std::copy(model_->params().begin(), model_->params().end(), out.begin());
    return Status::OK();
  }
  Status SetParams(std::span<const float> in) override {
    TF_RETURN_IF_ERROR(CheckSizes(layout(), in.size(), in.size(), "SetParams"));
    std::copy(in.begin(), in.end(), model_->params().begin());
    return Status::OK();
  }
  Status GetOptimizerState(std::span<float> m, std::span<float> v) override {
    TF_RETURN_IF_ERROR(CheckSizes(layout(), m.size(), v.size(), "GetOptimizerState"));
    std::copy(optimizer_->m().begin(), optimizer_->m().end(), m.begin());
    std::copy(optimizer_->v().begin(), optimizer_->v().end(), v.begin());
    return Status::OK();
  }
  Status SetOptimizerState(std::span<const float> m, std::span<const float> v) override {
    TF_RETURN_IF_ERROR(CheckSizes(layout(), m.size(), v.size(), "SetOptimizerState"));
    std::copy(m.begin(), m.end(), optimizer_->m().begin());
    std::copy(v.begin(), v.end(), optimizer_->v().begin());
    return Status::OK();
  }
  Status SnapshotState(int64_t begin, int64_t end, float* params, float* m, float* v) override {
    TF_RETURN_IF_ERROR(CheckRange(layout(), begin, end));
    // The loop waits for this copy: all the cores, in 1 MiB blocks.
    const float* src[3] = {model_->params().data() + begin, optimizer_->m().data() + begin,
                           optimizer_->v().data() + begin};
    float* dst[3] = {params, m, v};
    constexpr int64_t kBlock = 1 << 18;
    const int64_t blocks = (end - begin + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < 3 * blocks; ++i) {
      const int64_t t = i / blocks, b = (i % blocks) * kBlock;
      std::copy_n(src[t] + b, std::min(kBlock, end - begin - b), dst[t] + b);
    }
    return Status::OK();
  }
  comm::GradientBuffer gradient_buffer() override {
    return comm::GradientBuffer{.data = model_->grads().data(),
                                .dtype = comm::DataType::kF32,
                                .elements = static_cast<int64_t>(model_->grads().size())};
  }
  void SetGradReadyHook(GPT2::GradReadyHook hook) override { model_->set_grad_ready_hook(std::move(hook)); }

 private:
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<AdamW> optimizer_;
  comm::ShardPlan plan_;  // the norm's summation order (engine/sharded_backend.h)
  double norm_ = 0;       // the last GradNorm()
};

#if defined(TF_WITH_CUDA)
class CudaBackend final : public TrainBackend {
 public:
  CudaBackend(std::unique_ptr<GPT2Cuda> model, const AdamWConfig& adamw, int device)
      : model_(std::move(model)), adamw_(adamw), device_(device) {}

  std::string Describe() const override {
    const GPT2CudaOptions& o = model_->options();
    return fmt::format("cuda:{} {}, {}, attention {}, recompute {}, gelu fusion {}, {:.2f} GiB device memory planned",
                       device_, cuda::DeviceDescription(device_), cuda::DTypeName(model_->dtype()),
                       AttentionName(o.attention), o.recompute, o.GeluFusion(model_->dtype()),
                       model_->device_bytes() / double(1 << 30));
  }
  const ParameterLayout& layout() const override { return model_->layout(); }
  Status ZeroGrad() override { return model_->ZeroGrad(); }
  StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                  float grad_scale) override {
    return model_->ForwardBackward(inputs, targets, B, T, grad_scale);
  }
  StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    return model_->Forward(inputs, targets, B, T);
  }
  Status ForwardBackwardAccumulate(const int32_t* inputs, const int32_t* targets, int B, int T,
                                   float grad_scale) override {
    return model_->ForwardBackwardAccumulate(inputs, targets, B, T, grad_scale);
  }
  StatusOr<double> TakeLossSum() override { return model_->TakeLossSum(); }
  ~CudaBackend() override {
    if (state_ready_ != nullptr) {
      cudaStreamSynchronize(model_->copy_stream());
      cudaEventDestroy(state_ready_);
      cudaEventDestroy(snapshot_done_);
    }
  }
  StatusOr<float> GradNorm() override { return model_->GradNorm(); }
  std::string PciBusId() const override {
    char id[32] = {};
    return cudaDeviceGetPCIBusId(id, sizeof(id), device_) == cudaSuccess ? std::string(id) : std::string();
  }
  Status ApplyUpdate(double lr, int64_t t) override {
    if (snapshot_pending_) {
      // The update must not overwrite state a checkpoint copy is still reading.
      TF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(model_->compute_stream(), snapshot_done_, 0));
      snapshot_pending_ = false;
    }
    return model_->ApplyUpdate(adamw_, lr, t);
  }
  Status SnapshotState(int64_t begin, int64_t end, float* params, float* m, float* v) override {
    TF_RETURN_IF_ERROR(CheckRange(layout(), begin, end));
    cudaStream_t copy = model_->copy_stream();
    if (state_ready_ == nullptr) {
      TF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&state_ready_, cudaEventDisableTiming));
      TF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&snapshot_done_, cudaEventDisableTiming));
    }
    const size_t bytes = static_cast<size_t>(end - begin) * sizeof(float);
    TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(state_ready_, model_->compute_stream()));
    TF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy, state_ready_, 0));
    const cudaMemcpyKind d2h = cudaMemcpyDeviceToHost;
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(params, model_->master_device() + begin, bytes, d2h, copy));
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m, model_->adam_m_device() + begin, bytes, d2h, copy));
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v, model_->adam_v_device() + begin, bytes, d2h, copy));
    TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(snapshot_done_, copy));
    snapshot_pending_ = true;
    return Status::OK();
  }
  Status WaitSnapshot() override {
    if (state_ready_ == nullptr) return Status::OK();
    TF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));  // the writer thread's current device
    TF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(snapshot_done_));
    return Status::OK();
  }
  float* AllocateHost(size_t elements) override {
    void* p = nullptr;
    if (cudaSetDevice(device_) != cudaSuccess ||
        cudaHostAlloc(&p, std::max<size_t>(elements, 1) * sizeof(float), cudaHostAllocDefault) != cudaSuccess) {
      return nullptr;
    }
    return static_cast<float*>(p);
  }
  void FreeHost(float* p) override { cudaFreeHost(p); }
  Status GetParams(std::span<float> out) override { return model_->StoreParams(out); }
  Status SetParams(std::span<const float> in) override { return model_->LoadParams(in); }
  Status GetOptimizerState(std::span<float> m, std::span<float> v) override {
    TF_RETURN_IF_ERROR(CheckSizes(layout(), m.size(), v.size(), "GetOptimizerState"));
    TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->compute_stream()));
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(m.data(), model_->adam_m_device(), m.size() * 4, cudaMemcpyDeviceToHost));
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(v.data(), model_->adam_v_device(), v.size() * 4, cudaMemcpyDeviceToHost));
    return Status::OK();
  }
  Status SetOptimizerState(std::span<const float> m, std::span<const float> v) override {
    TF_RETURN_IF_ERROR(CheckSizes(layout(), m.size(), v.size(), "SetOptimizerState"));
    cudaStream_t s = model_->compute_stream();
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(model_->adam_m_device(), m.data(), m.size() * 4, cudaMemcpyHostToDevice, s));
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(model_->adam_v_device(), v.data(), v.size() * 4, cudaMemcpyHostToDevice, s));
    TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));  // while the host spans are alive
    return Status::OK();
  }
  comm::GradientBuffer gradient_buffer() override {
    return comm::GradientBuffer{
        .data = model_->grads_device(),
        .dtype = model_->dtype() == cuda::DType::kBF16 ? comm::DataType::kBF16 : comm::DataType::kF32,
        .elements = model_->num_params(),
        .on_device = true,
        .device = device_,
        .compute_stream = model_->compute_stream(),
        .comm_stream = model_->comm_stream()};
  }
  void SetGradReadyHook(GPT2::GradReadyHook hook) override { model_->set_grad_ready_hook(std::move(hook)); }
  GPT2Cuda* cuda_model() override { return model_.get(); }

 private:
  std::unique_ptr<GPT2Cuda> model_;
  AdamWConfig adamw_;
  int device_;
  cudaEvent_t state_ready_ = nullptr, snapshot_done_ = nullptr;
  bool snapshot_pending_ = false;
};
#endif

StatusOr<std::unique_ptr<TrainBackend>> MakeCpuBackend(const GPT2Config& config, const TrainConfig& train,
                                                       const AdamWConfig& adamw, const comm::ShardPlan& plan) {
  TF_ASSIGN_OR_RETURN(auto model, GPT2::Create(config, train.batch_size, train.seq_len));
  std::unique_ptr<AdamW> optimizer;
  try {
    optimizer = std::make_unique<AdamW>(model->layout(), adamw);
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument("out of memory allocating AdamW state ({:.2f} GiB)",
                                   2.0 * model->layout().total() * 4 / double(1 << 30));
  }
  return std::unique_ptr<TrainBackend>(new CpuBackend(std::move(model), std::move(optimizer), plan));
}

}  // namespace

bool UsesCuda(const TrainConfig& train) {
  return train.device == "cuda" || (train.device == "auto" && CudaDeviceCount() > 0);
}

StatusOr<std::unique_ptr<TrainBackend>> MakeTrainBackend(const GPT2Config& model, const TrainConfig& train,
                                                         const comm::Topology& topo, const comm::ShardPlan& plan) {
  const AdamWConfig adamw{train.beta1, train.beta2, train.eps, train.weight_decay, train.grad_clip};
  if (!UsesCuda(train)) {
    if (train.zero_stage == 0) return MakeCpuBackend(model, train, adamw, plan);
    // The plan is over one replica group of G consecutive ranks (all ranks without groups).
    const int G = plan.world;
    if (G < 1 || topo.world % G != 0) {
      return Status::Internal("a shard plan over {} ranks for a world of {}", G, topo.world);
    }
    TF_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> group, comm::MakeSplitCommunicator(topo, topo.rank / G));
    TF_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> across, comm::MakeSplitCommunicator(topo, topo.rank % G));
    return MakeShardedCpuBackend(model, train, adamw, plan, std::move(group), std::move(across));
  }
  if (train.zero_stage > 0) {
    return Status::InvalidArgument("zero_stage {} runs on CPU ranks in this version; GPU ranks train with zero_stage 0 "
                                   "(device \"cpu\" shards the state)",
                                   train.zero_stage);
  }
  const int gpus = CudaDeviceCount();
  if (gpus == 0) {
    return Status::InvalidArgument("device \"cuda\" requested but no CUDA GPU is visible{} (use device \"cpu\" or "
                                   "\"auto\")",
                                   TrainBackendHasCuda() ? "" : " and this trainflow was built without CUDA");
  }
  if (topo.local_rank >= gpus) {
    return Status::InvalidArgument("rank {} is local rank {} on host {}, but only {} GPU{} visible there: start at "
                                   "most one rank per GPU",
                                   topo.rank, topo.local_rank, topo.hostname, gpus, gpus == 1 ? " is" : "s are");
  }
#if defined(TF_WITH_CUDA)
  GPT2CudaOptions mo;
  TF_ASSIGN_OR_RETURN(mo.attention, ParseAttention(train.attention));
  mo.recompute = train.recompute;
  mo.gelu_fusion = train.gelu_fusion;
  mo.fuse_residual = train.fuse_residual;
  mo.deterministic_attention = train.deterministic;
  const cuda::DType dtype = train.dtype == "bf16" ? cuda::DType::kBF16 : cuda::DType::kF32;
  TF_ASSIGN_OR_RETURN(auto m, GPT2Cuda::Create(model, train.batch_size, train.seq_len, dtype, mo, topo.local_rank));
  return std::unique_ptr<TrainBackend>(new CudaBackend(std::move(m), adamw, topo.local_rank));
#else
  return Status::Internal("unreachable: a CUDA device without the CUDA backend");
#endif
}

int CudaDeviceCount() {
#if defined(TF_WITH_CUDA)
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

bool TrainBackendHasCuda() {
#if defined(TF_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace tf
