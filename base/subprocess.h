// Running a helper command (launchers, remote shells, scontrol/sbatch) from the supervisor and the
// Slurm commands: a forked child whose stdout and stderr go to a file descriptor or are captured.
// Thread safety: the functions may be called from any thread (each call forks its own child).
#pragma once
#include <string>
#include <vector>

namespace tf {

// In a forked child: stdout and stderr to `out_fd`, stdin from /dev/null, then argv (exit 127 if it
// cannot run, saying why on out_fd).
[[noreturn]] void ExecWithOutput(const std::vector<std::string>& argv, int out_fd);

// Runs argv (in its own process group) with a deadline; stdout+stderr captured into `output` (up to
// 64 KiB; may be null). Returns the exit code, 128+signal when killed by one, -1 on timeout (the
// group is killed), -2 when it could not be started.
int RunCommand(const std::vector<std::string>& argv, double timeout_s, std::string* output);

// The path of the running binary (/proc/self/exe); `fallback` when the system cannot say.
std::string SelfExecutable(const std::string& fallback);

}  // namespace tf
