// Collective benchmarks for the host communicator, reported as nccl-tests does: algorithm
// bandwidth (bytes / time) and bus bandwidth (algbw scaled by the algorithm's traffic factor:
// all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, all-to-all (n-1)/n), plus the
// gradient reducer with each codec on a GPT-2-124M-sized gradient slice.
//
// Run under MPI, e.g.:  mpirun -np 2 build/bench/collectives_mpi_bench
// Every rank runs every benchmark with a fixed iteration count (collectives must match across
// ranks, so Google Benchmark's adaptive iteration count is not used); only rank 0 reports.
#include <mpi.h>

#include <numeric>
#include <vector>

#include <benchmark/benchmark.h>

#include "comm/communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"

namespace tf::comm {
namespace {

Communicator* g_comm = nullptr;

int Iterations(int64_t bytes) {
  if (bytes <= (1 << 16)) return 200;
  if (bytes <= (1 << 22)) return 40;
  return 8;
}

void Report(benchmark::State& state, int64_t bytes, double bus_factor) {
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["algbw_GBps"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["busbw_GBps"] = benchmark::Counter(bus_factor * static_cast<double>(bytes) * state.iterations() / 1e9,
                                                    benchmark::Counter::kIsRate);
}

void BM_AllReduce(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<float> buf(static_cast<size_t>(bytes / 4), 1.0f);
  const int n = g_comm->world();
  for (auto _ : state) {
    if (!g_comm->AllReduceSum(buf.data(), bytes / 4, DataType::kF32).ok()) state.SkipWithError("all-reduce failed");
  }
  Report(state, bytes, 2.0 * (n - 1) / n);
}

void BM_ReduceScatter(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int n = g_comm->world();
  std::vector<int64_t> counts(static_cast<size_t>(n), bytes / 4 / n);
  std::vector<float> send(static_cast<size_t>(bytes / 4), 1.0f), recv(static_cast<size_t>(bytes / 4 / n));
  for (auto _ : state) {
    if (!g_comm->ReduceScatterSum(send.data(), recv.data(), counts, DataType::kF32).ok()) {
      state.SkipWithError("reduce-scatter failed");
    }
  }
  Report(state, bytes, static_cast<double>(n - 1) / n);
}

void BM_AllGather(benchmark::State& state) {
  const int64_t bytes = state.range(0);  // the gathered total
  const int n = g_comm->world();
  std::vector<char> send(static_cast<size_t>(bytes / n)), recv(static_cast<size_t>(bytes / n * n));
  for (auto _ : state) {
    if (!g_comm->AllGather(send.data(), recv.data(), send.size()).ok()) state.SkipWithError("all-gather failed");
  }
  Report(state, bytes, static_cast<double>(n - 1) / n);
}

void BM_AllToAll(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int n = g_comm->world();
  std::vector<char> send(static_cast<size_t>(bytes / n * n)), recv(send.size());
  for (auto _ : state) {
    if (!g_comm->AllToAll(send.data(), recv.data(), static_cast<size_t>(bytes / n)).ok()) {
      state.SkipWithError("all-to-all failed");
    }
  }
  Report(state, bytes, static_cast<double>(n - 1) / n);
}

// The reducer end to end (encode, collectives, decode) on 32 MB of gradients in 25 MB buckets,
// everything announced at once: what a step exposes when nothing overlaps.
void BM_Reducer(benchmark::State& state, const char* spec) {
  const int64_t n = int64_t{8} << 20;
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = static_cast<float>((i * 2654435761u) % 2001) * 1e-6f - 1e-3f;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t e = n; e > 0; e -= int64_t{1} << 18) ranges.emplace_back(std::max<int64_t>(0, e - (int64_t{1} << 18)), e);
  ReducerOptions o;
  o.codec = ParseCodec(spec).value();
  auto reducer = GradientReducer::Create(g_comm, g, ranges, o);
  if (!reducer.ok()) {
    state.SkipWithError(reducer.status().ToString().c_str());
    return;
  }
  double wire = 0;
  int64_t step = 0;
  for (auto _ : state) {
    (*reducer)->BeginStep(step++);
    for (auto [b, e] : ranges) (*reducer)->MarkReady(b, e);
    if (!(*reducer)->Finish().ok()) state.SkipWithError("reducer failed");
    wire += static_cast<double>((*reducer)->LastStats()->wire_bytes);
  }
  state.SetBytesProcessed(state.iterations() * n * 4);
  state.counters["wire_MB_per_step"] = wire / static_cast<double>(state.iterations()) / 1e6;
  state.counters["grad_GBps"] =
      benchmark::Counter(static_cast<double>(n) * 4 * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void Register() {
  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> collectives[] = {
      {"AllReduce", BM_AllReduce}, {"ReduceScatter", BM_ReduceScatter}, {"AllGather", BM_AllGather},
      {"AllToAll", BM_AllToAll}};
  for (auto [name, fn] : collectives) {
    for (int64_t bytes = 1 << 12; bytes <= (int64_t{1} << 26); bytes *= 8) {
      benchmark::RegisterBenchmark(name, fn)->Arg(bytes)->Iterations(Iterations(bytes))->UseRealTime()->Unit(
          benchmark::kMicrosecond);
    }
  }
  for (const char* spec : {"none", "bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.01"}) {
    benchmark::RegisterBenchmark((std::string("Reducer32MB/") + spec).c_str(), BM_Reducer, spec)
        ->Iterations(6)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace tf::comm

int main(int argc, char** argv) {
  auto topo = tf::comm::InitProcessGroup();
  if (!topo.ok()) {
    std::fprintf(stderr, "error: %s\n", topo.status().ToString().c_str());
    return 1;
  }
  auto comm = tf::comm::MakeHostCommunicator(*topo);
  if (!comm.ok()) {
    std::fprintf(stderr, "error: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  tf::comm::g_comm = comm->get();
  benchmark::Initialize(&argc, argv);
  tf::comm::Register();
  if (topo->rank == 0) {
    std::printf("collectives over %s: %s\n", (*comm)->name(), topo->Describe().c_str());
    benchmark::RunSpecifiedBenchmarks();
  } else {
    // Other ranks take part silently.
    class Silent : public benchmark::BenchmarkReporter {
     public:
      bool ReportContext(const Context&) override { return true; }
      void ReportRuns(const std::vector<Run>&) override {}
    } silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}
