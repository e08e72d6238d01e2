// `trainflow checkpoint list|inspect|verify DIR`: what a checkpoint directory holds (docs/checkpoints.md).
// Registered on the CLI app by AddCheckpointCommands; RunCheckpointCommand runs the one that was
// parsed (REQUIRES: one was) and returns its error, for the CLI to report.
#pragma once
#include <memory>

#include <CLI/CLI.hpp>

#include "base/status.h"

namespace tf {

struct CheckpointCommands;
std::shared_ptr<CheckpointCommands> AddCheckpointCommands(CLI::App& app);
Status RunCheckpointCommand(const CheckpointCommands& commands);
// True when a checkpoint subcommand was parsed.
bool CheckpointCommandParsed(const CheckpointCommands& commands);

}  // namespace tf
