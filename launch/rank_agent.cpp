#include "launch/rank_agent.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "base/log.h"
#include "base/net.h"
#include "base/progress.h"
#include "base/stop_signal.h"
#include "launch/protocol.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
namespace msg = protocol::msg;
namespace field = protocol::field;

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
  HeartbeatClientOptions o;
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
  const std::string hostname = HostName();
  // The host name the supervisor knows: its own (mpirun), else Slurm's node name (srun).
  std::string host = Getenv("TRAINFLOW_HOST");
  if (host.empty()) host = Getenv("SLURMD_NODENAME");
  o.identity = {{field::kRank, RankFromEnvironment()},
                {field::kGeneration, generation},
                {field::kHost, host.empty() ? std::string(hostname) : host},
                {field::kHostname, hostname},
                {field::kPid, static_cast<int64_t>(::getpid())},
                {field::kPpid, static_cast<int64_t>(::getppid())},
                {field::kSlurmStep, Getenv("SLURM_STEP_ID")}};
  std::unique_ptr<RankAgent> agent(new RankAgent());
  RankAgent* self = agent.get();
  TF_ASSIGN_OR_RETURN(agent->client_, HeartbeatClient::Start(
                                          std::move(o), [self](const json& c) { self->OnCommand(c); }));
  return agent;
}

RankAgent::~RankAgent() { client_.reset(); }

void RankAgent::OnCommand(const json& c) {
  const std::string type = c.value(field::kType, "");
  if (type == msg::kAbort) {
    RequestAbort(c.value(field::kReason, std::string("the supervisor aborted the job")));
    return;
  }
  if (type == msg::kStop) {
    RequestStop();
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (type == msg::kExit && !lingering_) {
    // A process of an earlier launch (or one told to leave before it failed): go now.
    spdlog::warn("the supervisor ended this process: {}", c.value(field::kReason, std::string("exit")));
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(c.value(field::kCode, static_cast<int>(kExitRetryable)));
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
  client_->Send({{field::kType, msg::kFailed},
                 {field::kExitCode, code},
                 {field::kError, failure.ToString()},
                 {field::kStep, target != nullptr ? target->step() : int64_t{-1}},
                 {field::kRescuable, rescuable}},
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
    const std::string type = c.value(field::kType, "");
    if (type == msg::kExit) return c.value(field::kCode, code);
    if (!rescuable) continue;
    if (type == msg::kRescue) {
      Rescue(*target, c.value(field::kMode, ""));
    } else if (type == msg::kCommit) {
      Answer(msg::kCommitted, target->step(), target->Commit());
    } else if (type == msg::kDiscard) {
      // The cross-check failed: what Write wrote must never be committed or loaded.
      Answer(msg::kDiscarded, target->step(), target->Discard());
    }
  }
}

void RankAgent::Rescue(RescueTarget& target, const std::string& mode) {
  if (mode == protocol::kModeHash) {
    StatusOr<std::string> h = target.Hash();
    client_->Send({{field::kType, msg::kHash},
                   {field::kStep, target.step()},
                   {field::kOk, h.ok()},
                   {field::kHash, h.ok() ? *h : ""},
                   {field::kError, h.ok() ? "" : h.status().ToString()}},
                  true);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<RescueTarget::Written> r = target.Write();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.ok()) {
    spdlog::info("rescue: wrote the state of step {} in {:.2f} s{}", r->step, s,
                 r->already ? " (a checkpoint of that step was already committed)" : "");
  } else {
    spdlog::warn("rescue: {}", r.status().ToString());
  }
  client_->Send({{field::kType, msg::kRescued},
                 {field::kOk, r.ok()},
                 {field::kStep, r.ok() ? r->step : target.step()},
                 {field::kHash, r.ok() ? r->hash : ""},
                 {field::kAlready, r.ok() && r->already},
                 {field::kSeconds, s},
                 {field::kError, r.ok() ? "" : r.status().ToString()}},
                true);
}

void RankAgent::Answer(const char* type, int64_t step, const Status& s) {
  if (s.ok()) {
    spdlog::info("rescue: the checkpoint of step {} is {}", step, type);
  } else {
    spdlog::warn("rescue: {} failed: {}", type == std::string(msg::kCommitted) ? "commit" : "discard", s.ToString());
  }
  client_->Send({{field::kType, type}, {field::kOk, s.ok()}, {field::kStep, step}, {field::kError, s.ToString()}},
                true);
}

void RankAgent::Finish(int code) {
  const ProgressSnapshot p = ReadProgress();
  client_->Send({{field::kType, msg::kExit},
                 {field::kExitCode, code},
                 {field::kStep, p.step},
                 {field::kCheckpointBytes, p.checkpoint_bytes}},
                /*keep=*/true);
  client_.reset();  // sends what is queued (within a moment) and stops the thread
}

}  // namespace tf::launch
