// ShardPlan (comm/shard_plan.h): the ranges tile the buffer, every rank but the last ones owns a
// full shard, shards are whole chunks, chunks respect the cap, and Counts/Owner agree with the
// ranges — for empty, tiny, odd and GPT-2-124M-sized buffers, worlds 1..9 and several chunk caps.
#include "comm/shard_plan.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include <gtest/gtest.h>

namespace tf::comm {
namespace {

constexpr int64_t kGpt2Small = 124439808;  // GPT-2 124M parameters

int64_t RoundUp16(int64_t x) { return (x + 15) / 16 * 16; }

// Checks Counts(b, e) against the ranges, and against Owner on small buffers.
void ExpectCounts(const ShardPlan& p, int64_t b, int64_t e) {
  const std::vector<int64_t> c = p.Counts(b, e);
  ASSERT_EQ(static_cast<int>(c.size()), p.world);
  EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), e - b) << "[" << b << ", " << e << ")";
  for (int r = 0; r < p.world; ++r) {
    const int64_t want = std::max<int64_t>(0, std::min(e, p.end(r)) - std::max(b, p.begin(r)));
    ASSERT_EQ(c[static_cast<size_t>(r)], want) << "rank " << r << " of [" << b << ", " << e << ")";
  }
  if (e - b <= 2000) {
    std::vector<int64_t> by_owner(static_cast<size_t>(p.world));
    for (int64_t i = b; i < e; ++i) by_owner[static_cast<size_t>(p.Owner(i))]++;
    EXPECT_EQ(by_owner, c) << "[" << b << ", " << e << ")";
  }
}

TEST(ShardPlanTest, PropertiesForEveryTotalWorldAndChunkCap) {
  for (int64_t total : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1000}, kGpt2Small}) {
    for (int world = 1; world <= 9; ++world) {
      for (int64_t max_chunk : {int64_t{1}, int64_t{16}, int64_t{17}, int64_t{100}, int64_t{1} << 20, int64_t{1} << 30}) {
        SCOPED_TRACE("total " + std::to_string(total) + " world " + std::to_string(world) + " max_chunk " +
                     std::to_string(max_chunk));
        const ShardPlan p = ShardPlan::Make(total, world, max_chunk);
        EXPECT_EQ(p.total, total);
        EXPECT_EQ(p.world, world);
        // Chunks: multiples of 16, within the cap, and the shard is whole chunks.
        ASSERT_GT(p.chunk_elements, 0);
        EXPECT_EQ(p.chunk_elements % 16, 0);
        EXPECT_LE(p.chunk_elements, RoundUp16(max_chunk));
        EXPECT_GE(p.chunks_per_rank, 1);
        EXPECT_EQ(p.shard_elements, p.chunks_per_rank * p.chunk_elements);
        // Padding is bounded: a shard exceeds ceil(total / world) by less than 17 per chunk.
        const int64_t per = (total + world - 1) / world;
        EXPECT_GE(p.shard_elements, per);
        EXPECT_LT(p.shard_elements, per + 17 * p.chunks_per_rank);
        // Ranges tile [0, total) in rank order; full shards first, then one partial, then empty.
        EXPECT_EQ(p.begin(0), 0);
        EXPECT_EQ(p.end(world - 1), total);
        bool short_seen = false;
        for (int r = 0; r < world; ++r) {
          ASSERT_LE(p.begin(r), p.end(r));
          if (r > 0) {
            ASSERT_EQ(p.begin(r), p.end(r - 1));
          }
          EXPECT_EQ(p.size(r), p.end(r) - p.begin(r));
          // Aligned to a chunk (ranks past the data own nothing and start at the end).
          EXPECT_TRUE(p.begin(r) % p.chunk_elements == 0 || p.begin(r) == total) << "rank " << r;
          EXPECT_LE(p.size(r), p.shard_elements);
          if (short_seen) {
            EXPECT_EQ(p.size(r), 0) << "rank " << r;
          }
          if (p.size(r) < p.shard_elements) short_seen = true;
        }
        EXPECT_EQ(p.chunks(), (total + p.chunk_elements - 1) / p.chunk_elements);
        // Owner: every element of a small buffer, and the edges of each range of a large one.
        if (total <= 1000) {
          for (int64_t i = 0; i < total; ++i) {
            const int o = p.Owner(i);
            ASSERT_TRUE(o >= 0 && o < world && p.begin(o) <= i && i < p.end(o)) << "element " << i;
          }
        } else {
          for (int r = 0; r < world; ++r) {
            if (p.size(r) == 0) continue;
            EXPECT_EQ(p.Owner(p.begin(r)), r);
            EXPECT_EQ(p.Owner(p.end(r) - 1), r);
          }
        }
        // Counts: the whole buffer gives the sizes; empty ranges give zeros; random ranges agree.
        std::vector<int64_t> sizes(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) sizes[static_cast<size_t>(r)] = p.size(r);
        EXPECT_EQ(p.Counts(0, total), sizes);
        EXPECT_EQ(p.Counts(total, total), std::vector<int64_t>(static_cast<size_t>(world), 0));
        std::mt19937_64 g(static_cast<uint64_t>(total * 131 + world * 7 + max_chunk));
        for (int k = 0; k < 20 && total > 0; ++k) {
          int64_t b = static_cast<int64_t>(g() % static_cast<uint64_t>(total + 1));
          int64_t e = static_cast<int64_t>(g() % static_cast<uint64_t>(total + 1));
          if (b > e) std::swap(b, e);
          ExpectCounts(p, b, std::min(e, b + 1500 + static_cast<int64_t>(g() % 2) * total));
        }
      }
    }
  }
}

TEST(ShardPlanTest, WorldOneOwnsEverythingInChunksWithinTheCap) {
  const ShardPlan p = ShardPlan::Make(kGpt2Small, 1, int64_t{1} << 22);
  EXPECT_EQ(p.begin(0), 0);
  EXPECT_EQ(p.end(0), kGpt2Small);
  EXPECT_EQ(p.chunks_per_rank, 30);  // ceil(124439808 / 4194304)
  EXPECT_EQ(p.chunk_elements, 4148000);  // round_up(ceil(124439808 / 30), 16)
  EXPECT_EQ(p.chunks(), 30);
}

TEST(ShardPlanTest, MatchesTheRuleOnAWorkedExample) {
  // per = ceil(1000 / 3) = 334; k = ceil(334 / 100) = 4; chunk = round_up(ceil(334 / 4), 16) = 96.
  const ShardPlan p = ShardPlan::Make(1000, 3, 100);
  EXPECT_EQ(p.chunks_per_rank, 4);
  EXPECT_EQ(p.chunk_elements, 96);
  EXPECT_EQ(p.shard_elements, 384);
  EXPECT_EQ(p.begin(1), 384);
  EXPECT_EQ(p.begin(2), 768);
  EXPECT_EQ(p.size(2), 232);
  EXPECT_EQ(p.Counts(300, 800), (std::vector<int64_t>{84, 384, 32}));
  EXPECT_EQ(p.Owner(383), 0);
  EXPECT_EQ(p.Owner(384), 1);
  EXPECT_EQ(p.chunks(), 11);
  // More ranks than chunks of data: the last ranks own nothing.
  const ShardPlan q = ShardPlan::Make(17, 9, 1 << 20);
  EXPECT_EQ(q.chunk_elements, 16);
  EXPECT_EQ(q.size(0), 16);
  EXPECT_EQ(q.size(1), 1);
  for (int r = 2; r < 9; ++r) EXPECT_EQ(q.size(r), 0);
}

}  // namespace
}  // namespace tf::comm
