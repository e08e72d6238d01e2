#include "monitor/metrics.h"

#include <algorithm>
#include <cmath>

#include <prometheus/text_serializer.h>

#include "base/clock.h"

namespace tf::monitor {
namespace {

using json = nlohmann::json;

prometheus::Gauge& NewGauge(prometheus::Registry& reg, const std::string& name, const std::string& help,
                            const prometheus::Labels& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(reg).Add(labels);
}

prometheus::Counter& NewCounter(prometheus::Registry& reg, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(reg).Add({});
}

// Text for the wire: invalid UTF-8 (a path, a sampled byte) becomes U+FFFD instead of an exception.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A finite number as JSON, else null (JSON has no NaN).
json Num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

}  // namespace

Monitor::Monitor(RunInfo info)
    : info_(std::move(info)), started_unix_(UnixSeconds()), registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& reg = *registry_;
  prometheus::BuildGauge()
      .Name("trainflow_run_info")
      .Help("What is running (value 1): version, model, run id, device, rank, world size, gradient codec")
      .Register(reg)
      .Add({{"version", info_.version},
            {"model", info_.model},
            {"run_id", info_.run_id},
            {"device", info_.device},
            {"rank", std::to_string(info_.rank)},
            {"world", std::to_string(info_.world)},
            {"compression", info_.compression}})
      .Set(1);
  step_ = &NewGauge(reg, "trainflow_step", "The last completed optimizer step (goes back on a rollback)");
  step_time_ = &NewGauge(reg, "trainflow_last_step_timestamp_seconds",
                         "Unix time the last step completed (a stale value: the run is stuck or gone)");
  NewGauge(reg, "trainflow_max_steps", "The run's max_steps").Set(static_cast<double>(info_.max_steps));
  loss_ = &NewGauge(reg, "trainflow_loss", "Training loss of the last step (mean over ranks and micro-batches)");
  eval_loss_family_ = &prometheus::BuildGauge()
                           .Name("trainflow_eval_loss")
                           .Help("Validation loss of the last evaluation (absent before the first)")
                           .Register(reg);
  lr_ = &NewGauge(reg, "trainflow_learning_rate", "Learning rate of the last step");
  grad_norm_ = &NewGauge(reg, "trainflow_grad_norm", "Global gradient norm of the last step, before clipping");
  tokens_per_s_ = &NewGauge(reg, "trainflow_tokens_per_second", "Tokens per second of the last step, all ranks");
  tokens_total_ = &NewCounter(reg, "trainflow_tokens_total",
                              "Tokens trained by the whole job in this process (the same on every rank)");
  steps_total_ = &NewCounter(reg, "trainflow_steps_total", "Optimizer steps this process completed");
  step_duration_ = &prometheus::BuildHistogram()
                        .Name("trainflow_step_duration_seconds")
                        .Help("Wall time of an optimizer step")
                        .Register(reg)
                        .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                                         0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100});
  auto& parts = prometheus::BuildGauge()
                    .Name("trainflow_step_part_seconds")
                    .Help("The last step's wall time by part: data, compute (forward and backward with the "
                          "communication they hide), comm_exposed (waiting for communication), optimizer")
                    .Register(reg);
  part_data_ = &parts.Add({{"part", "data"}});
  part_compute_ = &parts.Add({{"part", "compute"}});
  part_comm_ = &parts.Add({{"part", "comm_exposed"}});
  part_optimizer_ = &parts.Add({{"part", "optimizer"}});
  mfu_ = info_.has_mfu ? &NewGauge(reg, "trainflow_mfu_ratio",
                                   "Model FLOPs utilisation of the last step (0-1) against the peak")
                      : nullptr;
  sent_bytes_total_ = &NewCounter(reg, "trainflow_comm_sent_bytes_total", "Gradient bytes this rank sent");
  bandwidth_ = &NewGauge(reg, "trainflow_comm_bandwidth_bytes_per_second",
                         "Achieved bandwidth of the last step: bytes sent / time inside collectives");
  comm_s_ = &NewGauge(reg, "trainflow_comm_seconds", "Time inside collectives in the last step");
  codec_s_ = &NewGauge(reg, "trainflow_codec_seconds", "Time encoding and decoding gradients in the last step");
  compression_ = &NewGauge(reg, "trainflow_compression_ratio", "fp32 gradient bytes / bytes sent, last step");
  ckpt_stall_total_ = &NewCounter(reg, "trainflow_checkpoint_stall_seconds_total",
                                  "Training time spent taking checkpoint snapshots");
  ckpt_last_stall_ = &NewGauge(reg, "trainflow_checkpoint_last_stall_seconds", "The last checkpoint's training stall");
  auto& ckpts = prometheus::BuildCounter()
                    .Name("trainflow_checkpoints_total")
                    .Help("Checkpoints by result: written (committed; rank 0 commits for all ranks), failed (this "
                          "rank's parts), skipped (both buffer halves busy)")
                    .Register(reg);
  ckpt_written_ = &ckpts.Add({{"result", "written"}});
  ckpt_failed_ = &ckpts.Add({{"result", "failed"}});
  ckpt_skipped_ = &ckpts.Add({{"result", "skipped"}});
  ckpt_last_bytes_ = &NewGauge(reg, "trainflow_checkpoint_last_bytes", "Stored bytes of this rank's last part");
  ckpt_last_duration_ = &NewGauge(reg, "trainflow_checkpoint_last_duration_seconds",
                                  "Writer time of this rank's last part (encode and store)");
  ckpt_bytes_total_ = &NewCounter(reg, "trainflow_checkpoint_written_bytes_total", "Stored checkpoint bytes this rank wrote");
  ckpt_last_committed_ = &NewGauge(reg, "trainflow_checkpoint_last_committed_step",
                                   "Step of the newest checkpoint this process committed (-1: none yet)");
  ckpt_last_committed_->Set(-1);
  anomalies_ = &prometheus::BuildCounter()
                    .Name("trainflow_anomalies_total")
                    .Help("Anomalies the guards saw, by kind and the action taken")
                    .Register(reg);
  for (const auto& [kind, action] : info_.anomaly_series) anomalies_->Add({{"kind", kind}, {"action", action}});
  updates_skipped_ = &NewCounter(reg, "trainflow_updates_skipped_total", "Optimizer updates not applied (anomaly action skip)");
  rollbacks_ = &NewCounter(reg, "trainflow_rollbacks_total", "Rollbacks to a checkpoint (anomaly action rollback)");
  if (info_.rank == 0 && info_.world > 1) {
    rank_busy_ = &prometheus::BuildGauge()
                      .Name("trainflow_rank_busy_seconds")
                      .Help("Each rank's last step time minus its communication wait (rank 0 only)")
                      .Register(reg);
    for (int r = 0; r < info_.world; ++r) rank_busy_gauges_.push_back(&rank_busy_->Add({{"rank", std::to_string(r)}}));
    slowest_rank_ = &NewGauge(reg, "trainflow_slowest_rank", "The rank with the largest busy time (rank 0 only)");
    slowest_busy_ = &NewGauge(reg, "trainflow_slowest_rank_busy_seconds", "The slowest rank's busy time (rank 0 only)");
    busy_spread_ = &NewGauge(reg, "trainflow_rank_busy_spread_seconds",
                             "Slowest minus fastest rank's busy time (rank 0 only)");
  } else {
    rank_busy_ = nullptr;
    slowest_rank_ = slowest_busy_ = busy_spread_ = nullptr;
  }
  points_.reserve(1024);
}

void Monitor::RecordStep(const StepRecord& r) {
  const double now = UnixSeconds();
  step_->Set(static_cast<double>(r.step));
  step_time_->Set(now);
  loss_->Set(r.loss);
  lr_->Set(r.lr);
  grad_norm_->Set(r.grad_norm);
  tokens_per_s_->Set(r.tokens_per_s);
  tokens_total_->Increment(static_cast<double>(r.tokens));
  steps_total_->Increment();
  step_duration_->Observe(r.step_s);
  part_data_->Set(r.data_s);
  part_compute_->Set(r.compute_s);
  part_comm_->Set(r.comm_exposed_s);
  part_optimizer_->Set(r.optimizer_s);
  if (r.mfu && mfu_ != nullptr) mfu_->Set(*r.mfu);
  if (r.has_comm) {
    sent_bytes_total_->Increment(static_cast<double>(r.wire_bytes));
    bandwidth_->Set(r.comm_s > 0 ? static_cast<double>(r.wire_bytes) / r.comm_s : 0.0);
    comm_s_->Set(r.comm_s);
    codec_s_->Set(r.codec_s);
    compression_->Set(r.compression);
  }
  if (r.checkpoint_stall_s) {
    ckpt_stall_total_->Increment(*r.checkpoint_stall_s);
    ckpt_last_stall_->Set(*r.checkpoint_stall_s);
  }
  Point p{r, false, now, 0, 0, -1};
  p.r.rank_busy_s.clear();
  if (!r.rank_busy_s.empty() && slowest_rank_ != nullptr) {
    const auto [lo, hi] = std::minmax_element(r.rank_busy_s.begin(), r.rank_busy_s.end());
    p.slowest_rank = static_cast<int>(hi - r.rank_busy_s.begin());
    p.slowest_busy_s = *hi;
    p.spread_s = *hi - *lo;
    for (size_t i = 0; i < r.rank_busy_s.size() && i < rank_busy_gauges_.size(); ++i) {
      rank_busy_gauges_[i]->Set(r.rank_busy_s[i]);
    }
    slowest_rank_->Set(p.slowest_rank);
    slowest_busy_->Set(p.slowest_busy_s);
    busy_spread_->Set(p.spread_s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (r.val_loss) SetEvalLossLocked(*r.val_loss);
  if (!r.rank_busy_s.empty()) {
    rank_busy_s_ = r.rank_busy_s;
    rank_busy_step_ = r.step;
  }
  if (points_.size() >= kMaxRecords) {
    // Thin the older half: every other record goes.
    const size_t half = points_.size() / 2;
    size_t out = 0;
    for (size_t i = 0; i < points_.size(); ++i) {
      if (i < half && i % 2 == 1) continue;
      points_[out++] = std::move(points_[i]);
    }
    points_.resize(out);
  }
  points_.push_back(std::move(p));
}

void Monitor::SetEvalLossLocked(double loss) {
  if (eval_loss_ == nullptr) eval_loss_ = &eval_loss_family_->Add({});
  eval_loss_->Set(loss);
}

void Monitor::RecordEval(int64_t step, double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  SetEvalLossLocked(loss);
  if (!points_.empty() && points_.back().r.step == step) {
    points_.back().r.val_loss = loss;
  } else if (points_.empty() || points_.back().r.step < step) {
    Point p;
    p.r.step = step;
    p.r.val_loss = loss;
    p.eval_only = true;
    p.time_unix = UnixSeconds();
    points_.push_back(std::move(p));
  }
}

void Monitor::RecordCheckpoints(const CheckpointCounters& c) {
  std::lock_guard<std::mutex> lock(mu_);
  const CheckpointCounters& o = ckpt_seen_;
  if (c.written > o.written) ckpt_written_->Increment(static_cast<double>(c.written - o.written));
  if (c.failed > o.failed) ckpt_failed_->Increment(static_cast<double>(c.failed - o.failed));
  if (c.skipped > o.skipped) ckpt_skipped_->Increment(static_cast<double>(c.skipped - o.skipped));
  if (c.bytes_total > o.bytes_total) ckpt_bytes_total_->Increment(static_cast<double>(c.bytes_total - o.bytes_total));
  ckpt_last_bytes_->Set(static_cast<double>(c.last_bytes));
  ckpt_last_duration_->Set(c.last_duration_s);
  if (c.last_committed_step >= 0) ckpt_last_committed_->Set(static_cast<double>(c.last_committed_step));
  ckpt_seen_ = c;
}

void Monitor::RecordAnomaly(const std::string& kind, const std::string& action) {
  anomalies_->Add({{"kind", kind}, {"action", action}}).Increment();
}

void Monitor::RecordUpdateSkipped() { updates_skipped_->Increment(); }

void Monitor::RecordRollback(int64_t to_step) {
  rollbacks_->Increment();
  step_->Set(static_cast<double>(to_step));
  std::lock_guard<std::mutex> lock(mu_);
  while (!points_.empty() && points_.back().r.step > to_step) points_.pop_back();
  ++generation_;
}

void Monitor::AddEvent(const std::string& kind, int64_t step, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event>& ring = kind == "sample" ? samples_ : events_;
  if (ring.size() >= (kind == "sample" ? kMaxSamples : kMaxEvents)) ring.erase(ring.begin());
  ring.push_back(Event{next_event_id_++, step, UnixSeconds(), kind, message});
}

void Monitor::SetStatus(const std::string& status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status;
}

void Monitor::AddCollectable(std::shared_ptr<prometheus::Collectable> c) {
  std::lock_guard<std::mutex> lock(mu_);
  collectables_.push_back(std::move(c));
}

std::string Monitor::Exposition() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<std::shared_ptr<prometheus::Collectable>> extra;
  {
    std::lock_guard<std::mutex> lock(mu_);
    extra = collectables_;
  }
  for (const auto& c : extra) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

std::string Monitor::RunJson() const {
  json j{{"run_id", info_.run_id},
         {"version", info_.version},
         {"model_name", info_.model},
         {"rank", info_.rank},
         {"world", info_.world},
         {"host", info_.host},
         {"device", info_.device},
         {"compression", info_.compression},
         {"started_unix", started_unix_},
         {"max_steps", info_.max_steps},
         {"model", info_.model_config},
         {"train", info_.train_config}};
  std::lock_guard<std::mutex> lock(mu_);
  j["status"] = status_;
  j["last_step"] = points_.empty() ? 0 : points_.back().r.step;
  return Dump(j);
}

std::string Monitor::StepsJson(int64_t after) const {
  // Copied under the lock, serialised outside it: the training thread never waits for a client.
  std::vector<Point> page;
  int64_t last_step = 0, generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto first = std::upper_bound(points_.begin(), points_.end(), after,
                                  [](int64_t a, const Point& p) { return a < p.r.step; });
    const auto n = std::min<ptrdiff_t>(points_.end() - first, static_cast<ptrdiff_t>(kMaxRecordsPerAnswer));
    page.assign(first, first + n);
    last_step = points_.empty() ? 0 : points_.back().r.step;
    generation = generation_;
  }
  json steps = json::array();
  for (auto it = page.begin(); it != page.end(); ++it) {
    const StepRecord& r = it->r;
    if (it->eval_only) {
      steps.push_back(json{{"step", r.step}, {"val_loss", Num(r.val_loss.value_or(NAN))}, {"time_unix", it->time_unix}});
      continue;
    }
    json s{{"step", r.step},
           {"loss", Num(r.loss)},
           {"lr", Num(r.lr)},
           {"grad_norm", Num(r.grad_norm)},
           {"tokens_per_s", Num(r.tokens_per_s)},
           {"step_s", Num(r.step_s)},
           {"data_s", Num(r.data_s)},
           {"compute_s", Num(r.compute_s)},
           {"comm_exposed_s", Num(r.comm_exposed_s)},
           {"optimizer_s", Num(r.optimizer_s)},
           {"rss_bytes", r.rss_bytes},
           {"time_unix", it->time_unix}};
    if (r.mfu) s["mfu"] = Num(*r.mfu);
    if (r.has_comm) {
      s["wire_bytes"] = r.wire_bytes;
      s["comm_Bps"] = Num(r.comm_s > 0 ? static_cast<double>(r.wire_bytes) / r.comm_s : 0.0);
      s["compression"] = Num(r.compression);
    }
    if (r.val_loss) s["val_loss"] = Num(*r.val_loss);
    if (r.checkpoint_stall_s) s["checkpoint_stall_s"] = Num(*r.checkpoint_stall_s);
    if (it->slowest_rank >= 0) {
      s["slowest_rank"] = it->slowest_rank;
      s["slowest_rank_busy_s"] = Num(it->slowest_busy_s);
      s["rank_busy_spread_s"] = Num(it->spread_s);
    }
    steps.push_back(std::move(s));
  }
  return json{{"steps", std::move(steps)}, {"last_step", last_step}, {"generation", generation}}.dump();  // numbers
}

std::string Monitor::EventsJson(int64_t after_id) const {
  std::vector<Event> picked;  // both rings merged in id order, copied under the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = 0, k = 0;
    while (i < events_.size() || k < samples_.size()) {
      const bool take_event = k == samples_.size() || (i < events_.size() && events_[i].id < samples_[k].id);
      const Event& e = take_event ? events_[i++] : samples_[k++];
      if (e.id > after_id) picked.push_back(e);
    }
  }
  json events = json::array();
  for (const Event& e : picked) {
    events.push_back(
        json{{"id", e.id}, {"step", e.step}, {"time_unix", e.time_unix}, {"kind", e.kind}, {"message", e.message}});
  }
  return Dump(json{{"events", std::move(events)}});
}

std::string Monitor::RanksJson() const {
  json ranks = json::array();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < rank_busy_s_.size(); ++r) {
    ranks.push_back(json{{"rank", r}, {"busy_s", Num(rank_busy_s_[r])}, {"step", rank_busy_step_}});
  }
  return json{{"ranks", std::move(ranks)}}.dump();
}

}  // namespace tf::monitor
