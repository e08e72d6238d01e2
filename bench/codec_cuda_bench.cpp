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

#include <cstdint>
#include <string>

#include "bench/cuda_bench_util.h"
#include "comm/codec.h"
#include "kernels/cuda_runtime.h"

namespace tf {
namespace {

using bench::CopyBandwidth;
using bench::Failed;
using bench::SkipWithoutDevice;
using bench::TimeLaunches;
using cuda::DeviceBuffer;

constexpr long kN = 25 * 1024 * 1024 / 4;  // one 25 MiB bucket of fp32 gradients
const char* const kSpecs[] = {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01", "topk:0.1"};

// bytes_per_second counts the 4 n fp32 gradient bytes; of_copy_bw the compulsory traffic.
void Report(benchmark::State& state, const comm::CodecConfig& c, double traffic_bytes) {
  bench::ReportBytes(state, 4.0 * kN, traffic_bytes);
  state.counters["ratio"] = comm::CompressionRatio(c, kN);
}

// n fp32 values N(0, scale) on the device, every one drawn (no repeated pattern).
StatusOr<DeviceBuffer> RandomDevice(long n, float scale, uint32_t seed) {
  return bench::RandomDevice(static_cast<size_t>(n), cuda::DType::kF32, scale, seed, static_cast<size_t>(n));
}

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
