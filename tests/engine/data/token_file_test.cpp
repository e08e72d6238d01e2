// Tests for engine/data/token_file.h: both layouts round trip, the header is laid out as llm.c
// writes it, every malformed file gives the right code and a message naming the file, and the
// headered/bare detection is unambiguous for GPT-2's vocabulary.
#include "engine/data/token_file.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/test_dir.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

// The magic, seen as the first two tokens of a bare stream, is not a valid GPT-2 token pair:
// its first half is >= GPT-2's vocabulary (50257) and even the padded one (50304).
static_assert(kTokenFileMagicLowHalf >= 50304);
static_assert(kTokenFileHeaderBytes == 1024);

class TokenFileTest : public ::testing::Test {
 protected:

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteBytes(const std::string& name, const std::string& bytes) const {
    const std::string p = Path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  // A llm.c-style header with the given fields followed by `payload` bytes.
  std::string WriteHeadered(const std::string& name, int32_t magic, int32_t version,
                            int32_t count, size_t payload_bytes) const {
    int32_t header[256] = {};
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    return WriteBytes(name, std::string(reinterpret_cast<const char*>(header), 1024) +
                                std::string(payload_bytes, '\x01'));
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  testing_util::TestDir tmp_{"tf_token_file"};
  fs::path dir_ = tmp_.path();
};

void ExpectError(const StatusOr<std::vector<uint16_t>>& r, StatusCode code,
                 const std::string& path, const std::string& needle = "") {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << r.status().ToString();
}

const std::vector<uint16_t> kTokens = {50256, 0, 1, 15496, 11, 995, 65535, 50256};

TEST_F(TokenFileTest, HeaderedRoundTripAndLayout) {
  const std::string p = Path("train.bin");
  ASSERT_TRUE(WriteTokenFile(p, kTokens).ok());
  EXPECT_EQ(Listing(), std::vector<std::string>{"train.bin"});  // no .tmp left behind

  const std::string bytes = ReadAll(p);
  ASSERT_EQ(bytes.size(), 1024 + 2 * kTokens.size());
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], static_cast<int32_t>(kTokens.size()));
  for (int i = 3; i < 256; ++i) ASSERT_EQ(header[i], 0) << i;
  // Byte-level check of little-endian encoding: 20240520 = 0x0134D888.
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0x88);
  EXPECT_EQ(static_cast<uint8_t>(bytes[3]), 0x01);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1024]), 50256 & 0xff);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1025]), 50256 >> 8);

  auto r = ReadTokenFile(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kTokens);
}

TEST_F(TokenFileTest, HeaderRecordsTheTokenizerInReservedWords) {
  const std::string p = Path("gpt2.bin");
  const TokenFileTokenizer gpt2{"gpt2", 50257, 0x0123456789abcdefull};
  ASSERT_TRUE(WriteTokenFile(p, kTokens, /*with_header=*/true, Env::Default(), gpt2).ok());
  const std::string bytes = ReadAll(p);
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  // llm.c reads words 0-2 only: they are what it expects.
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], static_cast<int32_t>(kTokens.size()));
  EXPECT_EQ(header[3], 2);
  EXPECT_EQ(header[4], 50257);
  EXPECT_EQ(static_cast<uint32_t>(header[5]), 0x89abcdefu);
  EXPECT_EQ(static_cast<uint32_t>(header[6]), 0x01234567u);
  for (int i = 7; i < 256; ++i) ASSERT_EQ(header[i], 0) << i;

  TokenFileTokenizer read{"stale", 1, 1};
  auto r = ReadTokenFile(p, Env::Default(), &read);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kTokens);
  EXPECT_EQ(read, gpt2);

  // Files that record nothing (bare, or written without a tokenizer) read as kind "".
  ASSERT_TRUE(WriteTokenFile(Path("plain.bin"), kTokens).ok());
  ASSERT_TRUE(ReadTokenFile(Path("plain.bin"), Env::Default(), &read).ok());
  EXPECT_EQ(read, TokenFileTokenizer{});
  ASSERT_TRUE(WriteTokenFile(Path("bare.bin"), kTokens, /*with_header=*/false).ok());
  read = gpt2;
  ASSERT_TRUE(ReadTokenFile(Path("bare.bin"), Env::Default(), &read).ok());
  EXPECT_EQ(read, TokenFileTokenizer{});

  // An unknown kind is refused on both sides.
  Status s = WriteTokenFile(Path("x.bin"), kTokens, true, Env::Default(), TokenFileTokenizer{"sentencepiece", 1, 0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  int32_t bad[256] = {};
  bad[0] = 20240520;
  bad[1] = 1;
  bad[2] = 0;
  bad[3] = 7;
  const std::string q = WriteBytes("bad.bin", std::string(reinterpret_cast<const char*>(bad), 1024));
  auto rb = ReadTokenFile(q);
  EXPECT_EQ(rb.status().code(), StatusCode::kCorruption) << rb.status().ToString();
  EXPECT_NE(rb.status().message().find("tokenizer kind 7"), std::string::npos) << rb.status().ToString();
}

TEST_F(TokenFileTest, BareRoundTrip) {
  const std::string p = Path("bare.bin");
  ASSERT_TRUE(WriteTokenFile(p, kTokens, /*with_header=*/false).ok());
  EXPECT_EQ(ReadAll(p).size(), 2 * kTokens.size());
  auto r = ReadTokenFile(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kTokens);

  // A single token is a valid bare stream (shorter than the 4-byte magic).
  ASSERT_TRUE(WriteTokenFile(p, std::vector<uint16_t>{7}, false).ok());
  r = ReadTokenFile(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::vector<uint16_t>{7});
}

TEST_F(TokenFileTest, EmptyHeaderedFileHoldsZeroTokens) {
  const std::string p = Path("empty.bin");
  ASSERT_TRUE(WriteTokenFile(p, {}).ok());
  EXPECT_EQ(ReadAll(p).size(), 1024u);
  auto r = ReadTokenFile(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->empty());
}

TEST_F(TokenFileTest, OverwriteReplacesContents) {
  const std::string p = Path("o.bin");
  ASSERT_TRUE(WriteTokenFile(p, kTokens).ok());
  ASSERT_TRUE(WriteTokenFile(p, std::vector<uint16_t>{3, 4}, false).ok());
  auto r = ReadTokenFile(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<uint16_t>{3, 4}));
  EXPECT_EQ(Listing(), std::vector<std::string>{"o.bin"});
}

TEST_F(TokenFileTest, WriterErrors) {
  const std::string p = Path("w.bin");
  Status s = WriteTokenFile(p, {}, /*with_header=*/false);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(p), std::string::npos);
  const std::string missing = Path("no/dir/w.bin");
  s = WriteTokenFile(missing, kTokens);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find(missing), std::string::npos);
  EXPECT_TRUE(Listing().empty());
}

TEST_F(TokenFileTest, MissingFileIsNotFound) {
  const std::string p = Path("missing.bin");
  ExpectError(ReadTokenFile(p), StatusCode::kNotFound, p);
}

TEST_F(TokenFileTest, EmptyFileIsCorruption) {
  const std::string p = WriteBytes("empty.bin", "");
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p, "empty");
}

TEST_F(TokenFileTest, WrongVersion) {
  const std::string p = WriteHeadered("v2.bin", kTokenFileMagic, 2, 4, 8);
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p, "version 2");
}

TEST_F(TokenFileTest, TruncatedPayloadNamesSizes) {
  const std::string p = WriteHeadered("trunc.bin", kTokenFileMagic, 1, 10, 12);
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p,
              "header says 10 tokens, so the file should be 1044 bytes, but it is 1036 bytes "
              "(truncated)");
}

TEST_F(TokenFileTest, TrailingBytesNamesSizes) {
  const std::string p = WriteHeadered("trail.bin", kTokenFileMagic, 1, 2, 5);
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p,
              "should be 1028 bytes, but it is 1029 bytes (trailing bytes)");
}

TEST_F(TokenFileTest, NegativeCount) {
  const std::string p = WriteHeadered("neg.bin", kTokenFileMagic, 1, -1, 0);
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p, "negative");
}

TEST_F(TokenFileTest, TruncatedHeader) {
  int32_t magic = kTokenFileMagic;
  const std::string p =
      WriteBytes("hdr.bin", std::string(reinterpret_cast<char*>(&magic), 4) + "abcd");
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p, "shorter than the 1024 byte header");
}

TEST_F(TokenFileTest, OddBareLength) {
  const std::string p = WriteBytes("odd.bin", "abc");
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p, "odd length 3 bytes");
}

TEST_F(TokenFileTest, BareStreamStartingWithMagicTokensIsNotSilentlyMisread) {
  // Tokens (55432, 308) spell the magic; such a stream is outside GPT-2's vocabulary and is
  // read as a (broken) header rather than as tokens.
  const std::vector<uint16_t> t = {static_cast<uint16_t>(kTokenFileMagicLowHalf),
                                   static_cast<uint16_t>(kTokenFileMagicHighHalf), 1, 2};
  const std::string p = Path("magic_tokens.bin");
  ASSERT_TRUE(WriteTokenFile(p, t, false).ok());
  ExpectError(ReadTokenFile(p), StatusCode::kCorruption, p, "magic");
  // One token short of the magic is an ordinary bare stream.
  const std::vector<uint16_t> u = {50256, static_cast<uint16_t>(kTokenFileMagicHighHalf)};
  ASSERT_TRUE(WriteTokenFile(p, u, false).ok());
  auto r = ReadTokenFile(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, u);
}

TEST_F(TokenFileTest, ValidateTokens) {
  EXPECT_TRUE(ValidateTokens(std::vector<uint16_t>{0, 50256}, 50257, "x.bin").ok());
  EXPECT_TRUE(ValidateTokens({}, 1, "x.bin").ok());
  Status s = ValidateTokens(kTokens, 50257, "data/x.bin");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "data/x.bin: token id 65535 at position 6 is >= vocab size 50257");
  s = ValidateTokens(std::vector<uint16_t>{0}, 0, "x.bin");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace tf
