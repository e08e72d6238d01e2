#include "engine/monitoring.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/spdlog.h>

#include "base/clock.h"
#include "base/net.h"
#include "base/progress.h"
#include "base/random.h"
#include "engine/train_backend.h"
#include "model/config.h"
#include "monitor/metrics.h"
#include "monitor/server.h"
#include "monitor/system_metrics.h"

namespace tf {
namespace {

using json = nlohmann::json;

// The CPU's max clock in GHz: cpufreq's cpuinfo_max_freq, else /proc/cpuinfo's "cpu MHz".
double CpuMaxGhz() {
  if (std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); f) {
    double khz = 0;
    if (f >> khz && khz > 0) return khz / 1e6;
  }
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.starts_with("cpu MHz")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return std::atof(line.c_str() + colon + 1) / 1e3;
    }
  }
  return 0;
}

// fp32 FLOPs per cycle per core: two FMA units of the widest vector width.
double CpuFlopsPerCycle() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 64;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 32;
  return 8;
#else
  return 16;
#endif
}

// A run id shared by every rank: TRAINFLOW_RUN_ID, else rank 0's clock and randomness.
StatusOr<std::string> RunId() {
  if (const char* env = std::getenv("TRAINFLOW_RUN_ID"); env != nullptr && *env != '\0') return std::string(env);
  return FormatUtc(UnixSeconds(), "%Y%m%d-%H%M%S") + "-" + RandomHex(2);
}

class MonitorObserver final : public StepObserver {
 public:
  MonitorObserver(std::unique_ptr<monitor::Monitor> m, std::shared_ptr<monitor::SystemCollector> system,
                  std::unique_ptr<monitor::MetricsServer> server, std::optional<double> peak_flops_per_s,
                  double flops_per_token)
      : monitor_(std::move(m)),
        system_(std::move(system)),
        server_(std::move(server)),
        peak_(peak_flops_per_s),
        flops_per_token_(flops_per_token) {}
  ~MonitorObserver() override { server_.reset(); }  // the server stops before the Monitor goes

  Status OnStart(Trainer& t) override {
    const std::string what = t.resumed_from().empty() ? fmt::format("started at step {}", t.step()) : t.resumed_from();
    monitor_->AddEvent("start", t.step(), what);
    // The evaluation observer (added before this one) evaluated the initial weights.
    const auto& vals = t.result().val_losses;
    if (!vals.empty() && vals.back().first == t.step()) {
      monitor_->RecordEval(t.step(), vals.back().second);
      monitor_->AddEvent("eval", t.step(), fmt::format("validation loss {:.4f} (before training)", vals.back().second));
    }
    return Status::OK();
  }

  Status OnStep(Trainer& t, StepStats& s) override {
    monitor::StepRecord r;
    r.step = s.step;
    r.loss = s.loss;
    r.lr = s.lr;
    r.grad_norm = s.grad_norm;
    r.tokens_per_s = s.tokens_per_s;
    r.tokens = t.config().tokens_per_step() * t.topology().world;
    r.step_s = s.ms / 1e3;
    r.data_s = s.data_ms / 1e3;
    r.compute_s = s.compute_ms / 1e3;
    r.comm_exposed_s = s.comm_exposed_ms / 1e3;
    r.optimizer_s = s.optimizer_ms / 1e3;
    if (peak_) r.mfu = flops_per_token_ * s.tokens_per_s / (*peak_ * t.topology().world);
    r.has_comm = t.data_parallel();
    r.wire_bytes = s.wire_bytes;
    r.comm_s = s.comm_ms / 1e3;
    r.codec_s = s.codec_ms / 1e3;
    r.compression = s.compression;
    r.rss_bytes = monitor::ResidentBytes();
    if (s.val_loss) r.val_loss = *s.val_loss;
    if (s.checkpoint_stall_ms > 0) r.checkpoint_stall_s = s.checkpoint_stall_ms / 1e3;
    if (t.topology().rank == 0) {
      r.rank_busy_s.reserve(s.rank_busy_ms.size());
      for (double ms : s.rank_busy_ms) r.rank_busy_s.push_back(ms / 1e3);
    }
    monitor_->RecordStep(r);

    if (s.anomaly) {
      monitor_->RecordAnomaly(s.anomaly->kind, AnomalyActionName(s.anomaly->action));
      monitor_->AddEvent("anomaly", s.step, s.anomaly->Describe(s.step));
    }
    if (s.update_skipped && s.anomaly && s.anomaly->action == AnomalyAction::kSkip) monitor_->RecordUpdateSkipped();
    if (s.val_loss) monitor_->AddEvent("eval", s.step, fmt::format("validation loss {:.4f}", *s.val_loss));
    const auto& samples = t.result().samples;
    if (!samples.empty() && samples.back().first == s.step) monitor_->AddEvent("sample", s.step, samples.back().second);
    if (auto c = t.checkpoint_stats()) {
      monitor::CheckpointCounters k;
      k.written = c->written;
      k.failed = c->failed;
      k.skipped = c->skipped;
      k.bytes_total = c->bytes_total;
      k.last_bytes = c->last_bytes;
      k.last_duration_s = c->last_write_s;
      k.last_committed_step = c->last_committed_step;
      monitor_->RecordCheckpoints(k);
      if (c->last_committed_step > committed_step_ && t.topology().rank == 0) {
        monitor_->AddEvent("checkpoint", c->last_committed_step,
                           fmt::format("checkpoint of step {} committed ({:.1f} MiB stored)", c->last_committed_step,
                                       c->committed_new_bytes / double(1 << 20)));
      }
      if (c->failed > failed_) {
        monitor_->AddEvent("checkpoint", s.step, fmt::format("checkpoint write failed: {}", c->last_error));
      }
      committed_step_ = std::max(committed_step_, c->last_committed_step);
      failed_ = c->failed;
    }
    if (s.stopping) {
      monitor_->AddEvent("stop", s.step, s.interrupted ? "stop requested (signal or peer)" : "stop_at_step reached");
    }
    return Status::OK();
  }

  Status OnRollback(Trainer& t, int64_t from, int64_t to) override {
    monitor_->RecordRollback(to);
    monitor_->AddEvent("rollback", to,
                       fmt::format("rolled back from step {} to the checkpoint of step {} (data offset now {} steps)",
                                   from, to, t.data_offset()));
    return Status::OK();
  }

  Status OnEnd(Trainer& t, const TrainResult& result) override {
    monitor_->SetStatus(result.stopped ? "stopped" : "finished");
    monitor_->AddEvent("end", result.final_step, fmt::format("run {} at step {}", result.stopped ? "stopped" : "finished",
                                                             result.final_step));
    return Status::OK();
  }

 private:
  std::unique_ptr<monitor::Monitor> monitor_;
  std::shared_ptr<monitor::SystemCollector> system_;
  std::unique_ptr<monitor::MetricsServer> server_;
  std::optional<double> peak_;  // FLOP/s per rank
  double flops_per_token_;
  int64_t committed_step_ = -1;
  int64_t failed_ = 0;
};

}  // namespace

double FlopsPerToken(const GPT2Config& m, int seq_len) {
  return 6.0 * static_cast<double>(NumParameters(m)) + 12.0 * m.n_layer * static_cast<double>(seq_len) * m.n_embd;
}

std::optional<double> PeakTflops(const TrainConfig& train, const std::string& device) {
  if (train.peak_tflops > 0) return train.peak_tflops;
  if (device.starts_with("cpu")) {
    const double ghz = CpuMaxGhz();
    if (ghz <= 0) return std::nullopt;
    return omp_get_max_threads() * ghz * CpuFlopsPerCycle() / 1e3;
  }
  // Datasheet figures, dense: bf16 tensor cores, and fp32 without TF32 (the fp32 GEMMs do not use
  // TF32). SXM unless PCIe is named; the first match wins.
  struct Gpu {
    const char* name;
    double bf16, fp32;
  };
  static constexpr Gpu kGpus[] = {{"GH200", 989, 67},   {"H200", 989, 67},    {"H100 PCIe", 756, 51},
                                  {"H100 NVL", 835, 60}, {"H100", 989, 67},    {"B200", 2250, 80},
                                  {"A100", 312, 19.5},   {"L40S", 362, 91.6},  {"L40", 181, 90.5},
                                  {"L4", 121, 30.3},     {"A10", 125, 31.2},
                                  {"RTX 4090", 165, 82.6}};
  for (const Gpu& g : kGpus) {
    if (device.find(g.name) != std::string::npos) return train.dtype == "bf16" ? g.bf16 : g.fp32;
  }
  return std::nullopt;
}

namespace {

// Every rank learns whether `local` failed anywhere: a failing rank returns its own error, the
// others one naming how many failed (so no rank trains on while another has exited).
Status AgreeOnAllRanks(Trainer& t, Status local, const char* what) {
  if (t.topology().world > 1) {
    TF_ASSIGN_OR_RETURN(const int failed, t.CountOverRanks(!local.ok()));
    if (local.ok() && failed > 0) {
      return Status::InvalidArgument("{} failed on {} rank{} (their logs say why)", what, failed, failed == 1 ? "" : "s");
    }
  }
  return local;
}

// The endpoint's options for this rank: metrics_addr's port + local rank, the token.
StatusOr<monitor::ServerOptions> ServerOptionsFor(const TrainConfig& c, const comm::Topology& topo) {
  const StatusOr<HostPort> addr = ParseHostPort(c.metrics_addr);
  if (!addr.ok()) return addr.status().WithContext("metrics_addr");
  monitor::ServerOptions so;
  so.host = addr->host;
  so.port = addr->port;
  if (so.port != 0) {
    if (so.port + topo.local_rank > 65535) {
      return Status::InvalidArgument("metrics_addr port {} + local rank {} is beyond 65535", so.port, topo.local_rank);
    }
    so.port += topo.local_rank;
    so.port_stride = std::max(1, topo.local_world);
  }
  if (!c.metrics_token_file.empty()) {
    TF_ASSIGN_OR_RETURN(so.token, monitor::ReadTokenFile(c.metrics_token_file));
    struct stat st{};
    if (::stat(c.metrics_token_file.c_str(), &st) == 0 && (st.st_mode & 0077) != 0 && topo.rank == 0) {
      spdlog::warn("metrics_token_file {} can be read by other users (mode {:o}): chmod 600 it",
                   c.metrics_token_file, st.st_mode & 0777);
    }
  }
  return so;
}

}  // namespace

StatusOr<std::unique_ptr<StepObserver>> MakeMonitorObserver(Trainer& t) {
  const TrainConfig& c = t.config();
  if (c.metrics_addr.empty() || c.metrics_addr == "off") return std::unique_ptr<StepObserver>();
  const comm::Topology& topo = t.topology();
  t.GatherRankTimes(true);  // every rank alike: it changes the step's reduction
  StatusOr<monitor::ServerOptions> options = ServerOptionsFor(c, topo);
  TF_RETURN_IF_ERROR(AgreeOnAllRanks(t, options.status(), "the metrics endpoint's options"));
  const monitor::ServerOptions so = *options;

  monitor::RunInfo info;
  // Rank 0's run id for every rank.
  TF_ASSIGN_OR_RETURN(std::string id, RunId());
  if (topo.world > 1) {
    std::string fixed = id;
    fixed.resize(64, '\0');
    TF_RETURN_IF_ERROR(t.BroadcastFromRankZero(fixed.data(), fixed.size()));
    id = fixed.c_str();
  }
  info.run_id = id;
  info.version = "trainflow 0.1.0";
  const GPT2Config& m = t.model_config();
  info.model = fmt::format("{}L-{}H-{}C ({} parameters)", m.n_layer, m.n_head, m.n_embd,
                           FormatParameterCount(NumParameters(m)));
  info.device = t.backend().Describe();
  info.compression = t.compression();
  info.host = topo.hostname;
  info.rank = topo.rank;
  info.world = topo.world;
  info.max_steps = c.max_steps;
  info.model_config = ModelConfigToJson(m);
  info.train_config = TrainConfigToJson(c);
  // What the run uses, where the config leaves the choice to the engine (device "auto"; the CPU
  // backend computes in fp32 whatever dtype says); the configured values beside them.
  const bool cuda = UsesCuda(c);
  const std::pair<const char*, std::string> resolved[] = {{"device", cuda ? "cuda" : "cpu"},
                                                          {"dtype", cuda ? c.dtype : "fp32"}};
  for (const auto& [key, value] : resolved) {
    if (info.train_config.value(key, "") == value) continue;
    info.train_config[std::string(key) + "_configured"] = info.train_config[key];
    info.train_config[key] = value;
  }
  info.anomaly_series = t.anomaly_label_pairs();
  const std::optional<double> peak = PeakTflops(c, t.backend().Describe());
  info.has_mfu = peak.has_value();
  auto mon = std::make_unique<monitor::Monitor>(std::move(info));

  monitor::GpuSelection gpu;
  // The rank's GPU by bus id (NVML's index as the fallback); a CPU rank reports NVML's GPU
  // local_rank only when TRAINFLOW_NVML_LIBRARY names a library (an explicit choice: tests, or a
  // CPU job on a GPU node that wants its GPU watched).
  gpu.pci_bus_id = t.backend().PciBusId();
  const char* nvml_env = std::getenv("TRAINFLOW_NVML_LIBRARY");
  if (!gpu.pci_bus_id.empty() || (nvml_env != nullptr && *nvml_env != '\0')) gpu.nvml_index = topo.local_rank;
  auto system = std::make_shared<monitor::SystemCollector>(gpu);
  mon->AddCollectable(system);

  StatusOr<std::unique_ptr<monitor::MetricsServer>> started = monitor::MetricsServer::Start(mon.get(), so);
  TF_RETURN_IF_ERROR(AgreeOnAllRanks(t, started.status(), "starting the metrics endpoint"));
  std::unique_ptr<monitor::MetricsServer> server = std::move(started).value();
  const std::string moved = server->moved_from().empty()
                                ? std::string()
                                : fmt::format(" (port {} in use: moved on)", so.port);
  const std::string line = fmt::format("monitor: rank {} at {}/ (dashboard; Prometheus metrics at /metrics){}{}",
                                       topo.rank, server->url(), moved, so.token.empty() ? "" : "; bearer token required");
  SetMetricsUrl(server->url());
  if (topo.rank == 0 && t.options().print_progress) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  } else {
    spdlog::info("{}", line);
  }
  if (gpu.requested() && topo.rank == 0) spdlog::info("monitor: {}", system->gpu_status());
  return std::unique_ptr<StepObserver>(std::make_unique<MonitorObserver>(
      std::move(mon), std::move(system), std::move(server), peak ? std::optional<double>(*peak * 1e12) : std::nullopt,
      FlopsPerToken(m, c.seq_len)));
}

}  // namespace tf
