#include "engine/data/data_loader.h"

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/data/token_file.h"

namespace tf {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

StatusOr<DataLoader> DataLoader::FromTokens(std::vector<uint16_t> tokens, int vocab_size, int B, int T, int rank,
                                            int world_size, bool shuffle, uint64_t seed, const std::string& name) {
  if (B <= 0 || T <= 0) return Status::InvalidArgument("data loader: batch {} and seq_len {} must be positive", B, T);
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("data loader: rank {} outside world size {}", rank, world_size);
  }
  if (tokens.size() < 2) {
    return Status::InvalidArgument("{}: needs at least 2 tokens, has {}", name, tokens.size());
  }
  TF_RETURN_IF_ERROR(ValidateTokens(tokens, vocab_size, name));
  DataLoader d;
  d.tokens_ = std::move(tokens);
  d.B_ = B;
  d.T_ = T;
  d.rank_ = rank;
  d.world_ = world_size;
  d.shuffle_ = shuffle;
  d.seed_ = seed;
  d.name_ = name;
  return d;
}

StatusOr<DataLoader> DataLoader::Open(const std::string& path, int vocab_size, int B, int T, int rank,
                                      int world_size, bool shuffle, uint64_t seed) {
  if (path.empty()) return Status::InvalidArgument("no data file given (train_data / val_data)");
  TokenFileTokenizer tokenizer;
  TF_ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, ReadTokenFile(path, Env::Default(), &tokenizer));
  TF_ASSIGN_OR_RETURN(DataLoader d, FromTokens(std::move(tokens), vocab_size, B, T, rank, world_size, shuffle, seed,
                                               path));
  d.tokenizer_ = std::move(tokenizer);
  return d;
}

void DataLoader::Load(int64_t i, int32_t* inputs, int32_t* targets) const {
  const uint64_t N = tokens_.size();
  const int64_t g = i * world_ + rank_;  // global micro-batch index
  const uint64_t BT = static_cast<uint64_t>(B_) * T_;
  for (int b = 0; b < B_; ++b) {
    uint64_t start;
    if (shuffle_) {
      // Keyed by the global row index g*B + b, so W ranks with batch B read the rows one rank with
      // batch W*B reads (data-parallel runs match single-rank runs, shuffled or not).
      start = Mix(seed_ ^ Mix(static_cast<uint64_t>(g) * static_cast<uint64_t>(B_) + static_cast<uint64_t>(b))) % N;
    } else {
      start = (static_cast<uint64_t>(g) % N * (BT % N) + static_cast<uint64_t>(b) * T_) % N;
    }
    uint64_t pos = start;
    for (int t = 0; t < T_; ++t) {
      inputs[b * T_ + t] = tokens_[pos];
      pos = pos + 1 == N ? 0 : pos + 1;
      targets[b * T_ + t] = tokens_[pos];
    }
  }
}

std::string DataLoader::Fingerprint() const {
  return fmt::format("{} tokens, xxh64 {:016x}", tokens_.size(),
                     XXH64(tokens_.data(), tokens_.size() * sizeof(uint16_t), 0));
}

}  // namespace tf
