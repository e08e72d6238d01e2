#include "engine/cli/launch_cli.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/env.h"
#include "base/net.h"
#include "base/subprocess.h"
#include "engine/cli/cli.h"
#include "engine/cli/command.h"
#include "engine/cli/supervisor_flags.h"
#include "engine/train_config.h"
#include "launch/supervisor.h"
#include "model/config.h"
#include "monitor/system_metrics.h"

namespace tf {

struct LaunchCommands {
  CLI::App* launch = nullptr;
  CLI::App* health = nullptr;
  std::string hostfile, state_dir, heartbeat_addr, health_command, mpirun = "mpirun", mpirun_args, rsh_agent;
  std::string metrics_addr = "127.0.0.1:9460";
  int np = 0, min_ranks = 1, max_ranks = 0;
  double health_interval = launch::LaunchOptions{}.health_interval_s;
  SupervisorFlags supervisor;
  std::vector<std::string> command;
  bool status = false, json = false;
  // health
  std::vector<std::string> dirs;
  double min_free_gb = 1.0;
  std::string reach;
  double reach_timeout = 2.0;
  bool quiet = false;
};

using launch::LaunchOptions;

Status CheckProgram(const std::string& program, const std::string& what) {
  if (program.empty()) return Status::InvalidArgument("{} is empty", what);
  auto runnable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (runnable(program)) return Status::OK();
    return Status::InvalidArgument("{} '{}' is not an executable file", what, program);
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');) {
    if (runnable((d.empty() ? std::string(".") : d) + "/" + program)) return Status::OK();
  }
  return Status::InvalidArgument("{} '{}' is not found on PATH", what, program);
}

namespace {

int RunLaunch(const LaunchCommands& c) {
  if (c.status) {
    if (c.state_dir.empty()) return Fail(Status::InvalidArgument("--status needs --state-dir"));
    const Status s = launch::PrintLaunchStatus(c.state_dir, c.json);
    return s.ok() ? kExitOk : Fail(s);
  }
  LaunchOptions o;
  if (c.command.empty()) {
    return Fail(Status::InvalidArgument("no command to supervise: trainflow launch [options] -- train --model ..."));
  }
  o.train_args = c.command;
  GPT2Config model;
  TrainConfig train;
  // A bad configuration stops here, before anything is launched.
  if (Status s = ResolveTrainCommand(o.train_args, &model, &train); !s.ok()) return Fail(s);
  if (!c.hostfile.empty() && c.np > 0) return Fail(Status::InvalidArgument("give --hostfile or --np, not both"));
  if (!c.hostfile.empty()) {
    // A FIFO or a directory is refused without blocking (Env opens regular files only).
    auto text = Env::Default()->ReadFileToString(c.hostfile, uint64_t{64} << 20);
    if (!text.ok()) return Fail(text.status().WithContext("the hostfile"));
    auto hosts = launch::ParseHostfile(*text, c.hostfile);
    if (!hosts.ok()) return Fail(hosts.status());
    o.hosts = *hosts;
    o.hostfile = c.hostfile;
  } else {
    o.hosts = {{"localhost", c.np > 0 ? c.np : 1}};
  }
  o.min_ranks = c.min_ranks;
  o.max_ranks = c.max_ranks;
  if (o.max_ranks > 0 && o.max_ranks < o.min_ranks) {
    return Fail(Status::InvalidArgument("--max-ranks {} < --min-ranks {}", o.max_ranks, o.min_ranks));
  }
  if (Status s = ApplySupervisorFlags(c.supervisor, &o); !s.ok()) return Fail(s);
  o.health_command = c.health_command;
  o.health_interval_s = c.health_interval;
  o.mpirun = c.mpirun;
  if (Status s = CheckProgram(o.mpirun, "--mpirun"); !s.ok()) return Fail(s);
  std::istringstream words(c.mpirun_args);
  for (std::string w; words >> w;) o.mpirun_args.push_back(w);
  o.rsh_agent = c.rsh_agent;
  o.metrics_addr = c.metrics_addr;
  o.trainflow = SelfExecutable("trainflow");
  o.global_rows = int64_t{train.batch_size} * train.grad_accum_steps * std::max(1, launch::TotalSlots(o.hosts));
  if (o.max_ranks > 0) o.global_rows = int64_t{train.batch_size} * train.grad_accum_steps * o.max_ranks;
  o.max_batch_size = train.batch_size;
  o.world_multiple = std::max(1, train.shard_group_size);
  o.tokens_per_step = o.global_rows * train.seq_len;
  o.has_checkpoints = !train.checkpoint_dir.empty();
  if (!o.has_checkpoints) {
    spdlog::warn("the job has no checkpoint_dir: a restart after a failure starts from step 0");
  }
  // Where ranks reach the supervisor: loopback when every host is this machine, else it must be said.
  bool all_local = true;
  for (const auto& h : o.hosts) all_local = all_local && (h.name == "localhost" || h.name.starts_with("127."));
  if (!c.heartbeat_addr.empty()) {
    // HOST, HOST:PORT or [IPv6]:PORT; no port: any free one.
    const bool bare = c.heartbeat_addr.find(':') == std::string::npos ||
                      (c.heartbeat_addr.find(':') != c.heartbeat_addr.rfind(':') && !c.heartbeat_addr.starts_with("["));
    StatusOr<HostPort> parsed = ParseHostPort(bare ? "[" + c.heartbeat_addr + "]:0" : c.heartbeat_addr);
    if (!parsed.ok()) return Fail(Status::InvalidArgument("--heartbeat-addr: {}", parsed.status().message()));
    HostPort addr = *parsed;
    if (bare && c.heartbeat_addr.find(':') == std::string::npos) {
      addr.host = c.heartbeat_addr;
      addr.port = 0;
    }
    o.heartbeat_host = addr.host;
    o.heartbeat_port = addr.port;
  } else if (!all_local) {
    return Fail(Status::InvalidArgument("the hosts are not all this machine: --heartbeat-addr must give an address of "
                                        "this machine that every host can reach"));
  }
  o.state_dir = !c.state_dir.empty() ? c.state_dir : train.out_dir + "/launch";
  return launch::RunSupervisor(o);
}

// `trainflow health`: can a rank start here (this process did), free space where the run writes, and
// the GPUs NVML sees without uncorrected ECC errors.
int RunHealth(const LaunchCommands& c) {
  if (!c.reach.empty()) {
    // Only: does this host reach the supervisor (the probe of a silent rank on another host)?
    StatusOr<HostPort> addr = ParseHostPort(c.reach);
    if (!addr.ok()) return Fail(addr.status().WithContext("--reach"));
    std::string error;
    const int fd = ConnectWithin(addr->host, addr->port, c.reach_timeout, &error);
    if (fd < 0) {
      fmt::print(stderr, "unreachable: {}\n", error);
      return kExitRetryable;
    }
    ::close(fd);
    if (!c.quiet) fmt::print("reached {}\n", c.reach);
    return kExitOk;
  }
  std::vector<std::string> problems;
  std::vector<std::string> dirs = c.dirs.empty() ? std::vector<std::string>{"."} : c.dirs;
  for (const std::string& d : dirs) {
    if (d.starts_with("s3://")) continue;
    std::string probe = d;
    std::error_code ec;
    while (!probe.empty() && !std::filesystem::exists(probe, ec)) probe = std::filesystem::path(probe).parent_path();
    if (probe.empty()) probe = ".";
    struct statvfs st{};
    if (::statvfs(probe.c_str(), &st) != 0) {
      problems.push_back(fmt::format("cannot stat the file system of '{}'", d));
      continue;
    }
    const double free_gb = static_cast<double>(st.f_bavail) * st.f_frsize / 1e9;
    if (free_gb < c.min_free_gb) {
      problems.push_back(fmt::format("'{}' has {:.2f} GB free, less than {:.2f} GB", d, free_gb, c.min_free_gb));
    }
  }
  std::string gpus;
  for (int i = 0; i < 64; ++i) {
    monitor::GpuSelection sel;
    sel.nvml_index = i;
    monitor::SystemCollector collector(sel);
    if (collector.gpu_status().starts_with("no NVML")) break;  // a host without GPUs
    if (collector.gpu_status().find("GPU " + std::to_string(i)) == std::string::npos) break;
    for (const auto& family : collector.Collect()) {
      if (family.name != "trainflow_gpu_ecc_errors_total") continue;
      for (const auto& m : family.metric) {
        bool uncorrected = false;
        for (const auto& l : m.label) uncorrected = uncorrected || (l.name == "type" && l.value == "uncorrected");
        if (uncorrected && m.counter.value > 0) {
          problems.push_back(fmt::format("GPU {} has {} uncorrected ECC error(s)", i, m.counter.value));
        }
      }
    }
    gpus += fmt::format("{}GPU {}", gpus.empty() ? "" : ", ", i);
  }
  const char* host = std::getenv("TRAINFLOW_HOST");
  if (!problems.empty()) {
    for (const std::string& p : problems) fmt::print(stderr, "unhealthy: {}\n", p);
    return kExitIOError;
  }
  if (!c.quiet) {
    fmt::print("healthy{}: {}{}\n", host != nullptr ? fmt::format(" ({})", host) : "", gpus.empty() ? "no GPU" : gpus,
               fmt::format(", {} dir(s) with >= {:.2f} GB free", dirs.size(), c.min_free_gb));
  }
  return kExitOk;
}

}  // namespace

std::shared_ptr<LaunchCommands> AddLaunchCommands(CLI::App& app) {
  auto c = std::make_shared<LaunchCommands>();
  auto* l = app.add_subcommand(
      "launch", "Supervise a training job: heartbeats, automatic restart, elastic resize, host quarantine "
                "(docs/fault-tolerance.md): trainflow launch --hostfile H -- train --model ...");
  c->launch = l;
  l->add_option("--hostfile", c->hostfile, "Open MPI hostfile (\"host slots=N\" lines); re-read when it changes");
  l->add_option("--np", c->np, "Ranks on this machine (instead of --hostfile)")->check(CLI::Range(1, 4096));
  l->add_option("--min-ranks", c->min_ranks, "Fewest ranks to continue with")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  l->add_option("--max-ranks", c->max_ranks, "Most ranks (default: every slot; the global batch is this many ranks')")
      ->check(CLI::Range(1, 1 << 20));
  l->add_option("--state-dir", c->state_dir, "The supervisor's state (default: OUT_DIR/launch)");
  AddSupervisorFlags(l, &c->supervisor);
  l->add_option("--heartbeat-addr", c->heartbeat_addr,
                "HOST[:PORT] the ranks reach the supervisor at (default 127.0.0.1 when every host is this machine)");
  l->add_option("--health-check", c->health_command,
                "Shell command run on a quarantined host (with `trainflow health`); exit 0 readmits it");
  l->add_option("--health-interval", c->health_interval, "Seconds between health checks")
      ->check(FiniteRange(0.1, 1e6))
      ->capture_default_str();
  l->add_option("--mpirun", c->mpirun, "The launcher")->capture_default_str();
  l->add_option("--mpirun-args", c->mpirun_args, "Extra mpirun arguments, space-separated (MCA settings)");
  l->add_option("--rsh-agent", c->rsh_agent, "Remote shell for other hosts (Open MPI's plm_rsh_agent; default ssh)");
  l->add_option("--metrics-addr", c->metrics_addr,
                "The supervisor's Prometheus endpoint HOST:PORT (restarts, failures, downtime, effective training "
                "ratio); \"off\": none; a port in use moves on")
      ->capture_default_str();
  l->add_flag("--status", c->status, "Print the hosts, the job and the incidents of --state-dir, and exit");
  l->add_flag("--json", c->json, "With --status: as JSON");
  l->add_option("command", c->command, "-- train --model ... (the job)");
  auto* h = app.add_subcommand("health", "Host health check: free disk, GPUs visible without ECC errors (exit 0: healthy)");
  c->health = h;
  h->add_option("--dir", c->dirs, "A directory the run writes (repeatable; default .)");
  h->add_option("--min-free-gb", c->min_free_gb, "Least free space")->check(FiniteRange(0, 1e9))->capture_default_str();
  h->add_flag("--quiet", c->quiet, "No output when healthy");
  h->add_option("--reach", c->reach, "Only check that a TCP connection to HOST:PORT opens (exit 0; 3 when it does not)");
  h->add_option("--timeout", c->reach_timeout, "Seconds to wait for --reach")->check(CLI::Range(0.1, 60.0))->capture_default_str();
  return c;
}

bool LaunchCommandParsed(const LaunchCommands& c) { return c.launch->parsed() || c.health->parsed(); }

int RunLaunchCommand(const LaunchCommands& c) { return c.launch->parsed() ? RunLaunch(c) : RunHealth(c); }

}  // namespace tf
