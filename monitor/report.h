// Offline report of a training run: one self-contained HTML page (inline CSS and SVG charts, no
// script, nothing fetched) of the curves in a run's metrics.jsonl, its events and a summary.
//
// Input: one JSON object per line. A line with an "event" key is an event (listed, and marked on the
// loss chart; an "eval" event's "val_loss" is plotted as a validation point of its step); any other
// object with a non-negative integer "step" is a step record. A step record's checkpoint_stall_ms is
// listed as a checkpoint event too, and ReportOptions::job_events (the supervisor's restarts,
// failures, rescues) follow the file's events. A later record
// of a step replaces an earlier one, and an event {"event":"rollback","to_step":S} discards every
// step record with step > S that came before it (the abandoned branch); events are always kept.
// Blank lines and a torn last line (no newline, not JSON) are ignored; other lines that are not such
// objects (or are nested over 16 deep) are skipped and counted in the report. null (how a non-finite
// value is written) is left out of the charts and counted in their legends. Long runs are downsampled
// to the min and max per pixel column, so a 1M-step run stays well under 2 MB. All text from the
// input and the options is HTML-escaped.
// Errors: kInvalidArgument when no step record remains.
//
// Thread safety: a pure function; safe to call concurrently.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace tf::monitor {

// An event from outside metrics.jsonl (the supervisor's incidents): listed, and marked on the loss
// chart when it has a step.
struct ReportEvent {
  std::optional<int64_t> step;
  std::string kind, message, details;
};

struct ReportOptions {
  std::string title = "TrainFlow run";
  std::string subtitle;               // e.g. model and run id
  nlohmann::json run_info = nullptr;  // optional: scalars in one table, each object member in its own
  bool loss_log_scale = false;        // a logarithmic y axis on the loss chart
  std::vector<ReportEvent> job_events;
};

StatusOr<std::string> RenderReportHtml(std::string_view metrics_jsonl, const ReportOptions& options);

}  // namespace tf::monitor
