#include "engine/memory_plan.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/format.h"
#include "base/system_memory.h"
#include "model/parameters.h"

namespace tf {
namespace {

constexpr int kMaxStage = 3;

// Bytes per element of each kind before sharding.
struct ElementBytes {
  int64_t params, grads, master, moments;
};

ElementBytes BytesPerElement(StateDevice device) {
  switch (device) {
    case StateDevice::kCudaBf16:
      return {2, 2, 4, 8};
    case StateDevice::kCpu:
    case StateDevice::kCudaFp32:
      break;
  }
  return {4, 4, 0, 8};
}

// The kinds that sharding splits, and the first stage that shards each.
enum ShardedKind { kParams, kGrads, kMaster, kMoments };
constexpr int kShardedFrom[] = {3, 2, 1, 1};

std::string Kinds(const StateBytes& b, int zero_stage, int shard_world) {
  struct Kind {
    const char* name;
    int64_t bytes;
    bool sharded;
  };
  const bool sharding = shard_world > 1;
  const Kind kinds[] = {
      {"params", b.params, sharding && zero_stage >= kShardedFrom[kParams]},
      {"grads", b.grads, sharding && zero_stage >= kShardedFrom[kGrads]},
      {"master", b.master, sharding && zero_stage >= kShardedFrom[kMaster]},
      {"moments", b.moments, sharding && zero_stage >= kShardedFrom[kMoments]},
      {"gathered", b.gathered, false},
      {"activations", b.activations, false},
  };
  std::string out;
  for (const Kind& k : kinds) {
    if (k.bytes == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", k.name, FormatBytes(static_cast<uint64_t>(k.bytes)));
    if (k.sharded) out += fmt::format(" (1/{})", shard_world);
  }
  return out;
}

std::string PerRank(const StateBytes& b) { return FormatBytes(static_cast<uint64_t>(b.total())); }

int64_t GatheredUnitElements(const ParameterLayout& layout) {
  const int n_layer = layout.n_layer();
  std::vector<int64_t> blocks;
  for (int l = 0; l < n_layer; ++l) blocks.push_back(layout.LayerEnd(l) - layout.LayerBegin(l));
  std::sort(blocks.begin(), blocks.end(), std::greater<>());
  const int64_t embeddings = layout.LayerBegin(0);
  const int64_t ln_f = layout.total() - layout.LayerEnd(n_layer - 1);
  return embeddings + ln_f + blocks[0] + (n_layer > 1 ? blocks[1] : 0);
}

}  // namespace

int64_t GatheredUnitElements(const GPT2Config& model) { return GatheredUnitElements(ParameterLayout(model)); }

StateBytes PlanStateBytes(const GPT2Config& model, StateDevice device, int zero_stage, int64_t shard_elements,
                          int64_t activation_bytes) {
  assert(zero_stage >= 0 && zero_stage <= kMaxStage);
  assert(zero_stage == 0 || shard_elements > 0);
  const ParameterLayout layout(model);
  const ElementBytes e = BytesPerElement(device);
  auto held = [&](ShardedKind kind) { return zero_stage >= kShardedFrom[kind] ? shard_elements : layout.total(); };
  StateBytes b;
  b.params = e.params * held(kParams);
  b.grads = e.grads * held(kGrads);
  b.master = e.master * held(kMaster);
  b.moments = e.moments * held(kMoments);
  if (zero_stage == 2) b.gathered = e.grads * GatheredUnitElements(layout);
  if (zero_stage == 3) b.gathered = (e.params + e.grads) * GatheredUnitElements(layout);
  b.activations = activation_bytes;
  return b;
}

std::string DescribeStateBytes(const StateBytes& bytes, int zero_stage, int shard_world) {
  return fmt::format("{}; {} per rank", Kinds(bytes, zero_stage, shard_world), PerRank(bytes));
}

StatusOr<MemoryBudget> HostMemoryBudget(Env* env, int ranks_here) {
  TF_ASSIGN_OR_RETURN(HostMemory host, AvailableHostMemory(env));
  return MemoryBudget{host.available, std::move(host.source), ranks_here};
}

Status CheckStateFits(int zero_stage, int shard_world, const std::function<StateBytes(int)>& plan_for_stage,
                      const MemoryBudget& budget) {
  assert(zero_stage >= 0 && zero_stage <= kMaxStage);
  assert(shard_world >= 1 && budget.ranks_here >= 1);
  const int64_t available = std::max<int64_t>(budget.available, 0);
  const int64_t usable = available / 100 * kStateBudgetPercent + available % 100 * kStateBudgetPercent / 100;
  auto fits = [&](const StateBytes& b) { return b.total() * budget.ranks_here <= usable; };
  const StateBytes here = plan_for_stage(zero_stage);
  if (fits(here)) return Status::OK();

  const bool shared = budget.ranks_here > 1;
  std::string need = fmt::format("zero_stage {} needs {} per rank", zero_stage, PerRank(here));
  if (shared) {
    need += fmt::format(" x {} ranks on this host = {}", budget.ranks_here,
                        FormatBytes(static_cast<uint64_t>(here.total() * budget.ranks_here)));
  }
  // The lowest other stage that fits (it communicates least), else the stage that needs least.
  int fitting = -1, smallest = zero_stage;
  StateBytes fitting_bytes, smallest_bytes = here;
  for (int s = 0; s <= kMaxStage; ++s) {
    if (s == zero_stage) continue;
    const StateBytes b = plan_for_stage(s);
    if (fitting < 0 && fits(b)) fitting = s, fitting_bytes = b;
    if (b.total() < smallest_bytes.total()) smallest = s, smallest_bytes = b;
  }
  std::string advice;
  if (fitting >= 0) {
    advice = fmt::format("zero_stage {} ({} per rank) would fit; or use {}a smaller batch", fitting,
                         PerRank(fitting_bytes), shared ? "fewer ranks per host or " : "");
  } else {
    if (smallest != zero_stage) {
      advice = fmt::format("no zero_stage fits (zero_stage {} needs least, {} per rank): ", smallest,
                           PerRank(smallest_bytes));
    }
    advice += fmt::format("use more ranks to shard over, {}a smaller batch or a smaller model",
                          shared ? "fewer ranks per host, " : "");
  }
  return Status::InvalidArgument("{} ({}), but {} is {} (the state may use {}% of it, {}): {}", need,
                                 Kinds(here, zero_stage, shard_world), budget.source,
                                 FormatBytes(static_cast<uint64_t>(available)), kStateBudgetPercent,
                                 FormatBytes(static_cast<uint64_t>(usable)), advice);
}

}  // namespace tf
