// Throughput of the CUDA gradient codecs (comm/codec.cu) on one 25 MiB bucket of fp32 gradients
// (6,553,600 values; PyTorch DDP's default bucket_cap_mb), against the device's measured copy
// bandwidth. The same benchmarks and counters as bench/codec_bench.cpp:
//  * BM_CudaCodecEncode/<spec>: Encode with error feedback (a residual), as the reducer runs it;
//    BM_CudaCodecDecode/<spec>: DecodeAccumulate (scale 1/world) of one encoding into fp32.
//  * bytes_per_second: fp32 gradient bytes handled per second (4 n per iteration);
//  * "of_copy_bw": compulsory traffic per second / the device-to-device cudaMemcpy bandwidth (2 x
//    bytes / time over 1 GiB, measured once per process, printed to stderr). Traffic: encode
//    12 n + EncodedBytes (reads x and r, writes r and the encoding), decode 8 n + EncodedBytes
//    (topk: 8 bytes per sent element instead of 8 n). A rate counter ("/s" suffix), a plain fraction;
//  * "ratio": CompressionRatio.
// Timing: CUDA events around each launch (UseManualTime), after a few warm-up launches. Without a
// device every benchmark reports "no CUDA device" and is skipped.
//
// Run: build/bench/codec_cuda_bench [--benchmark_filter=topk] [--benchmark_min_time=0.5s]
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "comm/codec.h"
#include "kernels/cuda_runtime.h"

namespace tf {
namespace {

using cuda::DeviceBuffer;

constexpr long kN = 25 * 1024 * 1024 / 4;  // one 25 MiB bucket of fp32 gradients
constexpr int kWarmUpLaunches = 3;
const char* const kSpecs[] = {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:0.1"};

// Device-to-device copy bandwidth (bytes read + written per second), best of 5 copies of 1 GiB
// after one warm-up copy. 0 if it cannot be measured.
double CopyBandwidth() {
  static const double rate = [] {
    const size_t bytes = size_t(1) << 30;
    auto a = DeviceBuffer::Allocate(bytes), b = DeviceBuffer::Allocate(bytes);
    if (!a.ok() || !b.ok()) return 0.0;
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    float best_ms = 1e30f;
    for (int r = 0; r < 6; ++r) {
      cudaEventRecord(start, nullptr);
      cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, nullptr);
      cudaEventRecord(stop, nullptr);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      if (r > 0) best_ms = std::min(best_ms, ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    const double r = 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
    std::fprintf(stderr, "ceiling: %s, device-to-device copy %.1f GB/s\n", cuda::DeviceDescription(0).c_str(),
                 r * 1e-9);
    return r;
  }();
  return rate;
}

bool SkipWithoutDevice(benchmark::State& state) {
  if (cuda::DeviceCount() > 0) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

bool Failed(benchmark::State& state, const Status& s) {
  if (s.ok()) return false;
  state.SkipWithError(s.ToString().c_str());
  return true;
}

// Times `launch` (enqueues on the default stream, returns a Status) with CUDA events, after a few
// warm-up launches.
template <typename F>
void TimeLaunches(benchmark::State& state, F&& launch) {
  for (int i = 0; i < kWarmUpLaunches; ++i) {
    if (Failed(state, launch())) return;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    state.SkipWithError("warm-up failed");
    return;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, nullptr);
    const Status s = launch();
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    if (Failed(state, s)) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void Report(benchmark::State& state, const comm::CodecConfig& c, double traffic_bytes) {
  using benchmark::Counter;
  state.SetBytesProcessed(static_cast<int64_t>(4.0 * kN * static_cast<double>(state.iterations())));
  const double ceiling = CopyBandwidth();
  if (ceiling > 0) state.counters["of_copy_bw"] = Counter(traffic_bytes / ceiling, Counter::kIsIterationInvariantRate);
  state.counters["ratio"] = comm::CompressionRatio(c, kN);
}

// n fp32 values N(0, scale) on the device.
StatusOr<DeviceBuffer> RandomDevice(long n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> h(static_cast<size_t>(n));
  for (float& x : h) x = dist(rng);
  TF_ASSIGN_OR_RETURN(DeviceBuffer d, DeviceBuffer::Allocate(h.size() * sizeof(float)));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

#define TF_BENCH_ASSIGN(var, expr)              \
  auto var##_or = (expr);                       \
  if (Failed(state, var##_or.status())) return; \
  DeviceBuffer var = std::move(var##_or).value()

void BM_CudaCodecEncode(benchmark::State& state, const std::string& spec) {
  if (SkipWithoutDevice(state)) return;
  auto c = comm::ParseCodec(spec);
  if (Failed(state, c.status())) return;
  CopyBandwidth();  // measured before timing starts
  const size_t bytes = comm::EncodedBytes(*c, kN);
  TF_BENCH_ASSIGN(x, RandomDevice(kN, 1e-3f, 1));
  TF_BENCH_ASSIGN(r, RandomDevice(kN, 1e-4f, 2));
  TF_BENCH_ASSIGN(out, DeviceBuffer::Allocate(bytes));
  uint64_t seed = 0;
  TimeLaunches(state,
               [&] { return comm::cuda::Encode(*c, x.as<float>(), r.as<float>(), kN, out.data(), ++seed, nullptr); });
  Report(state, *c, 12.0 * kN + static_cast<double>(bytes));
}

void BM_CudaCodecDecode(benchmark::State& state, const std::string& spec) {
  if (SkipWithoutDevice(state)) return;
  auto c = comm::ParseCodec(spec);
  if (Failed(state, c.status())) return;
  CopyBandwidth();
  const size_t bytes = comm::EncodedBytes(*c, kN);
  TF_BENCH_ASSIGN(x, RandomDevice(kN, 1e-3f, 3));
  TF_BENCH_ASSIGN(acc, RandomDevice(kN, 1e-3f, 4));
  TF_BENCH_ASSIGN(enc, DeviceBuffer::Allocate(bytes));
  if (Failed(state, comm::cuda::Encode(*c, x.as<float>(), nullptr, kN, enc.data(), 0, nullptr))) return;
  TimeLaunches(state,
               [&] { return comm::cuda::DecodeAccumulate(*c, enc.data(), kN, 0.125f, acc.as<float>(), nullptr); });
  const double touched = c->sparse() ? 8.0 * static_cast<double>(comm::TopKPairs(*c, kN)) : 8.0 * kN;
  Report(state, *c, touched + static_cast<double>(bytes));
}

const bool kRegistered = [] {
  for (const char* spec : kSpecs) {
    benchmark::RegisterBenchmark((std::string("BM_CudaCodecEncode/") + spec).c_str(), BM_CudaCodecEncode,
                                 std::string(spec))
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("BM_CudaCodecDecode/") + spec).c_str(), BM_CudaCodecDecode,
                                 std::string(spec))
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace tf
