#include "launch/job_control.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "launch/slurm_util.h"

extern char** environ;

namespace tf::launch {
namespace {

// The state letter of /proc/PID/stat in `stat_text` ('T' stopped, 'Z' zombie, ...); 0 when unreadable.
char StateLetter(const std::string& stat_text) {
  const size_t close = stat_text.rfind(')');
  return close != std::string::npos && close + 2 < stat_text.size() ? stat_text[close + 2] : 0;
}

class ProcessJob final : public JobControl {
 public:
  ProcessJob(const LaunchOptions& o, Env* env, ProcessLauncher* launcher, RemoteShell* shell)
      : o_(o), env_(env), launcher_(launcher), shell_(shell) {}

  StatusOr<Started> Start(const StartRequest& q) override;

  bool Alive(LauncherProcess* p) override {
    if (p->ended) return false;
    if (p->child) {
      int status = 0;
      if (launcher_->Ended(p->pid, &status)) {
        p->ended = true;
        p->status = status;
        return false;
      }
      return true;
    }
    if (launcher_->Running(p->pid, p->start_time)) return true;
    p->ended = true;
    return false;
  }

  bool Adoptable(int64_t pid, int64_t start_time) override {
    return pid > 0 && launcher_->Running(pid, start_time);
  }

  void KillLauncher(LauncherProcess* p) override {
    launcher_->KillSession(p->pid);  // its session: mpirun and the local ranks
    if (p->child && !p->ended) launcher_->Reap(p->pid);
    p->ended = true;
  }

  void CancelStep(const std::string& slurm_step) override {
    std::string out;
    shell_->RunHere({"scancel", "--signal=KILL", o_.slurm_job_id + "." + slurm_step}, 5.0, &out);
  }

  ProbeResult Probe(const RankAddress& r, std::string* detail) override {
    std::string stat;
    if (shell_->IsLocal(r.host)) {
      std::optional<std::string> s = launcher_->Stat(r.pid);
      if (!s) return ProbeResult::kGone;
      stat = std::move(*s);
    } else {
      const double timeout = UsesSrun() ? 5.0 : 3.0;
      const int rc = shell_->Run(r.host, fmt::format("cat /proc/{}/stat", r.pid), timeout, &stat);
      if (rc == -1 || rc == 255) {
        *detail = fmt::format("host {} did not answer the remote shell within {} s", r.host, timeout);
        return ProbeResult::kUnreachable;
      }
      if (rc != 0) return ProbeResult::kGone;
    }
    const char state = StateLetter(stat);
    if (state == 'T' || state == 't') {
      *detail = "the process is stopped (SIGSTOP or a debugger)";
      return ProbeResult::kStopped;
    }
    if (state == 'Z' || state == 0) return ProbeResult::kGone;
    *detail = fmt::format("the process is alive (state {})", state);
    return ProbeResult::kSilent;
  }

  ProbeResult ProbeReach(const RankAddress& r, const std::string& address, std::string* detail) override {
    std::string out;
    const int rc = shell_->Run(r.host,
                               fmt::format("{} health --reach {} --timeout 2", slurm::ShellQuote(o_.trainflow),
                                           slurm::ShellQuote(address)),
                               UsesSrun() ? 8.0 : 6.0, &out);
    if (rc == kExitRetryable) {
      *detail += fmt::format("; its host cannot connect to the supervisor at {}: a network partition", address);
      return ProbeResult::kCutOff;
    }
    if (rc != 0) {
      *detail += fmt::format("; could not check that its host reaches the supervisor (exit {})", rc);
    } else {
      *detail += "; its host reaches the supervisor";
    }
    return ProbeResult::kSilent;
  }

  void KillRank(const RankAddress& r) override {
    if (r.pid <= 0) return;
    if (shell_->IsLocal(r.host)) {
      if (launcher_->Cmdline(r.pid).find("trainflow") != std::string::npos) launcher_->Kill(r.pid);
      return;
    }
    // The rank, and the daemon that started it (Open MPI's orted, orphaned after a partition).
    const std::string script = fmt::format(
        "for p in {} {}; do c=$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null); case \"$c\" in *trainflow*|*orted*) "
        "kill -9 $p;; esac; done; true",
        r.pid, r.ppid);
    std::string out;
    if (shell_->Run(r.host, script, 5.0, &out) != 0) {
      spdlog::warn("could not end rank pid {} on {}: {}", r.pid, r.host, out);
    }
  }

  int HealthCheck(const std::string& host) override {
    const std::string check = fmt::format("TRAINFLOW_HOST={}; export TRAINFLOW_HOST; {} health --quiet",
                                          slurm::ShellQuote(host), slurm::ShellQuote(o_.trainflow)) +
                              (o_.health_command.empty() ? "" : " && " + o_.health_command);
    std::string out;
    const int rc = shell_->IsLocal(host) && !UsesSrun() ? shell_->RunHere({"/bin/sh", "-c", check}, 30.0, &out)
                                                        : shell_->Run(host, check, 30.0, &out);
    if (rc != 0) spdlog::debug("host {} still unhealthy (rc {}): {}", host, rc, out);
    return rc;
  }

  bool IsLocal(const std::string& host) override { return shell_->IsLocal(host); }

 private:
  bool UsesSrun() const { return o_.launcher == "srun"; }

  const LaunchOptions& o_;
  Env* env_;
  ProcessLauncher* launcher_;
  RemoteShell* shell_;
};

StatusOr<Started> ProcessJob::Start(const StartRequest& q) {
  std::vector<std::string> train = o_.train_args;
  train.insert(train.end(), {"--batch_size", std::to_string(q.plan.batch_size), "--grad_accum_steps",
                             std::to_string(q.plan.grad_accum_steps)});
  LaunchCommand c;
  std::vector<std::string>& argv = c.argv;
  if (UsesSrun()) {
    // One line per rank, in rank order: srun --distribution=arbitrary puts rank i on line i's node.
    const std::string hostfile = fmt::format("{}/gen-{:04d}.hosts", o_.state_dir, q.generation);
    std::string lines;
    for (const HostEntry& h : q.hosts) {
      for (int i = 0; i < h.slots; ++i) lines += h.name + "\n";
    }
    TF_RETURN_IF_ERROR(env_->WriteFileAtomically(hostfile, lines));
    argv = {o_.srun,
            "--mpi=pmix",
            fmt::format("--ntasks={}", q.plan.world),
            fmt::format("--nodes={}", q.hosts.size()),
            "--distribution=arbitrary",
            "--kill-on-bad-exit=0",
            fmt::format("--job-name=trainflow-gen{}", q.generation)};
    argv.insert(argv.end(), o_.srun_args.begin(), o_.srun_args.end());
    argv.push_back(o_.trainflow);
    argv.insert(argv.end(), train.begin(), train.end());
    c.child_env.emplace_back("SLURM_HOSTFILE", hostfile);
    // The batch step's task layout is not this step's (the hosts file is).
    for (const char* v : {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_DISTRIBUTION", "SLURM_NTASKS",
                          "SLURM_NPROCS", "SLURM_NNODES"}) {
      c.child_env.emplace_back(v, "");
    }
  } else {
    argv = {o_.mpirun};
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
    // mpirun leaves the survivors of a failed rank alone (orte_enable_recovery): the supervisor
    // decides, after their rescue. Shared memory without single-copy (CMA): a peer killed
    // mid-transfer then stalls a survivor's collective (which the abort ends) instead of killing it.
    argv.insert(argv.end(), {"--oversubscribe", "--mca", "orte_enable_recovery", "1", "--mca",
                             "btl_vader_single_copy_mechanism", "none"});
    if (!o_.rsh_agent.empty()) argv.insert(argv.end(), {"--mca", "plm_rsh_agent", o_.rsh_agent});
    argv.insert(argv.end(), o_.mpirun_args.begin(), o_.mpirun_args.end());
    for (const char* v : {"TRAINFLOW_SUPERVISOR", "TRAINFLOW_SUPERVISOR_SECRET", "TRAINFLOW_LAUNCH_GENERATION",
                          "TRAINFLOW_HEARTBEAT_INTERVAL"}) {
      argv.insert(argv.end(), {"-x", v});
    }
    bool first = true;
    for (const HostEntry& h : q.hosts) {
      if (!first) argv.push_back(":");
      first = false;
      argv.insert(argv.end(), {"-np", std::to_string(h.slots), "--host", fmt::format("{}:{}", h.name, h.slots),
                               "/usr/bin/env", "TRAINFLOW_HOST=" + h.name, o_.trainflow});
      argv.insert(argv.end(), train.begin(), train.end());
    }
  }
  {
    // The kernel refuses a command line (with the environment) over ARG_MAX: say so once, not retry.
    size_t bytes = 0;
    for (const std::string& a : argv) bytes += a.size() + 1 + sizeof(char*);
    for (char** e = environ; *e != nullptr; ++e) bytes += std::strlen(*e) + 1 + sizeof(char*);
    const long arg_max = ::sysconf(_SC_ARG_MAX);
    if (arg_max > 0 && bytes > static_cast<size_t>(arg_max)) {
      return Status::InvalidArgument("the {} command line for {} host(s) would be {} bytes with the environment, over "
                                     "this system's limit of {} (ARG_MAX): use fewer hosts (--max-ranks) or more "
                                     "slots per host",
                                     argv[0], q.hosts.size(), bytes, arg_max);
    }
  }
  TF_ASSIGN_OR_RETURN(const int log_fd, OpenRegularForWrite(q.log_path, O_TRUNC, o_.group_readable ? 0640 : 0600));
  Started started;
  {
    std::string cmdline;
    for (const std::string& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
    const std::string head = "# " + cmdline + "\n";
    (void)!::write(log_fd, head.data(), head.size());
    started.log_offset = static_cast<int64_t>(head.size());
  }
  c.log_fd = log_fd;
  c.env = {{"TRAINFLOW_SUPERVISOR", q.address},
           {"TRAINFLOW_SUPERVISOR_SECRET", q.secret},
           {"TRAINFLOW_LAUNCH_GENERATION", std::to_string(q.generation)},
           {"TRAINFLOW_HEARTBEAT_INTERVAL", fmt::format("{}", o_.heartbeat_interval_s)}};
  c.forget = {"TRAINFLOW_SUPERVISOR_SECRET"};
  StatusOr<int64_t> pid = launcher_->Start(c);
  ::close(log_fd);
  TF_RETURN_IF_ERROR(pid.status());
  started.launcher.pid = *pid;
  started.launcher.start_time = launcher_->StartTime(*pid);
  return started;
}

}  // namespace

std::unique_ptr<JobControl> NewProcessJob(const LaunchOptions& options, Env* env, ProcessLauncher* launcher,
                                          RemoteShell* shell) {
  return std::make_unique<ProcessJob>(options, env, launcher, shell);
}

}  // namespace tf::launch
