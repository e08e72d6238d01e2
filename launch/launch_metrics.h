// The supervisor's /metrics and /api/run (docs/fault-tolerance.md "Metrics"): Prometheus text and
// the JSON of state.json, both from the last snapshot of the supervisor's state (Update).
// Thread safety: Update from the supervisor's thread, the rest from the metrics server's.
#pragma once
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "monitor/metrics.h"

namespace tf::launch {

class LaunchMetrics : public monitor::MetricsSource {
 public:
  void Update(nlohmann::json snapshot) {
    std::lock_guard<std::mutex> lock(mu_);
    snap_ = std::move(snapshot);
  }
  std::string RunJson() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return snap_.dump();
  }
  std::string Exposition() const override;

 private:
  mutable std::mutex mu_;
  nlohmann::json snap_ = nlohmann::json::object();  // guarded by mu_
};

}  // namespace tf::launch
