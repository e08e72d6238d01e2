#include "engine/cli/supervisor_flags.h"

#include <sstream>

#include <fmt/format.h>

#include "base/progress.h"
#include "engine/cli/command.h"

namespace tf {
namespace {

Status ParseHangTimeouts(const std::string& list, launch::LaunchOptions* o) {
  std::vector<std::string> specs;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) specs.push_back(item);
  }
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    const std::string name = eq == std::string::npos ? "" : spec.substr(0, eq);
    const std::string value = eq == std::string::npos ? spec : spec.substr(eq + 1);
    char* end = nullptr;
    const double s = std::strtod(value.c_str(), &end);
    if (value.empty() || end == value.c_str() || *end != '\0' || !(s > 0 && s <= 1e6)) {
      return Status::InvalidArgument("--hang-timeout '{}': expected [PHASE=]SECONDS with 0 < SECONDS <= 1e6", spec);
    }
    if (eq != std::string::npos && name.empty()) {
      return Status::InvalidArgument("--hang-timeout '{}': a phase name before '='", spec);
    }
    if (name.empty()) {
      // Every phase of the step loop.
      for (Phase p : {Phase::kData, Phase::kCompute, Phase::kCommunication, Phase::kOptimizer}) o->hang_timeouts[p] = s;
      continue;
    }
    Phase p;
    if (!ParsePhase(name, &p)) {
      std::string names;
      for (int i = 0; i < kNumPhases; ++i) names += fmt::format("{}{}", i ? ", " : "", PhaseName(static_cast<Phase>(i)));
      return Status::InvalidArgument("--hang-timeout '{}': unknown phase '{}' (phases: {})", spec, name, names);
    }
    o->hang_timeouts[p] = s;
  }
  return Status::OK();
}

}  // namespace

void AddSupervisorFlags(CLI::App* a, SupervisorFlags* f) {
  a->add_option("--max-restarts", f->max_restarts, "Restart budget (restarts after failures)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  a->add_option("--heartbeat-interval", f->heartbeat_interval_s,
                "Seconds between heartbeats (a dead rank is found within two)")
      ->check(FiniteRange(0.05, 60.0))
      ->capture_default_str();
  a->add_option("--late-timeout", f->late_timeout_s,
                "Seconds of silence before a rank that is alive and reachable (late: a loaded or paused machine) "
                "counts as failed; lateness never counts towards a quarantine")
      ->check(FiniteRange(0.1, 1e6))
      ->capture_default_str();
  a->add_option("--hang-timeout", f->hang_timeouts,
                "[PHASE=]SECONDS[,...] without progress before a rank counts as hung (no PHASE: the step's "
                "phases), e.g. 30 or compute=60,checkpoint=900; defaults in docs/fault-tolerance.md");
  a->add_option("--startup-timeout", f->startup_timeout_s, "Seconds for every rank to start")
      ->check(FiniteRange(1, 1e6))
      ->capture_default_str();
  a->add_option("--rescue-timeout", f->rescue_timeout_s, "Seconds for a survivor to save its state")
      ->check(FiniteRange(1, 1e6))
      ->capture_default_str();
  a->add_option("--quarantine-after", f->quarantine_after, "Failures of a host within the window that quarantine it")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  a->add_option("--quarantine-window", f->quarantine_window_s, "Seconds")->check(FiniteRange(1, 1e9))->capture_default_str();
  a->add_option("--backoff-max", f->backoff_max_s, "Longest wait before a restart (seconds)")
      ->check(FiniteRange(0, 1e6))
      ->capture_default_str();
  a->add_option("--backoff-reset", f->backoff_reset_s, "A job healthy this long resets the backoff (seconds)")
      ->check(FiniteRange(0, 1e6))
      ->capture_default_str();
}

Status ApplySupervisorFlags(const SupervisorFlags& f, launch::LaunchOptions* o) {
  o->max_restarts = f.max_restarts;
  o->heartbeat_interval_s = f.heartbeat_interval_s;
  o->late_timeout_s = f.late_timeout_s;
  if (o->late_timeout_s < 2 * o->heartbeat_interval_s) {
    return Status::InvalidArgument("--late-timeout {} s is shorter than two heartbeat intervals ({} s)",
                                   o->late_timeout_s, 2 * o->heartbeat_interval_s);
  }
  TF_RETURN_IF_ERROR(ParseHangTimeouts(f.hang_timeouts, o));
  o->startup_timeout_s = f.startup_timeout_s;
  o->rescue_timeout_s = f.rescue_timeout_s;
  o->quarantine.max_failures = f.quarantine_after;
  o->quarantine.window_s = f.quarantine_window_s;
  o->backoff.max_s = f.backoff_max_s;
  o->backoff.reset_after_s = f.backoff_reset_s;
  return Status::OK();
}

std::vector<std::string> SupervisorFlagArgs(const SupervisorFlags& f) {
  const SupervisorFlags d;
  std::vector<std::string> w = {"--max-restarts", std::to_string(f.max_restarts), "--quarantine-after",
                                std::to_string(f.quarantine_after)};
  auto number = [&w](const char* flag, double value, double default_value) {
    if (value != default_value) w.insert(w.end(), {flag, fmt::format("{}", value)});
  };
  number("--heartbeat-interval", f.heartbeat_interval_s, d.heartbeat_interval_s);
  number("--startup-timeout", f.startup_timeout_s, d.startup_timeout_s);
  number("--late-timeout", f.late_timeout_s, d.late_timeout_s);
  if (!f.hang_timeouts.empty()) w.insert(w.end(), {"--hang-timeout", f.hang_timeouts});
  number("--rescue-timeout", f.rescue_timeout_s, d.rescue_timeout_s);
  number("--quarantine-window", f.quarantine_window_s, d.quarantine_window_s);
  number("--backoff-max", f.backoff_max_s, d.backoff_max_s);
  number("--backoff-reset", f.backoff_reset_s, d.backoff_reset_s);
  return w;
}

}  // namespace tf
