// The `trainflow` command line (CLI11): train, prepare, eval, sample, export, report, checkpoint, env, bench.
// Usage and every flag: `trainflow --help`, `trainflow <command> --help`; overview in README.md.
#pragma once

namespace tf {

// Runs the command; returns the process exit code (base/status.h ExitCode: 0 done, 2 bad input,
// 3 retryable communication failure, 4 I/O error, 5 stopped on request, 1 internal error).
// Errors are logged to stderr as "trainflow: error: <message>".
int RunCli(int argc, char** argv);

}  // namespace tf
