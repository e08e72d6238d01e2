// RenderReportHtml (report.h): parse metrics.jsonl into columns, resolve rollbacks and repeated
// steps, then write the page: summary, notes, run info, one SVG chart per metric group, events.
#include "monitor/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/json.h"

namespace tf::monitor {
namespace {

using nlohmann::json;

// ---- what metrics.jsonl holds -------------------------------------------------------------------

enum Metric : int {
  kLoss, kValLoss, kLr, kGradNorm, kMs, kTokensPerS, kMfu, kDataMs, kComputeMs, kCommExposedMs,
  kOptimizerMs, kCommMs, kCodecMs, kWireBytes, kCommGBps, kRssBytes, kCheckpointStallMs, kNumMetrics
};
constexpr std::array<const char*, kNumMetrics> kMetricKeys = {
    "loss", "val_loss", "lr", "grad_norm", "ms", "tokens_per_s", "mfu", "data_ms", "compute_ms",
    "comm_exposed_ms", "optimizer_ms", "comm_ms", "codec_ms", "wire_bytes", "comm_GBps", "rss_bytes",
    "checkpoint_stall_ms"};

struct Event {
  std::optional<int64_t> step;
  std::string kind;
  std::string message;
  std::string details;  // the other keys, as compact JSON
  std::optional<double> val_loss;  // an "eval" event's
};

// The resolved run. A value column is empty when no record has the key; otherwise it has one entry
// per step: NaN where the record lacks the key, +inf where it holds null (a non-finite value).
struct Run {
  std::vector<int64_t> steps;  // ascending, unique
  std::array<std::vector<double>, kNumMetrics> values;
  std::vector<Event> events;  // in file order
  int64_t malformed_lines = 0;
  bool torn_last_line = false;
  int64_t rolled_back = 0;  // step records discarded by a later rollback
  int64_t replaced = 0;     // step records replaced by a later record of the same step
};

bool Plottable(double v) { return std::isfinite(v) && std::fabs(v) < 1e300; }

std::optional<int64_t> NonNegativeInt(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < 0) return std::nullopt;
  return i;
}

std::string CompactJson(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// An "eval" event's loss as the validation point of its step: the evaluation before training has
// no step record, so its step is inserted (with no other value).
void AddEvaluationEvents(Run* run) {
  for (const Event& e : run->events) {
    if (!e.val_loss) continue;
    const auto it = std::lower_bound(run->steps.begin(), run->steps.end(), *e.step);
    const size_t i = static_cast<size_t>(it - run->steps.begin());
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (it == run->steps.end() || *it != *e.step) {
      run->steps.insert(it, *e.step);
      for (std::vector<double>& col : run->values) {
        if (!col.empty()) col.insert(col.begin() + static_cast<ptrdiff_t>(i), nan);
      }
    }
    std::vector<double>& val = run->values[kValLoss];
    if (val.empty()) val.assign(run->steps.size(), nan);
    if (std::isnan(val[i])) val[i] = *e.val_loss;
  }
}

// Each checkpoint snapshot (a step record's checkpoint_stall_ms) as a checkpoint event.
void AddCheckpointEvents(Run* run) {
  const std::vector<double>& stall = run->values[kCheckpointStallMs];
  for (size_t i = 0; i < stall.size(); ++i) {
    if (std::isnan(stall[i])) continue;
    Event e;
    e.step = run->steps[i];
    e.kind = "checkpoint";
    e.message = Plottable(stall[i]) ? fmt::format("snapshot taken: training paused {:.1f} ms", stall[i])
                                    : "snapshot taken";
    run->events.push_back(std::move(e));
  }
}

StatusOr<Run> ParseRun(std::string_view text) {
  // Records in file order; rollbacks as (number of records before the event, to_step).
  std::vector<int64_t> raw_steps;
  std::array<std::vector<double>, kNumMetrics> raw_values;
  std::vector<std::pair<size_t, int64_t>> rollbacks;
  Run run;

  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    const bool unterminated = end == std::string_view::npos;
    if (unterminated) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const StatusOr<json> parsed = ParseJson(line, "metrics line", /*allow_comments=*/false);
    if (!parsed.ok() && unterminated) {
      run.torn_last_line = true;
      continue;
    }
    if (!parsed.ok() || !parsed->is_object()) {
      ++run.malformed_lines;
      continue;
    }
    const json& record = *parsed;
    const auto step_it = record.find("step");
    const std::optional<int64_t> step = step_it == record.end() ? std::nullopt : NonNegativeInt(*step_it);

    if (const auto ev = record.find("event"); ev != record.end()) {
      Event e;
      e.kind = ev->is_string() ? ev->get<std::string>() : CompactJson(*ev);
      if (step_it != record.end() && !step) {
        ++run.malformed_lines;
        continue;
      }
      e.step = step;
      if (e.kind == "rollback") {
        const auto to = record.find("to_step");
        const std::optional<int64_t> to_step = to == record.end() ? std::nullopt : NonNegativeInt(*to);
        if (!to_step) {
          ++run.malformed_lines;
          continue;
        }
        rollbacks.emplace_back(raw_steps.size(), *to_step);
      }
      json rest = json::object();
      for (const auto& [key, value] : record.items()) {
        if (key == "message" && value.is_string()) e.message = value.get<std::string>();
        else if (key != "event" && key != "step") rest[key] = value;
      }
      if (const auto v = record.find("val_loss"); e.kind == "eval" && step && v != record.end() && v->is_number()) {
        e.val_loss = v->get<double>();
      }
      if (!rest.empty()) e.details = CompactJson(rest);
      run.events.push_back(std::move(e));
      continue;
    }

    if (!step) {
      ++run.malformed_lines;
      continue;
    }
    std::array<double, kNumMetrics> row;
    row.fill(std::numeric_limits<double>::quiet_NaN());
    bool ok = true;
    for (int m = 0; m < kNumMetrics && ok; ++m) {
      const auto it = record.find(kMetricKeys[m]);
      if (it == record.end()) continue;
      if (it->is_number()) row[m] = it->get<double>();
      else if (it->is_null()) row[m] = std::numeric_limits<double>::infinity();
      else ok = false;
    }
    if (!ok) {
      ++run.malformed_lines;
      continue;
    }
    const size_t index = raw_steps.size();
    raw_steps.push_back(*step);
    for (int m = 0; m < kNumMetrics; ++m) {
      if (std::isnan(row[m]) && raw_values[m].empty()) continue;
      raw_values[m].resize(index, std::numeric_limits<double>::quiet_NaN());
      raw_values[m].push_back(row[m]);
    }
  }
  if (raw_steps.empty()) {
    return Status::InvalidArgument("metrics.jsonl has no step records ({} malformed lines{})",
                                   run.malformed_lines, run.torn_last_line ? ", a torn last line" : "");
  }

  // A record survives when no later rollback goes back before its step.
  std::vector<uint32_t> kept;
  kept.reserve(raw_steps.size());
  int64_t limit = std::numeric_limits<int64_t>::max();
  auto rb = rollbacks.rbegin();
  for (size_t i = raw_steps.size(); i-- > 0;) {
    for (; rb != rollbacks.rend() && rb->first > i; ++rb) limit = std::min(limit, rb->second);
    if (raw_steps[i] <= limit) kept.push_back(static_cast<uint32_t>(i));
    else ++run.rolled_back;
  }
  std::reverse(kept.begin(), kept.end());
  std::stable_sort(kept.begin(), kept.end(), [&](uint32_t a, uint32_t b) { return raw_steps[a] < raw_steps[b]; });
  std::vector<uint32_t> order;  // the last record of each step
  order.reserve(kept.size());
  for (size_t k = 0; k < kept.size(); ++k) {
    if (k + 1 < kept.size() && raw_steps[kept[k + 1]] == raw_steps[kept[k]]) ++run.replaced;
    else order.push_back(kept[k]);
  }
  if (order.empty()) {
    return Status::InvalidArgument("metrics.jsonl: every step record was discarded by a rollback");
  }

  run.steps.reserve(order.size());
  for (uint32_t i : order) run.steps.push_back(raw_steps[i]);
  for (int m = 0; m < kNumMetrics; ++m) {
    std::vector<double>& raw = raw_values[m];
    if (raw.empty()) continue;
    raw.resize(raw_steps.size(), std::numeric_limits<double>::quiet_NaN());
    std::vector<double>& col = run.values[m];
    col.reserve(order.size());
    for (uint32_t i : order) col.push_back(raw[i]);
    if (std::none_of(col.begin(), col.end(), [](double v) { return !std::isnan(v); })) col.clear();
    std::vector<double>().swap(raw);
  }
  AddEvaluationEvents(&run);
  AddCheckpointEvents(&run);
  return run;
}

// ---- text ------------------------------------------------------------------------------------------

void AppendEscaped(std::string_view s, std::string* out) {
  for (const char c : s) {
    switch (c) {
      case '&': *out += "&amp;"; break;
      case '<': *out += "&lt;"; break;
      case '>': *out += "&gt;"; break;
      case '"': *out += "&quot;"; break;
      case '\'': *out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') out->push_back(' ');
        else out->push_back(c);
    }
  }
}

std::string Escaped(std::string_view s) {
  std::string out;
  AppendEscaped(s, &out);
  return out;
}

// At most max_bytes of `s`, cut on a UTF-8 character boundary, with "…" when cut.
std::string Cut(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "\u2026";
}

// Numbers as charts show them: enough significant digits to tell values `resolution` apart, and a
// k/M/G/T/P suffix (chosen once per axis) from 10^4 up.
struct NumberFormat {
  double div = 1;
  const char* suffix = "";
  double resolution = 1;
};

NumberFormat ChooseFormat(double max_abs, double resolution) {
  static constexpr std::array<const char*, 6> kSuffix = {"", "k", "M", "G", "T", "P"};
  NumberFormat f;
  f.resolution = resolution > 0 ? resolution : 1;
  if (max_abs >= 1e4) {
    const int e3 = std::min(5, static_cast<int>(std::floor(std::log10(max_abs) / 3)));
    f.div = std::pow(10.0, 3 * e3);
    f.suffix = kSuffix[e3];
  }
  return f;
}

std::string FormatNumber(double v, const NumberFormat& f) {
  const double x = v / f.div, r = f.resolution / f.div;
  if (std::fabs(x) < r * 1e-6 || x == 0) return "0";
  const int lead = static_cast<int>(std::floor(std::log10(std::fabs(x)) + 1e-9));
  int sig = lead - static_cast<int>(std::floor(std::log10(r) + 1e-9)) + 1;
  if (lead >= 0) sig = std::max(sig, lead + 1);
  sig = std::clamp(sig, 1, 15);
  std::string s = fmt::format("{:.{}g}", x, sig);
  if (const size_t e = s.find('e'); e != std::string::npos) {  // 6e-05 -> 6e-5
    std::string exp = s.substr(e + 1);
    const bool negative = exp[0] == '-';
    exp.erase(0, exp.find_first_not_of("+-0"));
    s = s.substr(0, e + 1) + (negative ? "-" : "") + (exp.empty() ? "0" : exp);
  }
  return s + f.suffix;
}

std::string FormatValue(double v) { return FormatNumber(v, ChooseFormat(std::fabs(v), std::fabs(v) * 1e-3)); }

std::string FormatDuration(double ms) {
  const double s = ms / 1000;
  if (s < 60) return fmt::format("{:.1f} s", s);
  const auto total = static_cast<int64_t>(std::llround(s));
  if (total < 3600) return fmt::format("{}m {:02}s", total / 60, total % 60);
  return fmt::format("{}h {:02}m {:02}s", total / 3600, total / 60 % 60, total % 60);
}

// ---- charts ----------------------------------------------------------------------------------------

struct SeriesDef {
  Metric metric;
  const char* label;
};
struct ChartDef {
  const char* id;
  const char* title;
  const char* unit;  // the y axis label
  double scale;      // plotted value = recorded value * scale
  std::vector<SeriesDef> series;
};

const std::vector<ChartDef>& Charts() {
  static const std::vector<ChartDef> charts = {
      {"loss", "Loss", "loss (nats/token)", 1, {{kLoss, "train"}, {kValLoss, "val"}}},
      {"lr", "Learning rate", "learning rate", 1, {{kLr, "lr"}}},
      {"grad_norm", "Gradient norm (before clipping)", "L2 norm", 1, {{kGradNorm, "grad norm"}}},
      {"throughput", "Throughput", "tokens/s", 1, {{kTokensPerS, "tokens/s"}}},
      {"mfu", "Model FLOPs utilisation", "MFU (%)", 100, {{kMfu, "MFU"}}},
      {"step_time", "Step time", "ms", 1,
       {{kMs, "step"}, {kDataMs, "data"}, {kComputeMs, "compute"}, {kCommExposedMs, "comm exposed"},
        {kOptimizerMs, "optimizer"}}},
      {"comm_bandwidth", "Communication bandwidth (inside collectives)", "GB/s", 1, {{kCommGBps, "achieved"}}},
      {"comm_sent", "Gradient bytes sent per step", "MB", 1e-6, {{kWireBytes, "sent"}}},
      {"comm_time", "Communication time", "ms", 1, {{kCommMs, "in collectives"}, {kCodecMs, "codec"}}},
      {"memory", "Host memory (RSS)", "GiB", 1.0 / (1 << 30), {{kRssBytes, "RSS"}}},
      {"checkpoint", "Checkpoint stalls", "ms", 1, {{kCheckpointStallMs, "stall"}}},
  };
  return charts;
}

constexpr std::array<const char*, 5> kColors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"};
constexpr int kWidth = 880, kHeight = 300, kLeft = 76, kRight = 16, kTop = 12, kBottom = 44;
constexpr int kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr size_t kMaxDots = 120;  // series with at most this many points also get a dot per point

struct Tick {
  double value;
  std::string label;
};

double NiceStep(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

// Ticks at multiples of a 1-2-5 step inside [lo, hi].
std::vector<Tick> LinearTicks(double lo, double hi, double step) {
  std::vector<double> values;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9 && values.size() < 50; ++k) {
    values.push_back(k * step);
  }
  double max_abs = 0;
  for (double v : values) max_abs = std::max(max_abs, std::fabs(v));
  const NumberFormat f = ChooseFormat(max_abs, step);
  std::vector<Tick> ticks;
  for (double v : values) ticks.push_back({v, FormatNumber(v, f)});
  return ticks;
}

// Ticks at m * 10^e inside [lo, hi] (lo > 0): m = 1 over many decades, 1-2-5 over a few, 1..9 within one.
std::vector<Tick> LogTicks(double lo, double hi) {
  const double decades = std::log10(hi / lo);
  std::vector<int> mult = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  if (decades >= 4) mult = {1};
  else if (decades >= 1.5) mult = {1, 2, 5};
  std::vector<Tick> ticks;
  for (int e = static_cast<int>(std::floor(std::log10(lo))); e <= static_cast<int>(std::ceil(std::log10(hi))); ++e) {
    for (int m : mult) {
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) ticks.push_back({v, FormatNumber(v, ChooseFormat(v, v))});
    }
  }
  if (ticks.size() < 2) return LinearTicks(lo, hi, NiceStep(hi - lo, 4));
  return ticks;
}

struct SeriesStats {
  const SeriesDef* def = nullptr;
  const std::vector<double>* values = nullptr;
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  double last = 0;
  int64_t last_step = 0, points = 0, nonfinite = 0, nonpositive = 0;
};

// Per pixel column, the first-occurring of the min and the max, then the other: spikes stay visible.
std::vector<std::pair<double, double>> Downsample(const std::vector<int64_t>& steps, const std::vector<double>& values,
                                                  double scale, bool log_y, double x0, double x1) {
  std::vector<std::pair<double, double>> out;  // (step, plotted value)
  int bucket = -1;
  size_t lo_i = 0, hi_i = 0;
  auto value = [&](size_t i) { return values[i] * scale; };
  auto flush = [&] {
    if (bucket < 0) return;
    const size_t a = std::min(lo_i, hi_i), b = std::max(lo_i, hi_i);
    out.emplace_back(static_cast<double>(steps[a]), value(a));
    if (b != a) out.emplace_back(static_cast<double>(steps[b]), value(b));
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const double v = value(i);
    if (!Plottable(v) || (log_y && v <= 0)) continue;
    const int b = std::min(kPlotW - 1, static_cast<int>((steps[i] - x0) / (x1 - x0) * kPlotW));
    if (b != bucket) {
      flush();
      bucket = b;
      lo_i = hi_i = i;
    } else if (v < value(lo_i)) {
      lo_i = i;
    } else if (v > value(hi_i)) {
      hi_i = i;
    }
  }
  flush();
  return out;
}

int EventRank(std::string_view kind) {
  if (kind == "rollback") return 3;
  if (kind == "anomaly") return 2;
  if (kind == "checkpoint") return 0;
  return 1;
}
const char* EventClass(int rank) {
  static constexpr std::array<const char*, 4> kClass = {"ev-checkpoint", "ev-other", "ev-anomaly", "ev-rollback"};
  return kClass[rank];
}

// One vertical line per pixel column that has events, coloured by its most severe kind.
void AppendEventMarkers(const std::vector<Event>& events, double x0, double x1, std::string* out) {
  struct Column {
    int rank = -1;
    int64_t first = 0, last = 0, count = 0;
    std::map<std::string, int64_t> kinds;
    const Event* only = nullptr;
  };
  std::map<int, Column> columns;
  for (const Event& e : events) {
    if (!e.step || *e.step < x0 || *e.step > x1) continue;
    const int px = std::min(kPlotW - 1, static_cast<int>((*e.step - x0) / (x1 - x0) * kPlotW));
    Column& c = columns[px];
    if (c.count == 0) c.first = *e.step;
    c.first = std::min(c.first, *e.step);
    c.last = std::max(c.last, *e.step);
    c.rank = std::max(c.rank, EventRank(e.kind));
    ++c.kinds[e.kind];
    ++c.count;
    c.only = c.count == 1 ? &e : nullptr;
  }
  for (const auto& [px, c] : columns) {
    const double x = kLeft + px + 0.5;
    fmt::format_to(std::back_inserter(*out), R"(<line class="ev {}" x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}"><title>)",
                   EventClass(c.rank), x, kTop, x, kTop + kPlotH);
    std::string title;
    if (c.only != nullptr) {
      title = fmt::format("step {}: {}", c.first, c.only->kind);
      if (!c.only->message.empty()) title += ": " + c.only->message;
    } else {
      title = fmt::format("steps {}-{}: {} events (", c.first, c.last, c.count);
      bool first = true;
      for (const auto& [kind, n] : c.kinds) {
        title += fmt::format("{}{} {}", first ? "" : ", ", kind, n);
        first = false;
      }
      title += ")";
    }
    AppendEscaped(Cut(title, 200), out);
    *out += "</title></line>\n";
  }
}

// Appends the chart's section; nothing when none of its series has a plottable point.
void AppendChart(const Run& run, const ChartDef& def, bool log_y, std::string* out) {
  std::vector<SeriesStats> series;
  for (const SeriesDef& s : def.series) {
    const std::vector<double>& col = run.values[s.metric];
    if (col.empty()) continue;
    SeriesStats st;
    st.def = &s;
    st.values = &col;
    for (size_t i = 0; i < col.size(); ++i) {
      if (std::isnan(col[i])) continue;
      const double v = col[i] * def.scale;
      if (!Plottable(v)) {
        ++st.nonfinite;
        continue;
      }
      if (log_y && v <= 0) {
        ++st.nonpositive;
        continue;
      }
      st.min = std::min(st.min, v);
      st.max = std::max(st.max, v);
      st.last = v;
      st.last_step = run.steps[i];
      ++st.points;
    }
    series.push_back(st);
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const SeriesStats& s : series) {
    if (s.points == 0) continue;
    lo = std::min(lo, s.min);
    hi = std::max(hi, s.max);
  }
  if (!(lo <= hi)) return;

  double x0 = static_cast<double>(run.steps.front()), x1 = static_cast<double>(run.steps.back());
  for (const Event& e : run.events) {
    if (!e.step) continue;
    x0 = std::min(x0, static_cast<double>(*e.step));
    x1 = std::max(x1, static_cast<double>(*e.step));
  }
  if (x1 == x0) {
    x0 -= 1;
    x1 += 1;
  }
  std::vector<Tick> y_ticks;
  if (log_y) {
    if (hi == lo) {
      lo /= 1.1;
      hi *= 1.1;
    }
    y_ticks = LogTicks(lo, hi);
    const double pad = 0.03 * std::log10(hi / lo);
    lo = std::pow(10.0, std::log10(lo) - pad);
    hi = std::pow(10.0, std::log10(hi) + pad);
  } else {
    if (hi == lo) {
      const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
    const double step = NiceStep(hi - lo, 5);
    lo = std::floor(lo / step + 1e-9) * step;
    hi = std::ceil(hi / step - 1e-9) * step;
    y_ticks = LinearTicks(lo, hi, step);
  }
  const double ylo = log_y ? std::log10(lo) : lo, yhi = log_y ? std::log10(hi) : hi;
  auto px = [&](double step) { return kLeft + (step - x0) / (x1 - x0) * kPlotW; };
  auto py = [&](double v) { return kTop + kPlotH - ((log_y ? std::log10(v) : v) - ylo) / (yhi - ylo) * kPlotH; };

  auto o = std::back_inserter(*out);
  fmt::format_to(o, R"(<section class="chart" id="chart-{}"><h2>{}</h2>)"
                    "\n",
                 def.id, Escaped(def.title));
  fmt::format_to(o,
                 R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img">)"
                 "\n",
                 kWidth, kHeight);
  fmt::format_to(o, R"(<rect class="plot" x="{}" y="{}" width="{}" height="{}"/>)"
                    "\n",
                 kLeft, kTop, kPlotW, kPlotH);
  for (const Tick& t : y_ticks) {
    const double y = py(t.value);
    fmt::format_to(o, R"(<line class="grid" x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}"/>)", kLeft, y, kLeft + kPlotW, y);
    fmt::format_to(o, R"(<text class="yt" x="{}" y="{:.1f}">{}</text>)"
                      "\n",
                   kLeft - 6, y + 4, t.label);
  }
  const double x_step = std::max(1.0, NiceStep(x1 - x0, 8));
  for (const Tick& t : LinearTicks(x0, x1, x_step)) {
    const double x = px(t.value);
    fmt::format_to(o, R"(<line class="grid" x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}"/>)", x, kTop, x, kTop + kPlotH);
    fmt::format_to(o, R"(<text class="xt" x="{:.1f}" y="{}">{}</text>)"
                      "\n",
                   x, kTop + kPlotH + 16, t.label);
  }
  fmt::format_to(o, R"(<text class="xl" x="{}" y="{}">step</text>)"
                    "\n",
                 kLeft + kPlotW / 2, kHeight - 6);
  fmt::format_to(o, R"svg(<text class="yl" transform="rotate(-90)" x="{}" y="14">{}{}</text>)svg"
                    "\n",
                 -(kTop + kPlotH / 2), Escaped(def.unit), log_y ? " (log scale)" : "");
  if (def.series.front().metric == kLoss) AppendEventMarkers(run.events, x0, x1, out);

  for (size_t k = 0; k < series.size(); ++k) {
    const SeriesStats& s = series[k];
    const char* color = kColors[k % kColors.size()];
    const auto points = Downsample(run.steps, *s.values, def.scale, log_y, x0, x1);
    fmt::format_to(o, R"(<polyline class="series" stroke="{}" points=")", color);
    for (size_t i = 0; i < points.size(); ++i) {
      fmt::format_to(o, "{}{:.1f},{:.1f}", i == 0 ? "" : " ", px(points[i].first), py(points[i].second));
    }
    *out += "\"/>\n";
    if (points.size() <= kMaxDots) {
      for (const auto& [step, v] : points) {
        fmt::format_to(o, R"(<circle r="2.5" fill="{}" cx="{:.1f}" cy="{:.1f}"/>)", color, px(step), py(v));
      }
      *out += "\n";
    }
  }
  *out += "</svg>\n";

  *out += "<table class=\"legend\"><tr><th></th><th>series</th><th>min</th><th>max</th><th>last</th><th></th></tr>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const SeriesStats& s = series[k];
    fmt::format_to(o, R"(<tr><td><span class="swatch" style="background:{}"></span></td><td>{}</td>)",
                   kColors[k % kColors.size()], Escaped(s.def->label));
    if (s.points > 0) {
      fmt::format_to(o, "<td>{}</td><td>{}</td><td>{} (step {})</td>", FormatValue(s.min), FormatValue(s.max),
                     FormatValue(s.last), s.last_step);
    } else {
      *out += "<td>-</td><td>-</td><td>-</td>";
    }
    std::string note;
    if (s.nonfinite > 0) note = fmt::format("{} non-finite skipped", s.nonfinite);
    if (s.nonpositive > 0) note += fmt::format("{}{} non-positive not shown on log scale", note.empty() ? "" : "; ",
                                               s.nonpositive);
    fmt::format_to(o, "<td class=\"note\">{}</td></tr>\n", note);
  }
  *out += "</table>\n";
  if (def.series.front().metric == kLoss && !run.events.empty()) {
    *out += "<p class=\"markers\">Vertical markers: events (hover for details); "
            "<span class=\"k-rollback\">rollback</span>, <span class=\"k-anomaly\">anomaly</span>, "
            "<span class=\"k-other\">other</span>, <span class=\"k-checkpoint\">checkpoint</span>; "
            "several in one pixel column show the most severe.</p>\n";
  }
  *out += "</section>\n";
}

// ---- page ------------------------------------------------------------------------------------------

constexpr std::string_view kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:920px;
  margin:24px auto;padding:0 12px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:24px 0 6px} h3{font-size:15px;margin:14px 0 4px}
.sub{color:#666;margin:0 0 16px}
table{border-collapse:collapse;margin:4px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
table.legend td,table.legend th{border:none;padding:1px 8px;font-size:13px} .note{color:#a33}
.swatch{display:inline-block;width:14px;height:4px;vertical-align:middle}
svg{max-width:100%;height:auto;font-size:11px;font-family:inherit}
.plot{fill:#fff;stroke:#999} .grid{stroke:#eee} .series{fill:none;stroke-width:1.3;stroke-linejoin:round}
.yt{text-anchor:end;fill:#555} .xt{text-anchor:middle;fill:#555} .xl,.yl{text-anchor:middle;fill:#333;font-size:12px}
.ev{stroke-width:1.5;opacity:.55} .ev-rollback{stroke:#8e44ad} .ev-anomaly{stroke:#e67e22}
.ev-checkpoint{stroke:#89a;stroke-dasharray:4 3} .ev-other{stroke:#3a7}
.markers{font-size:12px;color:#555;margin:2px 0} .markers span{font-weight:600}
.k-rollback{color:#8e44ad} .k-anomaly{color:#e67e22} .k-checkpoint{color:#89a} .k-other{color:#3a7}
.msg{max-width:520px;overflow-wrap:anywhere} .details{color:#666;font-size:12px;overflow-wrap:anywhere}
)";

constexpr size_t kMaxEventRowsPerKind = 200;
constexpr size_t kMaxTextBytes = 300;
constexpr size_t kMaxInfoRows = 400;

double MedianOfLastHalf(const std::vector<double>& col) {
  std::vector<double> v;
  for (size_t i = col.size() / 2; i < col.size(); ++i) {
    if (Plottable(col[i])) v.push_back(col[i]);
  }
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void AppendRow(std::string_view name, std::string_view value_html, std::string* out) {
  *out += "<tr><th>";
  AppendEscaped(name, out);
  *out += "</th><td>";
  *out += value_html;
  *out += "</td></tr>\n";
}

void AppendSummary(const Run& run, std::string* out) {
  *out += "<h2>Summary</h2><table class=\"summary\">\n";
  AppendRow("steps", fmt::format("{} (step {} to {})", run.steps.size(), run.steps.front(), run.steps.back()), out);
  const std::vector<double>& loss = run.values[kLoss];
  for (size_t i = loss.size(); i-- > 0;) {
    if (Plottable(loss[i])) {
      AppendRow("final loss", fmt::format("{} (step {})", FormatValue(loss[i]), run.steps[i]), out);
      break;
    }
  }
  const std::vector<double>& val = run.values[kValLoss];
  size_t best = val.size();
  for (size_t i = 0; i < val.size(); ++i) {
    if (Plottable(val[i]) && (best == val.size() || val[i] < val[best])) best = i;
  }
  if (best < val.size()) {
    AppendRow("best val loss", fmt::format("{} (step {})", FormatValue(val[best]), run.steps[best]), out);
  }
  if (const double t = MedianOfLastHalf(run.values[kTokensPerS]); Plottable(t)) {
    AppendRow("tokens/s (median of the last half)", FormatValue(t), out);
  }
  if (const double m = MedianOfLastHalf(run.values[kMfu]); Plottable(m)) {
    AppendRow("MFU (median of the last half)", FormatValue(100 * m) + " %", out);
  }
  if (!run.values[kMs].empty()) {
    double total = 0;
    for (double v : run.values[kMs]) {
      if (Plottable(v)) total += v;
    }
    AppendRow("total time (sum of step ms)", FormatDuration(total), out);
  }
  std::map<std::string, int64_t> kinds;
  for (const Event& e : run.events) ++kinds[e.kind];
  std::string counts;
  for (const auto& [kind, n] : kinds) {
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", Escaped(Cut(kind, 60)), n);
  }
  AppendRow("events", counts.empty() ? "none" : counts, out);
  *out += "</table>\n";

  std::vector<std::string> notes;
  if (run.malformed_lines > 0) notes.push_back(fmt::format("{} malformed lines skipped.", run.malformed_lines));
  if (run.torn_last_line) notes.push_back("The last line was incomplete (torn) and was ignored.");
  if (run.rolled_back > 0) {
    notes.push_back(fmt::format("{} step records of rolled-back branches discarded.", run.rolled_back));
  }
  if (run.replaced > 0) {
    notes.push_back(fmt::format("{} step records replaced by a later record of the same step.", run.replaced));
  }
  if (!notes.empty()) {
    *out += "<ul class=\"notes\">";
    for (const std::string& n : notes) *out += "<li>" + n + "</li>";
    *out += "</ul>\n";
  }
}

std::string JsonText(const json& v) { return v.is_string() ? v.get<std::string>() : CompactJson(v); }

void Flatten(const std::string& prefix, const json& v, std::vector<std::pair<std::string, std::string>>* rows) {
  if (rows->size() > kMaxInfoRows) return;
  if (v.is_object() && !v.empty()) {
    for (const auto& [key, value] : v.items()) Flatten(prefix.empty() ? key : prefix + "." + key, value, rows);
  } else {
    rows->emplace_back(prefix, JsonText(v));
  }
}

void AppendInfoTable(const std::vector<std::pair<std::string, std::string>>& rows, std::string* out) {
  *out += "<table class=\"info\">\n";
  for (size_t i = 0; i < rows.size() && i < kMaxInfoRows; ++i) {
    AppendRow(Cut(rows[i].first, 120), Escaped(Cut(rows[i].second, kMaxTextBytes)), out);
  }
  if (rows.size() > kMaxInfoRows) *out += "<tr><td colspan=\"2\">(more not shown)</td></tr>\n";
  *out += "</table>\n";
}

void AppendRunInfo(const json& info, std::string* out) {
  if (info.is_null()) return;
  *out += "<h2>Run</h2>\n";
  if (!info.is_object()) {
    AppendInfoTable({{"info", JsonText(info)}}, out);
    return;
  }
  std::vector<std::pair<std::string, std::string>> scalars;
  for (const auto& [key, value] : info.items()) {
    if (!value.is_object() || value.empty()) scalars.emplace_back(key, JsonText(value));
  }
  if (!scalars.empty()) AppendInfoTable(scalars, out);
  for (const auto& [key, value] : info.items()) {
    if (!value.is_object() || value.empty()) continue;
    *out += "<h3>";
    AppendEscaped(Cut(key, 120), out);
    *out += "</h3>\n";
    std::vector<std::pair<std::string, std::string>> rows;
    Flatten("", value, &rows);
    AppendInfoTable(rows, out);
  }
}

void AppendEvents(const std::vector<Event>& events, std::string* out) {
  if (events.empty()) return;
  fmt::format_to(std::back_inserter(*out), "<h2>Events ({})</h2>\n", events.size());
  *out += "<table class=\"events\"><tr><th>step</th><th>kind</th><th>message</th><th>details</th></tr>\n";
  std::map<std::string, size_t> listed, omitted;
  for (const Event& e : events) {
    if (listed[e.kind] >= kMaxEventRowsPerKind) {
      ++omitted[e.kind];
      continue;
    }
    ++listed[e.kind];
    fmt::format_to(std::back_inserter(*out), "<tr><td class=\"num\">{}</td><td>",
                   e.step ? fmt::format("{}", *e.step) : "-");
    AppendEscaped(Cut(e.kind, 60), out);
    *out += "</td><td class=\"msg\">";
    AppendEscaped(Cut(e.message, kMaxTextBytes), out);
    *out += "</td><td class=\"details\">";
    AppendEscaped(Cut(e.details, kMaxTextBytes), out);
    *out += "</td></tr>\n";
  }
  *out += "</table>\n";
  for (const auto& [kind, n] : omitted) {
    fmt::format_to(std::back_inserter(*out), "<p>{} more {} events not listed (the first {} are).</p>\n", n,
                   Escaped(Cut(kind, 60)), kMaxEventRowsPerKind);
  }
}

}  // namespace

StatusOr<std::string> RenderReportHtml(std::string_view metrics_jsonl, const ReportOptions& options) {
  TF_ASSIGN_OR_RETURN(Run run, ParseRun(metrics_jsonl));
  for (const ReportEvent& j : options.job_events) run.events.push_back(Event{j.step, j.kind, j.message, j.details, {}});
  std::string out;
  out.reserve(256 << 10);
  out += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>";
  AppendEscaped(options.title, &out);
  out += "</title>\n<style>";
  out += kStyle;
  out += "</style></head>\n<body>\n<h1>";
  AppendEscaped(options.title, &out);
  out += "</h1>\n";
  if (!options.subtitle.empty()) {
    out += "<p class=\"sub\">";
    AppendEscaped(options.subtitle, &out);
    out += "</p>\n";
  }
  AppendSummary(run, &out);
  AppendRunInfo(options.run_info, &out);
  for (const ChartDef& def : Charts()) {
    AppendChart(run, def, options.loss_log_scale && def.series.front().metric == kLoss, &out);
  }
  AppendEvents(run.events, &out);
  out += "<p class=\"sub\">Each line shows at most two points per pixel column (the lowest and the highest), "
         "so spikes stay visible. Records of a step replaced by a later record, and of rolled-back branches, "
         "are not shown.</p>\n</body></html>\n";
  return out;
}

}  // namespace tf::monitor
