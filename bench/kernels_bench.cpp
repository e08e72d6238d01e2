// Throughput of the CPU kernels (kernels/*.h) at GPT-2 124M shapes, against the machine's ceilings.
// Shapes: B = 4, T = 64 (N = 256 rows), C = 768, NH = 12, MLP 4C = 3072, vocabulary V = 50257
// padded to Vp = 50304, 124,475,904 parameters (padded vocabulary) for the optimizer.
//
// Each benchmark reports a rate and its fraction of a ceiling measured once per process (Ceilings()):
//  * GEMM-like kernels (matmul, attention): "GFLOP" (executed FLOPs, printed as GFLOP=x/s) and
//    "of_sgemm_peak" against a square 2048 SGEMM on all OpenMP threads through the build's GEMM
//    engine, the one the kernels call (BM_EigenSgemm shows Eigen's own rate across shapes).
//  * Memory-bound kernels: bytes_per_second of the compulsory traffic (inputs read once, outputs
//    written once, read-modify-write twice) and "of_stream_bw" against the STREAM-triad DRAM
//    bandwidth; cache-resident working sets (residual, softmax_rows, ...) can exceed 1.
// The of_* counters are plain fractions printed with a "/s" suffix (rate counters). OpenMP
// everywhere, so real (wall) time, after a short warm-up (thread pool, page faults, caches).
// Run: build/bench/kernels_bench [--benchmark_filter=Matmul] [--benchmark_min_time=0.5]
// Threads: OMP_NUM_THREADS (default: all cores).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <Eigen/Core>
#include <benchmark/benchmark.h>

#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/math.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"

namespace tf {
namespace {

constexpr int kB = 4, kT = 64, kN = kB * kT, kC = 768, kNH = 12, kMlp = 4 * kC;
constexpr int kV = 50257, kVp = 50304, kMaxT = 1024;
constexpr long kParams = 124'475'904;  // GPT-2 124M with the padded vocabulary
constexpr double kWarmUpSeconds = 0.05;

// ---- Ceilings -----------------------------------------------------------------------------------

struct CeilingRates {
  double sgemm_flops_per_s;   // Eigen float GEMM, 2048^3, all threads
  double stream_bytes_per_s;  // STREAM triad a = b + s*c over 3 x 128 MiB, all threads
};

template <typename F>
double BestSeconds(int reps, const F& f) {
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Measured once, on first use (a function-local static: thread-safe initialisation), and printed to
// stderr so the ceilings are on record next to the results.
const CeilingRates& Ceilings() {
  static const CeilingRates rates = [] {
    CeilingRates r{};
    {
      const int n = 2048;
      // Through the build's GEMM engine (cpu::matmul_forward: OpenBLAS or Eigen), as the model runs.
      Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
      const double s = BestSeconds(3, [&] { cpu::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n); });
      benchmark::DoNotOptimize(c.data());
      r.sgemm_flops_per_s = 2.0 * n * n * n / s;
    }
    {
      const long n = 1L << 25;  // 128 MiB per array: far beyond any last-level cache
      std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
      const double s = BestSeconds(5, [&] {
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
      });
      benchmark::DoNotOptimize(a.data());
      r.stream_bytes_per_s = 3.0 * sizeof(float) * n / s;
    }
    std::fprintf(stderr, "ceilings (%d OpenMP threads): SGEMM %.1f GFLOP/s (%s 2048^3), STREAM triad %.1f GB/s\n",
                 omp_get_max_threads(), r.sgemm_flops_per_s * 1e-9, cpu::gemm_engine_name(),
                 r.stream_bytes_per_s * 1e-9);
    return r;
  }();
  return rates;
}

void ReportFlops(benchmark::State& state, double flops_per_iter) {
  using benchmark::Counter;
  state.counters["GFLOP"] = Counter(flops_per_iter * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["of_sgemm_peak"] =
      Counter(flops_per_iter / Ceilings().sgemm_flops_per_s, Counter::kIsIterationInvariantRate);
}

void ReportBytes(benchmark::State& state, double bytes_per_iter) {
  using benchmark::Counter;
  state.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter * static_cast<double>(state.iterations())));
  state.counters["of_stream_bw"] =
      Counter(bytes_per_iter / Ceilings().stream_bytes_per_s, Counter::kIsIterationInvariantRate);
}

// ---- Inputs -------------------------------------------------------------------------------------

std::vector<float> Random(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
std::vector<int32_t> Tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
constexpr double kF = sizeof(float);

// ---- Plain SGEMM: the ceiling ------------------------------------------------------------------

// C (M,N) = A (M,K) B (K,N), Eigen float GEMM (column-major, multi-threaded with OpenMP).
void BM_EigenSgemm(benchmark::State& state) {
  const int M = static_cast<int>(state.range(0)), K = static_cast<int>(state.range(1)),
            N = static_cast<int>(state.range(2));
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(M, K), b = Eigen::MatrixXf::Random(K, N), c(M, N);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  ReportFlops(state, 2.0 * M * N * K);
}
BENCHMARK(BM_EigenSgemm)
    ->ArgNames({"M", "K", "N"})
    ->Args({1024, 1024, 1024})
    ->Args({2048, 2048, 2048})
    ->Args({kN, kC, 3 * kC})
    ->Args({kN, kC, kVp})
    ->UseRealTime()
    ->MinWarmUpTime(kWarmUpSeconds)
    ->Unit(benchmark::kMillisecond);

// ---- Encoder ------------------------------------------------------------------------------------

void BM_EncoderForward(benchmark::State& state) {
  const auto wte = Random(static_cast<size_t>(kVp) * kC, 0.02f, 1),
             wpe = Random(static_cast<size_t>(kMaxT) * kC, 0.01f, 2);
  const auto inp = Tokens(kN, kV, 3);
  std::vector<float> out(static_cast<size_t>(kN) * kC);
  for (auto _ : state) {
    cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), kB, kT, kC);
    benchmark::DoNotOptimize(out.data());
  }
  // Reads N rows of wte, T rows of wpe and the ids; writes out.
  ReportBytes(state, kF * (2.0 * kN * kC + kT * kC) + 4.0 * kN);
}
BENCHMARK(BM_EncoderForward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

void BM_EncoderBackward(benchmark::State& state) {
  const auto dout = Random(static_cast<size_t>(kN) * kC, 1.0f, 4);
  const auto inp = Tokens(kN, kV, 5);
  std::vector<float> dwte(static_cast<size_t>(kVp) * kC), dwpe(static_cast<size_t>(kMaxT) * kC);
  for (auto _ : state) {
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), kB, kT, kC);
    benchmark::DoNotOptimize(dwte.data());
  }
  // Reads dout; read-modify-writes N rows of dwte and T rows of dwpe.
  ReportBytes(state, kF * (kN * kC + 2.0 * kN * kC + 2.0 * kT * kC) + 4.0 * kN);
}
BENCHMARK(BM_EncoderBackward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

// ---- LayerNorm ----------------------------------------------------------------------------------

void BM_LayerNormForward(benchmark::State& state) {
  const auto inp = Random(static_cast<size_t>(kN) * kC, 1.0f, 6), w = Random(kC, 1.0f, 7), b = Random(kC, 0.1f, 8);
  std::vector<float> out(inp.size()), mean(kN), rstd(kN);
  for (auto _ : state) {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), kN, kC);
    benchmark::DoNotOptimize(out.data());
  }
  ReportBytes(state, kF * (2.0 * kN * kC + 2.0 * kC + 2.0 * kN));
}
BENCHMARK(BM_LayerNormForward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

void BM_LayerNormBackward(benchmark::State& state) {
  const auto inp = Random(static_cast<size_t>(kN) * kC, 1.0f, 9), w = Random(kC, 1.0f, 10), b = Random(kC, 0.1f, 11);
  const auto dout = Random(inp.size(), 1.0f, 12);
  std::vector<float> out(inp.size()), mean(kN), rstd(kN), dinp(inp.size()), dw(kC), db(kC);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), kN, kC);
  for (auto _ : state) {
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                            rstd.data(), kN, kC);
    benchmark::DoNotOptimize(dinp.data());
  }
  // Reads dout, inp, weight, mean, rstd; read-modify-writes dinp, dweight, dbias.
  ReportBytes(state, kF * (4.0 * kN * kC + 5.0 * kC + 2.0 * kN));
}
BENCHMARK(BM_LayerNormBackward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

// ---- Matmul -------------------------------------------------------------------------------------

// Args {N, C, OC, has_bias}: the four linear layers of a block and the (bias-free) LM head.
void MatmulShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "C", "OC", "bias"});
  b->Args({kN, kC, 3 * kC, 1});  // attention qkv
  b->Args({kN, kC, kC, 1});      // attention projection
  b->Args({kN, kC, kMlp, 1});    // MLP fc
  b->Args({kN, kMlp, kC, 1});    // MLP projection
  b->Args({kN, kC, kVp, 0});     // LM head (tied wte, padded vocabulary)
}

void BM_MatmulForward(benchmark::State& state) {
  const int N = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1)),
            OC = static_cast<int>(state.range(2));
  const bool has_bias = state.range(3) != 0;
  const auto inp = Random(static_cast<size_t>(N) * C, 1.0f, 13), w = Random(static_cast<size_t>(OC) * C, 0.02f, 14);
  const auto bias = Random(OC, 0.1f, 15);
  std::vector<float> out(static_cast<size_t>(N) * OC);
  for (auto _ : state) {
    cpu::matmul_forward(out.data(), inp.data(), w.data(), has_bias ? bias.data() : nullptr, N, C, OC);
    benchmark::DoNotOptimize(out.data());
  }
  ReportFlops(state, 2.0 * N * C * OC + (has_bias ? 1.0 * N * OC : 0.0));
}
BENCHMARK(BM_MatmulForward)
    ->Apply(MatmulShapes)
    ->UseRealTime()
    ->MinWarmUpTime(kWarmUpSeconds)
    ->Unit(benchmark::kMicrosecond);

void BM_MatmulBackward(benchmark::State& state) {
  const int N = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1)),
            OC = static_cast<int>(state.range(2));
  const bool has_bias = state.range(3) != 0;
  const auto inp = Random(static_cast<size_t>(N) * C, 1.0f, 16), w = Random(static_cast<size_t>(OC) * C, 0.02f, 17);
  const auto dout = Random(static_cast<size_t>(N) * OC, 1.0f, 18);
  std::vector<float> dinp(inp.size()), dw(w.size()), dbias(OC);
  for (auto _ : state) {
    cpu::matmul_backward(dinp.data(), dw.data(), has_bias ? dbias.data() : nullptr, dout.data(), inp.data(), w.data(),
                         N, C, OC);
    benchmark::DoNotOptimize(dw.data());
  }
  // Two GEMMs (dinp += dout w, dweight += dout^T inp) of 2*N*C*OC each, plus the column sums.
  ReportFlops(state, 4.0 * N * C * OC + (has_bias ? 1.0 * N * OC : 0.0));
}
BENCHMARK(BM_MatmulBackward)
    ->Apply(MatmulShapes)
    ->UseRealTime()
    ->MinWarmUpTime(kWarmUpSeconds)
    ->Unit(benchmark::kMicrosecond);

// ---- Attention ----------------------------------------------------------------------------------

// The kernels compute full T x T score/probability products per head (the causal mask is
// applied afterwards), so the executed FLOPs are: forward q k^T and P v, 2 * 2 T^2 hs per head
// = 4 B T^2 C; backward dv, dP, dq, dk, 4 * 2 T^2 hs per head = 8 B T^2 C. (Half of that is
// useful under the causal mask.)
void BM_AttentionForward(benchmark::State& state) {
  const auto qkv = Random(static_cast<size_t>(kN) * 3 * kC, 1.0f, 19);
  std::vector<float> out(static_cast<size_t>(kN) * kC), att(static_cast<size_t>(kB) * kNH * kT * kT);
  for (auto _ : state) {
    cpu::attention_forward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
    benchmark::DoNotOptimize(out.data());
  }
  ReportFlops(state, 4.0 * kB * kT * kT * kC);
}
BENCHMARK(BM_AttentionForward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

void BM_AttentionBackward(benchmark::State& state) {
  const auto qkv = Random(static_cast<size_t>(kN) * 3 * kC, 1.0f, 20);
  const auto dout = Random(static_cast<size_t>(kN) * kC, 1.0f, 21);
  std::vector<float> out(dout.size()), att(static_cast<size_t>(kB) * kNH * kT * kT), dqkv(qkv.size());
  std::vector<float> scratch(static_cast<size_t>(cpu::attention_scratch_floats(kT)));
  cpu::attention_forward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  for (auto _ : state) {
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), kB, kT, kC, kNH, scratch.data(),
                            static_cast<long>(scratch.size()));
    benchmark::DoNotOptimize(dqkv.data());
  }
  ReportFlops(state, 8.0 * kB * kT * kT * kC);
}
BENCHMARK(BM_AttentionBackward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

// ---- Element-wise -------------------------------------------------------------------------------

void BM_GeluForward(benchmark::State& state) {
  const long n = static_cast<long>(kN) * kMlp;
  const auto inp = Random(n, 3.0f, 22);
  std::vector<float> out(n);
  for (auto _ : state) {
    cpu::gelu_forward(out.data(), inp.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  ReportBytes(state, kF * 2.0 * n);
}
BENCHMARK(BM_GeluForward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

void BM_GeluBackward(benchmark::State& state) {
  const long n = static_cast<long>(kN) * kMlp;
  const auto inp = Random(n, 3.0f, 23), dout = Random(n, 1.0f, 24);
  std::vector<float> dinp(n);
  for (auto _ : state) {
    cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), n);
    benchmark::DoNotOptimize(dinp.data());
  }
  ReportBytes(state, kF * 3.0 * n);
}
BENCHMARK(BM_GeluBackward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

void BM_ResidualForward(benchmark::State& state) {
  const long n = static_cast<long>(kN) * kC;
  const auto a = Random(n, 1.0f, 25), b = Random(n, 1.0f, 26);
  std::vector<float> out(n);
  for (auto _ : state) {
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  ReportBytes(state, kF * 3.0 * n);
}
BENCHMARK(BM_ResidualForward)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

void BM_Accumulate(benchmark::State& state) {
  const long n = static_cast<long>(kN) * kC;
  const auto src = Random(n, 1.0f, 27);
  std::vector<float> dst(n);
  for (auto _ : state) {
    cpu::accumulate(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
  }
  ReportBytes(state, kF * 3.0 * n);  // read src, read-modify-write dst
}
BENCHMARK(BM_Accumulate)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

// ---- Classifier ---------------------------------------------------------------------------------

// Arg: 1 = loss and gradient (the training step), 0 = loss only (dloss = 0, evaluation).
// With the gradient the logits are overwritten in place, so later iterations run on the previous
// gradient; the work (V exps per row, three passes) does not depend on the values.
void BM_CrossEntropy(benchmark::State& state) {
  const bool with_grad = state.range(0) != 0;
  auto logits = Random(static_cast<size_t>(kN) * kVp, 5.0f, 28);
  const auto targets = Tokens(kN, kV, 29);
  std::vector<float> losses(kN);
  for (auto _ : state) {
    cpu::crossentropy_forward_backward(logits.data(), losses.data(), targets.data(), kN, kV, kVp,
                                       with_grad ? 1.0f / kN : 0.0f);
    benchmark::DoNotOptimize(losses.data());
    benchmark::DoNotOptimize(logits.data());
  }
  ReportBytes(state, kF * (1.0 * kN * kV + (with_grad ? 1.0 * kN * kVp : 0.0) + kN) + 4.0 * kN);
}
BENCHMARK(BM_CrossEntropy)
    ->ArgName("grad")
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime()
    ->MinWarmUpTime(kWarmUpSeconds)
    ->Unit(benchmark::kMicrosecond);

// Sampling: one row per sequence (the last position of each of the B sequences).
void BM_SoftmaxRows(benchmark::State& state) {
  const auto logits = Random(static_cast<size_t>(kB) * kVp, 5.0f, 30);
  std::vector<float> probs(static_cast<size_t>(kB) * kV);
  for (auto _ : state) {
    cpu::softmax_rows(probs.data(), logits.data(), kB, kV, kVp, 0.8f);
    benchmark::DoNotOptimize(probs.data());
  }
  ReportBytes(state, kF * 2.0 * kB * kV);
}
BENCHMARK(BM_SoftmaxRows)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMicrosecond);

// ---- Optimizer (all 124M parameters: DRAM-bound) ------------------------------------------------

void BM_SumSquares(benchmark::State& state) {
  const std::vector<float> g(kParams, 1e-3f);  // values do not change the work
  for (auto _ : state) benchmark::DoNotOptimize(cpu::sum_squares(g.data(), kParams));
  ReportBytes(state, kF * kParams);
}
BENCHMARK(BM_SumSquares)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMillisecond);

void BM_AdamW(benchmark::State& state) {
  std::vector<float> p(kParams, 0.02f), m(kParams, 0.0f), v(kParams, 0.0f);
  const std::vector<float> g(kParams, 1e-3f);
  const math::AdamWParams h{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};  // step 1's bias corrections
  for (auto _ : state) {
    cpu::adamw_step(p.data(), m.data(), v.data(), g.data(), kParams, 1.0f, h);
    benchmark::DoNotOptimize(p.data());
  }
  // Read-modify-writes p, m, v; reads g.
  ReportBytes(state, kF * 7.0 * kParams);
}
BENCHMARK(BM_AdamW)->UseRealTime()->MinWarmUpTime(kWarmUpSeconds)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tf
