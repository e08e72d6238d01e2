// Throughput of the CPU gradient codecs (comm/codec.h) on one 25 MiB bucket of fp32 gradients
// (6,553,600 values; PyTorch DDP's default bucket_cap_mb), against the measured memory bandwidth.
// BM_CodecEncode/<spec>: Encode with a residual, as the reducer runs it; BM_CodecDecode/<spec>:
// DecodeAccumulate (scale 1/world) of one encoding into an fp32 buffer. Reported:
//  * bytes_per_second: fp32 gradient bytes handled (4 n per iteration), to compare across codecs
//    and with the network's bandwidth;
//  * "of_stream_bw": compulsory traffic / the STREAM-triad bandwidth (measured once, printed to
//    stderr; a plain fraction shown with "/s"): encode 12 n + EncodedBytes, decode 8 n +
//    EncodedBytes (topk touches only the sent elements' acc: latency-bound, low by construction);
//  * "ratio": CompressionRatio, uncompressed / encoded bytes.
// OpenMP inside the codecs, so real (wall) time, after a warm-up (page faults, thread pool, caches).
// Run: build/bench/codec_bench [--benchmark_filter=int8] [--benchmark_min_time=0.5s]
// Threads: OMP_NUM_THREADS (default: all cores).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "comm/codec.h"

namespace tf {
namespace {

constexpr int64_t kN = 25 * 1024 * 1024 / 4;  // one 25 MiB bucket of fp32 gradients
constexpr double kWarmUpSeconds = 0.05;
const char* const kSpecs[] = {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:0.1"};

// STREAM triad a = b + s c over 3 x 128 MiB with all OpenMP threads, best of 5 after a warm-up:
// bytes read + written per second. Measured once, on first use.
double StreamBandwidth() {
  static const double rate = [] {
    const long n = 1L << 25;  // 128 MiB per array: far beyond any last-level cache
    std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
    auto triad = [&] {
#pragma omp parallel for schedule(static)
      for (long i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    };
    triad();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      triad();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    benchmark::DoNotOptimize(a.data());
    const double bw = 3.0 * sizeof(float) * n / best;
    std::fprintf(stderr, "ceiling (%d OpenMP threads): STREAM triad %.1f GB/s\n", omp_get_max_threads(), bw * 1e-9);
    return bw;
  }();
  return rate;
}

std::vector<float> Gradients(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

void Report(benchmark::State& state, const comm::CodecConfig& c, double traffic_bytes) {
  using benchmark::Counter;
  state.SetBytesProcessed(static_cast<int64_t>(4.0 * kN * static_cast<double>(state.iterations())));
  state.counters["of_stream_bw"] = Counter(traffic_bytes / StreamBandwidth(), Counter::kIsIterationInvariantRate);
  state.counters["ratio"] = comm::CompressionRatio(c, kN);
}

// The timed loop (warm-up: MinWarmUpTime at registration).
template <typename F>
void Run(benchmark::State& state, F&& f) {
  for (auto _ : state) {
    f();
    benchmark::ClobberMemory();
  }
}

void BM_CodecEncode(benchmark::State& state, const std::string& spec) {
  auto c = comm::ParseCodec(spec);
  if (!c.ok()) {
    state.SkipWithError(c.status().ToString().c_str());
    return;
  }
  StreamBandwidth();  // measured before timing starts
  const auto x = Gradients(kN, 1e-3f, 1);
  auto r = Gradients(kN, 1e-4f, 2);
  const size_t bytes = comm::EncodedBytes(*c, kN);
  std::vector<uint8_t> out(bytes);
  uint64_t seed = 0;
  Run(state, [&] { comm::Encode(*c, x.data(), r.data(), kN, out.data(), ++seed); });
  Report(state, *c, 12.0 * kN + static_cast<double>(bytes));
}

void BM_CodecDecode(benchmark::State& state, const std::string& spec) {
  auto c = comm::ParseCodec(spec);
  if (!c.ok()) {
    state.SkipWithError(c.status().ToString().c_str());
    return;
  }
  StreamBandwidth();
  const auto x = Gradients(kN, 1e-3f, 3);
  const size_t bytes = comm::EncodedBytes(*c, kN);
  std::vector<uint8_t> enc(bytes);
  comm::Encode(*c, x.data(), nullptr, kN, enc.data(), 0);
  std::vector<float> acc(static_cast<size_t>(kN), 0.0f);
  Run(state, [&] { comm::DecodeAccumulate(*c, enc.data(), kN, 0.125f, acc.data()); });
  const double touched = c->sparse() ? 8.0 * static_cast<double>(comm::TopKPairs(*c, kN)) : 8.0 * kN;
  Report(state, *c, touched + static_cast<double>(bytes));
}

const bool kRegistered = [] {
  for (const char* spec : kSpecs) {
    benchmark::RegisterBenchmark((std::string("BM_CodecEncode/") + spec).c_str(), BM_CodecEncode, std::string(spec))
        ->UseRealTime()
        ->MinWarmUpTime(kWarmUpSeconds)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("BM_CodecDecode/") + spec).c_str(), BM_CodecDecode, std::string(spec))
        ->UseRealTime()
        ->MinWarmUpTime(kWarmUpSeconds)
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
}  // namespace tf
