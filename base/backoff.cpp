#include "base/backoff.h"

#include <algorithm>
#include <functional>
#include <random>
#include <thread>

namespace tf {

double ExponentialDelay(double base_s, double factor, int k, double max_s) {
  double d = base_s;
  if (factor > 1 && d > 0) {
    for (int i = 0; i < k && d < max_s; ++i) d *= factor;
  }
  return std::min(d, max_s);
}

double FullJitter(double d) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ std::hash<std::thread::id>{}(std::this_thread::get_id()));
  return std::uniform_real_distribution<double>(0.0, std::max(d, 0.0))(rng);
}

}  // namespace tf
