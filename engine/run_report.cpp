#include "engine/run_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json.h"
#include "monitor/report.h"

namespace tf {
namespace {

// The supervisor's incidents (docs/fault-tolerance.md: one JSON object per line with "kind", and
// "step", "detail", "action", "restart", "rescue" ... where they apply) as report events. A line
// that is not such an object is skipped; a file that is not a regular file, or is over
// kMaxJsonFileBytes, gives one event saying so.
std::vector<monitor::ReportEvent> JobEvents(const std::string& path, Env* env) {
  std::vector<monitor::ReportEvent> events;
  auto info = env->Stat(path);
  if (!info.ok() || !info->exists) return events;
  StatusOr<std::string> text = info->is_regular && info->size <= kMaxJsonFileBytes
                                   ? env->ReadFileToString(path)
                                   : StatusOr<std::string>(Status::InvalidArgument("not a regular file of at most {} bytes",
                                                                                   kMaxJsonFileBytes));
  if (!text.ok()) {
    events.push_back({std::nullopt, "job", fmt::format("{} not read: {}", path, text.status().message()), ""});
    return events;
  }
  size_t skipped = 0;
  for (size_t pos = 0; pos < text->size();) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    const std::string_view line(text->data() + pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    StatusOr<nlohmann::json> j = ParseJson(line, "incidents.jsonl", /*allow_comments=*/false);
    if (!j.ok() || !j->is_object() || !j->contains("kind") || !(*j)["kind"].is_string()) {
      ++skipped;
      continue;
    }
    monitor::ReportEvent e;
    nlohmann::json rest = nlohmann::json::object();
    for (const auto& [key, value] : j->items()) {
      if (key == "kind") e.kind = value.get<std::string>();
      else if (key == "step" && value.is_number_integer() && value.get<int64_t>() >= 0) e.step = value.get<int64_t>();
      else if ((key == "detail" || key == "action") && value.is_string() && e.message.empty()) e.message = value.get<std::string>();
      else rest[key] = value;
    }
    if (const auto r = rest.find("restart"); r != rest.end() && r->is_number_integer()) {
      e.message += fmt::format("{}restart {}", e.message.empty() ? "" : "; ", r->get<int64_t>());
    }
    if (e.kind == "recovered" && rest.contains("failure_to_step_s") && rest["failure_to_step_s"].is_number()) {
      e.message = fmt::format("training again, {:.1f} s after the failure was detected",
                              rest["failure_to_step_s"].get<double>());
    }
    e.details = rest.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    events.push_back(std::move(e));
  }
  if (skipped > 0) events.push_back({std::nullopt, "job", fmt::format("{}: {} unreadable lines skipped", path, skipped), ""});
  return events;
}

}  // namespace

StatusOr<std::string> WriteRunReport(const std::string& run_dir, const std::string& out_path, Env* env) {
  const std::string jsonl = run_dir + "/metrics.jsonl";
  TF_ASSIGN_OR_RETURN(const FileInfo info, env->Stat(jsonl));
  if (!info.exists) {
    return Status::NotFound("{} has no metrics.jsonl: give the out_dir of a training run", run_dir);
  }
  TF_ASSIGN_OR_RETURN(const std::string text, env->ReadFileToString(jsonl));
  monitor::ReportOptions o;
  o.title = "TrainFlow run: " + run_dir;
  nlohmann::json run = nlohmann::json::object();
  for (const char* name : {"model_config", "train_config"}) {
    const std::string path = run_dir + "/" + name + ".json";
    auto st = env->Stat(path);
    if (!st.ok() || !st->exists) continue;
    auto body = env->ReadFileToString(path);
    if (!body.ok()) continue;
    StatusOr<nlohmann::json> j = ParseJson(*body, path, /*allow_comments=*/false);
    if (j.ok() && j->is_object()) run[name] = std::move(*j);
  }
  if (run.contains("model_config")) {
    const nlohmann::json& m = run["model_config"];
    o.subtitle = m.dump();
  }
  if (!run.empty()) o.run_info = std::move(run);
  // `trainflow launch` keeps its state in OUT_DIR/launch unless --state-dir says otherwise.
  o.job_events = JobEvents(run_dir + "/launch/incidents.jsonl", env);
  StatusOr<std::string> html = monitor::RenderReportHtml(text, o);
  if (!html.ok()) return html.status().WithContext(jsonl);
  const std::string out = out_path.empty() ? run_dir + "/report.html" : out_path;
  TF_RETURN_IF_ERROR(env->WriteFileAtomically(out, *html));
  return out;
}

}  // namespace tf
