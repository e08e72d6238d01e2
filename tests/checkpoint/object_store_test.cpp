// checkpoint/object_store.h and checkpoint/manifest.h: the POSIX store's keys and atomic puts, the
// manifest's own checksum and validation, and the commit protocol — a checkpoint whose write failed
// or crashed before its manifest does not exist, a damaged object is named with what was expected
// and found, and the newest valid checkpoint is taken with the newer broken ones reported.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/fault_env.h"
#include "checkpoint/manifest.h"
#include "checkpoint/object_store.h"
#include "tests/test_dir.h"

namespace tf::checkpoint {
namespace {

namespace fs = std::filesystem;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenPosixStore(dir_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  static Manifest At(int64_t step) {
    Manifest m;
    m.step = step;
    m.code_version = "test";
    m.world = 2;
    m.state = {{"data_rows", step * 8}, {"model", {{"n_layer", 2}}}};
    return m;
  }
  static std::vector<std::pair<std::string, std::string>> Objects(int64_t step) {
    return {{"params.bin", std::string(1000, static_cast<char>('a' + step % 26))},
            {"adam/m.bin", "moments of step " + std::to_string(step)},
            {"empty.bin", ""}};
  }

  testing_util::TestDir tmp_{"tf_ckpt"};
  std::string dir_ = tmp_.path();
  std::unique_ptr<ObjectStore> store_;
};

TEST_F(CheckpointStoreTest, KeysAreValidated) {
  for (const char* good : {"a", "step-000000000001/MANIFEST.json", "x/y/z.bin", "a_b-c.d"}) {
    EXPECT_TRUE(ValidateKey(good).ok()) << good;
  }
  for (const char* bad : {"", "/abs", "trailing/", "a//b", "../up", "a/./b", "sp ace", "a/b.tmp.1.2", "ü"}) {
    Status s = ValidateKey(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(std::string("'") + bad + "'"), std::string::npos) << s.ToString();
    EXPECT_FALSE(store_->Put(bad, "x").ok()) << bad;
  }
}

TEST_F(CheckpointStoreTest, PosixStorePutGetListDelete) {
  ASSERT_TRUE(store_->Put("b/two", "2").ok());
  ASSERT_TRUE(store_->Put("a/one", "1").ok());
  ASSERT_TRUE(store_->Put("a/deeper/three", "333").ok());
  ASSERT_TRUE(store_->Put("a/one", "uno").ok());  // replaced whole
  EXPECT_EQ(*store_->Get("a/one"), "uno");
  EXPECT_EQ(*store_->List(""), (std::vector<std::string>{"a/deeper/three", "a/one", "b/two"}));
  EXPECT_EQ(*store_->List("a/"), (std::vector<std::string>{"a/deeper/three", "a/one"}));
  EXPECT_EQ(*store_->List("a/d"), (std::vector<std::string>{"a/deeper/three"}));
  EXPECT_TRUE(store_->List("zzz")->empty());
  // An abandoned temporary file of an atomic write is not an object.
  std::ofstream(dir_ + "/b/two.tmp.123.4") << "partial";
  EXPECT_EQ(*store_->List("b"), std::vector<std::string>{"b/two"});
  auto missing = store_->Get("a/none");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("a/none"), std::string::npos);
  EXPECT_TRUE(store_->Delete("a/one").ok());
  EXPECT_TRUE(store_->Delete("a/one").ok());  // already gone
  EXPECT_EQ(*store_->List("a"), std::vector<std::string>{"a/deeper/three"});
  // A root that is a file is refused by name.
  std::ofstream(dir_ + "/file") << "x";
  auto bad = OpenPosixStore(dir_ + "/file");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
}

TEST_F(CheckpointStoreTest, ManifestRoundTripsAndChecksItself) {
  Manifest m = At(100);
  m.created = "2026-12-06T00:00:00Z";
  m.tensors = {{"params", 10, 4}};
  m.objects = {{"step-000000000100/params.bin", 1000, 0x0123456789abcdefull, "", -1, "", ""},
               {"step-000000000100/adam/m.bin", 7, 42, "", -1, "", ""},
               {"step-000000000100/params.000000", 9, 1, "params", 0, "planes", ""},
               {"step-000000000090/params.000001", 9, 2, "params", 1, "raw", ""},
               {"step-000000000100/params.000002", 9, 3, "params", 2, "xor-planes", "step-000000000090/params.000002"}};
  const std::string text = SerializeManifest(m);
  auto back = ParseManifest(text, "M");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step, 100);
  EXPECT_EQ(back->world, 2);
  EXPECT_EQ(back->created, m.created);
  EXPECT_EQ(back->state, m.state);
  EXPECT_EQ(back->objects, m.objects);
  EXPECT_EQ(back->tensors, m.tensors);
  EXPECT_EQ(Dependencies(*back), (std::set<int64_t>{90, 100}));

  // Chunks must cover each tensor exactly once and name declared tensors.
  auto reject = [&](auto edit, const std::string& needle) {
    nlohmann::json j = nlohmann::json::parse(text);
    edit(j);
    j.erase("checksum");
    j["checksum"] = fmt::format("{:016x}", XXH64(j.dump().data(), j.dump().size(), 0));
    auto r = ParseManifest(j.dump(), "M");
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  };
  reject([](nlohmann::json& j) { j["objects"].erase(2); }, "lacks chunk 0 of 3");
  reject([](nlohmann::json& j) { j["objects"][3]["chunk"] = 0; }, "listed twice");
  reject([](nlohmann::json& j) { j["objects"][3]["chunk"] = 3; }, "chunk 3 of tensor 'params', which has 3");
  reject([](nlohmann::json& j) { j["objects"][2]["tensor"] = "adam.v"; }, "'adam.v', which \"tensors\" does not list");
  reject([](nlohmann::json& j) { j["objects"][0]["key"] = "elsewhere/x"; }, "not under a step-... prefix");
  reject([](nlohmann::json& j) { j["objects"][4]["base"] = "../x"; }, "base '../x'");
  reject([](nlohmann::json& j) { j["tensors"][0]["chunk_elements"] = 0; }, "in chunks of 0");

  // A hand edit (here: one digit of the step) breaks the checksum and is named as such.
  std::string edited = text;
  edited.replace(edited.find("\"step\": 100"), 11, "\"step\": 200");
  auto e = ParseManifest(edited, "M");
  EXPECT_EQ(e.status().code(), StatusCode::kCorruption);
  EXPECT_NE(e.status().message().find("checksum"), std::string::npos) << e.status().ToString();
  // Truncated, not JSON, another format or version: Corruption naming the source.
  for (const std::string& bad : {text.substr(0, text.size() / 2), std::string("[1,2]"), std::string("")}) {
    auto r = ParseManifest(bad, "M");
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    EXPECT_EQ(r.status().message().rfind("M: ", 0), 0u) << r.status().ToString();
  }
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"format", "pytorch.dcp"}, {"version", 0}, {"kind", "delta"}, {"step", -1}, {"world", 0}}) {
    nlohmann::json j = nlohmann::json::parse(text);
    j[key] = value;
    j.erase("checksum");
    j["checksum"] = fmt::format("{:016x}", XXH64(j.dump().data(), j.dump().size(), 0));
    auto r = ParseManifest(j.dump(), "M");
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << key;
    EXPECT_NE(r.status().message().find(key == "version" ? "version 0" : value.dump().substr(0, 3)),
              std::string::npos)
        << r.status().ToString();
  }
  // A newer version is not damage: Unimplemented, naming the version it needs.
  nlohmann::json newer = nlohmann::json::parse(text);
  newer["version"] = 99;
  auto r = ParseManifest(newer.dump(), "M");
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(IsNewerFormat(r.status()));
  EXPECT_NE(r.status().message().find("M: checkpoint format version 99 is newer than this build reads (1)"),
            std::string::npos)
      << r.status().ToString();
}

TEST_F(CheckpointStoreTest, WriteListVerify) {
  for (int64_t step : {100, 200}) ASSERT_TRUE(WriteCheckpoint(*store_, At(step), Objects(step)).ok());
  auto listed = ListCheckpoints(*store_);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step, 100);
  ASSERT_TRUE((*listed)[1].manifest.has_value()) << (*listed)[1].problem.ToString();
  const Manifest& m = *(*listed)[1].manifest;
  EXPECT_EQ(m.objects.size(), 3u);
  EXPECT_EQ(m.objects[0].bytes, 1000u);
  EXPECT_FALSE(m.created.empty());
  EXPECT_TRUE(VerifyCheckpoint(*store_, m).ok());
  auto newest = NewestValidCheckpoint(*store_, nullptr);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->step, 200);
  EXPECT_EQ(newest->state.at("data_rows"), 1600);
}

TEST_F(CheckpointStoreTest, DamagedNewestCheckpointIsNamedAndThePreviousOneUsed) {
  for (int64_t step : {100, 200, 300}) ASSERT_TRUE(WriteCheckpoint(*store_, At(step), Objects(step)).ok());
  // 300: a flipped byte in an object. 200: its manifest is gone (as after a crash before the commit).
  {
    std::fstream f(dir_ + "/step-000000000300/adam/m.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('X');
  }
  fs::remove(dir_ + "/step-000000000200/MANIFEST.json");
  std::vector<std::pair<int64_t, Status>> skipped;
  auto newest = NewestValidCheckpoint(*store_, &skipped);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->step, 100);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].first, 300);
  EXPECT_EQ(skipped[0].second.code(), StatusCode::kCorruption);
  EXPECT_NE(skipped[0].second.message().find("step-000000000300/adam/m.bin: xxh64 "), std::string::npos)
      << skipped[0].second.ToString();
  EXPECT_NE(skipped[0].second.message().find("the manifest says"), std::string::npos);
  EXPECT_EQ(skipped[1].first, 200);
  EXPECT_NE(skipped[1].second.message().find("no manifest"), std::string::npos) << skipped[1].second.ToString();
  // A truncated object is named with both sizes.
  fs::resize_file(dir_ + "/step-000000000100/params.bin", 10);
  auto none = NewestValidCheckpoint(*store_, nullptr);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  Status v = VerifyCheckpoint(*store_, *ParseManifest(*store_->Get("step-000000000100/MANIFEST.json"), "M"));
  EXPECT_NE(v.message().find("params.bin: 10 bytes, the manifest says 1000"), std::string::npos) << v.ToString();
}

TEST_F(CheckpointStoreTest, AFailedOrCrashedWriteLeavesNoCheckpointAndTheEarlierOnesIntact) {
  ASSERT_TRUE(WriteCheckpoint(*store_, At(100), Objects(100)).ok());
  // Every write, sync and rename of the next checkpoint fails in turn (3 objects, one of them empty,
  // and the manifest), and a full disk: the write reports it, and step 100 is still the newest valid
  // checkpoint.
  std::vector<FaultOptions> faults;
  for (int64_t n = 1; n <= 4; ++n) {
    if (n <= 3) faults.push_back(FaultOptions{.fail_write_at = n});  // the empty object appends nothing
    faults.push_back(FaultOptions{.fail_sync_at = n});
    faults.push_back(FaultOptions{.fail_rename_at = n});
  }
  faults.push_back(FaultOptions{.enospc_after_bytes = 500});
  for (const FaultOptions& fault : faults) {
    FaultInjectionEnv env(Env::Default(), fault);
    auto store = OpenPosixStore(dir_, &env);
    ASSERT_TRUE(store.ok());
    Status s = WriteCheckpoint(**store, At(200), Objects(200));
    EXPECT_FALSE(s.ok());
    auto newest = NewestValidCheckpoint(*store_, nullptr);
    ASSERT_TRUE(newest.ok()) << newest.status().ToString();
    EXPECT_EQ(newest->step, 100) << s.ToString();
    fs::remove_all(dir_ + "/step-000000000200");
  }
  // A crash after the objects but before the manifest is durable: the checkpoint does not exist.
  {
    FaultInjectionEnv env(Env::Default(), FaultOptions{});
    auto store = OpenPosixStore(dir_, &env);
    ASSERT_TRUE(store.ok());
    for (const auto& [key, data] : Objects(300)) ASSERT_TRUE((*store)->Put(CheckpointPrefix(300) + "/" + key, data).ok());
    ASSERT_TRUE(env.SimulateCrash().ok());
  }
  auto newest = NewestValidCheckpoint(*store_, nullptr);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->step, 100);
}

}  // namespace
}  // namespace tf::checkpoint
