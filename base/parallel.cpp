#include "base/parallel.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

namespace tf {

Status ParallelFor(size_t n, size_t threads, const std::function<Status(size_t i, size_t worker)>& task) {
  const size_t workers = std::max<size_t>(1, std::min(threads, n));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t first_index = std::numeric_limits<size_t>::max();  // guarded by mu
  Status first;                                               // guarded by mu
  auto work = [&](size_t worker) {
    while (!failed.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = task(i, worker);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_index) {
          first_index = i;
          first = std::move(s);
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& t : pool) t.join();
  return first;
}

}  // namespace tf
