// The `trainflow` command line (CLI11): train, prepare, eval, sample, export, bench.
// Usage and every flag: `trainflow --help`, `trainflow <command> --help`; overview in README.md.
#pragma once

namespace tf {

// Runs the command; returns the process exit code (0 ok, 1 runtime error, 2 usage error).
// Errors are printed to stderr as "trainflow: error: <message>".
int RunCli(int argc, char** argv);

}  // namespace tf
