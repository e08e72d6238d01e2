// The monitor's cost. On the training thread, once per step: Monitor::RecordStep (gauges, the
// histogram, one history record) and ResidentBytes (one /proc read). On the server's threads, per
// request: the Prometheus exposition with the process collector, and a page of step records.
// bench/RESULTS.md sets the per-step cost against the default job's step time.
#include <benchmark/benchmark.h>

#include "monitor/metrics.h"
#include "monitor/system_metrics.h"

namespace tf::monitor {
namespace {

RunInfo Info(int world) {
  RunInfo i;
  i.run_id = "bench";
  i.version = "trainflow bench";
  i.model = "bench";
  i.device = "cpu";
  i.compression = "none";
  i.world = world;
  i.max_steps = 1 << 30;
  i.has_mfu = true;
  i.anomaly_series = {{"nonfinite_loss", "stop"}, {"nonfinite_grad_norm", "stop"}, {"loss_spike", "warn"},
                      {"grad_norm_spike", "warn"}};
  return i;
}

StepRecord Record(int64_t step, int world) {
  StepRecord r;
  r.step = step;
  r.loss = 2.5;
  r.lr = 1e-3;
  r.grad_norm = 1.1;
  r.tokens_per_s = 1e5;
  r.step_s = 0.02;
  r.compute_s = 0.019;
  r.mfu = 0.4;
  r.has_comm = world > 1;
  r.wire_bytes = 1 << 20;
  r.comm_s = 0.001;
  r.rss_bytes = 1 << 28;
  if (world > 1) r.rank_busy_s.assign(static_cast<size_t>(world), 0.019);
  return r;
}

// The training thread's whole per-step work (history growing, thinning included).
void BM_RecordStep(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  Monitor m(Info(world));
  StepRecord r = Record(0, world);
  int64_t step = 0;
  for (auto _ : state) {
    r.step = ++step;
    r.rss_bytes = ResidentBytes();
    m.RecordStep(r);
  }
}
BENCHMARK(BM_RecordStep)->Arg(1)->Arg(8)->Arg(64);

void BM_ResidentBytes(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(ResidentBytes());
}
BENCHMARK(BM_ResidentBytes);

// One Prometheus scrape (server thread): registry, process collector, text.
void BM_Exposition(benchmark::State& state) {
  Monitor m(Info(8));
  m.AddCollectable(std::make_shared<SystemCollector>());
  for (int i = 1; i <= 100; ++i) m.RecordStep(Record(i, 8));
  for (auto _ : state) benchmark::DoNotOptimize(m.Exposition());
}
BENCHMARK(BM_Exposition)->Unit(benchmark::kMicrosecond);

// A dashboard poll of one new step, and a first load of a full page.
void BM_StepsJson(benchmark::State& state) {
  Monitor m(Info(1));
  for (int i = 1; i <= 20000; ++i) m.RecordStep(Record(i, 1));
  const int64_t after = 20000 - state.range(0);
  for (auto _ : state) benchmark::DoNotOptimize(m.StepsJson(after));
}
BENCHMARK(BM_StepsJson)->Arg(1)->Arg(5000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tf::monitor
