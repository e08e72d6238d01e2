// Token file reader/writer. Format: docs/formats.md ("Token files").
#include "engine/data/token_file.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <initializer_list>
#include <limits>
#include <utility>

namespace tf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are read by copying little-endian bytes straight into memory");
static_assert(kTokenFileMagicLowHalf == 55432 && kTokenFileMagicHighHalf == 308);

constexpr int kFirstReserved = 7;  // header ints from here on are 0

int32_t KindCode(const std::string& kind) { return kind == "byte" ? 1 : kind == "gpt2" ? 2 : 0; }

}  // namespace

StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path, Env* env, TokenFileTokenizer* tokenizer) {
  if (tokenizer != nullptr) *tokenizer = TokenFileTokenizer{};
  auto opened = env->NewRandomAccessFile(path);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) return Status::NotFound("{}: no such token file", path);
    return opened.status().WithContext("token file");
  }
  const RandomAccessFile& file = **opened;
  const uint64_t size = file.size();
  if (size == 0) return Status::Corruption("{}: token file is empty", path);

  int32_t first = 0;
  if (size >= sizeof(first)) TF_RETURN_IF_ERROR(file.ReadExact(0, 4, reinterpret_cast<char*>(&first)));
  uint64_t data_offset = 0;
  uint64_t count = 0;
  if (size >= sizeof(first) && first == kTokenFileMagic) {
    if (size < kTokenFileHeaderBytes)
      return Status::Corruption(
          "{}: starts with the token-file magic but is {} bytes, shorter than the {} byte header",
          path, size, kTokenFileHeaderBytes);
    int32_t header[kTokenFileHeaderInts];
    TF_RETURN_IF_ERROR(file.ReadExact(0, kTokenFileHeaderBytes, reinterpret_cast<char*>(header)));
    if (header[1] != kTokenFileVersion)
      return Status::Corruption("{}: token file version {} is not supported (expected {}{})",
                                path, header[1], kTokenFileVersion,
                                header[1] == 2 ? "; version 2 holds uint32 tokens" : "");
    if (header[2] < 0)
      return Status::Corruption("{}: header token count {} is negative", path, header[2]);
    count = static_cast<uint64_t>(header[2]);
    const uint64_t expected = kTokenFileHeaderBytes + count * sizeof(uint16_t);
    if (size != expected)
      return Status::Corruption(
          "{}: header says {} tokens, so the file should be {} bytes, but it is {} bytes ({})",
          path, count, expected, size, size < expected ? "truncated" : "trailing bytes");
    data_offset = kTokenFileHeaderBytes;
    if (header[3] < 0 || header[3] > 2) {
      return Status::Corruption("{}: header records tokenizer kind {}, which is none of 0 (not recorded), 1 (byte), 2 "
                                "(gpt2)",
                                path, header[3]);
    }
    if (tokenizer != nullptr && header[3] != 0) {
      tokenizer->kind = header[3] == 1 ? "byte" : "gpt2";
      tokenizer->vocab_size = header[4];
      tokenizer->fingerprint = static_cast<uint64_t>(static_cast<uint32_t>(header[5])) |
                               static_cast<uint64_t>(static_cast<uint32_t>(header[6])) << 32;
    }
  } else {
    if (size >= kTokenFileHeaderBytes) {
      // A header whose magic was damaged would otherwise be read as 512 bare tokens of garbage.
      int32_t header[kTokenFileHeaderInts];
      TF_RETURN_IF_ERROR(file.ReadExact(0, kTokenFileHeaderBytes, reinterpret_cast<char*>(header)));
      const bool rest_zero =
          std::all_of(header + kFirstReserved, header + kTokenFileHeaderInts, [](int32_t v) { return v == 0; });
      if (header[1] == kTokenFileVersion && header[2] >= 0 && rest_zero &&
          kTokenFileHeaderBytes + static_cast<uint64_t>(header[2]) * 2 == size) {
        return Status::Corruption("{}: has a token-file header (version {}, {} tokens) whose magic is {} instead of {}: "
                                  "the file is damaged",
                                  path, header[1], header[2], header[0], kTokenFileMagic);
      }
    }
    if (size % 2 != 0)
      return Status::Corruption(
          "{}: bare uint16 token stream has odd length {} bytes (expected a multiple of 2)", path,
          size);
    count = size / 2;
  }
  std::vector<uint16_t> tokens(count);
  TF_RETURN_IF_ERROR(file.ReadExact(data_offset, count * sizeof(uint16_t), reinterpret_cast<char*>(tokens.data())));
  return tokens;
}

Status WriteTokenFile(const std::string& path, std::span<const uint16_t> tokens, bool with_header, Env* env,
                      const TokenFileTokenizer& tokenizer) {
  if (!tokenizer.kind.empty() && KindCode(tokenizer.kind) == 0) {
    return Status::InvalidArgument("{}: token files record tokenizer kinds byte and gpt2, not '{}'", path,
                                   tokenizer.kind);
  }
  const std::string_view data(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  if (!with_header) {
    if (tokens.empty())
      return Status::InvalidArgument("{}: a bare token stream must hold at least one token",
                                     path);
    return env->WriteFileAtomically(path, data);
  }
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return Status::InvalidArgument("{}: {} tokens do not fit the header's int32 count", path,
                                   tokens.size());
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  if (!tokenizer.kind.empty()) {
    header[3] = KindCode(tokenizer.kind);
    header[4] = tokenizer.vocab_size;
    header[5] = static_cast<int32_t>(static_cast<uint32_t>(tokenizer.fingerprint));
    header[6] = static_cast<int32_t>(static_cast<uint32_t>(tokenizer.fingerprint >> 32));
  }
  return env->WriteFileAtomically(path, [&](WritableFile* f) {
    TF_RETURN_IF_ERROR(f->Append(std::string_view(reinterpret_cast<const char*>(header), kTokenFileHeaderBytes)));
    return f->Append(data);
  });
}

Status ValidateTokens(std::span<const uint16_t> tokens, int vocab_size, const std::string& path) {
  if (vocab_size <= 0)
    return Status::InvalidArgument("{}: vocab size {} must be positive", path, vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int>(tokens[i]) >= vocab_size)
      return Status::InvalidArgument("{}: token id {} at position {} is >= vocab size {}", path,
                                     tokens[i], i, vocab_size);
  }
  return Status::OK();
}

}  // namespace tf
