// ShardPlan: who owns which elements of a flat buffer under ZeRO sharding. Rank r of `world` owns
// the contiguous range [begin(r), end(r)) (the flat partition DeepSpeed uses), so a rank's shard of
// the parameters, gradients and optimizer state is one slice of each flat buffer.
//
// Every rank owns shard_elements = chunks_per_rank * chunk_elements elements except the last ones,
// which own fewer or none: the buffer is padded internally, so any total and any world work (no
// divisibility needed; world 1 owns everything). chunk_elements is a multiple of 16 (64-byte lines)
// and at most max_chunk_elements rounded up to 16; checkpoints cut tensors into these chunks, so
// each rank writes exactly the chunks it owns. The rule, with per = ceil(total / world):
//   chunks_per_rank = max(1, ceil(per / max_chunk)), chunk_elements = max(16, round_up(ceil(per /
//   chunks_per_rank), 16)), begin(r) = min(r * shard_elements, total).
// A plain value, pure functions of (total, world, max_chunk_elements): every rank computes the same.
#pragma once
#include <cstdint>
#include <vector>

namespace tf::comm {

struct ShardPlan {
  // REQUIRES: total >= 0, world >= 1, max_chunk_elements >= 1.
  static ShardPlan Make(int64_t total, int world, int64_t max_chunk_elements);

  int64_t total = 0;
  int world = 1;
  int64_t chunk_elements = 0, chunks_per_rank = 0, shard_elements = 0;

  // REQUIRES: 0 <= r < world.
  int64_t begin(int r) const;
  int64_t end(int r) const;
  int64_t size(int r) const { return end(r) - begin(r); }
  // The rank that owns `element`. REQUIRES: 0 <= element < total.
  int Owner(int64_t element) const;
  // counts[r] = the number of elements of [b, e) rank r owns, in rank order (the counts of a
  // ReduceScatterSum / AllGatherV of that contiguous range). REQUIRES: 0 <= b <= e <= total.
  std::vector<int64_t> Counts(int64_t b, int64_t e) const;
  // ceil(total / chunk_elements): the number of chunks the buffer is cut into.
  int64_t chunks() const;

  bool operator==(const ShardPlan&) const = default;
};

}  // namespace tf::comm
