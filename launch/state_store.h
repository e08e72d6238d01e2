// The supervisor's state directory (docs/fault-tolerance.md "The supervisor's own state"): the lock
// that keeps a second supervisor out, the job's secret, state.json (hosts, restarts, accounting, the
// running job) and incidents.jsonl (one JSON object per line). state.json and incidents.jsonl go
// through an Env, so tests can inject a full disk or a failed rename: state.json is replaced
// atomically and durably (a failed write leaves the previous one for the next supervisor), and
// every failure is returned to the caller. The lock (flock) and the secret (mode 0600, also when
// the directory is group-readable) use the file system directly.
// Thread safety: one thread per object; the free functions from any thread.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/env.h"
#include "base/status.h"

namespace tf::launch {

class StateStore {
 public:
  // REQUIRES: env outlives the store.
  StateStore(Env* env, std::string dir, bool group_readable);
  ~StateStore();  // releases the lock
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Creates the directory (owner-only, or 02750 when group-readable), takes the lock and writes
  // `pid` into it. InvalidArgument naming the holder's pid when another supervisor holds it.
  Status Lock(int64_t pid);
  // The job's secret (kept across supervisor restarts: the running ranks know it); made with
  // `fresh` and written owner-only when there is none (or a short one).
  StatusOr<std::string> Secret(const std::string& fresh);
  // state.json: nullopt when there is none; Corruption/InvalidArgument when it is not a state.
  StatusOr<std::optional<nlohmann::json>> LoadState() const;
  // Replaces state.json atomically and durably.
  Status SaveState(const nlohmann::json& state);
  // Appends `record` as one line of incidents.jsonl.
  Status AppendIncident(const nlohmann::json& record);

  const std::string& dir() const { return dir_; }
  Env* env() const { return env_; }

 private:
  Env* env_;
  std::string dir_;
  bool group_readable_;
  int lock_fd_ = -1;
};

// For `trainflow launch --status`: state_dir's state.json (NotFound when there is none), its
// incidents (lines that do not parse are skipped), and whether a supervisor holds the lock (its pid
// in *holder).
StatusOr<nlohmann::json> ReadLaunchState(Env* env, const std::string& state_dir);
std::vector<nlohmann::json> ReadIncidents(Env* env, const std::string& state_dir);
bool SupervisorRunning(const std::string& state_dir, std::string* holder);

}  // namespace tf::launch
