#include "engine/cli/cli.h"

#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/json.h"
#include "engine/cli/checkpoint_cli.h"
#include "engine/cli/command.h"
#include "engine/cli/launch_cli.h"
#include "engine/cli/slurm_cli.h"

namespace tf {
namespace {

constexpr const char* kExitCodesHelp =
    "Exit codes: 0 done; 1 internal error; 2 bad configuration, flag or input (do not retry); 3 peer or\n"
    "communication failure or timeout (retry); 4 I/O error from the OS or storage; 5 stopped by\n"
    "SIGINT/SIGTERM or stop_at_step after finishing a step and writing the outputs (resumable).\n"
    "docs/exit-codes.md has the details.";

// Every flag of every command is accepted as --word-word and --word_word: the names of the
// arguments before a bare "--" (what follows it is another command's, passed on as given) are
// rewritten with dashes, which is how the commands declare them.
std::vector<std::string> NormalizeFlags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    args[i] = DashedFlag(args[i]);
  }
  return args;
}

}  // namespace

std::string DashedFlag(std::string arg) {
  if (!arg.starts_with("--")) return arg;
  const size_t end = std::min(arg.find('='), arg.size());
  std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return arg;
}

int RunCli(int argc, char** argv) {
  std::vector<std::string> normalized = NormalizeFlags(argc, argv);
  std::vector<char*> normalized_argv;
  for (std::string& a : normalized) normalized_argv.push_back(a.data());
  normalized_argv.push_back(nullptr);
  argv = normalized_argv.data();
  CLI::App app{"TrainFlow: a fault-tolerant GPT-2 training engine (CPU and CUDA backends)", "trainflow"};
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  app.set_version_flag("--version", "trainflow 0.1.0");

  // In the order `trainflow --help` lists them.
  std::vector<Command> commands = {AddTrainCommand(app), AddPrepareCommand(app), AddEvalCommand(app),
                                   AddSampleCommand(app), AddExportCommand(app), AddReportCommand(app)};
  const auto checkpoint = AddCheckpointCommands(app);
  commands.push_back({[checkpoint] { return CheckpointCommandParsed(*checkpoint); },
                      [checkpoint] {
                        const Status s = RunCheckpointCommand(*checkpoint);
                        return s.ok() ? kExitOk : Fail(s);
                      }});
  const auto launch = AddLaunchCommands(app);
  commands.push_back(
      {[launch] { return LaunchCommandParsed(*launch); }, [launch] { return RunLaunchCommand(*launch); }});
  const auto slurm = AddSlurmCommands(app);
  commands.push_back({[slurm] { return SlurmCommandParsed(*slurm); }, [slurm] { return RunSlurmCommand(*slurm); }});
  commands.push_back(AddEnvCommand(app));
  commands.push_back(AddBenchCommand(app));

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known |= sub->get_name() == argv[1];
    if (!known) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      return Fail(Status::InvalidArgument("unknown command '{}' (commands: {}; see trainflow --help)",
                                          QuoteForMessage(argv[1]), names));
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitBadInput;
  }
  for (const Command& c : commands) {
    if (c.parsed()) return c.run();
  }
  return kExitBadInput;
}

}  // namespace tf
