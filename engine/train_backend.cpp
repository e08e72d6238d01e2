#include "engine/train_backend.h"

#include <omp.h>

#include <fmt/format.h>

#include "engine/optimizer.h"
#if defined(TF_WITH_CUDA)
#include "comm/device_reducer.h"
#include "comm/nccl_communicator.h"
#include "kernels/cuda_runtime.h"
#include "model/gpt2_cuda.h"
#endif

namespace tf {
namespace {

class CpuBackend final : public TrainBackend {
 public:
  CpuBackend(std::unique_ptr<GPT2> model, std::unique_ptr<AdamW> optimizer)
      : model_(std::move(model)), optimizer_(std::move(optimizer)) {}

  std::string Describe() const override { return fmt::format("cpu ({} threads)", omp_get_max_threads()); }
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
  StatusOr<float> OptimizerStep(double lr, int64_t t) override {
    return optimizer_->Step(model_->params(), model_->grads(), lr, t);
  }
  Status GetParams(std::span<float> out) override {
    std::copy(model_->params().begin(), model_->params().end(), out.begin());
    return Status::OK();
  }
  Status SetParams(std::span<const float> in) override {
    std::copy(in.begin(), in.end(), model_->params().begin());
    return Status::OK();
  }
  std::span<float> host_grads() override { return model_->grads(); }
  std::span<float> host_params() override { return model_->params(); }
  void SetGradReadyHook(GPT2::GradReadyHook hook) override { model_->set_grad_ready_hook(std::move(hook)); }

 private:
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<AdamW> optimizer_;
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
  StatusOr<float> OptimizerStep(double lr, int64_t t) override {
    // The step synchronises on the gradient norm anyway; wait for the reduction first, with the
    // communicator's deadline and NCCL's asynchronous errors, instead of blocking forever in the
    // stream synchronisation if a peer is gone.
    if (nccl_) TF_RETURN_IF_ERROR(nccl_->Synchronize());
    return model_->Step(adamw_, lr, t);
  }
  Status GetParams(std::span<float> out) override { return model_->StoreParams(out); }
  Status SetParams(std::span<const float> in) override { return model_->LoadParams(in); }
  std::span<float> host_grads() override { return {}; }
  std::span<float> host_params() override { return {}; }
  void SetGradReadyHook(GPT2::GradReadyHook) override {}

  StatusOr<comm::CodecChoice> ChooseDeviceCodec(const comm::Topology& topology, const comm::ReducerOptions& options,
                                                comm::Communicator* host) override {
    if (!nccl_) {
      TF_ASSIGN_OR_RETURN(nccl_, comm::NcclCommunicator::Create(topology, model_->comm_stream()));
    }
    return comm::ChooseDeviceCodec(nccl_.get(), host, GradType(), model_->num_params(), options,
                                   model_->compute_stream());
  }
  Status SetUpDeviceDataParallel(const comm::Topology& topology, const comm::ReducerOptions& options) override {
    if (!nccl_) {
      TF_ASSIGN_OR_RETURN(nccl_, comm::NcclCommunicator::Create(topology, model_->comm_stream()));
    }
    const comm::DataType dt = GradType();
    TF_ASSIGN_OR_RETURN(reducer_, comm::DeviceGradientReducer::Create(nccl_.get(), model_->grads_device(), dt,
                                                                      model_->num_params(),
                                                                      GradReadyRanges(model_->layout()), options,
                                                                      model_->compute_stream()));
    model_->set_grad_ready_hook([this](int64_t begin, int64_t end) {
      if (reduce_now_) reducer_->MarkReady(begin, end);
    });
    return Status::OK();
  }
  void BeginDeviceReduction(int64_t step) override {
    if (reducer_) reducer_->BeginStep(step);
  }
  void set_reduce_on_backward(bool on) override { reduce_now_ = on && reducer_ != nullptr; }
  Status FinishDeviceReduction() override { return reducer_ ? reducer_->Finish() : Status::OK(); }
  comm::DataType GradType() const {
    return model_->dtype() == cuda::DType::kBF16 ? comm::DataType::kBF16 : comm::DataType::kF32;
  }
  StatusOr<comm::ReducerStats> DeviceReductionStats() override {
    if (!reducer_) return comm::ReducerStats{};
    return reducer_->LastStats();
  }

 private:
  std::unique_ptr<GPT2Cuda> model_;  // declared first: outlives the reducer and NCCL using its streams
  std::unique_ptr<comm::NcclCommunicator> nccl_;
  std::unique_ptr<comm::DeviceGradientReducer> reducer_;
  bool reduce_now_ = false;
  AdamWConfig adamw_;
  int device_;
};
#endif

}  // namespace

StatusOr<std::unique_ptr<TrainBackend>> MakeCpuBackend(const GPT2Config& config, int B, int T,
                                                       const AdamWConfig& adamw) {
  TF_ASSIGN_OR_RETURN(auto model, GPT2::Create(config, B, T));
  std::unique_ptr<AdamW> optimizer;
  try {
    optimizer = std::make_unique<AdamW>(model->layout(), adamw);
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument("out of memory allocating AdamW state ({:.2f} GiB)",
                                   2.0 * model->layout().total() * 4 / double(1 << 30));
  }
  return std::unique_ptr<TrainBackend>(new CpuBackend(std::move(model), std::move(optimizer)));
}

StatusOr<std::unique_ptr<TrainBackend>> MakeCudaBackend(const GPT2Config& config, int B, int T,
                                                        const AdamWConfig& adamw, const CudaBackendOptions& options,
                                                        int device) {
#if defined(TF_WITH_CUDA)
  const std::string& dtype = options.dtype;
  if (dtype != "bf16" && dtype != "fp32") {
    return Status::InvalidArgument("dtype must be bf16 or fp32, got '{}'", dtype);
  }
  GPT2CudaOptions mo;
  TF_ASSIGN_OR_RETURN(mo.attention, ParseAttention(options.attention));
  mo.recompute = options.recompute;
  mo.gelu_fusion = options.gelu_fusion;
  mo.deterministic_attention = options.deterministic;
  const int n = cuda::DeviceCount();
  if (device < 0 || device >= n) {
    return Status::InvalidArgument("CUDA device {} requested but {} {} visible", device, n, n == 1 ? "is" : "are");
  }
  TF_ASSIGN_OR_RETURN(auto model, GPT2Cuda::Create(config, B, T, dtype == "bf16" ? cuda::DType::kBF16 : cuda::DType::kF32,
                                                   mo, device));
  return std::unique_ptr<TrainBackend>(new CudaBackend(std::move(model), adamw, device));
#else
  (void)config, (void)B, (void)T, (void)adamw, (void)options, (void)device;
  return Status::Unimplemented("this trainflow was built without the CUDA backend (no nvcc at build time); "
                               "use device \"cpu\"");
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
