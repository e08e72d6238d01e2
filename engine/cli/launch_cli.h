// `trainflow launch [options] -- train ...` (the supervisor, launch/supervisor.h), `trainflow
// launch --status`, and `trainflow health` (the built-in host health check the supervisor runs
// before it readmits a quarantined host). Registered on the CLI app by AddLaunchCommands;
// RunLaunchCommand runs the one parsed and returns the exit code. docs/fault-tolerance.md.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/status.h"

namespace tf {

// OK when `program` (a path, or a name looked up on PATH) is an executable file; else
// InvalidArgument naming `what` (the flag).
Status CheckProgram(const std::string& program, const std::string& what);

struct LaunchCommands;
std::shared_ptr<LaunchCommands> AddLaunchCommands(CLI::App& app);
bool LaunchCommandParsed(const LaunchCommands& commands);
int RunLaunchCommand(const LaunchCommands& commands);

}  // namespace tf
