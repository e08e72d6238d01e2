// Causal attention on the GPU: the fused flash kernels (kernels/flash_attention.cu) against the
// GEMM-based baseline (kernels/attention.cu), forward and backward.
// Args: "shape" 0 = GPT-2 124M training (B = 16, T = 1024, NH = 12, hs = 64), 1 = GPT-2 1558M
// (B = 8, T = 1024, NH = 25, hs = 64); "dt" 0 fp32, 1 bf16; BM_Flash "simt" = 1 forces the SIMT
// kernels (bf16 otherwise runs on tensor cores).
// Counters: TFLOP/s = useful causal FLOPs / GPU time (the FlashAttention convention, the same work
// for both): forward 2 hs T (T+1) B NH, backward 2.5x that (5 products); the flash backward's 7
// products and the baseline's full (T,T) products are not counted. of_peak = that / the peak:
// --peak=<TFLOP/s> (bf16) or --peak_fp32=<TFLOP/s>, else a measured 8192^3 cuBLASLt GEMM (best of
// 5 after warm-up, printed to stderr).
// Timing (bench/cuda_bench_util.h, TimeFlopRate): CUDA events around 5 back-to-back calls after 3
// warm-up calls; no cache flush (>= 75 MB of qkv at the 124M shape exceeds L2). Without a CUDA
// device every benchmark reports "no CUDA device" and is skipped.
//
// Run: build/bench/attention_cuda_bench [--peak=989] [--benchmark_filter=Flash]
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include "bench/cuda_bench_util.h"
#include "kernels/attention.h"
#include "kernels/cublas_handle.h"
#include "kernels/cuda_runtime.h"
#include "kernels/flash_attention.h"
#include "kernels/matmul.h"

namespace tf {
namespace {

using bench::Buffers;
using bench::ContextOrSkip;
using bench::Failed;
using cuda::DType;

struct AttnShape {
  int B, T, C, NH;
};
constexpr AttnShape kShapes[] = {{16, 1024, 768, 12}, {8, 1024, 1600, 25}};

double g_peak_flag[2] = {0, 0};  // --peak_fp32, --peak (TFLOP/s); 0 = measure

DType ArgDType(const benchmark::State& state) { return state.range(1) == 0 ? DType::kF32 : DType::kBF16; }
const AttnShape& ArgShape(const benchmark::State& state) { return kShapes[state.range(0)]; }

// The ceiling for dt: the flag if given, else a measured cuBLASLt GEMM timed one call per
// measurement (0 if that fails).
double PeakFlops(cuda::CublasContext& ctx, DType dt) {
  const double flag = g_peak_flag[dt == DType::kF32 ? 0 : 1];
  return flag > 0 ? flag * 1e12 : bench::GemmPeakFlops(ctx, dt, 1);
}

// Times op and sets the TFLOP/s and of_peak counters.
template <typename Op>
void RunTimed(benchmark::State& state, cuda::CublasContext& ctx, DType dt, double flops_per_call, const Op& op) {
  const double peak = PeakFlops(ctx, dt);
  bench::TimeFlopRate(state, ctx.stream(), flops_per_call, peak, op);
}

// Useful causal forward FLOPs: 2 products x 2 hs T(T+1)/2 per (batch, head).
double ForwardFlops(const AttnShape& s) {
  return 2.0 * (s.C / s.NH) * double(s.T) * (s.T + 1) * s.B * s.NH;
}

// args: shape, dt, simt
void BM_Flash(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
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
  if (Failed(state, buf.status)) return;
  cudaStream_t stream = ctx->stream();
  auto forward = [&] { return cuda::flash_attention_forward(out, lse, qkv, s.B, s.T, s.C, s.NH, dt, stream, impl); };
  if (!backward) {
    RunTimed(state, *ctx, dt, ForwardFlops(s), forward);
    return;
  }
  if (Failed(state, forward())) return;  // out and lse of a real forward pass
  RunTimed(state, *ctx, dt, 2.5 * ForwardFlops(s), [&] {
    return cuda::flash_attention_backward(dqkv, dout, qkv, out, lse, s.B, s.T, s.C, s.NH, dt, scratch, scratch_bytes,
                                          stream, impl);
  });
}

// args: shape, dt
void BM_Gemm(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
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
  if (Failed(state, buf.status)) return;
  auto forward = [&] { return cuda::attention_forward(*ctx, out, att, qkv, s.B, s.T, s.C, s.NH, dt, scratch); };
  if (!backward) {
    RunTimed(state, *ctx, dt, ForwardFlops(s), forward);
    return;
  }
  if (Failed(state, forward())) return;
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
