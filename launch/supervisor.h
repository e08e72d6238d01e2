// The supervisor of `trainflow launch` (docs/fault-tolerance.md): runs a data-parallel training job
// over the healthy hosts of a hostfile through mpirun, watches every rank through authenticated
// heartbeats (launch/heartbeat.h, launch/rank_agent.h), and after a failure — a rank dead, hung,
// stopped or cut off, or the launcher failing — names it in the log and the incident log, has a
// survivor save the state of the last completed step, tears the job down host by host, and starts
// it again from the newest valid checkpoint on the hosts that remain healthy (elastic between
// min_ranks and max_ranks, keeping the global batch), within a restart budget with backoff. A host
// is quarantined after K failures within a window and readmitted only after a health check.
// A bad configuration or input stops the job at once (exit code 2); it is never retried.
//
// State lives in state_dir (owner-only): the lock that keeps a second supervisor out, the job
// secret, state.json (hosts, restarts, the running job's mpirun and ports) and incidents.jsonl. A
// supervisor killed and started again with the same arguments adopts the job still running (its
// ranks reconnect) or, when it is gone, resumes from the checkpoint. Thread safety: one thread.
//
// The parts: the state machine (launch/supervisor_machine.h), the job it controls
// (launch/job_control.h), the state directory (launch/state_store.h), the decisions
// (launch/policy.h), the messages to and from the ranks (launch/protocol.h) and the seams to the
// world — clock, launcher, remote shell, heartbeat transport (launch/seams.h).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "launch/policy.h"

namespace tf::launch {

// What a job used (accumulated in state_dir over supervisor restarts and Slurm requeues), for teams
// on a budget: reported at the end and as metrics.
struct ResourceUsage {
  double node_seconds = 0;      // hosts held x wall time
  double gpu_seconds = 0;       // GPUs held x wall time
  int64_t tokens = 0;           // tokens trained (every rank's rows x seq_len, lost work included)
  int64_t checkpoint_bytes = 0; // bytes the ranks' checkpointers stored
  int64_t restarts = 0;         // restarts after failures (this supervisor's and earlier ones')
  int64_t requeues = 0;         // Slurm requeues and resubmissions before this run
};

struct LaunchOptions {
  std::vector<HostEntry> hosts;      // the hostfile's
  std::string hostfile;              // re-read when it changes ("" = the hosts are fixed)
  int min_ranks = 1;
  int max_ranks = 0;                 // 0: every healthy slot
  int max_restarts = 10;
  std::string state_dir;
  double heartbeat_interval_s = 1.0;
  // A rank silent for two intervals whose process is alive and whose host reaches the supervisor is
  // late, not failed, until this many seconds of silence (docs/fault-tolerance.md "Detection").
  double late_timeout_s = 60;
  std::string heartbeat_host = "127.0.0.1";  // where ranks reach the supervisor
  int heartbeat_port = 0;                     // 0: any free port
  // Progress timeouts by phase (seconds); phases not given use the defaults of docs/fault-tolerance.md.
  std::map<Phase, double> hang_timeouts;
  double startup_timeout_s = 300;    // launch to every rank's first heartbeat
  double rescue_timeout_s = 60;      // the survivors' state write
  QuarantinePolicy quarantine;
  BackoffPolicy backoff;
  std::string health_command;        // run on a quarantined host (through the remote shell); 0 = healthy
  double health_interval_s = 30;
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;  // extra arguments (MCA settings)
  std::string rsh_agent;             // Open MPI's plm_rsh_agent and the supervisor's remote shell ("" = ssh)
  std::string trainflow;             // the ranks' binary
  std::vector<std::string> train_args;   // "train ..." after "--"
  int64_t global_rows = 0;           // the job's ranks x batch_size x grad_accum_steps
  int max_batch_size = 0;            // the configured batch_size: no rank gets a larger one
  int world_multiple = 1;            // every world is a multiple of this (the job's ZeRO shard_group_size)
  bool has_checkpoints = false;      // the job has a checkpoint_dir (else no rescue, no resume)
  std::string metrics_addr = "127.0.0.1:9460";  // the supervisor's /metrics ("off": none)
  std::string metrics_token;         // "": /metrics is open (to whoever reaches metrics_addr)
  // The launcher: "mpirun", or "srun" inside a Slurm allocation (docs/slurm.md): ranks placed host
  // by host with --distribution=arbitrary, probes and kills through `srun --overlap` helper steps.
  std::string launcher = "mpirun";
  std::string srun = "srun";
  std::vector<std::string> srun_args;
  std::string slurm_job_id;          // srun: the allocation
  // Too few healthy slots for min_ranks: wait for a quarantined host's health check (true), or end
  // with outcome "too_few_hosts" (Slurm: the job goes elsewhere).
  bool wait_for_hosts = true;
  // Resource accounting: tokens per optimizer step (global rows x seq_len), what is held.
  int64_t tokens_per_step = 0;
  int accounted_hosts = 0;           // 0: the hosts of the hostfile
  int accounted_gpus = 0;
  int64_t requeues = 0;              // Slurm requeues before this run
  std::string endpoints_path;        // "": not written; else the metrics endpoints (owner-only JSON)
  // state_dir, its logs, state, incidents and the endpoints file also readable by the group of
  // state_dir's parent (`trainflow slurm --group`); the lock and the job's secret stay owner-only.
  bool group_readable = false;
};

// How a supervised run ended (besides its exit code), for `trainflow slurm run`.
struct SupervisorOutcome {
  // finished | stopped (SIGINT/SIGTERM to the supervisor) | time_warning (SIGUSR1: stopped at a
  // checkpoint) | stopped_outside (the ranks stopped on their own signal: preemption, scancel) |
  // too_few_hosts | budget | bad_input | error
  std::string reason = "error";
  std::map<std::string, std::string> bad_hosts;  // quarantined host -> the failures that did it
  int64_t final_step = -1;
  ResourceUsage usage;               // the job's, up to now
};

// Runs the job to its end; returns the exit code (0 done, 2 bad input, 3 budget exhausted or
// unrecoverable, 5 stopped by SIGINT/SIGTERM).
// SIGUSR1 (Slurm's warning before the time limit) stops the job at a checkpoint as SIGTERM does.
int RunSupervisor(const LaunchOptions& options, SupervisorOutcome* outcome = nullptr);

// `trainflow launch --status`: the hosts, their state, the job and the incidents, from state_dir.
Status PrintLaunchStatus(const std::string& state_dir, bool as_json);

// The default progress timeout of a phase (seconds).
double DefaultHangTimeout(Phase phase);

}  // namespace tf::launch
