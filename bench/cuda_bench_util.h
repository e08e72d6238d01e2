// Shared harness of the CUDA benchmarks (bench/*_cuda_bench.cpp): skipping without a device,
// reporting a failed Status as a skipped benchmark, random device inputs, CUDA-event timing with
// warm-up, and the two ceilings the benchmarks report against (device-to-device copy bandwidth for
// memory-bound kernels, a measured cuBLASLt GEMM for compute-bound ones).
//
// Header-only, for benchmark binaries only (one translation unit each); needs the CUDA backend.
// Timing is on the given stream (nullptr: the legacy default stream) with CUDA events, so it
// measures GPU time between two events, not host time. Every helper reports failure as a Status
// or as SkipWithError on the benchmark state; none aborts.
// Ownership: DeviceBuffer and the Buffers / EventPair holders own their device resources and are
// not copyable. The measured ceilings and the shared CublasContext are process-wide, created on
// first use and kept until exit. Thread safety: none beyond function-local static initialisation;
// Google Benchmark runs the benchmarks of a binary on one thread.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include "base/float16.h"
#include "kernels/cublas_handle.h"
#include "kernels/cuda_runtime.h"
#include "kernels/matmul.h"
#include "base/status.h"

namespace tf::bench {

// Untimed calls before any measurement (clocks, caches, cuBLASLt heuristics).
constexpr int kWarmUpCalls = 3;
// Back-to-back calls between the two events of one TimeFlopRate measurement, so that each call's
// host work overlaps the previous call's kernels, as it does in training.
constexpr int kCallsPerTiming = 5;
// Elements drawn from the random generator by RandomDevice / FillRandom before the pattern repeats.
constexpr size_t kRandomPattern = size_t{1} << 20;
// Side of the square GEMM that GemmPeakFlops times.
constexpr int kPeakGemmSize = 8192;

// ---- Skipping -------------------------------------------------------------------------------------

// Skips the benchmark with "no CUDA device" when there is none; true if it did.
inline bool SkipWithoutDevice(benchmark::State& state) {
  if (cuda::DeviceCount() > 0) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

// Reports a failed Status (or allocation) as a skipped benchmark; true if it failed.
inline bool Failed(benchmark::State& state, const Status& s) {
  if (s.ok()) return false;
  state.SkipWithError(s.ToString().c_str());
  return true;
}

// The process's CublasContext on the default stream, created on first use (the device is printed
// to stderr); nullptr without a device or if creation failed (reported on stderr).
inline cuda::CublasContext* DefaultContext() {
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

// DefaultContext(), or nullptr after skipping the benchmark with "no CUDA device".
inline cuda::CublasContext* ContextOrSkip(benchmark::State& state) {
  cuda::CublasContext* ctx = DefaultContext();
  if (ctx == nullptr) state.SkipWithError("no CUDA device");
  return ctx;
}

// ---- Inputs ---------------------------------------------------------------------------------------

// Fills n elements of dt at dst (device memory) with N(0, scale^2) values: the first
// min(n, pattern) drawn from mt19937(seed), uploaded once, then repeated by doubling
// device-to-device copies (pattern >= n: every value drawn). REQUIRES: pattern > 0.
inline Status FillRandom(void* dst, size_t n, cuda::DType dt, float scale, uint32_t seed,
                         size_t pattern = kRandomPattern) {
  if (n == 0) return Status::OK();
  const size_t es = cuda::DTypeSize(dt);
  const size_t block = std::min(n, pattern);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> f(block);
  for (float& x : f) x = dist(rng);
  char* d = static_cast<char*>(dst);
  if (dt == cuda::DType::kF32) {
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(d, f.data(), block * es, cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> h(block);
    for (size_t i = 0; i < block; ++i) h[i] = FloatToBf16(f[i]);
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(d, h.data(), block * es, cudaMemcpyHostToDevice));
  }
  for (size_t done = block; done < n;) {
    const size_t chunk = std::min(done, n - done);
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(d + done * es, d, chunk * es, cudaMemcpyDeviceToDevice));
    done += chunk;
  }
  return Status::OK();
}

// A new device buffer of n elements of dt filled as FillRandom does.
inline StatusOr<cuda::DeviceBuffer> RandomDevice(size_t n, cuda::DType dt, float scale, uint32_t seed,
                                                 size_t pattern = kRandomPattern) {
  TF_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::Allocate(n * cuda::DTypeSize(dt)));
  TF_RETURN_IF_ERROR(FillRandom(buf.data(), n, dt, scale, seed, pattern));
  return buf;
}

// Device buffers for one benchmark, allocated one after another; the first failure is kept in
// `status` (later calls then return nullptr) so that the caller checks once. Every random buffer
// uses the same seed (42), scaled.
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
  void* Add(size_t n, cuda::DType dt, float scale) {
    void* p = AddBytes(n * cuda::DTypeSize(dt));
    if (p != nullptr && scale != 0.0f) status = FillRandom(p, n, dt, scale, 42);
    return p;
  }
};

// Unwraps a StatusOr<DeviceBuffer> into a new DeviceBuffer `var`, or skips the benchmark and
// returns. REQUIRES: a `benchmark::State& state` in scope, inside a function returning void.
#define TF_BENCH_ASSIGN(var, expr)                                   \
  auto var##_or = (expr);                                            \
  if (::tf::bench::Failed(state, var##_or.status())) return;         \
  ::tf::cuda::DeviceBuffer var = std::move(var##_or).value()

// ---- Timing ---------------------------------------------------------------------------------------

// A start and a stop event, destroyed with the holder.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Times `launch` (enqueues kernel(s) on the default stream, returns a Status) with CUDA events
// around each single launch as the iteration's manual time, after kWarmUpCalls launches and a
// device synchronisation. A failed launch skips the benchmark.
template <typename F>
void TimeLaunches(benchmark::State& state, F&& launch) {
  for (int i = 0; i < kWarmUpCalls; ++i) {
    if (Failed(state, launch())) return;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    state.SkipWithError("warm-up failed");
    return;
  }
  EventPair ev;
  for (auto _ : state) {
    cudaEventRecord(ev.start, nullptr);
    const Status s = launch();
    cudaEventRecord(ev.stop, nullptr);
    cudaEventSynchronize(ev.stop);
    if (Failed(state, s)) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, ev.start, ev.stop);
    state.SetIterationTime(ms * 1e-3);
  }
}

// Seconds per call of op (enqueues on `stream`, returns a Status), best of `measurements` timings
// of `calls_per_measurement` back-to-back calls each, after kWarmUpCalls calls.
// REQUIRES: measurements >= 1, calls_per_measurement >= 1.
template <typename Op>
StatusOr<double> BestSecondsPerCall(cudaStream_t stream, int measurements, int calls_per_measurement,
                                    const Op& op) {
  EventPair ev;
  for (int i = 0; i < kWarmUpCalls; ++i) TF_RETURN_IF_ERROR(op());
  double best = 1e30;
  for (int r = 0; r < measurements; ++r) {
    TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start, stream));
    for (int i = 0; i < calls_per_measurement; ++i) TF_RETURN_IF_ERROR(op());
    TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop, stream));
    TF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.stop));
    float ms = 0;
    TF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    best = std::min(best, ms * 1e-3 / calls_per_measurement);
  }
  return best;
}

// Times op (enqueues on `stream`, returns a Status) with CUDA events around kCallsPerTiming
// back-to-back calls per iteration (manual time), after kWarmUpCalls calls, and sets the counters
// "TFLOP/s" (flops_per_call x calls / GPU seconds), "peak_TFLOP/s" (peak_flops) and, when
// peak_flops > 0, "of_peak". A failed call skips the benchmark.
template <typename Op>
void TimeFlopRate(benchmark::State& state, cudaStream_t stream, double flops_per_call, double peak_flops,
                  const Op& op) {
  EventPair ev;
  for (int i = 0; i < kWarmUpCalls; ++i) {
    if (Failed(state, op())) return;
  }
  double seconds = 0;
  long calls = 0;
  for (auto _ : state) {
    Status st;
    if (cudaEventRecord(ev.start, stream) != cudaSuccess) st = Status(StatusCode::kInternal, "cudaEventRecord");
    for (int i = 0; i < kCallsPerTiming && st.ok(); ++i) st = op();
    float ms = 0;
    if (st.ok() && (cudaEventRecord(ev.stop, stream) != cudaSuccess || cudaEventSynchronize(ev.stop) != cudaSuccess ||
                    cudaEventElapsedTime(&ms, ev.start, ev.stop) != cudaSuccess)) {
      st = Status(StatusCode::kInternal, "CUDA event timing failed");
    }
    if (Failed(state, st)) break;
    state.SetIterationTime(ms * 1e-3);
    seconds += ms * 1e-3;
    calls += kCallsPerTiming;
  }
  if (calls == 0 || seconds <= 0) return;
  const double rate = flops_per_call * calls / seconds;
  state.counters["TFLOP/s"] = rate / 1e12;
  state.counters["peak_TFLOP/s"] = peak_flops / 1e12;
  if (peak_flops > 0) state.counters["of_peak"] = rate / peak_flops;
}

// ---- Ceilings -------------------------------------------------------------------------------------

// Device-to-device copy bandwidth (bytes read + written per second): best of 5 copies of 1 GiB
// after one warm-up copy, measured once per process and printed to stderr. 0 if it cannot be
// measured.
inline double CopyBandwidth() {
  static const double rate = [] {
    StatusOr<double> r = cuda::MeasureCopyBandwidth();
    if (!r.ok()) return 0.0;
    std::fprintf(stderr, "ceiling: %s, device-to-device copy %.1f GB/s\n", cuda::DeviceDescription(0).c_str(),
                 *r * 1e-9);
    return *r;
  }();
  return rate;
}

// Sets bytes_per_second from `processed_bytes` per iteration and the rate counter "of_copy_bw" =
// `traffic_bytes` per iteration / CopyBandwidth() (a plain fraction of the ceiling that the console
// prints with a "/s" suffix; absent if the ceiling could not be measured).
inline void ReportBytes(benchmark::State& state, double processed_bytes, double traffic_bytes) {
  using benchmark::Counter;
  state.SetBytesProcessed(static_cast<int64_t>(processed_bytes * static_cast<double>(state.iterations())));
  const double ceiling = CopyBandwidth();
  if (ceiling > 0) state.counters["of_copy_bw"] = Counter(traffic_bytes / ceiling, Counter::kIsIterationInvariantRate);
}
// The same with the compulsory traffic as the bytes processed.
inline void ReportBytes(benchmark::State& state, double bytes) { ReportBytes(state, bytes, bytes); }

// Peak FLOP/s for dt: a square kPeakGemmSize GEMM through cuda::matmul_forward (cuBLASLt, no
// bias), BestSecondsPerCall of 5 measurements of `calls_per_measurement` calls. Measured once per
// dtype and process (the first caller's calls_per_measurement wins) and printed to stderr; 0 if it
// fails (the reason is printed). REQUIRES: calls_per_measurement >= 1.
inline double GemmPeakFlops(cuda::CublasContext& ctx, cuda::DType dt, int calls_per_measurement) {
  static double peak[2] = {-1, -1};
  double& p = peak[dt == cuda::DType::kF32 ? 0 : 1];
  if (p >= 0) return p;
  p = 0;
  const size_t n = size_t(kPeakGemmSize) * kPeakGemmSize;
  Buffers buf;
  void* a = buf.Add(n, dt, 1.0f);
  void* b = buf.Add(n, dt, 1.0f);
  void* c = buf.Add(n, dt, 0.0f);
  if (!buf.status.ok()) {
    std::fprintf(stderr, "peak GEMM: %s\n", buf.status.ToString().c_str());
    return p;
  }
  auto s = BestSecondsPerCall(ctx.stream(), 5, calls_per_measurement, [&] {
    return cuda::matmul_forward(ctx, c, a, b, nullptr, kPeakGemmSize, kPeakGemmSize, kPeakGemmSize, dt);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "peak GEMM: %s\n", s.status().ToString().c_str());
    return p;
  }
  p = 2.0 * kPeakGemmSize * double(kPeakGemmSize) * kPeakGemmSize / *s;
  std::fprintf(stderr, "peak (%s, %d^3 cuBLASLt GEMM): %.1f TFLOP/s\n", cuda::DTypeName(dt), kPeakGemmSize,
               p / 1e12);
  return p;
}

}  // namespace tf::bench
