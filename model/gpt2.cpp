#include "model/gpt2.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "base/log.h"
#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/random.h"

namespace tf {
namespace {

void Zero(float* p, int64_t n) { std::memset(p, 0, static_cast<size_t>(n) * sizeof(float)); }

// The model's own flat buffers as units: pointers into them; GradsDone announces the unit's flat
// range to the grad-ready hook (so the hook sees GradReadyRanges, in order).
class FlatStorage final : public UnitStorage {
 public:
  FlatStorage(const ParameterLayout& layout, float* params, float* grads, const GPT2::GradReadyHook& hook)
      : layout_(layout), params_(params), grads_(grads), hook_(hook) {}
  float* AcquireParams(int unit) override { return params_ + UnitRange(layout_, unit).first; }
  void ReleaseParams(int) override {}
  float* AcquireGrads(int unit) override { return grads_ + UnitRange(layout_, unit).first; }
  void GradsDone(int unit) override {
    if (!hook_) return;
    const auto [begin, end] = UnitRange(layout_, unit);
    hook_(begin, end);
  }

 private:
  const ParameterLayout& layout_;
  float* params_;
  float* grads_;
  const GPT2::GradReadyHook& hook_;
};

float MissingStorage() {
  spdlog::error("GPT2: a pass on a model created with external storage and no unit storage set "
                "(call set_unit_storage first); nothing computed, loss NaN");
  return std::numeric_limits<float>::quiet_NaN();
}

}  // namespace

StatusOr<std::unique_ptr<GPT2>> GPT2::Create(const GPT2Config& config, int max_batch, int max_seq,
                                             bool external_storage) {
  TF_RETURN_IF_ERROR(ValidateConfig(config));
  if (max_batch <= 0 || max_seq <= 0) {
    return Status::InvalidArgument("batch ({}) and sequence length ({}) must be positive", max_batch, max_seq);
  }
  if (max_seq > config.block_size) {
    return Status::InvalidArgument("sequence length {} exceeds the model's block_size {}", max_seq,
                                   config.block_size);
  }
  if (int64_t{max_batch} * max_seq > (int64_t{1} << 24)) {
    return Status::InvalidArgument("batch x sequence = {} tokens per micro-batch is too large",
                                   int64_t{max_batch} * max_seq);
  }
  try {
    return std::unique_ptr<GPT2>(new GPT2(config, max_batch, max_seq, external_storage));
  } catch (const std::bad_alloc&) {
    const double params_gib = external_storage ? 0.0 : 2.0 * ParameterLayout(config).total() * 4 / double(1 << 30);
    return Status::InvalidArgument(
        "out of memory allocating the model for batch {} x sequence {} ({:.2f} GiB of parameters and gradients "
        "plus {:.2f} GiB of activations); reduce batch_size or seq_len",
        max_batch, max_seq, params_gib, ActivationBytes(config, max_batch, max_seq) / double(1 << 30));
  }
}

int64_t GPT2::ActivationBytes(const GPT2Config& config, int max_batch, int max_seq) {
  return PlanActivations(config, max_batch, max_seq, nullptr, nullptr) * 4;
}

int64_t GPT2::PlanActivations(const GPT2Config& config, int max_batch, int max_seq, GPT2* model, float* arena) {
  const int64_t L = config.n_layer, C = config.n_embd, NH = config.n_head, Vp = config.padded_vocab_size;
  const int64_t B = max_batch, T = max_seq, N = B * T;
  // Each activation is rounded up to 16 floats so every one starts 64-byte aligned.
  struct Slot {
    float* GPT2::*member;
    int64_t n;
  };
  const Slot slots[] = {
      {&GPT2::encoded_, N * C},       {&GPT2::ln1_, L * N * C},          {&GPT2::ln1_mean_, L * N},
      {&GPT2::ln1_rstd_, L * N},      {&GPT2::qkv_, L * N * 3 * C},      {&GPT2::atty_, L * N * C},
      {&GPT2::att_, L * B * NH * T * T}, {&GPT2::residual2_, L * N * C}, {&GPT2::ln2_, L * N * C},
      {&GPT2::ln2_mean_, L * N},      {&GPT2::ln2_rstd_, L * N},         {&GPT2::fch_, L * N * 4 * C},
      {&GPT2::fch_gelu_, L * N * 4 * C}, {&GPT2::residual3_, L * N * C}, {&GPT2::lnf_, N * C},
      {&GPT2::lnf_mean_, N},          {&GPT2::lnf_rstd_, N},             {&GPT2::logits_, N * Vp},
      {&GPT2::losses_, N},            {&GPT2::dresidual_, N * C},        {&GPT2::dln_, N * C},
      {&GPT2::datty_, N * C},         {&GPT2::dqkv_, N * 3 * C},         {&GPT2::dfch_, N * 4 * C},
      {&GPT2::att_scratch_, cpu::attention_scratch_floats(static_cast<int>(T))},
  };
  int64_t total = 0;
  for (const Slot& s : slots) {
    if (model != nullptr) model->*s.member = arena + total;
    total += (s.n + 15) / 16 * 16;
  }
  return total;
}

GPT2::GPT2(const GPT2Config& config, int max_batch, int max_seq, bool external_storage)
    : config_(config), layout_(config), max_batch_(max_batch), max_seq_(max_seq),
      external_storage_(external_storage) {
  if (!external_storage) {
    params_ = AlignedBuffer(layout_.total());
    grads_ = AlignedBuffer(layout_.total());
    own_storage_ = std::make_unique<FlatStorage>(layout_, params_.data(), grads_.data(), grad_ready_);
  }
  acts_ = AlignedBuffer(PlanActivations(config, max_batch, max_seq, nullptr, nullptr));
  PlanActivations(config, max_batch, max_seq, this, acts_.data());
  att_scratch_floats_ = cpu::attention_scratch_floats(max_seq);
}

void GPT2::InitWeights(uint64_t seed) {
  if (!external_storage_) InitGPT2Weights(config_, seed, params_.span());
}

void InitGPT2Weights(const GPT2Config& config_, uint64_t seed, std::span<float> params, bool parallel, int64_t first) {
  const ParameterLayout layout_(config_);
  Rng rng(seed);
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  const int64_t last = first + static_cast<int64_t>(params.size());
  std::fill(params.begin(), params.end(), 0.0f);
  for (const ParamTensor& t : layout_.tensors()) {
    // Elements [lo, hi) of the tensor are in `params`: element i at at(i).
    const int64_t lo = std::clamp(first - t.offset, int64_t{0}, t.numel);
    const int64_t hi = std::clamp(last - t.offset, int64_t{0}, t.numel);
    float* base = params.data();
    auto at = [base, off = t.offset - first](int64_t i) -> float& { return base[off + i]; };
    const bool is_ln_weight = t.name.ends_with("ln_1.weight") || t.name.ends_with("ln_2.weight") ||
                              t.name.ends_with("ln_f.weight");
    if (is_ln_weight) {
      for (int64_t i = lo; i < hi; ++i) at(i) = 1.0f;
    } else if (t.shape.size() >= 2) {
      float std = 0.02f;
      if (t.name.ends_with("c_proj.weight")) std *= residual_scale;
      int64_t n = t.numel;
      if (t.name == "transformer.wte.weight") n = int64_t{config_.vocab_size} * config_.n_embd;  // padded rows stay 0
      if (!parallel) {
        // The one sequential stream: every draw is taken, those outside [first, last) dropped.
        for (int64_t i = 0; i < n; ++i) {
          const auto v = static_cast<float>(rng.Normal() * std);
          if (i >= lo && i < hi) at(i) = v;
        }
      } else {
        constexpr int64_t kChunk = int64_t{1} << 20;
        const int64_t chunks = (n + kChunk - 1) / kChunk;
        const uint64_t tensor_seed = rng.NextU64();
#pragma omp parallel for schedule(dynamic)
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t begin = c * kChunk, end = std::min(n, (c + 1) * kChunk);
          if (end <= lo || begin >= hi) continue;  // independent streams: chunks outside are skipped
          Rng chunk_rng(tensor_seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c + 1)));
          for (int64_t i = begin; i < end; ++i) {
            const auto v = static_cast<float>(chunk_rng.Normal() * std);
            if (i >= lo && i < hi) at(i) = v;
          }
        }
      }
    }
    // Biases stay zero.
  }
}

float GPT2::Forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  UnitStorage* s = storage();
  if (s == nullptr) return MissingStorage();
  ForwardUnits(*s, inputs, B, T);
  if (targets == nullptr) return 0.0f;
  const int N = B * T;
  // Loss only (dloss = 0 keeps the logits intact).
  cpu::crossentropy_forward_backward(logits_, losses_, targets, N, config_.vocab_size, config_.padded_vocab_size,
                                     0.0f);
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += losses_[i];
  return static_cast<float>(sum / N);
}

void GPT2::ForwardUnits(UnitStorage& s, const int32_t* inputs, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, Vp = config_.padded_vocab_size, L = config_.n_layer;
  const int N = B * T;
  const int64_t NC = int64_t{N} * C;
  const EmbeddingView emb = MakeEmbeddingView(layout_, s.AcquireParams(0));
  s.Prefetch(1);
  cpu::encoder_forward(encoded_, inputs, emb.wte, emb.wpe, B, T, C);
  const float* residual = encoded_;
  for (int l = 0; l < L; ++l) {
    const BlockView w = MakeBlockView(layout_, l, s.AcquireParams(1 + l));
    s.Prefetch(2 + l);
    float* ln1 = ln1_ + l * NC;
    float* qkv = qkv_ + l * NC * 3;
    float* atty = atty_ + l * NC;
    float* att = att_ + int64_t{l} * B * NH * T * T;
    float* residual2 = residual2_ + l * NC;
    float* ln2 = ln2_ + l * NC;
    float* fch = fch_ + l * NC * 4;
    float* fch_gelu = fch_gelu_ + l * NC * 4;
    float* residual3 = residual3_ + l * NC;
    cpu::layernorm_forward(ln1, ln1_mean_ + int64_t{l} * N, ln1_rstd_ + int64_t{l} * N, residual, w.ln1_w, w.ln1_b,
                           N, C);
    cpu::matmul_forward(qkv, ln1, w.qkv_w, w.qkv_b, N, C, 3 * C);
    cpu::attention_forward(atty, att, qkv, B, T, C, NH);
    cpu::matmul_forward(residual2, atty, w.attproj_w, w.attproj_b, N, C, C);
    cpu::accumulate(residual2, residual, NC);
    cpu::layernorm_forward(ln2, ln2_mean_ + int64_t{l} * N, ln2_rstd_ + int64_t{l} * N, residual2, w.ln2_w,
                           w.ln2_b, N, C);
    cpu::matmul_forward(fch, ln2, w.fc_w, w.fc_b, N, C, 4 * C);
    cpu::gelu_forward(fch_gelu, fch, NC * 4);
    cpu::matmul_forward(residual3, fch_gelu, w.fcproj_w, w.fcproj_b, N, 4 * C, C);
    cpu::accumulate(residual3, residual2, NC);
    residual = residual3;
    s.ReleaseParams(1 + l);
  }
  const FinalNormView lnf = MakeFinalNormView(layout_, s.AcquireParams(L + 1));
  cpu::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual, lnf.lnf_w, lnf.lnf_b, N, C);
  cpu::matmul_forward(logits_, lnf_, emb.wte, nullptr, N, C, Vp);
  s.ReleaseParams(L + 1);
  s.ReleaseParams(0);
}

float GPT2::ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale) {
  UnitStorage* s = storage();
  if (s == nullptr) return MissingStorage();
  ForwardUnits(*s, inputs, B, T);
  const int N = B * T;
  // Fused: losses, then the logits buffer becomes d(mean loss * grad_scale)/dlogits.
  cpu::crossentropy_forward_backward(logits_, losses_, targets, N, config_.vocab_size, config_.padded_vocab_size,
                                     grad_scale / static_cast<float>(N));
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += losses_[i];
  Backward(*s, inputs, B, T);
  return static_cast<float>(sum / N);
}

void GPT2::Backward(UnitStorage& s, const int32_t* inputs, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, Vp = config_.padded_vocab_size, L = config_.n_layer;
  const int N = B * T;
  const int64_t NC = int64_t{N} * C;
  const EmbeddingView emb = MakeEmbeddingView(layout_, s.AcquireParams(0));
  const FinalNormView lnf = MakeFinalNormView(layout_, s.AcquireParams(L + 1));
  s.Prefetch(L);
  const EmbeddingView demb = MakeEmbeddingView(layout_, s.AcquireGrads(0));
  const FinalNormView dlnf = MakeFinalNormView(layout_, s.AcquireGrads(L + 1));

  // LM head (tied to wte): dlnf = dlogits @ wte; dwte += dlogits^T @ lnf.
  Zero(dln_, NC);
  cpu::matmul_backward(dln_, demb.wte, nullptr, logits_, lnf_, emb.wte, N, C, Vp);
  Zero(dresidual_, NC);
  const float* last_residual = L > 0 ? residual3_ + (L - 1) * NC : encoded_;
  cpu::layernorm_backward(dresidual_, dlnf.lnf_w, dlnf.lnf_b, dln_, last_residual, lnf.lnf_w, lnf_mean_, lnf_rstd_,
                          N, C);
  s.GradsDone(L + 1);
  s.ReleaseParams(L + 1);

  for (int l = L - 1; l >= 0; --l) {
    const BlockView w = MakeBlockView(layout_, l, s.AcquireParams(1 + l));
    if (l > 0) s.Prefetch(l);
    const BlockView g = MakeBlockView(layout_, l, s.AcquireGrads(1 + l));
    const float* residual = l == 0 ? encoded_ : residual3_ + (l - 1) * NC;
    const float* ln1 = ln1_ + l * NC;
    const float* qkv = qkv_ + l * NC * 3;
    const float* atty = atty_ + l * NC;
    const float* att = att_ + int64_t{l} * B * NH * T * T;
    const float* residual2 = residual2_ + l * NC;
    const float* ln2 = ln2_ + l * NC;
    const float* fch = fch_ + l * NC * 4;
    const float* fch_gelu = fch_gelu_ + l * NC * 4;

    // dresidual holds d(residual3). MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    Zero(dfch_, NC * 4);
    cpu::matmul_backward(dfch_, g.fcproj_w, g.fcproj_b, dresidual_, fch_gelu, w.fcproj_w, N, 4 * C, C);
    cpu::gelu_backward(dfch_, fch, dfch_, NC * 4);
    Zero(dln_, NC);
    cpu::matmul_backward(dln_, g.fc_w, g.fc_b, dfch_, ln2, w.fc_w, N, C, 4 * C);
    cpu::layernorm_backward(dresidual_, g.ln2_w, g.ln2_b, dln_, residual2, w.ln2_w, ln2_mean_ + int64_t{l} * N,
                            ln2_rstd_ + int64_t{l} * N, N, C);
    // dresidual now holds d(residual2). Attention: residual2 = residual + attproj(attn(qkv(ln1(residual)))).
    Zero(datty_, NC);
    cpu::matmul_backward(datty_, g.attproj_w, g.attproj_b, dresidual_, atty, w.attproj_w, N, C, C);
    cpu::attention_backward(dqkv_, datty_, qkv, att, B, T, C, NH, att_scratch_, att_scratch_floats_);
    Zero(dln_, NC);
    cpu::matmul_backward(dln_, g.qkv_w, g.qkv_b, dqkv_, ln1, w.qkv_w, N, C, 3 * C);
    cpu::layernorm_backward(dresidual_, g.ln1_w, g.ln1_b, dln_, residual, w.ln1_w, ln1_mean_ + int64_t{l} * N,
                            ln1_rstd_ + int64_t{l} * N, N, C);
    s.GradsDone(1 + l);
    s.ReleaseParams(1 + l);
  }
  cpu::encoder_backward(demb.wte, demb.wpe, dresidual_, inputs, B, T, C);
  s.GradsDone(0);
  s.ReleaseParams(0);
}

}  // namespace tf
