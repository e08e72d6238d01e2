// Multi-rank tests of comm/: run by CTest under `mpirun -np 2` and `-np 3` (odd sizes catch
// partitioning bugs). Every rank runs every test; each rank computes the expected result serially
// from what all ranks contribute (the inputs are a pure function of rank and index).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/auto_codec.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"

namespace tf::comm {
namespace {

class CommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = InitProcessGroup();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    topo_ = *t;
    ASSERT_GE(topo_.world, 2) << "run me under mpirun -np N (N >= 2)";
    auto c = MakeHostCommunicator(topo_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    comm_ = std::move(c).value();
    comm_->set_timeout_seconds(120);
  }
  // Value contributed by `rank` at index i: exact in float (small integers / 8) so sums are exact.
  static float Value(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 41 - 20) / 8.0f; }
  static float Random(int rank, int64_t i, uint64_t salt) {
    std::mt19937_64 g((static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL) ^ salt);
    return static_cast<float>(static_cast<int64_t>(g() % 2000001) - 1000000) * 1e-6f;
  }
  // True on every rank iff `ok` on every rank (so one rank's failure fails all consistently).
  bool AllRanks(bool ok) {
    int mine = ok ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
  }
  Topology topo_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(CommTest, BootstrapMatchesLauncher) {
  EXPECT_TRUE(topo_.mpi);
  EXPECT_EQ(topo_.launcher, "mpirun");
  EXPECT_EQ(topo_.world, std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(topo_.rank, std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(topo_.local_rank, std::atoi(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")));
  EXPECT_EQ(topo_.local_world, topo_.world);  // one node in CI
  EXPECT_EQ(topo_.num_nodes, 1);
  EXPECT_EQ(topo_.node, 0);
  // Ranks are distinct and complete.
  std::vector<int> ranks(static_cast<size_t>(topo_.world));
  ASSERT_TRUE(comm_->AllGather(&topo_.rank, ranks.data(), sizeof(int)).ok());
  for (int r = 0; r < topo_.world; ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
  EXPECT_NE(topo_.Describe().find(std::to_string(topo_.world) + " ranks on 1 node"), std::string::npos)
      << topo_.Describe();
}

TEST_F(CommTest, AllReduceSumsExactly) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = Value(topo_.rank, i);
    ASSERT_TRUE(comm_->AllReduceSum(x.data(), n, DataType::kF32).ok());
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < topo_.world; ++r) want += Value(r, i);
      ASSERT_EQ(x[static_cast<size_t>(i)], want) << "n=" << n << " i=" << i;
    }
  }
  double d = topo_.rank + 0.5;
  ASSERT_TRUE(comm_->AllReduceSum(&d, 1, DataType::kF64).ok());
  EXPECT_EQ(d, topo_.world * (topo_.world - 1) / 2.0 + 0.5 * topo_.world);
}

TEST_F(CommTest, ReduceScatterAndAllGatherVWithUnevenCounts) {
  const int W = topo_.world;
  std::vector<int64_t> counts(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) counts[static_cast<size_t>(r)] = 3 * r + 1 + (r == W - 1 ? 100 : 0);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  int64_t my_off = 0;
  for (int r = 0; r < topo_.rank; ++r) my_off += counts[static_cast<size_t>(r)];
  const int64_t mine = counts[static_cast<size_t>(topo_.rank)];
  std::vector<float> send(static_cast<size_t>(total)), recv(static_cast<size_t>(mine), -1.0f);
  for (int64_t i = 0; i < total; ++i) send[static_cast<size_t>(i)] = Value(topo_.rank, i);
  ASSERT_TRUE(comm_->ReduceScatterSum(send.data(), recv.data(), counts, DataType::kF32).ok());
  for (int64_t i = 0; i < mine; ++i) {
    float want = 0;
    for (int r = 0; r < W; ++r) want += Value(r, my_off + i);
    ASSERT_EQ(recv[static_cast<size_t>(i)], want) << i;
  }
  // All-gather the blocks back: everyone ends with the full reduced vector.
  std::vector<float> all(static_cast<size_t>(total), -1.0f);
  ASSERT_TRUE(comm_->AllGatherV(recv.data(), all.data(), counts, DataType::kF32).ok());
  for (int64_t i = 0; i < total; ++i) {
    float want = 0;
    for (int r = 0; r < W; ++r) want += Value(r, i);
    ASSERT_EQ(all[static_cast<size_t>(i)], want) << i;
  }
  // Wrong number of counts is an error, not a hang.
  EXPECT_FALSE(comm_->ReduceScatterSum(send.data(), recv.data(), std::span(counts).first(1), DataType::kF32).ok());
}

// Random values of widely different magnitudes, so that the order of a sum changes its rounding.
template <typename T>
T Mixed(int rank, int64_t i) {
  // splitmix64 of (rank, i): cheap enough for blocks of millions of elements.
  uint64_t x = (static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  const double unit = static_cast<double>(static_cast<int64_t>(x % 2000001) - 1000000) * 1e-6;
  return static_cast<T>(std::ldexp(unit, static_cast<int>((x >> 40) % 41) - 20));
}

// The reduce-scatter sums every element in rank order (x_0 + x_1 + ... + x_{W-1}), bit for bit,
// whatever the counts partition: even blocks, skewed blocks with empty ones, and in place.
template <typename T>
void ExpectRankOrderSums(Communicator* comm, DataType dt, int64_t n = 10007) {
  const int W = comm->world(), me = comm->rank();
  std::vector<T> send(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) send[static_cast<size_t>(i)] = Mixed<T>(me, i);
  std::vector<T> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    T s = Mixed<T>(0, i);
    for (int r = 1; r < W; ++r) s += Mixed<T>(r, i);
    want[static_cast<size_t>(i)] = s;
  }
  std::vector<int64_t> even(static_cast<size_t>(W), n / W), skewed(static_cast<size_t>(W), 0);
  even[static_cast<size_t>(W - 1)] += n % W;
  skewed[0] = n - 17;  // rank 0 owns almost everything, the middle ranks nothing
  skewed[static_cast<size_t>(W - 1)] = 17;
  for (const auto& counts : {even, skewed}) {
    const int64_t off = std::accumulate(counts.begin(), counts.begin() + me, int64_t{0});
    const int64_t mine = counts[static_cast<size_t>(me)];
    std::vector<T> recv(static_cast<size_t>(mine) + 1, T(-1));
    ASSERT_TRUE(comm->ReduceScatterSum(send.data(), recv.data(), counts, dt).ok());
    EXPECT_EQ(0, std::memcmp(recv.data(), want.data() + off, static_cast<size_t>(mine) * sizeof(T)))
        << "rank " << me << " of " << W << ": sums differ from the rank-order sums (" << mine << " elements)";
    EXPECT_EQ(recv[static_cast<size_t>(mine)], T(-1)) << "wrote past counts[rank]";
    std::vector<T> in_place = send;
    ASSERT_TRUE(comm->ReduceScatterSum(in_place.data(), in_place.data() + off, counts, dt).ok());
    EXPECT_EQ(0, std::memcmp(in_place.data() + off, want.data() + off, static_cast<size_t>(mine) * sizeof(T)))
        << "in place";
  }
}

TEST_F(CommTest, ReduceScatterSumsInRankOrderWhateverThePartition) {
  ExpectRankOrderSums<float>(comm_.get(), DataType::kF32);
  ExpectRankOrderSums<double>(comm_.get(), DataType::kF64);
  // Blocks larger than the 16 MiB receive buffer go in rounds (a skewed block spans several).
  ExpectRankOrderSums<float>(comm_.get(), DataType::kF32, 5'000'011);
  std::vector<int64_t> counts(static_cast<size_t>(topo_.world), 4);
  std::vector<uint16_t> bf16(static_cast<size_t>(4 * topo_.world));
  const Status s = comm_->ReduceScatterSum(bf16.data(), bf16.data(), counts, DataType::kBF16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

TEST_F(CommTest, AllGatherAllToAllBroadcastBarrier) {
  const int W = topo_.world;
  const size_t bytes = 37;
  std::vector<unsigned char> send(bytes * static_cast<size_t>(W)), recv(bytes * static_cast<size_t>(W));
  for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<unsigned char>(topo_.rank * 31 + j);
  ASSERT_TRUE(comm_->AllGather(send.data(), recv.data(), bytes).ok());
  for (int r = 0; r < W; ++r) {
    for (size_t j = 0; j < bytes; ++j) ASSERT_EQ(recv[r * bytes + j], static_cast<unsigned char>(r * 31 + j));
  }
  ASSERT_TRUE(comm_->AllToAll(send.data(), recv.data(), bytes).ok());
  for (int r = 0; r < W; ++r) {  // block r came from rank r's block number `rank`
    for (size_t j = 0; j < bytes; ++j) {
      ASSERT_EQ(recv[r * bytes + j], static_cast<unsigned char>(r * 31 + topo_.rank * bytes + j));
    }
  }
  std::vector<double> v(1000, topo_.rank == W - 1 ? 3.25 : 0.0);
  ASSERT_TRUE(comm_->Broadcast(v.data(), v.size() * sizeof(double), W - 1).ok());
  for (double x : v) ASSERT_EQ(x, 3.25);
  EXPECT_FALSE(comm_->Broadcast(v.data(), 8, W).ok());
  EXPECT_TRUE(comm_->Barrier().ok());
}

// A collective that a peer never joins ends in a clear error after the timeout, not a hang.
TEST_F(CommTest, TimeoutInsteadOfHang) {
  auto dup = MpiCommunicator::Create(MPI_COMM_WORLD);
  ASSERT_TRUE(dup.ok());
  (*dup)->set_timeout_seconds(0.5);
  if (topo_.rank == 0) {
    int x = 1;
    const Status s = (*dup)->Broadcast(&x, sizeof(x), 1);  // rank 1 joins only after 2 s
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("did not complete within"), std::string::npos) << s.ToString();
    const Status again = (*dup)->Barrier();
    EXPECT_FALSE(again.ok());
    EXPECT_NE(again.message().find("failed earlier"), std::string::npos) << again.ToString();
  } else if (topo_.rank == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    int x = 7;
    EXPECT_TRUE((*dup)->Broadcast(&x, sizeof(x), 1).ok());
  }
  // Rank 0's broadcast completes in the background once rank 1 joins; the world is still usable.
  ASSERT_TRUE(comm_->Barrier().ok());
}

TEST_F(CommTest, ConsistencyCheckNamesTheDifferentRanks) {
  EXPECT_TRUE(CheckSameOnAllRanks("same", "training config").ok());
  const Status s = CheckSameOnAllRanks(topo_.rank == 1 ? "other" : "same", "training config");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 has a different training config than rank 0"), std::string::npos)
      << s.ToString();
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// Many tensors of odd sizes, announced last to first (as backward does).
Ranges OddRanges(int64_t* total) {
  const int64_t sizes[] = {1, 3, 1000, 17, 4099, 250, 2, 777, 12345, 5, 64, 1023};
  Ranges r;
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  *total = n;
  for (int64_t s : sizes) {
    r.emplace_back(n - s, n);
    n -= s;
  }
  return r;
}

// The bucketed reducer (exact) equals the serial average, bit-identically on every rank, for
// several bucket sizes — including buckets smaller than a tensor and one bucket for everything.
TEST_F(CommTest, ReducerExactEqualsSerialAverageOnEveryRank) {
  int64_t n = 0;
  const Ranges ranges = OddRanges(&n);
  for (auto [cap, first] : {std::pair<int64_t, int64_t>{64, 16}, {4096, 1024}, {1 << 20, 4096}, {1 << 26, 1 << 26}}) {
    SCOPED_TRACE("bucket " + std::to_string(cap) + " first " + std::to_string(first));
    std::vector<float> g(static_cast<size_t>(n));
    ReducerOptions o;
    o.bucket_bytes = cap;
    o.first_bucket_bytes = first;
    auto reducer = GradientReducer::Create(comm_.get(), g, ranges, o);
    ASSERT_TRUE(reducer.ok()) << reducer.status().ToString();
    for (int step = 0; step < 2; ++step) {
      for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = Random(topo_.rank, i, step);
      (*reducer)->BeginStep(step);
      for (auto [b, e] : ranges) {
        (*reducer)->MarkReady(b, e);
        std::this_thread::yield();  // let the communication thread start early buckets
      }
      ASSERT_TRUE((*reducer)->Finish().ok());
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < topo_.world; ++r) want += Random(r, i, step);
        want /= topo_.world;
        ASSERT_NEAR(g[static_cast<size_t>(i)], want, 1e-6 * (1 + std::abs(want))) << i;
      }
      // Bit-identical on every rank.
      const uint64_t h = Fingerprint(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
      std::vector<uint64_t> all(static_cast<size_t>(topo_.world));
      ASSERT_TRUE(comm_->AllGather(&h, all.data(), sizeof(h)).ok());
      for (uint64_t x : all) ASSERT_EQ(x, all[0]);
      const ReducerStats st = *(*reducer)->LastStats();
      EXPECT_EQ(st.raw_bytes, n * 4);
      EXPECT_GT(st.wire_bytes, 0);
      EXPECT_GE(st.exposed_ms, 0.0);
    }
  }
}

// Each lossy codec through the reducer: the result is the same on every rank; its error against
// the exact average stays within the codec's bound; and error feedback loses nothing: over K
// steps, sum(applied) + mean over ranks of the worker residuals + the server residuals
// == the mean over ranks of sum(inputs).
TEST_F(CommTest, ReducerCodecsErrorFeedbackAndAgreement) {
  int64_t n = 0;
  const Ranges ranges = OddRanges(&n);
  struct Case {
    const char* spec;
    double max_rel_err;  // relative L2 error of one step vs the exact average (generous bounds)
  };
  for (const Case& c : {Case{"bf16", 1e-2}, Case{"fp16", 1e-2}, Case{"int8", 0.05}, Case{"int8-sr", 0.1},
                        Case{"sign", 1.5}, Case{"topk:0.1", 1.0}}) {
    SCOPED_TRACE(c.spec);
    std::vector<float> g(static_cast<size_t>(n));
    ReducerOptions o;
    o.bucket_bytes = 8192;
    o.first_bucket_bytes = 1024;
    auto codec = ParseCodec(c.spec);
    ASSERT_TRUE(codec.ok());
    o.codec = *codec;
    auto reducer = GradientReducer::Create(comm_.get(), g, ranges, o);
    ASSERT_TRUE(reducer.ok()) << reducer.status().ToString();
    std::vector<double> in_mean(static_cast<size_t>(n)), out_sum(static_cast<size_t>(n));
    const int K = 4;
    for (int step = 0; step < K; ++step) {
      std::vector<double> exact(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        g[static_cast<size_t>(i)] = Random(topo_.rank, i, 100 + step);
        for (int r = 0; r < topo_.world; ++r) exact[static_cast<size_t>(i)] += Random(r, i, 100 + step);
        exact[static_cast<size_t>(i)] /= topo_.world;
        in_mean[static_cast<size_t>(i)] += exact[static_cast<size_t>(i)];
      }
      (*reducer)->BeginStep(step);
      for (auto [b, e] : ranges) (*reducer)->MarkReady(b, e);
      ASSERT_TRUE((*reducer)->Finish().ok());
      double err = 0, ref = 0;
      for (int64_t i = 0; i < n; ++i) {
        out_sum[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
        err += std::pow(g[static_cast<size_t>(i)] - exact[static_cast<size_t>(i)], 2);
        ref += std::pow(exact[static_cast<size_t>(i)], 2);
      }
      if (step == 0) {
        const double rel = std::sqrt(err / ref);
        EXPECT_LT(rel, c.max_rel_err);
        if (topo_.rank == 0) {
          std::printf("[ codec %-8s ] relative L2 error vs exact average %.3e; %lld bytes sent for %lld raw\n", c.spec,
                      rel, static_cast<long long>((*reducer)->LastStats()->wire_bytes),
                      static_cast<long long>((*reducer)->LastStats()->raw_bytes));
        }
      }
      const uint64_t h = Fingerprint(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
      std::vector<uint64_t> all(static_cast<size_t>(topo_.world));
      ASSERT_TRUE(comm_->AllGather(&h, all.data(), sizeof(h)).ok());
      for (uint64_t x : all) ASSERT_EQ(x, all[0]) << "ranks disagree after step " << step;
    }
    std::vector<double> kept(static_cast<size_t>(n));
    std::vector<float> res, server;
    ASSERT_TRUE((*reducer)->GetState(&res, &server).ok());
    for (int64_t i = 0; i < n; ++i) {
      kept[static_cast<size_t>(i)] = res[static_cast<size_t>(i)] / topo_.world +
                                     (server.empty() ? 0.0 : server[static_cast<size_t>(i)]);
    }
    ASSERT_TRUE(comm_->AllReduceSum(kept.data(), n, DataType::kF64).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(out_sum[static_cast<size_t>(i)] + kept[static_cast<size_t>(i)], in_mean[static_cast<size_t>(i)], 1e-5)
          << "element " << i;
    }
  }
}

// Overlap: buckets announced early (as backward produces them) are reduced while "backward" goes
// on, before Finish() is called. The gaps (100 ms) dwarf a small bucket's reduction (< 1 ms), so
// at least the first buckets must be done by then even on a loaded machine.
TEST_F(CommTest, ReducerOverlapsBucketsWithBackward) {
  const int64_t n = 4 * 4096;
  std::vector<float> g(static_cast<size_t>(n), 1.0f);
  Ranges ranges;
  for (int64_t e = n; e > 0; e -= 4096) ranges.emplace_back(e - 4096, e);
  ReducerOptions o;
  o.bucket_bytes = 4096 * 4;
  o.first_bucket_bytes = 4096 * 4;
  auto reducer = GradientReducer::Create(comm_.get(), g, ranges, o);
  ASSERT_TRUE(reducer.ok()) << reducer.status().ToString();
  ASSERT_EQ((*reducer)->buckets().size(), 4u);
  (*reducer)->BeginStep(0);
  for (auto [b, e] : ranges) {
    (*reducer)->MarkReady(b, e);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the rest of "backward"
  }
  ASSERT_TRUE((*reducer)->Finish().ok());
  EXPECT_GE((*reducer)->LastStats()->overlapped_buckets, 2);
  for (float x : g) ASSERT_EQ(x, 1.0f);  // the average of ones
}

TEST_F(CommTest, AutoCodecAgreesAcrossRanksAndExplains) {
  ReducerOptions base;
  auto choice = ChooseCodec(comm_.get(), 1 << 20, base);
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  EXPECT_EQ(choice->candidates.size(), 3u);
  EXPECT_NE(choice->reason.find("->"), std::string::npos);
  const int kind = static_cast<int>(choice->codec.kind);
  std::vector<int> all(static_cast<size_t>(topo_.world));
  ASSERT_TRUE(comm_->AllGather(&kind, all.data(), sizeof(int)).ok());
  for (int k : all) EXPECT_EQ(k, kind);
  if (topo_.rank == 0) std::printf("[ auto ] %s\n", choice->reason.c_str());
}

}  // namespace
}  // namespace tf::comm
