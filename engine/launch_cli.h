// `trainflow launch [options] -- train ...` (the supervisor, engine/supervisor.h), `trainflow
// launch --status`, and `trainflow health` (the built-in host health check the supervisor runs
// before it readmits a quarantined host). Registered on the CLI app by AddLaunchCommands;
// RunLaunchCommand runs the one parsed and returns the exit code. docs/fault-tolerance.md.
#pragma once
#include <memory>

#include <CLI/CLI.hpp>

namespace tf {

struct LaunchCommands;
std::shared_ptr<LaunchCommands> AddLaunchCommands(CLI::App& app);
bool LaunchCommandParsed(const LaunchCommands& commands);
int RunLaunchCommand(const LaunchCommands& commands);

}  // namespace tf
