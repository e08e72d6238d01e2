// Strict JSON reading for every JSON TrainFlow accepts (configs, manifests, safetensors headers and
// metadata, tokenizer files, state files, protocol messages): nesting depth bounded (kMaxJsonDepth,
// checked on the text before the parser builds anything, so a hostile file cannot exhaust the
// stack), duplicate keys refused at every level, syntax errors reported with line and column before
// any depth problem further on, numbers beyond a double's range named with their key; `//` and
// `/* */` comments allowed where the caller says so. Errors are InvalidArgument naming the source.
// QuoteForMessage bounds what an error message quotes from user input. Pure; thread-safe.
#pragma once
#include <cstdint>
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
// ParseJson of a whole file, opened by Env::ReadFileToString (so a FIFO, a directory or a device is
// refused without blocking) and at most max_bytes: errors read "<what> '<path>': ...".
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, const std::string& what, Env* env = Env::Default(),
                                      uint64_t max_bytes = kMaxJsonFileBytes);
// `text` for an error message: at most max_chars, control bytes escaped, "..." when cut.
std::string QuoteForMessage(std::string_view text, size_t max_chars = 80);
// A JSON value as an error message shows it: compact, and cut like QuoteForMessage.
std::string JsonForMessage(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace tf
