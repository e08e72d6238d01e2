// Launch policy: hostfile parsing and its errors, host quarantine over a sliding window with readmission and
// hostfile re-reads, restart backoff with its reset, elastic batch planning (checked against a brute-force
// search of every (world, batch, accumulation) triple), rank placement, and the JSON state round trips.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launch/policy.h"

namespace tf::launch {
namespace {

using nlohmann::json;

std::vector<std::pair<std::string, int>> Pairs(const std::vector<HostEntry>& hosts) {
  std::vector<std::pair<std::string, int>> out;
  for (const HostEntry& h : hosts) out.emplace_back(h.name, h.slots);
  return out;
}
using P = std::vector<std::pair<std::string, int>>;

// ---- Hostfile --------------------------------------------------------------------------------------------

TEST(HostfileTest, ParsesOpenMpiSyntax) {
  const std::string text =
      "# cluster A\n"
      "\n"
      "node-1.example.com slots=4\n"
      "  node_2   slots = 2   max_slots=8   # trailing comment\n"
      "10.0.0.3\tmax-slots=2\r\n"
      "fe80::1 slots=1 max_slots=1\n"
      "   \t  \n"
      "last slots=4096";  // no final newline
  auto hosts = ParseHostfile(text, "hosts.txt");
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  EXPECT_EQ(Pairs(*hosts),
            (P{{"node-1.example.com", 4}, {"node_2", 2}, {"10.0.0.3", 1}, {"fe80::1", 1}, {"last", 4096}}));
}

TEST(HostfileTest, ErrorsNameSourceLineAndProblem) {
  struct Case {
    std::string text;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"a\nno$de slots=2\n", "hosts.txt: line 2: host name 'no$de' has '$' at column 3"},
      {"user@host\n", "line 1: host name 'user@host' has '@'"},
      {"a slots=0\n", "line 1: slots 0 is outside 1..4096"},
      {"a\n\n# c\nb slots=4097\n", "line 4: slots 4097 is outside 1..4096"},
      {"a slots=99999999999999999999999\n", "line 1: slots 99999999999999999999999 is outside 1..4096"},
      {"a slots=-1\n", "line 1: slots '-1' is not a whole number"},
      {"a slots=+2\n", "line 1: slots '+2' is not a whole number"},
      {"a slots=two\n", "line 1: slots 'two' is not a whole number"},
      {"a slots=\n", "line 1: slots needs a value"},
      {"a slots=2 cpus=4\n", "line 1: unknown key 'cpus' (expected slots, max_slots or max-slots)"},
      {"a 4\n", "line 1: expected key=value after the host name, got '4'"},
      {"a slots\n", "line 1: expected key=value after the host name, got 'slots'"},
      {"a =4\n", "line 1: expected key=value after the host name, got '=4'"},
      {"a slots=2 slots=3\n", "line 1: slots given twice"},
      {"a max_slots=2 max-slots=3\n", "line 1: max-slots given twice"},
      {"a slots=4 max_slots=2\n", "line 1: max_slots 2 is less than slots 4"},
      {"a\nb\n# a again\na slots=2\n", "line 4: host 'a' is listed twice (first on line 1)"},
      {"slots=4\n", "line 1: host name 'slots=4' has '='"},
      {std::string(300, 'x') + "\n", "line 1: host name 'xxxx"},
      {"a\x01 slots=1\n", "line 1: host name 'a\\x01' has '\\x01' at column 2"},
      {"a\n-Eoption slots=1\n", "line 2: host name '-Eoption' starts with '-'"},
      {".hidden\n", "line 1: host name '.hidden' starts with '.'"},
      {"", "hosts.txt: no hosts"},
      {"# only comments\n\n   \n", "hosts.txt: no hosts"},
  };
  for (const Case& c : cases) {
    auto r = ParseHostfile(c.text, "hosts.txt");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos)
        << "text: " << c.text << "\nmessage: " << r.status().message() << "\nwanted: " << c.want;
    EXPECT_TRUE(r.status().message().starts_with("hosts.txt: ")) << r.status().message();
  }
  auto long_name = ParseHostfile(std::string(300, 'x'), "h");
  EXPECT_NE(long_name.status().message().find("longer than 255 bytes"), std::string::npos);
  EXPECT_LT(long_name.status().message().size(), 150u) << "the name is cut in the message";
}

TEST(HostfileTest, FormatReadsBackAndCountsSlots) {
  const std::vector<HostEntry> hosts = {{"a", 2}, {"b.x", 1}, {"c:1", 8}};
  EXPECT_EQ(FormatHostfile(hosts), "a slots=2\nb.x slots=1\nc:1 slots=8\n");
  auto back = ParseHostfile(FormatHostfile(hosts), "formatted");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Pairs(*back), Pairs(hosts));
  EXPECT_EQ(TotalSlots(hosts), 11);
  EXPECT_EQ(TotalSlots({}), 0);
}

// ---- HostBook --------------------------------------------------------------------------------------------

HostBook ThreeHosts(QuarantinePolicy p = {.max_failures = 3, .window_s = 100}) {
  HostBook b(p);
  b.SetHosts({{"a", 2}, {"b", 4}, {"c", 1}});
  return b;
}

TEST(HostBookTest, QuarantinesAfterMaxFailuresWithinWindow) {
  HostBook b = ThreeHosts();
  EXPECT_EQ(b.state("b"), HostState::kHealthy);
  EXPECT_FALSE(b.RecordFailure("b", 0, "exit 3"));
  EXPECT_FALSE(b.RecordFailure("b", 50, "exit 3"));
  EXPECT_EQ(b.failures_in_window("b", 50), 2);
  EXPECT_TRUE(b.RecordFailure("b", 99, "NCCL timeout"));  // three within 100 s
  EXPECT_EQ(b.state("b"), HostState::kQuarantined);
  EXPECT_STREQ(HostStateName(b.state("b")), "quarantined");
  EXPECT_EQ(b.last_cause("b"), "NCCL timeout");
  EXPECT_EQ(Pairs(b.Usable()), (P{{"a", 2}, {"c", 1}}));
  EXPECT_EQ(b.Quarantined(), std::vector<std::string>{"b"});
  // Already quarantined: counted, but this failure did not quarantine it.
  EXPECT_FALSE(b.RecordFailure("b", 100, "exit 3"));
  EXPECT_EQ(b.total_failures("b"), 4);
  EXPECT_EQ(b.total_failures("a"), 0);
  EXPECT_EQ(b.state("a"), HostState::kHealthy);
}

TEST(HostBookTest, FailuresExpireFromTheWindow) {
  HostBook b = ThreeHosts();
  EXPECT_FALSE(b.RecordFailure("a", 0, "x"));
  EXPECT_FALSE(b.RecordFailure("a", 10, "x"));
  EXPECT_EQ(b.failures_in_window("a", 99.5), 2);
  EXPECT_EQ(b.failures_in_window("a", 100), 1) << "a failure counts while now - t < window_s";
  EXPECT_EQ(b.failures_in_window("a", 110), 0);
  // The failure at 0 has expired by 100: two in the window, not three.
  EXPECT_FALSE(b.RecordFailure("a", 100, "x"));
  EXPECT_EQ(b.failures_in_window("a", 100), 2);
  EXPECT_EQ(b.state("a"), HostState::kHealthy);
  // Spread-out failures never quarantine, however many.
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(b.RecordFailure("c", 1000 + 60.0 * i, "x")) << i;
  EXPECT_EQ(b.total_failures("c"), 20);
  EXPECT_EQ(b.state("c"), HostState::kHealthy);
  EXPECT_TRUE(b.RecordFailure("a", 105, "x"));  // 10, 100, 105
}

TEST(HostBookTest, OneFailureQuarantinesWhenMaxIsOne) {
  HostBook b = ThreeHosts({.max_failures = 1, .window_s = 10});
  EXPECT_TRUE(b.RecordFailure("c", 5, "x"));
  EXPECT_EQ(b.state("c"), HostState::kQuarantined);
}

TEST(HostBookTest, ReadmitClearsTheWindowAndKeepsTheTotal) {
  HostBook b = ThreeHosts();
  for (double t : {1.0, 2.0, 3.0}) b.RecordFailure("a", t, "x");
  ASSERT_EQ(b.state("a"), HostState::kQuarantined);
  b.Readmit("a", 4);
  EXPECT_EQ(b.state("a"), HostState::kHealthy);
  EXPECT_EQ(b.failures_in_window("a", 4), 0);
  EXPECT_EQ(b.total_failures("a"), 3);
  EXPECT_EQ(Pairs(b.Usable()), (P{{"a", 2}, {"b", 4}, {"c", 1}}));
  EXPECT_TRUE(b.Quarantined().empty());
  // A fresh window: two more failures are not enough, a third is.
  EXPECT_FALSE(b.RecordFailure("a", 5, "x"));
  EXPECT_FALSE(b.RecordFailure("a", 6, "x"));
  EXPECT_TRUE(b.RecordFailure("a", 7, "x"));
  b.Readmit("nobody", 8);  // unknown: no-op
  EXPECT_EQ(b.state("nobody"), HostState::kGone);
}

TEST(HostBookTest, HostsRemovedAndReAddedKeepTheirHistory) {
  HostBook b = ThreeHosts();
  for (double t : {1.0, 2.0, 3.0}) b.RecordFailure("b", t, "x");
  b.RecordFailure("c", 4, "y");
  b.SetHosts({{"c", 2}, {"d", 1}});  // a and b leave, c grows, d arrives
  EXPECT_EQ(b.state("a"), HostState::kGone);
  EXPECT_EQ(b.state("b"), HostState::kGone);
  EXPECT_STREQ(HostStateName(b.state("b")), "gone");
  EXPECT_EQ(b.state("d"), HostState::kHealthy);
  EXPECT_EQ(Pairs(b.Usable()), (P{{"c", 2}, {"d", 1}}));
  EXPECT_TRUE(b.Quarantined().empty()) << "a gone host is not listed as quarantined";
  EXPECT_EQ(b.total_failures("b"), 3);
  EXPECT_EQ(b.failures_in_window("c", 5), 1);
  // A failure reported late for a host that has left is kept for its return.
  b.RecordFailure("a", 5, "late");
  EXPECT_EQ(b.state("a"), HostState::kGone);
  // Back in a new order and with new slots: b still quarantined, a with its failure.
  b.SetHosts({{"b", 8}, {"d", 1}, {"a", 3}, {"c", 2}});
  EXPECT_EQ(b.state("b"), HostState::kQuarantined);
  EXPECT_EQ(b.Quarantined(), std::vector<std::string>{"b"});
  EXPECT_EQ(Pairs(b.Usable()), (P{{"d", 1}, {"a", 3}, {"c", 2}}));
  EXPECT_EQ(b.failures_in_window("a", 6), 1);
  EXPECT_EQ(b.last_cause("a"), "late");
  b.Readmit("b", 10);
  EXPECT_EQ(Pairs(b.Usable()), (P{{"b", 8}, {"d", 1}, {"a", 3}, {"c", 2}}));
}

TEST(HostBookTest, UnknownAndDuplicateHosts) {
  HostBook b({.max_failures = 2, .window_s = 10});
  EXPECT_EQ(b.state("x"), HostState::kGone);
  EXPECT_EQ(b.failures_in_window("x", 0), 0);
  EXPECT_EQ(b.total_failures("x"), 0);
  EXPECT_EQ(b.last_cause("x"), "");
  EXPECT_TRUE(b.Usable().empty());
  // Quarantine reached while never listed takes effect when it is listed.
  EXPECT_FALSE(b.RecordFailure("x", 0, "x"));
  EXPECT_TRUE(b.RecordFailure("x", 1, "x"));
  b.SetHosts({{"y", 1}, {"x", 2}, {"y", 5}});
  EXPECT_EQ(b.state("x"), HostState::kQuarantined);
  EXPECT_EQ(Pairs(b.Usable()), (P{{"y", 5}})) << "listed twice counts once; the last slots win";
}

TEST(HostBookTest, JsonRoundTripResumesTheSameState) {
  const QuarantinePolicy p{.max_failures = 3, .window_s = 100};
  HostBook b = ThreeHosts(p);
  for (double t : {1.5, 2.25, 3.125}) b.RecordFailure("b", t, "exit 3");
  b.RecordFailure("a", 0.1, "signal 9 \"killed\"\n");
  b.RecordFailure("c", 7, "oom");
  b.SetHosts({{"c", 1}, {"a", 2}, {"e", 6}});  // b gone (and quarantined)
  b.RecordFailure("a", 20, "exit 4");

  const std::string text = b.ToJson().dump();
  auto back = HostBook::FromJson(json::parse(text), p);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), b.ToJson());
  EXPECT_EQ(back->ToJson().dump(), text);
  EXPECT_EQ(Pairs(back->Usable()), (P{{"c", 1}, {"a", 2}, {"e", 6}}));
  for (const char* h : {"a", "b", "c", "e", "zz"}) {
    EXPECT_EQ(back->state(h), b.state(h)) << h;
    EXPECT_EQ(back->failures_in_window(h, 50), b.failures_in_window(h, 50)) << h;
    EXPECT_EQ(back->total_failures(h), b.total_failures(h)) << h;
    EXPECT_EQ(back->last_cause(h), b.last_cause(h)) << h;
  }
  // Both go on identically: c's second failure does not quarantine it, a's third (0.1, 20, 30) does.
  EXPECT_FALSE(b.RecordFailure("c", 30, "x"));
  EXPECT_FALSE(back->RecordFailure("c", 30, "x"));
  EXPECT_TRUE(b.RecordFailure("a", 30, "x"));
  EXPECT_TRUE(back->RecordFailure("a", 30, "x"));
  EXPECT_EQ(back->ToJson(), b.ToJson());
  back->SetHosts({{"b", 4}});
  EXPECT_EQ(back->state("b"), HostState::kQuarantined);
  EXPECT_EQ(back->total_failures("b"), 3);
  // An empty book round-trips too.
  auto empty = HostBook::FromJson(HostBook(p).ToJson(), p);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->Usable().empty());
}

TEST(HostBookTest, MalformedJsonIsCorruption) {
  const QuarantinePolicy p;
  HostBook b = ThreeHosts();
  b.RecordFailure("a", 1, "x");
  const json good = b.ToJson();
  ASSERT_TRUE(HostBook::FromJson(good, p).ok());

  struct Case {
    std::string what;
    json j;
    std::string want;
  };
  auto with = [&](auto edit) {
    json j = good;
    edit(j);
    return j;
  };
  const std::vector<Case> cases = {
      {"text that failed to parse", json::parse("{\"hosts\": [", nullptr, false), "not a JSON object"},
      {"array", json::array(), "not a JSON object"},
      {"no version", with([](json& j) { j.erase("version"); }), "lacks 'version'"},
      {"future version", with([](json& j) { j["version"] = 2; }), "'version' = 2 is outside 1..1"},
      {"unknown key", with([](json& j) { j["extra"] = 1; }), "unexpected key 'extra'"},
      {"hosts not array", with([](json& j) { j["hosts"] = json::object(); }), "'hosts' is not an array"},
      {"host not object", with([](json& j) { j["hosts"][1] = "b"; }), "hosts[1]: not a JSON object"},
      {"no name", with([](json& j) { j["hosts"][0].erase("name"); }), "hosts[0]: lacks 'name'"},
      {"name not string", with([](json& j) { j["hosts"][0]["name"] = 5; }), "'name' is not a string"},
      {"bad name", with([](json& j) { j["hosts"][2]["name"] = "c d"; }), "hosts[2]: host name 'c d' has ' '"},
      {"duplicate", with([](json& j) { j["hosts"][2]["name"] = "a"; }), "host 'a' appears twice"},
      {"slots zero", with([](json& j) { j["hosts"][0]["slots"] = 0; }), "'slots' = 0 is outside 1..4096"},
      {"slots float", with([](json& j) { j["hosts"][0]["slots"] = 2.5; }), "'slots' is not an integer"},
      {"slots huge", with([](json& j) { j["hosts"][0]["slots"] = UINT64_MAX; }), "'slots' = 18446744073709551615"},
      {"listed string", with([](json& j) { j["hosts"][0]["listed"] = "yes"; }), "'listed' is not true or false"},
      {"quarantined int", with([](json& j) { j["hosts"][0]["quarantined"] = 1; }), "'quarantined' is not true"},
      {"failures object", with([](json& j) { j["hosts"][0]["failures"] = json::object(); }),
       "'failures' is not an array"},
      {"failure string", with([](json& j) { j["hosts"][0]["failures"] = {"1"}; }), "\"1\" is not a finite time"},
      {"failure NaN", with([](json& j) { j["hosts"][0]["failures"] = {NAN}; }), "is not a finite time"},
      {"total below window", with([](json& j) { j["hosts"][0]["total_failures"] = 0; }),
       "'total_failures' = 0 is outside 1.."},
      {"total negative", with([](json& j) { j["hosts"][1]["total_failures"] = -1; }), "outside 0.."},
      {"cause not string", with([](json& j) { j["hosts"][0]["last_cause"] = nullptr; }),
       "'last_cause' is not a string"},
  };
  for (const Case& c : cases) {
    auto r = HostBook::FromJson(c.j, p);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << c.what;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos)
        << c.what << ": " << r.status().message() << "\nwanted: " << c.want;
    EXPECT_TRUE(r.status().message().starts_with("host book state")) << r.status().message();
  }
}

// ---- RestartBackoff --------------------------------------------------------------------------------------

TEST(RestartBackoffTest, ExponentialSequenceCappedAtMax) {
  RestartBackoff b(BackoffPolicy{});  // 0, then 1, 2, 4, ... capped at 60
  const std::vector<double> want = {0, 1, 2, 4, 8, 16, 32, 60, 60, 60};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(b.NextDelay(10.0 * i), want[i]) << "failure " << i + 1;
    EXPECT_EQ(b.consecutive(), static_cast<int>(i + 1));
  }
  for (int i = 0; i < 5000; ++i) b.NextDelay(200);
  EXPECT_EQ(b.NextDelay(200), 60) << "no overflow after many failures";
}

TEST(RestartBackoffTest, OtherPolicies) {
  RestartBackoff constant({.first_s = 5, .base_s = 3, .factor = 1, .max_s = 100, .reset_after_s = 10});
  EXPECT_EQ(constant.NextDelay(0), 5);
  EXPECT_EQ(constant.NextDelay(1), 3);
  EXPECT_EQ(constant.NextDelay(2), 3);
  RestartBackoff capped({.first_s = 90, .base_s = 0.5, .factor = 3, .max_s = 10, .reset_after_s = 10});
  EXPECT_EQ(capped.NextDelay(0), 10) << "first_s is capped too";
  EXPECT_EQ(capped.NextDelay(0), 0.5);
  EXPECT_EQ(capped.NextDelay(0), 1.5);
  EXPECT_EQ(capped.NextDelay(0), 4.5);
  EXPECT_EQ(capped.NextDelay(0), 10);
  RestartBackoff zero({.first_s = 0, .base_s = 0, .factor = 2, .max_s = 60, .reset_after_s = 10});
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(zero.NextDelay(0), 0) << i;
}

TEST(RestartBackoffTest, AHealthyRunResetsTheSequence) {
  RestartBackoff b({.first_s = 0, .base_s = 1, .factor = 2, .max_s = 60, .reset_after_s = 300});
  b.Started(0);
  EXPECT_EQ(b.NextDelay(10), 0);
  b.Started(10);
  EXPECT_EQ(b.NextDelay(20), 1);
  b.Started(21);
  EXPECT_EQ(b.NextDelay(320.9), 2) << "299.9 s of running is not enough";
  b.Started(323);
  EXPECT_EQ(b.NextDelay(623), 0) << "300 s of running resets";
  EXPECT_EQ(b.consecutive(), 1);
  b.Started(623);
  EXPECT_EQ(b.NextDelay(630), 1);
}

TEST(RestartBackoffTest, NoResetWithoutANewStart) {
  RestartBackoff b({.first_s = 0, .base_s = 1, .factor = 2, .max_s = 60, .reset_after_s = 300});
  EXPECT_EQ(b.NextDelay(0), 0) << "no start recorded yet";
  EXPECT_EQ(b.NextDelay(1000), 1) << "no start, no reset, however long";
  b.Started(1000);
  EXPECT_EQ(b.NextDelay(2000), 0);
  // The restart never launched (no Started): the next failure continues the sequence.
  EXPECT_EQ(b.NextDelay(3000), 1);
  EXPECT_EQ(b.NextDelay(4000), 2);
}

TEST(RestartBackoffTest, JsonRoundTripAndCorruption) {
  const BackoffPolicy p;
  RestartBackoff b(p);
  b.NextDelay(0);
  b.NextDelay(1);
  b.Started(2.5);
  auto back = RestartBackoff::FromJson(json::parse(b.ToJson().dump()), p);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), b.ToJson());
  EXPECT_EQ(back->consecutive(), 2);
  EXPECT_EQ(back->NextDelay(10), b.NextDelay(10));
  EXPECT_EQ(back->NextDelay(400), b.NextDelay(400));  // no start in between: 4 in both
  back->Started(500);
  b.Started(500);
  EXPECT_EQ(back->NextDelay(900), 0);  // the restored start resets in both
  EXPECT_EQ(b.NextDelay(900), 0);
  auto fresh = RestartBackoff::FromJson(RestartBackoff(p).ToJson(), p);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->consecutive(), 0);

  const json good = b.ToJson();
  auto with = [&](auto edit) {
    json j = good;
    edit(j);
    return j;
  };
  const std::vector<std::pair<json, std::string>> bad = {
      {json::parse("[1,", nullptr, false), "not a JSON object"},
      {json(3), "not a JSON object"},
      {with([](json& j) { j.erase("consecutive"); }), "lacks 'consecutive'"},
      {with([](json& j) { j["consecutive"] = -1; }), "'consecutive' = -1 is outside 0.."},
      {with([](json& j) { j["consecutive"] = "2"; }), "'consecutive' is not an integer"},
      {with([](json& j) { j["started"] = "now"; }), "started: \"now\" is not a finite time"},
      {with([](json& j) { j["version"] = 0; }), "'version' = 0"},
      {with([](json& j) { j["x"] = 0; }), "unexpected key 'x'"},
  };
  for (const auto& [j, want] : bad) {
    auto r = RestartBackoff::FromJson(j, p);
    ASSERT_FALSE(r.ok()) << j;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << j;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message() << "\nwanted: " << want;
  }
}

// ---- PlanBatch and AssignRanks ---------------------------------------------------------------------------

std::tuple<int, int, int, int64_t, bool> Shape(const BatchPlan& p) {
  return {p.world, p.batch_size, p.grad_accum_steps, p.global_rows, p.exact};
}

BatchPlan Plan(int64_t global, int max_b, int min_r, int max_r, int slots) {
  auto r = PlanBatch(global, max_b, min_r, max_r, slots);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : BatchPlan{};
}

TEST(PlanBatchTest, LosingARankKeepsTheGlobalBatchThroughAccumulation) {
  // The job: 2 ranks x 4 rows x 1 = 8 rows. One host fails; one slot is left.
  EXPECT_EQ(Shape(Plan(8, 4, 1, 2, 2)), std::make_tuple(2, 4, 1, int64_t{8}, true));
  const BatchPlan one = Plan(8, 4, 1, 2, 1);
  EXPECT_EQ(Shape(one), std::make_tuple(1, 4, 2, int64_t{8}, true));
  EXPECT_EQ(one.note, "global batch 8 rows: 1 rank x 4 x 2");
}

TEST(PlanBatchTest, PrefersFewerRanksThatKeepTheBatchExact) {
  const BatchPlan p = Plan(8, 4, 1, 8, 3);
  EXPECT_EQ(Shape(p), std::make_tuple(2, 4, 1, int64_t{8}, true));
  EXPECT_EQ(p.note, "global batch 8 rows: 2 ranks x 4 x 1 (not 3 ranks: no larger world divides 8 rows)");
  // max_ranks bounds the world even with more slots.
  EXPECT_EQ(Shape(Plan(8, 4, 1, 4, 16)), std::make_tuple(4, 2, 1, int64_t{8}, true));
  EXPECT_EQ(Shape(Plan(12, 8, 1, 100, 5)), std::make_tuple(4, 3, 1, int64_t{12}, true));
}

TEST(PlanBatchTest, PrimeGlobalBatches) {
  // Only 1 rank divides 7: exact on one rank.
  EXPECT_EQ(Shape(Plan(7, 8, 1, 4, 4)), std::make_tuple(1, 7, 1, int64_t{7}, true));
  // 13 rows with at most 4 per micro-batch: 13 micro-batches of 1.
  EXPECT_EQ(Shape(Plan(13, 4, 1, 4, 4)), std::make_tuple(1, 1, 13, int64_t{13}, true));
  // min_ranks forbids falling back to 1: 4 ranks, and 8 rows is the closest to 7.
  const BatchPlan p = Plan(7, 8, 2, 4, 4);
  EXPECT_EQ(Shape(p), std::make_tuple(4, 2, 1, int64_t{8}, false));
  EXPECT_EQ(p.note, "global batch 7 -> 8 rows: 4 ranks x 2 x 1");
  // A prime world equal to the batch is exact.
  EXPECT_EQ(Shape(Plan(7, 8, 2, 7, 7)), std::make_tuple(7, 1, 1, int64_t{7}, true));
}

TEST(PlanBatchTest, MaxBatchSizeLimitsTheMicroBatch) {
  EXPECT_EQ(Shape(Plan(64, 8, 1, 2, 2)), std::make_tuple(2, 8, 4, int64_t{64}, true));
  EXPECT_EQ(Shape(Plan(24, 5, 1, 1, 1)), std::make_tuple(1, 4, 6, int64_t{24}, true));  // 5 does not divide 24
  EXPECT_EQ(Shape(Plan(24, 1, 1, 3, 3)), std::make_tuple(3, 1, 8, int64_t{24}, true));
  EXPECT_EQ(Shape(Plan(6, 100, 1, 1, 1)), std::make_tuple(1, 6, 1, int64_t{6}, true));
}

TEST(PlanBatchTest, InexactPlansTakeTheClosestGlobalBatch) {
  // 24 rows over exactly 5 ranks: 25 (5 x 1 x 5) is closer than 20 (5 x 4 x 1); max 4 rows per micro-batch.
  const BatchPlan p = Plan(24, 4, 5, 5, 5);
  EXPECT_EQ(Shape(p), std::make_tuple(5, 1, 5, int64_t{25}, false));
  EXPECT_EQ(p.note, "global batch 24 -> 25 rows: 5 ranks x 1 x 5");
  EXPECT_EQ(Shape(Plan(22, 4, 5, 5, 5)), std::make_tuple(5, 4, 1, int64_t{20}, false));
  // 10 rows over 4 ranks: 8 and 12 are equally far; the smaller wins.
  EXPECT_EQ(Shape(Plan(10, 8, 4, 4, 4)), std::make_tuple(4, 2, 1, int64_t{8}, false));
  // Fewer rows than ranks: one row each.
  const BatchPlan tiny = Plan(3, 8, 4, 6, 6);
  EXPECT_EQ(Shape(tiny), std::make_tuple(6, 1, 1, int64_t{6}, false));
  EXPECT_EQ(tiny.note, "global batch 3 -> 6 rows: 6 ranks x 1 x 1");
}

// ZeRO replica groups: a world must be a multiple of shard_group_size (2 here).
TEST(PlanBatchTest, WorldsAreMultiplesOfTheShardGroupSize) {
  auto p = PlanBatch(24, 8, 1, 8, 7, 2);  // 7 healthy slots: 6 ranks, not 7
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->world, 6);
  EXPECT_TRUE(p->exact);
  EXPECT_EQ(p->batch_size * p->grad_accum_steps * p->world, 24);
  p = PlanBatch(24, 8, 1, 8, 5, 4);  // 4 ranks divide 24
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->world, 4);
  auto none = PlanBatch(24, 8, 1, 8, 3, 4);  // 3 slots: no multiple of 4
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(none.status().message(), "no multiple of shard_group_size 4 in [1, 3] ranks (3 usable slots)");
  EXPECT_EQ(PlanBatch(24, 8, 1, 8, 8, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(PlanBatchTest, Errors) {
  auto few = PlanBatch(8, 4, 3, 8, 2);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(few.status().message(), "2 usable slots, fewer than min_ranks 3");
  EXPECT_EQ(PlanBatch(8, 4, 1, 8, 0).status().message(), "0 usable slots, fewer than min_ranks 1");
  for (auto [g, b, lo, hi, s] : std::vector<std::tuple<int64_t, int, int, int, int>>{
           {0, 4, 1, 2, 2}, {-8, 4, 1, 2, 2}, {int64_t{1} << 31, 4, 1, 2, 2}, {8, 0, 1, 2, 2},
           {8, 4, 0, 2, 2}, {8, 4, 3, 2, 2}, {8, 4, 1, 2, -1}}) {
    auto r = PlanBatch(g, b, lo, hi, s);
    ASSERT_FALSE(r.ok()) << g << " " << b << " " << lo << " " << hi << " " << s;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
  EXPECT_TRUE(PlanBatch(INT32_MAX, 1 << 20, 1, 4096, 4096).ok());
}

// The rule written as a search over every (w, b, a), sharing nothing with PlanBatch.
BatchPlan BruteForce(int64_t g, int max_b, int min_r, int max_r, int slots) {
  const int top = std::min(max_r, slots);
  for (int w = top; w >= min_r; --w) {
    for (int b = max_b; b >= 1; --b) {
      for (int64_t a = 1; w * b * a <= g; ++a) {
        if (w * b * a == g) return {w, b, static_cast<int>(a), g, true, ""};
      }
    }
  }
  BatchPlan best;
  int64_t best_dist = INT64_MAX;
  for (int b = max_b; b >= 1; --b) {
    for (int64_t a = 1; a <= g + 1; ++a) {
      const int64_t rows = int64_t{top} * b * a, dist = rows > g ? rows - g : g - rows;
      const bool better = dist < best_dist || (dist == best_dist && rows < best.global_rows) ||
                          (dist == best_dist && rows == best.global_rows && b > best.batch_size);
      if (better) best = {top, b, static_cast<int>(a), rows, false, ""}, best_dist = dist;
    }
  }
  return best;
}

TEST(PlanBatchTest, MatchesABruteForceSearchOfTheRule) {
  int checked = 0;
  for (int64_t g = 1; g <= 40; ++g) {
    for (int max_b = 1; max_b <= 9; ++max_b) {
      for (int min_r = 1; min_r <= 4; ++min_r) {
        for (int max_r = min_r; max_r <= 7; ++max_r) {
          for (int slots = min_r; slots <= 8; ++slots) {
            const BatchPlan want = BruteForce(g, max_b, min_r, max_r, slots);
            auto got = PlanBatch(g, max_b, min_r, max_r, slots);
            ASSERT_TRUE(got.ok()) << got.status().ToString();
            ASSERT_EQ(Shape(*got), Shape(want)) << "g=" << g << " max_b=" << max_b << " min=" << min_r
                                                << " max=" << max_r << " slots=" << slots;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 30000);
}

TEST(AssignRanksTest, FillsHostsInOrderUpToTheirSlots) {
  const std::vector<HostEntry> usable = {{"a", 2}, {"b", 4}, {"c", 1}};
  EXPECT_EQ(Pairs(AssignRanks(usable, 5)), (P{{"a", 2}, {"b", 3}}));
  EXPECT_EQ(Pairs(AssignRanks(usable, 1)), (P{{"a", 1}}));
  EXPECT_EQ(Pairs(AssignRanks(usable, 7)), (P{{"a", 2}, {"b", 4}, {"c", 1}}));
  EXPECT_EQ(Pairs(AssignRanks(usable, 9)), (P{{"a", 2}, {"b", 4}, {"c", 1}})) << "all there is";
  EXPECT_TRUE(AssignRanks(usable, 0).empty());
  EXPECT_TRUE(AssignRanks({}, 3).empty());
}

TEST(LaunchPolicyTest, AFailedHostShrinksTheJobAndItsHostfile) {
  auto hosts = ParseHostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n", "hosts");
  ASSERT_TRUE(hosts.ok());
  HostBook book({.max_failures = 1, .window_s = 600});
  book.SetHosts(*hosts);
  // 6 ranks x 4 x 1 = 24 rows; n2 fails and is quarantined: 4 slots remain, and 4 ranks divide 24.
  EXPECT_TRUE(book.RecordFailure("n2", 100, "exit 3"));
  const BatchPlan plan = Plan(24, 4, 1, 6, TotalSlots(book.Usable()));
  EXPECT_EQ(Shape(plan), std::make_tuple(4, 3, 2, int64_t{24}, true));
  const std::vector<HostEntry> placed = AssignRanks(book.Usable(), plan.world);
  EXPECT_EQ(FormatHostfile(placed), "n1 slots=2\nn3 slots=2\n");
  book.Readmit("n2", 200);
  EXPECT_EQ(Shape(Plan(24, 4, 1, 6, TotalSlots(book.Usable()))), std::make_tuple(6, 4, 1, int64_t{24}, true));
}

}  // namespace
}  // namespace tf::launch
