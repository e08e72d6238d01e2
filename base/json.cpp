// The strict JSON reader (base/json.h).
#include "base/json.h"

#include <set>
#include <vector>

namespace tf {
namespace {

// How nlohmann's parser says the text ended where more was expected.
constexpr std::string_view kEndOfInput = "unexpected end of input";

// The deepest nesting of objects/arrays in `text`, outside strings and comments; stops counting
// once past `limit`. Returns the byte offset where the limit was crossed through *where.
int NestingDepth(std::string_view text, int limit, size_t* where) {
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string_view::npos ? text.size() : end + 1;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) {
        *where = i;
        return depth;
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return depth;
}

void LineColumn(std::string_view text, size_t byte, size_t* line, size_t* column) {
  *line = 1;
  *column = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++*line;
      *column = 1;
    } else {
      ++*column;
    }
  }
}

}  // namespace

std::string JsonForMessage(const nlohmann::json& value, size_t max_chars) {
  return QuoteForMessage(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max_chars);
}

std::string QuoteForMessage(std::string_view text, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (text.size() > max_chars) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& what, bool allow_comments) {
  size_t where = 0;
  if (NestingDepth(text, kMaxJsonDepth, &where) > kMaxJsonDepth) {
    // Bytes that are not JSON at all (a binary file) are reported as such: the text before the
    // level too many is parsed first (its nesting is within the limit), and only when all of it
    // reads as the start of a JSON value is the depth the problem.
    if (auto prefix = ParseJson(text.substr(0, where), what, allow_comments);
        !prefix.ok() && prefix.status().message().find(kEndOfInput) == std::string::npos) {
      return prefix.status();
    }
    size_t line, column;
    LineColumn(text, where, &line, &column);
    return Status::InvalidArgument("{}: JSON nested more than {} levels deep (at line {}, column {})", what,
                                   kMaxJsonDepth, line, column);
  }
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    size_t line, column;
    LineColumn(text, nul, &line, &column);
    return Status::InvalidArgument("{}: a NUL byte at line {}, column {} (byte {}) is not JSON", what, line, column,
                                   nul);
  }
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate, last_key;
  nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    else if (event == E::object_end && !keys.empty()) {
      keys.pop_back();
      last_key.clear();
    } else if (event == E::key && !keys.empty() && parsed.is_string()) {
      last_key = parsed.get<std::string>();
      if (!keys.back().insert(last_key).second && duplicate.empty()) duplicate = last_key;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, allow_comments);
  } catch (const nlohmann::json::parse_error& e) {
    size_t line, column;
    LineColumn(text, e.byte > 0 ? e.byte - 1 : 0, &line, &column);
    std::string why = e.what();
    if (const size_t p = why.find("syntax error while parsing value - "); p != std::string::npos) {
      why = why.substr(p + 35);
    } else if (const size_t q = why.find(": "); q != std::string::npos) {
      why = why.substr(q + 2);
    }
    return Status::InvalidArgument("{}: not valid JSON: line {}, column {}: {}", what, line, column,
                                   QuoteForMessage(why, 200));
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406: "number overflow parsing '1e400'", a number beyond a double's range.
    std::string why = e.what();
    if (const size_t p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    if (e.id == 406) why += " (beyond the range of a double)";
    const std::string key = last_key.empty() ? "" : fmt::format(" key '{}':", QuoteForMessage(last_key));
    return Status::InvalidArgument("{}:{} {}", what, key, QuoteForMessage(why, 200));
  }
  if (!duplicate.empty()) {
    return Status::InvalidArgument("{}: key '{}' appears more than once in the same object", what,
                                   QuoteForMessage(duplicate));
  }
  return j;
}

StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, const std::string& what, Env* env,
                                      uint64_t max_bytes) {
  const std::string source = fmt::format("{} '{}'", what, path);
  auto text = env->ReadFileToString(path, max_bytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return Status::NotFound("{} does not exist", source);
    return text.status().WithContext(what);
  }
  return ParseJson(*text, source);
}

}  // namespace tf
