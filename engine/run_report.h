// The offline report of a run (monitor/report.h) from its output directory: metrics.jsonl, and the
// model and training configs and the supervisor's launch/incidents.jsonl (restarts, failures,
// rescues) when present, rendered to one self-contained HTML file. Written at the
// end of every run (rank 0, <out_dir>/report.html) and by `trainflow report RUN_DIR`.
#pragma once
#include <string>

#include "base/env.h"
#include "base/status.h"

namespace tf {

// Writes `out_path` (atomically; "" = RUN_DIR/report.html) and returns its path. Errors name the
// directory or file: no metrics.jsonl, no step records in it, an unwritable output.
StatusOr<std::string> WriteRunReport(const std::string& run_dir, const std::string& out_path, Env* env);

}  // namespace tf
