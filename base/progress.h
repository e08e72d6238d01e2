// What this process is doing, for the supervisor's heartbeats (launch/rank_agent.h): the phase of
// the training loop, the steps completed, a progress counter that moves whenever work inside a
// phase advances (a micro-batch, a gradient bucket, a checkpoint chunk), and the newest committed
// checkpoint. A phase whose counter stops moving for longer than its timeout is a hang.
//
// Also the abort request: the supervisor (or a failed peer) has given up on the job, so every wait
// for other ranks (comm/ collectives) returns Unavailable with the reason instead of waiting on.
//
// Thread safety: lock-free atomics; any thread may set and read. The reason is written once.
#pragma once
#include <cstdint>
#include <string>

namespace tf {

enum class Phase : int {
  kStartup = 0,   // process start to the first step: launcher, process group, data, weights, resume
  kData,          // reading a micro-batch
  kCompute,       // forward and backward
  kCommunication, // waiting for the other ranks (gradients, the step's reduction, barriers)
  kOptimizer,     // the update
  kCheckpoint,    // taking, writing or committing a checkpoint on the training thread
  kEval,          // evaluation
  kSample,        // sampling text
  kFinishing,     // writing the outputs
  kRescue,        // saving the state after a failure (launch/rank_agent.h)
};
inline constexpr int kNumPhases = 10;
const char* PhaseName(Phase p);
// "communication" -> kCommunication; false when unknown.
bool ParsePhase(const std::string& name, Phase* out);

struct ProgressSnapshot {
  Phase phase = Phase::kStartup;
  int64_t step = 0;                  // optimizer steps completed
  uint64_t progress = 0;             // moves with any advance (and every phase change)
  int64_t checkpoint_step = -1;      // newest committed checkpoint known to this process
  double step_time = 0;              // when `step` was reached (Unix seconds; 0: not yet)
  int64_t start_step = -1;           // where this process's training loop began (-1: not yet)
  double first_step_time = 0;        // when its first step completed (Unix seconds; 0: not yet)
  int64_t checkpoint_bytes = 0;      // bytes this process's checkpointers stored (resource accounting)
};

void SetPhase(Phase p);             // also advances the counter
void SetStepsDone(int64_t step);  // also records the time
void AdvanceProgress();
void SetStartStep(int64_t step);  // the training loop begins at `step` (after any resume)
void SetCommittedCheckpoint(int64_t step);
void AddCheckpointBytes(int64_t bytes);  // a checkpoint part of this process was stored
// Where this process serves its metrics ("" = nowhere): the supervisor lists it for the job's owner.
void SetMetricsUrl(const std::string& url);
std::string MetricsUrl();
ProgressSnapshot ReadProgress();

// Every wait for peers gives up from now on, saying `reason`. The first reason is kept.
void RequestAbort(const std::string& reason);
bool AbortRequested();
std::string AbortReason();
void ClearAbortRequest();  // tests

}  // namespace tf
