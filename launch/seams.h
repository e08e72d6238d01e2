// What the supervisor (launch/supervisor_machine.h) needs from the world, behind interfaces so that
// unit tests can drive it with fakes (tests/launch/supervisor_test.cpp): the clock, the process
// launcher (mpirun or srun and the local process table), the remote shell (probes, kills and
// health checks on other hosts) and the heartbeat transport (launch/heartbeat.h's server). The
// System*() implementations are the real ones and live for the process.
// Thread safety: Clock, ProcessLauncher and RemoteShell from any thread (the supervisor probes and
// kills host by host on threads of its own); a HeartbeatTransport from one thread.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "launch/heartbeat.h"

namespace tf::launch {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual double Mono() = 0;              // seconds on a steady clock
  virtual double Wall() = 0;              // seconds since the Unix epoch
  virtual void Sleep(double seconds) = 0;
};
Clock* SystemClock();

// A launcher command: argv, its output and its environment.
struct LaunchCommand {
  std::vector<std::string> argv;
  int log_fd = -1;  // stdout and stderr (the caller closes it after Start)
  // Set in the supervisor's environment before the start (mpirun forwards them with -x) ...
  std::vector<std::pair<std::string, std::string>> env;
  // ... of which these are removed from it again after the start (the job's secret).
  std::vector<std::string> forget;
  // Set ("" : removed) in the launcher's environment only.
  std::vector<std::pair<std::string, std::string>> child_env;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts the command in a session of its own (a supervisor killed with -9 leaves it running).
  virtual StatusOr<int64_t> Start(const LaunchCommand& command) = 0;
  // A child of this process: whether it ended (then *status is its wait status). Does not block.
  virtual bool Ended(int64_t pid, int* status) = 0;
  // Whether process `pid` runs and started at `start_time` (an adopted launcher, not a later process).
  virtual bool Running(int64_t pid, int64_t start_time) = 0;
  virtual int64_t StartTime(int64_t pid) = 0;  // -1 when there is no such process
  virtual void KillSession(int64_t pid) = 0;   // SIGKILL to the session `pid` leads
  virtual void Reap(int64_t pid) = 0;          // waits for an ended child
  // Processes on this machine (ranks of local hosts): /proc/PID/stat (nullopt when gone), the
  // command line (NULs as given), SIGKILL.
  virtual std::optional<std::string> Stat(int64_t pid) = 0;
  virtual std::string Cmdline(int64_t pid) = 0;
  virtual void Kill(int64_t pid) = 0;
};
ProcessLauncher* SystemLauncher();

class RemoteShell {
 public:
  virtual ~RemoteShell() = default;
  // Runs `script` with /bin/sh on `host`: its exit code, 255 when the remote shell itself failed, -1
  // after timeout_s, -2 when it could not be started; output captured into *output (may be null).
  virtual int Run(const std::string& host, const std::string& script, double timeout_s, std::string* output) = 0;
  // The same for argv on this machine (scancel; a health check of this machine's host).
  virtual int RunHere(const std::vector<std::string>& argv, double timeout_s, std::string* output) = 0;
  // Whether `host` is this machine (probed through /proc, not the remote shell).
  virtual bool IsLocal(const std::string& host) = 0;
};
// ssh (or `rsh_agent`'s words) HOST SCRIPT; with `srun` set, an srun helper step beside job
// `slurm_job_id`'s (--overlap) instead.
std::unique_ptr<RemoteShell> NewCommandShell(std::string rsh_agent, std::string srun, std::string slurm_job_id);

class HeartbeatTransport {
 public:
  using Event = HeartbeatServer::Event;
  virtual ~HeartbeatTransport() = default;
  virtual int port() const = 0;
  // Waits up to timeout_s for activity and returns what happened (possibly nothing).
  virtual std::vector<Event> Poll(double timeout_s) = 0;
  virtual bool Send(int conn, const nlohmann::json& body) = 0;  // false when the connection is gone
  virtual void Close(int conn) = 0;
};
// Binds host:port (0: any free port) for the job's ranks, authenticated with `secret`.
using TransportFactory = std::function<StatusOr<std::unique_ptr<HeartbeatTransport>>(
    const std::string& host, int port, const std::string& secret)>;
TransportFactory HeartbeatServerTransport();

// The supervisor's own signals: SIGINT/SIGTERM (stop, twice: end now) and SIGUSR1 (Slurm's time
// limit warning).
class SignalSource {
 public:
  virtual ~SignalSource() = default;
  virtual void Install() = 0;
  virtual int stops() = 0;     // SIGINT/SIGTERM so far
  virtual int warnings() = 0;  // SIGUSR1 so far
};
SignalSource* ProcessSignals();

}  // namespace tf::launch
