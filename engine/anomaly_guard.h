// AnomalyGuard: judges each step's loss and gradient norm before the optimizer applies the update.
// A non-finite loss or norm is an anomaly; so is a spike — a value whose log(1 + x) is more than
// `zscore` standard deviations above the mean of the last `window` accepted values' (losses and norms
// vary multiplicatively; the deviation is floored at 0.02, about 2%, so a flat series does not flag
// noise; nothing is flagged before window/4 values are in). Each kind has an action: warn (apply the update anyway), skip (do not apply it), stop
// (end the run with an error), rollback (return to the newest checkpoint and skip the data since).
//
// Every rank sees the same numbers (the loss is averaged over the ranks, the norm is of the averaged
// gradients), so every rank reaches the same verdict without a collective. Values of updates that
// were not applied do not enter the statistics. Thread safety: one thread.
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace tf {

enum class AnomalyAction { kOff, kWarn, kSkip, kStop, kRollback };

StatusOr<AnomalyAction> ParseAnomalyAction(const std::string& name);
const char* AnomalyActionName(AnomalyAction a);

struct Anomaly {
  std::string kind;  // nonfinite_loss, nonfinite_grad_norm, loss_spike, grad_norm_spike
  AnomalyAction action = AnomalyAction::kWarn;
  // The offending value; for spikes, the window's mean (geometric, of 1 + x, minus 1), the standard
  // deviation of log(1 + x) and the value's z-score on that scale.
  double value = 0, mean = 0, stddev = 0, zscore = 0;
  // "step 12: loss 9.1 is 7.2 standard deviations above the mean 4.10 of the last 100 steps (action skip)"
  std::string Describe(int64_t step) const;
};

class AnomalyGuard {
 public:
  struct Options {
    AnomalyAction nonfinite = AnomalyAction::kStop;
    AnomalyAction spike = AnomalyAction::kWarn;
    double zscore = 8.0;
    int window = 100;
  };
  explicit AnomalyGuard(const Options& o) : o_(o) {}

  // The most severe anomaly of the step (stop > rollback > skip > warn), or none. An accepted step
  // (no anomaly, or warn) enters the statistics.
  std::optional<Anomaly> Check(double loss, double grad_norm);
  // Forget the statistics (after a rollback).
  void Reset();
  // The (kind, action) pairs that can occur: label values for the metrics.
  std::vector<std::pair<std::string, std::string>> LabelPairs() const;

 private:
  struct Series {
    std::deque<double> values;
    double sum = 0, sum_sq = 0;
  };
  std::optional<Anomaly> Spike(const Series& s, double x, const char* kind) const;
  void Accept(Series& s, double x);

  Options o_;
  Series loss_, norm_;
};

}  // namespace tf
