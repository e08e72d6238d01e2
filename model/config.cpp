#include "model/config.h"

#include "base/json.h"

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace tf {

int DefaultPaddedVocab(int vocab_size) { return (vocab_size + 63) / 64 * 64; }

Status ValidateConfig(const GPT2Config& c) {
  auto positive = [](const char* key, int v) -> Status {
    if (v <= 0) return Status::InvalidArgument("{} must be positive, got {}", key, v);
    return Status::OK();
  };
  TF_RETURN_IF_ERROR(positive("n_layer", c.n_layer));
  TF_RETURN_IF_ERROR(positive("n_head", c.n_head));
  TF_RETURN_IF_ERROR(positive("n_embd", c.n_embd));
  TF_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  TF_RETURN_IF_ERROR(positive("block_size", c.block_size));
  if (c.n_embd % c.n_head != 0) {
    return Status::InvalidArgument("n_embd ({}) must be divisible by n_head ({})", c.n_embd, c.n_head);
  }
  if (c.padded_vocab_size < c.vocab_size) {
    return Status::InvalidArgument("padded_vocab_size ({}) must be >= vocab_size ({})", c.padded_vocab_size,
                                   c.vocab_size);
  }
  if (c.vocab_size > 65536) {
    return Status::InvalidArgument("vocab_size {} does not fit the uint16 token files (max 65536)", c.vocab_size);
  }
  // GEMM dimensions are int: keep 4*n_embd and every matrix's row count well inside.
  if (c.n_embd > (1 << 20) || c.block_size > (1 << 20) || c.n_layer > 4096 || c.padded_vocab_size > (1 << 24)) {
    return Status::InvalidArgument("model shape too large (n_embd {}, block_size {}, n_layer {}, padded vocab {})",
                                   c.n_embd, c.block_size, c.n_layer, c.padded_vocab_size);
  }
  return Status::OK();
}

StatusOr<GPT2Config> ParseModelConfig(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) return Status::InvalidArgument("{}: model config must be a JSON object", source);
  static const std::set<std::string> kKeys = {"n_layer",    "n_head",     "n_embd", "vocab_size",
                                              "block_size", "padded_vocab_size"};
  for (const auto& [key, value] : j.items()) {
    if (key.starts_with("_")) continue;  // "_comment" and friends are allowed
    if (!kKeys.contains(key)) return Status::InvalidArgument("{}: unknown model config key '{}'", source, key);
  }
  GPT2Config c;
  auto get = [&](const char* key, int* out, bool required) -> Status {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) return Status::InvalidArgument("{}: missing model config key '{}'", source, key);
      return Status::OK();
    }
    if (!it->is_number_integer()) {
      return Status::InvalidArgument("{}: model config key '{}' must be an integer, got {}", source, key,
                                     JsonForMessage(*it));
    }
    const int64_t v = it->get<int64_t>();
    if (v <= 0 || v > (int64_t{1} << 30)) {
      return Status::InvalidArgument("{}: model config key '{}' must be a positive integer, got {}", source, key, v);
    }
    *out = static_cast<int>(v);
    return Status::OK();
  };
  TF_RETURN_IF_ERROR(get("n_layer", &c.n_layer, true));
  TF_RETURN_IF_ERROR(get("n_head", &c.n_head, true));
  TF_RETURN_IF_ERROR(get("n_embd", &c.n_embd, true));
  TF_RETURN_IF_ERROR(get("vocab_size", &c.vocab_size, true));
  TF_RETURN_IF_ERROR(get("block_size", &c.block_size, true));
  c.padded_vocab_size = DefaultPaddedVocab(c.vocab_size);
  TF_RETURN_IF_ERROR(get("padded_vocab_size", &c.padded_vocab_size, false));
  Status s = ValidateConfig(c);
  if (!s.ok()) return s.WithContext(source);
  return c;
}

StatusOr<GPT2Config> LoadModelConfig(const std::string& path) {
  TF_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path, "model config"));
  return ParseModelConfig(j, path);
}

nlohmann::json ModelConfigToJson(const GPT2Config& c) {
  return {{"n_layer", c.n_layer},       {"n_head", c.n_head},         {"n_embd", c.n_embd},
          {"vocab_size", c.vocab_size}, {"block_size", c.block_size}, {"padded_vocab_size", c.padded_vocab_size}};
}

int64_t NumParameters(const GPT2Config& c) {
  const int64_t C = c.n_embd, L = c.n_layer;
  const int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return int64_t{c.vocab_size} * C + int64_t{c.block_size} * C + L * per_layer + 2 * C;
}

std::string FormatParameterCount(int64_t n) {
  const double x = static_cast<double>(n);
  if (n < 1000) return std::to_string(n);
  if (n < 1000000) return fmt::format("{:.1f}K", x / 1e3);
  if (n < 1000000000) return fmt::format("{:.2f}M", x / 1e6);
  return fmt::format("{:.2f}B", x / 1e9);
}

}  // namespace tf
