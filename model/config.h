// GPT-2 model configuration: shapes only (no training hyper-parameters), parsed from JSON.
//
// JSON keys (all integers): n_layer, n_head, n_embd, vocab_size, block_size, and optionally
// padded_vocab_size (>= vocab_size; the embedding/LM-head matrix gets this many rows so GEMMs see
// a friendly size; padded rows stay zero and are never exported). Unknown keys, wrong types and
// impossible shapes are InvalidArgument naming the key and the source.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace tf {

struct GPT2Config {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;         // V: real tokens
  int block_size = 0;         // maximum sequence length (rows of wpe)
  int padded_vocab_size = 0;  // Vp >= V

  int head_size() const { return n_embd / n_head; }
  bool operator==(const GPT2Config&) const = default;
};

// Default padding: vocab_size rounded up to a multiple of 64 (50257 -> 50304 as in llm.c's
// 50304 for GEMM-friendly shapes; 256 stays 256).
int DefaultPaddedVocab(int vocab_size);

// Checks every field (positive, n_embd % n_head == 0, padded_vocab_size >= vocab_size, sizes that
// keep every buffer index within int64 / GEMM int limits).
Status ValidateConfig(const GPT2Config& config);

// `source` names the origin (a file path) in error messages.
StatusOr<GPT2Config> ParseModelConfig(const nlohmann::json& j, const std::string& source);
StatusOr<GPT2Config> LoadModelConfig(const std::string& path);
nlohmann::json ModelConfigToJson(const GPT2Config& config);

// Number of trainable parameters counting the real vocabulary (V rows of wte), as Hugging Face counts.
int64_t NumParameters(const GPT2Config& config);
// "12.3K", "124.44M", "1.56B": a parameter count for people.
std::string FormatParameterCount(int64_t n);

}  // namespace tf
