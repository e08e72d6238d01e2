#include "launch/rank_agent.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "base/log.h"
#include "base/progress.h"
#include "base/stop_signal.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool Retryable(int code) { return code == kExitRetryable || code == kExitIOError; }

}  // namespace

bool SupervisedProcess() { return !Getenv("TRAINFLOW_SUPERVISOR").empty(); }

void QuickExit(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  spdlog::shutdown();
  ::_exit(code);
}

StatusOr<std::unique_ptr<RankAgent>> RankAgent::FromEnvironment() {
  const std::string address = Getenv("TRAINFLOW_SUPERVISOR");
  if (address.empty()) return std::unique_ptr<RankAgent>();
  monitor::HeartbeatClientOptions o;
  o.address = address;
  o.secret = Getenv("TRAINFLOW_SUPERVISOR_SECRET");
  if (o.secret.empty()) {
    return Status::InvalidArgument("TRAINFLOW_SUPERVISOR is set but TRAINFLOW_SUPERVISOR_SECRET is not");
  }
  if (const std::string v = Getenv("TRAINFLOW_HEARTBEAT_INTERVAL"); !v.empty()) {
    char* end = nullptr;
    o.interval_s = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(o.interval_s > 0 && o.interval_s <= 3600)) {
      return Status::InvalidArgument("TRAINFLOW_HEARTBEAT_INTERVAL='{}': expected seconds in (0, 3600]", v);
    }
  }
  int64_t generation = 0;
  if (const std::string v = Getenv("TRAINFLOW_LAUNCH_GENERATION"); !v.empty()) {
    char* end = nullptr;
    generation = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || generation < 0) {
      return Status::InvalidArgument("TRAINFLOW_LAUNCH_GENERATION='{}': expected a whole number >= 0", v);
    }
  }
  char hostname[256] = {};
  ::gethostname(hostname, sizeof(hostname) - 1);
  // The host name the supervisor knows: its own (mpirun), else Slurm's node name (srun).
  std::string host = Getenv("TRAINFLOW_HOST");
  if (host.empty()) host = Getenv("SLURMD_NODENAME");
  o.identity = {{"rank", RankFromEnvironment()},
                {"generation", generation},
                {"host", host.empty() ? std::string(hostname) : host},
                {"hostname", hostname},
                {"pid", static_cast<int64_t>(::getpid())},
                {"ppid", static_cast<int64_t>(::getppid())},
                {"slurm_step", Getenv("SLURM_STEP_ID")}};
  std::unique_ptr<RankAgent> agent(new RankAgent());
  RankAgent* self = agent.get();
  TF_ASSIGN_OR_RETURN(agent->client_, monitor::HeartbeatClient::Start(
                                          std::move(o), [self](const json& c) { self->OnCommand(c); }));
  return agent;
}

RankAgent::~RankAgent() { client_.reset(); }

void RankAgent::OnCommand(const json& c) {
  const std::string type = c.value("type", "");
  if (type == "abort") {
    RequestAbort(c.value("reason", std::string("the supervisor aborted the job")));
    return;
  }
  if (type == "stop") {
    RequestStop();
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (type == "exit" && !lingering_) {
    // A process of an earlier launch (or one told to leave before it failed): go now.
    spdlog::warn("the supervisor ended this process: {}", c.value("reason", std::string("exit")));
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(c.value("code", static_cast<int>(kExitRetryable)));
  }
  commands_.push_back(c);
  cv_.notify_all();
}

int RankAgent::Linger(RescueTarget* target, const Status& failure, int code) {
  SetPhase(Phase::kRescue);
  const bool rescuable = target != nullptr && target->rescuable() && Retryable(code);
  {
    std::lock_guard<std::mutex> lock(mu_);
    lingering_ = true;
  }
  client_->Send({{"type", "failed"},
                 {"exit_code", code},
                 {"error", failure.ToString()},
                 {"step", target != nullptr ? target->step() : int64_t{-1}},
                 {"rescuable", rescuable}},
                /*keep=*/true);
  if (!Retryable(code)) return code;  // nothing to save: the supervisor stops the job
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kLingerS);
  while (true) {
    json c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_until(lock, deadline, [&] { return !commands_.empty(); })) {
        spdlog::warn("no word from the supervisor within {:.0f} s after the failure; exiting", kLingerS);
        return code;
      }
      c = std::move(commands_.front());
      commands_.pop_front();
    }
    const std::string type = c.value("type", "");
    if (type == "exit") return c.value("code", code);
    if (type == "rescue" && rescuable) {
      if (c.value("mode", "") == "hash") {
        StatusOr<std::string> h = target->Hash();
        client_->Send({{"type", "hash"},
                       {"step", target->step()},
                       {"ok", h.ok()},
                       {"hash", h.ok() ? *h : ""},
                       {"error", h.ok() ? "" : h.status().ToString()}},
                      true);
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<RescueTarget::Written> r = target->Write();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r.ok()) {
        spdlog::info("rescue: wrote the state of step {} in {:.2f} s{}", r->step, s,
                     r->already ? " (a checkpoint of that step was already committed)" : "");
      } else {
        spdlog::warn("rescue: {}", r.status().ToString());
      }
      client_->Send({{"type", "rescued"},
                     {"ok", r.ok()},
                     {"step", r.ok() ? r->step : target->step()},
                     {"hash", r.ok() ? r->hash : ""},
                     {"already", r.ok() && r->already},
                     {"seconds", s},
                     {"error", r.ok() ? "" : r.status().ToString()}},
                    true);
      continue;
    }
    if (type == "commit" && rescuable) {
      Status s = target->Commit();
      if (s.ok()) {
        spdlog::info("rescue: the checkpoint of step {} is committed", target->step());
      } else {
        spdlog::warn("rescue: commit failed: {}", s.ToString());
      }
      client_->Send({{"type", "committed"}, {"ok", s.ok()}, {"step", target->step()}, {"error", s.ToString()}},
                    true);
      continue;
    }
  }
}

void RankAgent::Finish(int code) {
  const ProgressSnapshot p = ReadProgress();
  client_->Send({{"type", "exit"}, {"exit_code", code}, {"step", p.step}, {"checkpoint_bytes", p.checkpoint_bytes}},
                /*keep=*/true);
  client_.reset();  // sends what is queued (within a moment) and stops the thread
}

}  // namespace tf::launch
