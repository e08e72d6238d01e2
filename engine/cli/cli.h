// The `trainflow` command line (CLI11). Its commands, each in a file of its own under engine/cli/:
// train, prepare, eval, sample, export, report (*_cmd.cpp), checkpoint (checkpoint_cli), launch and
// health (launch_cli), slurm (slurm_cli), env (env_report), bench (bench). cli.cpp registers them
// and runs the one named. Usage and every flag: `trainflow --help`, `trainflow <command> --help`;
// overview in README.md.
#pragma once
#include <string>
#include <vector>

#include "base/status.h"

namespace tf {

struct GPT2Config;
struct TrainConfig;

// Runs the command; returns the process exit code (base/status.h ExitCode: 0 done, 2 bad input,
// 3 retryable communication failure, 4 I/O error, 5 stopped on request, 1 internal error).
// Errors are logged to stderr as "trainflow: error: <message>".
int RunCli(int argc, char** argv);

// "--out_dir=a_b" as every command declares it, "--out-dir=a_b" (the name's underscores become
// dashes; the value and anything not starting with "--" stay as given).
std::string DashedFlag(std::string arg);

// The configs of a `train ...` command line (args[0] == "train"), as `trainflow train` would resolve
// them (for `trainflow launch`, which checks them before launching anything).
Status ResolveTrainCommand(const std::vector<std::string>& args, GPT2Config* model, TrainConfig* train);

}  // namespace tf
