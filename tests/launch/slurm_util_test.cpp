// Slurm helpers: node-list expansion and its errors, compression checked by a property test against a
// reference grouping written here, SLURM_TASKS_PER_NODE, --time parsing with a format/parse round trip, shell
// quoting checked by running /bin/sh on the quoted words, and job names.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "launch/slurm_util.h"

namespace tf::slurm {
namespace {

using Names = std::vector<std::string>;

struct ErrorCase {
  std::string text;
  std::string want;  // a substring of the message
};

// ---- ExpandNodeList --------------------------------------------------------------------------------------

TEST(ExpandNodeListTest, ExpandsRangesListsAndSeveralBrackets) {
  auto names = ExpandNodeList("node[01-03,7],gpu-a1,rack[1-2]-n[1-2]");
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(*names, (Names{"node01", "node02", "node03", "node7", "gpu-a1", "rack1-n1", "rack1-n2", "rack2-n1",
                           "rack2-n2"}));
}

TEST(ExpandNodeListTest, PadsToTheWidthOfTheLowerBound) {
  struct Case {
    std::string list;
    Names want;
  };
  const std::vector<Case> cases = {
      {"n[08-10]", {"n08", "n09", "n10"}},
      {"n[8-10]", {"n8", "n9", "n10"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"n[0-1]", {"n0", "n1"}},
      {"n[007]", {"n007"}},
      {"n[00-01,5,010-011]", {"n00", "n01", "n5", "n010", "n011"}},
      {"n[9-010]", {"n9", "n10"}},
  };
  for (const Case& c : cases) {
    auto names = ExpandNodeList(c.list);
    ASSERT_TRUE(names.ok()) << c.list << ": " << names.status().ToString();
    EXPECT_EQ(*names, c.want) << c.list;
  }
}

TEST(ExpandNodeListTest, EdgeCases) {
  struct Case {
    std::string list;
    Names want;
  };
  const std::vector<Case> cases = {
      {"single", {"single"}},
      {"  a ,\tb[1-2] \n, c ", {"a", "b1", "b2", "c"}},  // whitespace around names trimmed
      {"a,a,n[1,1]", {"a", "a", "n1", "n1"}},             // duplicates kept
      {"[1-3]", {"1", "2", "3"}},                         // no prefix
      {"n[1-2]x", {"n1x", "n2x"}},                        // text after the bracket
      {"n[3,1,2]", {"n3", "n1", "n2"}},                   // order as written
      {"a[1-2]b[3]c[5-6]", {"a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6"}},
      {"n[5-5]", {"n5"}},
      {"host.example.com,10.0.0.1", {"host.example.com", "10.0.0.1"}},
      {"n[999999999999999998-999999999999999999]", {"n999999999999999998", "n999999999999999999"}},
  };
  for (const Case& c : cases) {
    auto names = ExpandNodeList(c.list);
    ASSERT_TRUE(names.ok()) << c.list << ": " << names.status().ToString();
    EXPECT_EQ(*names, c.want) << c.list;
  }
}

TEST(ExpandNodeListTest, AllowsExactlyMaxNodesNames) {
  for (const std::string list : {"n[1-65536]", "a[1-256]b[1-256]", "n[1-65535],x", "n[0-32767],m[0-32767]"}) {
    auto names = ExpandNodeList(list);
    ASSERT_TRUE(names.ok()) << list << ": " << names.status().ToString();
    EXPECT_EQ(static_cast<int64_t>(names->size()), kMaxNodes) << list;
  }
  auto names = ExpandNodeList("n[00001-65536]");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->front(), "n00001");
  EXPECT_EQ(names->back(), "n65536");
}

TEST(ExpandNodeListTest, ErrorsQuoteTheTextAndSayWhatIsWrong) {
  const std::vector<ErrorCase> cases = {
      {"", "node list '' is empty"},
      {" \t ", "is empty"},
      {"a,,b", "node list 'a,,b': empty name at column 3"},
      {"a,", "node list 'a,': empty name at column 3"},
      {",a", "node list ',a': empty name at column 1"},
      {"a, ,b", "empty name at column 3"},
      {"a b", "node list 'a b': name 'a b' contains whitespace"},
      {"n[1-2", "node list 'n[1-2': '[' at column 2 is never closed"},
      {"n[1-2],m[3", "'[' at column 9 is never closed"},
      {"n1-2]", "node list 'n1-2]': ']' at column 5 has no '['"},
      {"n[1]]", "']' at column 5 has no '['"},
      {"n[[1]]", "'[' at column 3 is inside the '[' at column 2"},
      {"n[1[2]]", "'[' at column 4 is inside the '[' at column 2"},
      {"n[]", "node list 'n[]': 'n[]' has empty brackets"},
      {"n[1,,2]", "in 'n[1,,2]', '' is not a number or a range lo-hi of digits"},
      {"n[1,]", "in 'n[1,]', '' is not a number"},
      {"n[5-3]", "node list 'n[5-3]': in 'n[5-3]', range '5-3' ends below its start"},
      {"n[10-9]", "range '10-9' ends below its start"},
      {"n[a-3]", "in 'n[a-3]', 'a-3' is not a number or a range lo-hi of digits"},
      {"n[1-b]", "'1-b' is not a number"},
      {"n[1 -3]", "'1 -3' is not a number"},
      {"n[-3]", "'-3' is not a number"},
      {"n[1-]", "'1-' is not a number"},
      {"n[1-2-3]", "'1-2-3' is not a number"},
      {"n[+1]", "'+1' is not a number"},
      {"n[0x1]", "'0x1' is not a number"},
      {"n[1234567890123456789]", "'1234567890123456789' has a number of more than 18 digits"},
      {"n[1-65537]", "node list 'n[1-65537]' expands to more than 65536 names"},
      {"n[1-65536],x", "expands to more than 65536 names"},
      {"a[1-256]b[1-257]", "expands to more than 65536 names"},
      {"n[0-999999999999999999]", "expands to more than 65536 names"},
      {"a[0-99999][0-99999][0-99999][0-99999]", "expands to more than 65536 names"},
      {"n[1-40000],m[1-40000]", "expands to more than 65536 names"},
  };
  for (const ErrorCase& c : cases) {
    auto names = ExpandNodeList(c.text);
    ASSERT_FALSE(names.ok()) << "'" << c.text << "' expanded";
    EXPECT_EQ(names.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(names.status().message().find(c.want), std::string::npos)
        << c.text << ": " << names.status().message();
  }
}

TEST(ExpandNodeListTest, LongTextIsCutInMessages) {
  const std::string list = std::string(500, 'a') + ",,b";
  auto names = ExpandNodeList(list);
  ASSERT_FALSE(names.ok());
  EXPECT_LT(names.status().message().size(), 200u) << names.status().message();
  EXPECT_NE(names.status().message().find("empty name at column 502"), std::string::npos);
}

// ---- CompressNodeList ------------------------------------------------------------------------------------

TEST(CompressNodeListTest, Examples) {
  struct Case {
    Names names;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{}, ""},
      {{"node1", "node2", "node4"}, "node[1-2,4]"},
      {{"node1"}, "node1"},
      {{"node1", "node1", "node1"}, "node1"},
      {{"gpu"}, "gpu"},
      {{"gpu", "gpu", "cpu"}, "gpu,cpu"},
      {{"node4", "node2", "node1", "node3", "node2"}, "node[1-4]"},
      {{"b1", "a1", "b2", "a3"}, "b[1-2],a[1,3]"},
      {{"n8", "n9", "n10", "n11"}, "n[8-11]"},        // plain numbers of any length share a group
      {{"n08", "n09", "n10"}, "n[08-10]"},            // n10 joins the names padded to 2 digits
      {{"n08", "n9", "n10"}, "n[08,10],n9"},          // n9 is not padded to 2 digits
      {{"n10", "n9", "n08"}, "n[08,10],n9"},          // the group of n10 is decided by n08 that follows
      {{"n0", "n00", "n1", "n01"}, "n[0-1],n[00-01]"},
      {{"n7", "n010", "n100", "n8"}, "n[7-8],n[010,100]"},
      {{"n99", "n100", "n0100"}, "n[99-100],n0100"},
      {{"n001", "n002", "n003", "n010", "n011", "n013"}, "n[001-003,010-011,013]"},
      {{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}, "rack1-n[1-2],rack2-n[1-2]"},
      {{"123", "124", "126"}, "[123-124,126]"},
      {{"x1y", "x2y"}, "x1y,x2y"},  // no trailing digits: each its own group
      {{"n0", "n1", "n2"}, "n[0-2]"},
      {{"n1234567890123456789", "n1234567890123456790"}, "n1234567890123456789,n1234567890123456790"},
      {{"n999999999999999998", "n999999999999999999"}, "n[999999999999999998-999999999999999999]"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(CompressNodeList(c.names), c.want) << ::testing::PrintToString(c.names);
  }
}

TEST(CompressNodeListTest, CanonicalListsAreFixedPoints) {
  for (const std::string list :
       {"node[01-03,07],gpu-a1,rack1-n[1-2],rack2-n[1-2]", "a", "n[1-65536]", "n[0-2,4,6-9],m5,[1-2]",
        "n[00001-65536]", "n[08-10]", "n[8-10]", "gpu[1-16],cpu[001-099]"}) {
    auto names = ExpandNodeList(list);
    ASSERT_TRUE(names.ok()) << list << ": " << names.status().ToString();
    EXPECT_EQ(CompressNodeList(*names), list);
  }
}

// The contract, written independently: duplicates removed; names grouped by the text before their trailing
// digits and, where those are zero-padded or share their count with a zero-padded name of that prefix, the
// count; groups in order of first appearance, each sorted by number.
Names ReferenceGrouping(const Names& names) {
  const auto split = [](const std::string& name) {
    const size_t last = name.find_last_not_of("0123456789");
    const size_t digits = name.size() - (last == std::string::npos ? 0 : last + 1);
    return std::make_pair(name.substr(0, name.size() - digits), name.substr(name.size() - digits));
  };
  const auto zero_padded = [](const std::string& digits) { return digits.size() > 1 && digits[0] == '0'; };
  std::map<std::string, std::vector<size_t>> padded_widths;
  for (const std::string& name : names) {
    const auto [prefix, digits] = split(name);
    if (zero_padded(digits)) padded_widths[prefix].push_back(digits.size());
  }
  // Key: (prefix, -1 for no digits, 0 for plain numbers, else the width).
  std::vector<std::pair<std::string, int>> order;
  std::map<std::pair<std::string, int>, std::vector<std::string>> groups;
  for (const std::string& name : names) {
    const auto [prefix, digits] = split(name);
    const std::vector<size_t>& widths = padded_widths[prefix];
    int width = 0;
    if (digits.empty()) width = -1;
    else if (std::count(widths.begin(), widths.end(), digits.size())) width = static_cast<int>(digits.size());
    const auto key = std::make_pair(width == -1 ? name : prefix, width);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(name);
  }
  Names out;
  for (const auto& key : order) {
    std::vector<std::string>& g = groups[key];
    // Numbers without leading zeros, or all of one width: shorter first, then as text, is numeric order.
    std::sort(g.begin(), g.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    g.erase(std::unique(g.begin(), g.end()), g.end());
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

TEST(CompressNodeListTest, PropertyExpandOfCompressIsTheContract) {
  std::mt19937 rng(20240611);
  const std::vector<std::string> prefixes = {"node", "gpu-a", "rack1-n", "", "x.y_", "n"};
  for (int trial = 0; trial < 2000; ++trial) {
    Names names;
    const int n = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int i = 0; i < n; ++i) {
      const std::string& prefix = prefixes[rng() % prefixes.size()];
      // No digits, plain numbers or numbers padded to 2..4 digits; numbers near 0, 9-10 and 99-100 so
      // that runs, gaps, duplicates and numbers growing a digit all occur.
      const int width = std::uniform_int_distribution<int>(prefix.empty() ? 1 : 0, 4)(rng);
      const int base = std::vector<int>{0, 5, 95}[rng() % 3];
      const int v = base + std::uniform_int_distribution<int>(0, 10)(rng);
      std::string name = prefix;
      if (width == 1) name += std::to_string(v);
      else if (width > 1) name += fmt::format("{:0{}}", v, width);
      names.push_back(name);
    }
    const std::string compressed = CompressNodeList(names);
    auto expanded = ExpandNodeList(compressed);
    ASSERT_TRUE(expanded.ok()) << compressed << ": " << expanded.status().ToString();
    ASSERT_EQ(*expanded, ReferenceGrouping(names))
        << "names " << ::testing::PrintToString(names) << " compressed to " << compressed;
    ASSERT_EQ(CompressNodeList(*expanded), compressed);
  }
}

// ---- ParseTasksPerNode -----------------------------------------------------------------------------------

TEST(ParseTasksPerNodeTest, Examples) {
  struct Case {
    std::string text;
    std::vector<int> want;
  };
  const std::vector<Case> cases = {
      {"2(x3),1", {2, 2, 2, 1}},
      {"4", {4}},
      {"1(x1)", {1}},
      {"8(x2),4,2(x2)", {8, 8, 4, 2, 2}},
      {" 2(x2) , 3 \n", {2, 2, 3}},
      {"2147483647", {2147483647}},
      {"007", {7}},
  };
  for (const Case& c : cases) {
    auto counts = ParseTasksPerNode(c.text);
    ASSERT_TRUE(counts.ok()) << c.text << ": " << counts.status().ToString();
    EXPECT_EQ(*counts, c.want) << c.text;
  }
  auto many = ParseTasksPerNode("3(x65536)");
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  EXPECT_EQ(static_cast<int64_t>(many->size()), kMaxNodes);
  EXPECT_EQ(many->back(), 3);
}

TEST(ParseTasksPerNodeTest, Errors) {
  const std::vector<ErrorCase> cases = {
      {"", "tasks per node '' is empty"},
      {"  ", "is empty"},
      {"0", "tasks per node '0': count '0' is outside 1..2147483647"},
      {"2,0(x3)", "count '0' is outside"},
      {"-1", "count '-1' is outside 1..2147483647"},
      {"2147483648", "count '2147483648' is outside"},
      {"99999999999999999999", "count '99999999999999999999' is outside"},
      {"2(x0)", "tasks per node '2(x0)': repeat '0' is outside 1..65536"},
      {"2(x-1)", "repeat '-1' is outside 1..65536"},
      {"2(x65537)", "repeat '65537' is outside 1..65536"},
      {"1(x65536),1", "tasks per node '1(x65536),1' covers more than 65536 nodes"},
      {"1(x40000),1(x40000)", "covers more than 65536 nodes"},
      {"2(x)", "'2(x)' is not N or N(xR) with N, R digits"},
      {"2(3)", "'2(3)' is not N or N(xR)"},
      {"2(x3", "'2(x3' is not N or N(xR)"},
      {"2(x3))", "'2(x3))' is not N or N(xR)"},
      {"2(X3)", "'2(X3)' is not N or N(xR)"},
      {"2 (x3)", "'2 (x3)' is not N or N(xR)"},
      {"(x3)", "'(x3)' is not N or N(xR)"},
      {"2,", "'' is not N or N(xR)"},
      {",2", "'' is not N or N(xR)"},
      {"2,,3", "'' is not N or N(xR)"},
      {"a", "'a' is not N or N(xR)"},
      {"1.5", "'1.5' is not N or N(xR)"},
      {"+2", "'+2' is not N or N(xR)"},
      {"2x3", "'2x3' is not N or N(xR)"},
  };
  for (const ErrorCase& c : cases) {
    auto counts = ParseTasksPerNode(c.text);
    ASSERT_FALSE(counts.ok()) << "'" << c.text << "' parsed";
    EXPECT_EQ(counts.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(counts.status().message().find(c.want), std::string::npos)
        << c.text << ": " << counts.status().message();
  }
}

// ---- ParseSlurmTime / FormatSlurmTime --------------------------------------------------------------------

TEST(SlurmTimeTest, ParsesEveryFormat) {
  struct Case {
    std::string text;
    int64_t want;
  };
  const std::vector<Case> cases = {
      {"0", 0},
      {"5", 300},
      {"90", 5400},                 // MM: the leading field may exceed 59
      {"100:00", 6000},             // MM:SS
      {"1:30", 90},
      {"00:59", 59},
      {"01:02:03", 3723},           // HH:MM:SS
      {"48:00:00", 172800},         // leading hours may exceed 23
      {"1:2:3", 3723},
      {"2-0", 172800},              // D-HH
      {"1-12", 129600},
      {"1-23", 169200},
      {"1-02:30", 86400 + 9000},    // D-HH:MM
      {"1-02:03:04", 93784},        // D-HH:MM:SS
      {"0-00:00:01", 1},
      {"365-23:59:59", 365 * 86400 + 86399},
      {" 30 ", 1800},
      {"UNLIMITED", -1},
      {"unlimited", -1},
      {"Unlimited", -1},
      {"INFINITE", -1},
      {"infinite", -1},
      {"\tInFiNiTe\n", -1},
  };
  for (const Case& c : cases) {
    auto s = ParseSlurmTime(c.text);
    ASSERT_TRUE(s.ok()) << c.text << ": " << s.status().ToString();
    EXPECT_EQ(*s, c.want) << c.text;
  }
}

TEST(SlurmTimeTest, ErrorsNameTheText) {
  const std::vector<ErrorCase> cases = {
      {"", "time '' is empty"},
      {"   ", "is empty"},
      {"-1", "time '-1' is negative"},
      {"-5:00", "time '-5:00' is negative"},
      {"-1-00:00:00", "is negative"},
      {"abc", "time 'abc' is not MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (digits) or UNLIMITED"},
      {"unlimitedd", "time 'unlimitedd' is not MM"},
      {"1:60", "time '1:60': seconds 60 are not below 60"},
      {"1:2:60", "seconds 60 are not below 60"},
      {"1:60:00", "minutes 60 are not below 60"},
      {"1-24", "time '1-24': hours 24 are not below 24"},
      {"1-1:60", "minutes 60 are not below 60"},
      {"1-1:1:60", "seconds 60 are not below 60"},
      {"1:2:3:4", "time '1:2:3:4' is not MM"},
      {"1-2:3:4:5", "is not MM"},
      {"1-", "time '1-' is not MM"},
      {"-", "is negative"},
      {"1--2", "is not MM"},
      {"1-2-3", "is not MM"},
      {":30", "is not MM"},
      {"30:", "is not MM"},
      {"1::2", "is not MM"},
      {"1.5", "is not MM"},
      {"+5", "is not MM"},
      {"1 h", "is not MM"},
      {"1:-1", "is not MM"},
      {"1h", "is not MM"},
      {"1234567890123456789", "time '1234567890123456789': field '1234567890123456789' has more than 18 digits"},
      {"999999999999999999-0", "time '999999999999999999-0' is more than 9223372036854775807 seconds"},
      {"999999999999999999", "is more than 9223372036854775807 seconds"},
      {"106751991167301-00:00:00", "is more than 9223372036854775807 seconds"},
  };
  for (const ErrorCase& c : cases) {
    auto s = ParseSlurmTime(c.text);
    ASSERT_FALSE(s.ok()) << "'" << c.text << "' parsed as " << *s;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(s.status().message().find(c.want), std::string::npos) << c.text << ": " << s.status().message();
  }
}

TEST(SlurmTimeTest, Formats) {
  EXPECT_EQ(FormatSlurmTime(0), "00:00:00");
  EXPECT_EQ(FormatSlurmTime(59), "00:00:59");
  EXPECT_EQ(FormatSlurmTime(3600), "01:00:00");
  EXPECT_EQ(FormatSlurmTime(3723), "01:02:03");
  EXPECT_EQ(FormatSlurmTime(86399), "23:59:59");
  EXPECT_EQ(FormatSlurmTime(86400), "1-00:00:00");
  EXPECT_EQ(FormatSlurmTime(93784), "1-02:03:04");
  EXPECT_EQ(FormatSlurmTime(400 * 86400 + 5), "400-00:00:05");
  EXPECT_EQ(FormatSlurmTime(std::numeric_limits<int64_t>::max()), "106751991167300-15:30:07");
  EXPECT_EQ(FormatSlurmTime(-1), "UNLIMITED");
  EXPECT_EQ(FormatSlurmTime(std::numeric_limits<int64_t>::min()), "UNLIMITED");
}

TEST(SlurmTimeTest, PropertyParseOfFormatIsIdentity) {
  std::vector<int64_t> values = {0, 1, 59, 60, 61, 3599, 3600, 3601, 86399, 86400, 86401, 172799,
                                 std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const int bits = static_cast<int>(rng() % 63);  // log-uniform over [0, 2^63)
    values.push_back(static_cast<int64_t>(rng() >> (64 - 1 - bits)) & std::numeric_limits<int64_t>::max());
  }
  for (int64_t s : values) {
    const std::string text = FormatSlurmTime(s);
    auto back = ParseSlurmTime(text);
    ASSERT_TRUE(back.ok()) << s << " -> " << text << ": " << back.status().ToString();
    ASSERT_EQ(*back, s) << text;
  }
  auto unlimited = ParseSlurmTime(FormatSlurmTime(-5));
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(*unlimited, -1);
}

// ---- ShellQuote ------------------------------------------------------------------------------------------

TEST(ShellQuoteTest, Examples) {
  EXPECT_EQ(ShellQuote("abc"), "abc");
  EXPECT_EQ(ShellQuote("A-Za-z0-9_./:=,@%+-"), "A-Za-z0-9_./:=,@%+-");
  EXPECT_EQ(ShellQuote("--nodelist=node[1-2]"), "'--nodelist=node[1-2]'");
  EXPECT_EQ(ShellQuote("/path/to/x.json"), "/path/to/x.json");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote("'"), "''\\'''");
  EXPECT_EQ(ShellQuote("$HOME"), "'$HOME'");
  for (const std::string word : {"~", "*", "?", "a;b", "a|b", "a&b", "a>b", "(", "#", "!", "\\", "\"", "{a,b}",
                                 "a\tb", "a\nb", "é"}) {
    EXPECT_EQ(ShellQuote(word), "'" + word + "'") << word;
  }
}

// What /bin/sh prints for `printf %s <word>` (popen runs the command with /bin/sh -c).
std::string ShellEcho(const std::string& word) {
  const std::string command = "printf %s " + word;
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return "<popen failed>";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  if (status != 0) out += "<exit status " + std::to_string(status) + ">";
  return out;
}

TEST(ShellQuoteTest, ShellReadsBackTheWord) {
  const std::vector<std::string> nasty = {
      "",
      " ",
      "a b  c",
      "'",
      "''",
      "it's",
      "\"double\"",
      "$HOME",
      "${HOME}",
      "$(echo pwned)",
      "`echo pwned`",
      "\\",
      "back\\slash\\n",
      "line1\nline2\n",
      "\n",
      "tab\there",
      "*",
      "~",
      "~root",
      "a;echo pwned",
      "a|b&c>d<e",
      "#comment",
      "-n",
      "--",
      "%s%d",
      "!",
      "{a,b}",
      "'$x'\"$y\"`z`",
      "ünïcödé",
  };
  for (const std::string& word : nasty) {
    EXPECT_EQ(ShellEcho(ShellQuote(word)), word) << "quoted as " << ShellQuote(word);
  }
}

TEST(ShellQuoteTest, PropertyShellReadsBackRandomBytes) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    std::string word(rng() % 12, ' ');
    for (char& c : word) c = static_cast<char>(1 + rng() % 255);  // any byte but NUL
    ASSERT_EQ(ShellEcho(ShellQuote(word)), word) << "quoted as " << ShellQuote(word);
  }
}

// ---- ValidJobName ----------------------------------------------------------------------------------------

TEST(ValidJobNameTest, Accepts) {
  for (const std::string name : {"a", "train", "gpt2-small_run.3", "A_b-C.d", "0start", "_x", "x.", "x-"}) {
    EXPECT_TRUE(ValidJobName(name)) << name;
  }
  EXPECT_TRUE(ValidJobName(std::string(64, 'a')));
}

TEST(ValidJobNameTest, Rejects) {
  for (const std::string name : {"", "-x", ".x", "a b", "a/b", "a:b", "a$b", "a'b", "é", "a\n", "a\tb", "a,b"}) {
    EXPECT_FALSE(ValidJobName(name)) << name;
  }
  EXPECT_FALSE(ValidJobName(std::string(65, 'a')));
  EXPECT_FALSE(ValidJobName(std::string("a\0b", 3)));
}

// ---- CheckSbatchValue / CheckSbatchOption ----------------------------------------------------------

TEST(CheckSbatchValueTest, AcceptsWhatSlurmTakes) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--partition", "gpu"}, {"--partition", "gpu,debug"}, {"--qos", "high"}, {"--account", "team_a.b-c"},
           {"--constraint", "a100&(ib|roce)"}, {"--constraint", "[rack1*2&rack2*4]"}, {"--mem", "4096"},
           {"--mem", "200G"}, {"--mem", "2t"}, {"--mem", "0"}}) {
    EXPECT_TRUE(CheckSbatchValue(flag, value).ok()) << flag << " " << value;
  }
  for (const std::string o : {"--mail-type=END", "--exclusive", "--gres=gpu:8", "--comment=a,b"}) {
    EXPECT_TRUE(CheckSbatchOption(o).ok()) << o;
  }
}

TEST(CheckSbatchValueTest, RefusesNewlinesSpacesAndOptions) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--partition", "gpu\ntouch /tmp/x"}, {"--partition", "gpu debug"}, {"--partition", ""},
           {"--account", "a --uid=0"}, {"--account", "-Aother"}, {"--account", "a,b"}, {"--qos", "x;y"},
           {"--constraint", "a\n#SBATCH --uid=0"}, {"--constraint", "$(id)"}, {"--mem", "lots"},
           {"--mem", "200GB"}, {"--mem", "G"}, {"--mem", "-1"}, {"--mem", "12\n"}}) {
    const Status s = CheckSbatchValue(flag, value);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << flag << " " << value;
    EXPECT_TRUE(s.message().starts_with(flag)) << s.message();
  }
  for (const std::string o : {"", "X", "-x", "---x", "--", "--a b", "--a\n#SBATCH --b", "--a\tb", "--mail-type=END --uid=0"}) {
    EXPECT_FALSE(CheckSbatchOption(o).ok()) << o;
  }
}

}  // namespace
}  // namespace tf::slurm
