// The supervisor of `trainflow launch` as a state machine (docs/fault-tolerance.md): launch a
// generation, watch its ranks (detect: dead, stopped, lost host, partitioned, late, hung, failed,
// launcher), recover (isolate, rescue, tear down, account the hosts) and restart within the budget
// with backoff, adopt a running job after a supervisor restart, quarantine and readmit hosts, and
// resize the job to the healthy slots. It touches the world only through SupervisorWorld: the clock,
// the launcher and remote shell under the job control (launch/job_control.h), the heartbeat
// transport, the state store's Env and the signals (launch/seams.h) — tests drive it with fakes.
// launch/supervisor.h's RunSupervisor runs it with the real ones.
// Thread safety: one thread calls Run; the health checks run on a thread of their own
// (health_results_ under health_mu_), the teardown's kills on one thread per rank.
#pragma once
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/env.h"
#include "base/status.h"
#include "launch/job_control.h"
#include "launch/launch_metrics.h"
#include "launch/policy.h"
#include "launch/seams.h"
#include "launch/state_store.h"
#include "launch/supervisor.h"
#include "monitor/server.h"

namespace tf::launch {

// What the supervisor acts on. Null members take the real ones: Env::Default(), SystemClock(),
// SystemLauncher(), a remote shell from the options (ssh, the rsh agent, or srun helper steps),
// HeartbeatServerTransport(), ProcessSignals().
struct SupervisorWorld {
  Env* env = nullptr;
  Clock* clock = nullptr;
  ProcessLauncher* launcher = nullptr;
  RemoteShell* shell = nullptr;
  TransportFactory listen;
  SignalSource* signals = nullptr;
  int64_t pid = 0;  // the supervisor's, in the lock and state.json (0: getpid())
};

struct RankInfo {
  int conn = -1;
  std::string host;
  int64_t pid = 0, ppid = 0;
  double last_hb = 0;         // Clock::Mono() of the last message
  std::string phase = "startup";
  int64_t step = 0;
  uint64_t progress = 0;
  double progress_at = 0;     // Mono() when (phase, step, progress) last changed
  int64_t checkpoint = -1;
  double step_time = 0;       // Unix time the rank reached `step`
  bool exited = false;
  int exit_code = -1;
  bool failed = false, rescuable = false;
  double failed_at = 0;  // Mono()
  int64_t failed_step = -1;
  std::string error;
  bool closed = false;
  int64_t checkpoint_bytes = 0;  // the process's own count (accounted as it grows)
  std::string metrics_url;
  // Late: silent for more than two intervals while its process is alive and its host reaches the
  // supervisor. Not a failure until late_timeout_s; never counted against its host.
  double late_since = 0;      // Mono() of the last heartbeat before it went late (0: not late)
  double late_probe_at = 0;   // Mono() of the last probe while late
};

struct Job {
  int64_t generation = 0;
  LauncherProcess launcher;    // mpirun or srun
  std::vector<HostEntry> hosts;
  BatchPlan plan;
  double started_mono = 0, started_wall = 0;
  std::string log_path;
  int64_t log_offset = 0;
  std::map<int, RankInfo> ranks;
  bool all_connected = false;
  bool stop_sent = false;      // a graceful stop was asked (user signal or growing)
  bool growing = false;
  // The training progress this launch made (rank 0): first and last (step, time) seen.
  int64_t first_step = -1, last_step = -1;
  double first_step_time = 0, last_step_time = 0;
  bool accounted = false;     // AccountGeneration ran: its productive time is in productive_s_
  int64_t start_step = -1;     // the step it resumed at (first heartbeat)
  std::string slurm_step;      // srun: the job step the ranks run in (from their hello)
  int64_t tokens_step = -1;    // rank 0's step the token count has reached
};

class Supervisor {
  using json = nlohmann::json;

 public:
  // REQUIRES: what `world` points to outlives the supervisor.
  Supervisor(LaunchOptions o, SupervisorOutcome* outcome, SupervisorWorld world);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  // Runs the job to its end; the exit code of RunSupervisor.
  int Run();

 private:
  // ---- state ----
  Status Open();
  void Save();
  void Incident(json record);
  void Say(const std::string& line);

  // ---- the job ----
  Status Launch();
  void Adopt(const json& job);
  void HandleEvents(const std::vector<HeartbeatTransport::Event>& events);
  void OnMessage(int rank, const json& m);
  void AccountRank(int rank, int64_t step, int64_t checkpoint_bytes);
  bool LauncherAlive() { return job_ctl_->Alive(&job_->launcher); }
  void TailLog();
  std::optional<json> Detect();  // a failure to recover from, or nothing
  // Where the ranks reach the heartbeat server: HOST:PORT ([HOST]:PORT for IPv6).
  std::string HeartbeatAddress() const;
  static RankAddress AddressOf(const RankInfo& r) { return {r.host, r.pid, r.ppid}; }
  void Recover(json incident, const std::set<int>& culprits);
  // The rescue exchange after a failure (the culprits excluded): the survivor with the newest whole
  // state writes it, a second one at that step hashes its own; commit when they agree, else discard.
  // Returns the incident's "rescue" record; *best_step: the survivors' newest step (-1: none).
  json Rescue(const std::set<int>& culprits, int64_t* best_step);
  // Counts the failure against its cause and the hosts it blames (the culprits', and a rank's own
  // non-peer failure; never lateness), and quarantines hosts. Returns the hosts quarantined now.
  std::vector<std::string> AccountHosts(const json& incident, const std::set<int>& culprits);
  // Polls up to timeout_s for each rank's answer of the type `wanted` gives it (other events are
  // handled as usual), stopping early when rank `needed` disconnects. Returns the answers that came.
  std::map<int, json> AwaitReplies(const std::map<int, const char*>& wanted, int needed, double timeout_s);
  void Teardown(double deadline_s);
  void AccountGeneration(int64_t kept_until_step);
  // The running generation's productive time so far (its steps since it started x time per step);
  // AccountGeneration adds what is kept when it ends.
  double RunningProductive() const;
  double HangTimeout(const std::string& phase) const;
  // Applies the last round's results and starts a new round in the background (`wait`: and waits
  // for it and applies it).
  void HealthChecks(bool wait = false);
  bool UsesSrun() const { return o_.launcher == "srun"; }
  ResourceUsage Usage() const;
  void WriteEndpoints();
  bool RereadHostfile();
  int Finish(int code, const std::string& why, const char* reason);
  // Run's steps; each returns the exit code when the supervisor ends, else nothing.
  // No job: launches the next generation when the backoff and the budget allow, or waits for hosts.
  std::optional<int> LaunchNext();
  // The launcher ended or every rank said goodbye: finished, stopped, grown, bad input, or a failure.
  std::optional<int> JobEnded(bool all_exited, int worst);
  // While the job runs: health checks, the hostfile, growing back at a checkpoint, saving the state.
  void Periodic();
  // Asks every connected rank to finish its step, write a checkpoint and exit 5.
  void SendStop();
  void PollFor(double seconds, const std::function<bool()>& done);

  LaunchOptions o_;
  SupervisorWorld world_;
  Clock* clock_;
  std::unique_ptr<RemoteShell> own_shell_;  // when the world brings none
  std::unique_ptr<JobControl> job_ctl_;
  StateStore store_;
  HostBook book_;
  RestartBackoff backoff_;
  std::string secret_;
  std::unique_ptr<HeartbeatTransport> server_;
  LaunchMetrics metrics_;
  std::unique_ptr<monitor::MetricsServer> metrics_server_;  // after metrics_: stopped first
  std::optional<Job> job_;
  std::map<int, int> conn_rank_;  // connection -> rank of the current job
  int64_t generation_ = 0;
  int restarts_ = 0;
  double next_launch_ = 0;        // clock_->Mono()
  double last_health_ = 0;
  double last_save_ = 0;
  std::thread health_thread_;
  std::atomic<bool> health_running_{false};
  std::mutex health_mu_;
  std::vector<std::pair<std::string, int>> health_results_;  // guarded by health_mu_
  double last_hostfile_check_ = 0;
  std::filesystem::file_time_type hostfile_mtime_{};
  // Accounting (seconds): wall time of the run, productive step time, downtime after failures.
  double run_started_wall_ = 0;
  double productive_s_ = 0, downtime_s_ = 0;
  double prior_wall_s_ = 0;       // wall time of earlier supervisors of this run
  double failure_at_wall_ = 0;    // the last failure's detection (for the downtime to the next step)
  int64_t failed_generation_ = 0;
  std::map<std::string, int64_t> failures_by_cause_;
  std::map<std::string, int64_t> failures_by_host_;
  int64_t late_episodes_ = 0;     // ranks found late (not failures)
  bool save_failed_ = false;      // the last Save could not write state.json (said once)
  int64_t rejected_ = 0;          // heartbeat connections that did not authenticate
  int rejected_logged_ = 0;
  double rejected_summary_at_ = 0;
  int budget_base_ = 0;           // restarts of earlier supervisors that ended: outside this run's budget
  std::string ended_;             // why this supervisor ended (Finish); "" while it runs
  double last_watch_ = 0;         // clock_->Mono() of the watch loop's last poll (0: no job)
  int64_t final_step_ = -1;
  bool stopping_ = false;         // the user asked the supervisor to stop
  bool time_warning_ = false;     // ... because of SIGUSR1 (Slurm's time-limit warning)
  SupervisorOutcome* outcome_;    // may be null
  std::map<std::string, std::string> host_causes_;  // quarantined host -> why
  // Accounting carried over from earlier supervisors of the job (state.json) and this run's counts.
  ResourceUsage usage_prior_;
  int64_t tokens_ = 0, checkpoint_bytes_ = 0;
  std::string endpoints_written_;
};

}  // namespace tf::launch
