// GPT2: the model's parameters, gradients and activations (CPU backend), and its forward and
// backward passes — architecture identical to Hugging Face GPT2LMHeadModel (see docs/model.md).
//
// Ownership: a GPT2 owns flat parameter and gradient buffers (layout: model/parameters.h) and an
// activation arena planned once for at most (max_batch, max_seq) tokens; no step allocates.
// AdamW state lives with the optimizer (engine/), mirroring the same layout.
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
// REQUIRES: params.size() == ParameterLayout(config).total().
// `parallel`: the same distributions, but each tensor's normals come in chunks of 2^20 from
// independent streams (seeded by seed, tensor and chunk) filled on all OpenMP threads — other values
// than the sequential stream (which training uses), for benchmarks of large models (GPT-2 1558M:
// ~1.5e9 sequential normals take ~half a minute).
void InitGPT2Weights(const GPT2Config& config, uint64_t seed, std::span<float> params, bool parallel = false);

class GPT2 {
 public:
  // Plans activations for up to max_batch x max_seq tokens. REQUIRES: ValidateConfig(config) ok.
  static StatusOr<std::unique_ptr<GPT2>> Create(const GPT2Config& config, int max_batch, int max_seq);
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

  // GPT-2 initialisation, deterministic for `seed`: normal(0, 0.02) for every matrix and
  // embedding, residual projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 n_layer),
  // zero biases, unit LayerNorm weights, zero padded vocabulary rows.
  void InitWeights(uint64_t seed);

  // Forward pass. inputs (B,T) token ids < vocab_size (REQUIRES: checked by the data path),
  // B <= max_batch, T <= min(max_seq, block_size). With targets (B,T) returns the mean
  // cross-entropy; without, returns 0. logits() is valid afterwards.
  float Forward(const int32_t* inputs, const int32_t* targets, int B, int T);

  // Forward, loss and backward in one pass; gradients are accumulated (+=) into grads(), the
  // gradient of (mean loss * grad_scale). grad_scale = 1/accum_steps averages micro-batches.
  // Returns the mean loss of this micro-batch. Call ZeroGrad() before the first micro-batch.
  float ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale);
  void ZeroGrad() { grads_.Zero(); }

  // (B,T,Vp) logits of the last Forward (only the first vocab_size columns are meaningful).
  // Not valid after ForwardBackward (the fused loss overwrites them with their gradient).
  const float* logits() const { return logits_; }

  // Called during ForwardBackward each time a flat range [begin, end) of grads() becomes final
  // for this micro-batch: ln_f, then blocks last to first, then wte+wpe. For the data-parallel
  // reducer (overlap communication with the rest of backward).
  using GradReadyHook = std::function<void(int64_t begin, int64_t end)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

 private:
  GPT2(const GPT2Config& config, int max_batch, int max_seq);
  // Points each activation member into `arena` (when non-null) and returns the arena's floats.
  static int64_t PlanActivations(const GPT2Config& config, int max_batch, int max_seq, GPT2* model, float* arena);
  void Backward(const int32_t* inputs, int B, int T);

  GPT2Config config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_;
  AlignedBuffer params_, grads_, acts_;
  ModelView p_, g_;
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
