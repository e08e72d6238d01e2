// Tests for monitor/report.h: a synthetic run gets a chart per present metric group and none for
// absent ones, with balanced tags and one polyline per series; the summary's figures; rollback
// (the abandoned branch dropped) and repeated steps (the later record wins); a torn last line
// tolerated; malformed (or deeply nested) lines counted; no step records refused; every input string escaped; a
// 1,000,000-step run under 2 MB with its spike kept; null values skipped.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "monitor/report.h"

namespace tf::monitor {
namespace {

using json = nlohmann::json;

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

// Every element closed in order ("<x/>" closes itself; <!DOCTYPE> and <meta> are void).
testing::AssertionResult TagsBalanced(const std::string& html) {
  std::vector<std::string> open;
  for (size_t pos = html.find('<'); pos != std::string::npos; pos = html.find('<', pos + 1)) {
    const size_t end = html.find('>', pos);
    if (end == std::string::npos) return testing::AssertionFailure() << "unterminated tag at " << pos;
    const std::string tag = html.substr(pos + 1, end - pos - 1);
    if (tag.empty() || tag[0] == '!') continue;
    const bool closing = tag[0] == '/';
    const std::string name = tag.substr(closing ? 1 : 0, tag.find_first_of(" />", closing ? 1 : 0) - (closing ? 1 : 0));
    if (name == "meta") continue;
    if (closing) {
      if (open.empty() || open.back() != name) {
        return testing::AssertionFailure() << "</" << name << "> closes <" << (open.empty() ? "" : open.back()) << ">";
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
  }
  if (!open.empty()) return testing::AssertionFailure() << "<" << open.back() << "> never closed";
  return testing::AssertionSuccess();
}

// The points attributes of every polyline.
std::vector<std::string> Polylines(const std::string& html) {
  std::vector<std::string> out;
  const std::string key = "<polyline class=\"series\"";
  for (size_t pos = html.find(key); pos != std::string::npos; pos = html.find(key, pos + 1)) {
    const size_t begin = html.find("points=\"", pos) + 8;
    out.push_back(html.substr(begin, html.find('"', begin) - begin));
  }
  return out;
}

std::string Render(const std::string& jsonl, const ReportOptions& options = {}) {
  StatusOr<std::string> html = RenderReportHtml(jsonl, options);
  EXPECT_TRUE(html.ok()) << html.status().ToString();
  return html.ok() ? *html : std::string();
}

// 200 steps: loss 10 - 0.01 step, val_loss every 50 steps, lr, grad_norm, ms (100), tokens_per_s
// (1000 in the first half, 3000 in the second, one outlier), data_ms and compute_ms; two events.
std::string SyntheticRun() {
  std::string s;
  const double val[] = {9, 8.5, 8.2, 8.3};
  for (int step = 0; step < 200; ++step) {
    json r = {{"step", step},      {"loss", 10 - 0.01 * step}, {"lr", 6e-4 * std::min(1.0, step / 20.0)},
              {"grad_norm", 1.5},  {"ms", 100.0},              {"tokens_per_s", step < 100 ? 1000 : 3000},
              {"data_ms", 1.0},    {"compute_ms", 95.0}};
    if (step == 150) r["tokens_per_s"] = 1e9;
    if (step % 50 == 0) r["val_loss"] = val[step / 50];
    s += r.dump() + "\n";
    if (step == 100) s += R"({"event":"checkpoint","step":100,"message":"checkpoint step 100 committed"})" "\n";
    if (step == 120) s += R"({"event":"anomaly","step":120,"message":"loss spike"})" "\n";
    if (step == 150) s += R"({"event":"checkpoint","step":150,"message":"checkpoint step 150 committed"})" "\n";
  }
  return s;
}

TEST(ReportTest, ChartsForPresentMetricsOnly) {
  const std::string html = Render(SyntheticRun(), {.title = "tiny", .subtitle = "gpt2-tiny, run 1"});
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  EXPECT_TRUE(TagsBalanced(html));
  for (const char* id : {"loss", "lr", "grad_norm", "throughput", "step_time"}) {
    EXPECT_EQ(Count(html, fmt::format("id=\"chart-{}\"", id)), 1u) << id;
  }
  for (const char* id : {"mfu", "comm_bandwidth", "comm_sent", "comm_time", "memory", "checkpoint"}) {
    EXPECT_EQ(Count(html, fmt::format("id=\"chart-{}\"", id)), 0u) << id;
  }
  EXPECT_EQ(Count(html, "<svg"), 5u);
  EXPECT_EQ(Count(html, "</svg>"), 5u);
  // loss: train + val; lr; grad_norm; tokens/s; step time: step, data, compute.
  const std::vector<std::string> lines = Polylines(html);
  ASSERT_EQ(lines.size(), 8u);
  for (const std::string& points : lines) {
    EXPECT_FALSE(points.empty());
    EXPECT_EQ(points.find_first_not_of("0123456789., "), std::string::npos) << points;
  }
  EXPECT_EQ(Count(html, "class=\"ev "), 3u);  // the events, on the loss chart
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // nothing fetched
}

TEST(ReportTest, Summary) {
  const std::string html = Render(SyntheticRun());
  EXPECT_NE(html.find("<th>steps</th><td>200 (step 0 to 199)</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>final loss</th><td>8.01 (step 199)</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>best val loss</th><td>8.2 (step 100)</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>tokens/s (median of the last half)</th><td>3000</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>total time (sum of step ms)</th><td>20.0 s</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>events</th><td>anomaly 1, checkpoint 2</td>"), std::string::npos);
  EXPECT_EQ(html.find("malformed"), std::string::npos);
  EXPECT_NE(html.find("<h2>Events (3)</h2>"), std::string::npos);
}

// The evaluation before training ("eval" event of step 0, no step record) is the val curve's first
// point.
TEST(ReportTest, EvaluationBeforeTrainingIsTheFirstValPoint) {
  std::string s = R"({"event":"eval","step":0,"val_loss":5.5,"message":"validation loss 5.5000 before training"})" "\n";
  for (int step = 1; step <= 4; ++step) {
    json r = {{"step", step}, {"loss", 5 - 0.5 * step}};
    if (step == 4) r["val_loss"] = 3.5;
    s += r.dump() + "\n";
  }
  const std::string html = Render(s);
  EXPECT_TRUE(TagsBalanced(html));
  EXPECT_NE(html.find("<td>5 (step 0 to 4)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>val</td><td>3.5</td><td>5.5</td><td>3.5 (step 4)</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<td>train</td><td>3</td><td>4.5</td><td>3 (step 4)</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>events</th><td>eval 1</td>"), std::string::npos);
}

// Checkpoint snapshots (a step record's checkpoint_stall_ms) and the supervisor's events are listed.
TEST(ReportTest, CheckpointsAndJobEventsAreListed) {
  std::string s;
  for (int step = 1; step <= 4; ++step) {
    json r = {{"step", step}, {"loss", 5 - 0.5 * step}};
    if (step == 2) r["checkpoint_stall_ms"] = 12.5;
    s += r.dump() + "\n";
  }
  ReportOptions o;
  o.job_events = {{2, "hung", "no progress: rank 1; restart 1", R"({"rescue":{"ok":true}})"},
                  {std::nullopt, "supervisor_restart", "adopted the running job", ""}};
  const std::string html = Render(s, o);
  EXPECT_TRUE(TagsBalanced(html));
  EXPECT_NE(html.find("<th>events</th><td>checkpoint 1, hung 1, supervisor_restart 1</td>"), std::string::npos);
  EXPECT_NE(html.find("snapshot taken: training paused 12.5 ms"), std::string::npos);
  EXPECT_NE(html.find("no progress: rank 1; restart 1"), std::string::npos);
  EXPECT_NE(html.find("&quot;rescue&quot;"), std::string::npos);
  EXPECT_NE(html.find("<h2>Events (3)</h2>"), std::string::npos);
}

TEST(ReportTest, RollbackDropsTheAbandonedBranch) {
  std::string s;
  for (int step = 0; step <= 5; ++step) s += fmt::format(R"({{"step":{},"loss":1}})" "\n", step);
  for (int step = 6; step <= 10; ++step) s += fmt::format(R"({{"step":{},"loss":100}})" "\n", step);
  s += R"({"event":"anomaly","step":10,"message":"loss spike"})" "\n";
  s += R"({"event":"rollback","step":10,"to_step":5,"message":"rolled back to step 5"})" "\n";
  for (int step = 6; step <= 8; ++step) s += fmt::format(R"({{"step":{},"loss":2}})" "\n", step);
  const std::string html = Render(s);
  EXPECT_TRUE(TagsBalanced(html));
  EXPECT_NE(html.find("<td>9 (step 0 to 8)</td>"), std::string::npos);
  EXPECT_NE(html.find(">10</text>"), std::string::npos);  // the step axis reaches the events
  EXPECT_NE(html.find("<td>train</td><td>1</td><td>2</td><td>2 (step 8)</td>"), std::string::npos);
  EXPECT_NE(html.find("5 step records of rolled-back branches discarded."), std::string::npos);
  EXPECT_EQ(html.find("step records replaced"), std::string::npos);
  EXPECT_NE(html.find("class=\"ev ev-rollback\""), std::string::npos);  // anomaly and rollback share a column
  EXPECT_NE(html.find("<td>rollback</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>anomaly</td>"), std::string::npos);  // events of the dropped branch stay listed
}

TEST(ReportTest, LaterRecordOfAStepReplacesTheEarlier) {
  const std::string html = Render(R"({"step":0,"loss":3})" "\n" R"({"step":1,"loss":4})" "\n"
                                  R"({"step":2,"loss":9})" "\n" R"({"step":1,"loss":5})" "\n");
  EXPECT_NE(html.find("<td>3 (step 0 to 2)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>train</td><td>3</td><td>9</td><td>9 (step 2)</td>"), std::string::npos);
  EXPECT_NE(html.find("1 step records replaced by a later record of the same step."), std::string::npos);
  EXPECT_EQ(html.find("<td>4</td>"), std::string::npos);
}

TEST(ReportTest, TornLastLineIgnored) {
  const std::string html = Render(R"({"step":0,"loss":3})" "\n" R"({"step":1,"loss":2})" "\n" R"({"step":2,"lo)");
  EXPECT_NE(html.find("<td>2 (step 0 to 1)</td>"), std::string::npos);
  EXPECT_NE(html.find("The last line was incomplete (torn) and was ignored."), std::string::npos);
  EXPECT_EQ(html.find("malformed"), std::string::npos);
  // A complete last line without its newline is a record.
  EXPECT_NE(Render(R"({"step":0,"loss":3})" "\n" R"({"step":1,"loss":2})").find("<td>2 (step 0 to 1)</td>"),
            std::string::npos);
}

TEST(ReportTest, MalformedLinesSkippedAndCounted) {
  const std::string deep = R"({"event":"x","d":)" + std::string(100000, '[') + std::string(100000, ']') + "}\n";
  const std::string s = deep +
                        "garbage\n"
                        "[1,2]\n"
                        R"({"loss":1})" "\n"
                        R"({"step":-1,"loss":1})" "\n"
                        R"({"step":"3","loss":1})" "\n"
                        R"({"step":4,"loss":"x"})" "\n"
                        R"({"step":5,"loss":1)" "\n"
                        R"({"event":"rollback","step":5})" "\n"
                        "\n   \r\n"
                        R"({"step":6,"loss":1})" "\r\n"
                        R"({"step":7,"loss":1,"unknown_key":[1]})" "\n"
                        R"({"event":"restart","step":7,"ranks":[[0,1],{"a":[2]}]})" "\n";
  const std::string html = Render(s);
  EXPECT_NE(html.find("9 malformed lines skipped."), std::string::npos);
  EXPECT_NE(html.find(R"({&quot;ranks&quot;:[[0,1],{&quot;a&quot;:[2]}]})"), std::string::npos);
  EXPECT_NE(html.find("<td>2 (step 6 to 7)</td>"), std::string::npos);
  EXPECT_EQ(html.find("torn"), std::string::npos);
}

TEST(ReportTest, NoStepRecordsIsAnError) {
  for (const std::string& s : {std::string(), std::string("\n\n  \n"), std::string("garbage\n{\"loss\":1}\n"),
                              std::string(R"({"event":"start","step":0})" "\n"), std::string(R"({"step":1,"lo)")}) {
    const StatusOr<std::string> html = RenderReportHtml(s, {});
    ASSERT_FALSE(html.ok()) << s;
    EXPECT_EQ(html.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(html.status().message().find("no step records"), std::string::npos) << html.status().message();
  }
  const StatusOr<std::string> all_rolled_back = RenderReportHtml(
      R"({"step":3,"loss":1})" "\n" R"({"event":"rollback","step":3,"to_step":2})" "\n", {});
  ASSERT_FALSE(all_rolled_back.ok());
  EXPECT_EQ(all_rolled_back.status().code(), StatusCode::kInvalidArgument);
}

TEST(ReportTest, EscapesEveryInputString) {
  const std::string s = R"({"step":0,"loss":1})" "\n"
                        R"({"event":"anomaly","step":0,"message":"<script>alert(1)</script>","x":"<i>"})" "\n"
                        R"({"event":"<b onclick=\"f()\">","step":0})" "\n";
  ReportOptions options;
  options.title = "run <script>alert(2)</script> & co";
  options.subtitle = "<img src=x onerror=alert(3)>";
  options.run_info = {{"run_id", "<u>id</u>"}, {"train", {{"note", "</table><script>"}, {"<k>", 1}}}};
  const std::string html = Render(s, options);
  EXPECT_TRUE(TagsBalanced(html));
  for (const char* raw : {"<script", "<img", "<b ", "<u>", "<i>", "<k>", "onclick=\""}) {
    EXPECT_EQ(html.find(raw), std::string::npos) << raw;
  }
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("<title>run &lt;script&gt;alert(2)&lt;/script&gt; &amp; co</title>"), std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(3)&gt;"), std::string::npos);
  EXPECT_NE(html.find("<h3>train</h3>"), std::string::npos);
}

TEST(ReportTest, RunInfoTables) {
  ReportOptions options;
  options.run_info = {{"run_id", "r1"}, {"model", {{"n_layer", 12}, {"n_head", 12}}},
                      {"train", {{"lr", 6e-4}, {"schedule", {{"warmup", 100}}}}}};
  const std::string html = Render(R"({"step":0,"loss":1})" "\n", options);
  EXPECT_NE(html.find("<th>run_id</th><td>r1</td>"), std::string::npos);
  EXPECT_NE(html.find("<h3>model</h3>"), std::string::npos);
  EXPECT_NE(html.find("<th>n_layer</th><td>12</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>schedule.warmup</th><td>100</td>"), std::string::npos);
}

TEST(ReportTest, NullValuesSkipped) {
  std::string s;
  for (int step = 0; step < 10; ++step) {
    if (step == 3 || step == 7) s += fmt::format(R"({{"step":{},"loss":null,"mfu":null}})" "\n", step);
    else s += fmt::format(R"({{"step":{},"loss":{},"mfu":null}})" "\n", step, 5 - 0.1 * step);
  }
  const std::string html = Render(s);
  EXPECT_TRUE(TagsBalanced(html));
  EXPECT_EQ(html.find("malformed"), std::string::npos);
  EXPECT_NE(html.find("2 non-finite skipped"), std::string::npos);
  EXPECT_EQ(html.find("id=\"chart-mfu\""), std::string::npos);  // only nulls: no chart
  const std::vector<std::string> lines = Polylines(html);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(Count(lines[0], ","), 8u);  // 8 finite points
  EXPECT_EQ(lines[0].find_first_not_of("0123456789., "), std::string::npos);
  EXPECT_NE(html.find("final loss</th><td>4.1 (step 9)"), std::string::npos);
}

TEST(ReportTest, LogScaleLoss) {
  std::string s;
  for (int step = 0; step < 100; ++step) s += fmt::format(R"({{"step":{},"loss":{}}})" "\n", step, 11.0 / (1 + step));
  s += R"({"step":100,"loss":0})" "\n";
  ReportOptions options;
  options.loss_log_scale = true;
  const std::string html = Render(s, options);
  EXPECT_TRUE(TagsBalanced(html));
  EXPECT_NE(html.find("(log scale)"), std::string::npos);
  EXPECT_NE(html.find("1 non-positive not shown on log scale"), std::string::npos);
  EXPECT_NE(html.find(">0.2</text>"), std::string::npos);
  EXPECT_NE(html.find(">10</text>"), std::string::npos);
}

TEST(ReportTest, SingleStep) {
  const std::string html = Render(R"({"step":7,"loss":2.5,"lr":0.001})");
  EXPECT_TRUE(TagsBalanced(html));
  for (const std::string& points : Polylines(html)) {
    EXPECT_EQ(points.find_first_not_of("0123456789., "), std::string::npos) << points;
  }
}

TEST(ReportTest, MillionStepsStaySmallAndKeepSpikes) {
  constexpr int kSteps = 1'000'000;
  std::string s;
  s.reserve(size_t{kSteps} * 96);
  for (int step = 0; step < kSteps; ++step) {
    const double loss = step == 500'000 ? 50.0 : 3 + 8.0 / (1 + step / 1000.0) + 0.01 * (step % 7);
    fmt::format_to(std::back_inserter(s), R"({{"step":{},"loss":{:.5f},"lr":0.0006,"ms":120.5,"tokens_per_s":{})",
                   step, loss, 50000 + step % 13);
    if (step % 1000 == 0) fmt::format_to(std::back_inserter(s), R"(,"val_loss":{:.4f})", loss + 0.1);
    s += "}\n";
    if (step % 1000 == 999) fmt::format_to(std::back_inserter(s), R"({{"event":"checkpoint","step":{}}})" "\n", step);
  }
  const std::string html = Render(s);
  EXPECT_LT(html.size(), size_t{2} << 20);
  EXPECT_TRUE(TagsBalanced(html));
  EXPECT_NE(html.find("<td>1000000 (step 0 to 999999)</td>"), std::string::npos);
  EXPECT_NE(html.find("</td><td>50</td><td>"), std::string::npos);  // the spike is the max
  for (const std::string& points : Polylines(html)) EXPECT_LE(Count(points, ","), 2000u);
  EXPECT_NE(html.find("800 more checkpoint events not listed"), std::string::npos);
  EXPECT_NE(html.find("<td>33h 28m 20s</td>"), std::string::npos);  // 1e6 x 120.5 ms
}

}  // namespace
}  // namespace tf::monitor
