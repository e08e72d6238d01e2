#include "engine/cli/slurm_cli.h"

#include <grp.h>
#include <netdb.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/env.h"
#include "base/json.h"
#include "base/subprocess.h"
#include "engine/cli/cli.h"
#include "engine/cli/launch_cli.h"
#include "engine/cli/supervisor_flags.h"
#include "engine/train_config.h"
#include "launch/heartbeat.h"
#include "launch/slurm_util.h"
#include "launch/supervisor.h"
#include "model/config.h"

namespace tf {

struct SlurmCommands {
  CLI::App* slurm = nullptr;
  std::string unknown;  // a word after `slurm` that is no subcommand
  CLI::App* submit = nullptr;
  CLI::App* run = nullptr;
  // Shared by submit (written into the script) and run (what the script passes on).
  std::string dir, group, heartbeat_addr, srun = "srun";
  int ranks_per_node = 0, gpus_per_node = 0, min_nodes = 0, requeue_budget = 10;
  SupervisorFlags supervisor;
  std::vector<std::string> srun_args;
  std::vector<std::string> command;
  // submit only
  int nodes = 1, cpus_per_rank = 0, warning_s = 120;
  std::string time, partition, account, qos, constraint, exclude, mem, job_name, sbatch = "sbatch";
  std::vector<std::string> sbatch_args;
  bool dry_run = false, no_job_prefix = false;
};

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

int Fail(const Status& s) {
  spdlog::error("{}", s.ToString());
  return ExitCodeFor(s.code());
}

void Say(const std::string& line) {
  fmt::print("[slurm] {}\n", line);
  std::fflush(stdout);
}

std::string SelfExe() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("trainflow") : p.string();
}

std::string UserName() {
  if (const passwd* pw = ::getpwuid(::geteuid()); pw != nullptr) return pw->pw_name;
  return std::to_string(::geteuid());
}

std::string UtcNow(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

// --group: a group that exists and that this user may give files to (a member of it, or root).
StatusOr<gid_t> CheckGroup(const std::string& group) {
  const struct group* g = ::getgrnam(group.c_str());
  if (g == nullptr) return Status::InvalidArgument("--group '{}': no such group", group);
  const gid_t gid = g->gr_gid;
  if (::geteuid() == 0 || ::getegid() == gid) return gid;
  std::vector<gid_t> mine(static_cast<size_t>(std::max(0, ::getgroups(0, nullptr))));
  const int n = ::getgroups(static_cast<int>(mine.size()), mine.data());
  for (int i = 0; i < n; ++i) {
    if (mine[static_cast<size_t>(i)] == gid) return gid;
  }
  return Status::InvalidArgument("--group '{}': you are not a member of it, so the job's files cannot be given to it",
                                 group);
}

// Files of the job: owner-only, or also readable by --group.
mode_t FileMode(const std::string& group) { return group.empty() ? 0600 : 0640; }

// The job directory: created owner-only (or owner + `group`, read-only for the group, new files
// inheriting the group).
Status PrepareDir(const std::string& dir, const std::string& group) {
  gid_t gid = 0;
  if (!group.empty()) {  // before anything is created
    auto g = CheckGroup(group);
    if (!g.ok()) return g.status();
    gid = *g;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create the job directory '{}': {}", dir, ec.message());
  if (group.empty()) {
    if (::chmod(dir.c_str(), 0700) != 0) return Status::IOError("cannot chmod '{}': {}", dir, std::strerror(errno));
    return Status::OK();
  }
  if (::chown(dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return Status::IOError("cannot give '{}' to group {}: {}", dir, group, std::strerror(errno));
  }
  if (::chmod(dir.c_str(), 02750) != 0) return Status::IOError("cannot chmod '{}': {}", dir, std::strerror(errno));
  return Status::OK();
}

Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
    out.close();
    if (!out) return Status::IOError("cannot write '{}'", tmp);
  }
  if (::chmod(tmp.c_str(), mode) != 0) return Status::IOError("cannot chmod '{}': {}", tmp, std::strerror(errno));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::IOError("cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  return Status::OK();
}

// The job's own JSON files (job.json, usage.json): {} when missing; a damaged one is named and
// replaced by {} (what it held is rebuilt or recounted).
json ReadJson(const std::string& path) {
  StatusOr<json> j = ReadJsonFile(path, "job file", Env::Default(), uint64_t{16} << 20);
  if (!j.ok()) {
    if (j.status().code() != StatusCode::kNotFound) spdlog::warn("{}; starting it afresh", j.status().ToString());
    return json::object();
  }
  return j->is_object() ? *j : json::object();
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 1000 && u < 5) {
    b /= 1000;
    ++u;
  }
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 1, units[u]);
}

// Options given to `slurm run` by the script (the same names as submit's).
void AddRunOptions(CLI::App* a, SlurmCommands* c) {
  a->add_option("--dir", c->dir, "The job directory (state, logs, usage; default checkpoints and outputs)");
  a->add_option("--ranks-per-node", c->ranks_per_node, "Ranks on each node (default: one per GPU, else 1)")
      ->check(CLI::Range(1, 1024));
  a->add_option("--gpus-per-node", c->gpus_per_node, "GPUs on each node (0: a CPU job)")->check(CLI::Range(0, 1024));
  a->add_option("--min-nodes", c->min_nodes,
                "Fewest nodes to go on with after isolating failing ones (default: every node); below it the job "
                "is resubmitted without the failing nodes")
      ->check(CLI::Range(1, 1 << 20));
  a->add_option("--requeue-budget", c->requeue_budget,
                "Most requeues and resubmissions of the job (time limits, preemptions, bad nodes)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  AddSupervisorFlags(a, &c->supervisor);
  a->add_option("--heartbeat-addr", c->heartbeat_addr,
                "Address of this node the other nodes reach (default: the node's NodeAddr; 127.0.0.1 on one node)");
  a->add_option("--group", c->group, "Also let this group read the job's outputs (default: owner only)");
  a->add_option("--srun", c->srun, "The srun to use")->capture_default_str();
  a->add_option("--srun-arg", c->srun_args, "An extra srun argument for the ranks' step (repeatable), e.g. --cpu-bind=cores")
      ->expected(1)
      ->allow_extra_args(false)  // one word each: never the "--" and the train command after it
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  a->add_option("command", c->command, "-- train --model ... (the job)");
}

// ---- slurm submit --------------------------------------------------------------------------------

struct Directive {
  std::string why;   // a comment line above it ("" = none)
  std::string line;  // the option, e.g. --nodes=2
};

std::string BuildScript(const SlurmCommands& c, const std::string& name, const std::string& dir,
                        const std::vector<std::string>& run_argv, int ranks_per_node) {
  std::vector<Directive> d;
  d.push_back({"", "--job-name=" + name});
  d.push_back({fmt::format("{} node{}, {} rank{} on each ({})", c.nodes, c.nodes == 1 ? "" : "s", ranks_per_node,
                           ranks_per_node == 1 ? "" : "s", c.gpus_per_node > 0 ? "one per GPU" : "CPU slots"),
               fmt::format("--nodes={}", c.nodes)});
  d.push_back({"", fmt::format("--ntasks-per-node={}", ranks_per_node)});
  if (c.gpus_per_node > 0) d.push_back({"", fmt::format("--gpus-per-node={}", c.gpus_per_node)});
  if (c.cpus_per_rank > 0) d.push_back({"cores for each rank", fmt::format("--cpus-per-task={}", c.cpus_per_rank)});
  if (!c.mem.empty()) d.push_back({"memory per node", "--mem=" + c.mem});
  if (!c.time.empty()) d.push_back({"the time limit of each run (a requeued run starts a new one)", "--time=" + c.time});
  if (!c.partition.empty()) d.push_back({"", "--partition=" + c.partition});
  if (!c.account.empty()) d.push_back({"", "--account=" + c.account});
  if (!c.qos.empty()) d.push_back({"", "--qos=" + c.qos});
  if (!c.constraint.empty()) d.push_back({"", "--constraint=" + c.constraint});
  if (!c.exclude.empty()) d.push_back({"nodes never to run on", "--exclude=" + c.exclude});
  d.push_back({fmt::format("SIGUSR1 to the supervisor {} s before the time limit: it stops the ranks at a checkpoint "
                           "and requeues the job",
                           c.warning_s),
               fmt::format("--signal=B:USR1@{}", c.warning_s)});
  d.push_back({"Slurm may requeue the job (time limit, preemption, node failure); a requeued run resumes from the "
               "newest checkpoint",
               "--requeue"});
  d.push_back({"each run appends to the same log", "--open-mode=append"});
  d.push_back({"", "--output=" + dir + "/slurm-%j.out"});
  d.push_back({"paths in the command are relative to where the job was submitted", "--chdir=" + fs::current_path().string()});
  for (const std::string& a : c.sbatch_args) d.push_back({"", a});

  std::string s = "#!/bin/bash\n";
  s += fmt::format("# TrainFlow job {}, written by `trainflow slurm submit` on {} for {}.\n", name,
                   UtcNow("%Y-%m-%dT%H:%M:%SZ"), UserName());
  s += "# Each line is explained in docs/slurm.md. Submit it again (it resumes): sbatch " + dir + "/job.sbatch\n";
  for (const Directive& x : d) {
    if (!x.why.empty()) s += "# " + x.why + "\n";
    s += "#SBATCH " + x.line + "\n";
  }
  s += "\n# Outputs, checkpoints and logs readable by the owner only" +
       std::string(c.group.empty() ? "" : " (and group " + c.group + ")") + ".\n";
  s += c.group.empty() ? "umask 077\n" : "umask 027\n";
  s += "# The supervisor: launches the ranks with srun --mpi=pmix on the allocation's nodes, restarts them after\n"
       "# failures, isolates failing nodes, requeues before the time limit; its log is this job's output.\n";
  s += "exec";
  size_t col = 4;
  for (size_t i = 0; i < run_argv.size(); ++i) {
    const std::string w = slurm::ShellQuote(run_argv[i]);
    const bool breaks = run_argv[i] == "--" || (col + 1 + w.size() > 100 && i > 0);
    if (breaks) {
      s += " \\\n   ";
      col = 3;
    }
    s += " " + w;
    col += 1 + w.size();
  }
  s += "\n";
  return s;
}

// `flag` in the train command, in either spelling (--out_dir, --out-dir), up to a bare "--".
bool HasFlag(const std::vector<std::string>& args, const std::string& flag) {
  const std::string want = DashedFlag(flag);
  for (const std::string& a : args) {
    if (a == "--") break;
    if (DashedFlag(a.substr(0, a.find('='))) == want) return true;
  }
  return false;
}

int RunSubmit(const SlurmCommands& c) {
  if (c.command.empty()) {
    return Fail(Status::InvalidArgument("no job: trainflow slurm submit [options] -- train --model ..."));
  }
  GPT2Config model;
  TrainConfig train;
  // A bad configuration stops here, before anything is queued.
  if (Status s = ResolveTrainCommand(c.command, &model, &train); !s.ok()) return Fail(s);
  launch::LaunchOptions checked;
  if (Status s = ApplySupervisorFlags(c.supervisor, &checked); !s.ok()) return Fail(s);
  if (c.nodes < 1) return Fail(Status::InvalidArgument("--nodes {}: at least 1", c.nodes));
  const int ranks_per_node = c.ranks_per_node > 0 ? c.ranks_per_node : std::max(1, c.gpus_per_node);
  if (c.gpus_per_node > 0 && ranks_per_node > c.gpus_per_node) {
    return Fail(Status::InvalidArgument("--ranks-per-node {} > --gpus-per-node {}: one rank per GPU at most",
                                        ranks_per_node, c.gpus_per_node));
  }
  if (c.min_nodes > c.nodes) return Fail(Status::InvalidArgument("--min-nodes {} > --nodes {}", c.min_nodes, c.nodes));
  const std::string name = c.job_name.empty() ? "trainflow-" + UtcNow("%Y%m%d-%H%M%S") : c.job_name;
  if (!slurm::ValidJobName(name)) {
    return Fail(Status::InvalidArgument("--job-name '{}': 1 to 64 of A-Z a-z 0-9 _ . - (not starting with - or .)", name));
  }
  if (c.warning_s < 10 || c.warning_s > 65535) {
    return Fail(Status::InvalidArgument("--warning {}: seconds in [10, 65535]", c.warning_s));
  }
  if (!c.time.empty()) {
    auto limit = slurm::ParseSlurmTime(c.time);
    if (!limit.ok()) return Fail(limit.status().WithContext("--time"));
    if (*limit >= 0 && *limit <= c.warning_s) {
      return Fail(Status::InvalidArgument("--time {} ({} s) leaves no time before the --warning of {} s", c.time, *limit,
                                          c.warning_s));
    }
  }
  for (const std::string& a : c.sbatch_args) {
    if (Status s = slurm::CheckSbatchOption(a); !s.ok()) return Fail(s);
  }
  // Every value that goes into the script is one Slurm accepts: never a newline, a space or an option.
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--partition", c.partition},
                                    {"--account", c.account},
                                    {"--qos", c.qos},
                                    {"--constraint", c.constraint},
                                    {"--exclude", c.exclude},
                                    {"--mem", c.mem}}) {
    if (value.empty()) continue;
    if (Status s = slurm::CheckSbatchValue(flag, value); !s.ok()) return Fail(s);
  }
  for (const std::string& a : c.srun_args) {
    if (a.empty() || a.find_first_of("\n\r") != std::string::npos) {
      return Fail(Status::InvalidArgument("--srun-arg '{}': one srun option on one line", a));
    }
  }
  if (!c.exclude.empty()) {
    if (auto e = slurm::ExpandNodeList(c.exclude); !e.ok()) return Fail(e.status().WithContext("--exclude"));
  }
  if (!c.group.empty()) {
    if (auto g = CheckGroup(c.group); !g.ok()) return Fail(g.status());
  }
  const std::string dir = fs::absolute(c.dir.empty() ? "trainflow-jobs/" + name : c.dir).lexically_normal().string();
  if (Status s = slurm::CheckSbatchPath("--dir", dir); !s.ok()) return Fail(s);
  std::error_code cwd_ec;
  if (Status s = slurm::CheckSbatchPath("the working directory (sbatch --chdir)", fs::current_path(cwd_ec).string());
      !s.ok()) {
    return Fail(s);
  }
  if (std::error_code ec; fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return Fail(Status::InvalidArgument("--dir '{}' exists and is not a directory", dir));
  }
  if (!c.dry_run) {
    if (Status s = CheckProgram(c.sbatch, "sbatch"); !s.ok()) {
      return Fail(Status::InvalidArgument("{}: `slurm submit` runs on a Slurm cluster's login node (--sbatch names "
                                          "another sbatch); nothing was written",
                                          s.message()));
    }
  }

  // The job's command: checkpoints are what a requeued run resumes from, so it always has them.
  std::vector<std::string> train_args = c.command;
  std::string checkpoints = train.checkpoint_dir;
  if (checkpoints.empty()) {
    checkpoints = dir + "/checkpoints";
    train_args.insert(train_args.end(), {"--checkpoint_dir", checkpoints});
  } else if (checkpoints.starts_with("s3://") && !c.no_job_prefix) {
    // Every job under its own prefix (the bucket may be shared); the owner's credentials reach it.
    while (checkpoints.ends_with("/")) checkpoints.pop_back();
    checkpoints += "/" + UserName() + "/" + name;
    train_args.insert(train_args.end(), {"--checkpoint_dir", checkpoints});
  }
  if (train.out_dir == TrainConfig{}.out_dir && !HasFlag(c.command, "--out_dir")) {
    train_args.insert(train_args.end(), {"--out_dir", dir + "/out"});
  }
  std::vector<std::string> run = {SelfExe(), "slurm", "run", "--dir", dir};
  if (c.ranks_per_node > 0) run.insert(run.end(), {"--ranks-per-node", std::to_string(c.ranks_per_node)});
  if (c.gpus_per_node > 0) run.insert(run.end(), {"--gpus-per-node", std::to_string(c.gpus_per_node)});
  if (c.min_nodes > 0) run.insert(run.end(), {"--min-nodes", std::to_string(c.min_nodes)});
  run.insert(run.end(), {"--requeue-budget", std::to_string(c.requeue_budget)});
  const std::vector<std::string> supervisor = SupervisorFlagArgs(c.supervisor);
  run.insert(run.end(), supervisor.begin(), supervisor.end());
  if (!c.heartbeat_addr.empty()) run.insert(run.end(), {"--heartbeat-addr", c.heartbeat_addr});
  if (!c.group.empty()) run.insert(run.end(), {"--group", c.group});
  if (c.srun != "srun") run.insert(run.end(), {"--srun", c.srun});
  for (const std::string& a : c.srun_args) run.push_back("--srun-arg=" + a);
  run.push_back("--");
  run.insert(run.end(), train_args.begin(), train_args.end());
  const std::string script = BuildScript(c, name, dir, run, ranks_per_node);
  if (c.dry_run) {
    fmt::print("{}", script);
    return kExitOk;
  }

  ::umask(c.group.empty() ? 077 : 027);
  // What this submission creates goes again if sbatch refuses it: the outermost new directory.
  std::string created;
  for (fs::path p = fs::path(dir); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::exists(p, ec)) break;
    created = p.string();
  }
  if (Status s = PrepareDir(dir, c.group); !s.ok()) return Fail(s);
  const std::string script_path = dir + "/job.sbatch";
  const std::string pending = dir + "/job.sbatch.pending";
  if (Status s = WriteFile(pending, script, c.group.empty() ? 0700 : 0750); !s.ok()) return Fail(s);
  std::string out;
  const int rc = RunCommand({c.sbatch, "--parsable", pending}, 60.0, &out);
  if (rc != 0) {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    std::error_code ec;
    fs::remove(pending, ec);
    if (!created.empty()) fs::remove_all(created, ec);
    return Fail(Status::InvalidArgument("sbatch refused the job (exit {}): {}; nothing was submitted{}", rc, out,
                                        created.empty() ? "" : " and nothing was left behind"));
  }
  if (std::error_code ec; fs::rename(pending, script_path, ec), ec) {
    return Fail(Status::IOError("submitted, but cannot rename '{}' to '{}': {}", pending, script_path, ec.message()));
  }
  json meta = ReadJson(dir + "/job.json");
  meta["name"] = name;
  meta["owner"] = UserName();
  meta["script"] = script_path;
  meta["checkpoint_dir"] = checkpoints;
  if (!meta.contains("exclude")) {
    meta["exclude"] = json::array();
    if (!c.exclude.empty()) meta["exclude"] = *slurm::ExpandNodeList(c.exclude);
  }
  if (Status s = WriteFile(dir + "/job.json", meta.dump(2) + "\n", FileMode(c.group)); !s.ok()) return Fail(s);
  std::string job_id = out.substr(0, out.find_first_of(";\n"));
  fmt::print("submitted job {} ({}): {} node{} x {} rank{}\n  script     {}\n  log        {}/slurm-{}.out\n"
             "  checkpoints {}\n  status     trainflow launch --status --state-dir {}/launch\n  usage      {}/usage.json\n",
             job_id, name, c.nodes, c.nodes == 1 ? "" : "s", ranks_per_node, ranks_per_node == 1 ? "" : "s", script_path,
             dir, job_id, checkpoints, dir, dir);
  return kExitOk;
}

// ---- slurm run (inside the allocation) -----------------------------------------------------------

int Scontrol(const std::vector<std::string>& args, std::string* out = nullptr) {
  std::vector<std::string> argv = {"scontrol"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string text;
  const int rc = RunCommand(argv, 30.0, &text);
  if (rc != 0) spdlog::warn("scontrol {} failed (exit {}): {}", args.empty() ? "" : args[0], rc, text);
  if (out != nullptr) *out = text;
  return rc;
}

// "Key=Value" from `scontrol show ... -o` output ("" when absent).
std::string Field(const std::string& text, const std::string& key) {
  const std::string k = " " + key + "=";
  std::string padded = " " + text;
  const size_t at = padded.find(k);
  if (at == std::string::npos) return "";
  const size_t from = at + k.size();
  const size_t end = padded.find_first_of(" \n", from);
  return padded.substr(from, end == std::string::npos ? std::string::npos : end - from);
}

void Comment(const std::string& job_id, const std::string& text) {
  std::string t = "trainflow: " + text;
  if (t.size() > 250) t = t.substr(0, 247) + "...";
  Scontrol({"update", "JobId=" + job_id, "Comment=" + t});
}

// Where ranks on other nodes reach this node's supervisor.
std::string HeartbeatHost(const SlurmCommands& c, size_t nodes) {
  if (!c.heartbeat_addr.empty()) return c.heartbeat_addr;
  if (nodes <= 1) return "127.0.0.1";
  std::string addr = Getenv("SLURMD_NODENAME");
  std::string out;
  if (!addr.empty() && RunCommand({"scontrol", "show", "node", addr, "-o"}, 30.0, &out) == 0) {
    if (const std::string a = Field(out, "NodeAddr"); !a.empty()) addr = a;
  }
  if (addr.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    addr = name;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(addr.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) {
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof(ip));
    ::freeaddrinfo(res);
    return ip;
  }
  return addr;
}

int64_t IntEnv(const char* name) {
  const std::string v = Getenv(name);
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return v.empty() || end == v.c_str() || *end != '\0' || n < 0 ? 0 : n;
}

int RunInAllocation(const SlurmCommands& c) {
  const std::string job_id = Getenv("SLURM_JOB_ID");
  const std::string nodelist = Getenv("SLURM_JOB_NODELIST");
  if (job_id.empty() || nodelist.empty()) {
    return Fail(Status::InvalidArgument("`trainflow slurm run` runs inside a Slurm allocation (SLURM_JOB_ID and "
                                        "SLURM_JOB_NODELIST are not set): submit the job with `trainflow slurm submit`"));
  }
  if (c.command.empty()) return Fail(Status::InvalidArgument("no job: trainflow slurm run [options] -- train ..."));
  if (c.dir.empty()) return Fail(Status::InvalidArgument("--dir is required"));
  ::umask(c.group.empty() ? 077 : 027);
  const std::string dir = fs::absolute(c.dir).lexically_normal().string();
  if (Status s = PrepareDir(dir, c.group); !s.ok()) return Fail(s);
  GPT2Config model;
  TrainConfig train;
  if (Status s = ResolveTrainCommand(c.command, &model, &train); !s.ok()) {
    Comment(job_id, "bad configuration: " + s.message());
    return Fail(s);
  }
  auto names = slurm::ExpandNodeList(nodelist);
  if (!names.ok()) return Fail(names.status().WithContext("SLURM_JOB_NODELIST"));
  std::vector<int> per_node;
  if (c.ranks_per_node > 0) {
    per_node.assign(names->size(), c.ranks_per_node);
  } else if (const std::string tpn = Getenv("SLURM_TASKS_PER_NODE"); !tpn.empty()) {
    auto t = slurm::ParseTasksPerNode(tpn);
    if (!t.ok()) return Fail(t.status().WithContext("SLURM_TASKS_PER_NODE"));
    per_node = *t;
  }
  if (per_node.size() != names->size()) per_node.assign(names->size(), std::max(1, c.gpus_per_node));
  std::vector<launch::HostEntry> hosts;
  int total = 0, fewest = 1 << 30;
  for (size_t i = 0; i < names->size(); ++i) {
    hosts.push_back({(*names)[i], per_node[i]});
    total += per_node[i];
    fewest = std::min(fewest, per_node[i]);
  }
  const int64_t requeues = IntEnv("SLURM_RESTART_COUNT") + IntEnv("TRAINFLOW_SLURM_RESUBMITS");
  Say(fmt::format("job {} run {} (requeue budget {}): {} node{} ({}), {} rank{}; state in {}", job_id, requeues + 1,
                  c.requeue_budget, hosts.size(), hosts.size() == 1 ? "" : "s", nodelist, total, total == 1 ? "" : "s",
                  dir));

  // Per-job secrets and ports: the metrics token (owner-only), any free port for every endpoint.
  const std::string token_path = dir + "/metrics.token";
  std::string token;
  std::ifstream(token_path) >> token;
  if (token.size() < 32) {
    token = monitor::RandomHex(32);
    if (Status s = WriteFile(token_path, token + "\n", FileMode(c.group)); !s.ok()) return Fail(s);
  }
  std::vector<std::string> train_args = c.command;
  if (train.metrics_addr == TrainConfig{}.metrics_addr && !HasFlag(c.command, "--metrics_addr")) {
    train_args.insert(train_args.end(), {"--metrics_addr", "127.0.0.1:0"});
  }
  if (train.metrics_token_file.empty() && train.metrics_addr != "off" && !train.metrics_addr.empty()) {
    train_args.insert(train_args.end(), {"--metrics_token_file", token_path});
  }

  launch::LaunchOptions o;
  if (Status s = ApplySupervisorFlags(c.supervisor, &o); !s.ok()) return Fail(s);
  o.hosts = hosts;
  o.min_ranks = c.min_nodes > 0 ? std::min(total, c.min_nodes * fewest) : total;
  o.heartbeat_host = HeartbeatHost(c, hosts.size());
  o.state_dir = dir + "/launch";
  o.group_readable = !c.group.empty();
  o.launcher = "srun";
  o.srun = c.srun;
  o.srun_args = c.srun_args;
  // The batch job's cores per rank (srun does not inherit --cpus-per-task since Slurm 22.05).
  if (const std::string cpt = Getenv("SLURM_CPUS_PER_TASK"); !cpt.empty() && !HasFlag(c.srun_args, "--cpus-per-task")) {
    o.srun_args.insert(o.srun_args.begin(), "--cpus-per-task=" + cpt);
  }
  o.slurm_job_id = job_id;
  o.wait_for_hosts = false;
  o.trainflow = SelfExe();
  o.train_args = train_args;
  o.global_rows = int64_t{train.batch_size} * train.grad_accum_steps * total;
  o.max_batch_size = train.batch_size;
  o.has_checkpoints = !train.checkpoint_dir.empty();
  if (!o.has_checkpoints) spdlog::warn("the job has no checkpoint_dir: a requeued or restarted run starts from step 0");
  o.tokens_per_step = o.global_rows * train.seq_len;
  o.accounted_hosts = static_cast<int>(hosts.size());
  o.accounted_gpus = static_cast<int>(hosts.size()) * c.gpus_per_node;
  o.requeues = requeues;
  o.metrics_addr = "127.0.0.1:0";
  o.metrics_token = token;
  o.endpoints_path = dir + "/endpoints.json";

  const double started = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  launch::SupervisorOutcome out;
  int code = launch::RunSupervisor(o, &out);

  // What the job used, for teams on a budget: usage.json (totals and every run) and the log.
  const launch::ResourceUsage& u = out.usage;
  json usage = ReadJson(dir + "/usage.json");
  json runs = usage.value("runs", json::array());
  runs.push_back({{"job_id", job_id},
                  {"run", requeues + 1},
                  {"nodes", nodelist},
                  {"started", started},
                  {"ended", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
                  {"outcome", out.reason},
                  {"exit_code", code},
                  {"final_step", out.final_step}});
  usage = {{"node_hours", u.node_seconds / 3600.0}, {"gpu_hours", u.gpu_seconds / 3600.0}, {"tokens", u.tokens},
           {"checkpoint_bytes", u.checkpoint_bytes}, {"restarts", u.restarts},             {"requeues", u.requeues},
           {"runs", runs}};
  (void)WriteFile(dir + "/usage.json", usage.dump(2) + "\n", FileMode(c.group));
  Say(fmt::format("usage so far: {:.4f} node-hours, {:.4f} GPU-hours, {} tokens trained, {} of checkpoints, {} "
                  "restart{}, {} requeue{} ({}/usage.json)",
                  u.node_seconds / 3600.0, u.gpu_seconds / 3600.0, u.tokens, HumanBytes(static_cast<double>(u.checkpoint_bytes)),
                  u.restarts, u.restarts == 1 ? "" : "s", u.requeues, u.requeues == 1 ? "" : "s", dir));

  const bool budget_left = requeues < c.requeue_budget;
  if (out.reason == "finished") return code;
  if (out.reason == "time_warning") {
    if (!budget_left) {
      Comment(job_id, fmt::format("stopped at a checkpoint before the time limit; requeue budget of {} spent",
                                  c.requeue_budget));
      Say(fmt::format("requeue budget of {} spent: not requeued (sbatch {}/job.sbatch resumes it)", c.requeue_budget, dir));
      return kExitStopped;
    }
    Say(fmt::format("checkpoint written before the time limit (step {}): requeueing job {}", out.final_step, job_id));
    std::fflush(stdout);
    if (Scontrol({"requeue", job_id}) != 0) return kExitStopped;
    return kExitOk;
  }
  if (out.reason == "stopped_outside") {
    // The ranks were signalled: a preemption (Slurm requeues a requeueable job itself) or scancel.
    std::string show;
    Scontrol({"show", "job", job_id, "-o"}, &show);
    const std::string preempted = Field(show, "PreemptTime");
    const bool preemption = !preempted.empty() && preempted != "None";
    Say(fmt::format("the ranks stopped at a checkpoint (step {}) on Slurm's signal (job state {}{})", out.final_step,
                    Field(show, "JobState"), preemption ? ", preempted" : ""));
    // A preempted job that ends by itself within its grace time is not requeued by Slurm: it does so.
    if (preemption && Field(show, "Requeue") != "0") {
      if (!budget_left) {
        Comment(job_id, fmt::format("preempted; requeue budget of {} spent", c.requeue_budget));
        Say(fmt::format("requeue budget of {} spent: not requeued (sbatch {}/job.sbatch resumes it)", c.requeue_budget, dir));
        return kExitStopped;
      }
      Say(fmt::format("preempted: requeueing job {}", job_id));
      std::fflush(stdout);
      if (Scontrol({"requeue", job_id}) == 0) return kExitOk;
    }
    return kExitStopped;
  }
  if (out.reason == "too_few_hosts" && !out.bad_hosts.empty()) {
    std::vector<std::string> bad;
    std::string why;
    for (const auto& [h, cause] : out.bad_hosts) {
      bad.push_back(h);
      why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", h, cause);
    }
    Comment(job_id, "excluded " + slurm::CompressNodeList(bad) + " (" + why + ")");
    if (::geteuid() == 0) {
      for (const auto& [h, cause] : out.bad_hosts) {
        std::string reason = "trainflow job " + job_id + ": " + cause;
        if (reason.size() > 200) reason = reason.substr(0, 197) + "...";
        if (Scontrol({"update", "NodeName=" + h, "State=DRAIN", "Reason=" + reason}) == 0) Say("drained node " + h);
      }
    }
    json meta = ReadJson(dir + "/job.json");
    std::set<std::string> excluded;
    for (const json& e : meta.value("exclude", json::array())) {
      if (e.is_string()) excluded.insert(e.get<std::string>());
    }
    excluded.insert(bad.begin(), bad.end());
    meta["exclude"] = std::vector<std::string>(excluded.begin(), excluded.end());
    (void)WriteFile(dir + "/job.json", meta.dump(2) + "\n", FileMode(c.group));
    if (!budget_left) {
      Say(fmt::format("too few healthy nodes ({}) and the requeue budget of {} is spent", why, c.requeue_budget));
      return kExitRetryable;
    }
    const std::string script = meta.value("script", dir + "/job.sbatch");
    std::vector<std::string> argv = {"sbatch", "--parsable",
                                     "--exclude=" + slurm::CompressNodeList(std::vector<std::string>(excluded.begin(), excluded.end())),
                                     "--dependency=afterany:" + job_id,
                                     fmt::format("--export=ALL,TRAINFLOW_SLURM_RESUBMITS={}", requeues + 1), script};
    std::string sb;
    const int rc = RunCommand(argv, 60.0, &sb);
    if (rc != 0) {
      Say(fmt::format("too few healthy nodes ({}); resubmitting without them failed (exit {}): {}", why, rc, sb));
      return kExitRetryable;
    }
    const std::string next = sb.substr(0, sb.find_first_of(";\n"));
    Say(fmt::format("too few healthy nodes: {}. Resubmitted as job {} excluding {} (it resumes from the checkpoint)",
                    why, next, slurm::CompressNodeList(std::vector<std::string>(excluded.begin(), excluded.end()))));
    Comment(job_id, "continued as job " + next + " without " + slurm::CompressNodeList(bad));
    return kExitRetryable;
  }
  if (out.reason == "budget" || out.reason == "bad_input" || out.reason == "error") {
    Comment(job_id, out.reason == "budget" ? "restart budget spent (see the log)"
                    : out.reason == "bad_input" ? "configuration or input error (see the log)"
                                                : "the job could not be launched (see the log)");
  }
  return code;
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
  s->add_option("--nodes", c->nodes, "Nodes")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  s->add_option("--cpus-per-rank", c->cpus_per_rank, "Cores for each rank (--cpus-per-task)")->check(CLI::Range(1, 4096));
  s->add_option("--mem", c->mem, "Memory per node (sbatch --mem, e.g. 200G)");
  s->add_option("--time", c->time, "Time limit of each run (sbatch --time: MM, HH:MM:SS, D-HH:MM:SS)");
  s->add_option("--warning", c->warning_s, "Seconds before the time limit to checkpoint and requeue")
      ->capture_default_str();
  s->add_option("--partition", c->partition, "Partition");
  s->add_option("--account", c->account, "Account to charge");
  s->add_option("--qos", c->qos, "Quality of service");
  s->add_option("--constraint", c->constraint, "Node features (sbatch --constraint)");
  s->add_option("--exclude", c->exclude, "Nodes never to use (a Slurm host list)");
  s->add_option("--job-name", c->job_name, "Job name (default trainflow-DATE-TIME); also the default --dir and the "
                                           "S3 checkpoint prefix");
  s->add_option("--sbatch-arg", c->sbatch_args, "An extra #SBATCH option (repeatable), e.g. --mail-type=END")
      ->expected(1)
      ->allow_extra_args(false)  // one word each: never the "--" and the train command after it
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  s->add_option("--sbatch", c->sbatch, "The sbatch to use")->capture_default_str();
  s->add_flag("--dry-run", c->dry_run, "Print the script; submit nothing");
  s->add_flag("--no-job-prefix", c->no_job_prefix,
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
