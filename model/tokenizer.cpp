#include "model/tokenizer.h"

#include "base/env.h"
#include "base/json.h"
#include "base/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tf {

Tokenizer::~Tokenizer() = default;

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// ---- Byte tokenizer ------------------------------------------------------------------------

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) {
        out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      } else {
        out.append(kReplacementChar);
      }
    }
    return out;
  }
  int vocab_size() const override { return 256; }
  int eot_token() const override { return -1; }
  std::string name() const override { return "byte"; }
  uint64_t fingerprint() const override { return 0; }
};

// ---- GPT-2 helpers -------------------------------------------------------------------------

// GPT-2's pre-tokenization pattern, verbatim from OpenAI's encoder.py.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kEndOfText = "<|endoftext|>";

// encoder.py's bytes_to_unicode(): byte b -> the code point that stands for it in
// encoder.json / vocab.bpe. Printable Latin-1 bytes map to themselves; the other 68 bytes
// map, in increasing order, to U+0100, U+0101, ...
std::array<char32_t, 256> BytesToUnicode() {
  std::array<char32_t, 256> map{};
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = printable(b) ? char32_t(b) : next++;
  return map;
}

// Decodes UTF-8 into code points. Returns false on an ill-formed sequence.
bool DecodeUtf8(std::string_view s, std::vector<char32_t>* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    int len = 0;
    char32_t cp = 0;
    if (c < 0x80) { len = 1; cp = c; }
    else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    out->push_back(cp);
    i += len;
  }
  return true;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  auto text = Env::Default()->ReadFileToString(path);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound) return Status::NotFound("{}: no such file", path);
  return text;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

struct Merge {
  int32_t rank;    // line order in vocab.bpe; lower merges first
  int32_t merged;  // id of the concatenated symbol
};

using PcreCode = std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)>;
using PcreMatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;

// ---- GPT-2 tokenizer -----------------------------------------------------------------------

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // All state is filled in by LoadGpt2Tokenizer and never changes afterwards, so every
  // const method is safe to call concurrently: pcre2_code is read-only during matching and
  // each Encode call creates its own match data. There is no per-word cache (and so no mutex).
  Gpt2Tokenizer() : regex_(nullptr, &pcre2_code_free) {}

  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 1);
    size_t pos = 0;
    while (true) {
      const size_t special = text.find(kEndOfText, pos);
      const size_t end = special == std::string_view::npos ? text.size() : special;
      EncodeOrdinary(text.substr(pos, end - pos), &ids);
      if (special == std::string_view::npos) break;
      ids.push_back(eot_);
      pos = special + kEndOfText.size();
    }
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size()) {
        out.append(token_bytes_[id]);
      } else {
        out.append(kReplacementChar);
      }
    }
    return out;
  }

  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  int eot_token() const override { return eot_; }
  std::string name() const override { return "gpt2"; }
  uint64_t fingerprint() const override { return fingerprint_; }

 private:
  friend StatusOr<std::unique_ptr<Tokenizer>> tf::LoadGpt2Tokenizer(const std::string&,
                                                                     const std::string&);

  // Text without special tokens: regex pre-tokenization, then BPE per piece.
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const {
    if (text.empty()) return;
    PcreMatchData md(pcre2_match_data_create_from_pattern(regex_.get(), nullptr),
                     &pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t offset = 0;
    while (md != nullptr && offset < text.size()) {
      const int rc = pcre2_match(regex_.get(), subject, text.size(), offset, 0, md.get(), nullptr);
      if (rc < 0) break;  // no match (only ill-formed UTF-8 is left) or a PCRE2 resource limit
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t begin = ov[0], end = ov[1];
      if (end <= begin || begin < offset) break;  // cannot happen: no alternative matches empty
      // Bytes the regex skipped are ill-formed UTF-8 (PCRE2_MATCH_INVALID_UTF); keep them.
      BytePairEncode(text.substr(offset, begin - offset), ids);
      BytePairEncode(text.substr(begin, end - begin), ids);
      offset = end;
    }
    BytePairEncode(text.substr(offset), ids);
  }

  // encoder.py's bpe() on one piece, working on token ids instead of strings (every symbol
  // that can arise is a token; LoadGpt2Tokenizer checks this). Same rule as encoder.py: find
  // the lowest-ranked adjacent pair, merge all of its non-overlapping occurrences left to
  // right, repeat until no adjacent pair has a rank. A min-heap of (rank, position) with
  // lazy invalidation makes this O(n log n) instead of O(n^2) for long pieces.
  void BytePairEncode(std::string_view piece, std::vector<int32_t>* ids) const {
    const int n = static_cast<int>(piece.size());
    if (n == 0) return;
    if (n == 1) {
      ids->push_back(byte_to_id_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    std::vector<int32_t> sym(n);
    std::vector<int> next(n), prev(n);
    for (int i = 0; i < n; ++i) {
      sym[i] = byte_to_id_[static_cast<unsigned char>(piece[i])];
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    auto find_merge = [&](int p) -> const Merge* {
      if (p < 0 || next[p] < 0) return nullptr;
      auto it = merges_.find(PairKey(sym[p], sym[next[p]]));
      return it == merges_.end() ? nullptr : &it->second;
    };
    using Entry = std::pair<int32_t, int>;  // (rank, position of the pair's left symbol)
    std::vector<Entry> heap;
    auto push = [&](int p) {
      if (const Merge* m = find_merge(p)) {
        heap.emplace_back(m->rank, p);
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);

    std::vector<int> round;
    while (!heap.empty()) {
      // One encoder.py iteration: every occurrence of the lowest-ranked pair, in order.
      // (Pairs created during the round never have this rank: they contain a longer symbol.)
      const int32_t rank = heap.front().first;
      round.clear();
      while (!heap.empty() && heap.front().first == rank) {
        round.push_back(heap.front().second);
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        heap.pop_back();
      }
      for (int p : round) {  // ascending positions; skip occurrences already consumed
        if (sym[p] < 0) continue;
        const Merge* m = find_merge(p);
        if (m == nullptr || m->rank != rank) continue;
        const int q = next[p];
        sym[p] = m->merged;
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        push(prev[p]);
        push(p);
      }
    }
    for (int p = 0; p >= 0; p = next[p]) ids->push_back(sym[p]);
  }

  PcreCode regex_;
  std::vector<std::string> token_bytes_;       // id -> the bytes it stands for
  std::array<int32_t, 256> byte_to_id_{};      // byte -> id of its single-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // PairKey(left id, right id) -> merge
  int32_t eot_ = -1;
  uint64_t fingerprint_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json_path,
                                                       const std::string& vocab_bpe_path) {
  auto tok = std::make_unique<Gpt2Tokenizer>();
  const std::array<char32_t, 256> byte_to_cp = BytesToUnicode();
  std::unordered_map<char32_t, unsigned char> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = static_cast<unsigned char>(b);

  // encoder.json: {"<symbol string>": id, ...}, ids a permutation of 0..N-1.
  TF_ASSIGN_OR_RETURN(const std::string json_text, ReadWholeFile(encoder_json_path));
  auto parsed = ParseJson(json_text, encoder_json_path, /*allow_comments=*/false);
  if (!parsed.ok()) return Status(StatusCode::kCorruption, parsed.status().message());
  nlohmann::json json = std::move(parsed).value();
  if (!json.is_object() || json.empty()) {
    return Status::Corruption("{}: expected a non-empty JSON object mapping symbols to ids",
                              encoder_json_path);
  }
  const size_t vocab = json.size();
  if (vocab > (size_t{1} << 30)) {
    return Status::Corruption("{}: {} entries is more than a tokenizer can have",
                              encoder_json_path, vocab);
  }
  tok->token_bytes_.assign(vocab, std::string());
  std::vector<bool> seen(vocab, false);
  std::unordered_map<std::string, int32_t> symbol_to_id;
  symbol_to_id.reserve(vocab);
  std::vector<char32_t> cps;
  for (const auto& [symbol, value] : json.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(vocab)) {
      return Status::Corruption("{}: entry \"{}\": id {} is not an integer in [0, {})",
                                encoder_json_path, symbol, value.dump(), vocab);
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (seen[id]) {
      return Status::Corruption("{}: entry \"{}\": id {} is used twice", encoder_json_path,
                                symbol, id);
    }
    seen[id] = true;
    if (!DecodeUtf8(symbol, &cps)) {
      return Status::Corruption("{}: entry for id {} is not valid UTF-8", encoder_json_path, id);
    }
    std::string& bytes = tok->token_bytes_[id];
    for (char32_t cp : cps) {
      auto it = cp_to_byte.find(cp);
      if (it == cp_to_byte.end()) {
        return Status::Corruption("{}: entry \"{}\" (id {}) has U+{:04X}, not a GPT-2 byte symbol",
                                  encoder_json_path, symbol, id, static_cast<uint32_t>(cp));
      }
      bytes.push_back(static_cast<char>(it->second));
    }
    symbol_to_id.emplace(symbol, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(byte_to_cp[b], &symbol);
    auto it = symbol_to_id.find(symbol);
    if (it == symbol_to_id.end()) {
      return Status::Corruption("{}: no token for byte 0x{:02X} (symbol \"{}\")",
                                encoder_json_path, b, symbol);
    }
    tok->byte_to_id_[b] = it->second;
  }
  if (auto it = symbol_to_id.find(std::string(kEndOfText)); it != symbol_to_id.end()) {
    tok->eot_ = it->second;
  } else {
    return Status::Corruption("{}: no \"{}\" entry", encoder_json_path, kEndOfText);
  }

  // vocab.bpe: "#version: ..." then one merge "<left> <right>" per line, in rank order.
  TF_ASSIGN_OR_RETURN(const std::string bpe_text, ReadWholeFile(vocab_bpe_path));
  std::string_view rest = bpe_text;
  int32_t rank = 0;
  for (size_t line_no = 1; !rest.empty(); ++line_no) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line_no == 1 && line.starts_with("#version")) continue;
    // Fields are separated by spaces or tabs; no GPT-2 symbol contains whitespace.
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      const size_t start = i;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
      if (i > start) fields.push_back(line.substr(start, i - start));
    }
    if (fields.size() != 2) {
      return Status::Corruption("{}:{}: expected two space-separated symbols, got {} fields",
                                vocab_bpe_path, line_no, fields.size());
    }
    int32_t part_ids[2];
    for (int k = 0; k < 2; ++k) {
      auto it = symbol_to_id.find(std::string(fields[k]));
      if (it == symbol_to_id.end()) {
        return Status::Corruption("{}:{}: symbol \"{}\" is not in {}", vocab_bpe_path, line_no,
                                  fields[k], encoder_json_path);
      }
      part_ids[k] = it->second;
    }
    const std::string merged = std::string(fields[0]) + std::string(fields[1]);
    auto it = symbol_to_id.find(merged);
    if (it == symbol_to_id.end()) {
      return Status::Corruption("{}:{}: merged symbol \"{}\" is not in {}", vocab_bpe_path,
                                line_no, merged, encoder_json_path);
    }
    if (!tok->merges_.emplace(PairKey(part_ids[0], part_ids[1]), Merge{rank, it->second})
             .second) {
      return Status::Corruption("{}:{}: merge \"{} {}\" appears twice", vocab_bpe_path, line_no,
                                fields[0], fields[1]);
    }
    ++rank;
  }

  {  // The fingerprint: each id's bytes (length-prefixed), then the merges in rank order.
    std::string canon;
    for (const std::string& b : tok->token_bytes_) {
      const uint32_t n = static_cast<uint32_t>(b.size());
      canon.append(reinterpret_cast<const char*>(&n), sizeof(n)).append(b);
    }
    std::vector<std::pair<int32_t, uint64_t>> by_rank;
    by_rank.reserve(tok->merges_.size());
    for (const auto& [pair, m] : tok->merges_) by_rank.emplace_back(m.rank, pair);
    std::sort(by_rank.begin(), by_rank.end());
    for (const auto& [r, pair] : by_rank) canon.append(reinterpret_cast<const char*>(&pair), sizeof(pair));
    tok->fingerprint_ = XXH64(canon.data(), canon.size(), 0);
  }

  // PCRE2 with UTF + UCP gives \s, \p{L}, \p{N} their Unicode meaning (as Python's `regex`).
  // MATCH_INVALID_UTF lets matching skip ill-formed bytes instead of failing the whole call.
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  tok->regex_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern.data()),
                                  kGpt2Pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err,
                                  &err_offset, nullptr));
  if (tok->regex_ == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Status::Internal("compiling the GPT-2 regex at offset {}: {}", err_offset,
                            reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimization only; pcre2_match falls back to the interpreter without it.
  (void)pcre2_jit_compile(tok->regex_.get(), PCRE2_JIT_COMPLETE);

  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

int TokenizerVocabSize(const std::string& kind) {
  if (kind == "byte") return 256;
  if (kind == "gpt2") return 50257;
  return 0;
}

std::string TokenizerKindForVocab(int vocab_size) {
  if (vocab_size == 256) return "byte";
  if (vocab_size == 50257) return "gpt2";
  return "";
}

std::vector<std::string> Gpt2TokenizerSearchPath() {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) {
    dirs.push_back((exe.parent_path().parent_path() / "third_party" / "gpt2-tokenizer").string());
    dirs.push_back((exe.parent_path().parent_path() / "share" / "trainflow" / "gpt2-tokenizer").string());
  }
  dirs.push_back("third_party/gpt2-tokenizer");
  return dirs;
}

StatusOr<std::string> FindGpt2TokenizerDir(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr const char* kFetch =
      "fetch them with scripts/fetch_gpt2_tokenizer.sh [DIR] from a TrainFlow checkout (docs/tokenizers.md)";
  // A directory someone named (flag, config key or environment) is taken as given.
  auto named = [&](const std::string& d, const char* how) -> StatusOr<std::string> {
    for (const char* file : {"encoder.json", "vocab.bpe"}) {
      std::error_code ec;
      const fs::path p = fs::path(d) / file;
      if (!fs::is_regular_file(p, ec)) {
        if (fs::exists(p, ec)) {
          return Status::InvalidArgument("GPT-2 tokenizer file {} is not a regular file ({} is '{}')", p.string(), how,
                                         d);
        }
        return Status::NotFound("GPT-2 tokenizer file {} not found ({} is '{}'); {}", p.string(), how, d, kFetch);
      }
    }
    return d;
  };
  if (!dir.empty()) return named(dir, "--tokenizer-dir / tokenizer_dir");
  if (const char* env = std::getenv("TRAINFLOW_TOKENIZER_DIR"); env != nullptr && *env != '\0') {
    return named(env, "TRAINFLOW_TOKENIZER_DIR");
  }
  const std::vector<std::string> path = Gpt2TokenizerSearchPath();
  for (const std::string& d : path) {
    if (named(d, "").ok()) return d;
  }
  std::string looked;
  for (const std::string& d : path) looked += (looked.empty() ? "" : ", ") + d;
  return Status::NotFound("GPT-2 tokenizer files (encoder.json, vocab.bpe) not found; looked in {}. {}, then pass "
                          "--tokenizer-dir DIR (config key tokenizer_dir) or set TRAINFLOW_TOKENIZER_DIR=DIR",
                          looked, kFetch);
}

StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& kind,
                                                   const std::string& gpt2_dir) {
  if (kind == "byte") return MakeByteTokenizer();
  if (kind == "gpt2") {
    TF_ASSIGN_OR_RETURN(const std::string found, FindGpt2TokenizerDir(gpt2_dir));
    const std::filesystem::path dir(found);
    return LoadGpt2Tokenizer((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
  }
  return Status::InvalidArgument("unknown tokenizer kind \"{}\" (allowed: \"byte\", \"gpt2\")",
                                 kind);
}

}  // namespace tf
