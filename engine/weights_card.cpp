#include "engine/weights_card.h"

#include <charconv>

#include <fmt/format.h>

#include "base/json.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

template <typename Int>
Status ParseInt(const std::string& text, const char* key, const std::string& path, Int* out, int base = 10) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, base);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return Status::Corruption("{}: metadata {} is '{}', not a whole number", path, key, text);
  }
  return Status::OK();
}

// A metadata value that does not parse is a damaged file, not a user's mistake.
template <typename T>
StatusOr<T> AsCorruption(StatusOr<T> r) {
  if (r.ok()) return r;
  return Status(StatusCode::kCorruption, r.status().message());
}

}  // namespace

std::map<std::string, std::string> WeightsCard::ToMetadata() const {
  std::map<std::string, std::string> m;
  if (model) m[kMetaModelConfig] = ModelConfigToJson(*model).dump();
  if (step >= 0) m[kMetaStep] = std::to_string(step);
  if (!tokenizer.empty()) m[kMetaTokenizer] = tokenizer;
  if (tokenizer_fingerprint != 0) m[kMetaTokenizerFingerprint] = fmt::format("{:016x}", tokenizer_fingerprint);
  if (seq_len > 0) m[kMetaSeqLen] = std::to_string(seq_len);
  if (world > 0) m[kMetaWorld] = std::to_string(world);
  if (!train_config.is_null()) m[kMetaTrainConfig] = train_config.dump();
  return m;
}

std::optional<int64_t> WeightsCard::RunInt(const std::string& key) const {
  if (!train_config.is_object() || !train_config.contains(key) || !train_config[key].is_number_integer()) {
    return std::nullopt;
  }
  return train_config[key].get<int64_t>();
}

std::optional<double> WeightsCard::RunNumber(const std::string& key) const {
  if (!train_config.is_object() || !train_config.contains(key) || !train_config[key].is_number()) return std::nullopt;
  return train_config[key].get<double>();
}

std::optional<std::string> WeightsCard::RunString(const std::string& key) const {
  if (!train_config.is_object() || !train_config.contains(key) || !train_config[key].is_string()) return std::nullopt;
  return train_config[key].get<std::string>();
}

std::string WeightsCard::TokenizerFor(const GPT2Config& m) const {
  return tokenizer.empty() ? TokenizerKindForVocab(m.vocab_size) : tokenizer;
}

StatusOr<WeightsCard> WeightsCardFromMetadata(const std::map<std::string, std::string>& meta,
                                              const std::string& path) {
  WeightsCard c;
  auto get = [&](const char* key) -> const std::string* {
    auto it = meta.find(key);
    return it == meta.end() ? nullptr : &it->second;
  };
  if (const std::string* v = get(kMetaModelConfig)) {
    const std::string source = fmt::format("{} (metadata {})", path, kMetaModelConfig);
    TF_ASSIGN_OR_RETURN(nlohmann::json j, AsCorruption(ParseJson(*v, source, /*allow_comments=*/false)));
    TF_ASSIGN_OR_RETURN(c.model, AsCorruption(ParseModelConfig(j, source)));
  }
  if (const std::string* v = get(kMetaStep)) TF_RETURN_IF_ERROR(ParseInt(*v, kMetaStep, path, &c.step));
  if (const std::string* v = get(kMetaTokenizer)) {
    if (*v != "byte" && *v != "gpt2") {
      return Status::Corruption("{}: metadata {} is '{}', expected byte or gpt2", path, kMetaTokenizer, *v);
    }
    c.tokenizer = *v;
  }
  if (const std::string* v = get(kMetaTokenizerFingerprint)) {
    TF_RETURN_IF_ERROR(ParseInt(*v, kMetaTokenizerFingerprint, path, &c.tokenizer_fingerprint, 16));
  }
  if (const std::string* v = get(kMetaSeqLen)) TF_RETURN_IF_ERROR(ParseInt(*v, kMetaSeqLen, path, &c.seq_len));
  if (const std::string* v = get(kMetaWorld)) TF_RETURN_IF_ERROR(ParseInt(*v, kMetaWorld, path, &c.world));
  if (const std::string* v = get(kMetaTrainConfig)) {
    const std::string source = fmt::format("{} (metadata {})", path, kMetaTrainConfig);
    TF_ASSIGN_OR_RETURN(c.train_config, AsCorruption(ParseJson(*v, source, /*allow_comments=*/false)));
    if (!c.train_config.is_object()) return Status::Corruption("{}: not a JSON object", source);
  }
  if (c.model && c.seq_len > c.model->block_size) {
    return Status::Corruption("{}: metadata {} {} exceeds the model's block_size {}", path, kMetaSeqLen, c.seq_len,
                              c.model->block_size);
  }
  return c;
}

StatusOr<WeightsCard> ReadWeightsCard(const std::string& path) {
  TF_ASSIGN_OR_RETURN(auto meta, ReadSafetensorsMetadata(path));
  return WeightsCardFromMetadata(meta, path);
}

}  // namespace tf
