// `trainflow report RUN_DIR`: a self-contained HTML report of a run's curves (engine/run_report.h).
#include <memory>
#include <string>

#include <fmt/format.h>

#include "base/env.h"
#include "engine/cli/command.h"
#include "engine/run_report.h"

namespace tf {

Command AddReportCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Write a self-contained HTML report of a run's curves (metrics.jsonl)");
  struct Args {
    std::string run_dir, out;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("RUN_DIR", a->run_dir, "The run's out_dir (holding metrics.jsonl)")->required();
  cmd->add_option("--out", a->out, "Output file (default: RUN_DIR/report.html)");
  return {[cmd] { return cmd->parsed(); },
          [a] {
            auto path = WriteRunReport(a->run_dir, a->out, Env::Default());
            if (!path.ok()) return Fail(path.status());
            fmt::print("report: {}\n", *path);
            return 0;
          }};
}

}  // namespace tf
