#include "launch/slurm_job.h"

#include <grp.h>
#include <netdb.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/format.h"
#include "base/json.h"
#include "base/net.h"
#include "base/random.h"
#include "base/status.h"
#include "base/subprocess.h"
#include "launch/heartbeat.h"
#include "launch/slurm_util.h"

namespace tf::slurm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

int64_t IntEnv(const char* name) {
  const std::string v = Getenv(name);
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return v.empty() || end == v.c_str() || *end != '\0' || n < 0 ? 0 : n;
}

void Say(const std::string& line) {
  fmt::print("[slurm] {}\n", line);
  std::fflush(stdout);
}

std::string UserName() {
  if (const passwd* pw = ::getpwuid(::geteuid()); pw != nullptr) return pw->pw_name;
  return std::to_string(::geteuid());
}

StatusOr<gid_t> GroupId(const std::string& group) {
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

// `flag` (e.g. --cpus-per-task) among srun arguments, alone or as --flag=value.
bool HasOption(const std::vector<std::string>& args, const std::string& flag) {
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == flag || a.starts_with(flag + "=")) return true;
  }
  return false;
}

struct Directive {
  std::string why;   // a comment line above it ("" = none)
  std::string line;  // the option, e.g. --nodes=2
};

std::string BuildScript(const SubmitOptions& o, const SubmitContext& ctx, const SbatchJob& job) {
  const int nodes = o.nodes;
  const int per_node = job.ranks_per_node;
  std::vector<Directive> d;
  d.push_back({"", "--job-name=" + job.name});
  d.push_back({fmt::format("{} node{}, {} rank{} on each ({})", nodes, nodes == 1 ? "" : "s", per_node,
                           per_node == 1 ? "" : "s", o.job.gpus_per_node > 0 ? "one per GPU" : "CPU slots"),
               fmt::format("--nodes={}", nodes)});
  d.push_back({"", fmt::format("--ntasks-per-node={}", per_node)});
  if (o.job.gpus_per_node > 0) d.push_back({"", fmt::format("--gpus-per-node={}", o.job.gpus_per_node)});
  if (o.cpus_per_rank > 0) d.push_back({"cores for each rank", fmt::format("--cpus-per-task={}", o.cpus_per_rank)});
  if (!o.mem.empty()) d.push_back({"memory per node", "--mem=" + o.mem});
  if (!o.time.empty()) d.push_back({"the time limit of each run (a requeued run starts a new one)", "--time=" + o.time});
  if (!o.partition.empty()) d.push_back({"", "--partition=" + o.partition});
  if (!o.account.empty()) d.push_back({"", "--account=" + o.account});
  if (!o.qos.empty()) d.push_back({"", "--qos=" + o.qos});
  if (!o.constraint.empty()) d.push_back({"", "--constraint=" + o.constraint});
  if (!o.exclude.empty()) d.push_back({"nodes never to run on", "--exclude=" + o.exclude});
  d.push_back({fmt::format("SIGUSR1 to the supervisor {} s before the time limit: it stops the ranks at a checkpoint "
                           "and requeues the job",
                           o.warning_s),
               fmt::format("--signal=B:USR1@{}", o.warning_s)});
  d.push_back({"Slurm may requeue the job (time limit, preemption, node failure); a requeued run resumes from the "
               "newest checkpoint",
               "--requeue"});
  d.push_back({"each run appends to the same log", "--open-mode=append"});
  d.push_back({"", "--output=" + job.dir + "/slurm-%j.out"});
  d.push_back({"paths in the command are relative to where the job was submitted", "--chdir=" + ctx.cwd});
  for (const std::string& a : o.sbatch_args) d.push_back({"", a});

  std::string s = "#!/bin/bash\n";
  s += fmt::format("# TrainFlow job {}, written by `trainflow slurm submit` on {} for {}.\n", job.name, ctx.now_utc,
                   ctx.user);
  s += "# Each line is explained in docs/slurm.md. Submit it again (it resumes): sbatch " + job.dir + "/job.sbatch\n";
  for (const Directive& x : d) {
    if (!x.why.empty()) s += "# " + x.why + "\n";
    s += "#SBATCH " + x.line + "\n";
  }
  const std::string& group = o.job.group;
  s += "\n# Outputs, checkpoints and logs readable by the owner only" +
       std::string(group.empty() ? "" : " (and group " + group + ")") + ".\n";
  s += group.empty() ? "umask 077\n" : "umask 027\n";
  s += "# The supervisor: launches the ranks with srun --mpi=pmix on the allocation's nodes, restarts them after\n"
       "# failures, isolates failing nodes, requeues before the time limit; its log is this job's output.\n";
  s += "exec";
  size_t col = 4;
  const std::vector<std::string>& argv = job.run_argv;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string w = ShellQuote(argv[i]);
    const bool breaks = argv[i] == "--" || (col + 1 + w.size() > 100 && i > 0);
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

// Where ranks on other nodes reach this node's supervisor.
std::string HeartbeatHost(const JobOptions& o, const Allocation& a, size_t nodes) {
  if (!o.heartbeat_addr.empty()) return o.heartbeat_addr;
  if (nodes <= 1) return "127.0.0.1";
  std::string addr = a.node_name;
  std::string out;
  if (!addr.empty() && RunCommand({"scontrol", "show", "node", addr, "-o"}, 30.0, &out) == 0) {
    if (const std::string found = Field(out, "NodeAddr"); !found.empty()) addr = found;
  }
  if (addr.empty()) addr = HostName();
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

// Too few healthy nodes: drain them (as root), exclude them, resubmit the job without them.
int ResubmitWithout(const JobOptions& o, const Allocation& a, const launch::SupervisorOutcome& out, bool budget_left) {
  const std::string& job_id = a.job_id;
  std::vector<std::string> bad;
  std::string why;
  for (const auto& [h, cause] : out.bad_hosts) {
    bad.push_back(h);
    why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", h, cause);
  }
  CommentJob(job_id, "excluded " + CompressNodeList(bad) + " (" + why + ")");
  if (::geteuid() == 0) {
    for (const auto& [h, cause] : out.bad_hosts) {
      std::string reason = "trainflow job " + job_id + ": " + cause;
      if (reason.size() > 200) reason = reason.substr(0, 197) + "...";
      if (Scontrol({"update", "NodeName=" + h, "State=DRAIN", "Reason=" + reason}) == 0) Say("drained node " + h);
    }
  }
  std::vector<std::string> excluded;
  if (auto e = AddExcludedNodes(o.dir, o.group, bad); e.ok()) {
    excluded = *e;
  } else {
    spdlog::warn("{}", e.status().ToString());
    excluded = bad;
  }
  if (!budget_left) {
    Say(fmt::format("too few healthy nodes ({}) and the requeue budget of {} is spent", why, o.requeue_budget));
    return kExitRetryable;
  }
  const std::string script = ReadJobJson(o.dir + "/job.json").value("script", o.dir + "/job.sbatch");
  std::vector<std::string> argv = {"sbatch", "--parsable", "--exclude=" + CompressNodeList(excluded),
                                   "--dependency=afterany:" + job_id,
                                   fmt::format("--export=ALL,TRAINFLOW_SLURM_RESUBMITS={}", a.requeues + 1), script};
  std::string sb;
  const int rc = RunCommand(argv, 60.0, &sb);
  if (rc != 0) {
    Say(fmt::format("too few healthy nodes ({}); resubmitting without them failed (exit {}): {}", why, rc, sb));
    return kExitRetryable;
  }
  const std::string next = sb.substr(0, sb.find_first_of(";\n"));
  Say(fmt::format("too few healthy nodes: {}. Resubmitted as job {} excluding {} (it resumes from the checkpoint)", why,
                  next, CompressNodeList(excluded)));
  CommentJob(job_id, "continued as job " + next + " without " + CompressNodeList(bad));
  return kExitRetryable;
}

}  // namespace

SubmitContext SubmitContext::Here() {
  SubmitContext c;
  std::error_code ec;
  c.trainflow = SelfExecutable("trainflow");
  c.cwd = fs::current_path(ec).string();
  c.user = UserName();
  c.now_utc = FormatUtc(UnixSeconds(), "%Y-%m-%dT%H:%M:%SZ");
  c.stamp_utc = FormatUtc(UnixSeconds(), "%Y%m%d-%H%M%S");
  return c;
}

StatusOr<SbatchJob> PlanSubmit(const SubmitOptions& o, const TrainJob& train, const SubmitContext& ctx) {
  const JobOptions& jo = o.job;
  if (o.nodes < 1) return Status::InvalidArgument("--nodes {}: at least 1", o.nodes);
  SbatchJob job;
  job.ranks_per_node = jo.ranks_per_node > 0 ? jo.ranks_per_node : std::max(1, jo.gpus_per_node);
  if (jo.gpus_per_node > 0 && job.ranks_per_node > jo.gpus_per_node) {
    return Status::InvalidArgument("--ranks-per-node {} > --gpus-per-node {}: one rank per GPU at most",
                                   job.ranks_per_node, jo.gpus_per_node);
  }
  if (jo.min_nodes > o.nodes) return Status::InvalidArgument("--min-nodes {} > --nodes {}", jo.min_nodes, o.nodes);
  job.name = o.job_name.empty() ? "trainflow-" + ctx.stamp_utc : o.job_name;
  if (!ValidJobName(job.name)) {
    return Status::InvalidArgument("--job-name '{}': 1 to 64 of A-Z a-z 0-9 _ . - (not starting with - or .)", job.name);
  }
  if (o.warning_s < 10 || o.warning_s > 65535) {
    return Status::InvalidArgument("--warning {}: seconds in [10, 65535]", o.warning_s);
  }
  if (!o.time.empty()) {
    auto limit = ParseSlurmTime(o.time);
    if (!limit.ok()) return limit.status().WithContext("--time");
    if (*limit >= 0 && *limit <= o.warning_s) {
      return Status::InvalidArgument("--time {} ({} s) leaves no time before the --warning of {} s", o.time, *limit,
                                     o.warning_s);
    }
  }
  for (const std::string& a : o.sbatch_args) TF_RETURN_IF_ERROR(CheckSbatchOption(a));
  // Every value that goes into the script is one Slurm accepts: never a newline, a space or an option.
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--partition", o.partition},
                                    {"--account", o.account},
                                    {"--qos", o.qos},
                                    {"--constraint", o.constraint},
                                    {"--exclude", o.exclude},
                                    {"--mem", o.mem}}) {
    if (!value.empty()) TF_RETURN_IF_ERROR(CheckSbatchValue(flag, value));
  }
  for (const std::string& a : jo.srun_args) {
    if (a.empty() || a.find_first_of("\n\r") != std::string::npos) {
      return Status::InvalidArgument("--srun-arg '{}': one srun option on one line", a);
    }
  }
  if (!o.exclude.empty()) {
    if (auto e = ExpandNodeList(o.exclude); !e.ok()) return e.status().WithContext("--exclude");
  }
  if (!jo.group.empty()) TF_RETURN_IF_ERROR(CheckGroup(jo.group));
  const fs::path given = jo.dir.empty() ? fs::path("trainflow-jobs/" + job.name) : fs::path(jo.dir);
  job.dir = (given.is_absolute() ? given : fs::path(ctx.cwd) / given).lexically_normal().string();
  TF_RETURN_IF_ERROR(CheckSbatchPath("--dir", job.dir));
  TF_RETURN_IF_ERROR(CheckSbatchPath("the working directory (sbatch --chdir)", ctx.cwd));
  if (std::error_code ec; fs::exists(job.dir, ec) && !fs::is_directory(job.dir, ec)) {
    return Status::InvalidArgument("--dir '{}' exists and is not a directory", job.dir);
  }

  // The job's command: checkpoints are what a requeued run resumes from, so it always has them.
  std::vector<std::string> train_args = train.args;
  job.checkpoint_dir = train.checkpoint_dir;
  if (job.checkpoint_dir.empty()) {
    job.checkpoint_dir = job.dir + "/checkpoints";
    train_args.insert(train_args.end(), {"--checkpoint_dir", job.checkpoint_dir});
  } else if (job.checkpoint_dir.starts_with("s3://") && !o.no_job_prefix) {
    // Every job under its own prefix (the bucket may be shared); the owner's credentials reach it.
    while (job.checkpoint_dir.ends_with("/")) job.checkpoint_dir.pop_back();
    job.checkpoint_dir += "/" + ctx.user + "/" + job.name;
    train_args.insert(train_args.end(), {"--checkpoint_dir", job.checkpoint_dir});
  }
  if (train.out_dir_default) train_args.insert(train_args.end(), {"--out_dir", job.dir + "/out"});
  std::vector<std::string>& run = job.run_argv;
  run = {ctx.trainflow, "slurm", "run", "--dir", job.dir};
  if (jo.ranks_per_node > 0) run.insert(run.end(), {"--ranks-per-node", std::to_string(jo.ranks_per_node)});
  if (jo.gpus_per_node > 0) run.insert(run.end(), {"--gpus-per-node", std::to_string(jo.gpus_per_node)});
  if (jo.min_nodes > 0) run.insert(run.end(), {"--min-nodes", std::to_string(jo.min_nodes)});
  run.insert(run.end(), {"--requeue-budget", std::to_string(jo.requeue_budget)});
  run.insert(run.end(), jo.supervisor_args.begin(), jo.supervisor_args.end());
  if (!jo.heartbeat_addr.empty()) run.insert(run.end(), {"--heartbeat-addr", jo.heartbeat_addr});
  if (!jo.group.empty()) run.insert(run.end(), {"--group", jo.group});
  if (jo.srun != "srun") run.insert(run.end(), {"--srun", jo.srun});
  for (const std::string& a : jo.srun_args) run.push_back("--srun-arg=" + a);
  run.push_back("--");
  run.insert(run.end(), train_args.begin(), train_args.end());
  job.script = BuildScript(o, ctx, job);
  return job;
}

StatusOr<std::string> Submit(const SubmitOptions& o, const SbatchJob& job, const std::string& sbatch) {
  const std::string& group = o.job.group;
  ::umask(group.empty() ? 077 : 027);
  // What this submission creates goes again if sbatch refuses it: the outermost new directory.
  std::string created;
  for (fs::path p = fs::path(job.dir); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::exists(p, ec)) break;
    created = p.string();
  }
  TF_RETURN_IF_ERROR(PrepareJobDir(job.dir, group));
  const std::string script_path = job.dir + "/job.sbatch";
  const std::string pending = job.dir + "/job.sbatch.pending";
  TF_RETURN_IF_ERROR(WriteJobFile(pending, job.script, group, /*executable=*/true));
  std::string out;
  const int rc = RunCommand({sbatch, "--parsable", pending}, 60.0, &out);
  if (rc != 0) {
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    std::error_code ec;
    fs::remove(pending, ec);
    if (!created.empty()) fs::remove_all(created, ec);
    return Status::InvalidArgument("sbatch refused the job (exit {}): {}; nothing was submitted{}", rc, out,
                                   created.empty() ? "" : " and nothing was left behind");
  }
  if (Status s = Env::Default()->RenameFile(pending, script_path); !s.ok()) {
    return Status::IOError("submitted, but {}", s.message());
  }
  json meta = ReadJobJson(job.dir + "/job.json");
  meta["name"] = job.name;
  meta["owner"] = UserName();
  meta["script"] = script_path;
  meta["checkpoint_dir"] = job.checkpoint_dir;
  if (!meta.contains("exclude")) {
    meta["exclude"] = json::array();
    if (!o.exclude.empty()) meta["exclude"] = *ExpandNodeList(o.exclude);
  }
  TF_RETURN_IF_ERROR(WriteJobFile(job.dir + "/job.json", meta.dump(2) + "\n", group));
  return out.substr(0, out.find_first_of(";\n"));
}

// ---- the job directory ---------------------------------------------------------------------------

Status CheckGroup(const std::string& group) { return GroupId(group).status(); }

Status PrepareJobDir(const std::string& dir, const std::string& group) {
  gid_t gid = 0;
  if (!group.empty()) {  // before anything is created
    TF_ASSIGN_OR_RETURN(gid, GroupId(group));
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

Status WriteJobFile(const std::string& path, const std::string& text, const std::string& group, bool executable) {
  TF_RETURN_IF_ERROR(Env::Default()->WriteFileAtomically(path, text));
  const mode_t mode = (group.empty() ? 0600 : 0640) | (executable ? (group.empty() ? 0100 : 0110) : 0);
  if (::chmod(path.c_str(), mode) != 0) return Status::IOError("cannot chmod '{}': {}", path, std::strerror(errno));
  return Status::OK();
}

json ReadJobJson(const std::string& path) {
  StatusOr<json> j = ReadJsonFile(path, "job file", Env::Default(), uint64_t{16} << 20);
  if (!j.ok()) {
    if (j.status().code() != StatusCode::kNotFound) spdlog::warn("{}; starting it afresh", j.status().ToString());
    return json::object();
  }
  return j->is_object() ? *j : json::object();
}

StatusOr<json> RecordUsage(const std::string& dir, const std::string& group, const launch::ResourceUsage& u,
                           const RunRecord& r) {
  json runs = ReadJobJson(dir + "/usage.json").value("runs", json::array());
  if (!runs.is_array()) runs = json::array();
  runs.push_back({{"job_id", r.job_id},
                  {"run", r.run},
                  {"nodes", r.nodes},
                  {"started", r.started},
                  {"ended", r.ended},
                  {"outcome", r.outcome},
                  {"exit_code", r.exit_code},
                  {"final_step", r.final_step}});
  json usage = {{"node_hours", u.node_seconds / 3600.0}, {"gpu_hours", u.gpu_seconds / 3600.0}, {"tokens", u.tokens},
                {"checkpoint_bytes", u.checkpoint_bytes}, {"restarts", u.restarts},             {"requeues", u.requeues},
                {"runs", runs}};
  TF_RETURN_IF_ERROR(WriteJobFile(dir + "/usage.json", usage.dump(2) + "\n", group));
  return usage;
}

StatusOr<std::vector<std::string>> AddExcludedNodes(const std::string& dir, const std::string& group,
                                                    const std::vector<std::string>& bad) {
  json meta = ReadJobJson(dir + "/job.json");
  std::set<std::string> excluded;
  for (const json& e : meta.value("exclude", json::array())) {
    if (e.is_string()) excluded.insert(e.get<std::string>());
  }
  excluded.insert(bad.begin(), bad.end());
  std::vector<std::string> list(excluded.begin(), excluded.end());
  meta["exclude"] = list;
  TF_RETURN_IF_ERROR(WriteJobFile(dir + "/job.json", meta.dump(2) + "\n", group));
  return list;
}

// ---- inside the allocation -----------------------------------------------------------------------

StatusOr<Allocation> Allocation::FromEnvironment() {
  Allocation a;
  a.job_id = Getenv("SLURM_JOB_ID");
  a.nodelist = Getenv("SLURM_JOB_NODELIST");
  if (a.job_id.empty() || a.nodelist.empty()) {
    return Status::InvalidArgument("`trainflow slurm run` runs inside a Slurm allocation (SLURM_JOB_ID and "
                                   "SLURM_JOB_NODELIST are not set): submit the job with `trainflow slurm submit`");
  }
  a.tasks_per_node = Getenv("SLURM_TASKS_PER_NODE");
  a.cpus_per_task = Getenv("SLURM_CPUS_PER_TASK");
  a.node_name = Getenv("SLURMD_NODENAME");
  a.requeues = IntEnv("SLURM_RESTART_COUNT") + IntEnv("TRAINFLOW_SLURM_RESUBMITS");
  return a;
}

StatusOr<std::vector<launch::HostEntry>> AllocationHosts(const JobOptions& o, const Allocation& a) {
  auto names = ExpandNodeList(a.nodelist);
  if (!names.ok()) return names.status().WithContext("SLURM_JOB_NODELIST");
  std::vector<int> per_node;
  if (o.ranks_per_node > 0) {
    per_node.assign(names->size(), o.ranks_per_node);
  } else if (!a.tasks_per_node.empty()) {
    auto t = ParseTasksPerNode(a.tasks_per_node);
    if (!t.ok()) return t.status().WithContext("SLURM_TASKS_PER_NODE");
    per_node = *t;
  }
  if (per_node.size() != names->size()) per_node.assign(names->size(), std::max(1, o.gpus_per_node));
  std::vector<launch::HostEntry> hosts;
  for (size_t i = 0; i < names->size(); ++i) hosts.push_back({(*names)[i], per_node[i]});
  return hosts;
}

launch::LaunchOptions JobLaunchOptions(const JobOptions& jo, const TrainJob& train, const Allocation& a,
                                       const std::vector<launch::HostEntry>& hosts, launch::LaunchOptions o,
                                       const std::string& metrics_token) {
  int total = 0, fewest = 1 << 30;
  for (const auto& h : hosts) {
    total += h.slots;
    fewest = std::min(fewest, h.slots);
  }
  o.hosts = hosts;
  o.min_ranks = jo.min_nodes > 0 ? std::min(total, jo.min_nodes * fewest) : total;
  o.heartbeat_host = HeartbeatHost(jo, a, hosts.size());
  o.state_dir = jo.dir + "/launch";
  o.group_readable = !jo.group.empty();
  o.launcher = "srun";
  o.srun = jo.srun;
  o.srun_args = jo.srun_args;
  // The batch job's cores per rank (srun does not inherit --cpus-per-task since Slurm 22.05).
  if (!a.cpus_per_task.empty() && !HasOption(jo.srun_args, "--cpus-per-task")) {
    o.srun_args.insert(o.srun_args.begin(), "--cpus-per-task=" + a.cpus_per_task);
  }
  o.slurm_job_id = a.job_id;
  o.wait_for_hosts = false;
  o.trainflow = SelfExecutable("trainflow");
  std::vector<std::string> train_args = train.args;
  if (train.metrics_addr_default) train_args.insert(train_args.end(), {"--metrics_addr", "127.0.0.1:0"});
  if (!train.metrics_token_file_set && train.metrics_enabled) {
    train_args.insert(train_args.end(), {"--metrics_token_file", jo.dir + "/metrics.token"});
  }
  o.train_args = train_args;
  o.global_rows = int64_t{train.batch_size} * train.grad_accum_steps * total;
  o.max_batch_size = train.batch_size;
  o.world_multiple = std::max(1, train.shard_group_size);
  o.has_checkpoints = !train.checkpoint_dir.empty();
  o.tokens_per_step = o.global_rows * train.seq_len;
  o.accounted_hosts = static_cast<int>(hosts.size());
  o.accounted_gpus = static_cast<int>(hosts.size()) * jo.gpus_per_node;
  o.requeues = a.requeues;
  o.metrics_addr = "127.0.0.1:0";
  o.metrics_token = metrics_token;
  o.endpoints_path = jo.dir + "/endpoints.json";
  return o;
}

StatusOr<int> RunInAllocation(const JobOptions& jo, const TrainJob& train, const Allocation& a,
                              const launch::LaunchOptions& supervisor) {
  const std::string& dir = jo.dir;
  const std::string& job_id = a.job_id;
  TF_ASSIGN_OR_RETURN(const std::vector<launch::HostEntry> hosts, AllocationHosts(jo, a));
  int total = 0;
  for (const auto& h : hosts) total += h.slots;
  Say(fmt::format("job {} run {} (requeue budget {}): {} node{} ({}), {} rank{}; state in {}", job_id, a.requeues + 1,
                  jo.requeue_budget, hosts.size(), hosts.size() == 1 ? "" : "s", a.nodelist, total,
                  total == 1 ? "" : "s", dir));

  // Per-job secrets and ports: the metrics token (owner-only), any free port for every endpoint.
  const std::string token_path = dir + "/metrics.token";
  std::string token;
  if (auto text = Env::Default()->ReadFileToString(token_path, 4096); text.ok()) {
    token = text->substr(0, text->find_first_of(" \t\r\n"));
  }
  if (token.size() < 32) {
    token = RandomHex(32);
    TF_RETURN_IF_ERROR(WriteJobFile(token_path, token + "\n", jo.group));
  }
  const launch::LaunchOptions o = JobLaunchOptions(jo, train, a, hosts, supervisor, token);
  if (!o.has_checkpoints) spdlog::warn("the job has no checkpoint_dir: a requeued or restarted run starts from step 0");

  RunRecord record;
  record.job_id = job_id;
  record.run = a.requeues + 1;
  record.nodes = a.nodelist;
  record.started = UnixSeconds();
  launch::SupervisorOutcome out;
  const int code = launch::RunSupervisor(o, &out);

  // What the job used, for teams on a budget: usage.json (totals and every run) and the log.
  const launch::ResourceUsage& u = out.usage;
  record.ended = UnixSeconds();
  record.outcome = out.reason;
  record.exit_code = code;
  record.final_step = out.final_step;
  if (auto r = RecordUsage(dir, jo.group, u, record); !r.ok()) spdlog::warn("{}", r.status().ToString());
  Say(fmt::format("usage so far: {:.4f} node-hours, {:.4f} GPU-hours, {} tokens trained, {} of checkpoints, {} "
                  "restart{}, {} requeue{} ({}/usage.json)",
                  u.node_seconds / 3600.0, u.gpu_seconds / 3600.0, u.tokens,
                  FormatBytes(static_cast<uint64_t>(u.checkpoint_bytes)), u.restarts, u.restarts == 1 ? "" : "s",
                  u.requeues, u.requeues == 1 ? "" : "s", dir));

  const bool budget_left = a.requeues < jo.requeue_budget;
  if (out.reason == "finished") return code;
  if (out.reason == "time_warning") {
    if (!budget_left) {
      CommentJob(job_id, fmt::format("stopped at a checkpoint before the time limit; requeue budget of {} spent",
                                     jo.requeue_budget));
      Say(fmt::format("requeue budget of {} spent: not requeued (sbatch {}/job.sbatch resumes it)", jo.requeue_budget,
                      dir));
      return kExitStopped;
    }
    Say(fmt::format("checkpoint written before the time limit (step {}): requeueing job {}", out.final_step, job_id));
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
        CommentJob(job_id, fmt::format("preempted; requeue budget of {} spent", jo.requeue_budget));
        Say(fmt::format("requeue budget of {} spent: not requeued (sbatch {}/job.sbatch resumes it)", jo.requeue_budget,
                        dir));
        return kExitStopped;
      }
      Say(fmt::format("preempted: requeueing job {}", job_id));
      if (Scontrol({"requeue", job_id}) == 0) return kExitOk;
    }
    return kExitStopped;
  }
  if (out.reason == "too_few_hosts" && !out.bad_hosts.empty()) return ResubmitWithout(jo, a, out, budget_left);
  if (out.reason == "budget" || out.reason == "bad_input" || out.reason == "error") {
    CommentJob(job_id, out.reason == "budget"      ? "restart budget spent (see the log)"
                       : out.reason == "bad_input" ? "configuration or input error (see the log)"
                                                   : "the job could not be launched (see the log)");
  }
  return code;
}

void CommentJob(const std::string& job_id, const std::string& text) {
  std::string t = "trainflow: " + text;
  if (t.size() > 250) t = t.substr(0, 247) + "...";
  Scontrol({"update", "JobId=" + job_id, "Comment=" + t});
}

}  // namespace tf::slurm
