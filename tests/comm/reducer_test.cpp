// Single-process parts of the data-parallel machinery: bucket planning, the reducer's contract on
// a 1-rank communicator (exact codec leaves gradients unchanged; lossy codecs keep the
// error-feedback invariant), bootstrap without a launcher, and the SingleProcessCommunicator.
// The multi-rank behaviour is tested under mpirun in comm_mpi_test.cpp.
#include <cstdlib>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "comm/auto_codec.h"
#include "comm/communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "model/config.h"
#include "model/parameters.h"

namespace tf::comm {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// Descending adjacent ranges of the given sizes, the way backward announces them.
Ranges DescendingRanges(const std::vector<int64_t>& sizes_last_first) {
  int64_t total = std::accumulate(sizes_last_first.begin(), sizes_last_first.end(), int64_t{0});
  Ranges r;
  for (int64_t s : sizes_last_first) {
    r.emplace_back(total - s, total);
    total -= s;
  }
  return r;
}

void ExpectTiles(const std::vector<Bucket>& buckets, int64_t n) {
  std::vector<int> covered(static_cast<size_t>(n), 0);
  for (const Bucket& b : buckets) {
    ASSERT_LT(b.begin, b.end);
    for (int64_t i = b.begin; i < b.end; ++i) covered[static_cast<size_t>(i)]++;
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(covered[static_cast<size_t>(i)], 1) << "element " << i;
}

TEST(PlanBuckets, TilesAndRespectsCapsFirstBucketSmaller) {
  const Ranges ranges = DescendingRanges({7, 300, 300, 300, 300, 1000, 5});
  const int64_t n = 7 + 4 * 300 + 1000 + 5;
  // Caps in bytes: first bucket 100 floats, the rest 400 floats.
  const auto buckets = PlanBuckets(ranges, 400 * 4, 100 * 4);
  ExpectTiles(buckets, n);
  ASSERT_FALSE(buckets.empty());
  EXPECT_LE(buckets[0].size(), 100);
  EXPECT_EQ(buckets[0].end, n);  // the first bucket holds the first range announced
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_LE(buckets[i].size(), 400) << i;
    EXPECT_EQ(buckets[i].end, buckets[i - 1].begin) << "buckets follow the announcement order";
  }
}

TEST(PlanBuckets, GPT2BucketsFollowBackwardOrder) {
  GPT2Config c;
  c.n_layer = 3, c.n_head = 2, c.n_embd = 32, c.vocab_size = 100, c.padded_vocab_size = 128, c.block_size = 16;
  const ParameterLayout layout(c);
  const Ranges ready = GradReadyRanges(layout);
  ASSERT_EQ(ready.size(), 5u);  // ln_f, 3 blocks, embeddings
  EXPECT_EQ(ready.front().second, layout.total());
  EXPECT_EQ(ready.back().first, 0);
  const auto buckets = PlanBuckets(ready, 16 << 10, 4 << 10);
  ExpectTiles(buckets, layout.total());
}

// AdamW's decay runs: tile the buffer in order, alternate flags (maximal runs), and agree with the
// tensors' own flags element by element.
TEST(DecayRanges, TileTheLayoutInMaximalRuns) {
  GPT2Config c;
  c.n_layer = 3, c.n_head = 2, c.n_embd = 32, c.vocab_size = 100, c.padded_vocab_size = 128, c.block_size = 16;
  const ParameterLayout layout(c);
  const std::vector<DecayRange> runs = DecayRanges(layout);
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.front().begin, 0);
  EXPECT_EQ(runs.back().end, layout.total());
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_LT(runs[r].begin, runs[r].end);
    if (r > 0) {
      EXPECT_EQ(runs[r].begin, runs[r - 1].end);
      EXPECT_NE(runs[r].decay, runs[r - 1].decay) << "runs " << r - 1 << " and " << r << " should be merged";
    }
  }
  for (const ParamTensor& t : layout.tensors()) {
    for (const DecayRange& r : runs) {
      if (t.offset >= r.begin && t.offset < r.end) {
        EXPECT_LE(t.offset + t.numel, r.end) << t.name;
        EXPECT_EQ(r.decay, t.weight_decay) << t.name;
      }
    }
  }
  // wte, wpe (decay) then ln_1 w/b (no decay) ... : the first run holds both embeddings.
  EXPECT_TRUE(runs.front().decay);
  EXPECT_EQ(runs.front().end, layout.tensors()[2].offset);
}

TEST(GradientReducer, RejectsRangesThatDoNotTile) {
  SingleProcessCommunicator comm;
  std::vector<float> g(100);
  EXPECT_FALSE(GradientReducer::Create(&comm, g, {{0, 50}, {60, 100}}, {}).ok());
  EXPECT_FALSE(GradientReducer::Create(&comm, g, {{0, 60}, {50, 100}}, {}).ok());
  EXPECT_FALSE(GradientReducer::Create(&comm, g, {{0, 90}}, {}).ok());
  EXPECT_TRUE(GradientReducer::Create(&comm, g, {{50, 100}, {0, 50}}, {}).ok());
}

TEST(GradientReducer, ExactOnOneRankLeavesGradientsAndReportsMissingRanges) {
  SingleProcessCommunicator comm;
  std::vector<float> g(1000);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : g) x = normal(rng);
  const std::vector<float> before = g;
  const Ranges ranges = DescendingRanges({100, 400, 500});
  ReducerOptions o;
  o.bucket_bytes = 256 * 4;
  o.first_bucket_bytes = 64 * 4;
  auto r = GradientReducer::Create(&comm, g, ranges, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  (*r)->BeginStep(0);
  for (auto [b, e] : ranges) (*r)->MarkReady(b, e);
  ASSERT_TRUE((*r)->Finish().ok());
  EXPECT_EQ(g, before);
  EXPECT_EQ((*r)->LastStats()->buckets, static_cast<int>((*r)->buckets().size()));

  (*r)->BeginStep(1);
  (*r)->MarkReady(ranges[0].first, ranges[0].second);
  const Status s = (*r)->Finish();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("never completely marked ready"), std::string::npos) << s.ToString();
}

// Error feedback on one rank: over K steps, sum of what was applied + final residuals equals the
// sum of the inputs (nothing lost, only delayed). Tolerance: K*n float additions of values ~1.
TEST(GradientReducer, ErrorFeedbackLosesNothingOnOneRank) {
  for (const char* spec : {"bf16", "fp16", "int8", "int8-sr", "sign", "topk:0.05"}) {
    SCOPED_TRACE(spec);
    SingleProcessCommunicator comm;
    const int64_t n = 3001;
    std::vector<float> g(static_cast<size_t>(n));
    const Ranges ranges = DescendingRanges({1, 1000, 2000});
    ReducerOptions o;
    o.bucket_bytes = 1024 * 4;
    o.first_bucket_bytes = 512 * 4;
    auto codec = ParseCodec(spec);
    ASSERT_TRUE(codec.ok());
    o.codec = *codec;
    auto r = GradientReducer::Create(&comm, g, ranges, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<double> in_sum(static_cast<size_t>(n)), out_sum(static_cast<size_t>(n));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (int step = 0; step < 6; ++step) {
      for (int64_t i = 0; i < n; ++i) {
        g[static_cast<size_t>(i)] = normal(rng);
        in_sum[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
      }
      (*r)->BeginStep(step);
      for (auto [b, e] : ranges) (*r)->MarkReady(b, e);
      ASSERT_TRUE((*r)->Finish().ok());
      for (int64_t i = 0; i < n; ++i) out_sum[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
      EXPECT_GT((*r)->LastStats()->wire_bytes, -1);
    }
    std::vector<float> res, server;
    ASSERT_TRUE((*r)->GetState(&res, &server).ok());
    for (int64_t i = 0; i < n; ++i) {
      const double kept = res[static_cast<size_t>(i)] + (server.empty() ? 0.0 : server[static_cast<size_t>(i)]);
      ASSERT_NEAR(out_sum[static_cast<size_t>(i)] + kept, in_sum[static_cast<size_t>(i)], 1e-4) << "element " << i;
    }
  }
}

TEST(AutoCodec, DecidesByMeasuredTimeWithAMarginForLossyCodecs) {
  const std::vector<std::string> c = {"none", "bf16", "int8"};
  auto slow_link = DecideCodec(c, {1000, 520, 300}, 1 << 20, 2, "host");
  ASSERT_TRUE(slow_link.ok());
  EXPECT_EQ(CodecName(slow_link->codec), "int8");
  EXPECT_NE(slow_link->reason.find("-> int8"), std::string::npos) << slow_link->reason;
  // A lossy codec that is only 3% faster does not pay for its error.
  auto fast_link = DecideCodec(c, {100, 130, 97}, 1 << 20, 2, "host");
  ASSERT_TRUE(fast_link.ok());
  EXPECT_EQ(CodecName(fast_link->codec), "none");
  EXPECT_EQ(fast_link->candidates.size(), 3u);
  EXPECT_FALSE(DecideCodec(c, {1, 2}, 1, 2, "host").ok());
  EXPECT_FALSE(DecideCodec({"int8", "none"}, {1, 2}, 1, 2, "host").ok());
}

TEST(ProcessGroup, PlainStartIsOneRankWithoutMpi) {
  // ctest starts this binary without a launcher.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("SLURM_STEP_ID") != nullptr) {
    GTEST_SKIP() << "started under a launcher";
  }
  auto t = InitProcessGroup();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->world, 1);
  EXPECT_EQ(t->rank, 0);
  EXPECT_EQ(t->num_nodes, 1);
  EXPECT_FALSE(t->mpi);
  EXPECT_TRUE(CheckSameOnAllRanks("anything", "config").ok());
  auto c = MakeHostCommunicator(*t);
  ASSERT_TRUE(c.ok());
  EXPECT_STREQ((*c)->name(), "single");
}

TEST(ProcessGroup, ReadsOpenMpiAndSlurmEnvironment) {
  // Pure parsing of the launcher variables (restored afterwards).
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_STEP_ID",
                        "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* x = std::getenv(v)) saved.emplace_back(v, x);
    unsetenv(v);
  }
  EXPECT_EQ(ReadLauncherEnvironment().world, 1);
  setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_PROCID", "5", 1), setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_LOCALID", "1", 1), setenv("SLURM_NNODES", "2", 1);
  EnvironmentHint h = ReadLauncherEnvironment();
  EXPECT_EQ(h.launcher, "srun");
  EXPECT_EQ(h.world, 8);
  EXPECT_EQ(h.rank, 5);
  EXPECT_EQ(h.local_rank, 1);
  EXPECT_EQ(h.local_world, 4);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1), setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  h = ReadLauncherEnvironment();
  EXPECT_EQ(h.launcher, "mpirun");
  EXPECT_EQ(h.world, 3);
  EXPECT_EQ(h.rank, 2);
  for (const char* v : vars) unsetenv(v);
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

TEST(SingleProcessCommunicator, CollectivesAreCopies) {
  SingleProcessCommunicator c;
  std::vector<float> a = {1, 2, 3}, b(3);
  const int64_t counts[] = {3};
  ASSERT_TRUE(c.AllReduceSum(a.data(), 3, DataType::kF32).ok());
  ASSERT_TRUE(c.ReduceScatterSum(a.data(), b.data(), counts, DataType::kF32).ok());
  EXPECT_EQ(a, b);
  std::fill(b.begin(), b.end(), 0.0f);
  ASSERT_TRUE(c.AllGather(a.data(), b.data(), 12).ok());
  EXPECT_EQ(a, b);
  EXPECT_FALSE(c.Broadcast(a.data(), 12, 1).ok());
}

}  // namespace
}  // namespace tf::comm
