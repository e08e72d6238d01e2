// GPU throughput of the CUDA linear layers and attention (kernels/matmul.cu, kernels/attention.cu)
// at GPT-2 124M training shapes: B = 16, T = 1024 (N = 16384 rows), C = 768, NH = 12 (hs 64), MLP
// 4C = 3072, vocabulary padded to Vp = 50304. Each benchmark for fp32 (arg 0) and bf16 (arg 1):
//  * BM_Linear/<layer>_fwd, _bwd: qkv, attn_proj, fc (GELU fused into the forward), fc_proj, with
//    bias; lm_head (C -> Vp, no bias: tied to the embedding). Backward = dinp, dweight, dbias
//    (accumulating). BM_Attention/fwd, /bwd: the unfused cuBLAS baseline. BM_Epilogue/<fusion>_fused
//    and _unfused: each epilogue fusion of the model against the separate kernels it replaces.
//  * TFLOP/s = executed FLOPs / GPU time: linear 2 N C OC forward, 4 N C OC backward (bias sum not
//    counted); attention 4 B NH T^2 hs forward, 8 B NH T^2 hs backward (the full (T,T) products, of
//    which the causal half is useful). of_peak = that / a measured 8192^3 GEMM of the same dtype.
// Timing (bench/cuda_bench_util.h, TimeFlopRate): CUDA events around 5 back-to-back calls after 3
// warm-up calls, so each call's host work overlaps the previous kernels, as in training. No cache
// flush (activations >= 25 MB, GEMMs compute-bound); random inputs (tensor-core power and clocks
// depend on the data). Without a CUDA device every benchmark reports an error and exits cleanly.
// Run: build/bench/matmul_attention_cuda_bench [--benchmark_filter=Linear] [--benchmark_min_time=0.5]
#include <cmath>
#include <cstddef>

#include <benchmark/benchmark.h>

#include "bench/cuda_bench_util.h"
#include "kernels/attention.h"
#include "kernels/cublas_handle.h"
#include "kernels/cuda_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"

namespace tf {
namespace {

using bench::Buffers;
using bench::ContextOrSkip;
using bench::Failed;
using cuda::DType;

constexpr int kB = 16, kT = 1024, kN = kB * kT, kC = 768, kNH = 12, kMlp = 4 * kC, kVp = 50304;

DType ArgDType(const benchmark::State& state) { return state.range(0) == 0 ? DType::kF32 : DType::kBF16; }

// The measured ceiling for dt (kCallsPerTiming calls per timing, as the benchmarks run).
double PeakFlops(cuda::CublasContext& ctx, DType dt) { return bench::GemmPeakFlops(ctx, dt, bench::kCallsPerTiming); }

// Times op and sets the TFLOP/s and of_peak counters.
template <typename Op>
void RunTimed(benchmark::State& state, cuda::CublasContext& ctx, DType dt, double flops_per_call, const Op& op) {
  const double peak = PeakFlops(ctx, dt);
  bench::TimeFlopRate(state, ctx.stream(), flops_per_call, peak, op);
}

enum class Layer { kQkv, kAttnProj, kFc, kFcProj, kLmHead };
struct LayerShape {
  int C, OC;
  bool bias, gelu;
};
LayerShape ShapeOf(Layer l) {
  switch (l) {
    case Layer::kQkv: return {kC, 3 * kC, true, false};
    case Layer::kAttnProj: return {kC, kC, true, false};
    case Layer::kFc: return {kC, kMlp, true, true};
    case Layer::kFcProj: return {kMlp, kC, true, false};
    case Layer::kLmHead: return {kC, kVp, false, false};
  }
  return {};
}

void BM_Linear(benchmark::State& state, Layer layer, bool backward) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
  const DType dt = ArgDType(state);
  const LayerShape s = ShapeOf(layer);
  const size_t n_in = size_t(kN) * s.C, n_out = size_t(kN) * s.OC, n_w = size_t(s.OC) * s.C;
  Buffers buf;
  void* inp = buf.Add(n_in, dt, 1.0f);
  void* weight = buf.Add(n_w, dt, 1.0f / std::sqrt(float(s.C)));
  void* bias = s.bias ? buf.Add(s.OC, dt, 0.1f) : nullptr;
  if (!backward) {
    void* out = buf.Add(n_out, dt, 0.0f);
    void* pre = s.gelu ? buf.Add(n_out, dt, 0.0f) : nullptr;
    if (Failed(state, buf.status)) return;
    RunTimed(state, *ctx, dt, 2.0 * kN * double(s.C) * s.OC,
             [&] { return cuda::matmul_forward(*ctx, out, inp, weight, bias, kN, s.C, s.OC, dt, pre); });
  } else {
    void* dout = buf.Add(n_out, dt, 1.0f);
    void* dinp = buf.Add(n_in, dt, 1.0f);
    void* dweight = buf.Add(n_w, dt, 1.0f);
    void* dbias = s.bias ? buf.Add(s.OC, dt, 1.0f) : nullptr;
    void* scratch = s.bias ? buf.Add(size_t(cuda::matmul_dbias_scratch_floats(kN, s.OC)), DType::kF32, 0.0f) : nullptr;
    if (Failed(state, buf.status)) return;
    RunTimed(state, *ctx, dt, 4.0 * kN * double(s.C) * s.OC, [&] {
      return cuda::matmul_backward(*ctx, dinp, dweight, dbias, dout, inp, weight, kN, s.C, s.OC, dt,
                                   static_cast<float*>(scratch));
    });
  }
}

void BM_Attention(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
  const DType dt = ArgDType(state);
  const size_t n_qkv = size_t(kN) * 3 * kC, n_out = size_t(kN) * kC, n_att = size_t(kB) * kNH * kT * kT;
  Buffers buf;
  void* qkv = buf.Add(n_qkv, dt, 1.0f);
  void* out = buf.Add(n_out, dt, 0.0f);
  void* att = buf.Add(n_att, dt, 0.0f);
  void* scratch = buf.AddBytes(cuda::attention_scratch_bytes(kB, kT, kC, kNH, dt));
  void* dout = backward ? buf.Add(n_out, dt, 1.0f) : nullptr;
  void* dqkv = backward ? buf.Add(n_qkv, dt, 0.0f) : nullptr;
  if (Failed(state, buf.status)) return;
  const double hs = kC / kNH;
  const double gemm_flops = 2.0 * kB * kNH * double(kT) * kT * hs;  // one (T,T,hs) product over all heads
  if (!backward) {
    RunTimed(state, *ctx, dt, 2 * gemm_flops,
             [&] { return cuda::attention_forward(*ctx, out, att, qkv, kB, kT, kC, kNH, dt, scratch); });
  } else {
    // Probabilities from a real forward pass first.
    if (Failed(state, cuda::attention_forward(*ctx, out, att, qkv, kB, kT, kC, kNH, dt, scratch))) return;
    RunTimed(state, *ctx, dt, 4 * gemm_flops,
             [&] { return cuda::attention_backward(*ctx, dqkv, dout, qkv, att, kB, kT, kC, kNH, dt, scratch); });
  }
}

// The model's epilogue fusions, each against the unfused sequence it replaces (what
// GPT2CudaOptions::gelu_fusion / fuse_residual switch), at the GPT-2 124M shapes:
//  * gelu_fwd: fc (C -> 4C) with GELU_AUX_BIAS, vs the GEMM + bias then gelu_forward;
//  * residual_fwd: fc_proj (4C -> C) with the residual as cuBLASLt's C, vs the GEMM + bias then
//    accumulate;
//  * dgelu_bwd: fc_proj's input gradient with the DGELU epilogue, vs the GEMM then gelu_backward
//    (dinp only, overwritten, as the model issues it).
// TFLOP/s counts the GEMM's FLOPs only, so fused and unfused rates compare directly (higher = faster).
enum class Epilogue { kGeluFwd, kResidualFwd, kDgeluBwd };
void BM_Epilogue(benchmark::State& state, Epilogue kind, bool fused) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
  const DType dt = ArgDType(state);
  Buffers buf;
  const size_t nc = size_t(kN) * kC, n4c = size_t(kN) * kMlp;
  if (kind == Epilogue::kGeluFwd) {
    void* inp = buf.Add(nc, dt, 1.0f);
    void* w = buf.Add(size_t(kMlp) * kC, dt, 1.0f / std::sqrt(float(kC)));
    void* b = buf.Add(kMlp, dt, 0.1f);
    void* pre = buf.Add(n4c, dt, 0.0f);
    void* out = buf.Add(n4c, dt, 0.0f);
    if (Failed(state, buf.status)) return;
    RunTimed(state, *ctx, dt, 2.0 * kN * double(kC) * kMlp, [&]() -> Status {
      if (fused) return cuda::matmul_forward(*ctx, out, inp, w, b, kN, kC, kMlp, dt, pre);
      TF_RETURN_IF_ERROR(cuda::matmul_forward(*ctx, pre, inp, w, b, kN, kC, kMlp, dt));
      return cuda::gelu_forward(out, pre, long(n4c), dt, ctx->stream());
    });
  } else if (kind == Epilogue::kResidualFwd) {
    void* inp = buf.Add(n4c, dt, 1.0f);
    void* w = buf.Add(size_t(kC) * kMlp, dt, 1.0f / std::sqrt(float(kMlp)));
    void* b = buf.Add(kC, dt, 0.1f);
    void* residual = buf.Add(nc, dt, 1.0f);
    void* out = buf.Add(nc, dt, 0.0f);
    if (Failed(state, buf.status)) return;
    RunTimed(state, *ctx, dt, 2.0 * kN * double(kMlp) * kC, [&]() -> Status {
      if (fused) return cuda::matmul_forward(*ctx, out, inp, w, b, kN, kMlp, kC, dt, nullptr, residual);
      TF_RETURN_IF_ERROR(cuda::matmul_forward(*ctx, out, inp, w, b, kN, kMlp, kC, dt));
      return cuda::accumulate(out, residual, long(nc), dt, ctx->stream());
    });
  } else {
    void* dout = buf.Add(nc, dt, 1.0f);
    void* inp = buf.Add(n4c, dt, 1.0f);
    void* pre = buf.Add(n4c, dt, 1.0f);
    void* w = buf.Add(size_t(kC) * kMlp, dt, 1.0f / std::sqrt(float(kMlp)));
    void* dweight = buf.Add(size_t(kC) * kMlp, dt, 0.0f);
    void* dinp = buf.Add(n4c, dt, 0.0f);
    if (Failed(state, buf.status)) return;
    // Both variants also run the dweight GEMM (matmul_backward always does): 4 N C OC FLOPs.
    RunTimed(state, *ctx, dt, 4.0 * kN * double(kMlp) * kC, [&]() -> Status {
      cuda::MatmulBackwardOptions o;
      o.accumulate_dinp = false;
      if (fused) o.dgelu_pre = pre;
      TF_RETURN_IF_ERROR(
          cuda::matmul_backward(*ctx, dinp, dweight, nullptr, dout, inp, w, kN, kMlp, kC, dt, nullptr, o));
      if (fused) return Status::OK();
      return cuda::gelu_backward(dinp, pre, dinp, long(n4c), dt, ctx->stream());
    });
  }
}
#define TF_EPILOGUE_BENCH(name, kind)                                                              \
  BENCHMARK_CAPTURE(BM_Epilogue, name##_fused, kind, true)                                         \
      ->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);                             \
  BENCHMARK_CAPTURE(BM_Epilogue, name##_unfused, kind, false)                                      \
      ->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond)
TF_EPILOGUE_BENCH(gelu_fwd, Epilogue::kGeluFwd);
TF_EPILOGUE_BENCH(residual_fwd, Epilogue::kResidualFwd);
TF_EPILOGUE_BENCH(dgelu_bwd, Epilogue::kDgeluBwd);

#define TF_LINEAR_BENCH(name, layer)                                                              \
  BENCHMARK_CAPTURE(BM_Linear, name##_fwd, layer, false)                                          \
      ->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);                            \
  BENCHMARK_CAPTURE(BM_Linear, name##_bwd, layer, true)                                           \
      ->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond)

TF_LINEAR_BENCH(qkv, Layer::kQkv);
TF_LINEAR_BENCH(attn_proj, Layer::kAttnProj);
TF_LINEAR_BENCH(fc, Layer::kFc);
TF_LINEAR_BENCH(fc_proj, Layer::kFcProj);
TF_LINEAR_BENCH(lm_head, Layer::kLmHead);
BENCHMARK_CAPTURE(BM_Attention, fwd, false)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Attention, bwd, true)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tf
