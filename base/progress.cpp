#include "base/progress.h"

#include "base/clock.h"

#include <atomic>
#include <mutex>

namespace tf {
namespace {

std::atomic<int> g_phase{0};
std::atomic<int64_t> g_step{0};
std::atomic<uint64_t> g_progress{0};
std::atomic<int64_t> g_checkpoint{-1};
std::atomic<double> g_step_time{0};
std::atomic<int64_t> g_start_step{-1};
std::atomic<double> g_first_step_time{0};
std::atomic<int64_t> g_checkpoint_bytes{0};
std::atomic<bool> g_abort{false};
std::mutex g_reason_mu;
std::string g_metrics_url;  // guarded by g_reason_mu
std::string g_reason;  // guarded by g_reason_mu

constexpr const char* kNames[kNumPhases] = {"startup",   "data",       "compute", "communication", "optimizer",
                                            "checkpoint", "eval",      "sample",  "finishing",     "rescue"};

}  // namespace

const char* PhaseName(Phase p) {
  const int i = static_cast<int>(p);
  return i >= 0 && i < kNumPhases ? kNames[i] : "unknown";
}

bool ParsePhase(const std::string& name, Phase* out) {
  for (int i = 0; i < kNumPhases; ++i) {
    if (name == kNames[i]) {
      *out = static_cast<Phase>(i);
      return true;
    }
  }
  return false;
}

void SetPhase(Phase p) {
  g_phase.store(static_cast<int>(p), std::memory_order_relaxed);
  g_progress.fetch_add(1, std::memory_order_relaxed);
}
void SetStepsDone(int64_t step) {
  const double now = UnixSeconds();
  g_step_time.store(now, std::memory_order_relaxed);
  const int64_t start = g_start_step.load(std::memory_order_relaxed);
  if (start >= 0 && step == start + 1 && g_first_step_time.load(std::memory_order_relaxed) == 0) {
    g_first_step_time.store(now, std::memory_order_relaxed);
  }
  g_step.store(step, std::memory_order_relaxed);
}
void AddCheckpointBytes(int64_t bytes) { g_checkpoint_bytes.fetch_add(bytes, std::memory_order_relaxed); }

void SetStartStep(int64_t step) { g_start_step.store(step, std::memory_order_relaxed); }
void AdvanceProgress() { g_progress.fetch_add(1, std::memory_order_relaxed); }
void SetCommittedCheckpoint(int64_t step) {
  int64_t cur = g_checkpoint.load();
  while (step > cur && !g_checkpoint.compare_exchange_weak(cur, step)) {
  }
}

ProgressSnapshot ReadProgress() {
  ProgressSnapshot s;
  s.phase = static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
  s.step = g_step.load(std::memory_order_relaxed);
  s.progress = g_progress.load(std::memory_order_relaxed);
  s.checkpoint_step = g_checkpoint.load(std::memory_order_relaxed);
  s.step_time = g_step_time.load(std::memory_order_relaxed);
  s.start_step = g_start_step.load(std::memory_order_relaxed);
  s.first_step_time = g_first_step_time.load(std::memory_order_relaxed);
  s.checkpoint_bytes = g_checkpoint_bytes.load(std::memory_order_relaxed);
  return s;
}

void RequestAbort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(g_reason_mu);
    if (g_reason.empty()) g_reason = reason;
  }
  g_abort.store(true);
}
bool AbortRequested() { return g_abort.load(std::memory_order_relaxed); }
std::string AbortReason() {
  std::lock_guard<std::mutex> lock(g_reason_mu);
  return g_reason;
}
void SetMetricsUrl(const std::string& url) {
  std::lock_guard<std::mutex> lock(g_reason_mu);
  g_metrics_url = url;
}
std::string MetricsUrl() {
  std::lock_guard<std::mutex> lock(g_reason_mu);
  return g_metrics_url;
}
void ClearAbortRequest() {
  std::lock_guard<std::mutex> lock(g_reason_mu);
  g_reason.clear();
  g_abort.store(false);
}

}  // namespace tf
