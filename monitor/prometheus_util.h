// Building prometheus-cpp metric families by hand, for collectors that compute their values at
// scrape time (monitor/system_metrics.cpp, the supervisor's metrics). Pure helpers.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

namespace tf::monitor {

inline prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

// A counter or gauge sample (by the family's type).
inline void AddSample(prometheus::MetricFamily* f, double value, std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f->type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

inline prometheus::MetricFamily Single(const char* name, const char* help, prometheus::MetricType type, double value,
                                       std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::MetricFamily f = Family(name, help, type);
  AddSample(&f, value, std::move(labels));
  return f;
}

}  // namespace tf::monitor
