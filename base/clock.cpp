#include "base/clock.h"

#include <chrono>
#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

namespace tf {

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string FormatUtc(double unix_s, const char* format) {
  const std::time_t t = static_cast<std::time_t>(std::floor(unix_s));
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[128];
  const size_t n = std::strftime(buf, sizeof(buf), format, &tm);
  return std::string(buf, n);
}

std::string IsoUtc(double unix_s) { return FormatUtc(unix_s, "%Y-%m-%dT%H:%M:%SZ"); }

std::string IsoUtcMillis(double unix_s) {
  const double whole = std::floor(unix_s);
  const int ms = std::min(999, static_cast<int>((unix_s - whole) * 1000));
  return fmt::format("{}.{:03d}Z", FormatUtc(whole, "%Y-%m-%dT%H:%M:%S"), ms);
}

}  // namespace tf
