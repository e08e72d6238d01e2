#include "model/step_work.h"

#include <algorithm>

#include "model/parameters.h"

namespace tf {
namespace {

// Accumulates work by piece name, keeping first-seen order.
class Ledger {
 public:
  void Add(const char* name, double flops, double bytes) {
    auto it = std::find_if(pieces_.begin(), pieces_.end(), [&](const PieceWork& p) { return p.name == name; });
    if (it == pieces_.end()) {
      pieces_.push_back({name, flops, bytes});
    } else {
      it->flops += flops;
      it->bytes += bytes;
    }
  }
  std::vector<PieceWork> Take() { return std::move(pieces_); }

 private:
  std::vector<PieceWork> pieces_;
};

}  // namespace

std::vector<PieceWork> GPT2StepWork(const GPT2Config& config, const StepWorkOptions& o) {
  const double s = o.elem_bytes;
  const double B = o.batch, T = o.seq, N = B * T;
  const double C = config.n_embd, NH = config.n_head, hs = config.head_size();
  const double V = config.vocab_size, Vp = config.padded_vocab_size;
  const double P = static_cast<double>(ParameterLayout(config).total());
  const double NC = N * C;
  Ledger w;

  // out (M x Nout) = in (M x K) @ W^T (+ bias) [+ residual C matrix] [+ the GELU aux output].
  auto gemm_fwd = [&](const char* name, double M, double K, double Nout, bool bias, bool residual, bool aux) {
    double bytes = s * (M * K + Nout * K + M * Nout);
    if (bias) bytes += s * Nout;
    if (residual) bytes += s * M * Nout;
    if (aux) bytes += s * M * Nout;
    w.Add(name, 2 * M * K * Nout, bytes);
  };
  // dinp (overwritten) = dout @ W; dW += dout^T @ inp; dbias += column sums of dout (our own kernel).
  auto gemm_bwd = [&](const char* name, double M, double K, double Nout, bool bias, bool dgelu) {
    double bytes = s * (M * Nout + Nout * K + M * K);  // dinp GEMM
    if (dgelu) bytes += s * M * K;                     // reads the pre-activation in its epilogue
    bytes += s * (M * Nout + M * K + 2 * Nout * K);    // dweight GEMM (accumulated)
    if (bias) bytes += s * (M * Nout + 2 * Nout);      // dbias column sums (accumulated)
    w.Add(name, 4 * M * K * Nout, bytes);
  };
  auto layernorm_fwd = [&](const char* name, bool stats) {
    w.Add(name, 0, s * (2 * NC + 2 * C) + (stats ? 8 * N : 0));
  };
  const double partial_bytes = 2.0 * 4.0 * C * ((N + 31) / 32);  // (2, R, C) fp32 partial sums, R = ceil(N / 32)
  auto layernorm_bwd = [&] {
    // dout, inp read; dinp read-modify-write; weight, stats; partials written and read; dweight/dbias.
    w.Add("layernorm bwd", 0, s * (4 * NC + C + 4 * C) + 8 * N + 2 * partial_bytes);
  };
  const double causal = T * (T + 1) / 2;  // scores per head that a causal attention needs
  const double lse_bytes = 4 * B * NH * T;
  auto attention_fwd = [&] {
    if (o.gemm_attention) {
      const double probs = B * NH * T * T * s;
      // Scores written, softmax read + written in place, probabilities read by the value product.
      w.Add("attention fwd", 4 * B * NH * hs * T * T, s * (3 * NC + NC) + 4 * probs);
    } else {
      w.Add("attention fwd", 4 * B * NH * hs * causal, s * (3 * NC + NC) + lse_bytes);
    }
  };
  auto attention_bwd = [&] {
    if (o.gemm_attention) {
      const double probs = B * NH * T * T * s;
      // dP written; P and dP read, dS written by the softmax backward; dS read by the dQ and dK products.
      w.Add("attention bwd", 8 * B * NH * hs * T * T, s * (3 * NC + NC + 3 * NC) + 6 * probs);
    } else {
      // qkv, out (for rowsum(dO * O)), dout, lse read; dqkv written.
      w.Add("attention bwd", 10 * B * NH * hs * causal, s * (3 * NC + NC + NC + 3 * NC) + lse_bytes);
    }
  };

  w.Add("zero grads", 0, s * P);
  w.Add("tokens to device", 0, 0);
  // Forward.
  w.Add("embedding fwd", 0, 4 * N + s * (NC + T * C + NC));
  const bool aux = o.gelu_fusion >= 1;
  for (int l = 0; l < config.n_layer; ++l) {
    layernorm_fwd("layernorm fwd", true);
    gemm_fwd("qkv fwd", N, C, 3 * C, true, false, false);
    attention_fwd();
    gemm_fwd("attproj fwd", N, C, C, true, o.fuse_residual, false);
    if (!o.fuse_residual) w.Add("residual add", 0, s * 3 * NC);
    layernorm_fwd("layernorm fwd", true);
    gemm_fwd("fc fwd", N, C, 4 * C, true, false, aux);
    if (!aux) w.Add("gelu fwd", 0, s * 8 * NC);
    gemm_fwd("fcproj fwd", N, 4 * C, C, true, o.fuse_residual, false);
    if (!o.fuse_residual) w.Add("residual add", 0, s * 3 * NC);
  }
  layernorm_fwd("layernorm fwd", true);
  gemm_fwd("lm head fwd", N, C, Vp, false, false, false);
  // Loss and dlogits in place: the V real logits read, the Vp-wide gradient written; targets, losses.
  w.Add("cross-entropy", 0, s * (N * V + N * Vp) + 8 * N);
  // Backward.
  gemm_bwd("lm head bwd", N, C, Vp, false, false);
  w.Add("zero", 0, s * NC);
  layernorm_bwd();
  const bool dgelu = o.gelu_fusion >= 2;
  for (int l = 0; l < config.n_layer; ++l) {
    if (o.recompute >= 1) w.Add("recompute", 0, s * 8 * NC);  // GELU forward again
    gemm_bwd("fcproj bwd", N, 4 * C, C, true, dgelu);
    if (!dgelu) w.Add("gelu bwd", 0, s * 12 * NC);  // pre-activation and gradient read, gradient written
    if (o.recompute >= 2) layernorm_fwd("recompute", false);
    gemm_bwd("fc bwd", N, C, 4 * C, true, false);
    layernorm_bwd();
    gemm_bwd("attproj bwd", N, C, C, true, false);
    attention_bwd();
    if (o.recompute >= 2) layernorm_fwd("recompute", false);
    gemm_bwd("qkv bwd", N, C, 3 * C, true, false);
    layernorm_bwd();
  }
  // dout read; tokens, sorted keys and values written and read once; each distinct token's dwte row
  // read-modify-written (at most min(N, V) rows); dwpe read-modify-written.
  w.Add("embedding bwd", 0, s * NC + 4 * N + 2 * 16 * N + s * 2 * std::min(N, V) * C + s * 2 * T * C);
  // Optimizer.
  w.Add("grad norm", 0, s * P);
  // Gradient read; fp32 master, m, v read-modify-written; the bf16 working copy written (fp32: the
  // master is the parameter).
  w.Add("adamw", 0, s * P + 24 * P + (o.elem_bytes == 2 ? 2 * P : 0));
  return w.Take();
}

double RooflineMs(const PieceWork& work, double peak_flops, double bandwidth) {
  return 1e3 * std::max(work.flops / peak_flops, work.bytes / bandwidth);
}

}  // namespace tf
