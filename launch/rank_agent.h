// RankAgent: a rank's side of `trainflow launch` (launch/supervisor.h; docs/fault-tolerance.md).
// It knows nothing of training: the state it rescues is behind RescueTarget, which the train
// command implements over the trainer (engine/cli/cli.cpp).
// Exists only when the supervisor started the process (TRAINFLOW_SUPERVISOR and
// TRAINFLOW_SUPERVISOR_SECRET set): a heartbeat thread (launch/heartbeat.h) reports the rank's
// phase, step and progress (base/progress.h) every interval, from start-up on, whatever the
// training thread is blocked in. Commands from the supervisor: "abort" (every wait for peers gives
// up: the training thread unwinds with Unavailable), "stop" (as SIGTERM: finish the step, write a
// checkpoint, exit 5), "exit" (a process of an older launch: leave at once).
//
// After a failure the training thread calls Linger: it reports the failure and the step whose
// state it still holds, then serves the supervisor's rescue commands — write that state as a
// checkpoint, or hash it for a cross-check, then commit or discard — until told to exit (or
// linger_s passes); after a failed cross-check, "discard" deletes the uncommitted write, so no half
// rescue is ever committed or loaded. The messages are launch/protocol.h's. Environment:
// TRAINFLOW_SUPERVISOR (HOST:PORT), TRAINFLOW_SUPERVISOR_SECRET, TRAINFLOW_LAUNCH_GENERATION,
// TRAINFLOW_HOST (the host name the supervisor gave), and TRAINFLOW_HEARTBEAT_INTERVAL (seconds,
// default 1). Thread safety: the training thread calls the
// methods; the command handler runs on the heartbeat thread.
#pragma once
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "launch/heartbeat.h"

namespace tf::launch {

// What a failed rank still holds, as the rescue exchange sees it.
class RescueTarget {
 public:
  struct Written {
    int64_t step = 0;
    std::string hash;      // of the state written
    bool already = false;  // a checkpoint of that step was already committed
  };
  virtual ~RescueTarget() = default;
  // The step whose state is held.
  virtual int64_t step() const = 0;
  // Whether the state can be written (a checkpoint destination exists).
  virtual bool rescuable() const = 0;
  // A hash of the held state, for the cross-check.
  virtual StatusOr<std::string> Hash() = 0;
  // Writes the state as an uncommitted checkpoint.
  virtual StatusOr<Written> Write() = 0;
  // Commits what Write wrote.
  virtual Status Commit() = 0;
  // Deletes what Write wrote, uncommitted (the cross-check failed). OK when nothing was written.
  virtual Status Discard() = 0;
};

// Whether `trainflow launch` started this process (TRAINFLOW_SUPERVISOR is set).
bool SupervisedProcess();
// Ends a supervised process after a failure at once: flushes the logs, runs no destructors (the
// communicator and its threads would wait for peers that are gone) and skips MPI_Finalize.
[[noreturn]] void QuickExit(int code);

class RankAgent {
 public:
  // nullptr without a supervisor; an error when its variables are malformed.
  static StatusOr<std::unique_ptr<RankAgent>> FromEnvironment();
  ~RankAgent();
  RankAgent(const RankAgent&) = delete;
  RankAgent& operator=(const RankAgent&) = delete;

  // The run failed with `failure` (exit code `code`); `target` may be null (training failed to
  // start). Reports it and serves rescue commands. Returns the exit code to use.
  int Linger(RescueTarget* target, const Status& failure, int code);
  // The process ends with `code` (after a success, a stop or a failure): tells the supervisor.
  void Finish(int code);

  // How long Linger waits for the supervisor (seconds).
  static constexpr double kLingerS = 30;

 private:
  RankAgent() = default;
  void OnCommand(const nlohmann::json& command);
  // Serves a "rescue" command: writes the held state (mode write) or hashes it (mode hash), and answers.
  void Rescue(RescueTarget& target, const std::string& mode);
  // Logs and answers a commit or discard (`type`: committed or discarded): {type, ok, step, error}.
  void Answer(const char* type, int64_t step, const Status& s);

  std::unique_ptr<HeartbeatClient> client_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<nlohmann::json> commands_;  // guarded by mu_: rescue commands for Linger
  bool lingering_ = false;               // guarded by mu_
};

}  // namespace tf::launch
