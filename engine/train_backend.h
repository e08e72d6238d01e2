// TrainBackend: what the Trainer needs from a device — forward/backward on micro-batches, the
// optimizer step, its gradient buffer and grad-ready hook for the data-parallel GradientSync
// (comm/grad_sync.h), and host copies of the training state — with one implementation each:
//   CPU   model/gpt2.h (GPT2) + engine/optimizer.h (AdamW), all in host memory.
//   CUDA  model/gpt2_cuda.h (GPT2Cuda): device memory, bf16 or fp32 storage, fused AdamW.
// MakeTrainBackend picks one from the training config (device, dtype, attention, ...: validated
// once, in engine/train_config.cpp).
//
// Ownership: a backend owns its model and optimizer state. Thread safety: one thread drives it.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "base/huge_pages.h"
#include "base/status.h"
#include "comm/grad_sync_setup.h"
#include "comm/grad_sync.h"
#include "comm/process_group.h"
#include "comm/shard_plan.h"
#include "engine/train_config.h"
#include "kernels/optimizer.h"
#include "model/config.h"
#include "model/gpt2.h"
#include "model/parameters.h"

namespace tf {

class GPT2Cuda;

class TrainBackend {
 public:
  virtual ~TrainBackend() = default;
  // "cpu (2 threads)", "cuda:0 NVIDIA H200 (sm_90, ...), bf16".
  virtual std::string Describe() const = 0;
  virtual const ParameterLayout& layout() const = 0;

  virtual Status ZeroGrad() = 0;
  // Accumulates the gradient of (mean loss * grad_scale); returns the micro-batch's mean loss.
  virtual StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                          float grad_scale) = 0;
  virtual StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  // The training loop's form: as ForwardBackward, with the micro-batch's mean loss added to an
  // accumulator read (and reset) by TakeLossSum() once per step — on a device this avoids a host
  // synchronisation per micro-batch.
  virtual Status ForwardBackwardAccumulate(const int32_t* inputs, const int32_t* targets, int B, int T,
                                           float grad_scale) {
    TF_ASSIGN_OR_RETURN(const float loss, ForwardBackward(inputs, targets, B, T, grad_scale));
    loss_sum_ += loss;
    return Status::OK();
  }
  virtual StatusOr<double> TakeLossSum() { return std::exchange(loss_sum_, 0.0); }
  // The PCI bus id of the rank's GPU ("0000:65:00.0"; "" for the CPU): which GPU the monitor reports.
  virtual std::string PciBusId() const { return ""; }
  // The global norm of the (already averaged) gradients, before clipping; a device synchronises
  // to read it back.
  virtual StatusOr<float> GradNorm() = 0;
  // Global-norm clip (by that norm) + AdamW at `lr`, step t (1-based).
  // REQUIRES: GradNorm() since the gradients last changed.
  virtual Status ApplyUpdate(double lr, int64_t t) = 0;
  // Both; returns the norm.
  StatusOr<float> OptimizerStep(double lr, int64_t t) {
    TF_ASSIGN_OR_RETURN(const float norm, GradNorm());
    TF_RETURN_IF_ERROR(ApplyUpdate(lr, t));
    return norm;
  }

  // fp32 master parameters in ParameterLayout order (a device backend copies; SetParams also
  // refreshes the bf16 copy).
  virtual Status GetParams(std::span<float> out) = 0;
  virtual Status SetParams(std::span<const float> in) = 0;
  // The host memory holding the fp32 parameters this backend keeps and the element of the flat
  // buffer it starts at — all of them, or a ZeRO stage-3 shard — for initialising them in place;
  // empty when they live on a device (then SetParams).
  virtual std::pair<int64_t, std::span<float>> HostParams() { return {0, {}}; }
  // AdamW's first and second moments (fp32, ParameterLayout order).
  virtual Status GetOptimizerState(std::span<float> m, std::span<float> v) = 0;
  virtual Status SetOptimizerState(std::span<const float> m, std::span<const float> v) = 0;

  // A loaded state: m and v hold elements [begin, begin + m.size()) of the moments, params either
  // the whole parameters or the same slice. A backend keeping the whole state needs whole vectors
  // (InvalidArgument otherwise); a sharded one keeps what it owns (a slice must cover its shard).
  virtual Status SetStateSlice(int64_t begin, std::span<const float> params, std::span<const float> m,
                               std::span<const float> v) {
    if (begin != 0 || m.size() != static_cast<size_t>(layout().total())) {
      return Status::InvalidArgument("this backend keeps the whole state; it was given elements [{}, {})", begin,
                                     begin + static_cast<int64_t>(m.size()));
    }
    TF_RETURN_IF_ERROR(SetParams(params));
    return SetOptimizerState(m, v);
  }
  // A checkpoint's snapshot: elements [begin, end) of the fp32 master parameters and of both
  // moments into host buffers of AllocateHost. The CPU copies now. CUDA: queued on a copy stream
  // after the last optimizer step; the next OptimizerStep waits for it (the forward/backward in
  // between overlap the copy), and WaitSnapshot (any thread) blocks until it is done.
  virtual Status SnapshotState(int64_t begin, int64_t end, float* params, float* m, float* v) = 0;
  virtual Status WaitSnapshot() { return Status::OK(); }
  // Host memory for snapshots (page-locked on a GPU, so copies run asynchronously); nullptr when
  // out of memory. FreeHost releases it.
  virtual float* AllocateHost(size_t elements) { return static_cast<float*>(AllocateLarge(elements * sizeof(float))); }
  virtual void FreeHost(float* p) { FreeLarge(p); }

  // The gradients the GradientSync averages in place, and the hook announcing final ranges
  // (model/parameters.h GradReadyRanges) during backward.
  virtual comm::GradientBuffer gradient_buffer() = 0;
  virtual void SetGradReadyHook(GPT2::GradReadyHook hook) = 0;
  // A backend that reduces the gradients itself (ZeRO stages 1-3: reduce-scattered as backward
  // goes) hands the trainer its synchroniser, once, to be fed by the grad-ready hook as any other;
  // nullptr: the trainer builds one over gradient_buffer().
  virtual std::unique_ptr<comm::GradientSync> TakeGradientSync() { return nullptr; }
  // Bytes this rank sent in the last ApplyUpdate (ZeRO stages 1 and 2 all-gather the updated
  // parameters there); 0 otherwise.
  virtual int64_t update_wire_bytes() const { return 0; }
  // Whether GetOptimizerState (sharded moments) and GetParams (sharded parameters, ZeRO stage 3)
  // are collectives that every rank must call. A params_collective backend takes an empty span
  // in GetParams from a rank that only takes part (it then never holds the whole model).
  virtual bool collective_state() const { return false; }
  virtual bool params_collective() const { return false; }
  // The CUDA model, for `trainflow bench`'s profiler and memory report (nullptr on the CPU).
  virtual GPT2Cuda* cuda_model() { return nullptr; }

 private:
  double loss_sum_ = 0.0;
};

// The backend `train.device` asks for ("auto": CUDA when the build has it and a GPU is visible),
// planned for B = train.batch_size, T = train.seq_len, on GPU `local_rank`, holding the state
// `plan` gives this rank under train.zero_stage (engine/sharded_backend.h; stage 0 uses the plan only
// to sum the gradient norm in the order the sharded stages do; for stages 1-3 plan.world is the
// replica group's size, dividing the world). InvalidArgument naming the problem (no GPU, more ranks
// than GPUs on a host, a stage the device does not run). Parameters are not initialised. Collective
// when zero_stage > 0 (the backend gets communicators of its own: its group and across the groups).
StatusOr<std::unique_ptr<TrainBackend>> MakeTrainBackend(const GPT2Config& model, const TrainConfig& train,
                                                         const comm::Topology& topology, const comm::ShardPlan& plan);
// Whether `train.device` resolves to the CUDA backend here.
bool UsesCuda(const TrainConfig& train);
// Number of usable CUDA devices (0 in CPU-only builds or without a driver).
int CudaDeviceCount();
// Whether this build has the CUDA backend.
bool TrainBackendHasCuda();

}  // namespace tf
