// GPU throughput of the CUDA linear layers and attention (kernels/matmul.cu, kernels/attention.cu)
// at GPT-2 124M training shapes: B = 16, T = 1024 (N = B*T = 16384 rows), C = 768, NH = 12 (head
// size 64), MLP 4C = 3072, vocabulary padded to Vp = 50304.
//
// Benchmarks, each for fp32 (arg 0) and bf16 (arg 1):
//  * BM_Linear/<layer>_fwd and _bwd: qkv (C -> 3C), attn_proj (C -> C), fc (C -> 4C, the GELU fused
//    into the forward), fc_proj (4C -> C), each with bias; lm_head (C -> Vp, no bias, as GPT-2 ties
//    it to the embedding). Backward = dinp, dweight and dbias (accumulating), as training runs it.
//  * BM_Attention/fwd and /bwd: the unfused cuBLAS baseline at (B, T, C, NH).
// Counters:
//  * TFLOP/s: the FLOPs the kernels execute per call / GPU time per call. Linear: 2 N C OC forward,
//    4 N C OC backward (two GEMMs; the bias column sum is not counted). Attention: 4 B NH T^2 hs
//    forward and 8 B NH T^2 hs backward, i.e. the full (T,T) products the baseline computes (the
//    causal half of them is useful work).
//  * of_peak: TFLOP/s / peak_TFLOP/s, where the peak is measured once per process and dtype: a
//    square 8192^3 GEMM of the same dtype through cuda::matmul_forward (cuBLASLt, no bias), best of
//    5 timed calls after warm-up. It is printed to stderr as well.
// Timing: CUDA events around kReps back-to-back calls on the context's stream (manual time), after
// kWarmUp calls (cuBLASLt heuristics, clocks). Issuing several calls per measurement lets the host
// work of each call (descriptor set-up, heuristic query) overlap the previous call's kernels, as it
// does in training. No cache flush: every activation operand is >= 25 MB and the GEMMs are
// compute-bound; only the small weight matrices may stay in L2 between calls.
// Inputs are random (N(0,1)-scaled data, not zeros: tensor-core power and clocks depend on the
// data).
//
// Without a CUDA device every benchmark reports an error ("no CUDA device") and exits cleanly.
// Run: build/bench/matmul_attention_cuda_bench [--benchmark_filter=Linear] [--benchmark_min_time=0.5]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include "kernels/attention.h"
#include "kernels/cublas_handle.h"
#include "kernels/cuda_runtime.h"
#include "kernels/matmul.h"

namespace tf {
namespace {

using cuda::DType;

constexpr int kB = 16, kT = 1024, kN = kB * kT, kC = 768, kNH = 12, kMlp = 4 * kC, kVp = 50304;
constexpr int kWarmUp = 3;
constexpr int kReps = 5;
constexpr int kPeakSize = 8192;

DType ArgDType(const benchmark::State& state) { return state.range(0) == 0 ? DType::kF32 : DType::kBF16; }

// The process's CublasContext on the default stream; nullptr without a device (or if creation
// failed, reported on stderr).
cuda::CublasContext* Context() {
  static std::optional<cuda::CublasContext> ctx = []() -> std::optional<cuda::CublasContext> {
    if (cuda::DeviceCount() == 0) return std::nullopt;
    auto c = cuda::CublasContext::Create(nullptr);
    if (!c.ok()) {
      std::fprintf(stderr, "CublasContext: %s\n", c.status().ToString().c_str());
      return std::nullopt;
    }
    std::fprintf(stderr, "device: %s\n", cuda::DeviceDescription(0).c_str());
    return std::move(c).value();
  }();
  return ctx ? &*ctx : nullptr;
}

// Fills a device buffer of `n` elements of `dt` with N(0, scale^2) values (a 1M-element random
// pattern, repeated).
Status FillRandom(void* dst, size_t n, DType dt, float scale) {
  constexpr size_t kPattern = size_t{1} << 20;
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> f(std::min(n, kPattern));
  for (float& x : f) x = dist(rng);
  std::vector<uint16_t> h;
  const void* src = f.data();
  if (dt == DType::kBF16) {
    h.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) {  // round to nearest even (values are finite)
      uint32_t u;
      std::memcpy(&u, &f[i], 4);
      h[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    src = h.data();
  }
  const size_t esize = cuda::DTypeSize(dt);
  for (size_t off = 0; off < n; off += f.size()) {
    const size_t count = std::min(f.size(), n - off);
    TF_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(static_cast<char*>(dst) + off * esize, src, count * esize, cudaMemcpyHostToDevice));
  }
  return Status::OK();
}

// Device buffers for one benchmark; on failure the benchmark is skipped with the reason.
struct Buffers {
  std::vector<cuda::DeviceBuffer> owned;
  Status status;
  // Allocates `bytes` of device memory, left uninitialised.
  void* AddBytes(size_t bytes) {
    if (!status.ok()) return nullptr;
    auto b = cuda::DeviceBuffer::Allocate(bytes);
    if (!b.ok()) {
      status = b.status();
      return nullptr;
    }
    owned.push_back(std::move(*b));
    return owned.back().data();
  }
  // Allocates n elements of dt, filled with N(0, scale^2) values unless scale == 0 (uninitialised).
  void* Add(size_t n, DType dt, float scale) {
    void* p = AddBytes(n * cuda::DTypeSize(dt));
    if (p != nullptr && scale != 0.0f) status = FillRandom(p, n, dt, scale);
    return p;
  }
};

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~Events() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// Seconds per call of op (kReps calls between two events), best of `reps` measurements.
template <typename Op>
StatusOr<double> BestSecondsPerCall(cudaStream_t stream, int reps, const Op& op) {
  Events ev;
  for (int i = 0; i < kWarmUp; ++i) TF_RETURN_IF_ERROR(op());
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start, stream));
    for (int i = 0; i < kReps; ++i) TF_RETURN_IF_ERROR(op());
    TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop, stream));
    TF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.stop));
    float ms = 0;
    TF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    best = std::min(best, ms * 1e-3 / kReps);
  }
  return best;
}

// Peak FLOP/s for dt: a square kPeakSize GEMM through cuBLASLt, measured once per dtype; 0 on failure.
double PeakFlops(cuda::CublasContext& ctx, DType dt) {
  static double peak[2] = {-1, -1};
  double& p = peak[dt == DType::kF32 ? 0 : 1];
  if (p >= 0) return p;
  p = 0;
  const size_t n = size_t(kPeakSize) * kPeakSize;
  Buffers buf;
  void* a = buf.Add(n, dt, 1.0f);
  void* b = buf.Add(n, dt, 1.0f);
  void* c = buf.Add(n, dt, 0.0f);
  if (!buf.status.ok()) {
    std::fprintf(stderr, "peak GEMM: %s\n", buf.status.ToString().c_str());
    return p;
  }
  auto s = BestSecondsPerCall(ctx.stream(), 5, [&] {
    return cuda::matmul_forward(ctx, c, a, b, nullptr, kPeakSize, kPeakSize, kPeakSize, dt);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "peak GEMM: %s\n", s.status().ToString().c_str());
    return p;
  }
  p = 2.0 * kPeakSize * double(kPeakSize) * kPeakSize / *s;
  std::fprintf(stderr, "peak (%s, %d^3 cuBLASLt GEMM): %.1f TFLOP/s\n", cuda::DTypeName(dt), kPeakSize, p / 1e12);
  return p;
}

// Times op with manual (GPU event) time and sets the TFLOP/s and of_peak counters.
template <typename Op>
void RunTimed(benchmark::State& state, cuda::CublasContext& ctx, DType dt, double flops_per_call, const Op& op) {
  const double peak = PeakFlops(ctx, dt);
  Events ev;
  for (int i = 0; i < kWarmUp; ++i) {
    Status st = op();
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
  }
  double seconds = 0;
  long calls = 0;
  for (auto _ : state) {
    Status st;
    if (cudaEventRecord(ev.start, ctx.stream()) != cudaSuccess) st = Status(StatusCode::kInternal, "cudaEventRecord");
    for (int i = 0; i < kReps && st.ok(); ++i) st = op();
    float ms = 0;
    if (st.ok() && (cudaEventRecord(ev.stop, ctx.stream()) != cudaSuccess ||
                    cudaEventSynchronize(ev.stop) != cudaSuccess ||
                    cudaEventElapsedTime(&ms, ev.start, ev.stop) != cudaSuccess)) {
      st = Status(StatusCode::kInternal, "CUDA event timing failed");
    }
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
    state.SetIterationTime(ms * 1e-3);
    seconds += ms * 1e-3;
    calls += kReps;
  }
  if (calls == 0 || seconds <= 0) return;
  const double rate = flops_per_call * calls / seconds;
  state.counters["TFLOP/s"] = rate / 1e12;
  state.counters["peak_TFLOP/s"] = peak / 1e12;
  if (peak > 0) state.counters["of_peak"] = rate / peak;
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
  cuda::CublasContext* ctx = Context();
  if (ctx == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
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
    if (!buf.status.ok()) {
      state.SkipWithError(buf.status.ToString().c_str());
      return;
    }
    RunTimed(state, *ctx, dt, 2.0 * kN * double(s.C) * s.OC,
             [&] { return cuda::matmul_forward(*ctx, out, inp, weight, bias, kN, s.C, s.OC, dt, pre); });
  } else {
    void* dout = buf.Add(n_out, dt, 1.0f);
    void* dinp = buf.Add(n_in, dt, 1.0f);
    void* dweight = buf.Add(n_w, dt, 1.0f);
    void* dbias = s.bias ? buf.Add(s.OC, dt, 1.0f) : nullptr;
    void* scratch = s.bias ? buf.Add(size_t(cuda::matmul_dbias_scratch_floats(kN, s.OC)), DType::kF32, 0.0f) : nullptr;
    if (!buf.status.ok()) {
      state.SkipWithError(buf.status.ToString().c_str());
      return;
    }
    RunTimed(state, *ctx, dt, 4.0 * kN * double(s.C) * s.OC, [&] {
      return cuda::matmul_backward(*ctx, dinp, dweight, dbias, dout, inp, weight, kN, s.C, s.OC, dt,
                                   static_cast<float*>(scratch));
    });
  }
}

void BM_Attention(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = Context();
  if (ctx == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const DType dt = ArgDType(state);
  const size_t n_qkv = size_t(kN) * 3 * kC, n_out = size_t(kN) * kC, n_att = size_t(kB) * kNH * kT * kT;
  Buffers buf;
  void* qkv = buf.Add(n_qkv, dt, 1.0f);
  void* out = buf.Add(n_out, dt, 0.0f);
  void* att = buf.Add(n_att, dt, 0.0f);
  void* scratch = buf.AddBytes(cuda::attention_scratch_bytes(kB, kT, kC, kNH, dt));
  void* dout = backward ? buf.Add(n_out, dt, 1.0f) : nullptr;
  void* dqkv = backward ? buf.Add(n_qkv, dt, 0.0f) : nullptr;
  if (!buf.status.ok()) {
    state.SkipWithError(buf.status.ToString().c_str());
    return;
  }
  const double hs = kC / kNH;
  const double gemm_flops = 2.0 * kB * kNH * double(kT) * kT * hs;  // one (T,T,hs) product over all heads
  if (!backward) {
    RunTimed(state, *ctx, dt, 2 * gemm_flops,
             [&] { return cuda::attention_forward(*ctx, out, att, qkv, kB, kT, kC, kNH, dt, scratch); });
  } else {
    // Probabilities from a real forward pass first.
    Status st = cuda::attention_forward(*ctx, out, att, qkv, kB, kT, kC, kNH, dt, scratch);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    RunTimed(state, *ctx, dt, 4 * gemm_flops,
             [&] { return cuda::attention_backward(*ctx, dqkv, dout, qkv, att, kB, kT, kC, kNH, dt, scratch); });
  }
}

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
