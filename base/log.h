// Logging: spdlog's default logger, set up once by main() (InitLogging) and used everywhere through
// spdlog::debug/info/warn/error. Diagnostics go to stderr as "trainflow: warning: ..." (with
// "[rank R]" in a job of several ranks) and, when a log file is given, also to that file with
// timestamps; the product's own output (progress lines, samples, results) stays on stdout.
// Thread safety: spdlog's loggers are thread-safe; InitLogging is called once, before threads start.
#pragma once
#include <string>

#include <spdlog/spdlog.h>

#include "base/status.h"

namespace tf {

struct LogOptions {
  int rank = -1;          // < 0: a single-process run (no rank prefix)
  std::string level = "info";  // debug, info, warning, error, off
  std::string file;       // "" = stderr only; else appended to (created if missing)
};

// Installs the default logger. InvalidArgument for an unknown level, IOError (naming the file and
// errno) for a log file that cannot be opened; stderr logging works in every case.
Status InitLogging(const LogOptions& options);
// The launcher's rank from the environment (Open MPI, PMI, Slurm), -1 when not launched as a job.
int RankFromEnvironment();

}  // namespace tf
