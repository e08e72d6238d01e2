#include "launch/slurm_util.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "base/json.h"  // QuoteForMessage

namespace tf::slurm {
namespace {

// Numbers in node lists and times: at most 18 digits, so every value fits in int64 with room to add one.
constexpr size_t kMaxDigits = 18;
constexpr size_t kMaxJobNameBytes = 64;
constexpr int64_t kSecondsPerDay = 86400;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) { return IsDigit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

enum class Digits { kOk, kNotDigits, kTooLong };

// A non-empty run of at most kMaxDigits decimal digits.
Digits ParseDigits(std::string_view s, int64_t* out) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), IsDigit)) return Digits::kNotDigits;
  if (s.size() > kMaxDigits) return Digits::kTooLong;
  int64_t v = 0;
  for (char c : s) v = v * 10 + (c - '0');
  *out = v;
  return Digits::kOk;
}

// a + b and a * b, saturating above kMaxNodes (both operands are >= 0).
int64_t AddCapped(int64_t a, int64_t b) { return std::min(a + b, kMaxNodes + 1); }
int64_t MulCapped(int64_t a, int64_t b) { return (a == 0 || b <= (kMaxNodes + 1) / a) ? a * b : kMaxNodes + 1; }

// v in decimal, zero-padded to `width` digits (0: as it is).
std::string Padded(int64_t v, size_t width) { return fmt::format("{:0{}}", v, width); }

// The contents of one bracket ("01-03,7"), expanded; `name` and `list` are for messages.
StatusOr<std::vector<std::string>> ExpandBracket(std::string_view body, std::string_view name,
                                                 const std::string& list) {
  struct Range {
    int64_t lo, hi;
    size_t width;
  };
  std::vector<Range> ranges;
  int64_t count = 0;
  if (body.empty()) {
    return Status::InvalidArgument("node list '{}': '{}' has empty brackets", QuoteForMessage(list),
                                   QuoteForMessage(name));
  }
  for (size_t start = 0; start <= body.size();) {
    size_t end = body.find(',', start);
    if (end == std::string_view::npos) end = body.size();
    const std::string_view item = body.substr(start, end - start);
    start = end + 1;
    const size_t dash = item.find('-');
    const std::string_view lo_text = item.substr(0, dash);
    const std::string_view hi_text = dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    Range r{0, 0, lo_text.size()};
    const Digits lo_ok = ParseDigits(lo_text, &r.lo);
    const Digits hi_ok = ParseDigits(hi_text, &r.hi);
    if (lo_ok == Digits::kNotDigits || hi_ok == Digits::kNotDigits) {
      return Status::InvalidArgument("node list '{}': in '{}', '{}' is not a number or a range lo-hi of digits",
                                     QuoteForMessage(list), QuoteForMessage(name), QuoteForMessage(item));
    }
    if (lo_ok == Digits::kTooLong || hi_ok == Digits::kTooLong) {
      return Status::InvalidArgument("node list '{}': in '{}', '{}' has a number of more than {} digits",
                                     QuoteForMessage(list), QuoteForMessage(name), QuoteForMessage(item),
                                     kMaxDigits);
    }
    if (r.hi < r.lo) {
      return Status::InvalidArgument("node list '{}': in '{}', range '{}' ends below its start",
                                     QuoteForMessage(list), QuoteForMessage(name), QuoteForMessage(item));
    }
    count = AddCapped(count, std::min(r.hi - r.lo + 1, kMaxNodes + 1));
    if (count > kMaxNodes) {
      return Status::InvalidArgument("node list '{}' expands to more than {} names", QuoteForMessage(list),
                                     kMaxNodes);
    }
    ranges.push_back(r);
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(count));
  for (const Range& r : ranges) {
    for (int64_t v = r.lo; v <= r.hi; ++v) out.push_back(Padded(v, r.width));
  }
  return out;
}

// Appends the names one trimmed, non-empty, bracket-balanced name expands to; *total counts all names so far.
Status ExpandName(std::string_view name, const std::string& list, int64_t* total, std::vector<std::string>* out) {
  // Each part is the choices at one position: a literal is one choice, a bracket its numbers.
  std::vector<std::vector<std::string>> parts;
  int64_t count = 1;
  for (size_t i = 0; i < name.size();) {
    if (name[i] == '[') {
      const size_t close = name.find(']', i);  // balanced and not nested: checked by the caller
      TF_ASSIGN_OR_RETURN(std::vector<std::string> numbers,
                          ExpandBracket(name.substr(i + 1, close - i - 1), name, list));
      count = MulCapped(count, static_cast<int64_t>(numbers.size()));
      parts.push_back(std::move(numbers));
      i = close + 1;
    } else {
      size_t end = name.find('[', i);
      if (end == std::string_view::npos) end = name.size();
      const std::string_view literal = name.substr(i, end - i);
      if (auto ws = std::find_if(literal.begin(), literal.end(), IsSpace); ws != literal.end()) {
        return Status::InvalidArgument("node list '{}': name '{}' contains whitespace", QuoteForMessage(list),
                                       QuoteForMessage(name));
      }
      parts.push_back({std::string(literal)});
      i = end;
    }
  }
  *total = AddCapped(*total, count);
  if (*total > kMaxNodes) {
    return Status::InvalidArgument("node list '{}' expands to more than {} names", QuoteForMessage(list),
                                   kMaxNodes);
  }
  // Odometer over the parts, the right-most fastest.
  std::vector<size_t> at(parts.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    std::string s;
    for (size_t p = 0; p < parts.size(); ++p) s += parts[p][at[p]];
    out->push_back(std::move(s));
    for (size_t p = parts.size(); p-- > 0;) {
      if (++at[p] < parts[p].size()) break;
      at[p] = 0;
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandNodeList(const std::string& list) {
  if (Trim(list).empty()) return Status::InvalidArgument("node list '{}' is empty", QuoteForMessage(list));
  // Split at commas outside brackets, checking that brackets pair up without nesting.
  std::vector<std::pair<size_t, size_t>> names;  // [begin, end) in `list`
  size_t begin = 0;
  size_t open = std::string::npos;  // the '[' not yet closed
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (open != std::string::npos) {
        return Status::InvalidArgument("node list '{}': '[' at column {} is inside the '[' at column {}",
                                       QuoteForMessage(list), i + 1, open + 1);
      }
      open = i;
    } else if (c == ']') {
      if (open == std::string::npos) {
        return Status::InvalidArgument("node list '{}': ']' at column {} has no '['", QuoteForMessage(list), i + 1);
      }
      open = std::string::npos;
    } else if (c == ',' && open == std::string::npos) {
      names.emplace_back(begin, i);
      begin = i + 1;
    } else if (i == list.size()) {
      return Status::InvalidArgument("node list '{}': '[' at column {} is never closed", QuoteForMessage(list),
                                     open + 1);
    }
  }
  std::vector<std::string> out;
  int64_t total = 0;
  const std::string_view text(list);
  for (const auto& [b, e] : names) {
    const std::string_view name = Trim(text.substr(b, e - b));
    if (name.empty()) {
      return Status::InvalidArgument("node list '{}': empty name at column {}", QuoteForMessage(list), b + 1);
    }
    TF_RETURN_IF_ERROR(ExpandName(name, list, &total, &out));
  }
  return out;
}

std::string CompressNodeList(const std::vector<std::string>& names) {
  // A name split into prefix and trailing digits (none past kMaxDigits: the name is then its prefix).
  struct Split {
    std::string_view prefix, digits;
    bool padded() const { return digits.size() > 1 && digits[0] == '0'; }
  };
  std::vector<Split> splits;
  splits.reserve(names.size());
  std::set<std::pair<std::string_view, size_t>> padded_widths;  // (prefix, width) of zero-padded names
  for (const std::string& name : names) {
    size_t n = 0;
    while (n < name.size() && IsDigit(name[name.size() - 1 - n])) ++n;
    if (n > kMaxDigits) n = 0;
    const std::string_view view(name);
    splits.push_back({view.substr(0, name.size() - n), view.substr(name.size() - n)});
    if (splits.back().padded()) padded_widths.emplace(splits.back().prefix, n);
  }
  struct Group {
    std::string_view prefix;  // the whole name for a name without digits
    size_t width = 0;         // 0: numbers as they are
    std::vector<int64_t> numbers;
  };
  std::vector<Group> groups;
  // (prefix, width, has digits) -> groups[i]
  std::map<std::tuple<std::string_view, size_t, bool>, size_t> index;
  for (const Split& s : splits) {
    const size_t width = (s.padded() || padded_widths.count({s.prefix, s.digits.size()})) ? s.digits.size() : 0;
    auto [it, inserted] = index.try_emplace({s.prefix, width, !s.digits.empty()}, groups.size());
    if (inserted) groups.push_back({s.prefix, width, {}});
    int64_t v = 0;
    if (ParseDigits(s.digits, &v) == Digits::kOk) groups[it->second].numbers.push_back(v);
  }
  std::string out;
  for (Group& g : groups) {
    if (!out.empty()) out += ',';
    std::sort(g.numbers.begin(), g.numbers.end());
    g.numbers.erase(std::unique(g.numbers.begin(), g.numbers.end()), g.numbers.end());
    out += g.prefix;
    if (g.numbers.size() == 1) out += Padded(g.numbers[0], g.width);
    if (g.numbers.size() < 2) continue;
    out += '[';
    for (size_t i = 0; i < g.numbers.size();) {
      size_t j = i;
      while (j + 1 < g.numbers.size() && g.numbers[j + 1] == g.numbers[j] + 1) ++j;
      if (i > 0) out += ',';
      out += Padded(g.numbers[i], g.width);
      if (j > i) out += '-' + Padded(g.numbers[j], g.width);
      i = j + 1;
    }
    out += ']';
  }
  return out;
}

StatusOr<std::vector<int>> ParseTasksPerNode(const std::string& text) {
  const std::string_view all = Trim(text);
  if (all.empty()) return Status::InvalidArgument("tasks per node '{}' is empty", QuoteForMessage(text));
  std::vector<int> out;
  for (size_t start = 0; start <= all.size();) {
    size_t end = all.find(',', start);
    if (end == std::string_view::npos) end = all.size();
    const std::string_view item = Trim(all.substr(start, end - start));
    start = end + 1;
    // "N" or "N(xR)".
    const size_t paren = item.find('(');
    const std::string_view count_text = item.substr(0, paren);
    std::string_view repeat_text = "1";
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') repeat_text = "";
      else repeat_text = item.substr(paren + 2, item.size() - paren - 3);
    }
    int64_t count = 0, repeat = 0;
    const Digits count_ok = ParseDigits(count_text, &count);
    const Digits repeat_ok = ParseDigits(repeat_text, &repeat);
    // A negative number is well formed but out of range.
    const auto negative = [](std::string_view s) {
      int64_t unused = 0;
      return s.size() > 1 && s[0] == '-' && ParseDigits(s.substr(1), &unused) != Digits::kNotDigits;
    };
    if ((count_ok == Digits::kNotDigits && !negative(count_text)) ||
        (repeat_ok == Digits::kNotDigits && !negative(repeat_text))) {
      return Status::InvalidArgument("tasks per node '{}': '{}' is not N or N(xR) with N, R digits",
                                     QuoteForMessage(text), QuoteForMessage(item));
    }
    if (count_ok != Digits::kOk || count < 1 || count > INT_MAX) {
      return Status::InvalidArgument("tasks per node '{}': count '{}' is outside 1..{}", QuoteForMessage(text),
                                     QuoteForMessage(count_text), INT_MAX);
    }
    if (repeat_ok != Digits::kOk || repeat < 1 || repeat > kMaxNodes) {
      return Status::InvalidArgument("tasks per node '{}': repeat '{}' is outside 1..{}", QuoteForMessage(text),
                                     QuoteForMessage(repeat_text), kMaxNodes);
    }
    if (static_cast<int64_t>(out.size()) + repeat > kMaxNodes) {
      return Status::InvalidArgument("tasks per node '{}' covers more than {} nodes", QuoteForMessage(text),
                                     kMaxNodes);
    }
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(count));
  }
  return out;
}

StatusOr<int64_t> ParseSlurmTime(const std::string& text) {
  const std::string_view t = Trim(text);
  const auto quoted = [&] { return QuoteForMessage(text); };
  if (t.empty()) return Status::InvalidArgument("time '{}' is empty", quoted());
  std::string lower(t);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  });
  if (lower == "unlimited" || lower == "infinite") return int64_t{-1};
  if (t.front() == '-') return Status::InvalidArgument("time '{}' is negative", quoted());

  const auto malformed = [&] {
    return Status::InvalidArgument(
        "time '{}' is not MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (digits) or UNLIMITED", quoted());
  };
  const size_t dash = t.find('-');
  const bool has_days = dash != std::string_view::npos;
  std::vector<std::string_view> fields;  // the days first when has_days
  if (has_days) fields.push_back(t.substr(0, dash));
  const std::string_view clock = has_days ? t.substr(dash + 1) : t;
  for (size_t start = 0; start <= clock.size();) {
    size_t end = clock.find(':', start);
    if (end == std::string_view::npos) end = clock.size();
    fields.push_back(clock.substr(start, end - start));
    start = end + 1;
  }
  const size_t clock_fields = fields.size() - (has_days ? 1 : 0);
  if (clock_fields > 3) return malformed();
  std::vector<int64_t> v(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const Digits d = ParseDigits(fields[i], &v[i]);
    if (d == Digits::kNotDigits) return malformed();
    if (d == Digits::kTooLong) {
      return Status::InvalidArgument("time '{}': field '{}' has more than {} digits", quoted(),
                                     QuoteForMessage(fields[i]), kMaxDigits);
    }
  }
  // Each field's unit in seconds and the bound it must stay below when it is not the leading field.
  static constexpr const char* kUnitNames[] = {"days", "hours", "minutes", "seconds"};
  static constexpr int64_t kUnitSeconds[] = {kSecondsPerDay, 3600, 60, 1};
  static constexpr int64_t kBelow[] = {0, 24, 60, 60};
  size_t first_unit;  // index into the tables of fields[0]
  if (has_days) first_unit = 0;
  else if (clock_fields == 3) first_unit = 1;
  else first_unit = 2;
  int64_t seconds = 0;
  for (size_t i = 0; i < fields.size(); ++i) {
    const size_t unit = first_unit + i;
    if (i > 0 && v[i] >= kBelow[unit]) {
      return Status::InvalidArgument("time '{}': {} {} are not below {}", quoted(), kUnitNames[unit], v[i],
                                     kBelow[unit]);
    }
    int64_t part = 0;
    if (__builtin_mul_overflow(v[i], kUnitSeconds[unit], &part) ||
        __builtin_add_overflow(seconds, part, &seconds)) {
      return Status::InvalidArgument("time '{}' is more than {} seconds", quoted(), INT64_MAX);
    }
  }
  return seconds;
}

std::string FormatSlurmTime(int64_t seconds) {
  if (seconds < 0) return "UNLIMITED";
  const int64_t days = seconds / kSecondsPerDay;
  const int64_t rest = seconds % kSecondsPerDay;
  const std::string clock = fmt::format("{:02}:{:02}:{:02}", rest / 3600, rest / 60 % 60, rest % 60);
  return days == 0 ? clock : fmt::format("{}-{}", days, clock);
}

std::string ShellQuote(const std::string& s) {
  const auto safe = [](char c) {
    return IsAlnum(c) || c == '_' || c == '.' || c == '/' || c == ':' || c == '=' || c == ',' || c == '@' ||
           c == '%' || c == '+' || c == '-';
  };
  if (!s.empty() && std::all_of(s.begin(), s.end(), safe)) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  out += '\'';
  return out;
}

bool ValidJobName(const std::string& name) {
  if (name.empty() || name.size() > kMaxJobNameBytes || name[0] == '-' || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsAlnum(c) || c == '_' || c == '.' || c == '-'; });
}

Status CheckSbatchValue(const std::string& flag, const std::string& value) {
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("{} '{}': {}", flag, QuoteForMessage(value, 80), why);
  };
  if (value.empty()) return refuse("empty");
  if (value.size() > 1024) return refuse("longer than 1024 bytes");
  if (value[0] == '-') return refuse("starts with '-' (it would read as another option)");
  if (flag == "--mem") {
    // Slurm: a whole number of megabytes, or with a unit K, M, G or T.
    size_t digits = 0;
    while (digits < value.size() && value[digits] >= '0' && value[digits] <= '9') ++digits;
    const std::string unit = value.substr(digits);
    if (digits == 0 || digits > 15 || !(unit.empty() || (unit.size() == 1 && std::string("KMGTkmgt").find(unit) != std::string::npos))) {
      return refuse("expected a size like 4096, 200G or 2T (megabytes without a unit)");
    }
    return Status::OK();
  }
  // Names (partition, account, QOS: comma lists) and feature expressions (constraint: & | , * [ ] ( ) :).
  const std::string extra = flag == "--constraint" ? ",&|*[]():!" : flag == "--exclude" ? ",[]" : flag == "--account" ? "" : ",";
  for (char c : value) {
    if (!(IsAlnum(c) || c == '_' || c == '.' || c == '-' || extra.find(c) != std::string::npos)) {
      return refuse(fmt::format("'{}' is not allowed (allowed: A-Z a-z 0-9 _ . -{}{})", QuoteForMessage(std::string(1, c)),
                                extra.empty() ? "" : " ", extra));
    }
  }
  return Status::OK();
}

Status CheckSbatchPath(const std::string& what, const std::string& path) {
  for (char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == ' ' || c == '%' || c == '"' || c == '\'' || c == '\\' || c == '$' || c == '`') {
      return Status::InvalidArgument("{} '{}' has {}: it goes into #SBATCH lines, which cannot carry it; use a "
                                     "directory without spaces, quotes, '%', '$' or control characters",
                                     what, QuoteForMessage(path, 120),
                                     c == ' ' ? std::string("a space") : "'" + QuoteForMessage(std::string(1, c)) + "'");
    }
  }
  return Status::OK();
}

Status CheckSbatchOption(const std::string& option) {
  if (!option.starts_with("--") || option.size() < 3 || option[2] == '-') {
    return Status::InvalidArgument("--sbatch-arg '{}': one sbatch long option, like --mail-type=END",
                                   QuoteForMessage(option, 80));
  }
  for (char c : option) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == ' ') {
      return Status::InvalidArgument("--sbatch-arg '{}': one option without spaces or control characters (one "
                                     "--sbatch-arg per option)",
                                     QuoteForMessage(option, 80));
    }
  }
  return Status::OK();
}

}  // namespace tf::slurm
