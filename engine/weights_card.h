// What a weights file carries besides its tensors, so that `eval`, `sample` and `export` use a
// model as it was trained: the model config, the tokenizer (kind and, for BPE, the fingerprint of
// its vocabulary and merges), the trained sequence length, the number of ranks, the step and the
// run's whole training config. Stored as safetensors "__metadata__" strings under the keys below
// (docs/formats.md, "Weights metadata"); written by the trainer, read by the CLI, carried over by
// `export`. Files made elsewhere (Hugging Face) have none of them: every field is optional.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "model/config.h"

namespace tf {

inline constexpr const char* kMetaModelConfig = "trainflow.model_config";
inline constexpr const char* kMetaStep = "trainflow.step";
inline constexpr const char* kMetaTokenizer = "trainflow.tokenizer";
inline constexpr const char* kMetaTokenizerFingerprint = "trainflow.tokenizer_fingerprint";
inline constexpr const char* kMetaSeqLen = "trainflow.seq_len";
inline constexpr const char* kMetaWorld = "trainflow.world";
inline constexpr const char* kMetaTrainConfig = "trainflow.train_config";

struct WeightsCard {
  std::optional<GPT2Config> model;
  std::string tokenizer;             // "byte", "gpt2" or "" (not recorded)
  uint64_t tokenizer_fingerprint = 0;  // 0: not recorded (always 0 for byte)
  int seq_len = 0;                   // trained T; 0: not recorded
  int world = 0;                     // ranks of the run; 0: not recorded
  int64_t step = -1;                 // -1: not recorded
  nlohmann::json train_config;       // the run's training config (TrainConfigToJson); null if absent

  std::map<std::string, std::string> ToMetadata() const;
  // The training config's value of `key`, when the run recorded one of that JSON type.
  std::optional<int64_t> RunInt(const std::string& key) const;
  std::optional<double> RunNumber(const std::string& key) const;
  std::optional<std::string> RunString(const std::string& key) const;
  // The tokenizer the model's ids belong to: the recorded one, else what `model`'s vocab_size
  // implies (TokenizerKindForVocab); "" when neither says.
  std::string TokenizerFor(const GPT2Config& model) const;
};

// Parses the metadata of a weights file (the file's tensors are not read). A malformed value is
// Corruption naming the key and the file.
StatusOr<WeightsCard> ReadWeightsCard(const std::string& path);
StatusOr<WeightsCard> WeightsCardFromMetadata(const std::map<std::string, std::string>& meta,
                                              const std::string& path);

}  // namespace tf
