#include "launch/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/env.h"
#include "base/json.h"
#include "base/subprocess.h"
#include "launch/heartbeat.h"
#include "launch/protocol.h"
#include "launch/slurm_util.h"
#include "launch/state_store.h"
#include "monitor/metrics.h"
#include "monitor/prometheus_util.h"
#include "monitor/server.h"

#include <prometheus/text_serializer.h>

namespace tf::launch {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
namespace msg = protocol::msg;
namespace field = protocol::field;

std::atomic<int> g_signals{0};
std::atomic<int> g_warnings{0};
extern "C" void OnSupervisorSignal(int) { g_signals.fetch_add(1); }
extern "C" void OnSupervisorWarning(int) { g_warnings.fetch_add(1); }

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
constexpr uint64_t kMaxHostfileBytes = uint64_t{64} << 20;

double Mono() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string IsoTime(double unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03d}Z", fmt::gmtime(t),
                     static_cast<int>((unix_s - std::floor(unix_s)) * 1000));
}

// Field 22 of /proc/PID/stat (start time in clock ticks): tells a process from a later one with its PID.
int64_t ProcStartTime(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::stoll(field);
  }
  return -1;
}

// The state letter of /proc/PID/stat in `stat_text` ('T' stopped, 'Z' zombie, ...); 0 when unreadable.
char StateLetter(const std::string& stat_text) {
  const size_t close = stat_text.rfind(')');
  return close != std::string::npos && close + 2 < stat_text.size() ? stat_text[close + 2] : 0;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool IsLocalHost(const std::string& host) {
  if (host == "localhost" || host.starts_with("127.")) return true;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return host == name;
}

std::string ExitDescription(int code) {
  switch (code) {
    case 0: return "done";
    case 1: return "internal error";
    case 2: return "bad configuration or input";
    case 3: return "peer or communication failure";
    case 4: return "I/O error";
    case 5: return "stopped";
    default: return code > 128 ? fmt::format("signal {} ({})", code - 128, ::strsignal(code - 128)) : "exit " + std::to_string(code);
  }
}

struct RankInfo {
  int conn = -1;
  std::string host;
  int64_t pid = 0, ppid = 0;
  double last_hb = 0;         // Mono() of the last message
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
  pid_t mpirun = -1;
  int64_t mpirun_start = -1;
  bool child = true;  // false: adopted from a previous supervisor (no waitpid)
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
  bool mpirun_exited = false;
  int mpirun_status = 0;
  std::string slurm_step;      // srun: the job step the ranks run in (from their hello)
  int64_t tokens_step = -1;    // rank 0's step the token count has reached
};

// The supervisor's /metrics and /api/run (its state.json), from the snapshot Save() leaves.
class LaunchMetrics : public monitor::MetricsSource {
 public:
  void Update(json snapshot) {
    std::lock_guard<std::mutex> lock(mu_);
    snap_ = std::move(snapshot);
  }
  std::string RunJson() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return snap_.dump();
  }
  std::string Exposition() const override {
    using prometheus::MetricType;
    using monitor::AddSample;
    using monitor::Family;
    using monitor::Single;
    json s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = snap_;
    }
    // Numbers only (a null would throw): 0 for anything else.
    auto num = [](const json& j, const char* key) {
      auto it = j.find(key);
      return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
    };
    std::vector<prometheus::MetricFamily> out;
    out.push_back(Single("trainflow_launch_restarts_total", "Restarts of the job after a failure.",
                         MetricType::Counter, num(s, "restarts")));
    out.push_back(Single("trainflow_launch_late_total",
                         "Ranks found late (silent, alive, reachable; not failures) by this supervisor.",
                         MetricType::Counter, num(s, "late")));
    auto by = [&](const char* name, const char* help, const char* label, const char* key) {
      prometheus::MetricFamily f = Family(name, help, MetricType::Counter);
      const json by_key = s.value(key, json::object());
      for (const auto& [k, v] : by_key.items()) AddSample(&f, v.is_number() ? v.get<double>() : 0.0, {{label, k}});
      if (!f.metric.empty()) out.push_back(std::move(f));
    };
    by("trainflow_launch_failures_total", "Failures detected, by cause (dead, hung, unresponsive, lost_host, failed, "
       "launcher, startup).", "cause", "failures_by_cause");
    by("trainflow_launch_host_failures_total", "Failures attributed to each host.", "host", "failures_by_host");
    out.push_back(Single("trainflow_launch_downtime_seconds_total",
                         "Seconds from each failure's detection to the first training step after it.",
                         MetricType::Counter, num(s, "downtime_s")));
    out.push_back(Single("trainflow_launch_productive_seconds_total",
                         "Step time of the steps the final model keeps (lost work excluded).", MetricType::Counter,
                         num(s, "productive_s")));
    out.push_back(Single("trainflow_launch_wall_seconds", "Wall time of the supervised run so far.", MetricType::Gauge,
                         num(s, "wall_s")));
    out.push_back(Single("trainflow_launch_effective_training_ratio", "Productive step time / wall time.",
                         MetricType::Gauge, num(s, "effective_ratio")));
    out.push_back(Single("trainflow_launch_generation", "Launches of the job so far.", MetricType::Gauge,
                         num(s, "generation")));
    const json job = s.contains("job") && s["job"].is_object() ? s["job"] : json::object();
    out.push_back(Single("trainflow_launch_world_size", "Ranks of the running job (0: none running).",
                         MetricType::Gauge, job.is_object() ? num(job, "world") : 0.0));
    prometheus::MetricFamily hosts = Family("trainflow_launch_host_state", "1 for each host's state.", MetricType::Gauge);
    for (const json& h : s.value("host_states", json::array())) {
      AddSample(&hosts, 1.0, {{"host", h.value("name", "")}, {"state", h.value("state", "")}});
    }
    if (!hosts.metric.empty()) out.push_back(std::move(hosts));
    const json u = s.value("usage", json::object());
    out.push_back(Single("trainflow_job_node_hours_total", "Host-hours held by the job (hosts x wall time, every run).",
                         MetricType::Counter, num(u, "node_seconds") / 3600.0));
    out.push_back(Single("trainflow_job_gpu_hours_total", "GPU-hours held by the job (GPUs x wall time, every run).",
                         MetricType::Counter, num(u, "gpu_seconds") / 3600.0));
    out.push_back(Single("trainflow_job_tokens_total", "Tokens trained by the job (all ranks; lost work included).",
                         MetricType::Counter, num(u, "tokens")));
    out.push_back(Single("trainflow_job_checkpoint_bytes_total", "Bytes the job's checkpoints stored.",
                         MetricType::Counter, num(u, "checkpoint_bytes")));
    out.push_back(Single("trainflow_job_requeues_total", "Slurm requeues and resubmissions of the job.",
                         MetricType::Counter, num(u, "requeues")));
    return prometheus::TextSerializer().Serialize(out);
  }

 private:
  mutable std::mutex mu_;
  json snap_ = json::object();  // guarded by mu_
};

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions o, SupervisorOutcome* outcome)
      : o_(std::move(o)),
        store_(Env::Default(), o_.state_dir, o_.group_readable),
        book_(o_.quarantine),
        backoff_(o_.backoff),
        outcome_(outcome) {}
  ~Supervisor() {
    if (health_thread_.joinable()) health_thread_.join();
  }
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
  void HandleEvents(const std::vector<monitor::HeartbeatServer::Event>& events);
  void OnMessage(int rank, const json& m);
  void AccountRank(int rank, int64_t step, int64_t checkpoint_bytes);
  bool MpirunAlive();
  void TailLog();
  std::optional<json> Detect();  // a failure to recover from, or nothing
  std::string Probe(const RankInfo& r, std::string* detail);
  // For a silent rank alive on another host: "cut_off" when that host cannot open a connection to the
  // heartbeat address (a partition), else "silent" (late).
  std::string ProbeReach(const RankInfo& r, std::string* detail);
  // Where the ranks reach the heartbeat server: HOST:PORT ([HOST]:PORT for IPv6).
  std::string HeartbeatAddress() const;
  void KillRank(const RankInfo& r);
  void Recover(json incident, const std::set<int>& culprits);
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
  // The command that runs `script` (sh) on `host`: the remote shell, or an srun helper step.
  std::vector<std::string> RemoteArgv(const std::string& host, const std::string& script) const;
  bool UsesSrun() const { return o_.launcher == "srun"; }
  std::vector<std::string> SrunLaunchArgv(const Job& job);
  ResourceUsage Usage() const;
  void WriteEndpoints();
  bool RereadHostfile();
  int Finish(int code, const std::string& why, const char* reason);
  void PollFor(double seconds, const std::function<bool()>& done);

  LaunchOptions o_;
  StateStore store_;
  HostBook book_;
  RestartBackoff backoff_;
  std::string secret_;
  std::unique_ptr<monitor::HeartbeatServer> server_;
  LaunchMetrics metrics_;
  std::unique_ptr<monitor::MetricsServer> metrics_server_;  // after metrics_: stopped first
  std::optional<Job> job_;
  std::map<int, int> conn_rank_;  // connection -> rank of the current job
  int64_t generation_ = 0;
  int restarts_ = 0;
  double next_launch_ = 0;        // Mono()
  double last_health_ = 0;
  double last_save_ = 0;
  std::thread health_thread_;
  std::atomic<bool> health_running_{false};
  std::mutex health_mu_;
  std::vector<std::pair<std::string, int>> health_results_;  // guarded by health_mu_
  double last_hostfile_check_ = 0;
  fs::file_time_type hostfile_mtime_{};
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
  double last_watch_ = 0;         // Mono() of the watch loop's last poll (0: no job)
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

double DefaultTimeoutFor(Phase p) {
  switch (p) {
    case Phase::kStartup: return 300;
    case Phase::kCheckpoint: return 600;
    case Phase::kEval: return 600;
    case Phase::kSample: return 300;
    case Phase::kFinishing: return 600;
    case Phase::kRescue: return 120;
    default: return 120;  // data, compute, communication, optimizer
  }
}

}  // namespace

double DefaultHangTimeout(Phase phase) { return DefaultTimeoutFor(phase); }

namespace {

double Supervisor::HangTimeout(const std::string& phase) const {
  Phase p = Phase::kStartup;
  if (!ParsePhase(phase, &p)) return DefaultTimeoutFor(Phase::kCompute);
  auto it = o_.hang_timeouts.find(p);
  return it != o_.hang_timeouts.end() ? it->second : DefaultTimeoutFor(p);
}

void Supervisor::Say(const std::string& line) {
  fmt::print("[launch] {}\n", line);
  std::fflush(stdout);
}

Status Supervisor::Open() {
  TF_RETURN_IF_ERROR(store_.Lock(::getpid()));
  TF_ASSIGN_OR_RETURN(secret_, store_.Secret(monitor::RandomHex(32)));
  book_.SetHosts(o_.hosts);
  if (!o_.hostfile.empty()) {
    std::error_code ec;
    hostfile_mtime_ = fs::last_write_time(o_.hostfile, ec);
  }
  // A previous supervisor's state: hosts, restarts, accounting, and maybe a job still running.
  TF_ASSIGN_OR_RETURN(std::optional<json> loaded, store_.LoadState());
  if (loaded) {
    json& st = *loaded;
    if (st.contains("hosts")) {
      TF_ASSIGN_OR_RETURN(book_, HostBook::FromJson(st["hosts"], o_.quarantine));
      book_.SetHosts(o_.hosts);
    }
    if (st.contains("backoff")) {
      TF_ASSIGN_OR_RETURN(backoff_, RestartBackoff::FromJson(st["backoff"], o_.backoff));
    }
    generation_ = st.value("generation", int64_t{0});
    restarts_ = st.value("restarts", 0);
    // A supervisor that ended by itself (finished, stopped, gave up) leaves a rerun a budget of its
    // own; one killed mid-run (then adopted or resumed here) leaves the count running.
    if (!st.value("ended", std::string()).empty()) {
      budget_base_ = restarts_;
      if (restarts_ > 0) {
        Say(fmt::format("earlier runs of this job restarted it {} time(s) ({}/state.json; the last ended: {}); this "
                        "run has --max-restarts {} of its own",
                        restarts_, o_.state_dir, st.value("ended", std::string()), o_.max_restarts));
      }
    } else if (restarts_ > 0) {
      Say(fmt::format("continuing the restart count of a supervisor that did not end: {} restart(s) so far of at most "
                      "{}",
                      restarts_, o_.max_restarts));
    }
    productive_s_ = st.value("productive_accounted_s", st.value("productive_s", 0.0));
    downtime_s_ = st.value("downtime_s", 0.0);
    prior_wall_s_ = st.value("wall_s", 0.0);
    if (st.contains("failures_by_cause")) failures_by_cause_ = st["failures_by_cause"].get<std::map<std::string, int64_t>>();
    if (st.contains("failures_by_host")) failures_by_host_ = st["failures_by_host"].get<std::map<std::string, int64_t>>();
    // A finished job launched again (more steps, say) simply resumes from its final checkpoint.
    if (st.contains("usage") && st["usage"].is_object()) {
      const json& u = st["usage"];
      usage_prior_.node_seconds = u.value("node_seconds", 0.0);
      usage_prior_.gpu_seconds = u.value("gpu_seconds", 0.0);
      usage_prior_.tokens = u.value("tokens", int64_t{0});
      usage_prior_.checkpoint_bytes = u.value("checkpoint_bytes", int64_t{0});
    }
    if (st.contains("host_causes") && st["host_causes"].is_object()) {
      for (const auto& [h, why] : st["host_causes"].items()) {
        if (why.is_string()) host_causes_[h] = why.get<std::string>();
      }
    }
    // A job of an earlier Slurm run ended with its allocation; one of mpirun's may still run.
    if (st.value("status", "") != "done" && st.contains("job") && st["job"].is_object() && !UsesSrun()) {
      Adopt(st["job"]);
    }
  }
  return Status::OK();
}

void Supervisor::Save() {
  json st;
  st["version"] = 1;
  st["pid"] = ::getpid();
  st["updated"] = IsoTime(WallNow());
  st["generation"] = generation_;
  st["restarts"] = restarts_;
  st["max_restarts"] = o_.max_restarts;
  st["hosts"] = book_.ToJson();
  st["backoff"] = backoff_.ToJson();
  const double wall = prior_wall_s_ + (WallNow() - run_started_wall_);
  st["wall_s"] = wall;
  const double productive = productive_s_ + RunningProductive();
  st["productive_s"] = productive;
  st["downtime_s"] = downtime_s_;
  st["effective_ratio"] = wall > 0 ? productive / wall : 0.0;
  st["late"] = late_episodes_;
  st["productive_accounted_s"] = productive_s_;
  st["failures_by_cause"] = failures_by_cause_;
  st["failures_by_host"] = failures_by_host_;
  st["final_step"] = final_step_;
  const ResourceUsage u = Usage();
  st["usage"] = {{"node_seconds", u.node_seconds}, {"gpu_seconds", u.gpu_seconds},     {"tokens", u.tokens},
                 {"checkpoint_bytes", u.checkpoint_bytes}, {"restarts", u.restarts}, {"requeues", u.requeues}};
  st["host_causes"] = host_causes_;
  if (job_) {
    json ranks = json::array();
    for (const auto& [r, info] : job_->ranks) {
      ranks.push_back({{"rank", r}, {"host", info.host}, {"pid", info.pid}, {"ppid", info.ppid}, {"step", info.step},
                       {"phase", info.phase}, {"checkpoint", info.checkpoint}});
    }
    st["job"] = {{"generation", job_->generation},
                 {"mpirun_pid", job_->mpirun},
                 {"mpirun_start", job_->mpirun_start},
                 {"port", server_ ? server_->port() : 0},
                 {"world", job_->plan.world},
                 {"batch_size", job_->plan.batch_size},
                 {"grad_accum_steps", job_->plan.grad_accum_steps},
                 {"hosts", FormatHostfile(job_->hosts)},
                 {"log", job_->log_path},
                 {"started", IsoTime(job_->started_wall)},
                 {"start_step", job_->start_step},
                 {"ranks", ranks}};
  }
  st["status"] = job_ ? "running" : (final_step_ >= 0 ? "done" : "waiting");
  st["ended"] = ended_;
  st["budget_base"] = budget_base_;
  json states = json::array();
  for (const HostEntry& h : o_.hosts) states.push_back({{"name", h.name}, {"state", HostStateName(book_.state(h.name))}});
  st["host_states"] = states;
  metrics_.Update(st);
  // Durable and atomic: a crash or a full disk leaves the previous state for the next supervisor.
  if (Status s = store_.SaveState(st); !s.ok()) {
    if (!save_failed_) spdlog::error("cannot save the supervisor's state: {}", s.ToString());
    save_failed_ = true;
  } else {
    save_failed_ = false;
  }
}

void Supervisor::Incident(json record) {
  record["time"] = IsoTime(WallNow());
  if (Status s = store_.AppendIncident(record); !s.ok()) spdlog::error("cannot record the incident ({}): {}", record.dump(), s.ToString());
}

// ---- launching ---------------------------------------------------------------------------------

Status Supervisor::Launch() {
  const std::vector<HostEntry> usable = book_.Usable();
  const int slots = TotalSlots(usable);
  const int max_ranks = o_.max_ranks > 0 ? o_.max_ranks : std::max(slots, 1);
  if (slots < o_.min_ranks) {
    return Status::Unavailable("{} healthy slot(s) left, fewer than the {} ranks the job needs at least", slots,
                               o_.min_ranks);
  }
  TF_ASSIGN_OR_RETURN(BatchPlan plan, PlanBatch(o_.global_rows, o_.max_batch_size, o_.min_ranks, max_ranks, slots));
  if (!plan.exact) {
    return Status::Unavailable("no world size in [{}, {}] on {} healthy slot(s) keeps the global batch of {} rows, "
                               "and an exact resume needs it ({})",
                               o_.min_ranks, max_ranks, slots, o_.global_rows, plan.note);
  }
  Job job;
  job.generation = ++generation_;
  job.plan = plan;
  job.hosts = AssignRanks(usable, plan.world);
  job.log_path = fmt::format("{}/gen-{:04d}.log", o_.state_dir, job.generation);
  const std::string address = HeartbeatAddress();
  std::vector<std::string> train = o_.train_args;
  train.insert(train.end(), {"--batch_size", std::to_string(plan.batch_size), "--grad_accum_steps",
                             std::to_string(plan.grad_accum_steps)});
  std::vector<std::string> argv;
  std::string srun_hostfile;
  if (UsesSrun()) {
    // One line per rank, in rank order: srun --distribution=arbitrary puts rank i on line i's node.
    srun_hostfile = fmt::format("{}/gen-{:04d}.hosts", o_.state_dir, job.generation);
    std::string lines;
    for (const HostEntry& h : job.hosts) {
      for (int i = 0; i < h.slots; ++i) lines += h.name + "\n";
    }
    TF_RETURN_IF_ERROR(Env::Default()->WriteFileAtomically(srun_hostfile, lines));
    argv = {o_.srun, "--mpi=pmix", fmt::format("--ntasks={}", plan.world), fmt::format("--nodes={}", job.hosts.size()),
            "--distribution=arbitrary", "--kill-on-bad-exit=0", fmt::format("--job-name=trainflow-gen{}", job.generation)};
    argv.insert(argv.end(), o_.srun_args.begin(), o_.srun_args.end());
    argv.push_back(o_.trainflow);
    argv.insert(argv.end(), train.begin(), train.end());
  } else {
  argv = {o_.mpirun};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  // mpirun leaves the survivors of a failed rank alone (orte_enable_recovery): the supervisor
  // decides, after their rescue. Shared memory without single-copy (CMA): a peer killed
  // mid-transfer then stalls a survivor's collective (which the abort ends) instead of killing it.
  argv.insert(argv.end(), {"--oversubscribe", "--mca", "orte_enable_recovery", "1", "--mca",
                           "btl_vader_single_copy_mechanism", "none"});
  if (!o_.rsh_agent.empty()) {
    argv.insert(argv.end(), {"--mca", "plm_rsh_agent", o_.rsh_agent});
  }
  argv.insert(argv.end(), o_.mpirun_args.begin(), o_.mpirun_args.end());
  for (const char* v : {"TRAINFLOW_SUPERVISOR", "TRAINFLOW_SUPERVISOR_SECRET", "TRAINFLOW_LAUNCH_GENERATION",
                        "TRAINFLOW_HEARTBEAT_INTERVAL"}) {
    argv.insert(argv.end(), {"-x", v});
  }
  bool first = true;
  for (const HostEntry& h : job.hosts) {
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
      --generation_;
      return Status::InvalidArgument("the {} command line for {} host(s) would be {} bytes with the environment, over "
                                     "this system's limit of {} (ARG_MAX): use fewer hosts (--max-ranks) or more "
                                     "slots per host",
                                     argv[0], job.hosts.size(), bytes, arg_max);
    }
  }
  StatusOr<int> opened = OpenRegularForWrite(job.log_path, O_TRUNC, o_.group_readable ? 0640 : 0600);
  if (!opened.ok()) {
    --generation_;
    return opened.status();
  }
  const int log_fd = *opened;
  {
    std::string cmdline;
    for (const std::string& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
    const std::string head = "# " + cmdline + "\n";
    (void)!::write(log_fd, head.data(), head.size());
    job.log_offset = static_cast<int64_t>(head.size());
  }
  ::setenv("TRAINFLOW_SUPERVISOR", address.c_str(), 1);
  ::setenv("TRAINFLOW_SUPERVISOR_SECRET", secret_.c_str(), 1);
  ::setenv("TRAINFLOW_LAUNCH_GENERATION", std::to_string(job.generation).c_str(), 1);
  ::setenv("TRAINFLOW_HEARTBEAT_INTERVAL", fmt::format("{}", o_.heartbeat_interval_s).c_str(), 1);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return Status::IOError("fork: {}", std::strerror(errno));
  }
  if (pid == 0) {
    // Its own session: a supervisor killed with -9 leaves the job running for the next one to adopt.
    ::setsid();
    if (!srun_hostfile.empty()) {
      ::setenv("SLURM_HOSTFILE", srun_hostfile.c_str(), 1);
      // The batch step's task layout is not this step's (the hosts file is).
      for (const char* v : {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_DISTRIBUTION", "SLURM_NTASKS",
                            "SLURM_NPROCS", "SLURM_NNODES"}) {
        ::unsetenv(v);
      }
    }
    ExecWithOutput(argv, log_fd);
  }
  ::close(log_fd);
  ::unsetenv("TRAINFLOW_SUPERVISOR_SECRET");
  job.mpirun = pid;
  job.mpirun_start = ProcStartTime(pid);
  job.started_mono = Mono();
  job.started_wall = WallNow();
  for (int r = 0; r < plan.world; ++r) job.ranks[r].progress_at = job.started_mono;
  std::string where;
  for (const HostEntry& h : job.hosts) where += fmt::format("{}{} x{}", where.empty() ? "" : ", ", h.name, h.slots);
  Say(fmt::format("generation {}: {} rank{} on {} ({}); {} pid {}, log {}", job.generation, plan.world,
                  plan.world == 1 ? "" : "s", where, plan.note, UsesSrun() ? "srun" : "mpirun", pid, job.log_path));
  conn_rank_.clear();
  job_ = std::move(job);
  backoff_.Started(Mono());
  Save();
  return Status::OK();
}

void Supervisor::Adopt(const json& j) {
  const pid_t pid = j.value("mpirun_pid", -1);
  const int64_t start = j.value("mpirun_start", int64_t{-1});
  if (pid <= 0 || ::kill(pid, 0) != 0 || ProcStartTime(pid) != start) {
    // Gone: its ranks may linger (a supervisor killed mid-recovery); end them, then resume from the checkpoint.
    if (j.contains("ranks")) {
      for (const json& r : j["ranks"]) {
        RankInfo info;
        info.host = r.value("host", "");
        info.pid = r.value("pid", int64_t{0});
        info.ppid = r.value("ppid", int64_t{0});
        if (info.pid > 0) KillRank(info);
      }
    }
    Say(fmt::format("the job of generation {} is no longer running; starting again from its checkpoint",
                    j.value("generation", int64_t{0})));
    return;
  }
  Job job;
  job.generation = j.value("generation", int64_t{0});
  generation_ = std::max(generation_, job.generation);
  job.mpirun = pid;
  job.mpirun_start = start;
  job.child = false;
  job.plan.world = j.value("world", 0);
  job.plan.batch_size = j.value("batch_size", 0);
  job.plan.grad_accum_steps = j.value("grad_accum_steps", 0);
  job.plan.global_rows = o_.global_rows;
  job.plan.exact = true;
  if (auto h = ParseHostfile(j.value("hosts", ""), "the adopted job's hosts"); h.ok()) job.hosts = *h;
  job.log_path = j.value("log", "");
  std::error_code ec;
  job.log_offset = static_cast<int64_t>(fs::file_size(job.log_path, ec));
  job.started_mono = Mono();
  job.started_wall = WallNow();
  for (int r = 0; r < job.plan.world; ++r) job.ranks[r].progress_at = job.started_mono;
  o_.heartbeat_port = j.value("port", 0);
  Say(fmt::format("adopting the running job of generation {} (mpirun pid {}); its ranks reconnect", job.generation,
                  pid));
  Incident({{"kind", "supervisor_restart"}, {"generation", job.generation}, {"action", "adopted the running job"}});
  job_ = std::move(job);
}

// ---- watching ----------------------------------------------------------------------------------

void Supervisor::HandleEvents(const std::vector<monitor::HeartbeatServer::Event>& events) {
  using Event = monitor::HeartbeatServer::Event;
  for (const Event& e : events) {
    if (e.kind == Event::kRejected) {
      // A crowd of strangers must not flood the log: the first few, then a count every 10 s.
      ++rejected_;
      const double now = Mono();
      if (rejected_logged_ < 5) {
        ++rejected_logged_;
        spdlog::warn("heartbeat connection from {} rejected: {}", e.peer, e.error);
      } else if (now - rejected_summary_at_ > 10) {
        spdlog::warn("{} heartbeat connections rejected so far (the last from {}: {})", rejected_, e.peer, e.error);
        rejected_summary_at_ = now;
      }
      continue;
    }
    if (e.kind == Event::kHello) {
      const int rank = e.body.value(field::kRank, -1);
      const int64_t gen = e.body.value(field::kGeneration, int64_t{-1});
      if (!job_ || gen != job_->generation || !job_->ranks.count(rank)) {
        // A process of an earlier launch (an orphan after a partition, say): it must go.
        server_->Send(e.conn, {{field::kType, msg::kExit}, {field::kCode, 3}, {field::kReason, fmt::format("generation {} is over", gen)}});
        server_->Close(e.conn);
        continue;
      }
      RankInfo& r = job_->ranks[rank];
      if (r.conn >= 0 && r.conn != e.conn) server_->Close(r.conn);
      r.conn = e.conn;
      r.host = e.body.value(field::kHost, "");
      r.pid = e.body.value(field::kPid, int64_t{0});
      r.ppid = e.body.value(field::kPpid, int64_t{0});
      if (const std::string step = e.body.value(field::kSlurmStep, ""); !step.empty()) job_->slurm_step = step;
      r.last_hb = Mono();
      r.late_since = 0;
      r.closed = false;
      conn_rank_[e.conn] = rank;
      continue;
    }
    auto it = conn_rank_.find(e.conn);
    if (it == conn_rank_.end() || !job_) continue;
    const int rank = it->second;
    if (e.kind == Event::kClosed) {
      conn_rank_.erase(it);
      RankInfo& r = job_->ranks[rank];
      if (r.conn == e.conn) {
        r.conn = -1;
        r.closed = true;
      }
      continue;
    }
    OnMessage(rank, e.body);
  }
}

void Supervisor::AccountRank(int rank, int64_t step, int64_t checkpoint_bytes) {
  RankInfo& r = job_->ranks[rank];
  if (checkpoint_bytes > r.checkpoint_bytes) {
    checkpoint_bytes_ += checkpoint_bytes - r.checkpoint_bytes;
    r.checkpoint_bytes = checkpoint_bytes;
  }
  if (rank == 0 && job_->start_step >= 0 && o_.tokens_per_step > 0) {
    const int64_t from = std::max(job_->tokens_step, job_->start_step);
    if (step > from) {
      tokens_ += (step - from) * o_.tokens_per_step;
      job_->tokens_step = step;
    }
  }
}

void Supervisor::WriteEndpoints() {
  if (o_.endpoints_path.empty()) return;
  json e = {{"supervisor", metrics_server_ ? metrics_server_->url() : ""}, {"token_required", !o_.metrics_token.empty()}};
  json ranks = json::object();
  if (job_) {
    for (const auto& [rank, r] : job_->ranks) {
      if (!r.metrics_url.empty()) ranks[std::to_string(rank)] = {{"host", r.host}, {"url", r.metrics_url}};
    }
  }
  e["ranks"] = ranks;
  const std::string text = e.dump(2) + "\n";
  if (text == endpoints_written_) return;
  const std::string tmp = o_.endpoints_path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, o_.group_readable ? 0640 : 0600);
  if (fd < 0) return;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  std::error_code ec;
  if (ok) fs::rename(tmp, o_.endpoints_path, ec);
  endpoints_written_ = text;
}

ResourceUsage Supervisor::Usage() const {
  ResourceUsage u = usage_prior_;
  const double run = WallNow() - run_started_wall_;
  const int hosts = o_.accounted_hosts > 0 ? o_.accounted_hosts : static_cast<int>(o_.hosts.size());
  u.node_seconds += hosts * run;
  u.gpu_seconds += o_.accounted_gpus * run;
  u.tokens += tokens_;
  u.checkpoint_bytes += checkpoint_bytes_;
  u.restarts = restarts_;
  u.requeues = o_.requeues;
  return u;
}

void Supervisor::OnMessage(int rank, const json& m) {
  RankInfo& r = job_->ranks[rank];
  if (r.late_since > 0) {
    spdlog::info("rank {} on {} is heartbeating again after {:.1f} s of silence (late, not failed)", rank, r.host,
                 Mono() - r.late_since);
    r.late_since = 0;
  }
  r.last_hb = Mono();
  const std::string type = m.value(field::kType, "");
  if (type == msg::kHeartbeat) {
    const std::string phase = m.value(field::kPhase, "");
    const int64_t step = m.value(field::kStep, int64_t{0});
    const uint64_t progress = m.value(field::kProgress, uint64_t{0});
    if (phase != r.phase || step != r.step || progress != r.progress) r.progress_at = Mono();
    r.phase = phase;
    r.step = step;
    r.progress = progress;
    r.checkpoint = m.value(field::kCheckpoint, int64_t{-1});
    r.step_time = m.value(field::kStepTime, 0.0);
    AccountRank(rank, step, m.value(field::kCheckpointBytes, int64_t{-1}));
    if (const std::string url = m.value(field::kMetricsUrl, ""); !url.empty() && url != r.metrics_url) {
      r.metrics_url = url;
      WriteEndpoints();
    }
    if (rank == 0) {
      if (job_->start_step < 0) job_->start_step = m.value(field::kStartStep, int64_t{-1});
      if (job_->start_step >= 0 && step > job_->start_step && r.step_time > 0) {
        if (job_->first_step < 0) {
          job_->first_step = step;
          job_->first_step_time = r.step_time;
          if (failure_at_wall_ > 0 && job_->generation > failed_generation_) {
            // When the generation's first step completed (the heartbeat may come a few steps later).
            const double first = m.value(field::kFirstStepTime, 0.0) > 0 ? m.value(field::kFirstStepTime, 0.0) : r.step_time;
            const double down = first - failure_at_wall_;
            downtime_s_ += std::max(0.0, down);
            Say(fmt::format("training again: step {} done {:.2f} s after the failure was detected",
                            m.value(field::kStartStep, step - 1) + 1, down));
            Incident({{"kind", "recovered"}, {"generation", job_->generation}, {"step", step},
                      {"failure_to_step_s", down}, {"first_step_time", first}, {"detected_at", failure_at_wall_}});
            failure_at_wall_ = 0;
          }
        }
        job_->last_step = step;
        job_->last_step_time = r.step_time;
      }
    }
    return;
  }
  if (type == msg::kFailed) {
    r.failed = true;
    r.failed_at = Mono();
    r.rescuable = m.value(field::kRescuable, false);
    r.failed_step = m.value(field::kStep, int64_t{-1});
    r.exit_code = m.value(field::kExitCode, 1);
    r.error = m.value(field::kError, "");
    return;
  }
  if (type == msg::kExit) {
    r.exited = true;
    r.exit_code = m.value(field::kExitCode, 0);
    AccountRank(rank, m.value(field::kStep, int64_t{-1}), m.value(field::kCheckpointBytes, int64_t{-1}));
    if (rank == 0) final_step_ = m.value(field::kStep, int64_t{-1});
    return;
  }
}

std::vector<std::string> Supervisor::RemoteArgv(const std::string& host, const std::string& script) const {
  if (UsesSrun()) {
    // A helper step beside the job's (--overlap: it needs none of the step's resources).
    return {o_.srun, "--overlap", "--jobid=" + o_.slurm_job_id, "--nodes=1", "--ntasks=1", "--nodelist=" + host,
            "--quiet", "--mpi=none", "--job-name=trainflow-helper", "/bin/sh", "-c", script};
  }
  std::vector<std::string> argv;
  std::istringstream words(o_.rsh_agent.empty() ? std::string("ssh") : o_.rsh_agent);
  for (std::string w; words >> w;) argv.push_back(w);
  argv.push_back(host);
  argv.push_back(script);
  return argv;
}

bool Supervisor::MpirunAlive() {
  if (job_->mpirun_exited) return false;
  if (job_->child) {
    int status = 0;
    if (::waitpid(job_->mpirun, &status, WNOHANG) == job_->mpirun) {
      job_->mpirun_exited = true;
      job_->mpirun_status = status;
      return false;
    }
    return true;
  }
  if (::kill(job_->mpirun, 0) == 0 && ProcStartTime(job_->mpirun) == job_->mpirun_start) return true;
  job_->mpirun_exited = true;
  return false;
}

void Supervisor::TailLog() {
  if (!job_ || job_->log_path.empty()) return;
  std::ifstream f(job_->log_path, std::ios::binary);
  if (!f) return;
  f.seekg(job_->log_offset);
  std::string chunk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t nl = chunk.rfind('\n');
  if (nl == std::string::npos) return;
  std::fwrite(chunk.data(), 1, nl + 1, stdout);
  std::fflush(stdout);
  job_->log_offset += static_cast<int64_t>(nl + 1);
}

std::string Supervisor::Probe(const RankInfo& r, std::string* detail) {
  std::string stat;
  if (IsLocalHost(r.host)) {
    std::ifstream f(fmt::format("/proc/{}/stat", r.pid));
    if (!f) return "gone";
    stat.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  } else {
    const int rc = RunCommand(RemoteArgv(r.host, fmt::format("cat /proc/{}/stat", r.pid)), UsesSrun() ? 5.0 : 3.0, &stat);
    if (rc == -1 || rc == 255) {
      *detail = fmt::format("host {} did not answer the remote shell within {} s", r.host, UsesSrun() ? 5 : 3);
      return "unreachable";
    }
    if (rc != 0) return "gone";
  }
  const char state = StateLetter(stat);
  if (state == 'T' || state == 't') {
    *detail = "the process is stopped (SIGSTOP or a debugger)";
    return "stopped";
  }
  if (state == 'Z' || state == 0) return "gone";
  *detail = fmt::format("the process is alive (state {})", state);
  return "silent";
}

std::string Supervisor::HeartbeatAddress() const {
  const bool v6 = o_.heartbeat_host.find(':') != std::string::npos;
  return fmt::format("{}:{}", v6 ? "[" + o_.heartbeat_host + "]" : o_.heartbeat_host, server_ ? server_->port() : 0);
}

std::string Supervisor::ProbeReach(const RankInfo& r, std::string* detail) {
  const std::string address = HeartbeatAddress();
  std::string out;
  const int rc = RunCommand(RemoteArgv(r.host, fmt::format("{} health --reach {} --timeout 2", slurm::ShellQuote(o_.trainflow),
                                                            slurm::ShellQuote(address))),
                            UsesSrun() ? 8.0 : 6.0, &out);
  if (rc == kExitRetryable) {
    *detail += fmt::format("; its host cannot connect to the supervisor at {}: a network partition", address);
    return "cut_off";
  }
  if (rc != 0) {
    *detail += fmt::format("; could not check that its host reaches the supervisor (exit {})", rc);
  } else {
    *detail += "; its host reaches the supervisor";
  }
  return "silent";
}

void Supervisor::KillRank(const RankInfo& r) {
  if (r.pid <= 0) return;
  if (IsLocalHost(r.host)) {
    std::ifstream f(fmt::format("/proc/{}/cmdline", r.pid));
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find("trainflow") != std::string::npos) ::kill(static_cast<pid_t>(r.pid), SIGKILL);
    return;
  }
  // The rank, and the daemon that started it (Open MPI's orted, orphaned after a partition).
  const std::string script = fmt::format(
      "for p in {} {}; do c=$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null); case \"$c\" in *trainflow*|*orted*) "
      "kill -9 $p;; esac; done; true",
      r.pid, r.ppid);
  std::string out;
  if (RunCommand(RemoteArgv(r.host, script), 5.0, &out) != 0) {
    spdlog::warn("could not end rank pid {} on {}: {}", r.pid, r.host, out);
  }
}

std::optional<json> Supervisor::Detect() {
  Job& job = *job_;
  const double now = Mono();
  // A rank that failed on bad input: the job stops.
  for (auto& [rank, r] : job.ranks) {
    if (r.failed && r.exit_code == kExitBadInput) {
      return json{{"kind", "bad_input"}, {"rank", rank}, {"host", r.host}, {"step", r.step}, {"phase", r.phase},
                  {"exit_code", r.exit_code}, {"detail", r.error}};
    }
  }
  // Dead: its connection closed without a goodbye.
  for (auto& [rank, r] : job.ranks) {
    if (r.closed && !r.exited) {
      return json{{"kind", "dead"}, {"rank", rank}, {"host", r.host}, {"step", r.step}, {"phase", r.phase},
                  {"detail", "the process exited or was killed (its heartbeat connection closed)"},
                  {"detected_after_s", now - r.last_hb}};
    }
  }
  if (!job.all_connected) {
    bool all = true;
    for (auto& [rank, r] : job.ranks) all = all && r.conn >= 0;
    if (all) job.all_connected = true;
    if (!all && now - job.started_mono > o_.startup_timeout_s) {
      std::string missing;
      for (auto& [rank, r] : job.ranks) {
        if (r.conn < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
      }
      return json{{"kind", "startup"}, {"rank", -1}, {"detail", fmt::format("rank(s) {} did not start within {:.0f} s",
                                                                            missing, o_.startup_timeout_s)}};
    }
  }
  // Silent for two intervals: the probe tells stopped, gone, unreachable and cut-off ranks (failures
  // at once) from late ones (alive, reachable: a loaded machine, a paused VM, a reclaim stall), which
  // get late_timeout_s and never count against their host.
  for (auto& [rank, r] : job.ranks) {
    if (r.conn < 0 || r.exited) continue;
    const double silent = now - r.last_hb;
    if (silent <= 2 * o_.heartbeat_interval_s) continue;
    const bool late = r.late_since > 0;
    // While late, probe again every interval (a remote probe costs a remote shell: every 5 s).
    const double reprobe = IsLocalHost(r.host) ? o_.heartbeat_interval_s : std::max(5.0, o_.heartbeat_interval_s);
    if (late && now - r.late_probe_at < reprobe && silent <= o_.late_timeout_s) continue;
    std::string detail;
    std::string state = Probe(r, &detail);
    if (state == "silent" && !IsLocalHost(r.host)) state = ProbeReach(r, &detail);
    r.late_probe_at = Mono();
    if (state == "silent") {
      if (silent > o_.late_timeout_s) {
        return json{{"kind", "unresponsive"}, {"rank", rank}, {"host", r.host}, {"step", r.step}, {"phase", r.phase},
                    {"detail", fmt::format("no heartbeat for {:.1f} s (--late-timeout {:.0f} s); {}", silent,
                                           o_.late_timeout_s, detail)},
                    {"detected_after_s", silent}, {"late", true}};
      }
      if (!late) {
        r.late_since = r.last_hb;
        ++late_episodes_;
        spdlog::warn("rank {} on {} is late: no heartbeat for {:.1f} s; {}; not a failure before {:.0f} s (--late-timeout)",
                     rank, r.host, silent, detail, o_.late_timeout_s);
      }
      continue;
    }
    const std::string kind = state == "stopped" ? "hung" : state == "unreachable" ? "lost_host" : state == "gone" ? "dead"
                                                                                                        : "unresponsive";
    return json{{"kind", kind}, {"rank", rank}, {"host", r.host}, {"step", r.step}, {"phase", r.phase},
                {"detail", fmt::format("no heartbeat for {:.1f} s; {}", silent, detail.empty() ? state : detail)},
                {"detected_after_s", silent}};
  }
  // A rank that reported a failure of its own (after a moment: when a peer died, its connection's
  // close may arrive just after the survivor's report, and the dead one is the cause).
  for (auto& [rank, r] : job.ranks) {
    if (r.failed && now - r.failed_at > std::max(0.5, o_.heartbeat_interval_s)) {
      return json{{"kind", "failed"}, {"rank", rank}, {"host", r.host}, {"step", r.step}, {"phase", r.phase},
                  {"exit_code", r.exit_code},
                  {"detail", fmt::format("{} (exit {}: {})", r.error, r.exit_code, ExitDescription(r.exit_code))}};
    }
  }
  // Hung: heartbeating, but no progress in its phase for longer than the phase allows. The ranks
  // waiting for the others (communication) are named only when no rank is stuck elsewhere.
  std::vector<int> stuck, waiting;
  for (auto& [rank, r] : job.ranks) {
    if (r.conn < 0 || r.exited) continue;
    if (now - r.progress_at > HangTimeout(r.phase)) (r.phase == "communication" ? waiting : stuck).push_back(rank);
  }
  if (stuck.empty() && !waiting.empty()) {
    // The waiting ranks wait for someone: a rank outside communication whose progress stopped too
    // (heartbeats arrive every interval, so its last change may have been seen a little later).
    for (auto& [rank, r] : job.ranks) {
      if (r.conn >= 0 && !r.exited && r.phase != "communication" &&
          now - r.progress_at > 2 * o_.heartbeat_interval_s) {
        stuck.push_back(rank);
      }
    }
  }
  if (!stuck.empty() || !waiting.empty()) {
    const std::vector<int>& named = !stuck.empty() ? stuck : waiting;
    std::string who;
    for (int rank : named) {
      const RankInfo& r = job.ranks[rank];
      who += fmt::format("{}rank {} on {} ({} for {:.0f} s at step {})", who.empty() ? "" : "; ", rank, r.host,
                         r.phase, now - r.progress_at, r.step);
    }
    const RankInfo& r0 = job.ranks[named[0]];
    json incident{{"kind", "hung"}, {"rank", named[0]}, {"host", r0.host}, {"step", r0.step}, {"phase", r0.phase},
                  {"detail", "no progress: " + who}, {"ranks", named}};
    return incident;
  }
  return std::nullopt;
}

// ---- recovering --------------------------------------------------------------------------------

void Supervisor::PollFor(double seconds, const std::function<bool()>& done) {
  const double end = Mono() + seconds;
  while (!done() && Mono() < end) {
    HandleEvents(server_->Poll(std::min(0.05, std::max(0.0, end - Mono()))));
    TailLog();
  }
}

double Supervisor::RunningProductive() const {
  if (!job_ || job_->accounted || job_->first_step < 0 || job_->last_step <= job_->first_step || job_->start_step < 0) {
    return 0;
  }
  const double per_step =
      (job_->last_step_time - job_->first_step_time) / static_cast<double>(job_->last_step - job_->first_step);
  if (!std::isfinite(per_step) || per_step <= 0) return 0;
  return per_step * static_cast<double>(std::max<int64_t>(0, job_->last_step - job_->start_step));
}

void Supervisor::AccountGeneration(int64_t kept_until_step) {
  Job& job = *job_;
  job.accounted = true;
  if (job.first_step < 0 || job.last_step <= job.first_step || job.start_step < 0) return;
  const double per_step = (job.last_step_time - job.first_step_time) / static_cast<double>(job.last_step - job.first_step);
  if (!std::isfinite(per_step) || per_step <= 0) return;
  const int64_t kept = std::max<int64_t>(0, kept_until_step - job.start_step);
  productive_s_ += per_step * static_cast<double>(kept);
  spdlog::debug("generation {}: steps {}..{} kept, {:.2f} ms per step", job.generation, job.start_step,
                job.start_step + kept, per_step * 1000);
}

void Supervisor::Teardown(double deadline_s) {
  Job& job = *job_;
  for (auto& [rank, r] : job.ranks) {
    if (r.conn >= 0 && !r.exited) {
      server_->Send(r.conn, {{field::kType, msg::kExit}, {field::kCode, 3}, {field::kReason, "the job is being restarted"}});
    }
  }
  // The ranks leave when told; mpirun may not notice for a while (it is not needed any more).
  const double end = Mono() + deadline_s;
  auto ranks_gone = [&] {
    for (auto& [rank, r] : job.ranks) {
      if (r.conn >= 0) return false;
    }
    return true;
  };
  while (MpirunAlive() && !ranks_gone() && Mono() < end) {
    HandleEvents(server_->Poll(0.02));
    TailLog();
  }
  const double grace = std::min(end, Mono() + 0.5);
  while (MpirunAlive() && Mono() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (MpirunAlive() && UsesSrun() && !job.slurm_step.empty()) {
    // The step's tasks on every node (srun killed alone would leave them running).
    std::string out;
    RunCommand({"scancel", "--signal=KILL", o_.slurm_job_id + "." + job.slurm_step}, 5.0, &out);
    const double wait = Mono() + 3.0;
    while (MpirunAlive() && Mono() < wait) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (MpirunAlive()) {
    ::kill(-job.mpirun, SIGKILL);  // its session: mpirun and the local ranks
    if (job.child) {
      ::waitpid(job.mpirun, nullptr, 0);
    }
    job.mpirun_exited = true;
  }
  // Host by host: whatever is left of the job (a partitioned host's rank and orted).
  std::vector<std::thread> cleaners;
  for (auto& [rank, r] : job.ranks) {
    if (r.pid > 0) cleaners.emplace_back([this, info = r] { KillRank(info); });
  }
  for (std::thread& t : cleaners) t.join();
  TailLog();
  for (auto& [conn, rank] : conn_rank_) server_->Close(conn);
  conn_rank_.clear();
}

std::map<int, json> Supervisor::AwaitReplies(const std::map<int, const char*>& wanted, int needed,
                                             double timeout_s) {
  std::map<int, json> got;
  const double end = Mono() + timeout_s;
  while (got.size() < wanted.size() && Mono() < end && job_->ranks[needed].conn >= 0) {
    for (const auto& e : server_->Poll(0.05)) {
      auto it = conn_rank_.find(e.conn);
      if (e.kind == monitor::HeartbeatServer::Event::kMessage && it != conn_rank_.end()) {
        auto w = wanted.find(it->second);
        if (w != wanted.end() && e.body.value(field::kType, "") == w->second) {
          got[it->second] = e.body;
          continue;
        }
      }
      HandleEvents({e});
    }
    TailLog();
  }
  return got;
}

void Supervisor::Recover(json incident, const std::set<int>& culprits) {
  Job& job = *job_;
  const double t0 = Mono();
  failure_at_wall_ = WallNow();
  failed_generation_ = job.generation;
  const std::string kind = incident.value("kind", "failed");
  incident["generation"] = job.generation;
  incident["detected_at"] = failure_at_wall_;
  Say(fmt::format("FAILURE ({}): {}rank {} on host {} at step {} ({}): {}", kind,
                  incident.value("rank", -1) < 0 ? "" : "", incident.value("rank", -1), incident.value("host", "?"),
                  incident.value("step", int64_t{-1}), incident.value("phase", "?"), incident.value("detail", "")));
  // The culprits go first (a stopped or silent process does not answer), then everyone else unwinds.
  for (int rank : culprits) KillRank(job.ranks[rank]);
  const std::string reason = fmt::format("rank {} failed ({})", incident.value("rank", -1), kind);
  for (auto& [rank, r] : job.ranks) {
    if (!culprits.count(rank) && r.conn >= 0) {
      server_->Send(r.conn, {{field::kType, msg::kAbort}, {field::kReason, reason}});
    }
  }
  auto settled = [&] {
    for (auto& [rank, r] : job.ranks) {
      if (!culprits.count(rank) && r.conn >= 0 && !r.failed && !r.exited) return false;
    }
    return true;
  };
  PollFor(5.0, settled);
  // The rescue: the survivor with the newest whole state writes it; a second one cross-checks its hash.
  json rescue = {{"attempted", false}};
  std::vector<int> survivors;
  int64_t best = -1;
  for (auto& [rank, r] : job.ranks) {
    if (!culprits.count(rank) && r.conn >= 0 && r.failed && r.rescuable) {
      survivors.push_back(rank);
      best = std::max(best, r.failed_step);
    }
  }
  if (!survivors.empty() && o_.has_checkpoints) {
    std::vector<int> at_best;
    for (int rank : survivors) {
      if (job.ranks[rank].failed_step == best) at_best.push_back(rank);
    }
    const int writer = at_best[0];
    const int checker = at_best.size() > 1 ? at_best[1] : -1;
    rescue = {{"attempted", true}, {"step", best}, {"writer", writer}, {"checker", checker}};
    server_->Send(job.ranks[writer].conn, {{field::kType, msg::kRescue}, {field::kMode, protocol::kModeWrite}});
    std::map<int, const char*> wanted = {{writer, msg::kRescued}};
    if (checker >= 0) {
      server_->Send(job.ranks[checker].conn, {{field::kType, msg::kRescue}, {field::kMode, protocol::kModeHash}});
      wanted[checker] = msg::kHash;
    }
    std::map<int, json> replies = AwaitReplies(wanted, writer, o_.rescue_timeout_s);
    const bool have_written = replies.count(writer) > 0, have_hash = checker < 0 || replies.count(checker) > 0;
    const json written = have_written ? replies[writer] : json::object();
    const json hashed = checker >= 0 && have_hash ? replies[checker] : json::object();
    bool ok = have_written && written.value(field::kOk, false);
    std::string why = !have_written ? "no answer from the writer" : written.value(field::kError, "");
    if (ok && checker >= 0) {
      if (!have_hash || !hashed.value(field::kOk, false)) {
        ok = true;  // the writer's state stands on its own checksums; note the missing cross-check
        rescue["cross_check"] = "unavailable";
      } else if (hashed.value(field::kHash, "") != written.value(field::kHash, "") ||
                 hashed.value(field::kStep, int64_t{-2}) != written.value(field::kStep, int64_t{-1})) {
        ok = false;
        why = fmt::format("state hashes differ between rank {} ({} at step {}) and rank {} ({} at step {})", writer,
                          written.value(field::kHash, ""), written.value(field::kStep, int64_t{-1}), checker,
                          hashed.value(field::kHash, ""), hashed.value(field::kStep, int64_t{-1}));
        rescue["cross_check"] = "mismatch";
      } else {
        rescue["cross_check"] = "match";
      }
    }
    if (ok && !written.value(field::kAlready, false)) {
      server_->Send(job.ranks[writer].conn, {{field::kType, msg::kCommit}});
      std::map<int, json> r = AwaitReplies({{writer, msg::kCommitted}}, writer, o_.rescue_timeout_s);
      ok = r.count(writer) > 0 && r[writer].value(field::kOk, false);
      if (!ok) why = r.count(writer) > 0 ? r[writer].value(field::kError, "") : "no answer to the commit";
    } else if (have_written && checker >= 0 && !ok) {
      // The rank deletes what it wrote, so no half-checked state is ever committed or loaded.
      server_->Send(job.ranks[writer].conn, {{field::kType, msg::kDiscard}});
      std::map<int, json> r = AwaitReplies({{writer, msg::kDiscarded}}, writer, o_.rescue_timeout_s);
      rescue["discarded"] = r.count(writer) > 0 && r[writer].value(field::kOk, false);
    }
    rescue["ok"] = ok;
    rescue["seconds"] = written.value(field::kSeconds, 0.0);
    if (ok) {
      rescue["already"] = written.value(field::kAlready, false);
      Say(fmt::format("rescue: rank {} saved the state of step {}{}{}", writer, best,
                      written.value(field::kAlready, false) ? " (already checkpointed)" : "",
                      checker >= 0 ? fmt::format(", cross-checked with rank {}", checker) : ""));
    } else {
      rescue["error"] = why;
      Say(fmt::format("rescue failed ({}); resuming from the last checkpoint", why));
    }
  } else if (!o_.has_checkpoints) {
    rescue["error"] = "the job has no checkpoint_dir";
  } else {
    rescue["error"] = "no surviving rank holds a whole state";
  }
  incident["rescue"] = rescue;
  AccountGeneration(rescue.value("ok", false) ? best : [&] {
    int64_t c = -1;
    for (auto& [rank, r] : job.ranks) c = std::max(c, r.checkpoint);
    return c;
  }());
  Teardown(10.0);
  // What the launcher saw of the failed rank (its exit signal), from the end of its log.
  if (std::ifstream f(job.log_path, std::ios::binary); f) {
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekg(std::max<std::streamoff>(0, size - 65536));
    const std::string tail((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    static const std::regex kSignal(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+))");
    static const std::regex kSrunTask(R"(srun: error: (\S+): task (\d+): ([^\n]+))");
    for (std::sregex_iterator it(tail.begin(), tail.end(), kSrunTask), end; it != end; ++it) {
      if (std::stoi((*it)[2]) == incident.value("rank", -2)) {
        incident["detail"] = incident.value("detail", "") + fmt::format("; srun: {} on {}", (*it)[3].str(), (*it)[1].str());
      }
    }
    for (std::sregex_iterator it(tail.begin(), tail.end(), kSignal), end; it != end; ++it) {
      if (std::stoi((*it)[1]) == incident.value("rank", -2)) {
        const int sig = std::stoi((*it)[2]);
        incident["signal"] = sig;
        incident["detail"] = incident.value("detail", "") + fmt::format("; mpirun: exited on signal {} ({})", sig,
                                                                        ::strsignal(sig));
      }
    }
  }
  // Host accounting: the culprits' hosts (a launcher failure names no rank).
  std::set<std::string> hosts;
  for (int rank : culprits) {
    if (!job.ranks[rank].host.empty()) hosts.insert(job.ranks[rank].host);
  }
  // A rank's own failure other than a peer's (an I/O or internal error) counts against its host.
  if (kind == "failed" && incident.value("exit_code", kExitRetryable) != kExitRetryable) {
    hosts.insert(incident.value("host", ""));
    hosts.erase("");
  }
  failures_by_cause_[kind]++;
  std::vector<std::string> quarantined;
  // Lateness is the machine's load, not the host's fault: it never counts towards a quarantine.
  if (incident.value("late", false)) hosts.clear();
  for (const std::string& h : hosts) {
    failures_by_host_[h]++;
    if (book_.RecordFailure(h, WallNow(), kind)) quarantined.push_back(h);
  }
  for (const std::string& h : quarantined) {
    const std::string cause = fmt::format("{} failures within {:.0f} s (last: {}: {})", book_.failures_in_window(h, WallNow()),
                                          o_.quarantine.window_s, kind, incident.value("detail", ""));
    host_causes_[h] = cause;
    Say(fmt::format("host {} quarantined after {}", h, cause));
  }
  incident["quarantined"] = quarantined;
  incident["teardown_s"] = Mono() - t0;
  ++restarts_;
  incident["restart"] = restarts_;
  Incident(incident);
  job_.reset();
  const double delay = backoff_.NextDelay(Mono());
  next_launch_ = Mono() + delay;
  if (delay > 0) Say(fmt::format("restarting in {:.1f} s (restart {} of at most {})", delay, restarts_ - budget_base_, o_.max_restarts));
  Save();
}

void Supervisor::HealthChecks(bool wait) {
  // Results of a round that finished.
  std::vector<std::pair<std::string, int>> results;
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    results.swap(health_results_);
  }
  if (!health_running_ && health_thread_.joinable()) health_thread_.join();
  for (const auto& [h, rc] : results) {
    if (rc == 0 && book_.state(h) == HostState::kQuarantined) {
      book_.Readmit(h, WallNow());
      host_causes_.erase(h);
      Say(fmt::format("host {} passed its health check: readmitted", h));
      Incident({{"kind", "readmitted"}, {"host", h}});
      Save();
    }
  }
  if (health_running_ || book_.Quarantined().empty()) return;
  if (!wait && Mono() - last_health_ < o_.health_interval_s) return;
  last_health_ = Mono();
  // A round in the background: a slow check must not delay the failure detection.
  std::vector<std::vector<std::string>> checks;
  std::vector<std::string> hosts = book_.Quarantined();
  for (const std::string& h : hosts) {
    const std::string check = fmt::format("TRAINFLOW_HOST={}; export TRAINFLOW_HOST; {} health --quiet", ShellQuote(h),
                                          ShellQuote(o_.trainflow)) +
                              (o_.health_command.empty() ? "" : " && " + o_.health_command);
    checks.push_back(IsLocalHost(h) && !UsesSrun() ? std::vector<std::string>{"/bin/sh", "-c", check}
                                                   : RemoteArgv(h, check));
  }
  health_running_ = true;
  health_thread_ = std::thread([this, hosts, checks] {
    for (size_t i = 0; i < hosts.size(); ++i) {
      std::string out;
      const int rc = RunCommand(checks[i], 30.0, &out);
      if (rc != 0) spdlog::debug("host {} still unhealthy (rc {}): {}", hosts[i], rc, out);
      std::lock_guard<std::mutex> lock(health_mu_);
      health_results_.emplace_back(hosts[i], rc);
    }
    health_running_ = false;
  });
  if (wait) {
    health_thread_.join();
    HealthChecks(false);  // applies them
  }
}

bool Supervisor::RereadHostfile() {
  if (o_.hostfile.empty()) return false;
  std::error_code ec;
  const auto mtime = fs::last_write_time(o_.hostfile, ec);
  if (ec || mtime == hostfile_mtime_) return false;
  hostfile_mtime_ = mtime;
  auto text = Env::Default()->ReadFileToString(o_.hostfile, kMaxHostfileBytes);
  if (!text.ok()) {
    spdlog::warn("hostfile changed but cannot be read; keeping the previous hosts: {}", text.status().ToString());
    return false;
  }
  auto hosts = ParseHostfile(*text, o_.hostfile);
  if (!hosts.ok()) {
    spdlog::warn("hostfile changed but is not valid; keeping the previous hosts: {}", hosts.status().ToString());
    return false;
  }
  o_.hosts = *hosts;
  book_.SetHosts(*hosts);
  Say(fmt::format("hostfile re-read: {} host(s), {} slot(s)", hosts->size(), TotalSlots(*hosts)));
  return true;
}

int Supervisor::Finish(int code, const std::string& why, const char* reason) {
  if (health_thread_.joinable()) health_thread_.join();
  ended_ = reason;
  Say(why);
  if (outcome_ != nullptr) {
    outcome_->reason = reason;
    outcome_->final_step = final_step_;
    outcome_->bad_hosts.clear();
    for (const std::string& h : book_.Quarantined()) {
      outcome_->bad_hosts[h] = host_causes_.count(h) ? host_causes_[h] : std::string("quarantined");
    }
    outcome_->usage = Usage();
  }
  const double wall = prior_wall_s_ + (WallNow() - run_started_wall_);
  const double productive = productive_s_ + RunningProductive();
  Say(fmt::format("summary: {} restart(s), {} late rank(s), {:.1f} s down, effective training time {:.1f}% of {:.1f} s; "
                  "incidents in {}/incidents.jsonl",
                  restarts_, late_episodes_, downtime_s_, wall > 0 ? 100.0 * productive / wall : 0.0, wall,
                  o_.state_dir));
  Save();
  return code;
}

int Supervisor::Run() {
  run_started_wall_ = WallNow();
  if (Status s = Open(); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return ExitCodeFor(s.code());
  }
  auto server = monitor::HeartbeatServer::Listen(o_.heartbeat_host, o_.heartbeat_port, secret_);
  if (!server.ok() && job_) {
    // The adopted job's port is taken: end that job and start again.
    Say("cannot listen on the adopted job's port; ending it and starting again from the checkpoint");
    ::kill(-job_->mpirun, SIGKILL);
    job_.reset();
    server = monitor::HeartbeatServer::Listen(o_.heartbeat_host, 0, secret_);
  }
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return kExitIOError;
  }
  server_ = std::move(*server);
  struct sigaction sa{};
  sa.sa_handler = OnSupervisorSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  struct sigaction warn{};
  warn.sa_handler = OnSupervisorWarning;
  sigemptyset(&warn.sa_mask);
  ::sigaction(SIGUSR1, &warn, nullptr);
  Say(fmt::format("supervising from {} (heartbeats on {}:{}, state in {})", ::getpid(), o_.heartbeat_host,
                  server_->port(), o_.state_dir));
  if (o_.metrics_addr != "off" && !o_.metrics_addr.empty()) {
    monitor::ServerOptions so;
    if (Status s = monitor::ParseHostPort(o_.metrics_addr, &so); !s.ok()) {
      spdlog::error("--metrics-addr: {}", s.ToString());
      return kExitBadInput;
    }
    so.token = o_.metrics_token;
    Save();
    auto ms = monitor::MetricsServer::Start(&metrics_, so);
    if (!ms.ok()) {
      spdlog::warn("no supervisor metrics endpoint: {}", ms.status().ToString());
    } else {
      metrics_server_ = std::move(*ms);
      Say(fmt::format("metrics at {}/metrics{}", metrics_server_->url(),
                      o_.metrics_token.empty() ? "" : " (bearer token required)"));
      WriteEndpoints();
    }
  }
  if (job_) Save();
  while (true) {
    // A user's SIGINT/SIGTERM, or Slurm's SIGUSR1 before the time limit: the job stops after its step
    // and writes a checkpoint; a second SIGINT/SIGTERM ends it.
    const int signals = g_signals.load();
    const bool warned = g_warnings.load() > 0;
    if ((signals > 0 || warned) && !stopping_) {
      stopping_ = true;
      time_warning_ = signals == 0;
      if (job_) {
        Say(time_warning_ ? "time limit warning (SIGUSR1): the ranks finish their step and write a checkpoint"
                          : "stop requested: the ranks finish their step and write a checkpoint (again to end them now)");
        for (auto& [rank, r] : job_->ranks) {
          if (r.conn >= 0) server_->Send(r.conn, {{field::kType, msg::kStop}});
        }
        job_->stop_sent = true;
      }
    }
    if (signals > 1 && job_) {
      Teardown(0.0);
      job_.reset();
      return Finish(kExitStopped, "stopped", time_warning_ ? "time_warning" : "stopped");
    }
    if (!job_) {
      last_watch_ = 0;
      if (stopping_) {
        return Finish(kExitStopped, "stopped before the next launch", time_warning_ ? "time_warning" : "stopped");
      }
      if (Mono() < next_launch_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      if (restarts_ - budget_base_ > o_.max_restarts) {
        return Finish(kExitRetryable,
                      fmt::format("giving up: {} restarts{}, more than --max-restarts {}", restarts_ - budget_base_,
                                  budget_base_ > 0 ? fmt::format(" in this run ({} before it)", budget_base_) : "",
                                  o_.max_restarts),
                      "budget");
      }
      Status s = Launch();
      if (!s.ok()) {
        if (s.code() != StatusCode::kUnavailable) {
          spdlog::error("{}", s.ToString());
          return Finish(ExitCodeFor(s.code()), "cannot launch", "error");
        }
        // Too few healthy slots: wait for a quarantined host to pass its health check.
        if (book_.Quarantined().empty() || !o_.wait_for_hosts) {
          return Finish(kExitRetryable, s.message(), "too_few_hosts");
        }
        Say(fmt::format("waiting for hosts: {}", s.message()));
        HealthChecks(/*wait=*/true);
        RereadHostfile();
        if (!book_.Usable().empty() && TotalSlots(book_.Usable()) >= o_.min_ranks) continue;
        const double wait_end = Mono() + o_.health_interval_s;
        while (Mono() < wait_end && g_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      continue;
    }
    // Time the supervisor itself was not running (a loaded or paused machine) is not the ranks' silence.
    const double before = Mono();
    if (last_watch_ > 0 && before - last_watch_ > std::max(1.0, o_.heartbeat_interval_s)) {
      const double gap = before - last_watch_;
      for (auto& [rank, r] : job_->ranks) {
        r.last_hb += gap;
        r.progress_at += gap;
      }
      spdlog::warn("the supervisor did not run for {:.1f} s; that time is not counted as the ranks' silence", gap);
    }
    HandleEvents(server_->Poll(0.05));
    last_watch_ = Mono();
    TailLog();
    const bool alive = MpirunAlive();
    bool all_exited = !job_->ranks.empty();
    int worst = 0;
    for (auto& [rank, r] : job_->ranks) {
      all_exited = all_exited && r.exited;
      if (r.exited) worst = std::max(worst, r.exit_code == 5 ? 0 : r.exit_code);
    }
    if (!alive || all_exited) {
      // Give the last messages a moment to arrive.
      PollFor(all_exited ? 0.2 : 1.0, [&] {
        for (auto& [rank, r] : job_->ranks) {
          if (!r.exited && !r.closed && r.conn >= 0) return false;
        }
        return true;
      });
      bool every = true, stopped = false, failed_input = false;
      for (auto& [rank, r] : job_->ranks) {
        every = every && r.exited;
        stopped = stopped || (r.exited && r.exit_code == 5);
        failed_input = failed_input || (r.failed && r.exit_code == 2);
      }
      if (every) {
        // Every rank said goodbye: mpirun ends by itself once they have finalized.
        const double end = Mono() + 30.0;
        while (MpirunAlive() && Mono() < end) {
          HandleEvents(server_->Poll(0.02));
          TailLog();
        }
      }
      if (MpirunAlive()) Teardown(10.0);
      if (every && worst == 0) {
        const bool grow = job_->growing;
        AccountGeneration(final_step_ >= 0 ? final_step_ : job_->last_step);
        job_.reset();
        if (stopped && stopping_) {
          return Finish(kExitStopped,
                        time_warning_ ? "stopped at a checkpoint before the time limit"
                                      : "stopped; `trainflow launch` with the same arguments resumes",
                        time_warning_ ? "time_warning" : "stopped");
        }
        if (stopped && grow) {
          Say("the job stopped at a checkpoint to grow");
          Save();
          continue;
        }
        if (!stopped) {
          Save();
          return Finish(kExitOk, fmt::format("the job finished (step {})", final_step_), "finished");
        }
        return Finish(kExitStopped, "the job stopped (stop_at_step or a signal to the ranks)", "stopped_outside");
      }
      if (failed_input) {
        std::string error;
        for (auto& [rank, r] : job_->ranks) {
          if (r.failed && error.empty()) error = r.error;
        }
        Incident({{"kind", "bad_input"}, {"generation", job_->generation}, {"detail", error}, {"action", "stopped"}});
        job_.reset();
        return Finish(kExitBadInput, "the job stopped on a configuration or input error (not retried): " + error,
                      "bad_input");
      }
      // mpirun ended without every rank saying goodbye: a failure (a rank killed before it connected,
      // or the launcher itself).
      int status = job_->mpirun_status;
      std::string detail = job_->child && WIFEXITED(status) ? fmt::format("mpirun exited with {}", WEXITSTATUS(status))
                           : job_->child && WIFSIGNALED(status) ? fmt::format("mpirun killed by signal {}", WTERMSIG(status))
                                                                : "mpirun ended";
      std::optional<json> d = Detect();
      json incident = d ? *d : json{{"kind", "launcher"}, {"rank", -1}, {"detail", detail}};
      std::set<int> culprits;
      if (incident.value("rank", -1) >= 0) culprits.insert(incident.value("rank", -1));
      if (incident.value("kind", "") == "bad_input") {
        job_.reset();
        return Finish(kExitBadInput,
                      "the job stopped on a configuration or input error (not retried): " + incident.value("detail", ""),
                      "bad_input");
      }
      Recover(incident, culprits);
      continue;
    }
    if (job_->stop_sent) continue;  // a graceful stop is under way
    if (std::optional<json> incident = Detect()) {
      if (incident->value("kind", "") == "bad_input") {
        // Every rank fails the same way on a bad config: stop them all, no restart.
        Teardown(5.0);
        Incident({{"kind", "bad_input"}, {"generation", job_->generation}, {"detail", incident->value("detail", "")},
                  {"action", "stopped"}});
        job_.reset();
        return Finish(kExitBadInput,
                      "the job stopped on a configuration or input error (not retried): " + incident->value("detail", ""),
                      "bad_input");
      }
      std::set<int> culprits;
      if (incident->contains("ranks")) {
        for (int r : (*incident)["ranks"]) culprits.insert(r);
      } else if (incident->value("rank", -1) >= 0 && incident->value("kind", "") != "failed") {
        culprits.insert(incident->value("rank", -1));
      }
      Recover(*incident, culprits);
      continue;
    }
    // Periodic work: quarantined hosts' health, the hostfile, growing back at a checkpoint.
    const double now = Mono();
    HealthChecks();
    if (now - last_hostfile_check_ > 2.0) {
      last_hostfile_check_ = now;
      RereadHostfile();
    }
    const int slots = TotalSlots(book_.Usable());
    const int cap = o_.max_ranks > 0 ? o_.max_ranks : slots;
    if (job_->all_connected && !job_->growing && job_->first_step >= 0) {
      auto plan = PlanBatch(o_.global_rows, o_.max_batch_size, o_.min_ranks, std::max(cap, o_.min_ranks), slots);
      if (plan.ok() && plan->exact && plan->world > job_->plan.world) {
        Say(fmt::format("{} healthy slot(s) now: stopping at a checkpoint to grow from {} to {} ranks", slots,
                        job_->plan.world, plan->world));
        Incident({{"kind", "grow"}, {"generation", job_->generation}, {"from", job_->plan.world}, {"to", plan->world}});
        for (auto& [rank, r] : job_->ranks) {
          if (r.conn >= 0) server_->Send(r.conn, {{field::kType, msg::kStop}});
        }
        job_->growing = true;
        job_->stop_sent = true;
      }
    }
    if (now - last_save_ > 1.0) {
      last_save_ = now;
      Save();
    }
  }
}

}  // namespace

int RunSupervisor(const LaunchOptions& options, SupervisorOutcome* outcome) {
  Supervisor s(options, outcome);
  return s.Run();
}

Status PrintLaunchStatus(const std::string& state_dir, bool as_json) {
  TF_ASSIGN_OR_RETURN(json st, ReadLaunchState(Env::Default(), state_dir));
  const std::vector<json> incidents = ReadIncidents(Env::Default(), state_dir);
  std::string holder;
  const bool running = SupervisorRunning(state_dir, &holder);
  if (as_json) {
    st["supervisor_running"] = running;
    st["incidents"] = incidents;
    fmt::print("{}\n", st.dump(2));
    return Status::OK();
  }
  fmt::print("supervisor: {} (state {}, updated {})\n", running ? "running, pid " + holder : "not running",
             st.value("status", "?"), st.value("updated", "?"));
  const int base = st.value("budget_base", 0);
  fmt::print("restarts: {} of at most {}{}; late ranks {}; effective training time {:.1f}% of {:.1f} s; {:.1f} s down\n",
             st.value("restarts", 0) - base, st.value("max_restarts", 0),
             base > 0 ? fmt::format(" ({} in earlier runs)", base) : "", st.value("late", 0),
             100.0 * st.value("effective_ratio", 0.0), st.value("wall_s", 0.0), st.value("downtime_s", 0.0));
  if (st.contains("job") && st["job"].is_object()) {
    const json& j = st["job"];
    fmt::print("job: generation {}, {} rank(s), batch_size {} x grad_accum_steps {}, mpirun pid {}\n",
               j.value("generation", 0), j.value("world", 0), j.value("batch_size", 0),
               j.value("grad_accum_steps", 0), j.value("mpirun_pid", 0));
    for (const json& r : j.value("ranks", json::array())) {
      fmt::print("  rank {:>3} on {:<16} pid {:<8} step {:<8} {}\n", r.value("rank", 0), r.value("host", ""),
                 r.value("pid", 0), r.value("step", 0), r.value("phase", ""));
    }
  }
  fmt::print("hosts:\n");
  if (st.contains("hosts") && st["hosts"].is_object()) {
    QuarantinePolicy p;
    auto book = HostBook::FromJson(st["hosts"], p);
    if (book.ok()) {
      for (const json& h : st["hosts"].value("hosts", json::array())) {
        const std::string name = h.is_object() ? h.value("name", "") : h.is_string() ? h.get<std::string>() : "";
        if (name.empty()) continue;
        fmt::print("  {:<20} {:<12} {} failure(s){}\n", name, HostStateName(book->state(name)),
                   book->total_failures(name),
                   book->last_cause(name).empty() ? "" : ", last: " + book->last_cause(name));
      }
    }
  }
  fmt::print("incidents ({}):\n", incidents.size());
  const size_t from = incidents.size() > 20 ? incidents.size() - 20 : 0;
  for (size_t i = from; i < incidents.size(); ++i) {
    const json& e = incidents[i];
    fmt::print("  {} {:<18} {}\n", e.value("time", ""), e.value("kind", ""),
               e.value("detail", e.contains("action") ? e.value("action", "") : std::string()));
  }
  return Status::OK();
}

}  // namespace tf::launch
