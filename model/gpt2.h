// GPT2: the model's parameters, gradients and activations (CPU backend), and its forward and
// backward passes — architecture identical to Hugging Face GPT2LMHeadModel (see docs/model.md).
//
// Ownership: a GPT2 owns flat parameter and gradient buffers (layout: model/parameters.h) and an
// activation arena planned once for at most (max_batch, max_seq) tokens; no step allocates.
// Created with external storage, it owns only the activations and reaches parameters and gradients
// unit by unit through a UnitStorage (sharded training). AdamW state lives with the optimizer
// (engine/), mirroring the same layout.
// Thread safety: none; one thread drives a GPT2 (kernels parallelise internally with OpenMP).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "base/aligned_buffer.h"
#include "model/config.h"
#include "model/parameters.h"

namespace tf {

// GPT-2 initialisation into a flat buffer laid out by ParameterLayout(config) (see InitWeights).
// REQUIRES: first + params.size() <= ParameterLayout(config).total().
// `parallel`: the same distributions, but each tensor's normals come in chunks of 2^20 from
// independent streams (seeded by seed, tensor and chunk) filled on all OpenMP threads — other values
// than the sequential stream (which training uses), for benchmarks of large models (GPT-2 1558M:
// ~1.5e9 sequential normals take ~half a minute).
// `first` > 0 or a shorter `params`: only elements [first, first + params.size()) of that buffer
// (a ZeRO shard), the same values (the sequential stream is drawn whole, the rest dropped).
void InitGPT2Weights(const GPT2Config& config, uint64_t seed, std::span<float> params, bool parallel = false,
                     int64_t first = 0);

// Where the parameters and gradients of each unit (model/parameters.h UnitRange) live during a
// pass, for sharded training. The model calls it on its own thread, in this order (L = n_layer;
// every Acquire is paired with one Release / GradsDone of the same unit):
//   Forward:  AcquireParams(0), Prefetch(1); encoder;
//             for l = 0 .. L-1: AcquireParams(1+l), Prefetch(2+l); block l; ReleaseParams(1+l);
//             AcquireParams(L+1); ln_f; LM head (tied to wte, unit 0); ReleaseParams(L+1), ReleaseParams(0).
//   ForwardBackward: the forward above, then
//             AcquireParams(0), AcquireParams(L+1), Prefetch(L), AcquireGrads(0), AcquireGrads(L+1);
//             LM head backward (dwte into unit 0), ln_f backward; GradsDone(L+1), ReleaseParams(L+1);
//             for l = L-1 .. 0: AcquireParams(1+l), Prefetch(l) when l > 0, AcquireGrads(1+l);
//                               block l backward; GradsDone(1+l), ReleaseParams(1+l);
//             encoder backward (into unit 0); GradsDone(0), ReleaseParams(0).
// At most two units' parameters are held at once (unit 0 and one other), plus what a storage
// prefetches; unit 0's gradient is held for the whole backward (the LM head and the encoder both
// write it).
class UnitStorage {
 public:
  virtual ~UnitStorage() = default;
  // The unit's parameters (UnitRange size floats, laid out as its slice of the flat buffer), valid
  // until ReleaseParams(unit).
  virtual float* AcquireParams(int unit) = 0;
  virtual void ReleaseParams(int unit) = 0;
  // A hint: the model will acquire `unit` next (a storage may start gathering it now). Default: nothing.
  virtual void Prefetch(int unit) {}
  // Gradient storage of the unit for this backward: the model adds (+=) the micro-batch's gradient
  // into it (the storage zeroes it when it wants a fresh one); valid until GradsDone(unit).
  virtual float* AcquireGrads(int unit) = 0;
  // The unit's gradient for this micro-batch is final; the model no longer touches that storage.
  virtual void GradsDone(int unit) = 0;
};

class GPT2 {
 public:
  // Plans activations for up to max_batch x max_seq tokens. REQUIRES: ValidateConfig(config) ok.
  // external_storage: allocate no parameter or gradient buffer (params() and grads() are empty,
  // ZeroGrad and InitWeights do nothing); the passes need set_unit_storage first.
  static StatusOr<std::unique_ptr<GPT2>> Create(const GPT2Config& config, int max_batch, int max_seq,
                                                bool external_storage = false);
  // The activation arena's size in bytes for Create(config, max_batch, max_seq), without building
  // a model (memory planning); equals that model's activation_bytes().
  static int64_t ActivationBytes(const GPT2Config& config, int max_batch, int max_seq);
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;

  const GPT2Config& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  int max_batch() const { return max_batch_; }
  int max_seq() const { return max_seq_; }
  std::span<float> params() { return params_.span(); }
  std::span<const float> params() const { return params_.span(); }
  std::span<float> grads() { return grads_.span(); }
  std::span<const float> grads() const { return grads_.span(); }
  // Bytes of the activation arena (for logs and memory planning).
  int64_t activation_bytes() const { return acts_.size() * 4; }
  bool external_storage() const { return external_storage_; }

  // Where Forward and ForwardBackward find parameters and put gradients; not owned, must outlive
  // the passes that use it. nullptr: the model's own buffers (with external storage: none, and
  // the passes return NaN without computing anything — a programming error, logged). While a
  // storage is set, it is the only one the passes use (params()/grads() are not read or written),
  // and the grad-ready hook is not called (GradsDone is the announcement).
  void set_unit_storage(UnitStorage* storage) { unit_storage_ = storage; }

  // GPT-2 initialisation, deterministic for `seed`: normal(0, 0.02) for every matrix and
  // embedding, residual projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 n_layer),
  // zero biases, unit LayerNorm weights, zero padded vocabulary rows. Does nothing with external
  // storage (initialise a flat buffer with InitGPT2Weights and hand its slices to the storage).
  void InitWeights(uint64_t seed);

  // Forward pass. inputs (B,T) token ids < vocab_size (REQUIRES: checked by the data path),
  // B <= max_batch, T <= min(max_seq, block_size). With targets (B,T) returns the mean
  // cross-entropy; without, returns 0. logits() is valid afterwards. Unit calls: see UnitStorage.
  float Forward(const int32_t* inputs, const int32_t* targets, int B, int T);

  // Forward, loss and backward in one pass; gradients are accumulated (+=) into grads() (or the
  // unit storage's AcquireGrads), the gradient of (mean loss * grad_scale). grad_scale =
  // 1/accum_steps averages micro-batches. Returns the mean loss of this micro-batch. Call
  // ZeroGrad() before the first micro-batch.
  float ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale);
  void ZeroGrad() { grads_.Zero(); }

  // (B,T,Vp) logits of the last Forward (only the first vocab_size columns are meaningful).
  // Not valid after ForwardBackward (the fused loss overwrites them with their gradient).
  const float* logits() const { return logits_; }

  // Called during ForwardBackward each time a flat range [begin, end) of grads() becomes final
  // for this micro-batch: ln_f, then blocks last to first, then wte+wpe. For the data-parallel
  // reducer (overlap communication with the rest of backward). Not called while a unit storage is set.
  using GradReadyHook = std::function<void(int64_t begin, int64_t end)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

 private:
  GPT2(const GPT2Config& config, int max_batch, int max_seq, bool external_storage);
  // Points each activation member into `arena` (when non-null) and returns the arena's floats.
  static int64_t PlanActivations(const GPT2Config& config, int max_batch, int max_seq, GPT2* model, float* arena);
  // The storage the passes use now; nullptr when there is none (external storage not set).
  UnitStorage* storage() const { return unit_storage_ != nullptr ? unit_storage_ : own_storage_.get(); }
  void ForwardUnits(UnitStorage& s, const int32_t* inputs, int B, int T);
  void Backward(UnitStorage& s, const int32_t* inputs, int B, int T);

  GPT2Config config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_;
  bool external_storage_;
  AlignedBuffer params_, grads_, acts_;
  std::unique_ptr<UnitStorage> own_storage_;  // params_/grads_ as units; nullptr with external storage
  UnitStorage* unit_storage_ = nullptr;
  GradReadyHook grad_ready_;

  // Activations (pointers into acts_), per llm.c's plan; L = n_layer, N = B*T.
  float* encoded_;                       // (N, C)
  float *ln1_, *ln1_mean_, *ln1_rstd_;   // (L, N, C), (L, N), (L, N)
  float* qkv_;                           // (L, N, 3C)
  float* atty_;                          // (L, N, C)
  float* att_;                           // (L, B, NH, T, T)
  float* residual2_;                     // (L, N, C)
  float *ln2_, *ln2_mean_, *ln2_rstd_;   // (L, N, C), (L, N), (L, N)
  float* fch_;                           // (L, N, 4C)
  float* fch_gelu_;                      // (L, N, 4C)
  float* residual3_;                     // (L, N, C)
  float *lnf_, *lnf_mean_, *lnf_rstd_;   // (N, C), (N), (N)
  float* logits_;                        // (N, Vp)
  float* losses_;                        // (N)
  // Backward scratch.
  float* dresidual_;  // (N, C)
  float* dln_;        // (N, C)
  float* datty_;      // (N, C)
  float* dqkv_;       // (N, 3C)
  float* dfch_;       // (N, 4C)
  float* att_scratch_;
  long att_scratch_floats_ = 0;
};

}  // namespace tf
