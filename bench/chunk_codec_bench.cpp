// Throughput and compression ratio of the checkpoint chunk codecs (checkpoint/chunk_codec.h) on one
// 16 MiB chunk (4,194,304 fp32 values), single-threaded as the checkpoint writer runs them.
// Data: "weights" N(0, 0.02); "adam-v" AdamW's second moment after 10 steps; "w10" the weights
// after 10 AdamW steps (lr 1e-4, wd 0.1), delta-coded against "weights".
//  * BM_Encode/<encoding>/<data>/<zstd level>: EncodeChunkAs (level -131072 is the default,
//    kChunkFastestZstdLevel); BM_EncodeChunk/...: EncodeChunk, which with a base tries planes and
//    the XOR delta and keeps the smaller; BM_Decode/...: DecodeChunk.
//  * bytes_per_second: fp32 input bytes (encode) or output bytes (decode) per second;
//  * "of_memcpy": that rate / one thread's memcpy rate on 16 MiB buffers (measured once, printed
//    to stderr) — the ceiling for anything that must at least read its input and write its output;
//  * "ratio": 4n / encoded bytes.
// Run: build/bench/chunk_codec_bench [--benchmark_filter=xor] [--benchmark_min_time=0.5s]
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/chunk_codec.h"

namespace tf::checkpoint {
namespace {

constexpr size_t kN = size_t{4} << 20;  // 16 MiB of fp32
constexpr double kWarmUpSeconds = 0.1;

// One thread's memcpy rate (bytes copied per second) on a chunk's 16 MiB — the benchmarks' own
// working set, so the same caches — best of 20 after a warm-up.
double MemcpyRate() {
  static const double rate = [] {
    const size_t bytes = 4 * kN;
    std::vector<char> a(bytes, 1), b(bytes, 2);
    std::memcpy(b.data(), a.data(), bytes);
    double best = 1e30;
    for (int r = 0; r < 20; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), bytes);
      benchmark::DoNotOptimize(b.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::fprintf(stderr, "ceiling (1 thread): memcpy %.1f GB/s\n", bytes / best * 1e-9);
    return bytes / best;
  }();
  return rate;
}

struct Data {
  std::vector<float> weights, w10, adam_v;
};

const Data& TestData() {
  static const Data d = [] {
    Data d;
    std::mt19937 rng(1);
    std::normal_distribution<float> init(0.0f, 0.02f), grad(0.0f, 1e-3f);
    d.weights.resize(kN);
    for (float& x : d.weights) x = init(rng);
    std::vector<float> mean(kN), m(kN, 0.0f), v(kN, 0.0f);
    for (float& g : mean) g = grad(rng);
    d.w10 = d.weights;
    const float lr = 1e-4f;
    for (int s = 1; s <= 10; ++s) {
      const float bc1 = 1.0f - std::pow(0.9f, static_cast<float>(s));
      const float bc2 = 1.0f - std::pow(0.95f, static_cast<float>(s));
      for (size_t i = 0; i < kN; ++i) {
        const float g = mean[i] + grad(rng);
        m[i] = 0.9f * m[i] + 0.1f * g;
        v[i] = 0.95f * v[i] + 0.05f * g * g;
        d.w10[i] -= lr * ((m[i] / bc1) / (std::sqrt(v[i] / bc2) + 1e-8f) + 0.1f * d.w10[i]);
      }
    }
    d.adam_v = std::move(v);
    return d;
  }();
  return d;
}

// A chunk and its base, as members of TestData() (generated on first use, not at registration).
struct Case {
  const char* name;
  std::vector<float> Data::*data;
  std::vector<float> Data::*base;  // null: no base
};

std::span<const float> Chunk(const Case& c) { return TestData().*c.data; }
std::span<const float> Base(const Case& c) {
  return c.base != nullptr ? std::span<const float>(TestData().*c.base) : std::span<const float>();
}

void Report(benchmark::State& state, size_t encoded_bytes) {
  using benchmark::Counter;
  state.SetBytesProcessed(static_cast<int64_t>(4 * kN * state.iterations()));
  state.counters["of_memcpy"] = Counter(4.0 * kN / MemcpyRate(), Counter::kIsIterationInvariantRate);
  state.counters["ratio"] = 4.0 * kN / static_cast<double>(encoded_bytes);
}

void BM_Encode(benchmark::State& state, ChunkEncoding e, Case c, int level) {
  MemcpyRate();  // and the data, before timing starts
  TestData();
  const ChunkCodecOptions o{.zstd_level = level};
  size_t bytes = 0;
  for (auto _ : state) {
    auto enc = EncodeChunkAs(e, Chunk(c), Base(c), o);
    if (!enc.ok()) {
      state.SkipWithError(enc.status().ToString().c_str());
      return;
    }
    bytes = enc->size();
    benchmark::DoNotOptimize(enc->data());
  }
  Report(state, bytes);
}

void BM_EncodeChunk(benchmark::State& state, Case c, int level) {
  MemcpyRate();  // and the data, before timing starts
  TestData();
  const ChunkCodecOptions o{.zstd_level = level};
  EncodedChunk enc;
  for (auto _ : state) {
    enc = EncodeChunk(Chunk(c), Base(c), o);
    benchmark::DoNotOptimize(enc.bytes.data());
  }
  state.SetLabel(std::string(EncodingName(enc.encoding)));
  Report(state, enc.bytes.size());
}

void BM_Decode(benchmark::State& state, ChunkEncoding e, Case c, int level) {
  MemcpyRate();  // and the data, before timing starts
  TestData();
  auto enc = EncodeChunkAs(e, Chunk(c), Base(c), {.zstd_level = level});
  std::vector<float> out(kN);
  for (auto _ : state) {
    Status s = DecodeChunk(*enc, Base(c), out);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, enc->size());
}

void BM_ChunkHash(benchmark::State& state) {
  MemcpyRate();  // and the data, before timing starts
  TestData();
  const std::vector<float>& w = TestData().weights;
  for (auto _ : state) benchmark::DoNotOptimize(ChunkHash(w));
  Report(state, 4 * kN);
}

template <typename... Args>
void Register(const std::string& name, Args&&... args) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(args)...)
      ->UseRealTime()
      ->MinWarmUpTime(kWarmUpSeconds)
      ->Unit(benchmark::kMillisecond);
}

const bool kRegistered = [] {
  const Case weights{"weights", &Data::weights, nullptr};
  const Case adam_v{"adam-v", &Data::adam_v, nullptr};
  const Case w10{"w10", &Data::w10, &Data::weights};
  const ChunkEncoding raw = ChunkEncoding::kRaw, planes = ChunkEncoding::kPlanes, xor_planes = ChunkEncoding::kXorPlanes;
  Register("BM_Encode/raw/weights", BM_Encode, raw, weights, 1);
  Register("BM_Decode/raw/weights", BM_Decode, raw, weights, 1);
  for (int level : {kChunkFastestZstdLevel, -100, 1, 3}) {
    for (const Case& c : {weights, adam_v}) {
      Register(fmt::format("BM_Encode/planes/{}/{}", c.name, level), BM_Encode, planes, c, level);
      Register(fmt::format("BM_Decode/planes/{}/{}", c.name, level), BM_Decode, planes, c, level);
    }
    Register(fmt::format("BM_Encode/xor-planes/w10/{}", level), BM_Encode, xor_planes, w10, level);
    Register(fmt::format("BM_Decode/xor-planes/w10/{}", level), BM_Decode, xor_planes, w10, level);
  }
  for (int level : {kChunkFastestZstdLevel, 1}) {
    Register(fmt::format("BM_EncodeChunk/weights/{}", level), BM_EncodeChunk, weights, level);
    Register(fmt::format("BM_EncodeChunk/w10/{}", level), BM_EncodeChunk, w10, level);
  }
  Register("BM_ChunkHash/weights", BM_ChunkHash);
  return true;
}();

}  // namespace
}  // namespace tf::checkpoint
