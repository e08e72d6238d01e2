// DataLoader: deterministic micro-batches from a token file (the data-order contract, docs/data.md).
//
// A token file is one circular stream of N tokens. Micro-batch i (counted from 0 across steps and
// accumulation micro-steps, on one rank) reads the B*T+1 tokens at (i*B*T + j) mod N, j = 0..B*T:
// inputs are the first B*T as a row-major (B,T) array, targets the same shifted by one. With world
// size W, rank r reads global micro-batch i*W + r. With shuffle on, each row b of micro-batch g
// instead starts at a pseudo-random offset Hash(seed, g*B + b) mod N (a pure function of the
// global row index, so runs resume and reshard exactly, and W ranks with batch B read exactly the
// rows one rank with batch W*B reads).
//
// Owns its copy of the tokens (validated against the vocabulary at Open). Not thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/data/token_file.h"

namespace tf {

class DataLoader {
 public:
  // Reads and validates the file: every token < vocab_size, at least 2 tokens.
  static StatusOr<DataLoader> Open(const std::string& path, int vocab_size, int B, int T, int rank = 0,
                                   int world_size = 1, bool shuffle = false, uint64_t seed = 0);
  // From tokens already in memory (tests). Same validation.
  static StatusOr<DataLoader> FromTokens(std::vector<uint16_t> tokens, int vocab_size, int B, int T, int rank = 0,
                                         int world_size = 1, bool shuffle = false, uint64_t seed = 0,
                                         const std::string& name = "<memory>");

  // Fills inputs and targets (B*T each) with this rank's micro-batch `i`.
  void Load(int64_t i, int32_t* inputs, int32_t* targets) const;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // "N tokens, xxh64 <hash>": identifies the data for cross-rank consistency checks.
  std::string Fingerprint() const;
  int B() const { return B_; }
  int T() const { return T_; }
  // The tokenizer the file's header records (kind "" when it records none), and the file's path.
  const TokenFileTokenizer& tokenizer() const { return tokenizer_; }
  const std::string& name() const { return name_; }

 private:
  DataLoader() = default;
  std::vector<uint16_t> tokens_;
  TokenFileTokenizer tokenizer_;
  std::string name_;
  int B_ = 0, T_ = 0, rank_ = 0, world_ = 1;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
};

}  // namespace tf
