#include "base/format.h"

#include <fmt/format.h>

namespace tf {

std::string FormatBytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  if (n < (uint64_t{1} << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / 1024);
  if (n < (uint64_t{1} << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(n) / (1 << 20));
  return fmt::format("{:.2f} GiB", static_cast<double>(n) / (1 << 30));
}

}  // namespace tf
