// Tests for engine/data/data_loader.h: the data-order contract exactly as the header states it
// (micro-batch i reads positions (i*B*T + j) mod N, j = 0..B*T; inputs (B,T) row-major, targets
// shifted by one; rank r of W reads global micro-batch i*W + r), shuffle determinism, and the
// validation errors of Open / FromTokens.
#include "engine/data/data_loader.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/data/token_file.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

constexpr int kN = 37;  // tokens in the stream: prime, so batches never line up with its end
constexpr int kVocab = 64;

// Token at position p is p itself, so every loaded id is the stream position it came from.
std::vector<uint16_t> Iota(int n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), uint16_t{0});
  return t;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch LoadBatch(const DataLoader& d, int64_t i) {
  Batch b;
  b.inputs.resize(static_cast<size_t>(d.B()) * d.T());
  b.targets.resize(b.inputs.size());
  d.Load(i, b.inputs.data(), b.targets.data());
  return b;
}

DataLoader MustMake(std::vector<uint16_t> tokens, int B, int T, int rank = 0, int world = 1, bool shuffle = false,
                    uint64_t seed = 0) {
  auto d = DataLoader::FromTokens(std::move(tokens), kVocab, B, T, rank, world, shuffle, seed);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

void ExpectContains(const Status& s, const std::string& needle) {
  EXPECT_NE(s.message().find(needle), std::string::npos) << "expected '" << needle << "' in: " << s.ToString();
}

// (B, T) pairs: B*T < N, B*T == N - 1 (one batch covers the stream with its target) and B*T > N
// (a single micro-batch wraps around the stream, possibly more than once).
struct Shape {
  int B, T;
};
const Shape kShapes[] = {{2, 5}, {4, 9}, {3, 20}, {1, 1}, {1, 80}};

TEST(DataLoaderTest, SequentialOrderFollowsTheContract) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T));
    const DataLoader d = MustMake(Iota(kN), s.B, s.T);
    EXPECT_EQ(d.num_tokens(), kN);
    const int64_t BT = int64_t{s.B} * s.T;
    for (int64_t i = 0; i < 12; ++i) {
      const Batch got = LoadBatch(d, i);
      for (int b = 0; b < s.B; ++b) {
        for (int t = 0; t < s.T; ++t) {
          const int64_t j = int64_t{b} * s.T + t;  // row-major (B,T) index = offset in the micro-batch
          ASSERT_EQ(got.inputs[static_cast<size_t>(j)], (i * BT + j) % kN) << "i=" << i << " b=" << b << " t=" << t;
          ASSERT_EQ(got.targets[static_cast<size_t>(j)], (i * BT + j + 1) % kN)
              << "i=" << i << " b=" << b << " t=" << t;
        }
      }
    }
  }
}

TEST(DataLoaderTest, FirstBatchesSpelledOut) {
  // B=2, T=5, N=37. Micro-batch 3 starts at 3*10 = 30: positions 30..40 mod 37.
  const DataLoader d = MustMake(Iota(kN), 2, 5);
  const Batch b = LoadBatch(d, 3);
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{30, 31, 32, 33, 34, 35, 36, 0, 1, 2}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{31, 32, 33, 34, 35, 36, 0, 1, 2, 3}));
  // Micro-batch 4 starts at 40 mod 37 = 3.
  const Batch b4 = LoadBatch(d, 4);
  EXPECT_EQ(b4.inputs, (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(b4.targets, (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
}

TEST(DataLoaderTest, TwoTokenStream) {
  // The smallest valid stream: [5, 9] read circularly.
  const DataLoader d = MustMake({5, 9}, 1, 3);
  const Batch b = LoadBatch(d, 0);
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{5, 9, 5}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{9, 5, 9}));
  const Batch b1 = LoadBatch(d, 1);  // starts at 3 mod 2 = 1
  EXPECT_EQ(b1.inputs, (std::vector<int32_t>{9, 5, 9}));
}

TEST(DataLoaderTest, LargeMicroBatchIndexDoesNotOverflow) {
  const DataLoader d = MustMake(Iota(kN), 2, 5);
  const int64_t i = int64_t{1} << 40;
  // (2^40 * 10) mod 37, computed without overflow: 2^40 mod 37 via repeated doubling.
  int64_t p = 1;
  for (int k = 0; k < 40; ++k) p = p * 2 % kN;
  const int64_t start = p * 10 % kN;
  const Batch b = LoadBatch(d, i);
  for (int j = 0; j < 10; ++j) EXPECT_EQ(b.inputs[static_cast<size_t>(j)], (start + j) % kN) << j;
}

TEST(DataLoaderTest, RankReadsGlobalMicroBatchIWPlusR) {
  for (bool shuffle : {false, true}) {
    for (int W : {2, 3, 5}) {
      SCOPED_TRACE("shuffle=" + std::to_string(shuffle) + " W=" + std::to_string(W));
      const DataLoader global = MustMake(Iota(kN), 2, 5, 0, 1, shuffle, 7);
      for (int r = 0; r < W; ++r) {
        const DataLoader rank = MustMake(Iota(kN), 2, 5, r, W, shuffle, 7);
        for (int64_t i = 0; i < 8; ++i) {
          ASSERT_EQ(LoadBatch(rank, i), LoadBatch(global, i * W + r)) << "r=" << r << " i=" << i;
        }
      }
    }
  }
}

TEST(DataLoaderTest, ShuffleIsDeterministicContiguousAndSeedDependent) {
  const int B = 3, T = 4;
  const DataLoader a = MustMake(Iota(kN), B, T, 0, 1, true, 1);
  const DataLoader a2 = MustMake(Iota(kN), B, T, 0, 1, true, 1);
  const DataLoader other = MustMake(Iota(kN), B, T, 0, 1, true, 2);
  const DataLoader sequential = MustMake(Iota(kN), B, T);
  int differs_from_other_seed = 0, differs_from_sequential = 0;
  for (int64_t i = 0; i < 16; ++i) {
    const Batch x = LoadBatch(a, i);
    EXPECT_EQ(x, LoadBatch(a2, i)) << "same seed, micro-batch " << i;
    EXPECT_EQ(x, LoadBatch(a, i)) << "Load is a pure function of i";
    differs_from_other_seed += x != LoadBatch(other, i);
    differs_from_sequential += x != LoadBatch(sequential, i);
    // Each row is still a contiguous window of the circular stream, targets shifted by one.
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const size_t k = static_cast<size_t>(b * T + t);
        EXPECT_EQ(x.targets[k], (x.inputs[k] + 1) % kN);
        if (t + 1 < T) {
          EXPECT_EQ(x.inputs[k + 1], x.targets[k]);
        }
      }
    }
  }
  // With 37 possible offsets per row and 3 rows, two seeds agreeing on 16 whole batches is
  // essentially impossible; a few coincidences are allowed.
  EXPECT_GE(differs_from_other_seed, 12);
  EXPECT_GE(differs_from_sequential, 12);
}

TEST(DataLoaderTest, ShuffleRowOffsetsCoverTheStream) {
  // Offsets are hashed mod N: over many rows, most of the 37 start positions must occur.
  const DataLoader d = MustMake(Iota(kN), 4, 2, 0, 1, true, 12345);
  std::vector<int> seen(kN, 0);
  for (int64_t i = 0; i < 100; ++i) {
    const Batch x = LoadBatch(d, i);
    for (int b = 0; b < 4; ++b) ++seen[static_cast<size_t>(x.inputs[static_cast<size_t>(b * 2)])];
  }
  int distinct = 0;
  for (int c : seen) distinct += c > 0;
  EXPECT_GE(distinct, 30);  // 400 draws over 37 bins: expected ~37 distinct
}

TEST(DataLoaderTest, TokenOutsideVocabularyIsRejected) {
  std::vector<uint16_t> t = Iota(kN);
  t[5] = kVocab;  // 64 is the first invalid id
  auto d = DataLoader::FromTokens(t, kVocab, 2, 5, 0, 1, false, 0, "my_tokens.bin");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
  ExpectContains(d.status(), "my_tokens.bin");
  ExpectContains(d.status(), "64");
  ExpectContains(d.status(), "position 5");
  // vocab_size - 1 is fine.
  t[5] = kVocab - 1;
  EXPECT_TRUE(DataLoader::FromTokens(t, kVocab, 2, 5).ok());
}

TEST(DataLoaderTest, FewerThanTwoTokensIsRejected) {
  for (std::vector<uint16_t> t : {std::vector<uint16_t>{}, std::vector<uint16_t>{3}}) {
    auto d = DataLoader::FromTokens(t, kVocab, 1, 1, 0, 1, false, 0, "tiny.bin");
    ASSERT_FALSE(d.ok()) << t.size() << " tokens";
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    ExpectContains(d.status(), "tiny.bin");
    ExpectContains(d.status(), "2 tokens");
  }
}

TEST(DataLoaderTest, BadShapeOrRankIsRejected) {
  EXPECT_EQ(DataLoader::FromTokens(Iota(kN), kVocab, 0, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::FromTokens(Iota(kN), kVocab, 2, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::FromTokens(Iota(kN), kVocab, 2, 5, 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::FromTokens(Iota(kN), kVocab, 2, 5, -1, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::FromTokens(Iota(kN), kVocab, 2, 5, 0, 0).status().code(), StatusCode::kInvalidArgument);
}

class DataLoaderFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("tf_data_loader_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(DataLoaderFileTest, OpenReadsTheSameStreamAsFromTokens) {
  for (bool header : {true, false}) {
    const std::string path = Path(header ? "headered.bin" : "bare.bin");
    ASSERT_TRUE(WriteTokenFile(path, Iota(kN), header).ok());
    auto d = DataLoader::Open(path, kVocab, 2, 5, 1, 2, false, 0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    const DataLoader ref = MustMake(Iota(kN), 2, 5, 1, 2);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(LoadBatch(*d, i), LoadBatch(ref, i)) << "header=" << header;
  }
}

TEST_F(DataLoaderFileTest, MissingFileIsNotFound) {
  const std::string path = Path("does_not_exist.bin");
  auto d = DataLoader::Open(path, kVocab, 2, 5);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound) << d.status().ToString();
  ExpectContains(d.status(), path);
}

TEST_F(DataLoaderFileTest, EmptyPathIsInvalid) {
  auto d = DataLoader::Open("", kVocab, 2, 5);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
}

TEST_F(DataLoaderFileTest, TruncatedFileIsAnError) {
  const std::string path = Path("truncated.bin");
  ASSERT_TRUE(WriteTokenFile(path, Iota(kN), /*with_header=*/true).ok());
  const auto full = fs::file_size(path);
  ASSERT_EQ(full, kTokenFileHeaderBytes + 2 * kN);
  for (uintmax_t chop : {1u, 2u, 20u}) {
    SCOPED_TRACE("chopped " + std::to_string(chop) + " bytes");
    fs::resize_file(path, full - chop);
    auto d = DataLoader::Open(path, kVocab, 2, 5);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << d.status().ToString();
    ExpectContains(d.status(), path);
    ExpectContains(d.status(), "truncated");
    fs::resize_file(path, full);  // restore the size (zeros past the cut do not matter here)
  }
}

TEST_F(DataLoaderFileTest, TokenOutsideVocabularyInFileNamesFileAndPosition) {
  const std::string path = Path("bad_token.bin");
  std::vector<uint16_t> t = Iota(kN);
  t[30] = 300;
  ASSERT_TRUE(WriteTokenFile(path, t).ok());
  auto d = DataLoader::Open(path, kVocab, 2, 5);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
  ExpectContains(d.status(), path);
  ExpectContains(d.status(), "300");
  ExpectContains(d.status(), "position 30");
}

TEST_F(DataLoaderFileTest, SingleTokenFileIsRejected) {
  const std::string path = Path("one.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint16_t>{1}).ok());
  auto d = DataLoader::Open(path, kVocab, 1, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
  ExpectContains(d.status(), path);
}

}  // namespace
}  // namespace tf

namespace tf {
namespace {

// W ranks with batch B read, row for row, what one rank with batch W*B reads (shuffled or not):
// the basis of "a W-rank run equals a 1-rank run with the same global batch".
TEST(DataLoaderTest, RanksTogetherReadTheGlobalBatch) {
  for (bool shuffle : {false, true}) {
    for (int W : {2, 3}) {
      SCOPED_TRACE("shuffle=" + std::to_string(shuffle) + " W=" + std::to_string(W));
      const int B = 2, T = 5;
      const DataLoader global = MustMake(Iota(kN), W * B, T, 0, 1, shuffle, 11);
      for (int64_t i = 0; i < 6; ++i) {
        const Batch all = LoadBatch(global, i);
        for (int r = 0; r < W; ++r) {
          const Batch part = LoadBatch(MustMake(Iota(kN), B, T, r, W, shuffle, 11), i);
          for (int j = 0; j < B * T; ++j) {
            ASSERT_EQ(part.inputs[static_cast<size_t>(j)], all.inputs[static_cast<size_t>(r * B * T + j)]);
            ASSERT_EQ(part.targets[static_cast<size_t>(j)], all.targets[static_cast<size_t>(r * B * T + j)]);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tf
