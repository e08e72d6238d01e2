// Launch policy: the decisions of `trainflow launch`, the supervisor that runs a data-parallel job over a
// hostfile through mpirun and restarts it after failures — which hosts are usable, how long to wait before a
// restart, how many ranks to run and with what per-rank batch. Pure: no processes, files or clocks; the
// caller passes the time (seconds on any clock it keeps steady) and persists the JSON state itself.
//
// Hosts are quarantined after QuarantinePolicy::max_failures failures within window_s seconds (a failure
// counts while now - t < window_s) and come back only through Readmit, after a passing health check. A host
// missing from a re-read hostfile is kGone, keeps its history and quarantine, and returns with them.
// Restart delays: first_s after the first failure since a reset, then base_s * factor^k; every delay is
// capped at max_s; a run that lasted reset_after_s from Started() to its failure resets the sequence.
// Elastic sizing (PlanBatch) prefers the largest world that keeps the global batch exact even when more
// slots are usable — the loss curve and learning-rate schedule stay those of the configured job — and
// changes the global batch only when no world in [min_ranks, max_ranks] divides it; min_ranks is the floor
// that bounds what exactness may cost in throughput (a prime batch of 7 rows on 6 slots runs on 1 rank).
// Thread safety: values; one thread at a time per object.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace tf::launch {

inline constexpr int kMaxSlotsPerHost = 4096;

struct HostEntry {
  std::string name;
  int slots = 1;
};

// Open MPI hostfile syntax: "name [slots=N] [max_slots=M]" per line ("max-slots" too; spaces around '='
// allowed), '#' comments (whole line or trailing), blank lines. max_slots must be >= slots and is otherwise
// ignored (the supervisor never oversubscribes). Errors are InvalidArgument "<source>: line <n>: <problem>":
// a name character outside [A-Za-z0-9._:-], slots outside 1..kMaxSlotsPerHost, an unknown or repeated key,
// a host listed twice; "<source>: no hosts" when there are none.
StatusOr<std::vector<HostEntry>> ParseHostfile(std::string_view text, const std::string& source);
// "name slots=N\n" per host: what mpirun --hostfile reads; ParseHostfile reads it back.
std::string FormatHostfile(const std::vector<HostEntry>& hosts);
int TotalSlots(const std::vector<HostEntry>& hosts);

struct QuarantinePolicy {
  int max_failures = 3;   // REQUIRES: >= 1
  double window_s = 3600; // REQUIRES: > 0
};

enum class HostState { kHealthy, kQuarantined, kGone };  // kGone: not in the current hostfile
const char* HostStateName(HostState s);

class HostBook {
 public:
  explicit HostBook(QuarantinePolicy p);

  // Replaces the host list (hostfile re-read): new hosts are healthy, hosts missing become kGone (history
  // kept; they come back with it if listed again), slots updated. A name listed twice counts once.
  void SetHosts(const std::vector<HostEntry>& hosts);
  // A failure attributed to `host` at `now`, with a cause for reports. Returns true when this failure
  // quarantined the host (failures within window_s reached max_failures). A host not listed keeps the
  // record, and the quarantine if it is reached, for when it is listed again.
  bool RecordFailure(const std::string& host, double now, const std::string& cause);
  // After a passing health check: healthy, window cleared (total_failures kept). Unknown hosts: no-op.
  void Readmit(const std::string& host, double now);

  HostState state(const std::string& host) const;  // kGone for a host never listed
  std::vector<HostEntry> Usable() const;           // healthy hosts, hostfile order
  std::vector<std::string> Quarantined() const;    // listed quarantined hosts, hostfile order
  int failures_in_window(const std::string& host, double now) const;
  int total_failures(const std::string& host) const;
  std::string last_cause(const std::string& host) const;  // "" when none

  // Everything needed to resume after a supervisor restart (the policy is the caller's, not stored).
  nlohmann::json ToJson() const;
  static StatusOr<HostBook> FromJson(const nlohmann::json& j, QuarantinePolicy p);  // Corruption on bad input

 private:
  struct Record {
    int slots = 1;
    bool listed = false;
    bool quarantined = false;
    std::vector<double> failures;  // times, trimmed to the window on each RecordFailure
    int64_t total_failures = 0;
    std::string last_cause;
  };
  int CountInWindow(const Record& r, double now) const;

  QuarantinePolicy p_;
  std::map<std::string, Record> records_;  // listed and gone hosts
  std::vector<std::string> order_;         // listed hosts, hostfile order
};

struct BackoffPolicy {
  double first_s = 0;
  double base_s = 1;
  double factor = 2;  // REQUIRES: >= 1
  double max_s = 60;
  double reset_after_s = 30;
};

class RestartBackoff {
 public:
  explicit RestartBackoff(BackoffPolicy p);

  // Delay before the restart that follows a failure at `now`. Consumes the last Started(): a failure with
  // no start since the previous one (a restart that never launched) never resets the sequence.
  double NextDelay(double now);
  void Started(double now);
  int consecutive() const { return consecutive_; }  // failures since the last reset

  nlohmann::json ToJson() const;
  static StatusOr<RestartBackoff> FromJson(const nlohmann::json& j, BackoffPolicy p);  // Corruption on bad input

 private:
  BackoffPolicy p_;
  int consecutive_ = 0;
  std::optional<double> started_;
};

// One step = world ranks x batch_size rows x grad_accum_steps micro-batches = global_rows.
struct BatchPlan {
  int world = 0;
  int batch_size = 0;
  int grad_accum_steps = 0;
  int64_t global_rows = 0;
  bool exact = false;  // global_rows is the requested one
  std::string note;    // "global batch 24 -> 20 rows: 5 ranks x 4 x 1", or the exact plan and why
};

// Among worlds w in [min_ranks, min(max_ranks, usable_slots)], the largest w that divides global_rows, with
// the largest batch_size <= max_batch_size that divides global_rows / w (fewest accumulation steps). If no w
// in range divides it: the largest w, and the product batch_size x grad_accum_steps whose global batch is
// closest to global_rows (ties: the smaller), split with the largest batch_size again; exact = false.
// Unavailable when usable_slots < min_ranks; InvalidArgument for global_rows outside 1..INT32_MAX,
// max_batch_size < 1, min_ranks < 1, max_ranks < min_ranks or usable_slots < 0.
// world_multiple > 1 (a ZeRO shard_group_size): only multiples of it are worlds; Unavailable when
// none is in range.
StatusOr<BatchPlan> PlanBatch(int64_t global_rows, int max_batch_size, int min_ranks, int max_ranks,
                              int usable_slots, int world_multiple = 1);
// The hosts that run `world` ranks: usable hosts in order, each filled up to its slots; slots in the result
// are ranks placed. Hosts left without ranks are omitted; all of them if they hold fewer than `world` slots.
std::vector<HostEntry> AssignRanks(const std::vector<HostEntry>& usable, int world);

}  // namespace tf::launch
