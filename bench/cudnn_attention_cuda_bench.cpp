// Causal attention on the GPU: cuDNN's fused flash-attention engines (kernels/cudnn_attention.cpp)
// against our flash kernels (kernels/flash_attention.cu), bf16, GPT-2 124M training shape B = 16,
// T = 1024, NH = 12, hs = 64 (C = 768), forward and backward.
//
// Counters as bench/attention_cuda_bench.cpp: TFLOP/s of useful causal work, forward
// 2 hs T (T+1) B NH FLOPs, backward 2.5x that; of_peak against a measured cuBLASLt 8192^3 bf16 GEMM
// (bench::GemmPeakFlops). Timing: bench::TimeFlopRate (warm-up, CUDA events around back-to-back
// calls); plans are built before timing (first call outside the timed region). BM_Cudnn arg "det":
// 1 = deterministic backward (dP workspace, no dQ atomics), 0 = fp32 atomic dQ accumulation.
// Skipped without a CUDA device; cuDNN benchmarks report an error when cuDNN cannot be loaded.
//
// Run: build/bench/cudnn_attention_cuda_bench [--benchmark_filter=Cudnn]
#include <algorithm>
#include <cstddef>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include "bench/cuda_bench_util.h"
#include "kernels/cudnn_attention.h"
#include "kernels/cuda_runtime.h"
#include "kernels/flash_attention.h"

namespace tf {
namespace {

using bench::Buffers;
using bench::ContextOrSkip;
using bench::Failed;
using cuda::DType;

constexpr int kB = 16, kT = 1024, kC = 768, kNH = 12;
constexpr DType kDt = DType::kBF16;

double ForwardFlops() { return 2.0 * (kC / kNH) * double(kT) * (kT + 1) * kB * kNH; }

// args: det
void BM_Cudnn(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
  auto attn = cuda::CudnnAttention::Create({.deterministic = state.range(0) != 0});
  if (Failed(state, attn.status())) return;
  using Dir = cuda::CudnnAttention::Direction;
  auto fwd_ws = (*attn)->WorkspaceBytes(Dir::kForward, kB, kT, kC, kNH);
  if (Failed(state, fwd_ws.status())) return;
  auto bwd_ws = backward ? (*attn)->WorkspaceBytes(Dir::kBackward, kB, kT, kC, kNH) : StatusOr<size_t>(size_t{0});
  if (Failed(state, bwd_ws.status())) return;
  const size_t n_qkv = size_t(kB) * kT * 3 * kC, n_out = size_t(kB) * kT * kC;
  Buffers buf;
  void* qkv = buf.Add(n_qkv, kDt, 1.0f);
  void* out = buf.Add(n_out, kDt, 0.0f);
  auto* lse = static_cast<float*>(buf.AddBytes(size_t(kB) * kNH * kT * sizeof(float)));
  void* ws = buf.AddBytes(std::max<size_t>({*fwd_ws, *bwd_ws, 256}));
  void* dout = backward ? buf.Add(n_out, kDt, 1.0f) : nullptr;
  void* dqkv = backward ? buf.Add(n_qkv, kDt, 0.0f) : nullptr;
  if (Failed(state, buf.status)) return;
  const size_t ws_bytes = std::max<size_t>({*fwd_ws, *bwd_ws, 256});
  state.SetLabel((*attn)->Describe());
  cudaStream_t stream = ctx->stream();
  auto forward = [&] {
    return (*attn)->Forward(out, lse, qkv, kB, kT, kC, kNH, kDt, ws, ws_bytes, stream);
  };
  const double peak = bench::GemmPeakFlops(*ctx, kDt, 1);
  if (!backward) {
    bench::TimeFlopRate(state, stream, ForwardFlops(), peak, forward);
    return;
  }
  if (Failed(state, forward())) return;  // out and lse of a real forward pass
  bench::TimeFlopRate(state, stream, 2.5 * ForwardFlops(), peak, [&] {
    return (*attn)->Backward(dqkv, dout, qkv, out, lse, kB, kT, kC, kNH, kDt, ws, ws_bytes, stream);
  });
}

void BM_Flash(benchmark::State& state, bool backward) {
  cuda::CublasContext* ctx = ContextOrSkip(state);
  if (ctx == nullptr) return;
  const size_t n_qkv = size_t(kB) * kT * 3 * kC, n_out = size_t(kB) * kT * kC;
  const size_t scratch_bytes = cuda::flash_attention_backward_scratch_bytes(kB, kT, kNH);
  Buffers buf;
  void* qkv = buf.Add(n_qkv, kDt, 1.0f);
  void* out = buf.Add(n_out, kDt, 0.0f);
  auto* lse = static_cast<float*>(buf.AddBytes(size_t(kB) * kNH * kT * sizeof(float)));
  void* scratch = buf.AddBytes(scratch_bytes);
  void* dout = backward ? buf.Add(n_out, kDt, 1.0f) : nullptr;
  void* dqkv = backward ? buf.Add(n_qkv, kDt, 0.0f) : nullptr;
  if (Failed(state, buf.status)) return;
  cudaStream_t stream = ctx->stream();
  auto forward = [&] { return cuda::flash_attention_forward(out, lse, qkv, kB, kT, kC, kNH, kDt, stream); };
  const double peak = bench::GemmPeakFlops(*ctx, kDt, 1);
  if (!backward) {
    bench::TimeFlopRate(state, stream, ForwardFlops(), peak, forward);
    return;
  }
  if (Failed(state, forward())) return;
  bench::TimeFlopRate(state, stream, 2.5 * ForwardFlops(), peak, [&] {
    return cuda::flash_attention_backward(dqkv, dout, qkv, out, lse, kB, kT, kC, kNH, kDt, scratch, scratch_bytes,
                                          stream);
  });
}

BENCHMARK_CAPTURE(BM_Cudnn, fwd, false)->ArgName("det")->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Cudnn, bwd, true)->ArgName("det")->Arg(1)->Arg(0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Flash, fwd, false)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Flash, bwd, true)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tf
