// Sizes for people to read, in one unit system (IEC: 1 KiB = 1024 bytes). Pure; thread-safe.
#pragma once
#include <cstdint>
#include <string>

namespace tf {

// "512 B", "2.0 KiB", "12.5 MiB", "1.21 GiB" (larger sizes stay in GiB).
std::string FormatBytes(uint64_t bytes);

}  // namespace tf
