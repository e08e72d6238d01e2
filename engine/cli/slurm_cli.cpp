#include "engine/cli/slurm_cli.h"

#include <sys/stat.h>

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "engine/cli/cli.h"
#include "engine/cli/command.h"
#include "engine/cli/launch_cli.h"
#include "engine/cli/supervisor_flags.h"
#include "engine/train_config.h"
#include "launch/slurm_job.h"
#include "model/config.h"

namespace tf {

struct SlurmCommands {
  CLI::App* slurm = nullptr;
  std::string unknown;  // a word after `slurm` that is no subcommand
  CLI::App* submit = nullptr;
  CLI::App* run = nullptr;
  // Shared by submit (written into the script) and run (what the script passes on).
  slurm::JobOptions job;
  SupervisorFlags supervisor;
  std::vector<std::string> command;
  // submit only
  slurm::SubmitOptions submit_options;
  std::string sbatch = "sbatch";
  bool dry_run = false;
};

namespace {

// `flag` in the train command, in either spelling (--out_dir, --out-dir), up to a bare "--".
bool HasFlag(const std::vector<std::string>& args, const std::string& flag) {
  const std::string want = DashedFlag(flag);
  for (const std::string& a : args) {
    if (a == "--") break;
    if (DashedFlag(a.substr(0, a.find('='))) == want) return true;
  }
  return false;
}

// The training command as the job needs it; a bad configuration is InvalidArgument.
StatusOr<slurm::TrainJob> ResolveJob(const std::vector<std::string>& command) {
  GPT2Config model;
  TrainConfig train;
  TF_RETURN_IF_ERROR(ResolveTrainCommand(command, &model, &train));
  slurm::TrainJob j;
  j.args = command;
  j.batch_size = train.batch_size;
  j.grad_accum_steps = train.grad_accum_steps;
  j.shard_group_size = train.shard_group_size;
  j.seq_len = train.seq_len;
  j.checkpoint_dir = train.checkpoint_dir;
  j.out_dir_default = train.out_dir == TrainConfig{}.out_dir && !HasFlag(command, "--out_dir");
  j.metrics_addr_default = train.metrics_addr == TrainConfig{}.metrics_addr && !HasFlag(command, "--metrics_addr");
  j.metrics_enabled = train.metrics_addr != "off" && !train.metrics_addr.empty();
  j.metrics_token_file_set = !train.metrics_token_file.empty();
  return j;
}

// Options given to `slurm run` by the script (the same names as submit's).
void AddRunOptions(CLI::App* a, SlurmCommands* c) {
  a->add_option("--dir", c->job.dir, "The job directory (state, logs, usage; default checkpoints and outputs)");
  a->add_option("--ranks-per-node", c->job.ranks_per_node, "Ranks on each node (default: one per GPU, else 1)")
      ->check(CLI::Range(1, 1024));
  a->add_option("--gpus-per-node", c->job.gpus_per_node, "GPUs on each node (0: a CPU job)")->check(CLI::Range(0, 1024));
  a->add_option("--min-nodes", c->job.min_nodes,
                "Fewest nodes to go on with after isolating failing ones (default: every node); below it the job "
                "is resubmitted without the failing nodes")
      ->check(CLI::Range(1, 1 << 20));
  a->add_option("--requeue-budget", c->job.requeue_budget,
                "Most requeues and resubmissions of the job (time limits, preemptions, bad nodes)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  AddSupervisorFlags(a, &c->supervisor);
  a->add_option("--heartbeat-addr", c->job.heartbeat_addr,
                "Address of this node the other nodes reach (default: the node's NodeAddr; 127.0.0.1 on one node)");
  a->add_option("--group", c->job.group, "Also let this group read the job's outputs (default: owner only)");
  a->add_option("--srun", c->job.srun, "The srun to use")->capture_default_str();
  a->add_option("--srun-arg", c->job.srun_args, "An extra srun argument for the ranks' step (repeatable), e.g. --cpu-bind=cores")
      ->expected(1)
      ->allow_extra_args(false)  // one word each: never the "--" and the train command after it
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  a->add_option("command", c->command, "-- train --model ... (the job)");
}

int RunSubmit(const SlurmCommands& c) {
  if (c.command.empty()) {
    return Fail(Status::InvalidArgument("no job: trainflow slurm submit [options] -- train --model ..."));
  }
  // A bad configuration stops here, before anything is queued.
  auto train = ResolveJob(c.command);
  if (!train.ok()) return Fail(train.status());
  launch::LaunchOptions checked;
  if (Status s = ApplySupervisorFlags(c.supervisor, &checked); !s.ok()) return Fail(s);
  slurm::SubmitOptions o = c.submit_options;
  o.job = c.job;
  o.job.supervisor_args = SupervisorFlagArgs(c.supervisor);
  auto job = slurm::PlanSubmit(o, *train, slurm::SubmitContext::Here());
  if (!job.ok()) return Fail(job.status());
  if (c.dry_run) {
    fmt::print("{}", job->script);
    return kExitOk;
  }
  if (Status s = CheckProgram(c.sbatch, "sbatch"); !s.ok()) {
    return Fail(Status::InvalidArgument("{}: `slurm submit` runs on a Slurm cluster's login node (--sbatch names "
                                        "another sbatch); nothing was written",
                                        s.message()));
  }
  auto job_id = slurm::Submit(o, *job, c.sbatch);
  if (!job_id.ok()) return Fail(job_id.status());
  const std::string& dir = job->dir;
  const int per_node = job->ranks_per_node;
  fmt::print("submitted job {} ({}): {} node{} x {} rank{}\n  script     {}/job.sbatch\n  log        {}/slurm-{}.out\n"
             "  checkpoints {}\n  status     trainflow launch --status --state-dir {}/launch\n  usage      {}/usage.json\n",
             *job_id, job->name, o.nodes, o.nodes == 1 ? "" : "s", per_node, per_node == 1 ? "" : "s", dir, dir,
             *job_id, job->checkpoint_dir, dir, dir);
  return kExitOk;
}

// `slurm run`, inside the allocation.
int RunInAllocation(const SlurmCommands& c) {
  auto allocation = slurm::Allocation::FromEnvironment();
  if (!allocation.ok()) return Fail(allocation.status());
  if (c.command.empty()) return Fail(Status::InvalidArgument("no job: trainflow slurm run [options] -- train ..."));
  if (c.job.dir.empty()) return Fail(Status::InvalidArgument("--dir is required"));
  ::umask(c.job.group.empty() ? 077 : 027);
  slurm::JobOptions job = c.job;
  job.dir = std::filesystem::absolute(c.job.dir).lexically_normal().string();
  if (Status s = slurm::PrepareJobDir(job.dir, job.group); !s.ok()) return Fail(s);
  auto train = ResolveJob(c.command);
  if (!train.ok()) {
    slurm::CommentJob(allocation->job_id, "bad configuration: " + train.status().message());
    return Fail(train.status());
  }
  launch::LaunchOptions supervisor;
  if (Status s = ApplySupervisorFlags(c.supervisor, &supervisor); !s.ok()) return Fail(s);
  auto code = slurm::RunInAllocation(job, *train, *allocation, supervisor);
  return code.ok() ? *code : Fail(code.status());
}

}  // namespace

std::shared_ptr<SlurmCommands> AddSlurmCommands(CLI::App& app) {
  auto c = std::make_shared<SlurmCommands>();
  c->supervisor.quarantine_after = 2;  // a Slurm node is isolated after 2 failures, not 3 (docs/slurm.md)
  auto* slurm = app.add_subcommand("slurm", "Run training jobs on a Slurm cluster (docs/slurm.md)");
  c->slurm = slurm;
  // An unknown word lands here (and is refused by name) instead of CLI11's "A subcommand is required".
  slurm->add_option("subcommand", c->unknown, "submit or run");
  auto* s = slurm->add_subcommand(
      "submit", "Write an sbatch script for a training job and submit it: trainflow slurm submit --nodes 2 "
                "--gpus-per-node 8 --time 4:00:00 -- train --model ...");
  c->submit = s;
  s->add_option("--nodes", c->submit_options.nodes, "Nodes")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  s->add_option("--cpus-per-rank", c->submit_options.cpus_per_rank, "Cores for each rank (--cpus-per-task)")->check(CLI::Range(1, 4096));
  s->add_option("--mem", c->submit_options.mem, "Memory per node (sbatch --mem, e.g. 200G)");
  s->add_option("--time", c->submit_options.time, "Time limit of each run (sbatch --time: MM, HH:MM:SS, D-HH:MM:SS)");
  s->add_option("--warning", c->submit_options.warning_s, "Seconds before the time limit to checkpoint and requeue")
      ->capture_default_str();
  s->add_option("--partition", c->submit_options.partition, "Partition");
  s->add_option("--account", c->submit_options.account, "Account to charge");
  s->add_option("--qos", c->submit_options.qos, "Quality of service");
  s->add_option("--constraint", c->submit_options.constraint, "Node features (sbatch --constraint)");
  s->add_option("--exclude", c->submit_options.exclude, "Nodes never to use (a Slurm host list)");
  s->add_option("--job-name", c->submit_options.job_name, "Job name (default trainflow-DATE-TIME); also the default --dir and the "
                                           "S3 checkpoint prefix");
  s->add_option("--sbatch-arg", c->submit_options.sbatch_args, "An extra #SBATCH option (repeatable), e.g. --mail-type=END")
      ->expected(1)
      ->allow_extra_args(false)  // one word each: never the "--" and the train command after it
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  s->add_option("--sbatch", c->sbatch, "The sbatch to use")->capture_default_str();
  s->add_flag("--dry-run", c->dry_run, "Print the script; submit nothing");
  s->add_flag("--no-job-prefix", c->submit_options.no_job_prefix,
              "Use an s3:// checkpoint_dir as given (default: under USER/JOB_NAME/ in it)");
  AddRunOptions(s, c.get());
  auto* r = slurm->add_subcommand("run", "Inside an allocation (what the submitted script runs): supervise the job's "
                                         "ranks with srun");
  c->run = r;
  AddRunOptions(r, c.get());
  return c;
}

bool SlurmCommandParsed(const SlurmCommands& c) { return c.slurm->parsed(); }

int RunSlurmCommand(const SlurmCommands& c) {
  if (c.submit->parsed()) return RunSubmit(c);
  if (c.run->parsed()) return RunInAllocation(c);
  return Fail(Status::InvalidArgument("{}: the slurm commands are submit and run (trainflow slurm --help)",
                                      c.unknown.empty() ? std::string("no slurm command given")
                                                        : fmt::format("unknown slurm command '{}'", c.unknown)));
}

}  // namespace tf
