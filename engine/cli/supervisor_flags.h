// The supervisor's flags (launch/supervisor.h LaunchOptions) that `trainflow launch` and
// `trainflow slurm submit|run` share, declared once: their names, checks, help and defaults (taken
// from LaunchOptions), how they become LaunchOptions, and how `slurm submit` writes them into the
// job's script for `slurm run`. docs/fault-tolerance.md, docs/slurm.md.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "launch/supervisor.h"

namespace tf {

struct SupervisorFlags {
  int max_restarts = launch::LaunchOptions{}.max_restarts;
  int quarantine_after = launch::LaunchOptions{}.quarantine.max_failures;
  double quarantine_window_s = launch::LaunchOptions{}.quarantine.window_s;
  double heartbeat_interval_s = launch::LaunchOptions{}.heartbeat_interval_s;
  double late_timeout_s = launch::LaunchOptions{}.late_timeout_s;
  std::string hang_timeouts;  // [PHASE=]SECONDS[,...]; "" = the defaults
  double startup_timeout_s = launch::LaunchOptions{}.startup_timeout_s;
  double rescue_timeout_s = launch::LaunchOptions{}.rescue_timeout_s;
  double backoff_max_s = launch::LaunchOptions{}.backoff.max_s;
  double backoff_reset_s = launch::LaunchOptions{}.backoff.reset_after_s;
};

// Adds the flags to `app`, bound to `flags`; their values on entry are the defaults shown.
// REQUIRES: `flags` outlives the parse.
void AddSupervisorFlags(CLI::App* app, SupervisorFlags* flags);

// Copies the flags into `options`. InvalidArgument for a --late-timeout under two heartbeat
// intervals or a malformed --hang-timeout.
Status ApplySupervisorFlags(const SupervisorFlags& flags, launch::LaunchOptions* options);

// The flags as command-line words for `slurm run` in the job's script: --max-restarts and
// --quarantine-after always (the script states the job's budgets), the others where they differ
// from LaunchOptions' defaults. Parsing the words back gives the same flags.
std::vector<std::string> SupervisorFlagArgs(const SupervisorFlags& flags);

}  // namespace tf
