// A training job on Slurm (docs/slurm.md): what `trainflow slurm submit` writes and submits — the
// job directory, its sbatch script and job.json — and what `trainflow slurm run` does inside the
// allocation: the supervisor (launch/supervisor.h) launching the ranks with srun on the
// allocation's nodes, then requeueing the job before its time limit or after a preemption,
// draining and excluding failing nodes and resubmitting without them, and recording what the job
// used (usage.json). The command line (engine/cli/slurm_cli.cpp) resolves the training command and
// the supervisor's flags; everything here takes them as values.
//
// The job directory is owner-only, or also group-readable with `group`; its files are written
// through Env::WriteFileAtomically. Thread safety: free functions; one job per process.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "launch/policy.h"
#include "launch/supervisor.h"

namespace tf::slurm {

// What the job needs of its training command, resolved by the caller.
struct TrainJob {
  std::vector<std::string> args;   // "train ..." as given
  int batch_size = 1;
  int grad_accum_steps = 1;
  int shard_group_size = 0;        // ZeRO replica groups: worlds are multiples of it (0: any)
  int64_t seq_len = 0;
  std::string checkpoint_dir;      // "" = none configured
  bool out_dir_default = false;    // out_dir neither in the configs nor on the command line
  bool metrics_addr_default = false;  // likewise metrics_addr
  bool metrics_enabled = true;     // metrics_addr is neither "" nor "off"
  bool metrics_token_file_set = false;
};

// Options of `slurm run`, which `slurm submit` writes into the script.
struct JobOptions {
  std::string dir;                 // the job directory
  std::string group;               // "" = owner-only files
  std::string heartbeat_addr;      // "" = the node's NodeAddr (127.0.0.1 on one node)
  std::string srun = "srun";
  std::vector<std::string> srun_args;
  int ranks_per_node = 0;          // 0: SLURM_TASKS_PER_NODE, else one per GPU, else 1
  int gpus_per_node = 0;
  int min_nodes = 0;               // 0: every node
  int requeue_budget = 10;
  std::vector<std::string> supervisor_args;  // the supervisor's flags, passed on as words
};

struct SubmitOptions {
  JobOptions job;                  // job.dir "" = trainflow-jobs/NAME
  int nodes = 1;
  int cpus_per_rank = 0;
  int warning_s = 120;
  std::string time, partition, account, qos, constraint, exclude, mem;
  std::string job_name;            // "" = trainflow-DATE-TIME
  std::vector<std::string> sbatch_args;
  bool no_job_prefix = false;
};

// Where and when the script is written: filled from the process by Here(); tests give their own.
struct SubmitContext {
  std::string trainflow;   // the binary the script runs
  std::string cwd;         // sbatch --chdir
  std::string user;
  std::string now_utc;     // "YYYY-mm-ddTHH:MM:SSZ"
  std::string stamp_utc;   // "YYYYmmdd-HHMMSS": the default job name
  static SubmitContext Here();
};

// A checked submission, ready to write.
struct SbatchJob {
  std::string name;
  std::string dir;           // absolute
  int ranks_per_node = 1;
  std::string checkpoint_dir;  // what the job resumes from
  std::vector<std::string> run_argv;  // the script's command: trainflow slurm run ... -- train ...
  std::string script;
};

// Validates the options (bad input: InvalidArgument naming the flag) and writes the script.
// Creates nothing.
StatusOr<SbatchJob> PlanSubmit(const SubmitOptions& options, const TrainJob& train, const SubmitContext& context);

// Creates the job directory, submits the script with `sbatch` (removing what it created when
// sbatch refuses), then keeps it as DIR/job.sbatch and records job.json. Returns the job id.
StatusOr<std::string> Submit(const SubmitOptions& options, const SbatchJob& job, const std::string& sbatch);

// ---- the job directory ---------------------------------------------------------------------------

// --group: a group that exists and that this user may give files to. InvalidArgument otherwise.
Status CheckGroup(const std::string& group);
// Creates `dir` owner-only (0700), or with `group` 02750 (new files inherit the group).
Status PrepareJobDir(const std::string& dir, const std::string& group);
// A file of the job: written atomically (Env), then mode 0600, or 0640 with a group (0700/0750 when
// executable).
Status WriteJobFile(const std::string& path, const std::string& text, const std::string& group,
                    bool executable = false);
// A JSON file of the job (job.json, usage.json): {} when missing; a damaged one is logged and read
// as {} (what it held is rebuilt or recounted).
nlohmann::json ReadJobJson(const std::string& path);

// One run of the job for usage.json.
struct RunRecord {
  std::string job_id;
  int64_t run = 1;
  std::string nodes;
  double started = 0, ended = 0;  // seconds since the epoch
  std::string outcome;
  int exit_code = 0;
  int64_t final_step = -1;
};
// usage.json with the totals `usage` and `run` appended to its runs; returns the new content.
StatusOr<nlohmann::json> RecordUsage(const std::string& dir, const std::string& group, const launch::ResourceUsage& usage,
                                     const RunRecord& run);
// job.json's "exclude" with `bad` added (sorted, without duplicates); returns the new list.
StatusOr<std::vector<std::string>> AddExcludedNodes(const std::string& dir, const std::string& group,
                                                    const std::vector<std::string>& bad);

// ---- inside the allocation -----------------------------------------------------------------------

// What Slurm tells the batch script (its environment).
struct Allocation {
  std::string job_id;            // SLURM_JOB_ID
  std::string nodelist;          // SLURM_JOB_NODELIST
  std::string tasks_per_node;    // SLURM_TASKS_PER_NODE ("" = unknown)
  std::string cpus_per_task;     // SLURM_CPUS_PER_TASK ("" = not set)
  std::string node_name;         // SLURMD_NODENAME
  int64_t requeues = 0;          // SLURM_RESTART_COUNT + TRAINFLOW_SLURM_RESUBMITS
  // InvalidArgument outside an allocation (no SLURM_JOB_ID or SLURM_JOB_NODELIST).
  static StatusOr<Allocation> FromEnvironment();
};

// The hosts and their ranks: --ranks-per-node, else SLURM_TASKS_PER_NODE, else one per GPU (or 1).
StatusOr<std::vector<launch::HostEntry>> AllocationHosts(const JobOptions& options, const Allocation& allocation);

// The supervisor's options for the job: `supervisor` carries the supervisor's flags; the hosts,
// srun, the per-job metrics token and ports, and the accounting come from the rest.
launch::LaunchOptions JobLaunchOptions(const JobOptions& options, const TrainJob& train, const Allocation& allocation,
                                       const std::vector<launch::HostEntry>& hosts, launch::LaunchOptions supervisor,
                                       const std::string& metrics_token);

// `slurm run` after the job directory is prepared and the training command resolved: runs the
// supervisor, records the usage, and requeues, resubmits or ends the job. Returns the exit code
// (docs/slurm.md); errors before the supervisor starts are a Status.
StatusOr<int> RunInAllocation(const JobOptions& options, const TrainJob& train, const Allocation& allocation,
                              const launch::LaunchOptions& supervisor);

// Sets the job's comment ("trainflow: TEXT", cut to 250 bytes) through scontrol.
void CommentJob(const std::string& job_id, const std::string& text);

}  // namespace tf::slurm
