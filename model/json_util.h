// Strict JSON reading for every JSON TrainFlow accepts (configs, safetensors headers and metadata,
// tokenizer files): nesting depth bounded (kMaxJsonDepth, checked on the text before parsing, so a
// hostile file cannot exhaust the stack), duplicate keys refused at every level, syntax errors
// reported with line and column; `//` and `/* */` comments allowed where the caller says so.
// QuoteForMessage bounds what an error message quotes from user input. Pure; thread-safe.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/env.h"
#include "base/status.h"

namespace tf {

inline constexpr int kMaxJsonDepth = 64;
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{64} << 20;

// `what` names the source in errors ("model config 'configs/x.json'").
StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& what, bool allow_comments = true);
// ParseJson of a whole (regular, at most kMaxJsonFileBytes) file: "<what> '<path>': ...".
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, const std::string& what, Env* env = Env::Default());
// `text` for an error message: at most max_chars, control bytes escaped, "..." when cut.
std::string QuoteForMessage(std::string_view text, size_t max_chars = 80);
// A JSON value as an error message shows it: compact, and cut like QuoteForMessage.
std::string JsonForMessage(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace tf
