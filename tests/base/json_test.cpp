// Tests for base/json.h: the bounded nesting depth (a hostile file must not exhaust the
// stack), duplicate keys at every level, NUL bytes, line/column in syntax errors, comments, and
// the bound on what error messages quote.
#include "base/json.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace tf {
namespace {

std::string Nested(int levels, const std::string& open = "[", const std::string& close = "]") {
  std::string s;
  for (int i = 0; i < levels; ++i) s += open;
  s += "1";
  for (int i = 0; i < levels; ++i) s += close;
  return s;
}

TEST(JsonTest, ParsesOrdinaryJsonWithComments) {
  auto j = ParseJson("{\n  // a comment\n  \"a\": [1, 2], /* another */ \"b\": {\"c\": \"x\"}\n}", "test");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["a"][1], 2);
  EXPECT_EQ((*j)["b"]["c"], "x");
  auto strict = ParseJson("{\"a\": 1 // no\n}", "strict", /*allow_comments=*/false);
  EXPECT_EQ(strict.status().code(), StatusCode::kInvalidArgument);
}

TEST(JsonTest, DepthIsBoundedBeforeParsing) {
  EXPECT_TRUE(ParseJson(Nested(kMaxJsonDepth), "ok").ok());
  for (const auto& [open, close] : std::vector<std::pair<std::string, std::string>>{{"[", "]"}, {"{\"k\":", "}"}}) {
    // 100,000 levels crashed the recursive parser before the bound.
    auto deep = ParseJson(Nested(100000, open, close), "model config 'm.json'");
    ASSERT_EQ(deep.status().code(), StatusCode::kInvalidArgument) << open;
    EXPECT_NE(deep.status().message().find("model config 'm.json'"), std::string::npos);
    EXPECT_NE(deep.status().message().find("nested more than 64 levels"), std::string::npos)
        << deep.status().ToString();
    EXPECT_LT(deep.status().message().size(), 200u);
  }
  // The same in an ignored key, and brackets inside strings and comments do not count.
  auto in_note = ParseJson("{\"_note\": " + Nested(70) + ", \"n\": 1}", "cfg");
  EXPECT_EQ(in_note.status().code(), StatusCode::kInvalidArgument);
  std::string brackets(1000, '[');
  auto in_string = ParseJson("{\"s\": \"" + brackets + "\" /* " + brackets + " */}", "cfg");
  ASSERT_TRUE(in_string.ok()) << in_string.status().ToString();
  EXPECT_EQ((*in_string)["s"].get<std::string>().size(), 1000u);
  auto escaped_quote = ParseJson("{\"s\": \"\\\"" + brackets + "\"}", "cfg");
  EXPECT_TRUE(escaped_quote.ok()) << escaped_quote.status().ToString();
}

TEST(JsonTest, SyntaxErrorsComeBeforeDepthFurtherOn) {
  // Bytes that are not JSON are reported as such, not as too deep, though '[' follow.
  auto garbage = ParseJson("\x93x" + std::string(100, '['), "garbage");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("not valid JSON: line 1, column 1"), std::string::npos)
      << garbage.status().ToString();
  auto late = ParseJson("{\"a\": 1, \"b\": x " + std::string(100, '['), "late");
  EXPECT_NE(late.status().message().find("not valid JSON: line 1, column 15"), std::string::npos)
      << late.status().ToString();
  // A valid start that then goes too deep is reported as too deep.
  auto deep = ParseJson("{\"a\": " + std::string(100, '['), "deep");
  EXPECT_NE(deep.status().message().find("nested more than 64 levels deep (at line 1, column 70)"), std::string::npos)
      << deep.status().ToString();
}

TEST(JsonTest, NumbersBeyondADoubleNameTheirKey) {
  auto j = ParseJson("{\"a\": {\"b\": 1}, \"lr\": 1e400}", "cfg");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(j.status().message().find("cfg: key 'lr': number overflow parsing '1e400' (beyond the range of a double)"),
            std::string::npos)
      << j.status().ToString();
  auto in_array = ParseJson("[{\"a\": 1}, -1e999]", "arr");
  ASSERT_FALSE(in_array.ok());
  EXPECT_EQ(in_array.status().message().find("key"), std::string::npos) << in_array.status().ToString();
}

TEST(JsonTest, DuplicateKeysAreRefusedAtEveryLevel) {
  auto top = ParseJson("{\"n_layer\": 2, \"n_layer\": 12}", "cfg");
  EXPECT_EQ(top.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(top.status().message().find("key 'n_layer' appears more than once"), std::string::npos)
      << top.status().ToString();
  auto nested = ParseJson("{\"a\": {\"x\": 1, \"y\": 2, \"x\": 3}}", "cfg");
  EXPECT_NE(nested.status().message().find("key 'x'"), std::string::npos) << nested.status().ToString();
  auto in_array = ParseJson("[{\"x\": 1}, {\"x\": 2, \"x\": 2}]", "cfg");
  EXPECT_EQ(in_array.status().code(), StatusCode::kInvalidArgument);
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJson("{\"a\": {\"x\": 1}, \"b\": {\"x\": 2}, \"x\": 3}", "cfg").ok());
}

TEST(JsonTest, NulBytesAreRefusedWithTheirPosition) {
  auto r = ParseJson(std::string("{\"a\": 1,\n \0 \"b\": 2}", 20), "header of 'w.safetensors'");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("NUL byte at line 2, column 2"), std::string::npos) << r.status().ToString();
}

TEST(JsonTest, SyntaxErrorsGiveLineAndColumn) {
  auto r = ParseJson("{\n  \"a\": 1,\n  \"b\": tru\n}", "training config 't.json'");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("training config 't.json': not valid JSON: line 3"), std::string::npos)
      << r.status().ToString();
  auto empty = ParseJson("", "cfg");
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
}

TEST(JsonTest, MessagesQuoteBoundedAndEscaped) {
  EXPECT_EQ(QuoteForMessage("short"), "short");
  EXPECT_EQ(QuoteForMessage("a\nb\x01"), "a\\nb\\x01");
  const std::string cut = QuoteForMessage(std::string(10000, 'z'), 20);
  EXPECT_EQ(cut, std::string(20, 'z') + "... (10000 bytes)");
  const std::string big = JsonForMessage(nlohmann::json(std::string(5000, 'q')));
  EXPECT_LT(big.size(), 120u);
  // A duplicate key that is itself huge is quoted cut.
  const std::string key(5000, 'k');
  auto r = ParseJson("{\"" + key + "\": 1, \"" + key + "\": 2}", "cfg");
  EXPECT_LT(r.status().message().size(), 200u) << r.status().message().size();
}

TEST(JsonTest, ReadJsonFileNamesTheFile) {
  const std::string dir = ::testing::TempDir() + "/tf_json_util_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string missing = dir + "/missing.json";
  auto r = ReadJsonFile(missing, "model config");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("model config '" + missing + "' does not exist"), std::string::npos)
      << r.status().ToString();
  auto d = ReadJsonFile(dir, "model config");
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("is a directory"), std::string::npos) << d.status().ToString();
  const std::string bad = dir + "/bad.json";
  std::ofstream(bad) << "{\"a\": }";
  auto b = ReadJsonFile(bad, "model config");
  EXPECT_NE(b.status().message().find("model config '" + bad + "': not valid JSON: line 1"), std::string::npos)
      << b.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tf
