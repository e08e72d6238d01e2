// The job of `trainflow launch` as the supervisor's state machine (launch/supervisor_machine.h)
// sees it: start a generation through the launcher, tell whether the launcher still runs (a child,
// or one adopted from an earlier supervisor), tear it down, and probe, kill and health-check ranks
// and hosts. NewProcessJob is the real one: mpirun (or srun in a Slurm allocation) through a
// ProcessLauncher, /proc for ranks on this machine, the remote shell for the others
// (launch/seams.h); tests give it fakes of those.
// Thread safety: Probe, KillRank and HealthCheck from any thread; the rest from one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "launch/policy.h"
#include "launch/seams.h"
#include "launch/supervisor.h"

namespace tf::launch {

// Where a rank runs.
struct RankAddress {
  std::string host;
  int64_t pid = 0, ppid = 0;
};

// The launcher process of a generation (mpirun or srun).
struct LauncherProcess {
  int64_t pid = -1;
  int64_t start_time = -1;  // tells it from a later process with its pid
  bool child = true;        // false: adopted from an earlier supervisor (no wait status)
  bool ended = false;
  int status = 0;           // a child's wait status once ended
};

struct StartRequest {
  int64_t generation = 0;
  std::vector<HostEntry> hosts;  // slots = ranks placed
  BatchPlan plan;
  std::string address;           // where the ranks reach the supervisor (HOST:PORT)
  std::string secret;
  std::string log_path;          // the generation's output
};

struct Started {
  LauncherProcess launcher;
  int64_t log_offset = 0;        // bytes of the log before the launcher's output
};

// What a probe of a silent rank found.
enum class ProbeResult {
  kGone,         // no such process (or a zombie)
  kStopped,      // SIGSTOP or a debugger ('T')
  kUnreachable,  // its host did not answer the remote shell
  kSilent,       // alive (and, on another host, its host reaches the supervisor): late
  kCutOff,       // alive, but its host cannot connect to the supervisor: a partition
};

class JobControl {
 public:
  virtual ~JobControl() = default;
  // Starts the generation's launcher. InvalidArgument when its command line would exceed ARG_MAX.
  virtual StatusOr<Started> Start(const StartRequest& request) = 0;
  // Whether the launcher still runs; records its end in *p.
  virtual bool Alive(LauncherProcess* p) = 0;
  // Whether an earlier supervisor's launcher (pid, start time) still runs.
  virtual bool Adoptable(int64_t pid, int64_t start_time) = 0;
  // Kills the launcher's session (it and the ranks on this machine) and reaps a child.
  virtual void KillLauncher(LauncherProcess* p) = 0;
  // srun: kills the job step's tasks on every node.
  virtual void CancelStep(const std::string& slurm_step) = 0;
  // A silent rank: gone, stopped, unreachable or alive (kSilent), with what was seen in *detail.
  virtual ProbeResult Probe(const RankAddress& r, std::string* detail) = 0;
  // A silent rank alive on another host: kCutOff when that host cannot connect to `address`, else
  // kSilent; appends what was seen to *detail.
  virtual ProbeResult ProbeReach(const RankAddress& r, const std::string& address, std::string* detail) = 0;
  // Ends the rank (and the daemon that started it, on other hosts).
  virtual void KillRank(const RankAddress& r) = 0;
  // The health check of a quarantined host: 0 when it passed.
  virtual int HealthCheck(const std::string& host) = 0;
  virtual bool IsLocal(const std::string& host) = 0;
};

// REQUIRES: options, env, launcher and shell outlive the job control.
std::unique_ptr<JobControl> NewProcessJob(const LaunchOptions& options, Env* env, ProcessLauncher* launcher,
                                          RemoteShell* shell);

}  // namespace tf::launch
