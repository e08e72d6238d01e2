#include "comm/grad_sync_setup.h"

#include "comm/reducer.h"

#if defined(TF_WITH_CUDA)
#include "comm/device_reducer.h"
#include "comm/nccl_communicator.h"
#endif

namespace tf::comm {
namespace {

class LocalGradientSync final : public StatelessGradientSync {
 public:
  void BeginStep(int64_t) override {}
  void MarkReady(int64_t, int64_t) override {}
  Status Finish() override { return Status::OK(); }
  StatusOr<ReducerStats> LastStats() override { return ReducerStats{}; }
  const std::vector<Bucket>& buckets() const override { return buckets_; }
  const ReducerOptions& options() const override { return options_; }

 private:
  std::vector<Bucket> buckets_;
  ReducerOptions options_;
};

}  // namespace

std::unique_ptr<GradientSync> MakeLocalGradientSync() { return std::make_unique<LocalGradientSync>(); }

StatusOr<GradientSyncSetup> MakeGradientSync(const Topology& topology, Communicator* host, const GradientBuffer& grads,
                                             const std::vector<std::pair<int64_t, int64_t>>& ready_order,
                                             ReducerOptions options, const std::string& compression) {
  GradientSyncSetup setup;
  if (!grads.on_device) {
    if (grads.dtype != DataType::kF32) return Status::InvalidArgument("host gradients must be fp32");
    std::span<float> g(static_cast<float*>(grads.data), static_cast<size_t>(grads.elements));
    if (compression == "auto") {
      TF_ASSIGN_OR_RETURN(CodecChoice choice, ChooseCodec(host, grads.elements, options));
      options.codec = choice.codec;
      setup.reason = choice.reason;
    } else {
      TF_ASSIGN_OR_RETURN(options.codec, ParseCodec(compression));
      setup.reason = "as configured";
    }
    TF_ASSIGN_OR_RETURN(auto reducer, GradientReducer::Create(host, g, ready_order, options));
    setup.sync = std::move(reducer);
    setup.codec = CodecName(options.codec);
    return setup;
  }
#if defined(TF_WITH_CUDA)
  auto* compute = static_cast<cudaStream_t>(grads.compute_stream);
  TF_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                      NcclCommunicator::Create(topology, static_cast<cudaStream_t>(grads.comm_stream)));
  if (compression == "auto") {
    TF_ASSIGN_OR_RETURN(CodecChoice choice,
                        ChooseDeviceCodec(nccl.get(), host, grads.dtype, grads.elements, options, compute));
    options.codec = choice.codec;
    setup.reason = choice.reason;
  } else {
    TF_ASSIGN_OR_RETURN(options.codec, ParseCodec(compression));
    setup.reason = "device reducer over NCCL";
  }
  TF_ASSIGN_OR_RETURN(auto reducer, DeviceGradientReducer::Create(nccl.get(), grads.data, grads.dtype, grads.elements,
                                                                  ready_order, options, compute));
  reducer->AdoptCommunicator(std::move(nccl));
  setup.sync = std::move(reducer);
  setup.codec = CodecName(options.codec);
  return setup;
#else
  (void)topology;
  return Status::Unimplemented("device gradients in a build without CUDA");
#endif
}

}  // namespace tf::comm
