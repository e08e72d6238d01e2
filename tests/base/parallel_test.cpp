// Tests for base/parallel.h: every index runs once, on at most the threads asked for (the caller
// among them), and a failure stops the loop and is reported by its lowest index.
#include "base/parallel.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(ParallelTest, EveryIndexOnceOnAtMostThreadsWorkers) {
  constexpr size_t kN = 1000;
  std::vector<std::atomic<int>> runs(kN);
  std::mutex mu;
  std::set<size_t> workers;
  std::set<std::thread::id> threads;
  const Status s = ParallelFor(kN, 4, [&](size_t i, size_t worker) {
    runs[i].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    workers.insert(worker);
    threads.insert(std::this_thread::get_id());
    return Status::OK();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
  EXPECT_LE(threads.size(), 4u);
  for (size_t w : workers) EXPECT_LT(w, 4u);
}

TEST(ParallelTest, OneThreadRunsInOrderOnTheCaller) {
  std::vector<size_t> order;
  const std::thread::id caller = std::this_thread::get_id();
  ASSERT_TRUE(ParallelFor(5, 1, [&](size_t i, size_t worker) {
                EXPECT_EQ(worker, 0u);
                EXPECT_EQ(std::this_thread::get_id(), caller);
                order.push_back(i);
                return Status::OK();
              }).ok());
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(ParallelFor(0, 8, [](size_t, size_t) { return Status::Internal("never called"); }).ok());
}

TEST(ParallelTest, AFailureStopsTheLoopAndTheLowestIndexIsReported) {
  std::atomic<size_t> ran{0};
  const Status s = ParallelFor(10000, 3, [&](size_t i, size_t) {
    ran.fetch_add(1);
    if (i == 7 || i == 9) return Status::IOError("task {} failed", i);
    return Status::OK();
  });
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message(), "task 7 failed");
  EXPECT_LT(ran.load(), 10000u);  // no task starts after the failure is seen

  // Serially, nothing after the first failure runs.
  std::vector<size_t> seen;
  const Status one = ParallelFor(10, 1, [&](size_t i, size_t) {
    seen.push_back(i);
    return i == 3 ? Status::IOError("stop") : Status::OK();
  });
  EXPECT_FALSE(one.ok());
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace tf
