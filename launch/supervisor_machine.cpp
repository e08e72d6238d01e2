#include "launch/supervisor_machine.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/clock.h"
#include "base/random.h"
#include "launch/protocol.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
namespace msg = protocol::msg;
namespace field = protocol::field;

constexpr uint64_t kMaxHostfileBytes = uint64_t{64} << 20;

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

// What the launcher saw of the failed rank (its exit signal, srun's report), from the end of its
// log, added to the incident's detail.
void AddLauncherReport(const std::string& log_path, json* incident) {
  if (std::ifstream f(log_path, std::ios::binary); f) {
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekg(std::max<std::streamoff>(0, size - 65536));
    const std::string tail((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    static const std::regex kSignal(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+))");
    static const std::regex kSrunTask(R"(srun: error: (\S+): task (\d+): ([^\n]+))");
    for (std::sregex_iterator it(tail.begin(), tail.end(), kSrunTask), end; it != end; ++it) {
      if (std::stoi((*it)[2]) == incident->value("rank", -2)) {
        (*incident)["detail"] =
            incident->value("detail", "") + fmt::format("; srun: {} on {}", (*it)[3].str(), (*it)[1].str());
      }
    }
    for (std::sregex_iterator it(tail.begin(), tail.end(), kSignal), end; it != end; ++it) {
      if (std::stoi((*it)[1]) == incident->value("rank", -2)) {
        const int sig = std::stoi((*it)[2]);
        (*incident)["signal"] = sig;
        (*incident)["detail"] =
            incident->value("detail", "") + fmt::format("; mpirun: exited on signal {} ({})", sig, ::strsignal(sig));
      }
    }
  }
}

}  // namespace

double DefaultHangTimeout(Phase p) {
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

Supervisor::Supervisor(LaunchOptions o, SupervisorOutcome* outcome, SupervisorWorld world)
    : o_(std::move(o)),
      world_(std::move(world)),
      clock_(world_.clock != nullptr ? world_.clock : SystemClock()),
      store_(world_.env != nullptr ? world_.env : Env::Default(), o_.state_dir, o_.group_readable),
      book_(o_.quarantine),
      backoff_(o_.backoff),
      outcome_(outcome) {
  if (world_.env == nullptr) world_.env = Env::Default();
  if (world_.launcher == nullptr) world_.launcher = SystemLauncher();
  if (world_.shell == nullptr) {
    own_shell_ = NewCommandShell(o_.rsh_agent, UsesSrun() ? o_.srun : std::string(), o_.slurm_job_id);
    world_.shell = own_shell_.get();
  }
  if (!world_.listen) world_.listen = HeartbeatServerTransport();
  if (world_.signals == nullptr) world_.signals = ProcessSignals();
  if (world_.pid == 0) world_.pid = ::getpid();
  job_ctl_ = NewProcessJob(o_, world_.env, world_.launcher, world_.shell);
}

Supervisor::~Supervisor() {
  if (health_thread_.joinable()) health_thread_.join();
}

double Supervisor::HangTimeout(const std::string& phase) const {
  Phase p = Phase::kStartup;
  if (!ParsePhase(phase, &p)) return DefaultHangTimeout(Phase::kCompute);
  auto it = o_.hang_timeouts.find(p);
  return it != o_.hang_timeouts.end() ? it->second : DefaultHangTimeout(p);
}

void Supervisor::Say(const std::string& line) {
  fmt::print("[launch] {}\n", line);
  std::fflush(stdout);
}

Status Supervisor::Open() {
  TF_RETURN_IF_ERROR(store_.Lock(world_.pid));
  TF_ASSIGN_OR_RETURN(secret_, store_.Secret(RandomHex(32)));
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
  st["pid"] = world_.pid;
  st["updated"] = IsoUtcMillis(clock_->Wall());
  st["generation"] = generation_;
  st["restarts"] = restarts_;
  st["max_restarts"] = o_.max_restarts;
  st["hosts"] = book_.ToJson();
  st["backoff"] = backoff_.ToJson();
  const double wall = prior_wall_s_ + (clock_->Wall() - run_started_wall_);
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
                 {"mpirun_pid", job_->launcher.pid},
                 {"mpirun_start", job_->launcher.start_time},
                 {"port", server_ ? server_->port() : 0},
                 {"world", job_->plan.world},
                 {"batch_size", job_->plan.batch_size},
                 {"grad_accum_steps", job_->plan.grad_accum_steps},
                 {"hosts", FormatHostfile(job_->hosts)},
                 {"log", job_->log_path},
                 {"started", IsoUtcMillis(job_->started_wall)},
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
  record["time"] = IsoUtcMillis(clock_->Wall());
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
  TF_ASSIGN_OR_RETURN(BatchPlan plan, PlanBatch(o_.global_rows, o_.max_batch_size, o_.min_ranks, max_ranks, slots,
                                                         o_.world_multiple));
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
  StatusOr<Started> started =
      job_ctl_->Start({job.generation, job.hosts, plan, HeartbeatAddress(), secret_, job.log_path});
  if (!started.ok()) {
    --generation_;
    return started.status();
  }
  job.launcher = started->launcher;
  job.log_offset = started->log_offset;
  const int64_t pid = job.launcher.pid;
  job.started_mono = clock_->Mono();
  job.started_wall = clock_->Wall();
  for (int r = 0; r < plan.world; ++r) job.ranks[r].progress_at = job.started_mono;
  std::string where;
  for (const HostEntry& h : job.hosts) where += fmt::format("{}{} x{}", where.empty() ? "" : ", ", h.name, h.slots);
  Say(fmt::format("generation {}: {} rank{} on {} ({}); {} pid {}, log {}", job.generation, plan.world,
                  plan.world == 1 ? "" : "s", where, plan.note, UsesSrun() ? "srun" : "mpirun", pid, job.log_path));
  conn_rank_.clear();
  job_ = std::move(job);
  backoff_.Started(clock_->Mono());
  Save();
  return Status::OK();
}

void Supervisor::Adopt(const json& j) {
  const int64_t pid = j.value("mpirun_pid", int64_t{-1});
  const int64_t start = j.value("mpirun_start", int64_t{-1});
  if (!job_ctl_->Adoptable(pid, start)) {
    // Gone: its ranks may linger (a supervisor killed mid-recovery); end them, then resume from the checkpoint.
    if (j.contains("ranks")) {
      for (const json& r : j["ranks"]) {
        RankInfo info;
        info.host = r.value("host", "");
        info.pid = r.value("pid", int64_t{0});
        info.ppid = r.value("ppid", int64_t{0});
        if (info.pid > 0) job_ctl_->KillRank(AddressOf(info));
      }
    }
    Say(fmt::format("the job of generation {} is no longer running; starting again from its checkpoint",
                    j.value("generation", int64_t{0})));
    return;
  }
  Job job;
  job.generation = j.value("generation", int64_t{0});
  generation_ = std::max(generation_, job.generation);
  job.launcher.pid = pid;
  job.launcher.start_time = start;
  job.launcher.child = false;
  job.plan.world = j.value("world", 0);
  job.plan.batch_size = j.value("batch_size", 0);
  job.plan.grad_accum_steps = j.value("grad_accum_steps", 0);
  job.plan.global_rows = o_.global_rows;
  job.plan.exact = true;
  if (auto h = ParseHostfile(j.value("hosts", ""), "the adopted job's hosts"); h.ok()) job.hosts = *h;
  job.log_path = j.value("log", "");
  std::error_code ec;
  job.log_offset = static_cast<int64_t>(fs::file_size(job.log_path, ec));
  job.started_mono = clock_->Mono();
  job.started_wall = clock_->Wall();
  for (int r = 0; r < job.plan.world; ++r) job.ranks[r].progress_at = job.started_mono;
  o_.heartbeat_port = j.value("port", 0);
  Say(fmt::format("adopting the running job of generation {} (mpirun pid {}); its ranks reconnect", job.generation,
                  pid));
  Incident({{"kind", "supervisor_restart"}, {"generation", job.generation}, {"action", "adopted the running job"}});
  job_ = std::move(job);
}

// ---- watching ----------------------------------------------------------------------------------

void Supervisor::HandleEvents(const std::vector<HeartbeatTransport::Event>& events) {
  using Event = HeartbeatTransport::Event;
  for (const Event& e : events) {
    if (e.kind == Event::kRejected) {
      // A crowd of strangers must not flood the log: the first few, then a count every 10 s.
      ++rejected_;
      const double now = clock_->Mono();
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
      r.last_hb = clock_->Mono();
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
  const double run = clock_->Wall() - run_started_wall_;
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
                 clock_->Mono() - r.late_since);
    r.late_since = 0;
  }
  r.last_hb = clock_->Mono();
  const std::string type = m.value(field::kType, "");
  if (type == msg::kHeartbeat) {
    const std::string phase = m.value(field::kPhase, "");
    const int64_t step = m.value(field::kStep, int64_t{0});
    const uint64_t progress = m.value(field::kProgress, uint64_t{0});
    if (phase != r.phase || step != r.step || progress != r.progress) r.progress_at = clock_->Mono();
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
    r.failed_at = clock_->Mono();
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

std::string Supervisor::HeartbeatAddress() const {
  const bool v6 = o_.heartbeat_host.find(':') != std::string::npos;
  return fmt::format("{}:{}", v6 ? "[" + o_.heartbeat_host + "]" : o_.heartbeat_host, server_ ? server_->port() : 0);
}

std::optional<json> Supervisor::Detect() {
  Job& job = *job_;
  const double now = clock_->Mono();
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
    const bool local = job_ctl_->IsLocal(r.host);
    const double reprobe = local ? o_.heartbeat_interval_s : std::max(5.0, o_.heartbeat_interval_s);
    if (late && now - r.late_probe_at < reprobe && silent <= o_.late_timeout_s) continue;
    std::string detail;
    ProbeResult state = job_ctl_->Probe(AddressOf(r), &detail);
    if (state == ProbeResult::kSilent && !local) state = job_ctl_->ProbeReach(AddressOf(r), HeartbeatAddress(), &detail);
    r.late_probe_at = clock_->Mono();
    if (state == ProbeResult::kSilent) {
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
    const char* kind = state == ProbeResult::kStopped       ? "hung"
                       : state == ProbeResult::kUnreachable ? "lost_host"
                       : state == ProbeResult::kGone        ? "dead"
                                                            : "unresponsive";
    const char* seen = state == ProbeResult::kGone ? "gone" : state == ProbeResult::kCutOff ? "cut_off" : kind;
    return json{{"kind", kind}, {"rank", rank}, {"host", r.host}, {"step", r.step}, {"phase", r.phase},
                {"detail", fmt::format("no heartbeat for {:.1f} s; {}", silent, detail.empty() ? seen : detail)},
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
  const double end = clock_->Mono() + seconds;
  while (!done() && clock_->Mono() < end) {
    HandleEvents(server_->Poll(std::min(0.05, std::max(0.0, end - clock_->Mono()))));
    TailLog();
  }
}

namespace {

// The job's measured seconds per step between its first and last reported steps; 0 when unknown.
double SecondsPerStep(const Job& job) {
  if (job.first_step < 0 || job.last_step <= job.first_step || job.start_step < 0) return 0;
  const double per_step = (job.last_step_time - job.first_step_time) / static_cast<double>(job.last_step - job.first_step);
  return std::isfinite(per_step) && per_step > 0 ? per_step : 0;
}

}  // namespace

double Supervisor::RunningProductive() const {
  if (!job_ || job_->accounted) return 0;
  return SecondsPerStep(*job_) * static_cast<double>(std::max<int64_t>(0, job_->last_step - job_->start_step));
}

void Supervisor::AccountGeneration(int64_t kept_until_step) {
  Job& job = *job_;
  job.accounted = true;
  const double per_step = SecondsPerStep(job);
  if (per_step <= 0) return;
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
  const double end = clock_->Mono() + deadline_s;
  auto ranks_gone = [&] {
    for (auto& [rank, r] : job.ranks) {
      if (r.conn >= 0) return false;
    }
    return true;
  };
  while (LauncherAlive() && !ranks_gone() && clock_->Mono() < end) {
    HandleEvents(server_->Poll(0.02));
    TailLog();
  }
  const double grace = std::min(end, clock_->Mono() + 0.5);
  while (LauncherAlive() && clock_->Mono() < grace) clock_->Sleep(0.01);
  if (LauncherAlive() && UsesSrun() && !job.slurm_step.empty()) {
    // The step's tasks on every node (srun killed alone would leave them running).
    job_ctl_->CancelStep(job.slurm_step);
    const double wait = clock_->Mono() + 3.0;
    while (LauncherAlive() && clock_->Mono() < wait) clock_->Sleep(0.02);
  }
  if (LauncherAlive()) job_ctl_->KillLauncher(&job.launcher);
  // Host by host: whatever is left of the job (a partitioned host's rank and orted).
  std::vector<std::thread> cleaners;
  for (auto& [rank, r] : job.ranks) {
    if (r.pid > 0) cleaners.emplace_back([this, a = AddressOf(r)] { job_ctl_->KillRank(a); });
  }
  for (std::thread& t : cleaners) t.join();
  TailLog();
  for (auto& [conn, rank] : conn_rank_) server_->Close(conn);
  conn_rank_.clear();
}

std::map<int, json> Supervisor::AwaitReplies(const std::map<int, const char*>& wanted, int needed,
                                             double timeout_s) {
  std::map<int, json> got;
  const double end = clock_->Mono() + timeout_s;
  while (got.size() < wanted.size() && clock_->Mono() < end && job_->ranks[needed].conn >= 0) {
    for (const auto& e : server_->Poll(0.05)) {
      auto it = conn_rank_.find(e.conn);
      if (e.kind == HeartbeatTransport::Event::kMessage && it != conn_rank_.end()) {
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

json Supervisor::Rescue(const std::set<int>& culprits, int64_t* best_step) {
  Job& job = *job_;
  // The rescue: the survivor with the newest whole state writes it; a second one cross-checks its hash.
  json rescue = {{"attempted", false}};
  std::vector<int> survivors;
  *best_step = -1;
  int64_t& best = *best_step;
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
  return rescue;
}

std::vector<std::string> Supervisor::AccountHosts(const json& incident, const std::set<int>& culprits) {
  const std::string kind = incident.value("kind", "failed");
  // Host accounting: the culprits' hosts (a launcher failure names no rank).
  std::set<std::string> hosts;
  for (int rank : culprits) {
    if (!job_->ranks[rank].host.empty()) hosts.insert(job_->ranks[rank].host);
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
    if (book_.RecordFailure(h, clock_->Wall(), kind)) quarantined.push_back(h);
  }
  for (const std::string& h : quarantined) {
    const std::string cause = fmt::format("{} failures within {:.0f} s (last: {}: {})", book_.failures_in_window(h, clock_->Wall()),
                                          o_.quarantine.window_s, kind, incident.value("detail", ""));
    host_causes_[h] = cause;
    Say(fmt::format("host {} quarantined after {}", h, cause));
  }
  return quarantined;
}

void Supervisor::Recover(json incident, const std::set<int>& culprits) {
  Job& job = *job_;
  const double t0 = clock_->Mono();
  failure_at_wall_ = clock_->Wall();
  failed_generation_ = job.generation;
  const std::string kind = incident.value("kind", "failed");
  incident["generation"] = job.generation;
  incident["detected_at"] = failure_at_wall_;
  Say(fmt::format("FAILURE ({}): {}rank {} on host {} at step {} ({}): {}", kind,
                  incident.value("rank", -1) < 0 ? "" : "", incident.value("rank", -1), incident.value("host", "?"),
                  incident.value("step", int64_t{-1}), incident.value("phase", "?"), incident.value("detail", "")));
  // The culprits go first (a stopped or silent process does not answer), then everyone else unwinds.
  for (int rank : culprits) job_ctl_->KillRank(AddressOf(job.ranks[rank]));
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
  int64_t best = -1;
  const json rescue = Rescue(culprits, &best);
  incident["rescue"] = rescue;
  AccountGeneration(rescue.value("ok", false) ? best : [&] {
    int64_t c = -1;
    for (auto& [rank, r] : job.ranks) c = std::max(c, r.checkpoint);
    return c;
  }());
  Teardown(10.0);
  AddLauncherReport(job.log_path, &incident);
  incident["quarantined"] = AccountHosts(incident, culprits);
  incident["teardown_s"] = clock_->Mono() - t0;
  ++restarts_;
  incident["restart"] = restarts_;
  Incident(incident);
  job_.reset();
  const double delay = backoff_.NextDelay(clock_->Mono());
  next_launch_ = clock_->Mono() + delay;
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
      book_.Readmit(h, clock_->Wall());
      host_causes_.erase(h);
      Say(fmt::format("host {} passed its health check: readmitted", h));
      Incident({{"kind", "readmitted"}, {"host", h}});
      Save();
    }
  }
  if (health_running_ || book_.Quarantined().empty()) return;
  if (!wait && clock_->Mono() - last_health_ < o_.health_interval_s) return;
  last_health_ = clock_->Mono();
  // A round in the background: a slow check must not delay the failure detection.
  std::vector<std::string> hosts = book_.Quarantined();
  health_running_ = true;
  health_thread_ = std::thread([this, hosts] {
    for (const std::string& h : hosts) {
      const int rc = job_ctl_->HealthCheck(h);
      std::lock_guard<std::mutex> lock(health_mu_);
      health_results_.emplace_back(h, rc);
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
  auto text = world_.env->ReadFileToString(o_.hostfile, kMaxHostfileBytes);
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
  const double wall = prior_wall_s_ + (clock_->Wall() - run_started_wall_);
  const double productive = productive_s_ + RunningProductive();
  Say(fmt::format("summary: {} restart(s), {} late rank(s), {:.1f} s down, effective training time {:.1f}% of {:.1f} s; "
                  "incidents in {}/incidents.jsonl",
                  restarts_, late_episodes_, downtime_s_, wall > 0 ? 100.0 * productive / wall : 0.0, wall,
                  o_.state_dir));
  Save();
  return code;
}

std::optional<int> Supervisor::LaunchNext() {
  last_watch_ = 0;
  if (stopping_) {
    return Finish(kExitStopped, "stopped before the next launch", time_warning_ ? "time_warning" : "stopped");
  }
  if (clock_->Mono() < next_launch_) {
    clock_->Sleep(0.02);
    return std::nullopt;
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
    if (!book_.Usable().empty() && TotalSlots(book_.Usable()) >= o_.min_ranks) return std::nullopt;
    const double wait_end = clock_->Mono() + o_.health_interval_s;
    while (clock_->Mono() < wait_end && world_.signals->stops() == 0) clock_->Sleep(0.05);
  }
  return std::nullopt;
}

std::optional<int> Supervisor::JobEnded(bool all_exited, int worst) {
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
    const double end = clock_->Mono() + 30.0;
    while (LauncherAlive() && clock_->Mono() < end) {
      HandleEvents(server_->Poll(0.02));
      TailLog();
    }
  }
  if (LauncherAlive()) Teardown(10.0);
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
      return std::nullopt;
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
  int status = job_->launcher.status;
  const bool child = job_->launcher.child;
  std::string detail = child && WIFEXITED(status) ? fmt::format("mpirun exited with {}", WEXITSTATUS(status))
                       : child && WIFSIGNALED(status) ? fmt::format("mpirun killed by signal {}", WTERMSIG(status))
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
  return std::nullopt;
}

void Supervisor::Periodic() {
  const double now = clock_->Mono();
  HealthChecks();
  if (now - last_hostfile_check_ > 2.0) {
    last_hostfile_check_ = now;
    RereadHostfile();
  }
  const int slots = TotalSlots(book_.Usable());
  const int cap = o_.max_ranks > 0 ? o_.max_ranks : slots;
  if (job_->all_connected && !job_->growing && job_->first_step >= 0) {
    auto plan = PlanBatch(o_.global_rows, o_.max_batch_size, o_.min_ranks, std::max(cap, o_.min_ranks), slots,
                          o_.world_multiple);
    if (plan.ok() && plan->exact && plan->world > job_->plan.world) {
      Say(fmt::format("{} healthy slot(s) now: stopping at a checkpoint to grow from {} to {} ranks", slots,
                      job_->plan.world, plan->world));
      Incident({{"kind", "grow"}, {"generation", job_->generation}, {"from", job_->plan.world}, {"to", plan->world}});
      job_->growing = true;
      SendStop();
    }
  }
  if (now - last_save_ > 1.0) {
    last_save_ = now;
    Save();
  }
}

void Supervisor::SendStop() {
  for (auto& [rank, r] : job_->ranks) {
    if (r.conn >= 0) server_->Send(r.conn, {{field::kType, msg::kStop}});
  }
  job_->stop_sent = true;
}

int Supervisor::Run() {
  run_started_wall_ = clock_->Wall();
  if (Status s = Open(); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return ExitCodeFor(s.code());
  }
  auto server = world_.listen(o_.heartbeat_host, o_.heartbeat_port, secret_);
  if (!server.ok() && job_) {
    // The adopted job's port is taken: end that job and start again.
    Say("cannot listen on the adopted job's port; ending it and starting again from the checkpoint");
    job_ctl_->KillLauncher(&job_->launcher);
    job_.reset();
    server = world_.listen(o_.heartbeat_host, 0, secret_);
  }
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return kExitIOError;
  }
  server_ = std::move(*server);
  world_.signals->Install();
  Say(fmt::format("supervising from {} (heartbeats on {}:{}, state in {})", world_.pid, o_.heartbeat_host,
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
    const int signals = world_.signals->stops();
    const bool warned = world_.signals->warnings() > 0;
    if ((signals > 0 || warned) && !stopping_) {
      stopping_ = true;
      time_warning_ = signals == 0;
      if (job_) {
        Say(time_warning_ ? "time limit warning (SIGUSR1): the ranks finish their step and write a checkpoint"
                          : "stop requested: the ranks finish their step and write a checkpoint (again to end them now)");
        SendStop();
      }
    }
    if (signals > 1 && job_) {
      Teardown(0.0);
      job_.reset();
      return Finish(kExitStopped, "stopped", time_warning_ ? "time_warning" : "stopped");
    }
    if (!job_) {
      if (std::optional<int> code = LaunchNext()) return *code;
      continue;
    }
    // Time the supervisor itself was not running (a loaded or paused machine) is not the ranks' silence.
    const double before = clock_->Mono();
    if (last_watch_ > 0 && before - last_watch_ > std::max(1.0, o_.heartbeat_interval_s)) {
      const double gap = before - last_watch_;
      for (auto& [rank, r] : job_->ranks) {
        r.last_hb += gap;
        r.progress_at += gap;
      }
      spdlog::warn("the supervisor did not run for {:.1f} s; that time is not counted as the ranks' silence", gap);
    }
    HandleEvents(server_->Poll(0.05));
    last_watch_ = clock_->Mono();
    TailLog();
    const bool alive = LauncherAlive();
    bool all_exited = !job_->ranks.empty();
    int worst = 0;
    for (auto& [rank, r] : job_->ranks) {
      all_exited = all_exited && r.exited;
      if (r.exited) worst = std::max(worst, r.exit_code == 5 ? 0 : r.exit_code);
    }
    if (!alive || all_exited) {
      if (std::optional<int> code = JobEnded(all_exited, worst)) return *code;
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
    Periodic();
  }
}

}  // namespace tf::launch
