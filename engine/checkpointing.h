// Checkpoints of a training run: the engine side of checkpoint/checkpointer.h (docs/checkpoints.md).
//
// What: the TrainState (engine/train_state.h) — tensors "params", "adam.m", "adam.v" (every rank
// holds them; each writes ~1/W of the chunks) and, with a lossy gradient codec, every rank's
// error-feedback residuals "ef.residual.rR" and "ef.server.rR" (written by rank R); the rest (step,
// data position, seeds, configs and fingerprints, codec, world size) in the manifest's "state".
//
// When: after every checkpoint_interval-th step, when checkpoint_every_s seconds have passed on
// rank 0's clock, and at the end of a run or a stop (SIGTERM/SIGINT, stop_at_step). Ranks agree
// without an extra collective: three numbers ride on the step's loss reduction (Contribute /
// AfterStep) — rank 0's "time is up", "some rank has no free buffer half" (then all skip, or all
// wait), and "my part of the oldest uncommitted checkpoint is written" (when all say so, rank 0
// commits it).
//
// Resume (ResumeFromCheckpoint): "auto" takes the newest checkpoint in checkpoint_dir that loads
// and verifies, reporting the newer ones it skipped and why; a location loads that one or fails.
// Any world size loads any checkpoint with the same global batch (ranks x batch_size x
// grad_accum_steps rows per step): the data position counts rows. Error-feedback residuals at
// another world size: every new rank's worker residual is the mean of the old ranks' (so the
// correction still owed to the averaged gradient is unchanged) and the server residuals, disjoint
// shards of one tensor, are summed and each new rank keeps its own shards.
//
// Thread safety: the training thread only.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "base/status.h"
#include "checkpoint/checkpointer.h"

namespace tf {

class Trainer;
struct StepStats;

class TrainCheckpointing {
 public:
  static constexpr int kSlots = 3;  // numbers added to the step's reduction
  // nullptr when the run has no checkpoint_dir.
  static StatusOr<std::unique_ptr<TrainCheckpointing>> Create(Trainer& trainer);

  // This rank's kSlots numbers for the step's sum over ranks.
  void Contribute(double* slots);
  // After step `stats.step`'s reduction (`reduced`: the sums): commits, snapshots when due.
  // Records the training stall in stats.checkpoint_stall_ms. Errors are only programming errors:
  // storage failures are logged and counted.
  Status AfterStep(const double* reduced, StepStats& stats);
  // End of the run (or a stop) at step `step`: a final checkpoint unless the newest is of this step,
  // written and committed before returning. Returns whether it was committed.
  StatusOr<bool> Finish(int64_t step);
  // Waits for this rank's checkpoint parts in flight and commits every checkpoint begun whose parts
  // all ranks wrote (a failed one stays uncommitted, logged). Collective: every rank calls it.
  Status CommitPending();

  const checkpoint::CheckpointerStats stats() const { return ckpt_->stats(); }

  // After a failure that left this rank's state whole at trainer step() (docs/fault-tolerance.md
  // "Rescue"): writes the whole state as a checkpoint of that step by this rank alone, under object
  // names of its own, without committing it (the supervisor first compares the state's hash with a
  // second survivor's). `already`: a checkpoint of this step is committed, nothing was written.
  // FailedPrecondition when the state cannot be rescued (a lossy codec's error feedback, which a
  // failure inside the reduction may have half updated). No collectives.
  struct Rescue {
    int64_t step = -1;
    std::string hash;
    bool already = false;
  };
  StatusOr<Rescue> RescueWrite();
  // Commits what RescueWrite wrote.
  Status RescueCommit();
  // Deletes what RescueWrite wrote, uncommitted (the supervisor's cross-check failed), so it can be
  // neither committed nor loaded. OK when nothing was written; Internal after RescueCommit.
  Status RescueDiscard();

 private:
  explicit TrainCheckpointing(Trainer& trainer) : trainer_(trainer) {}
  Status Take(int64_t step, double* stall_ms, bool always = false);

  Trainer& trainer_;
  std::unique_ptr<checkpoint::Checkpointer> ckpt_;
  std::unique_ptr<checkpoint::Checkpointer> rescue_;  // RescueWrite's one-off writer
  int64_t rescue_step_ = -1;        // the step RescueWrite wrote (-1: none, or discarded)
  bool rescue_committed_ = false;
  std::deque<int64_t> uncommitted_;  // several ranks: begun, not yet committed (same on every rank)
  int64_t last_begun_ = -1;
  double last_time_ = 0;  // rank 0: steady clock of the last checkpoint (or the start)
  int64_t reported_ = 0;  // rank 0: committed checkpoints already reported
  int64_t skipped_ = 0;   // checkpoints skipped because every rank's halves were busy
};

// Loads the checkpoint the run's `resume` key selects into the trainer. Returns a line saying what
// it resumed from ("" when it started fresh). Errors name the checkpoint and the problem.
// `step`: set to the step resumed when the checkpoint is in the run's own checkpoint_dir.
// `before_step` >= 0: only checkpoints of earlier steps (a rollback). `loaded`: the step loaded,
// wherever it came from (-1 untouched when none).
// XXH64 of the state that defines the trajectory (parameters, moments, step, data position) as
// 16 hex digits: equal on every rank of a data-parallel job after each step.
StatusOr<std::string> StateHash(Trainer& trainer);

StatusOr<std::string> ResumeFromCheckpoint(Trainer& trainer, int64_t* step, int64_t before_step = -1,
                                           int64_t* loaded = nullptr);

}  // namespace tf
