#include "launch/supervisor.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/env.h"
#include "launch/state_store.h"
#include "launch/supervisor_machine.h"

namespace tf::launch {

using json = nlohmann::json;

int RunSupervisor(const LaunchOptions& options, SupervisorOutcome* outcome) {
  Supervisor s(options, outcome, SupervisorWorld{});
  return s.Run();
}

Status PrintLaunchStatus(const std::string& state_dir, bool as_json) {
  TF_ASSIGN_OR_RETURN(json st, ReadLaunchState(Env::Default(), state_dir));
  const std::vector<json> incidents = ReadIncidents(Env::Default(), state_dir);
  std::string holder;
  const bool running = SupervisorRunning(state_dir, &holder);
  if (as_json) {
    st["supervisor_running"] = running;
    st["incidents"] = incidents;
    fmt::print("{}\n", st.dump(2));
    return Status::OK();
  }
  fmt::print("supervisor: {} (state {}, updated {})\n", running ? "running, pid " + holder : "not running",
             st.value("status", "?"), st.value("updated", "?"));
  const int base = st.value("budget_base", 0);
  fmt::print("restarts: {} of at most {}{}; late ranks {}; effective training time {:.1f}% of {:.1f} s; {:.1f} s down\n",
             st.value("restarts", 0) - base, st.value("max_restarts", 0),
             base > 0 ? fmt::format(" ({} in earlier runs)", base) : "", st.value("late", 0),
             100.0 * st.value("effective_ratio", 0.0), st.value("wall_s", 0.0), st.value("downtime_s", 0.0));
  if (st.contains("job") && st["job"].is_object()) {
    const json& j = st["job"];
    fmt::print("job: generation {}, {} rank(s), batch_size {} x grad_accum_steps {}, mpirun pid {}\n",
               j.value("generation", 0), j.value("world", 0), j.value("batch_size", 0),
               j.value("grad_accum_steps", 0), j.value("mpirun_pid", 0));
    for (const json& r : j.value("ranks", json::array())) {
      fmt::print("  rank {:>3} on {:<16} pid {:<8} step {:<8} {}\n", r.value("rank", 0), r.value("host", ""),
                 r.value("pid", 0), r.value("step", 0), r.value("phase", ""));
    }
  }
  fmt::print("hosts:\n");
  if (st.contains("hosts") && st["hosts"].is_object()) {
    QuarantinePolicy p;
    auto book = HostBook::FromJson(st["hosts"], p);
    if (book.ok()) {
      for (const json& h : st["hosts"].value("hosts", json::array())) {
        const std::string name = h.is_object() ? h.value("name", "") : h.is_string() ? h.get<std::string>() : "";
        if (name.empty()) continue;
        fmt::print("  {:<20} {:<12} {} failure(s){}\n", name, HostStateName(book->state(name)),
                   book->total_failures(name),
                   book->last_cause(name).empty() ? "" : ", last: " + book->last_cause(name));
      }
    }
  }
  fmt::print("incidents ({}):\n", incidents.size());
  const size_t from = incidents.size() > 20 ? incidents.size() - 20 : 0;
  for (size_t i = from; i < incidents.size(); ++i) {
    const json& e = incidents[i];
    fmt::print("  {} {:<18} {}\n", e.value("time", ""), e.value("kind", ""),
               e.value("detail", e.contains("action") ? e.value("action", "") : std::string()));
  }
  return Status::OK();
}

}  // namespace tf::launch
