// checkpoint/chunk_codec.h: every encoding round-trips bit-exactly (random bit patterns, NaN
// payloads, infinities, denormals, -0.0, realistic weights and AdamW moments, empty and odd sizes);
// EncodeChunk picks the smallest and is never larger than raw + header; the XOR delta of an
// unchanged chunk is tiny; and every malformed input — each truncation, each flipped header bit,
// random damage, wrong base or out sizes — is Corruption, leaves out untouched and never crashes.
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "checkpoint/chunk_codec.h"

namespace tf::checkpoint {
namespace {

constexpr ChunkEncoding kAll[] = {ChunkEncoding::kRaw, ChunkEncoding::kPlanes, ChunkEncoding::kXorPlanes};

float FromBits(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}

std::vector<float> RandomBits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = FromBits(static_cast<uint32_t>(rng()));
  return v;
}

std::vector<float> Normal(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// `steps` AdamW steps (lr, betas 0.9/0.95, weight decay 0.1) on w with noisy gradients around a
// fixed per-parameter mean; m and v are the moments afterwards.
struct AdamState {
  std::vector<float> w, m, v;
};
AdamState AdamSteps(std::vector<float> w, int steps, float lr, uint32_t seed) {
  const size_t n = w.size();
  std::mt19937 rng(seed);
  std::normal_distribution<float> grad(0.0f, 1e-3f);
  std::vector<float> mean(n), m(n, 0.0f), v(n, 0.0f);
  for (float& g : mean) g = grad(rng);
  for (int s = 1; s <= steps; ++s) {
    const float bc1 = 1.0f - std::pow(0.9f, static_cast<float>(s));
    const float bc2 = 1.0f - std::pow(0.95f, static_cast<float>(s));
    for (size_t i = 0; i < n; ++i) {
      const float g = mean[i] + grad(rng);
      m[i] = 0.9f * m[i] + 0.1f * g;
      v[i] = 0.95f * v[i] + 0.05f * g * g;
      w[i] -= lr * ((m[i] / bc1) / (std::sqrt(v[i] / bc2) + 1e-8f) + 0.1f * w[i]);
    }
  }
  return {std::move(w), std::move(m), std::move(v)};
}

// Every IEEE special the codec must carry through untouched.
std::vector<float> Specials() {
  const uint32_t bits[] = {
      0x00000000u, 0x80000000u,              // +0, -0
      0x7f800000u, 0xff800000u,              // +inf, -inf
      0x7fc00000u, 0xffc00000u,              // quiet NaNs
      0x7f800001u, 0x7fbfffffu, 0xff800123u, // signalling NaNs with payloads
      0x7fc0beefu, 0xffffffffu,              // quiet NaNs with payloads
      0x00000001u, 0x807fffffu, 0x00400000u, // denormals
      0x00800000u, 0x7f7fffffu, 0xff7fffffu, // FLT_MIN, +-FLT_MAX
      0x3f800000u, 0xbf800000u,              // +-1
  };
  std::vector<float> v;
  for (uint32_t b : bits) v.push_back(FromBits(b));
  return v;
}

::testing::AssertionResult BitEqual(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y) {
      return ::testing::AssertionFailure() << "element " << i << ": " << std::hex << x << " vs " << y;
    }
  }
  return ::testing::AssertionSuccess();
}

std::string Encode(ChunkEncoding e, std::span<const float> data, std::span<const float> base) {
  auto bytes = EncodeChunkAs(e, data, base);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

// Decodes and checks bit-exactness; base is passed for every encoding (ignored but for XOR).
void ExpectRoundTrip(std::string_view bytes, std::span<const float> data, std::span<const float> base,
                     const std::string& what) {
  std::vector<float> out(data.size(), 123.0f);
  Status s = DecodeChunk(bytes, base, out);
  ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
  EXPECT_TRUE(BitEqual(out, data)) << what;
}

uint64_t U64At(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

TEST(ChunkCodecTest, EncodingNames) {
  for (ChunkEncoding e : kAll) {
    auto parsed = ParseEncoding(EncodingName(e));
    ASSERT_TRUE(parsed.ok()) << EncodingName(e);
    EXPECT_EQ(*parsed, e);
  }
  EXPECT_EQ(EncodingName(ChunkEncoding::kRaw), "raw");
  EXPECT_EQ(EncodingName(ChunkEncoding::kPlanes), "planes");
  EXPECT_EQ(EncodingName(ChunkEncoding::kXorPlanes), "xor-planes");
  for (const char* bad : {"", "RAW", "xor", "zstd"}) {
    auto parsed = ParseEncoding(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << parsed.status().ToString();
  }
}

TEST(ChunkCodecTest, EveryEncodingRoundTripsEveryKindOfData) {
  ByteBuffer reused;
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{1000}, size_t{4097}, size_t{65537}}) {
    const std::vector<float> w0 = Normal(n, 0.02f, 1);
    const AdamState adam = AdamSteps(w0, 3, 1e-4f, 2);
    const std::vector<float> bits = RandomBits(n, 3);
    const std::vector<float> bits_base = RandomBits(n, 4);
    const struct {
      const char* name;
      const std::vector<float>& data;
      const std::vector<float>& base;
    } cases[] = {{"weights", w0, bits_base}, {"updated weights", adam.w, w0}, {"adam m", adam.m, w0},
                 {"adam v", adam.v, adam.v}, {"random bits", bits, bits_base}, {"same", bits, bits}};
    for (const auto& c : cases) {
      for (ChunkEncoding e : kAll) {
        const std::string what = fmt::format("{} n={} {}", c.name, n, EncodingName(e));
        const std::string bytes = Encode(e, c.data, c.base);
        ExpectRoundTrip(bytes, c.data, c.base, what);
      }
      for (bool try_planes : {true, false}) {
        for (int level : {kChunkFastestZstdLevel, -5, 1, 3}) {
          const std::string what = fmt::format("{} n={} EncodeChunk level {}", c.name, n, level);
          const EncodedChunk enc = EncodeChunk(c.data, c.base, {.zstd_level = level, .try_planes = try_planes});
          EXPECT_LE(enc.bytes.size(), kChunkHeaderBytes + 4 * n) << what;
          if (!try_planes) {
            EXPECT_NE(enc.encoding, ChunkEncoding::kPlanes) << what;
          }
          ExpectRoundTrip(enc.bytes, c.data, c.base, what);
          // Into a reused buffer that held a longer chunk before: the same encoding and bytes.
          reused.clear();
          reused.append(kChunkHeaderBytes + 4 * n + 100, '\x5a');
          EXPECT_EQ(EncodeChunkInto(c.data, c.base, {.zstd_level = level, .try_planes = try_planes}, reused),
                    enc.encoding) << what;
          EXPECT_EQ(reused.view(), enc.bytes) << what;
        }
      }
    }
  }
}

TEST(ChunkCodecTest, SpecialValuesAreBitExact) {
  // Repeated so the planes are long enough for zstd to take them; the base is shifted by one.
  const std::vector<float> specials = Specials();
  std::vector<float> data, base;
  for (size_t i = 0; i < 9 * specials.size(); ++i) {
    data.push_back(specials[i % specials.size()]);
    base.push_back(specials[(i + 1) % specials.size()]);
  }
  for (ChunkEncoding e : kAll) {
    ExpectRoundTrip(Encode(e, data, base), data, base, std::string(EncodingName(e)));
    if (e != ChunkEncoding::kXorPlanes) {
      ExpectRoundTrip(Encode(e, data, {}), data, {}, std::string(EncodingName(e)) + " no base");
    }
  }
  ExpectRoundTrip(EncodeChunk(data, base).bytes, data, base, "EncodeChunk");
}

TEST(ChunkCodecTest, PicksTheSmallestAndNeverExceedsRaw) {
  const size_t n = 1 << 16;
  const size_t raw = kChunkHeaderBytes + 4 * n;
  const std::vector<float> bits = RandomBits(n, 5);
  EncodedChunk enc = EncodeChunk(bits, {});
  EXPECT_EQ(enc.encoding, ChunkEncoding::kRaw);
  EXPECT_EQ(enc.bytes.size(), raw);
  EXPECT_EQ(EncodeChunk(bits, RandomBits(n, 6)).encoding, ChunkEncoding::kRaw);

  // N(0, 0.02) weights: the sign/exponent plane compresses, the mantissa planes are stored.
  const std::vector<float> w0 = Normal(n, 0.02f, 7);
  enc = EncodeChunk(w0, {});
  EXPECT_EQ(enc.encoding, ChunkEncoding::kPlanes);
  EXPECT_LT(enc.bytes.size(), raw / 1.15) << "ratio " << static_cast<double>(raw) / enc.bytes.size();
  EXPECT_EQ(enc.bytes[16 + 3], 1) << "sign/exponent plane should be zstd";
  EXPECT_EQ(enc.bytes[16 + 0], 0) << "lowest mantissa plane should be stored";
  const size_t planes_size = enc.bytes.size();
  // Negative levels keep Huffman literals (plain zstd -5 would give ~1.07 here).
  EXPECT_LT(EncodeChunk(w0, {}, {.zstd_level = -5}).bytes.size(), raw / 1.15);

  // A few small AdamW steps later: the XOR delta beats the planes.
  const AdamState adam = AdamSteps(w0, 10, 1e-4f, 8);
  enc = EncodeChunk(adam.w, w0);
  EXPECT_EQ(enc.encoding, ChunkEncoding::kXorPlanes);
  EXPECT_LT(enc.bytes.size(), raw / 1.3) << "ratio " << static_cast<double>(raw) / enc.bytes.size();
  EXPECT_LT(enc.bytes.size(), planes_size);
  EXPECT_EQ(EncodeChunk(adam.w, w0).bytes, enc.bytes) << "not deterministic";

  // An unchanged chunk is nearly free as a delta; a base never makes the result bigger.
  enc = EncodeChunk(w0, w0);
  EXPECT_EQ(enc.encoding, ChunkEncoding::kXorPlanes);
  EXPECT_LT(enc.bytes.size(), 200u);
  EXPECT_LE(EncodeChunk(adam.v, w0).bytes.size(), EncodeChunk(adam.v, {}).bytes.size());

  // try_planes = false: raw or the delta only.
  EXPECT_EQ(EncodeChunk(w0, {}, {.try_planes = false}).encoding, ChunkEncoding::kRaw);
  EXPECT_EQ(EncodeChunk(adam.w, w0, {.try_planes = false}).encoding, ChunkEncoding::kXorPlanes);
}

TEST(ChunkCodecTest, DeterministicAcrossThreadsAndEarlierCalls) {
  const std::vector<float> w0 = Normal(5000, 0.02f, 9);
  const std::vector<float> w1 = AdamSteps(w0, 2, 1e-4f, 10).w;
  const std::string first = Encode(ChunkEncoding::kXorPlanes, w1, w0);
  (void)EncodeChunk(RandomBits(100000, 11), {}, {.zstd_level = 9});  // other sizes, other level
  EXPECT_EQ(Encode(ChunkEncoding::kXorPlanes, w1, w0), first);
  std::string other_thread;
  std::thread([&] { other_thread = Encode(ChunkEncoding::kXorPlanes, w1, w0); }).join();
  EXPECT_EQ(other_thread, first);
}

TEST(ChunkCodecTest, HeaderLayout) {
  const std::vector<float> w = Normal(3000, 0.02f, 12);
  const std::string raw = Encode(ChunkEncoding::kRaw, w, {});
  ASSERT_EQ(raw.size(), kChunkHeaderBytes + 4 * w.size());
  EXPECT_EQ(raw.substr(0, 4), "TFCK");
  EXPECT_EQ(raw[4], kChunkFormatVersion);
  EXPECT_EQ(raw[5], 0);
  EXPECT_EQ(U64At(raw, 8), w.size());
  EXPECT_EQ(std::memcmp(raw.data() + 16, w.data(), 4 * w.size()), 0);

  const std::string planes = Encode(ChunkEncoding::kPlanes, w, {});
  EXPECT_EQ(planes[5], 1);
  uint64_t total = kChunkPlanesHeaderBytes;
  for (size_t k = 0; k < 4; ++k) total += U64At(planes, 24 + 8 * k);
  EXPECT_EQ(planes.size(), total);
  // Plane 0 is stored: byte 0 of each float.
  ASSERT_EQ(planes[16], 0);
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i], 4);
    ASSERT_EQ(static_cast<uint8_t>(planes[kChunkPlanesHeaderBytes + i]), bits & 0xff) << i;
  }
  EXPECT_EQ(Encode(ChunkEncoding::kXorPlanes, w, w)[5], 2);
}

TEST(ChunkCodecTest, ChunkHashIsXxh64OfTheBytes) {
  const std::vector<float> w = Normal(1000, 0.02f, 13);
  EXPECT_EQ(ChunkHash(w), XXH64(w.data(), 4 * w.size(), 0));
  EXPECT_EQ(ChunkHash({}), XXH64(nullptr, 0, 0));
  std::vector<float> v = w;
  v[500] = std::nextafter(v[500], 1.0f);
  EXPECT_NE(ChunkHash(v), ChunkHash(w));
  const float zero[] = {0.0f}, minus_zero[] = {-0.0f};
  EXPECT_NE(ChunkHash(zero), ChunkHash(minus_zero));
}

TEST(ChunkCodecTest, InPlaceDeltaDecode) {
  const std::vector<float> w0 = Normal(4096, 0.02f, 14);
  const std::vector<float> w1 = AdamSteps(w0, 1, 1e-4f, 15).w;
  const std::string bytes = Encode(ChunkEncoding::kXorPlanes, w1, w0);
  std::vector<float> buf = w0;
  ASSERT_TRUE(DecodeChunk(bytes, buf, buf).ok());
  EXPECT_TRUE(BitEqual(buf, w1));
}

// Decoding must fail with Corruption and leave out as it was.
void ExpectCorrupt(std::string_view bytes, std::span<const float> base, size_t n, const std::string& what,
                   const std::string& message_part = "") {
  std::vector<float> out(n, -7.0f);
  Status s = DecodeChunk(bytes, base, out);
  ASSERT_FALSE(s.ok()) << what;
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << what << ": " << s.ToString();
  if (!message_part.empty()) {
    EXPECT_NE(s.message().find(message_part), std::string::npos) << what << ": " << s.ToString();
  }
  for (float x : out) ASSERT_EQ(x, -7.0f) << what << ": out was written";
}

// A small chunk with both stored and zstd planes in every encoding.
struct Small {
  std::vector<float> base = Normal(300, 0.02f, 16);
  std::vector<float> data = AdamSteps(base, 2, 1e-4f, 17).w;
  std::string Bytes(ChunkEncoding e) const { return Encode(e, data, base); }
};

TEST(ChunkCodecTest, EveryTruncationIsCorruption) {
  const Small s;
  for (ChunkEncoding e : kAll) {
    const std::string bytes = s.Bytes(e);
    if (e != ChunkEncoding::kRaw) {
      ASSERT_TRUE(bytes[16 + 3] == 1) << EncodingName(e) << ": test data should give a zstd plane";
    }
    for (size_t len = 0; len < bytes.size(); ++len) {
      ExpectCorrupt(std::string_view(bytes).substr(0, len), s.base, s.data.size(),
                    fmt::format("{} cut to {} of {} bytes", EncodingName(e), len, bytes.size()));
    }
    ExpectCorrupt(bytes + '\0', s.base, s.data.size(), fmt::format("{} plus a byte", EncodingName(e)));
  }
}

TEST(ChunkCodecTest, EveryFlippedHeaderBitIsCorruption) {
  const Small s;
  for (ChunkEncoding e : kAll) {
    const std::string bytes = s.Bytes(e);
    const size_t header = e == ChunkEncoding::kRaw ? kChunkHeaderBytes : kChunkPlanesHeaderBytes;
    for (size_t at = 0; at < header; ++at) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = bytes;
        bad[at] = static_cast<char>(bad[at] ^ (1 << bit));
        ExpectCorrupt(bad, s.base, s.data.size(), fmt::format("{} byte {} bit {}", EncodingName(e), at, bit));
      }
    }
  }
}

TEST(ChunkCodecTest, MessagesNameTheProblem) {
  const Small s;
  const size_t n = s.data.size();
  const std::string xor_bytes = s.Bytes(ChunkEncoding::kXorPlanes);
  ASSERT_EQ(xor_bytes[16 + 0], 0) << "test data should give a stored plane 0";
  ExpectCorrupt("TFC", s.base, n, "short", "shorter than its 16-byte header");
  std::string bad = xor_bytes;
  bad[0] = 'X';
  ExpectCorrupt(bad, s.base, n, "magic", "bad magic");
  bad = xor_bytes;
  bad[4] = 2;
  ExpectCorrupt(bad, s.base, n, "version", "format version 2");
  bad = xor_bytes;
  bad[5] = 7;
  ExpectCorrupt(bad, s.base, n, "encoding", "unknown encoding 7");
  ExpectCorrupt(xor_bytes, s.base, n - 1, "out size", "holds 300 floats, but out has room for 299");
  ExpectCorrupt(xor_bytes, {}, n, "no base", "needs a base of that size, got 0 floats");
  ExpectCorrupt(xor_bytes, std::span(s.base).first(n - 1), n, "short base", "got 299 floats");
  bad = xor_bytes;
  bad[16 + 3] = 5;
  ExpectCorrupt(bad, s.base, n, "storage", "plane 3 has unknown storage 5");
  bad = xor_bytes;
  bad[16 + 0] = 1;  // a stored plane read as zstd
  ExpectCorrupt(bad, s.base, n, "stored as zstd", "plane 0: zstd:");
  ExpectCorrupt(Encode(ChunkEncoding::kRaw, s.data, {}).substr(0, 100), {}, n, "raw", "has 84 payload bytes, expected 1200");

  auto parsed = EncodeChunkAs(ChunkEncoding::kXorPlanes, s.data, std::span(s.base).first(10));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
}

// A planes chunk whose plane 3 is a zstd frame of `plane3` (the other planes stored, zero).
std::string CraftPlanes(size_t n, const std::string& plane3) {
  std::string frame(ZSTD_compressBound(plane3.size()), '\0');
  frame.resize(ZSTD_compress(frame.data(), frame.size(), plane3.data(), plane3.size(), 1));
  std::string out = "TFCK";
  out += static_cast<char>(kChunkFormatVersion);
  out += static_cast<char>(ChunkEncoding::kPlanes);
  out.append(2, '\0');
  auto put64 = [&](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
  put64(n);
  out += std::string("\0\0\0\1", 4);
  out.append(4, '\0');
  for (int k = 0; k < 3; ++k) put64(n);
  put64(frame.size());
  out.append(3 * n, '\0');
  return out + frame;
}

TEST(ChunkCodecTest, ZstdPlanesOfTheWrongSize) {
  const size_t n = 1000;
  std::vector<float> out(n);
  ASSERT_TRUE(DecodeChunk(CraftPlanes(n, std::string(n, '\x3f')), {}, out).ok());
  EXPECT_EQ(out[0], FromBits(0x3f000000u));
  ExpectCorrupt(CraftPlanes(n, std::string(n - 1, '\x3f')), {}, n, "short plane", "decompresses to 999 bytes");
  ExpectCorrupt(CraftPlanes(n, std::string(n + 1, '\x3f')), {}, n, "long plane", "plane 3: zstd:");
  ExpectCorrupt(CraftPlanes(0, std::string(1, 'x')), {}, 0, "empty chunk, long plane", "plane 3: zstd:");
  std::vector<float> none;
  EXPECT_TRUE(DecodeChunk(CraftPlanes(0, ""), {}, none).ok());
}

// Random damage anywhere (payload included): any result but a crash; errors are Corruption. Without
// a checksum a damaged stored plane decodes to wrong values — the manifest's xxh64 catches that.
TEST(ChunkCodecTest, RandomDamageNeverCrashes) {
  const Small s;
  std::mt19937 rng(18);
  int failures = 0;
  for (ChunkEncoding e : kAll) {
    const std::string bytes = s.Bytes(e);
    for (int trial = 0; trial < 3000; ++trial) {
      std::string bad = bytes;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
      if (rng() % 4 == 0) bad.resize(rng() % bad.size());
      std::vector<float> out(s.data.size());
      Status st = DecodeChunk(bad, s.base, out);
      if (!st.ok()) {
        ++failures;
        ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
      }
    }
  }
  EXPECT_GT(failures, 1000);
}

}  // namespace
}  // namespace tf::checkpoint
