#include "engine/anomaly_guard.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tf {
namespace {

int Severity(AnomalyAction a) {
  switch (a) {
    case AnomalyAction::kStop: return 4;
    case AnomalyAction::kRollback: return 3;
    case AnomalyAction::kSkip: return 2;
    case AnomalyAction::kWarn: return 1;
    case AnomalyAction::kOff: return 0;
  }
  return 0;
}

// Statistics are of log(1 + x): losses and norms vary multiplicatively, and 1 + keeps values near 0
// (a memorised batch) from looking like large relative jumps.
double Transform(double x) { return std::log1p(std::max(x, 0.0)); }
constexpr double kMinStddev = 0.02;  // of log(1 + x): about 2%

}  // namespace

StatusOr<AnomalyAction> ParseAnomalyAction(const std::string& name) {
  if (name == "off") return AnomalyAction::kOff;
  if (name == "warn") return AnomalyAction::kWarn;
  if (name == "skip") return AnomalyAction::kSkip;
  if (name == "stop") return AnomalyAction::kStop;
  if (name == "rollback") return AnomalyAction::kRollback;
  return Status::InvalidArgument("anomaly action must be off, warn, skip, stop or rollback, got '{}'", name);
}

const char* AnomalyActionName(AnomalyAction a) {
  switch (a) {
    case AnomalyAction::kOff: return "off";
    case AnomalyAction::kWarn: return "warn";
    case AnomalyAction::kSkip: return "skip";
    case AnomalyAction::kStop: return "stop";
    case AnomalyAction::kRollback: return "rollback";
  }
  return "?";
}

std::string Anomaly::Describe(int64_t step) const {
  const char* what = kind.starts_with("loss") || kind == "nonfinite_loss" ? "loss" : "gradient norm";
  if (kind.starts_with("nonfinite")) {
    return fmt::format("step {}: {} is {} (action {})", step, what, value, AnomalyActionName(action));
  }
  return fmt::format("step {}: {} {:.4g} is {:.1f} standard deviations above the recent mean {:.4g} (log scale; "
                     "action {})",
                     step, what, value, zscore, mean, AnomalyActionName(action));
}

std::optional<Anomaly> AnomalyGuard::Spike(const Series& s, double x, const char* kind) const {
  if (o_.spike == AnomalyAction::kOff) return std::nullopt;
  const size_t n = s.values.size();
  if (n < static_cast<size_t>(std::max(2, o_.window / 4))) return std::nullopt;
  const double mean = s.sum / static_cast<double>(n);
  const double var = std::max(0.0, s.sum_sq / static_cast<double>(n) - mean * mean);
  const double stddev = std::max(std::sqrt(var), kMinStddev);
  if ((Transform(x) - mean) / stddev <= o_.zscore) return std::nullopt;
  // Reported in the values' own units: the window's mean, and the z-score in the message.
  Anomaly a{kind, o_.spike, x, std::expm1(mean), stddev};
  a.zscore = (Transform(x) - mean) / stddev;
  return a;
}

void AnomalyGuard::Accept(Series& s, double x) {
  x = Transform(x);
  s.values.push_back(x);
  s.sum += x;
  s.sum_sq += x * x;
  if (s.values.size() > static_cast<size_t>(o_.window)) {
    const double old = s.values.front();
    s.values.pop_front();
    s.sum -= old;
    s.sum_sq -= old * old;
  }
}

std::optional<Anomaly> AnomalyGuard::Check(double loss, double grad_norm) {
  std::optional<Anomaly> worst;
  auto consider = [&](std::optional<Anomaly> a) {
    if (a && a->action != AnomalyAction::kOff && (!worst || Severity(a->action) > Severity(worst->action))) worst = a;
  };
  if (!std::isfinite(loss)) consider(Anomaly{"nonfinite_loss", o_.nonfinite, loss});
  if (!std::isfinite(grad_norm)) consider(Anomaly{"nonfinite_grad_norm", o_.nonfinite, grad_norm});
  if (std::isfinite(loss)) consider(Spike(loss_, loss, "loss_spike"));
  if (std::isfinite(grad_norm)) consider(Spike(norm_, grad_norm, "grad_norm_spike"));
  if (!worst || worst->action == AnomalyAction::kWarn) {
    if (std::isfinite(loss)) Accept(loss_, loss);
    if (std::isfinite(grad_norm)) Accept(norm_, grad_norm);
  }
  return worst;
}

void AnomalyGuard::Reset() {
  loss_ = Series{};
  norm_ = Series{};
}

std::vector<std::pair<std::string, std::string>> AnomalyGuard::LabelPairs() const {
  std::vector<std::pair<std::string, std::string>> out;
  if (o_.nonfinite != AnomalyAction::kOff) {
    for (const char* kind : {"nonfinite_loss", "nonfinite_grad_norm"}) out.emplace_back(kind, AnomalyActionName(o_.nonfinite));
  }
  if (o_.spike != AnomalyAction::kOff) {
    for (const char* kind : {"loss_spike", "grad_norm_spike"}) out.emplace_back(kind, AnomalyActionName(o_.spike));
  }
  return out;
}

}  // namespace tf
