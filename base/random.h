// Random identifiers from the kernel's generator (getrandom through std::random_device): secrets,
// nonces and run-id suffixes. Thread-safe.
#pragma once
#include <string>

namespace tf {

// 2 * n_bytes random lowercase hex digits.
std::string RandomHex(int n_bytes);

}  // namespace tf
