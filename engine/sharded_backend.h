// The CPU backend under ZeRO stages 1-3 (docs/distributed.md, "ZeRO"): rank r of a group of G keeps
// the optimizer state of its shard only — the contiguous range [plan.begin(r), plan.end(r)) of the
// flat parameter buffer (comm/shard_plan.h) — and, from stage 2, only that shard of the reduced
// gradient, and at stage 3 only that shard of the parameters:
//   stage 1  the model as at stage 0 (whole parameters and gradients); as backward of the step's
//            last micro-batch finishes each unit (the grad-ready hook, through the ShardSync the
//            trainer takes), a communication thread reduce-scatters that unit's gradient to its
//            owners, in place; AdamW updates the shard; the parameters are all-gathered.
//   stage 2  the model runs on external unit storage (model/gpt2.h UnitStorage): the parameters
//            stay whole, but each unit's gradient lives in a transient buffer that is
//            reduce-scattered into the owners' shards as soon as backward finishes it (on the
//            communication thread, overlapping the rest of backward) and then reused.
//   stage 3  as stage 2, and the parameters too are only the shard: each unit is all-gathered
//            just before the model uses it (the next one prefetched while the current one
//            computes) and dropped after; wte+wpe and ln_f stay gathered for the whole step.
// Replica groups (shard_group_size G < W): the plan is over G ranks and every collective above runs
// within the group; each reduce-scattered piece is then summed across the W/G groups
// (comm::AllReduceSumIdentical), so every group holds the same bits. Without groups the second
// communicator has one rank and that step is a no-op.
// Every stage computes the global gradient norm as the sum over the group, in rank order, of each
// rank's sum of squares over its plan range — as stage 0 does with a plan (PlannedSumSquares) — so
// with the exact reduction (comm/communicator.h: rank-order sums) all stages produce the same bits.
//
// Collectives: GetParams and GetOptimizerState (the whole state, gathered within the group) are
// collective at every sharded stage; every rank must call them. Thread safety: one thread drives
// the backend; its communicators are used by its own communication thread during forward/backward
// and the reduction, and by the driving thread otherwise.
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

// A ZeRO stage 1-3 CPU backend for rank `group->rank()` of the plan's world. `group` spans the
// plan's ranks (this rank's replica group), `across` the ranks with the same index in the other
// groups (one rank without groups); the backend owns both. Collective (every rank creates one).
StatusOr<std::unique_ptr<TrainBackend>> MakeShardedCpuBackend(const GPT2Config& model, const TrainConfig& train,
                                                              const AdamWConfig& adamw, const comm::ShardPlan& plan,
                                                              std::unique_ptr<comm::Communicator> group,
                                                              std::unique_ptr<comm::Communicator> across);

// How a run's flat state is owned over `world` ranks (a replica group's under shard_group_size): chunks of at most checkpoint_chunk_mb, so
// each rank's checkpoint part is exactly its shard (at stage 0 too: every rank writes that range).
comm::ShardPlan TrainShardPlan(const GPT2Config& model, const TrainConfig& train, int world);

// The sum of squares of a whole gradient buffer as the sharded stages compute it: each plan range's
// sum (cpu::sum_squares), added in rank order. One range (world 1): cpu::sum_squares itself.
double PlannedSumSquares(const float* grads, const comm::ShardPlan& plan);

}  // namespace tf
