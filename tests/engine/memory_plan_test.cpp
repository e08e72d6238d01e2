// Tests for engine/memory_plan.h: the per-rank state bytes of ZeRO stages 0-3 on each device
// against hand-computed formulas for GPT-2 124M (2 and 4 ranks, and 5: a padded shard), the log
// line, the host budget read from /proc/meminfo, and CheckStateFits' refusals and suggestions.
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include "base/system_memory.h"
#include "model/parameters.h"

namespace tf {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

const GPT2Config k124M{.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024,
                       .padded_vocab_size = 50304};

// The message of a refusal; "" (and a failure) when `s` is not InvalidArgument.
std::string Refusal(const Status& s) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  return s.code() == StatusCode::kInvalidArgument ? s.message() : "";
}

int64_t Params(const GPT2Config& c) { return ParameterLayout(c).total(); }
int64_t ShardOf(int64_t n, int world) { return (n + world - 1) / world; }

// The working set by hand: wte (Vp, C) + wpe (T, C), ln_f (2C), two blocks of 12 C^2 + 13 C.
int64_t HandGathered(const GPT2Config& c) {
  const int64_t C = c.n_embd;
  return (c.padded_vocab_size + c.block_size) * C + 2 * C + 2 * (12 * C * C + 13 * C);
}

TEST(MemoryPlanTest, GatheredUnitsAreEmbeddingsLnfAndTwoBlocks) {
  const GPT2Config& c = k124M;
  EXPECT_EQ(GatheredUnitElements(c), HandGathered(c));
  EXPECT_EQ(GatheredUnitElements(c), 53'597'184);
  GPT2Config one = c;
  one.n_layer = 1;  // a single block: the working set is the whole model
  EXPECT_EQ(GatheredUnitElements(one), Params(one));
}

struct Expected {
  int64_t params, grads, master, moments, gathered;
};

void ExpectPlan(StateDevice device, int stage, int64_t shard, const Expected& e) {
  const GPT2Config& c = k124M;
  const int64_t acts = 96 * kMiB;
  const StateBytes b = PlanStateBytes(c, device, stage, shard, acts);
  SCOPED_TRACE(::testing::Message() << "device " << static_cast<int>(device) << " stage " << stage << " shard " << shard);
  EXPECT_EQ(b.params, e.params);
  EXPECT_EQ(b.grads, e.grads);
  EXPECT_EQ(b.master, e.master);
  EXPECT_EQ(b.moments, e.moments);
  EXPECT_EQ(b.gathered, e.gathered);
  EXPECT_EQ(b.activations, acts);
  EXPECT_EQ(b.total(), e.params + e.grads + e.master + e.moments + e.gathered + acts);
}

TEST(MemoryPlanTest, Fp32StagesFollowTheFormulas) {
  const GPT2Config& c = k124M;
  const int64_t n = Params(c), u = HandGathered(c);
  ASSERT_EQ(n, 124'475'904);
  for (StateDevice d : {StateDevice::kCpu, StateDevice::kCudaFp32}) {
    // Stage 0: 16 bytes per parameter; the shard is ignored.
    ExpectPlan(d, 0, 1, {4 * n, 4 * n, 0, 8 * n, 0});
    for (int w : {2, 4, 5}) {
      const int64_t s = ShardOf(n, w);
      ExpectPlan(d, 1, s, {4 * n, 4 * n, 0, 8 * s, 0});        // 8 + 8/W
      ExpectPlan(d, 2, s, {4 * n, 4 * s, 0, 8 * s, 4 * u});    // 4 + 12/W + gradient working set
      ExpectPlan(d, 3, s, {4 * s, 4 * s, 0, 8 * s, 8 * u});    // 16/W + gathered params and grads
    }
  }
  // W = 2: 124M's stage 1 state is exactly 8N + 8S with S = N/2 (N is even).
  const StateBytes s1 = PlanStateBytes(c, StateDevice::kCpu, 1, n / 2, 0);
  EXPECT_EQ(s1.total(), 8 * n + 8 * (n / 2));
  EXPECT_EQ(s1.total(), 1'493'710'848);
}

TEST(MemoryPlanTest, CudaBf16StagesFollowTheFormulas) {
  const GPT2Config& c = k124M;
  const int64_t n = Params(c), u = HandGathered(c);
  ExpectPlan(StateDevice::kCudaBf16, 0, 1, {2 * n, 2 * n, 4 * n, 8 * n, 0});  // 16N
  for (int w : {2, 4}) {
    const int64_t s = ShardOf(n, w);
    ExpectPlan(StateDevice::kCudaBf16, 1, s, {2 * n, 2 * n, 4 * s, 8 * s, 0});      // 4N + 12S
    ExpectPlan(StateDevice::kCudaBf16, 2, s, {2 * n, 2 * s, 4 * s, 8 * s, 2 * u});  // 2N + 14S
    ExpectPlan(StateDevice::kCudaBf16, 3, s, {2 * s, 2 * s, 4 * s, 8 * s, 4 * u});  // 16S
  }
}

TEST(MemoryPlanTest, DescribeNamesEachKindItsShareAndTheTotal) {
  const GPT2Config& c = k124M;
  const int64_t n = Params(c);
  const StateBytes s1 = PlanStateBytes(c, StateDevice::kCpu, 1, n / 2, 96 * kMiB);
  EXPECT_EQ(DescribeStateBytes(s1, 1, 2),
            "params 474.8 MiB, grads 474.8 MiB, moments 474.8 MiB (1/2), activations 96.0 MiB; 1.48 GiB per rank");
  const StateBytes s3 = PlanStateBytes(c, StateDevice::kCudaBf16, 3, n / 4, 96 * kMiB);
  EXPECT_EQ(DescribeStateBytes(s3, 3, 4),
            "params 59.4 MiB (1/4), grads 59.4 MiB (1/4), master 118.7 MiB (1/4), moments 237.4 MiB (1/4), "
            "gathered 204.5 MiB, activations 96.0 MiB; 775.3 MiB per rank");
  // One rank shards nothing: no shares.
  const StateBytes one = PlanStateBytes(c, StateDevice::kCpu, 2, n, 0);
  EXPECT_EQ(DescribeStateBytes(one, 2, 1), "params 474.8 MiB, grads 474.8 MiB, moments 949.7 MiB, gathered 204.5 MiB; "
                                           "2.05 GiB per rank");
}

TEST(MemoryPlanTest, HostBudgetIsAvailableHostMemory) {
  auto b = HostMemoryBudget(Env::Default(), 3);
  auto host = AvailableHostMemory(Env::Default());
  ASSERT_TRUE(b.ok() && host.ok()) << b.status().ToString();
  EXPECT_GT(b->available, 0);
  EXPECT_EQ(b->source, host->source);  // MemAvailable in /proc/meminfo, unless a cgroup limit is tighter
  EXPECT_EQ(b->ranks_here, 3);
}

// GPT-2 124M on the CPU, 4 ranks all on this host, 96 MiB of activations each: per rank
// stage 0 1.95 GiB, stage 1 1.25 GiB, stage 2 1.10 GiB, stage 3 979.8 MiB.
class CheckStateFitsTest : public ::testing::Test {
 protected:
  Status Check(int stage, int64_t available, int ranks_here = 4) const {
    const MemoryBudget budget{available, "MemAvailable in /proc/meminfo", ranks_here};
    return CheckStateFits(stage, 4, plan_, budget);
  }
  const GPT2Config c_ = k124M;
  const int64_t shard_ = ShardOf(Params(c_), 4);
  std::function<StateBytes(int)> plan_ = [this](int s) {
    return PlanStateBytes(c_, StateDevice::kCpu, s, shard_, 96 * kMiB);
  };
};

TEST_F(CheckStateFitsTest, FitsWithinTheMargin) {
  EXPECT_TRUE(Check(2, 5 * kGiB).ok());
  EXPECT_TRUE(Check(0, 9 * kGiB).ok());
  // The boundary: 95% of the budget, to the byte.
  auto flat = [](int) { return StateBytes{.params = 950}; };
  EXPECT_TRUE(CheckStateFits(0, 1, flat, MemoryBudget{1000, "test", 1}).ok());
  EXPECT_FALSE(CheckStateFits(0, 1, flat, MemoryBudget{999, "test", 1}).ok());
  EXPECT_TRUE(CheckStateFits(0, 1, flat, MemoryBudget{2000, "test", 2}).ok());
  EXPECT_FALSE(CheckStateFits(0, 1, flat, MemoryBudget{1999, "test", 2}).ok());
}

TEST_F(CheckStateFitsTest, RefusalNamesTheNumbersAndTheStageThatFits) {
  EXPECT_EQ(Refusal(Check(0, 5 * kGiB)),
            "zero_stage 0 needs 1.95 GiB per rank x 4 ranks on this host = 7.79 GiB (params 474.8 MiB, "
            "grads 474.8 MiB, moments 949.7 MiB, activations 96.0 MiB), but MemAvailable in /proc/meminfo is "
            "5.00 GiB (the state may use 95% of it, 4.75 GiB): zero_stage 2 (1.10 GiB per rank) would fit; "
            "or use fewer ranks per host or a smaller batch");
}

TEST_F(CheckStateFitsTest, NoStageFits) {
  EXPECT_EQ(Refusal(Check(1, 3 * kGiB)),
            "zero_stage 1 needs 1.25 GiB per rank x 4 ranks on this host = 5.01 GiB (params 474.8 MiB, "
            "grads 474.8 MiB, moments 237.4 MiB (1/4), activations 96.0 MiB), but MemAvailable in /proc/meminfo "
            "is 3.00 GiB (the state may use 95% of it, 2.85 GiB): no zero_stage fits (zero_stage 3 needs "
            "least, 979.8 MiB per rank): use more ranks to shard over, fewer ranks per host, a smaller batch or a "
            "smaller model");
  const std::string at3 = Refusal(Check(3, 3 * kGiB));
  EXPECT_NE(at3.find("(the state may use 95% of it, 2.85 GiB): use more ranks to shard over"), std::string::npos)
      << at3;
}

TEST_F(CheckStateFitsTest, SuggestsALowerStageWhenOnlyItFits) {
  // Stage 2's working set can outweigh its saving (few ranks, large embeddings).
  auto plan = [](int s) {
    constexpr int64_t kStageMiB[] = {1000, 600, 900, 700};
    return StateBytes{.params = kStageMiB[s] * kMiB};
  };
  const std::string m = Refusal(CheckStateFits(2, 2, plan, MemoryBudget{800 * kMiB, "test", 1}));
  EXPECT_NE(m.find(": zero_stage 1 (600.0 MiB per rank) would fit; or use a smaller batch"), std::string::npos) << m;
}

TEST_F(CheckStateFitsTest, OneGpuBudgetNamesNoHostRanks) {
  const int64_t shard = ShardOf(Params(c_), 2);
  auto plan = [&](int s) { return PlanStateBytes(c_, StateDevice::kCudaBf16, s, shard, 96 * kMiB); };
  EXPECT_EQ(Refusal(CheckStateFits(0, 2, plan, MemoryBudget{1600 * kMiB, "the free memory of GPU 0", 1})),
            "zero_stage 0 needs 1.95 GiB per rank (params 237.4 MiB, grads 237.4 MiB, master 474.8 MiB, "
            "moments 949.7 MiB, activations 96.0 MiB), but the free memory of GPU 0 is 1.56 GiB (the state may "
            "use 95% of it, 1.48 GiB): zero_stage 1 (1.25 GiB per rank) would fit; or use a smaller batch");
}

}  // namespace
}  // namespace tf
