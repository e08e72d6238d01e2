// Memory planning for sharded data parallelism (ZeRO stages 0-3): the bytes of each kind of
// training state one rank holds, how they read in a log line, and the start-up check that refuses
// a configuration whose state will not fit the host's memory (CPU ranks) or the GPU's, naming the
// numbers and the stage that would fit, instead of an OOM kill mid-run. Pure functions but
// HostMemoryBudget, which reads the host's memory through Env; thread-safe.
//
// Per rank, with N parameters (ParameterLayout(model).total()) and S = this rank's shard in
// elements (padding included; from the shard plan): stage 0 holds everything; stage 1 shards the
// master weights and both AdamW moments (S each); stage 2 also the gradients, keeping a transient
// full gradient of the units being reduced ("gathered"); stage 3 also the parameters, keeping the
// parameters and gradients of the gathered units. A unit is wte+wpe, one block, or ln_f; the
// working set is wte+wpe, ln_f and two blocks (one computed, one reduced or prefetched).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "base/env.h"
#include "base/status.h"
#include "model/config.h"

namespace tf {

// Bytes one rank holds, by kind.
struct StateBytes {
  int64_t params = 0;       // the parameters the forward pass reads (bf16 copy on CUDA bf16)
  int64_t grads = 0;
  int64_t master = 0;       // fp32 master weights (CUDA bf16 only: elsewhere params are the master)
  int64_t moments = 0;      // AdamW m and v, fp32
  int64_t gathered = 0;     // stage 2: transient gradients; stage 3: gathered parameters + gradients
  int64_t activations = 0;  // the model's activation plan, as the caller passed it
  int64_t total() const { return params + grads + master + moments + gathered + activations; }
};

// How a rank stores its state: the CPU backend (fp32), the CUDA backend in bf16 (bf16 parameters
// and gradients, fp32 master weights and moments) or in fp32 (like the CPU).
enum class StateDevice { kCpu, kCudaBf16, kCudaFp32 };

// Elements of the working set of stages 2 and 3: wte+wpe, ln_f and the two largest blocks (one
// block when the model has one). REQUIRES (here and below): ValidateConfig(model) ok.
int64_t GatheredUnitElements(const GPT2Config& model);

// The state of one rank at `zero_stage`. activation_bytes: the model's activation plan (CPU:
// GPT2::activation_bytes(); CUDA: the model's own plan), carried into the total.
// REQUIRES: 0 <= zero_stage <= 3; shard_elements > 0 when zero_stage > 0 (ignored at stage 0).
StateBytes PlanStateBytes(const GPT2Config& model, StateDevice device, int zero_stage, int64_t shard_elements,
                          int64_t activation_bytes);

// "params 474.8 MiB, grads 474.8 MiB, moments 237.4 MiB (1/2), activations 96.0 MiB; 1.25 GiB per
// rank": the kinds that are not empty, those sharded at `zero_stage` marked with their share when
// shard_world > 1, and the total (IEC units, base/format.h).
std::string DescribeStateBytes(const StateBytes& bytes, int zero_stage, int shard_world);

// Memory the state of this host's (or this GPU's) ranks draws on.
struct MemoryBudget {
  int64_t available = 0;  // bytes a new allocation can get
  std::string source;     // where `available` was read, for messages: "MemAvailable in /proc/meminfo"
  int ranks_here = 1;     // ranks drawing on it: the ranks on this host for host memory, 1 for a GPU
};

// The host's budget, shared by `ranks_here`: MemAvailable, or the room under this process's cgroup
// memory limit when that is less (AvailableHostMemory, base/system_memory.h).
StatusOr<MemoryBudget> HostMemoryBudget(Env* env, int ranks_here);

// The state may use this share of the budget; the rest is left to what no plan counts (the
// allocator's overhead, communication buffers, checkpoint snapshots, the process itself).
inline constexpr int kStateBudgetPercent = 95;

// OK when ranks_here x plan_for_stage(zero_stage).total() fits kStateBudgetPercent of
// budget.available. Otherwise InvalidArgument naming the bytes per rank and per kind, the ranks,
// the budget and its source, and the lowest other stage that would fit (or that none does, naming
// the stage that needs least: then more ranks to shard over, fewer ranks per host or a smaller
// batch or model).
// plan_for_stage(s): the rank's state at stage s (PlanStateBytes with the same model, device, shard
// and activations). REQUIRES: 0 <= zero_stage <= 3; shard_world >= 1; budget.ranks_here >= 1.
Status CheckStateFits(int zero_stage, int shard_world, const std::function<StateBytes(int)>& plan_for_stage,
                      const MemoryBudget& budget);

}  // namespace tf
