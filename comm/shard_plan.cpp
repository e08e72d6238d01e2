#include "comm/shard_plan.h"

#include <algorithm>

namespace tf::comm {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

ShardPlan ShardPlan::Make(int64_t total, int world, int64_t max_chunk_elements) {
  ShardPlan p;
  p.total = std::max<int64_t>(total, 0);
  p.world = std::max(world, 1);
  const int64_t max_chunk = std::max<int64_t>(max_chunk_elements, 1);
  const int64_t per = CeilDiv(p.total, p.world);
  p.chunks_per_rank = std::max<int64_t>(1, CeilDiv(per, max_chunk));
  p.chunk_elements = std::max<int64_t>(16, CeilDiv(CeilDiv(per, p.chunks_per_rank), 16) * 16);
  p.shard_elements = p.chunks_per_rank * p.chunk_elements;
  return p;
}

int64_t ShardPlan::begin(int r) const { return std::min(static_cast<int64_t>(r) * shard_elements, total); }

int64_t ShardPlan::end(int r) const { return std::min(static_cast<int64_t>(r + 1) * shard_elements, total); }

int ShardPlan::Owner(int64_t element) const { return static_cast<int>(element / shard_elements); }

std::vector<int64_t> ShardPlan::Counts(int64_t b, int64_t e) const {
  std::vector<int64_t> counts(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    counts[static_cast<size_t>(r)] = std::max<int64_t>(0, std::min(e, end(r)) - std::max(b, begin(r)));
  }
  return counts;
}

int64_t ShardPlan::chunks() const { return CeilDiv(total, chunk_elements); }

}  // namespace tf::comm
