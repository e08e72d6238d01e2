#include "engine/run_report.h"

#include <nlohmann/json.hpp>

#include "monitor/report.h"

namespace tf {

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
    nlohmann::json j = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) run[name] = std::move(j);
  }
  if (run.contains("model_config")) {
    const nlohmann::json& m = run["model_config"];
    o.subtitle = m.dump();
  }
  if (!run.empty()) o.run_info = std::move(run);
  StatusOr<std::string> html = monitor::RenderReportHtml(text, o);
  if (!html.ok()) return html.status().WithContext(jsonl);
  const std::string out = out_path.empty() ? run_dir + "/report.html" : out_path;
  TF_RETURN_IF_ERROR(env->WriteFileAtomically(out, *html));
  return out;
}

}  // namespace tf
