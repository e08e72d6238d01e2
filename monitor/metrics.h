// Monitor: one process's live view of a training run — the Prometheus registry (prometheus-cpp;
// every metric of docs/monitoring.md except the process and GPU ones, which SystemCollector reads
// at scrape time), and the dashboard's data: the run description, a bounded history of step
// records and a bounded list of events.
//
// The training thread records (RecordStep, RecordEval, AddEvent, ...): each call sets a few atomic
// gauges and appends one fixed-size record under a mutex, nothing else (the cost is measured in
// bench/RESULTS.md). The HTTP server's threads read (Exposition, *Json): they copy what they need
// under the mutex and serialise outside it. History: at most kMaxRecords step records; when full, every other record of the older half
// is dropped, so a long run keeps its whole shape at a coarser resolution. Thread safety: all
// methods may be called from any thread.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace tf::monitor {

// One completed optimizer step, as the dashboard and the gauges see it. Times in seconds.
struct StepRecord {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  int64_t tokens = 0;  // trained in this step, all ranks
  double step_s = 0, data_s = 0, compute_s = 0, comm_exposed_s = 0, optimizer_s = 0;
  std::optional<double> mfu;  // 0..1, when the peak is known
  // Gradient synchronisation (has_comm: several ranks or a codec).
  bool has_comm = false;
  int64_t wire_bytes = 0;
  double comm_s = 0, codec_s = 0, compression = 0;
  int64_t rss_bytes = 0;
  std::optional<double> val_loss;
  std::optional<double> checkpoint_stall_s;
  // Rank 0 of several: every rank's busy time (step time minus its communication wait), by rank.
  std::vector<double> rank_busy_s;
};

// Checkpoint counters as the checkpointer reports them (cumulative); the monitor turns changes into
// counter increments.
struct CheckpointCounters {
  int64_t written = 0, failed = 0, skipped = 0;
  int64_t bytes_total = 0;
  int64_t last_bytes = 0;
  double last_duration_s = 0;
  int64_t last_committed_step = -1;
};

struct RunInfo {
  std::string run_id, version, model, device, compression, host;
  int rank = 0, world = 1;
  int64_t max_steps = 0;
  bool has_mfu = false;  // the peak is known: trainflow_mfu_ratio exists
  nlohmann::json model_config = nlohmann::json::object(), train_config = nlohmann::json::object();
  // (kind, action) label values pre-created for trainflow_anomalies_total, so the series exist at 0.
  std::vector<std::pair<std::string, std::string>> anomaly_series;
};

// What MetricsServer (monitor/server.h) serves: the Prometheus exposition and, when dashboard() is
// true, the dashboard's JSON API. Implementations are read from the server's threads.
class MetricsSource {
 public:
  virtual ~MetricsSource() = default;
  virtual std::string Exposition() const = 0;
  virtual bool dashboard() const { return false; }  // "/", /chart.js, /api/steps|events|ranks
  virtual std::string RunJson() const = 0;
  virtual std::string StepsJson(int64_t after) const { return "[]"; }
  virtual std::string EventsJson(int64_t after_id) const { return "[]"; }
  virtual std::string RanksJson() const { return "{}"; }
};

class Monitor : public MetricsSource {
 public:
  static constexpr size_t kMaxRecords = 20000;
  static constexpr size_t kMaxEvents = 1000;  // besides at most kMaxSamples "sample" events
  static constexpr size_t kMaxSamples = 100;
  static constexpr size_t kMaxRecordsPerAnswer = 5000;

  explicit Monitor(RunInfo info);
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  void RecordStep(const StepRecord& r);
  // An evaluation after `step`: it joins that step's record, or (the evaluation before the first
  // step of this process) becomes a record of its own holding only val_loss.
  void RecordEval(int64_t step, double loss);
  void RecordCheckpoints(const CheckpointCounters& c);
  void RecordAnomaly(const std::string& kind, const std::string& action);
  void RecordUpdateSkipped();
  // The run went back to `to_step`: records after it are dropped and the generation advances.
  void RecordRollback(int64_t to_step);
  // kind: start, eval, sample, checkpoint, anomaly, rollback, stop, end, restart.
  void AddEvent(const std::string& kind, int64_t step, const std::string& message);
  void SetStatus(const std::string& status);  // running, finished, stopped, failed

  // Prometheus text exposition of the registry and every added collectable.
  std::string Exposition() const override;
  void AddCollectable(std::shared_ptr<prometheus::Collectable> c);
  bool dashboard() const override { return true; }
  std::string RunJson() const override;
  std::string StepsJson(int64_t after) const override;
  std::string EventsJson(int64_t after_id) const override;
  std::string RanksJson() const override;

 private:
  void SetEvalLossLocked(double loss);

  struct Event {
    int64_t id, step;
    double time_unix;
    std::string kind, message;
  };
  struct Point {  // StepRecord without the per-rank vector
    StepRecord r;
    bool eval_only = false;  // an evaluation with no step of its own (before the first step)
    double time_unix = 0;
    double slowest_busy_s = 0, spread_s = 0;
    int slowest_rank = -1;
  };

  const RunInfo info_;
  const double started_unix_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge *step_time_, *step_, *loss_, *lr_, *grad_norm_, *tokens_per_s_, *mfu_;
  // trainflow_eval_loss has no sample until the first evaluation (0 would read as a loss).
  prometheus::Family<prometheus::Gauge>* eval_loss_family_;
  prometheus::Gauge *part_data_, *part_compute_, *part_comm_, *part_optimizer_;
  prometheus::Counter *tokens_total_, *steps_total_, *sent_bytes_total_;
  prometheus::Histogram* step_duration_;
  prometheus::Gauge *bandwidth_, *comm_s_, *codec_s_, *compression_;
  prometheus::Counter *ckpt_stall_total_, *ckpt_written_, *ckpt_failed_, *ckpt_skipped_, *ckpt_bytes_total_;
  prometheus::Gauge *ckpt_last_stall_, *ckpt_last_bytes_, *ckpt_last_duration_, *ckpt_last_committed_;
  prometheus::Family<prometheus::Counter>* anomalies_;
  prometheus::Counter *updates_skipped_, *rollbacks_;
  prometheus::Family<prometheus::Gauge>* rank_busy_;
  prometheus::Gauge *slowest_rank_, *slowest_busy_, *busy_spread_;

  mutable std::mutex mu_;  // guards everything below
  prometheus::Gauge* eval_loss_ = nullptr;  // added at the first evaluation
  std::vector<Point> points_;
  std::vector<Event> events_;   // oldest first, at most kMaxEvents
  std::vector<Event> samples_;  // the same for "sample" events (long texts, frequent)
  int64_t next_event_id_ = 1;
  int64_t generation_ = 0;
  std::vector<double> rank_busy_s_;  // the latest step's, rank 0 of several
  int64_t rank_busy_step_ = 0;
  std::vector<prometheus::Gauge*> rank_busy_gauges_;
  CheckpointCounters ckpt_seen_;
  std::string status_ = "running";
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
};

}  // namespace tf::monitor
