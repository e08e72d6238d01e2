// GPT2Cuda: the GPT-2 model on one CUDA device — parameters, gradients, AdamW state and activations
// in device memory planned once at Create(), forward/backward/AdamW through the tf::cuda kernels on
// one compute stream. Same layout (model/parameters.h), math and data contract as the CPU GPT2; the
// storage dtype is fp32 (for checking against the CPU) or bf16 (mixed precision: bf16 parameters,
// activations and gradients; fp32 master weights and AdamW moments; fp32 accumulation).
// GPT2CudaOptions: attention (flash by default, or the GEMM baseline), activation recomputation
// (bit-identical to storing) and epilogue fusions; EstimateMemory() gives a plan's device bytes
// without a device. Both: docs/cuda.md (the model, "Memory plan").
//
// Streams: compute_stream() runs every kernel of the model; comm_stream() (gradient reduction) and
// copy_stream() (checkpoint snapshots) are for the engine, never used by the model, and ordered
// against compute with events, e.g. cudaStreamWaitEvent(comm_stream(), backward_done_event()).
// Ownership: owns every device buffer, the three streams, the event and the cuBLAS context. Not
// copyable. Thread safety: none; one host thread drives it (other threads may only use the
// streams/pointers handed out, with their own synchronisation). Only built with the CUDA backend.
#pragma once
#if defined(TF_WITH_CUDA)
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cublas_handle.h"
#include "kernels/cudnn_attention.h"
#include "kernels/cuda_profiler.h"
#include "kernels/cuda_runtime.h"
#include "kernels/optimizer.h"
#include "model/config.h"
#include "model/parameters.h"

namespace tf {

struct GPT2CudaOptions {
  enum class Attention {
    kFlash,      // kernels/flash_attention.h: tensor cores for bf16 with head size 64/128, else SIMT
    kFlashSimt,  // the flash kernels' SIMT implementation only (reference / fallback)
    kGemm,       // kernels/attention.h: cuBLAS GEMMs, (L,B,NH,T,T) probabilities stored
    kCudnn,      // kernels/cudnn_attention.h: cuDNN's fused flash attention (bf16 only; needs
                 // libcudnn.so.9 >= 9.10.2 at run time); stores the same lse as kFlash
  };
  Attention attention = Attention::kFlash;
  // 0: store every activation; 1: recompute GELU(fch) in backward; 2: also ln1 and ln2.
  int recompute = 0;
  // GELU fused into the MLP's cuBLASLt GEMMs: 0 none (a separate kernel computes exactly math::gelu
  // and math::gelu_grad); 1 forward (GELU_AUX_BIAS epilogue: the fc GEMM writes the pre-activation
  // and its GELU); 2 forward and backward (also the DGELU epilogue: the fcproj dinp GEMM writes the
  // gradient of the pre-activation). Fused, the GELU is cuBLASLt's own (kernels/matmul.cu). -1: the
  // default, 0 until GPU measurements show a fusion pays (llm.c keeps it off: its PR #338 found
  // cuBLASLt's bf16 GELU epilogue slower than a separate kernel); fp32 always resolves to 0 (the
  // fp32 mode checks the GPU against the CPU formulas).
  int gelu_fusion = -1;
  // The residual adds folded into the attention-projection and fcproj GEMMs (cuBLASLt's C matrix
  // with beta = 1) instead of separate accumulate kernels.
  bool fuse_residual = true;
  // kCudnn only: a deterministic attention backward (dQ without fp32 atomics, at the cost of a dS
  // workspace and one more GEMM; kernels/cudnn_attention.h). Our own kernels are always deterministic.
  bool deterministic_attention = true;

  // gelu_fusion with -1 resolved for `dtype`.
  int GeluFusion(cuda::DType dtype) const {
    return gelu_fusion >= 0 ? gelu_fusion : 0;
  }
};

// The attention implementations by their config names: "flash", "flash_simt", "gemm".
StatusOr<GPT2CudaOptions::Attention> ParseAttention(const std::string& name);
const char* AttentionName(GPT2CudaOptions::Attention attention);

// Device bytes of a GPT2Cuda plan, by purpose. `buffers` is what Create() allocates itself
// (== device_bytes()); `total` adds the cuBLAS workspace. Neither counts the CUDA context (~0.5 GB
// per process on a Hopper, driver-dependent) or allocator fragmentation.
struct GPT2CudaMemory {
  size_t params = 0;       // parameters in the storage dtype
  size_t grads = 0;        // gradients in the storage dtype
  size_t master = 0;       // fp32 master weights (0 in fp32 mode: the parameters are the master)
  size_t moments = 0;      // AdamW m and v, fp32
  size_t activations = 0;  // forward activations kept for backward (storage dtype), incl. logits
  size_t backward = 0;     // per-layer backward buffers reused by every layer (dresidual, dln, datty, dqkv, dfch)
  size_t stats = 0;        // fp32: LayerNorm mean/rstd, attention log-sum-exp, losses
  size_t scratch = 0;      // the kernels' shared scratch area
  size_t other = 0;        // token ids, the norm and loss results, AdamW's decay-run table
  size_t buffers = 0;      // sum of the above
  size_t cublas_workspace = 0;
  size_t total = 0;  // buffers + cublas_workspace
};

class GPT2Cuda {
 public:
  using Options = GPT2CudaOptions;

  // REQUIRES: 0 < max_batch, 0 < max_seq <= config.block_size; with flash attention the head size
  // is at most 128 (InvalidArgument otherwise). Allocates everything up front (no allocation later).
  static StatusOr<std::unique_ptr<GPT2Cuda>> Create(const GPT2Config& config, int max_batch, int max_seq,
                                                    cuda::DType dtype, const Options& options, int device = 0);
  // Default options (flash attention, no recomputation).
  static StatusOr<std::unique_ptr<GPT2Cuda>> Create(const GPT2Config& config, int max_batch, int max_seq,
                                                    cuda::DType dtype, int device = 0);
  // The device bytes Create() would allocate for this plan, computed on the host (no device needed;
  // with a device, the embedding backward's sort scratch is queried exactly, else bounded above).
  static StatusOr<GPT2CudaMemory> EstimateMemory(const GPT2Config& config, int max_batch, int max_seq,
                                                 cuda::DType dtype, const Options& options);
  ~GPT2Cuda();
  GPT2Cuda(const GPT2Cuda&) = delete;
  GPT2Cuda& operator=(const GPT2Cuda&) = delete;

  const GPT2Config& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  cuda::DType dtype() const { return dtype_; }
  const Options& options() const { return options_; }
  // Bytes of the device buffers Create() allocated (== memory().buffers).
  size_t device_bytes() const { return memory_.buffers; }
  const GPT2CudaMemory& memory() const { return memory_; }
  // Bytes of the forward activations kept for backward (memory().activations + the LN/attention stats).
  size_t activation_bytes() const { return memory_.activations + memory_.stats; }

  // Host fp32 parameters (ParameterLayout order) -> device master weights and the dtype copy.
  Status LoadParams(std::span<const float> host);
  // Device master weights -> host fp32.
  Status StoreParams(std::span<float> host) const;
  // Device gradients -> host fp32 (converted from the storage dtype).
  Status StoreGrads(std::span<float> host) const;

  Status ZeroGrad();
  // Mean loss of the micro-batch (inputs/targets on the host, B*T each); no gradients.
  StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Forward + loss + backward; accumulates the gradient of (mean loss * grad_scale). Records
  // backward_done_event() on the compute stream after the last gradient kernel. (Returns after the
  // compute stream has synchronised: the loss is read back.)
  StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale);
  // As ForwardBackward, but the micro-batch's mean loss is added to a device accumulator instead
  // of being read back: no host synchronisation, so the next micro-batch is enqueued while this
  // one runs. TakeLossSum() returns the accumulated sum and resets it (synchronises).
  Status ForwardBackwardAccumulate(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale);
  StatusOr<double> TakeLossSum();
  // Global-norm clip + AdamW (decay mask from the layout) at `lr`, step t (1-based). Returns the norm.
  StatusOr<float> Step(const AdamWConfig& config, double lr, int64_t t);
  // Step in two halves: the gradients' global norm (synchronises to read it back), then the
  // update clipped by it. REQUIRES (ApplyUpdate): GradNorm() since the gradients last changed.
  StatusOr<float> GradNorm();
  Status ApplyUpdate(const AdamWConfig& config, double lr, int64_t t);

  // ---- Device state for the data-parallel reducer and the checkpointer -----------------------------
  // Flat buffers in ParameterLayout order, num_params() elements each, valid for the model's
  // lifetime: parameters and gradients in dtype(), master weights in fp32 (the same memory as
  // params_device() in fp32 mode). Written only by compute-stream work (ZeroGrad, ForwardBackward
  // accumulate into the gradients, Step updates master/params); another stream reading or writing
  // them must order itself against the compute stream (events). Step() reads the gradients as they
  // are when its kernels run on the compute stream (after a reduction, make the compute stream wait
  // for it first).
  int64_t num_params() const { return layout_.total(); }
  void* params_device() const { return params_.data(); }
  void* grads_device() const { return grads_.data(); }
  float* master_device() const { return dtype_ == cuda::DType::kF32 ? params_.as<float>() : master_.as<float>(); }
  // AdamW moments (fp32, ParameterLayout order), for checkpoints.
  float* adam_m_device() const { return m_.as<float>(); }
  float* adam_v_device() const { return v_.as<float>(); }

  // Called on the host during ForwardBackward each time the kernels that finish a flat gradient
  // range [begin, end) have been *enqueued* on compute_stream() (the same ranges and order as the
  // CPU model: model/parameters.h GradReadyRanges). For the data-parallel reducer, which records
  // an event on the compute stream at that point and reduces the range on comm_stream().
  using GradReadyHook = std::function<void(int64_t begin, int64_t end)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

  // Optional: time every piece of compute-stream work by name ("qkv fwd", "attention bwd", "adamw",
  // ...) with `profiler` (created on compute_stream(); nullptr turns it off). The caller collects.
  void set_profiler(cuda::RangeProfiler* profiler) { profiler_ = profiler; }

  cudaStream_t compute_stream() const { return stream_; }
  cudaStream_t comm_stream() const { return comm_stream_; }
  cudaStream_t copy_stream() const { return copy_stream_; }
  // Recorded on compute_stream() when each ForwardBackward's backward has issued its last gradient
  // kernel (timing disabled).
  cudaEvent_t backward_done_event() const { return backward_done_; }

 private:
  Status EnqueueSumSquares();  // the gradients' sum of squares into norm_ (compute stream)
  StatusOr<float> ReadNorm();   // sqrt of norm_, read back (synchronises)
  // Offsets (elements of dtype_) into the activation arena, (floats) into the stats buffer, and sizes.
  struct Plan {
    struct Acts {
      int64_t encoded, ln1, qkv, atty, att, residual2, ln2, fch, fch_gelu, residual3, lnf, logits, dresidual, dln,
          datty, dqkv, dfch;
      int64_t forward_end;  // elements [0, forward_end) are forward activations, the rest backward buffers
      int64_t total;
    } a;
    struct Stats {
      int64_t ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lnf_mean, lnf_rstd, lse, losses, total;
    } s;
    // Per-layer strides (elements): 0 for activations kept for one layer only (recomputed ones).
    int64_t ln_stride, fch_gelu_stride;
    size_t scratch_bytes;
    GPT2CudaMemory memory;
  };
  // Plans every buffer; encoder_scratch: bytes of the embedding backward's scratch; attention_scratch:
  // cuDNN attention's workspace (0 for the other implementations).
  static Plan MakePlan(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype, const Options& options,
                       size_t encoder_scratch, size_t attention_scratch);
  static Status ValidateOptions(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype,
                                const Options& options);
  // cuDNN attention's workspace for a plan without a device (an upper estimate; Create() asks cuDNN).
  static size_t EstimateCudnnWorkspace(const GPT2Config& config, int max_batch, int max_seq);
  // Floats between two layers' (B,NH,T) log-sum-exp rows: rounded up to 64, so that every layer's
  // starts 256-byte aligned (cuDNN declares its stats tensor 16-byte aligned; B*NH*T need not be a
  // multiple of 4, e.g. 25 heads, B = 1, odd T).
  static int64_t LseStride(int64_t B, int64_t NH, int64_t T) { return (B * NH * T + 63) / 64 * 64; }
  // cuDNN attention for this batch shape: only at the planned (max) shape, whose plans Create() built.
  // Other shapes (sampling grows T one token at a time; a short last batch) take our flash kernels —
  // the same contract and lse — instead of building (and NVRTC-compiling) a cuDNN plan per shape.
  bool UseCudnn(int B, int T) const { return cudnn_ != nullptr && B == max_batch_ && T == max_seq_; }

  GPT2Cuda(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype, const Options& options);
  Status Allocate();
  Status RunForward(int B, int T);
  // Tokens to the device, forward, fused loss + dlogits, backward; optionally adds the mean loss
  // to the device accumulator.
  Status TrainingPass(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale,
                      bool accumulate_loss);
  Status RunBackward(int B, int T);
  Status AttentionForward(int l, int B, int T);
  Status AttentionBackward(int l, int B, int T);
  StatusOr<float> MeanLoss(int N);
  // Pointer to element `offset` of a buffer holding dtype_ elements.
  void* At(const cuda::DeviceBuffer& b, int64_t offset) const {
    return static_cast<char*>(b.data()) + offset * static_cast<int64_t>(cuda::DTypeSize(dtype_));
  }

  GPT2Config config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_;
  cuda::DType dtype_;
  Options options_;
  cudaStream_t stream_ = nullptr, comm_stream_ = nullptr, copy_stream_ = nullptr;
  GradReadyHook grad_ready_;
  cuda::RangeProfiler* profiler_ = nullptr;
  void Mark(const char* name) {
    if (profiler_ != nullptr) profiler_->Begin(name);
  }
  void EndMark() {
    if (profiler_ != nullptr) profiler_->End();
  }
  cudaEvent_t backward_done_ = nullptr;
  std::unique_ptr<cuda::CublasContext> blas_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;  // with Attention::kCudnn
  GPT2CudaMemory memory_;

  // State: params/grads in dtype_, master/m/v in fp32 (master aliases params in fp32 mode).
  cuda::DeviceBuffer params_, grads_, master_, m_, v_;
  // Activations (dtype_) at plan_.a offsets; stats_ (fp32) at plan_.s offsets.
  cuda::DeviceBuffer acts_, stats_, tokens_ /*int32 inputs, targets*/;
  cuda::DeviceBuffer scratch_;  // shared by the kernels' scratch needs (used one at a time)
  cuda::DeviceBuffer norm_;     // [0] the gradients' sum of squares, [1] the accumulated loss (doubles)
  cuda::DeviceBuffer ranges_;   // AdamW's decay runs: int64 ends, then one byte per run (decay flag)
  int num_ranges_ = 0;
  Plan plan_{};
  std::vector<float> host_losses_;
};

}  // namespace tf
#endif  // TF_WITH_CUDA
