// Causal attention on the GPU: the fused flash kernels (kernels/flash_attention.cu) against the
// GEMM-based baseline (kernels/attention.cu), forward and backward.
//
// Shapes (arg "shape"): 0 = GPT-2 124M training, B = 16, T = 1024, NH = 12, hs = 64 (C = 768);
// 1 = GPT-2 1558M, B = 8, T = 1024, NH = 25, hs = 64 (C = 1600). Arg "dt": 0 fp32, 1 bf16.
// BM_Flash arg "simt" = 1 forces the SIMT kernels (bf16 otherwise runs on tensor cores).
//
// Counters:
//  * TFLOP/s: useful causal FLOPs per call / GPU time per call, the FlashAttention convention, so
//    that both implementations are judged on the same work: forward 2 products of (T(T+1)/2) x hs
//    multiply-adds per (batch, head) = 2 hs T (T+1) B NH FLOPs; backward 2.5x that (5 products).
//    (The flash backward executes 7 products — S and dP are recomputed in its dQ pass — and the
//    baseline computes full (T,T) products, twice the causal work; neither overhead is counted.)
//  * of_peak: TFLOP/s / peak_TFLOP/s. The peak is --peak=<TFLOP/s> (bf16 runs) or
//    --peak_fp32=<TFLOP/s> when given, else measured once per dtype: a square 8192^3 GEMM through
//    cuda::matmul_forward (cuBLASLt), best of 5 timed calls after warm-up, printed to stderr.
// Timing: CUDA events around kReps back-to-back calls (manual time), after kWarmUp calls. No cache
// flush: the operands (>= 75 MB of qkv at the 124M shape) exceed L2.
// Without a CUDA device every benchmark reports "no CUDA device" and is skipped.
//
// Run: build/bench/attention_cuda_bench [--peak=989] [--benchmark_filter=Flash]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
#include "kernels/flash_attention.h"
#include "kernels/matmul.h"

namespace tf {
namespace {

using cuda::DType;

struct AttnShape {
  int B, T, C, NH;
};
constexpr AttnShape kShapes[] = {{16, 1024, 768, 12}, {8, 1024, 1600, 25}};
constexpr int kWarmUp = 3;
constexpr int kReps = 5;
constexpr int kPeakSize = 8192;

double g_peak_flag[2] = {0, 0};  // --peak_fp32, --peak (TFLOP/s); 0 = measure

DType ArgDType(const benchmark::State& state) { return state.range(1) == 0 ? DType::kF32 : DType::kBF16; }
const AttnShape& ArgShape(const benchmark::State& state) { return kShapes[state.range(0)]; }

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

// Fills n elements of dt with N(0, scale^2) values (a 1M-element pattern, repeated).
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
    for (size_t i = 0; i < f.size(); ++i) {
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

struct Buffers {
  std::vector<cuda::DeviceBuffer> owned;
  Status status;
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

// The ceiling for dt: the flag if given, else a measured cuBLASLt GEMM (0 if that fails).
double PeakFlops(cuda::CublasContext& ctx, DType dt) {
  const int i = dt == DType::kF32 ? 0 : 1;
  if (g_peak_flag[i] > 0) return g_peak_flag[i] * 1e12;
  static double peak[2] = {-1, -1};
  if (peak[i] >= 0) return peak[i];
  peak[i] = 0;
  const size_t n = size_t(kPeakSize) * kPeakSize;
  Buffers buf;
  void* a = buf.Add(n, dt, 1.0f);
  void* b = buf.Add(n, dt, 1.0f);
  void* c = buf.Add(n, dt, 0.0f);
  if (!buf.status.ok()) {
    std::fprintf(stderr, "peak GEMM: %s\n", buf.status.ToString().c_str());
    return peak[i];
  }
  Events ev;
  double best = 1e30;
  for (int r = 0; r < kWarmUp + 5; ++r) {
    cudaEventRecord(ev.start, ctx.stream());
    const Status st = cuda::matmul_forward(ctx, c, a, b, nullptr, kPeakSize, kPeakSize, kPeakSize, dt);
    cudaEventRecord(ev.stop, ctx.stream());
    if (!st.ok() || cudaEventSynchronize(ev.stop) != cudaSuccess) {
      std::fprintf(stderr, "peak GEMM: %s\n", st.ToString().c_str());
      return peak[i];
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.start, ev.stop);
    if (r >= kWarmUp) best = std::min(best, ms * 1e-3);
  }
  peak[i] = 2.0 * kPeakSize * double(kPeakSize) * kPeakSize / best;
  std::fprintf(stderr, "peak (%s, %d^3 cuBLASLt GEMM): %.1f TFLOP/s\n", cuda::DTypeName(dt), kPeakSize,
               peak[i] / 1e12);
  return peak[i];
}

template <typename Op>
void RunTimed(benchmark::State& state, cuda::CublasContext& ctx, DType dt, double flops_per_call, const Op& op) {
  const double peak = PeakFlops(ctx, dt);
  Events ev;
  for (int i = 0; i < kWarmUp; ++i) {
    const Status st = op();
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

// Useful causal forward FLOPs: 2 products x 2 hs T(T+1)/2 per (batch, head).
double ForwardFlops(const AttnShape& s) {
  return 2.0 * (s.C / s.NH) * double(s.T) * (s.T + 1) * s.B * s.NH;
}

// args: shape, dt, simt
void BM_Flash(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = Context();
  if (ctx == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const AttnShape& s = ArgShape(state);
  const DType dt = ArgDType(state);
  const cuda::FlashImpl impl = state.range(2) != 0 ? cuda::FlashImpl::kSimt : cuda::FlashImpl::kAuto;
  state.SetLabel(cuda::flash_attention_uses_tensor_cores(s.C, s.NH, dt, impl) ? "tensor cores" : "SIMT");
  const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
  Buffers buf;
  void* qkv = buf.Add(n_qkv, dt, 1.0f);
  void* out = buf.Add(n_out, dt, 0.0f);
  auto* lse = static_cast<float*>(buf.AddBytes(size_t(s.B) * s.NH * s.T * sizeof(float)));
  const size_t scratch_bytes = cuda::flash_attention_backward_scratch_bytes(s.B, s.T, s.NH);
  void* scratch = backward ? buf.AddBytes(scratch_bytes) : nullptr;
  void* dout = backward ? buf.Add(n_out, dt, 1.0f) : nullptr;
  void* dqkv = backward ? buf.Add(n_qkv, dt, 0.0f) : nullptr;
  if (!buf.status.ok()) {
    state.SkipWithError(buf.status.ToString().c_str());
    return;
  }
  cudaStream_t stream = ctx->stream();
  auto forward = [&] { return cuda::flash_attention_forward(out, lse, qkv, s.B, s.T, s.C, s.NH, dt, stream, impl); };
  if (!backward) {
    RunTimed(state, *ctx, dt, ForwardFlops(s), forward);
    return;
  }
  const Status st = forward();  // out and lse of a real forward pass
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  RunTimed(state, *ctx, dt, 2.5 * ForwardFlops(s), [&] {
    return cuda::flash_attention_backward(dqkv, dout, qkv, out, lse, s.B, s.T, s.C, s.NH, dt, scratch, scratch_bytes,
                                          stream, impl);
  });
}

// args: shape, dt
void BM_Gemm(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = Context();
  if (ctx == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const AttnShape& s = ArgShape(state);
  const DType dt = ArgDType(state);
  const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
  const size_t n_att = size_t(s.B) * s.NH * s.T * s.T;
  Buffers buf;
  void* qkv = buf.Add(n_qkv, dt, 1.0f);
  void* out = buf.Add(n_out, dt, 0.0f);
  void* att = buf.Add(n_att, dt, 0.0f);
  void* scratch = buf.AddBytes(cuda::attention_scratch_bytes(s.B, s.T, s.C, s.NH, dt));
  void* dout = backward ? buf.Add(n_out, dt, 1.0f) : nullptr;
  void* dqkv = backward ? buf.Add(n_qkv, dt, 0.0f) : nullptr;
  if (!buf.status.ok()) {
    state.SkipWithError(buf.status.ToString().c_str());
    return;
  }
  auto forward = [&] { return cuda::attention_forward(*ctx, out, att, qkv, s.B, s.T, s.C, s.NH, dt, scratch); };
  if (!backward) {
    RunTimed(state, *ctx, dt, ForwardFlops(s), forward);
    return;
  }
  const Status st = forward();
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  RunTimed(state, *ctx, dt, 2.5 * ForwardFlops(s),
           [&] { return cuda::attention_backward(*ctx, dqkv, dout, qkv, att, s.B, s.T, s.C, s.NH, dt, scratch); });
}

// GPT-2 124M in bf16 (tensor cores and SIMT) and fp32; 1558M in bf16.
void FlashArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "dt", "simt"});
  b->Args({0, 1, 0})->Args({0, 1, 1})->Args({0, 0, 0})->Args({1, 1, 0});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}
void GemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "dt"});
  b->Args({0, 1})->Args({0, 0})->Args({1, 1});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK_CAPTURE(BM_Flash, fwd, false)->Apply(FlashArgs);
BENCHMARK_CAPTURE(BM_Flash, bwd, true)->Apply(FlashArgs);
BENCHMARK_CAPTURE(BM_Gemm, fwd, false)->Apply(GemmArgs);
BENCHMARK_CAPTURE(BM_Gemm, bwd, true)->Apply(GemmArgs);

}  // namespace
}  // namespace tf

// Own main: takes --peak=<TFLOP/s> (bf16) and --peak_fp32=<TFLOP/s> before Google Benchmark's flags.
int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--peak=", 7) == 0) {
      tf::g_peak_flag[1] = std::atof(a + 7);
    } else if (std::strncmp(a, "--peak_fp32=", 12) == 0) {
      tf::g_peak_flag[0] = std::atof(a + 12);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
