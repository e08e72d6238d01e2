#include "launch/launch_metrics.h"

#include <vector>

#include <prometheus/text_serializer.h>

#include "monitor/prometheus_util.h"

namespace tf::launch {

using json = nlohmann::json;

std::string LaunchMetrics::Exposition() const {
  using prometheus::MetricType;
  using monitor::AddSample;
  using monitor::Family;
  using monitor::Single;
  json s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = snap_;
  }
  // Numbers only (a null would throw): 0 for anything else.
  auto num = [](const json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  std::vector<prometheus::MetricFamily> out;
  out.push_back(Single("trainflow_launch_restarts_total", "Restarts of the job after a failure.",
                       MetricType::Counter, num(s, "restarts")));
  out.push_back(Single("trainflow_launch_late_total",
                       "Ranks found late (silent, alive, reachable; not failures) by this supervisor.",
                       MetricType::Counter, num(s, "late")));
  auto by = [&](const char* name, const char* help, const char* label, const char* key) {
    prometheus::MetricFamily f = Family(name, help, MetricType::Counter);
    const json by_key = s.value(key, json::object());
    for (const auto& [k, v] : by_key.items()) AddSample(&f, v.is_number() ? v.get<double>() : 0.0, {{label, k}});
    if (!f.metric.empty()) out.push_back(std::move(f));
  };
  by("trainflow_launch_failures_total", "Failures detected, by cause (dead, hung, unresponsive, lost_host, failed, "
     "launcher, startup).", "cause", "failures_by_cause");
  by("trainflow_launch_host_failures_total", "Failures attributed to each host.", "host", "failures_by_host");
  out.push_back(Single("trainflow_launch_downtime_seconds_total",
                       "Seconds from each failure's detection to the first training step after it.",
                       MetricType::Counter, num(s, "downtime_s")));
  out.push_back(Single("trainflow_launch_productive_seconds_total",
                       "Step time of the steps the final model keeps (lost work excluded).", MetricType::Counter,
                       num(s, "productive_s")));
  out.push_back(Single("trainflow_launch_wall_seconds", "Wall time of the supervised run so far.", MetricType::Gauge,
                       num(s, "wall_s")));
  out.push_back(Single("trainflow_launch_effective_training_ratio", "Productive step time / wall time.",
                       MetricType::Gauge, num(s, "effective_ratio")));
  out.push_back(Single("trainflow_launch_generation", "Launches of the job so far.", MetricType::Gauge,
                       num(s, "generation")));
  const json job = s.contains("job") && s["job"].is_object() ? s["job"] : json::object();
  out.push_back(Single("trainflow_launch_world_size", "Ranks of the running job (0: none running).",
                       MetricType::Gauge, job.is_object() ? num(job, "world") : 0.0));
  prometheus::MetricFamily hosts = Family("trainflow_launch_host_state", "1 for each host's state.", MetricType::Gauge);
  for (const json& h : s.value("host_states", json::array())) {
    AddSample(&hosts, 1.0, {{"host", h.value("name", "")}, {"state", h.value("state", "")}});
  }
  if (!hosts.metric.empty()) out.push_back(std::move(hosts));
  const json u = s.value("usage", json::object());
  out.push_back(Single("trainflow_job_node_hours_total", "Host-hours held by the job (hosts x wall time, every run).",
                       MetricType::Counter, num(u, "node_seconds") / 3600.0));
  out.push_back(Single("trainflow_job_gpu_hours_total", "GPU-hours held by the job (GPUs x wall time, every run).",
                       MetricType::Counter, num(u, "gpu_seconds") / 3600.0));
  out.push_back(Single("trainflow_job_tokens_total", "Tokens trained by the job (all ranks; lost work included).",
                       MetricType::Counter, num(u, "tokens")));
  out.push_back(Single("trainflow_job_checkpoint_bytes_total", "Bytes the job's checkpoints stored.",
                       MetricType::Counter, num(u, "checkpoint_bytes")));
  out.push_back(Single("trainflow_job_requeues_total", "Slurm requeues and resubmissions of the job.",
                       MetricType::Counter, num(u, "requeues")));
  return prometheus::TextSerializer().Serialize(out);
}

}  // namespace tf::launch
