// The CPU backend under ZeRO stages 1-3 (docs/distributed.md, "ZeRO"): rank r of W keeps the
// optimizer state of its shard only — the contiguous range [plan.begin(r), plan.end(r)) of the flat
// parameter buffer (comm/shard_plan.h) — and, from stage 2, only that shard of the reduced
// gradient, and at stage 3 only that shard of the parameters:
//   stage 1  the model as at stage 0 (whole parameters and gradients); the trainer's reducer
//            reduce-scatters the gradient to its owners (no all-gather); AdamW updates the shard;
//            the parameters are all-gathered.
//   stage 2  the model runs on external unit storage (model/gpt2.h UnitStorage): the parameters
//            stay whole, but each unit's gradient lives in a transient buffer that is
//            reduce-scattered into the owners' shards as soon as backward finishes it (on a
//            communication thread, overlapping the rest of backward) and then reused.
//   stage 3  as stage 2, and the parameters too are only the shard: each unit is all-gathered
//            just before the model uses it (the next one prefetched while the current one
//            computes) and dropped after; wte+wpe and ln_f stay gathered for the whole step.
// Every stage computes the global gradient norm as the sum over ranks, in rank order, of each
// rank's sum of squares over its plan range — as stage 0 does with a plan (PlannedSumSquares) — so
// with the exact reduction (comm/communicator.h: rank-order sums) all stages produce the same bits.
//
// Collectives: GetParams and GetOptimizerState (the whole state, gathered) are collective at every
// sharded stage; every rank must call them. Thread safety: one thread drives the backend; its
// communicator is used by its own communication thread during forward/backward and by the driving
// thread otherwise.
#pragma once
#include <memory>

#include "base/status.h"
#include "comm/communicator.h"
#include "comm/shard_plan.h"
#include "engine/train_backend.h"
#include "engine/train_config.h"
#include "kernels/optimizer.h"
#include "model/config.h"

namespace tf {

// A ZeRO stage 1-3 CPU backend for rank `comm->rank()` of the plan's world. `comm` must span the
// plan's ranks; the backend owns it. Collective (every rank creates one).
StatusOr<std::unique_ptr<TrainBackend>> MakeShardedCpuBackend(const GPT2Config& model, const TrainConfig& train,
                                                              const AdamWConfig& adamw, const comm::ShardPlan& plan,
                                                              std::unique_ptr<comm::Communicator> comm);

// How a run's flat state is owned over `world` ranks: chunks of at most checkpoint_chunk_mb, so
// each rank's checkpoint part is exactly its shard (at stage 0 too: every rank writes that range).
comm::ShardPlan TrainShardPlan(const GPT2Config& model, const TrainConfig& train, int world);

// The sum of squares of a whole gradient buffer as the sharded stages compute it: each plan range's
// sum (cpu::sum_squares), added in rank order. One range (world 1): cpu::sum_squares itself.
double PlannedSumSquares(const float* grads, const comm::ShardPlan& plan);

}  // namespace tf
