// Tests for model/safetensors.h: round trips, the on-disk layout checked byte by byte against
// the spec (docs/formats.md), F16/BF16 conversion against an independent ldexp-based reference,
// and every kind of malformed file producing the right code and a message naming the file.
#include "model/safetensors.h"

#include "base/fault_env.h"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tf {
namespace {

namespace fs = std::filesystem;

// Reference binary16 -> float, written independently of the library (ldexp on the fields).
float RefHalf(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = mant ? std::nan("") : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -24);
  else v = std::ldexp(1024 + mant, exp - 25);
  return static_cast<float>(sign ? -v : v);
}
float RefBf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("tf_safetensors_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes raw bytes to a file in the test directory; returns its path.
  std::string WriteBytes(const std::string& name, const std::string& bytes) const {
    const std::string p = Path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  // A file with the given header text (length prefix computed) and `data_bytes` data bytes.
  std::string WriteRaw(const std::string& name, const std::string& header,
                       const std::string& data) const {
    const uint64_t n = header.size();
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    return WriteBytes(name, bytes + header + data);
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // The files left in the test directory (to catch leftover .tmp files).
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// Expects `r` to have failed with `code` and a message naming `path` and containing `needle`.
template <typename T>
void ExpectError(const StatusOr<T>& r, StatusCode code, const std::string& path,
                 const std::string& needle = "") {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << r.status().ToString();
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

TEST_F(SafetensorsTest, RoundTripF32PreservesOrderShapesBitsAndMetadata) {
  NamedTensor w{"z.weight", {2, 3}, {1.f, -2.f, 3.5f, 0.f, -0.f, 1e-30f}};
  NamedTensor s{"a.scalar", {}, {42.f}};
  NamedTensor e{"m.empty", {0, 4}, {}};
  NamedTensor sp{"b.special", {4}, {INFINITY, -INFINITY, std::nanf(""), 1e-45f}};
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "17"}};
  const std::string p = Path("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(p, {&w, &s, &e, &sp}, meta).ok());
  EXPECT_EQ(Listing(), std::vector<std::string>{"rt.safetensors"});

  auto r = ReadSafetensors(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->metadata, meta);
  ASSERT_EQ(r->tensors.size(), 4u);
  const NamedTensor* want[] = {&w, &s, &e, &sp};
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(want[i]->name);
    EXPECT_EQ(r->tensors[i].name, want[i]->name);
    EXPECT_EQ(r->tensors[i].shape, want[i]->shape);
    EXPECT_TRUE(SameBits(r->tensors[i].data, want[i]->data));
  }
}

TEST_F(SafetensorsTest, TensorViewOverloadAndOverwrite) {
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.5f * static_cast<float>(i);
  const std::string p = Path("v.safetensors");
  ASSERT_TRUE(WriteSafetensors(p, {TensorView{"x", {10, 100}, big.data()}}, {}).ok());
  // Overwrite the same path: the new contents replace the old atomically.
  ASSERT_TRUE(WriteSafetensors(p, {TensorView{"y", {3}, big.data() + 1}}, {}).ok());
  EXPECT_EQ(Listing(), std::vector<std::string>{"v.safetensors"});
  auto r = ReadSafetensors(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].name, "y");
  EXPECT_EQ(r->tensors[0].data, (std::vector<float>{0.5f, 1.f, 1.5f}));
  EXPECT_TRUE(r->metadata.empty());
}

TEST_F(SafetensorsTest, RawLayoutMatchesSpec) {
  NamedTensor a{"first", {2}, {1.f, 2.f}};
  NamedTensor b{"second", {1, 3}, {3.f, 4.f, 5.f}};
  const std::string p = Path("layout.safetensors");
  ASSERT_TRUE(WriteSafetensors(p, {&a, &b}, {{"k", "v"}}).ok());
  const std::string bytes = ReadAll(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);  // little-endian
  EXPECT_EQ(n % 8, 0u) << "header padded so data starts 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 5 * 4);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding is spaces";

  nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"], nlohmann::json::object({{"k", "v"}}));
  EXPECT_EQ(j["first"]["dtype"], "F32");
  EXPECT_EQ(j["first"]["shape"], nlohmann::json::array({2}));
  EXPECT_EQ(j["first"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(j["second"]["shape"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(j["second"]["data_offsets"], nlohmann::json::array({8, 20}));
  EXPECT_EQ(j.size(), 3u);
  const float want[] = {1.f, 2.f, 3.f, 4.f, 5.f};
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, want, sizeof(want)), 0);
}

TEST_F(SafetensorsTest, ReadsHandWrittenF16AndBf16) {
  // F16: 1, -2, 65504 (max), 2^-24 (min subnormal), 2^-14 (min normal), 1/3 rounded, -0, inf.
  const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x3555, 0x8000, 0x7c00};
  const float f16_want[] = {1.f, -2.f, 65504.f, std::ldexp(1.f, -24), std::ldexp(1.f, -14),
                            0.333251953125f, -0.f, INFINITY};
  // BF16: 1, pi rounded (3.140625), -2^-126, 3.3895314e38 (max), NaN.
  const uint16_t bf16[] = {0x3f80, 0x4049, 0x8080, 0x7f7f, 0x7fc0};
  std::string data(reinterpret_cast<const char*>(f16), sizeof(f16));
  data.append(reinterpret_cast<const char*>(bf16), sizeof(bf16));
  const std::string p = WriteRaw(
      "half.safetensors",
      R"({"h":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[5],"data_offsets":[16,26]}}   )",
      data);
  auto r = ReadSafetensors(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "h");  // data-buffer order, not JSON key order
  EXPECT_EQ(r->tensors[0].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(SameBits(r->tensors[0].data, std::vector<float>(f16_want, f16_want + 8)));
  const std::vector<float>& b = r->tensors[1].data;
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[0], 1.f);
  EXPECT_EQ(b[1], 3.140625f);
  EXPECT_EQ(b[2], -std::ldexp(1.f, -126));
  EXPECT_EQ(b[3], 3.3895313892515355e38f);
  EXPECT_TRUE(std::isnan(b[4]));
}

TEST_F(SafetensorsTest, F16ReaderExhaustiveAgainstReference) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  const std::string p = WriteRaw(
      "all.safetensors", R"({"all":{"dtype":"F16","shape":[65536],"data_offsets":[0,131072]}})",
      std::string(reinterpret_cast<const char*>(all.data()), 131072));
  auto r = ReadSafetensors(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<float>& got = r->tensors[0].data;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = RefHalf(static_cast<uint16_t>(i));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got[i])) << std::hex << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << std::hex << i;
    }
  }
}

// Writes `values` with `dtype` and returns the raw 16-bit codes from the file.
std::vector<uint16_t> WriteAndGetCodes(const std::string& p, const std::vector<float>& values,
                                       SafetensorsDtype dtype) {
  Status s = WriteSafetensors(p, {TensorView{"t", {static_cast<int64_t>(values.size())},
                                             values.data()}},
                              {}, dtype);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  f.seekg(static_cast<std::streamoff>(8 + n));
  std::vector<uint16_t> codes(values.size());
  f.read(reinterpret_cast<char*>(codes.data()), static_cast<std::streamsize>(codes.size() * 2));
  EXPECT_TRUE(f.good());
  return codes;
}

TEST_F(SafetensorsTest, F16WriterIsExactOnRepresentableValues) {
  std::vector<float> values;
  std::vector<uint16_t> want;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float v = RefHalf(static_cast<uint16_t>(i));
    if (std::isnan(v)) continue;
    values.push_back(v);
    want.push_back(static_cast<uint16_t>(i));
  }
  EXPECT_EQ(WriteAndGetCodes(Path("f16.safetensors"), values, SafetensorsDtype::kF16), want);
  auto r = ReadSafetensors(Path("f16.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(SameBits(r->tensors[0].data, values));
}

// `code` must be the nearest representable value to x (ties to an even code).
template <typename Ref>
void ExpectNearest(float x, uint16_t code, Ref ref) {
  const double q = ref(code);
  const double err = std::fabs(static_cast<double>(x) - q);
  for (int d : {-1, 1}) {
    const uint16_t nb = static_cast<uint16_t>(code + d);
    if ((nb ^ code) & 0x8000) continue;  // wrapped across the sign bit
    const double qn = ref(nb);
    if (std::isnan(qn)) continue;
    const double errn = std::fabs(static_cast<double>(x) - qn);
    ASSERT_LE(err, errn) << x << " -> code " << code << " but neighbour " << nb << " is closer";
    if (err == errn) {
      ASSERT_EQ(code & 1, 0) << x << ": tie not rounded to even";
    }
  }
}

TEST_F(SafetensorsTest, F16AndBf16WritersRoundToNearestEven) {
  std::mt19937 rng(1234);
  std::vector<float> values = {
      1.f + std::ldexp(1.f, -11),      // f16 tie -> 1.0
      1.f + 3 * std::ldexp(1.f, -11),  // f16 tie -> 1 + 2^-9
      65519.f, std::ldexp(1.f, -25),   // f16: rounds to 65504; tie -> +0
      0.75f * std::ldexp(1.f, -24),    // f16 subnormal -> 2^-24
      std::ldexp(1.f, -14) * (1 - std::ldexp(1.f, -12)),  // f16 just below min normal
      1.f + std::ldexp(1.f, -8),                          // bf16 tie -> 1.0
      1.f + 3 * std::ldexp(1.f, -8),                      // bf16 tie -> 1 + 2^-6
  };
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-26, 15), sg(0, 1);
  for (int i = 0; i < 20000; ++i)
    values.push_back((sg(rng) ? -1.f : 1.f) * std::ldexp(mant(rng), ex(rng)));

  auto h = WriteAndGetCodes(Path("h.safetensors"), values, SafetensorsDtype::kF16);
  auto b = WriteAndGetCodes(Path("b.safetensors"), values, SafetensorsDtype::kBF16);
  ASSERT_EQ(h.size(), values.size());
  EXPECT_EQ(RefHalf(h[0]), 1.f);
  EXPECT_EQ(RefHalf(h[1]), 1.f + std::ldexp(1.f, -9));
  EXPECT_EQ(RefHalf(h[2]), 65504.f);
  EXPECT_EQ(h[3], 0u);
  EXPECT_EQ(h[4], 1u);
  EXPECT_EQ(h[5], 0x0400u);
  EXPECT_EQ(RefBf16(b[6]), 1.f);
  EXPECT_EQ(RefBf16(b[7]), 1.f + std::ldexp(1.f, -6));
  for (size_t i = 0; i < values.size(); ++i) {
    ExpectNearest(values[i], b[i], RefBf16);
    if (std::fabs(values[i]) < 65504.f) ExpectNearest(values[i], h[i], RefHalf);
  }
  // Overflow and specials.
  auto s = WriteAndGetCodes(Path("s.safetensors"), {65520.f, -1e6f, INFINITY, std::nanf("")},
                            SafetensorsDtype::kF16);
  EXPECT_EQ(s, (std::vector<uint16_t>{0x7c00, 0xfc00, 0x7c00, 0x7fff}));  // NaN: the hardware's canonical one
  auto sb = WriteAndGetCodes(Path("sb.safetensors"), {INFINITY, -std::nanf(""), 3.4e38f},
                             SafetensorsDtype::kBF16);
  EXPECT_EQ(sb[0], 0x7f80u);
  EXPECT_EQ(sb[1], 0x7fffu);  // NaN: canonical, as __float2bfloat16_rn
  EXPECT_EQ(sb[2], 0x7f80u);  // 3.4e38 is above bf16 max + half ulp: rounds to inf
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const std::string p = Path("nope.safetensors");
  ExpectError(ReadSafetensors(p), StatusCode::kNotFound, p);
}

TEST_F(SafetensorsTest, DirectoryIsRejected) {
  ExpectError(ReadSafetensors(dir_.string()), StatusCode::kInvalidArgument, dir_.string());
}

TEST_F(SafetensorsTest, BadLengthPrefix) {
  {
    const std::string p = WriteBytes("empty", "");
    ExpectError(ReadSafetensors(p), StatusCode::kCorruption, p, "shorter than");
  }
  {
    const std::string p = WriteBytes("short", "abcde");
    ExpectError(ReadSafetensors(p), StatusCode::kCorruption, p, "shorter than");
  }
  {
    uint64_t n = 100;  // claims 100 header bytes, file has 10
    const std::string p =
        WriteBytes("past_end", std::string(reinterpret_cast<char*>(&n), 8) + "{}        ");
    ExpectError(ReadSafetensors(p), StatusCode::kCorruption, p, "runs past");
  }
  {
    uint64_t n = uint64_t{1} << 62;
    const std::string p =
        WriteBytes("absurd", std::string(reinterpret_cast<char*>(&n), 8) + "{}");
    ExpectError(ReadSafetensors(p), StatusCode::kCorruption, p, "limit");
  }
}

TEST_F(SafetensorsTest, EmptyHeaderObjectIsAValidEmptyFile) {
  const std::string p = WriteRaw("e", "{}      ", "");
  auto r = ReadSafetensors(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->tensors.empty());
}

struct BadHeader {
  const char* label;
  std::string header;
  size_t data_bytes;
  StatusCode code;
  const char* needle;
};

TEST_F(SafetensorsTest, MalformedHeadersAreRejected) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const BadHeader cases[] = {
      {"invalid_json", R"({"a":)", 0, StatusCode::kCorruption, "not valid"},
      {"invalid_utf8", "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
       StatusCode::kCorruption, "not valid"},
      {"top_level_array", "[1,2]", 0, StatusCode::kCorruption, "not a safetensors file"},
      {"random_bytes", "\x93\x07[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 0,
       StatusCode::kCorruption, "not a safetensors file"},
      {"entry_not_object", R"({"a":3})", 0, StatusCode::kCorruption, "'a'"},
      {"unknown_dtype", R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", 8,
       StatusCode::kInvalidArgument, "F99"},
      {"unsupported_dtype", R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
       StatusCode::kInvalidArgument, "F64"},
      {"missing_dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "'dtype'"},
      {"dtype_not_string", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "'dtype'"},
      {"missing_shape", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "'shape'"},
      {"shape_not_array", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "'shape'"},
      {"negative_dim", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "shape[0] = -2"},
      {"fractional_dim", R"({"a":{"dtype":"F32","shape":[1,2.5],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "shape[1] = 2.5"},
      {"string_dim", R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "shape[0]"},
      {"overflowing_shape",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "too many elements"},
      {"missing_offsets", R"({"a":{"dtype":"F32","shape":[2]}})", 8, StatusCode::kCorruption,
       "data_offsets"},
      {"three_offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8,
       StatusCode::kCorruption, "data_offsets"},
      {"string_offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})", 8,
       StatusCode::kCorruption, "data_offsets"},
      {"negative_offset", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8,
       StatusCode::kCorruption, "data_offsets"},
      {"begin_after_end", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8,
       StatusCode::kCorruption, "begin > end"},
      {"end_past_data", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
       StatusCode::kCorruption, "past the data buffer"},
      {"size_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "needs 3 x 4 bytes"},
      {"f16_size_mismatch", R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8,
       StatusCode::kCorruption, "needs 2 x 2 bytes"},
      {"overlap",
       "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       StatusCode::kCorruption, "overlap"},
      {"duplicate_name",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       16, StatusCode::kCorruption, "'a' appears more than once"},
      {"trailing_uncovered_bytes", "{" + ok_a + "}", 12, StatusCode::kCorruption,
       "[8, 12) are not covered"},
      {"gap_between_tensors",
       "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20,
       StatusCode::kCorruption, "[8, 12) are not covered"},
      {"metadata_not_object", R"({"__metadata__":[1],)" + ok_a + "}", 8,
       StatusCode::kCorruption, "__metadata__"},
      {"metadata_value_not_string", R"({"__metadata__":{"k":1},)" + ok_a + "}", 8,
       StatusCode::kCorruption, "__metadata__ key 'k'"},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string p = WriteRaw(std::string(c.label) + ".safetensors", c.header,
                                   std::string(c.data_bytes, '\0'));
    ExpectError(ReadSafetensors(p), c.code, p, c.needle);
  }
  // The base header itself is fine.
  const std::string p = WriteRaw("ok.safetensors", "{" + ok_a + "}", std::string(8, '\0'));
  EXPECT_TRUE(ReadSafetensors(p).ok());
}

TEST_F(SafetensorsTest, WriterRejectsBadArgumentsAndLeavesNothing) {
  const float v[4] = {1, 2, 3, 4};
  const std::string p = Path("w.safetensors");
  auto expect_invalid = [&](const std::vector<TensorView>& ts, const std::string& needle) {
    Status s = WriteSafetensors(p, ts, {});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(p), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  expect_invalid({{"a", {2}, v}, {"a", {2}, v + 2}}, "more than once");
  expect_invalid({{"", {2}, v}}, "invalid tensor name");
  expect_invalid({{"__metadata__", {2}, v}}, "invalid tensor name");
  expect_invalid({{"a", {-1}, v}}, "negative dimension");
  expect_invalid({{"a", {2}, nullptr}}, "no data");
  expect_invalid({{"bad\xff", {2}, v}}, "cannot encode header");
  NamedTensor wrong{"w", {3}, {1.f, 2.f}};
  Status s = WriteSafetensors(p, {&wrong}, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("'w' has 2 values but its shape needs 3"), std::string::npos);
  EXPECT_TRUE(Listing().empty());

  // An OS failure (the directory does not exist) is an IOError and leaves nothing behind.
  const std::string missing_dir = Path("no/such/dir/x.safetensors");
  s = WriteSafetensors(missing_dir, {TensorView{"a", {2}, v}}, {});
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find(missing_dir), std::string::npos) << s.ToString();
  EXPECT_TRUE(Listing().empty());
}

TEST_F(SafetensorsTest, FailedWriteKeepsPreviousFile) {
  const float v[2] = {7, 8};
  const std::string p = Path("keep.safetensors");
  ASSERT_TRUE(WriteSafetensors(p, {TensorView{"old", {2}, v}}, {}).ok());
  // Each way the replacement can fail on real storage: EIO on a write, a full disk mid-write (the
  // torn prefix lands in the temporary only), a failed fsync, a failed rename.
  const std::vector<std::pair<std::string, FaultOptions>> faults = {
      {"write", FaultOptions{.fail_write_at = 1}},
      {"enospc", FaultOptions{.enospc_after_bytes = 10}},
      {"sync", FaultOptions{.fail_sync_at = 1}},
      {"rename", FaultOptions{.fail_rename_at = 1}},
  };
  for (const auto& [what, options] : faults) {
    FaultInjectionEnv env(Env::Default(), options);
    Status s = WriteSafetensors(p, {TensorView{"new", {2}, v}}, {}, SafetensorsDtype::kF32, &env);
    EXPECT_EQ(s.code(), StatusCode::kIOError) << what << ": " << s.ToString();
    EXPECT_NE(s.message().find(p), std::string::npos) << what << ": " << s.ToString();
    auto r = ReadSafetensors(p);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().ToString();
    EXPECT_EQ(r->tensors[0].name, "old") << what;
    // No temporary is left behind.
    EXPECT_EQ(Listing(), std::vector<std::string>{"keep.safetensors"}) << what;
  }
}

}  // namespace
}  // namespace tf
