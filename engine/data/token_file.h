// Token files: pre-tokenized training data in the llm.c / nanoGPT layout.
//
// Format (specified in docs/formats.md, "Token files"):
//   * with header: 256 little-endian int32 (1024 bytes): [0] = kTokenFileMagic, [1] =
//     kTokenFileVersion, [2] = token count n, [3] = tokenizer kind (0 not recorded, 1 byte, 2
//     gpt2), [4] = its vocabulary size, [5], [6] = low and high 32 bits of its fingerprint
//     (Tokenizer::fingerprint), the rest 0; then n little-endian uint16 tokens. llm.c reads only
//     [0]-[2], so the tokenizer fields do not disturb it.
//   * bare: just little-endian uint16 tokens (nanoGPT's train.bin), at least one.
// A file is read as headered exactly when its first 4 bytes are kTokenFileMagic. For any
// vocabulary of at most kTokenFileMagicLowHalf (55432) ids, e.g. GPT-2's 50257 or the padded
// 50304, a valid bare stream can never start with those bytes (see docs/formats.md).
//
// Errors (never exits, never throws): missing file -> NotFound; bytes that do not follow the
// format (bad version, count disagreeing with the size, odd length, empty file) -> Corruption;
// OS failures -> IOError. Messages name the path and, for sizes, expected and actual bytes.
//
// Thread safety: no shared state; concurrent calls on different paths are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace tf {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;  // uint16 tokens (llm.c's 2 = uint32, unsupported)
inline constexpr size_t kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);
// The magic seen as two little-endian uint16 tokens: (55432, 308).
inline constexpr uint32_t kTokenFileMagicLowHalf = static_cast<uint32_t>(kTokenFileMagic) & 0xffffu;
inline constexpr uint32_t kTokenFileMagicHighHalf = static_cast<uint32_t>(kTokenFileMagic) >> 16;

// The tokenizer a headered file records. kind "" = not recorded (bare files, older files).
struct TokenFileTokenizer {
  std::string kind;  // "byte", "gpt2" or ""
  int vocab_size = 0;
  uint64_t fingerprint = 0;
  bool operator==(const TokenFileTokenizer&) const = default;
};

// Reads either layout; returns the tokens (not yet checked against a vocabulary) and, when
// `tokenizer` is given, what the header records of the tokenizer (an unknown kind code is
// Corruption).
StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path, Env* env = Env::Default(),
                                              TokenFileTokenizer* tokenizer = nullptr);

// Writes atomically (Env::WriteFileAtomically), recording `tokenizer` in the header. REQUIRES for
// OK: with_header -> tokens.size() <= INT32_MAX (the count is an int32); !with_header -> tokens
// non-empty (an empty file is rejected by the reader); tokenizer.kind "", "byte" or "gpt2".
Status WriteTokenFile(const std::string& path, std::span<const uint16_t> tokens, bool with_header = true,
                      Env* env = Env::Default(), const TokenFileTokenizer& tokenizer = {});

// OK if every token is < vocab_size, else InvalidArgument
// "<path>: token id X at position P is >= vocab size V" for the first offender.
// REQUIRES for OK: vocab_size > 0. `path` is only used in the message.
Status ValidateTokens(std::span<const uint16_t> tokens, int vocab_size, const std::string& path);

}  // namespace tf
