#include "launch/policy.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <climits>
#include <cmath>
#include <initializer_list>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/backoff.h"
#include "base/json.h"  // QuoteForMessage

namespace tf::launch {
namespace {

constexpr size_t kMaxHostNameBytes = 255;
constexpr int kStateVersion = 1;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

bool IsNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == ':' || c == '-';
}

// The problem with a host name, or "" when it is valid.
std::string NameProblem(std::string_view name) {
  if (name.empty()) return "empty host name";
  if (name.size() > kMaxHostNameBytes) {
    return fmt::format("host name '{}' is longer than {} bytes", QuoteForMessage(name, 40), kMaxHostNameBytes);
  }
  if (name.front() == '-' || name.front() == '.') {
    // A remote shell (ssh) would read "-E..." as an option.
    return fmt::format("host name '{}' starts with '{}'", QuoteForMessage(name, 80), name.front());
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return fmt::format("host name '{}' has '{}' at column {} (allowed: A-Z a-z 0-9 . _ : -)",
                         QuoteForMessage(name, 80), QuoteForMessage(name.substr(i, 1)), i + 1);
    }
  }
  return "";
}

std::string_view SkipSpace(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  return s;
}

// A maximal run of characters that are neither space nor `stop`.
std::string_view TakeToken(std::string_view* s, char stop) {
  size_t n = 0;
  while (n < s->size() && !IsSpace((*s)[n]) && (*s)[n] != stop) ++n;
  std::string_view t = s->substr(0, n);
  s->remove_prefix(n);
  return t;
}

// A slot count in 1..kMaxSlotsPerHost, or the problem.
std::string ParseSlotCount(std::string_view key, std::string_view value, int* out) {
  if (value.empty()) return fmt::format("{} needs a value", key);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  const bool digits_only = std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits_only || end != value.data() + value.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return fmt::format("{} '{}' is not a whole number", key, QuoteForMessage(value, 40));
  }
  if (ec == std::errc::result_out_of_range || v < 1 || v > kMaxSlotsPerHost) {
    return fmt::format("{} {} is outside 1..{}", key, QuoteForMessage(value, 40), kMaxSlotsPerHost);
  }
  *out = static_cast<int>(v);
  return "";
}

// One non-blank, comment-free line: "name [key=value]...".
std::string ParseLine(std::string_view line, HostEntry* host) {
  std::string_view rest = line;
  const std::string_view name = TakeToken(&rest, '\0');
  if (std::string p = NameProblem(name); !p.empty()) return p;
  host->name = std::string(name);
  std::optional<int> slots, max_slots;
  for (rest = SkipSpace(rest); !rest.empty(); rest = SkipSpace(rest)) {
    const std::string_view key = TakeToken(&rest, '=');
    rest = SkipSpace(rest);
    if (key.empty() || rest.empty() || rest.front() != '=') {
      return fmt::format("expected key=value after the host name, got '{}'",
                         QuoteForMessage(key.empty() ? rest : key, 40));
    }
    rest = SkipSpace(rest.substr(1));
    const std::string_view value = TakeToken(&rest, '\0');
    std::optional<int>* target = nullptr;
    if (key == "slots") target = &slots;
    else if (key == "max_slots" || key == "max-slots") target = &max_slots;
    else return fmt::format("unknown key '{}' (expected slots, max_slots or max-slots)", QuoteForMessage(key, 40));
    if (target->has_value()) return fmt::format("{} given twice", key);
    int v = 0;
    if (std::string p = ParseSlotCount(key, value, &v); !p.empty()) return p;
    *target = v;
  }
  host->slots = slots.value_or(1);
  if (max_slots && *max_slots < host->slots) {
    return fmt::format("max_slots {} is less than slots {}", *max_slots, host->slots);
  }
  return "";
}

// JSON field access for FromJson: every failure is Corruption naming the field.
const nlohmann::json* Field(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

Status CheckKeys(const nlohmann::json& obj, std::initializer_list<const char*> keys, const std::string& where) {
  if (!obj.is_object()) return Status::Corruption("{}: not a JSON object: {}", where, JsonForMessage(obj));
  for (const char* k : keys) {
    if (!obj.contains(k)) return Status::Corruption("{}: lacks '{}'", where, k);
  }
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& k = it.key();
    if (std::none_of(keys.begin(), keys.end(), [&](const char* x) { return k == x; })) {
      return Status::Corruption("{}: unexpected key '{}'", where, QuoteForMessage(k, 40));
    }
  }
  return Status::OK();
}

StatusOr<int64_t> IntField(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi,
                           const std::string& where) {
  const nlohmann::json* v = Field(obj, key);
  if (v == nullptr || !v->is_number_integer()) {
    return Status::Corruption("{}: '{}' is not an integer: {}", where, key, v ? JsonForMessage(*v) : "missing");
  }
  // An unsigned value above INT64_MAX reads as negative through get<int64_t>.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Status::Corruption("{}: '{}' = {} is outside {}..{}", where, key, JsonForMessage(*v), lo, hi);
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return Status::Corruption("{}: '{}' = {} is outside {}..{}", where, key, x, lo, hi);
  return x;
}

StatusOr<bool> BoolField(const nlohmann::json& obj, const char* key, const std::string& where) {
  const nlohmann::json* v = Field(obj, key);
  if (v == nullptr || !v->is_boolean()) return Status::Corruption("{}: '{}' is not true or false", where, key);
  return v->get<bool>();
}

StatusOr<double> TimeValue(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    return Status::Corruption("{}: {} is not a finite time in seconds", where, JsonForMessage(v));
  }
  return v.get<double>();
}

std::string RankCount(int w) { return w == 1 ? "1 rank" : fmt::format("{} ranks", w); }

// The largest divisor of n (>= 1) that is at most cap (>= 1).
int64_t LargestDivisorAtMost(int64_t n, int64_t cap) {
  int64_t best = 1;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    if (d <= cap) best = std::max(best, d);
    if (n / d <= cap) best = std::max(best, n / d);
  }
  return best;
}

}  // namespace

StatusOr<std::vector<HostEntry>> ParseHostfile(std::string_view text, const std::string& source) {
  std::vector<HostEntry> hosts;
  std::map<std::string, int> first_line;
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    line = line.substr(0, line.find('#'));
    line = SkipSpace(line);
    while (!line.empty() && IsSpace(line.back())) line.remove_suffix(1);
    if (line.empty()) continue;
    HostEntry h;
    if (std::string p = ParseLine(line, &h); !p.empty()) {
      return Status::InvalidArgument("{}: line {}: {}", source, line_no, p);
    }
    auto [it, inserted] = first_line.emplace(h.name, line_no);
    if (!inserted) {
      return Status::InvalidArgument("{}: line {}: host '{}' is listed twice (first on line {})", source, line_no,
                                     h.name, it->second);
    }
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) return Status::InvalidArgument("{}: no hosts", source);
  return hosts;
}

std::string FormatHostfile(const std::vector<HostEntry>& hosts) {
  std::string out;
  for (const HostEntry& h : hosts) out += fmt::format("{} slots={}\n", h.name, h.slots);
  return out;
}

int TotalSlots(const std::vector<HostEntry>& hosts) {
  int n = 0;
  for (const HostEntry& h : hosts) n += h.slots;
  return n;
}

const char* HostStateName(HostState s) {
  switch (s) {
    case HostState::kHealthy: return "healthy";
    case HostState::kQuarantined: return "quarantined";
    case HostState::kGone: return "gone";
  }
  return "?";
}

HostBook::HostBook(QuarantinePolicy p) : p_(p) {
  assert(p.max_failures >= 1 && p.window_s > 0);
}

void HostBook::SetHosts(const std::vector<HostEntry>& hosts) {
  for (auto& [name, r] : records_) r.listed = false;
  order_.clear();
  for (const HostEntry& h : hosts) {
    Record& r = records_[h.name];
    r.slots = h.slots;
    if (r.listed) continue;
    r.listed = true;
    order_.push_back(h.name);
  }
}

int HostBook::CountInWindow(const Record& r, double now) const {
  return static_cast<int>(
      std::count_if(r.failures.begin(), r.failures.end(), [&](double t) { return now - t < p_.window_s; }));
}

bool HostBook::RecordFailure(const std::string& host, double now, const std::string& cause) {
  Record& r = records_[host];
  std::erase_if(r.failures, [&](double t) { return now - t >= p_.window_s; });
  r.failures.push_back(now);
  ++r.total_failures;
  r.last_cause = cause;
  if (r.quarantined || CountInWindow(r, now) < p_.max_failures) return false;
  r.quarantined = true;
  return true;
}

void HostBook::Readmit(const std::string& host, double /*now*/) {
  auto it = records_.find(host);
  if (it == records_.end()) return;
  it->second.quarantined = false;
  it->second.failures.clear();
}

HostState HostBook::state(const std::string& host) const {
  auto it = records_.find(host);
  if (it == records_.end() || !it->second.listed) return HostState::kGone;
  return it->second.quarantined ? HostState::kQuarantined : HostState::kHealthy;
}

std::vector<HostEntry> HostBook::Usable() const {
  std::vector<HostEntry> out;
  for (const std::string& name : order_) {
    const Record& r = records_.at(name);
    if (!r.quarantined) out.push_back({name, r.slots});
  }
  return out;
}

std::vector<std::string> HostBook::Quarantined() const {
  std::vector<std::string> out;
  for (const std::string& name : order_) {
    if (records_.at(name).quarantined) out.push_back(name);
  }
  return out;
}

int HostBook::failures_in_window(const std::string& host, double now) const {
  auto it = records_.find(host);
  return it == records_.end() ? 0 : CountInWindow(it->second, now);
}

int HostBook::total_failures(const std::string& host) const {
  auto it = records_.find(host);
  return it == records_.end() ? 0 : static_cast<int>(std::min<int64_t>(it->second.total_failures, INT_MAX));
}

std::string HostBook::last_cause(const std::string& host) const {
  auto it = records_.find(host);
  return it == records_.end() ? "" : it->second.last_cause;
}

nlohmann::json HostBook::ToJson() const {
  auto entry = [](const std::string& name, const Record& r) {
    return nlohmann::json{{"name", name},
                          {"slots", r.slots},
                          {"listed", r.listed},
                          {"quarantined", r.quarantined},
                          {"failures", r.failures},
                          {"total_failures", r.total_failures},
                          {"last_cause", r.last_cause}};
  };
  nlohmann::json hosts = nlohmann::json::array();
  for (const std::string& name : order_) hosts.push_back(entry(name, records_.at(name)));
  for (const auto& [name, r] : records_) {
    if (!r.listed) hosts.push_back(entry(name, r));
  }
  return {{"version", kStateVersion}, {"hosts", std::move(hosts)}};
}

StatusOr<HostBook> HostBook::FromJson(const nlohmann::json& j, QuarantinePolicy p) {
  const std::string where = "host book state";
  TF_RETURN_IF_ERROR(CheckKeys(j, {"version", "hosts"}, where));
  TF_ASSIGN_OR_RETURN(int64_t version, IntField(j, "version", kStateVersion, kStateVersion, where));
  (void)version;
  const nlohmann::json& hosts = j["hosts"];
  if (!hosts.is_array()) return Status::Corruption("{}: 'hosts' is not an array", where);
  HostBook book(p);
  for (size_t i = 0; i < hosts.size(); ++i) {
    const nlohmann::json& h = hosts[i];
    const std::string at = fmt::format("{}: hosts[{}]", where, i);
    TF_RETURN_IF_ERROR(CheckKeys(h, {"name", "slots", "listed", "quarantined", "failures", "total_failures",
                                     "last_cause"},
                                 at));
    if (!h["name"].is_string()) return Status::Corruption("{}: 'name' is not a string", at);
    const std::string name = h["name"].get<std::string>();
    if (std::string problem = NameProblem(name); !problem.empty()) return Status::Corruption("{}: {}", at, problem);
    if (book.records_.contains(name)) return Status::Corruption("{}: host '{}' appears twice", at, name);
    Record r;
    TF_ASSIGN_OR_RETURN(int64_t slots, IntField(h, "slots", 1, kMaxSlotsPerHost, at));
    r.slots = static_cast<int>(slots);
    TF_ASSIGN_OR_RETURN(r.listed, BoolField(h, "listed", at));
    TF_ASSIGN_OR_RETURN(r.quarantined, BoolField(h, "quarantined", at));
    if (!h["failures"].is_array()) return Status::Corruption("{}: 'failures' is not an array", at);
    for (const nlohmann::json& t : h["failures"]) {
      TF_ASSIGN_OR_RETURN(double time, TimeValue(t, at + ": failures"));
      r.failures.push_back(time);
    }
    TF_ASSIGN_OR_RETURN(r.total_failures,
                        IntField(h, "total_failures", static_cast<int64_t>(r.failures.size()), INT64_MAX, at));
    if (!h["last_cause"].is_string()) return Status::Corruption("{}: 'last_cause' is not a string", at);
    r.last_cause = h["last_cause"].get<std::string>();
    if (r.listed) book.order_.push_back(name);
    book.records_.emplace(name, std::move(r));
  }
  return book;
}

RestartBackoff::RestartBackoff(BackoffPolicy p) : p_(p) { assert(p.factor >= 1); }

void RestartBackoff::Started(double now) { started_ = now; }

double RestartBackoff::NextDelay(double now) {
  if (started_ && now - *started_ >= p_.reset_after_s) consecutive_ = 0;
  started_.reset();
  if (consecutive_ < INT_MAX) ++consecutive_;
  if (consecutive_ == 1) return std::min(p_.first_s, p_.max_s);
  return ExponentialDelay(p_.base_s, p_.factor, consecutive_ - 2, p_.max_s);
}

nlohmann::json RestartBackoff::ToJson() const {
  return {{"version", kStateVersion},
          {"consecutive", consecutive_},
          {"started", started_ ? nlohmann::json(*started_) : nlohmann::json(nullptr)}};
}

StatusOr<RestartBackoff> RestartBackoff::FromJson(const nlohmann::json& j, BackoffPolicy p) {
  const std::string where = "restart backoff state";
  TF_RETURN_IF_ERROR(CheckKeys(j, {"version", "consecutive", "started"}, where));
  TF_ASSIGN_OR_RETURN(int64_t version, IntField(j, "version", kStateVersion, kStateVersion, where));
  (void)version;
  RestartBackoff b(p);
  TF_ASSIGN_OR_RETURN(int64_t consecutive, IntField(j, "consecutive", 0, INT_MAX, where));
  b.consecutive_ = static_cast<int>(consecutive);
  if (!j["started"].is_null()) {
    TF_ASSIGN_OR_RETURN(double started, TimeValue(j["started"], where + ": started"));
    b.started_ = started;
  }
  return b;
}

StatusOr<BatchPlan> PlanBatch(int64_t global_rows, int max_batch_size, int min_ranks, int max_ranks,
                              int usable_slots, int world_multiple) {
  if (world_multiple < 1) return Status::InvalidArgument("world multiple {} is less than 1", world_multiple);
  if (global_rows < 1 || global_rows > INT32_MAX) {
    return Status::InvalidArgument("global batch of {} rows is outside 1..{}", global_rows, INT32_MAX);
  }
  if (max_batch_size < 1) return Status::InvalidArgument("max batch size {} is less than 1", max_batch_size);
  if (min_ranks < 1) return Status::InvalidArgument("min_ranks {} is less than 1", min_ranks);
  if (max_ranks < min_ranks) {
    return Status::InvalidArgument("max_ranks {} is less than min_ranks {}", max_ranks, min_ranks);
  }
  if (usable_slots < 0) return Status::InvalidArgument("usable slots {} is negative", usable_slots);
  if (usable_slots < min_ranks) {
    return Status::Unavailable("{} usable slot{}, fewer than min_ranks {}", usable_slots, usable_slots == 1 ? "" : "s",
                               min_ranks);
  }
  const int top = std::min(max_ranks, usable_slots) / world_multiple * world_multiple;
  if (top < min_ranks || top == 0) {
    return Status::Unavailable("no multiple of shard_group_size {} in [{}, {}] ranks ({} usable slots)", world_multiple,
                               min_ranks, std::min(max_ranks, usable_slots), usable_slots);
  }
  BatchPlan plan;
  for (int w = top; w >= min_ranks && !plan.exact; w -= world_multiple) {
    if (global_rows % w != 0) continue;
    plan.world = w;
    plan.exact = true;
    plan.global_rows = global_rows;
  }
  int64_t per_rank = 0;
  if (plan.exact) {
    per_rank = global_rows / plan.world;
  } else {
    plan.world = top;
    const int64_t below = global_rows / top;  // the smaller candidate wins ties
    const int64_t above = below + 1;
    per_rank = below >= 1 && global_rows - below * top <= above * top - global_rows ? below : above;
    plan.global_rows = per_rank * top;
  }
  plan.batch_size = static_cast<int>(LargestDivisorAtMost(per_rank, max_batch_size));
  plan.grad_accum_steps = static_cast<int>(per_rank / plan.batch_size);
  const std::string shape =
      fmt::format("{} x {} x {}", RankCount(plan.world), plan.batch_size, plan.grad_accum_steps);
  if (!plan.exact) {
    plan.note = fmt::format("global batch {} -> {} rows: {}", global_rows, plan.global_rows, shape);
  } else if (plan.world < top) {
    plan.note = fmt::format("global batch {} rows: {} (not {} ranks: no larger world divides {} rows)", global_rows,
                            shape, top, global_rows);
  } else {
    plan.note = fmt::format("global batch {} rows: {}", global_rows, shape);
  }
  return plan;
}

std::vector<HostEntry> AssignRanks(const std::vector<HostEntry>& usable, int world) {
  std::vector<HostEntry> out;
  for (const HostEntry& h : usable) {
    if (world <= 0) break;
    const int n = std::min(h.slots, world);
    if (n <= 0) continue;
    out.push_back({h.name, n});
    world -= n;
  }
  return out;
}

}  // namespace tf::launch
