// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): S3 request signing and the supervisor's
// authenticated heartbeat channel. OpenSSL's libcrypto is not linked into TrainFlow's libraries.
// Thread safety: pure functions.
#pragma once
#include <array>
#include <string>
#include <string_view>

namespace tf {

std::array<unsigned char, 32> Sha256(std::string_view data);
// SHA-256 of `data` as 64 lower-case hex digits.
std::string Sha256Hex(std::string_view data);
// HMAC-SHA256 of `message` under `key`, as 64 lower-case hex digits.
std::string HmacSha256Hex(std::string_view key, std::string_view message);
// a == b in time that depends only on the lengths (comparing MACs).
bool ConstantTimeEqual(std::string_view a, std::string_view b);

}  // namespace tf
