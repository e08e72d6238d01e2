#include "base/random.h"

#include <cstdint>
#include <random>

#include <fmt/format.h>

namespace tf {

std::string RandomHex(int n_bytes) {
  std::random_device rd;  // the kernel's getrandom on Linux
  std::string out;
  out.reserve(static_cast<size_t>(n_bytes) * 2);
  for (int i = 0; i < n_bytes; i += 4) {
    const uint32_t v = rd();
    for (int j = 0; j < 4 && i + j < n_bytes; ++j) out += fmt::format("{:02x}", (v >> (8 * j)) & 0xff);
  }
  return out;
}

}  // namespace tf
