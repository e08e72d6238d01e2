// `trainflow checkpoint list|inspect|verify DIR` through the real binary: a healthy directory is
// listed and verifies; a damaged object, a missing manifest and an edited manifest are each named
// with the step and what is wrong, and verify exits non-zero; a missing directory or a file in its
// place is a clean error naming it.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/manifest.h"
#include "checkpoint/object_store.h"
#include "tests/integration/cli_fixture.h"

namespace tf {
namespace {

namespace fs = std::filesystem;
using cli_testing::CliFixture;
using cli_testing::RunResult;

class CheckpointCli : public CliFixture {
 protected:
  std::string WriteThree() {
    const std::string dir = Path("ckpt");
    auto store = checkpoint::OpenPosixStore(dir);
    EXPECT_TRUE(store.ok());
    for (int64_t step : {10, 20, 30}) {
      checkpoint::Manifest m;
      m.step = step;
      m.code_version = "test";
      m.state = {{"data_rows", step * 4}};
      EXPECT_TRUE(checkpoint::WriteCheckpoint(**store, m,
                                              {{"params.bin", std::string(2048, 'p')}, {"adam.bin", "moments"}})
                      .ok());
    }
    return dir;
  }
  // `train` of byte-tiny for `steps` steps into out_dir Path(out), with a checkpoint every 2 steps
  // in Path("ckpt").
  RunResult TrainWithCheckpoints(const std::string& out, int steps) {
    if (data_.empty()) data_ = TokenFile("train.bin", 400);
    return Run({"train", "--model", cli_testing::kByteTiny, "--train_data", data_, "--max_steps", std::to_string(steps),
                "--batch_size", "1", "--seq_len", "8", "--sample_tokens", "0", "--eval_batches", "0", "--out_dir",
                Path(out), "--checkpoint_dir", Path("ckpt"), "--checkpoint_interval", "2"});
  }
  // A manifest whose state holds objects nested 70,000 deep (its checksum is never reached).
  static std::string DeepManifest() {
    const int depth = 70000;
    std::string deep;
    for (int i = 0; i < depth; ++i) deep += "{\"a\":";
    deep += "1" + std::string(depth, '}');
    return R"({"format": "trainflow.checkpoint", "version": 1, "checksum": "0000000000000000", "state": )" + deep + "}";
  }

  std::string data_;
};

TEST_F(CheckpointCli, HealthyDirectoryIsListedInspectedAndVerified) {
  const std::string dir = WriteThree();
  RunResult r = Run({"checkpoint", "list", dir});
  ASSERT_EQ(r.exit_code, 0) << r;
  for (const char* step : {"10", "20", "30"}) EXPECT_NE(r.out.find(std::string(step) + "  20"), std::string::npos) << r;
  EXPECT_NE(r.out.find("2.0 KiB"), std::string::npos) << r;
  r = Run({"checkpoint", "inspect", dir});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("step"), 30);
  EXPECT_EQ(j.at("state").at("data_rows"), 120);
  r = Run({"checkpoint", "inspect", dir, "--step", "10"});
  EXPECT_EQ(nlohmann::json::parse(r.out).at("step"), 10) << r;
  r = Run({"checkpoint", "verify", dir});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("step 30: ok (2 objects"), std::string::npos) << r;
}

TEST_F(CheckpointCli, DamageIsNamedAndVerifyFails) {
  const std::string dir = WriteThree();
  {
    std::fstream f(dir + "/step-000000000030/params.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('X');
  }
  fs::remove(dir + "/step-000000000020/MANIFEST.json");
  RunResult r = Run({"checkpoint", "list", dir});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("uncommitted: " + dir + "/step-000000000020: no manifest"), std::string::npos) << r;
  r = Run({"checkpoint", "verify", dir});
  ExpectCleanFailure(r, {"1 of 2 checkpoints", "failed verification"});
  EXPECT_NE(r.out.find("step 20: uncommitted"), std::string::npos) << r;
  EXPECT_NE(r.out.find("step 30: FAILED: " + dir + "/step-000000000030/params.bin: xxh64"), std::string::npos) << r;
  EXPECT_NE(r.out.find("step 10: ok"), std::string::npos) << r;
  r = Run({"checkpoint", "verify", dir, "--step", "10"});
  EXPECT_EQ(r.exit_code, 0) << r;
  // inspect skips to the newest valid manifest; an edited manifest is named by its checksum.
  r = Run({"checkpoint", "inspect", dir});
  EXPECT_EQ(nlohmann::json::parse(r.out).at("step"), 30) << r;  // its manifest is intact
  std::string text = cli_testing::ReadAll(dir + "/step-000000000010/MANIFEST.json");
  text.replace(text.find("\"data_rows\": 40"), 15, "\"data_rows\": 41");
  std::ofstream(dir + "/step-000000000010/MANIFEST.json", std::ios::trunc) << text;
  r = Run({"checkpoint", "inspect", dir, "--step", "10"});
  ExpectCleanFailure(r, {"step-000000000010/MANIFEST.json", "checksum"});
  ExpectCleanFailure(Run({"checkpoint", "inspect", dir, "--step", "15"}), {"no checkpoint of step 15"});
}

TEST_F(CheckpointCli, DeeplyNestedManifestIsDamageNotACrash) {
  // Objects nested 70,000 deep overflowed the stack of the recursive copy and dump of the
  // manifest's body: list, inspect and verify died of SIGSEGV.
  const std::string dir = WriteThree();
  std::ofstream(dir + "/step-000000000030/MANIFEST.json", std::ios::trunc) << DeepManifest();
  RunResult r = Run({"checkpoint", "list", dir});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("step-000000000030/MANIFEST.json: JSON nested more than 64 levels"), std::string::npos) << r;
  r = Run({"checkpoint", "inspect", dir});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("step"), 20) << r;
  r = Run({"checkpoint", "verify", dir});
  ExpectCleanFailure(r, {"1 of 3 checkpoints", "nested more than 64 levels"});
  EXPECT_NE(r.out.find("step 20: ok"), std::string::npos) << r;
}

TEST_F(CheckpointCli, ResumeSkipsADeeplyNestedManifest) {
  // `train` with resume auto died of SIGSEGV reading it.
  ASSERT_EQ(TrainWithCheckpoints("out1", 4).exit_code, 0);
  std::ofstream(Path("ckpt/step-000000000004/MANIFEST.json"), std::ios::trunc) << DeepManifest();
  const RunResult r = TrainWithCheckpoints("out2", 4);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE((r.out + r.err).find("step-000000000004/MANIFEST.json: JSON nested more than 64 levels"), std::string::npos)
      << r;
  EXPECT_NE(r.out.find("resumed from " + Path("ckpt") + "/step-000000000002"), std::string::npos) << r;
}

TEST_F(CheckpointCli, NewerFormatIsRefusedNotSkippedAndOverwritten) {
  // A manifest of a newer format version was taken for damage: resume fell back to the step before
  // and the next checkpoint of that step replaced it.
  const std::string ckpt = Path("ckpt");
  ASSERT_EQ(TrainWithCheckpoints("out1", 4).exit_code, 0);
  const std::string manifest = ckpt + "/step-000000000004/MANIFEST.json";
  std::string text = cli_testing::ReadAll(manifest);
  const size_t at = text.find("\n \"version\": 1,");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 15, "\n \"version\": 2,");
  std::ofstream(manifest, std::ios::trunc) << text;

  RunResult r = TrainWithCheckpoints("out2", 6);
  ExpectCleanFailure(r, {"step-000000000004/MANIFEST.json", "format version 2 is newer", "reads version 2"});
  EXPECT_EQ(cli_testing::ReadAll(manifest), text);
  r = Run({"checkpoint", "list", ckpt});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("newer format: "), std::string::npos) << r;
  EXPECT_NE(r.out.find("valid"), std::string::npos) << r;
}

TEST_F(CheckpointCli, LeftoversOfAnInterruptedWriteAreNotDamage) {
  // What kill -9 during the write of step 40 leaves: some of its objects, no manifest. verify said
  // "FAILED" and exited 2 although every committed checkpoint was intact.
  const std::string dir = WriteThree();
  fs::create_directories(dir + "/step-000000000040");
  std::ofstream(dir + "/step-000000000040/params.bin") << std::string(1000, 'p');
  RunResult r = Run({"checkpoint", "verify", dir});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("step 40: uncommitted, not a checkpoint"), std::string::npos) << r;
  EXPECT_NE(r.out.find("step 30: ok"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r;
  r = Run({"checkpoint", "list", dir});
  EXPECT_NE(r.out.find("uncommitted: "), std::string::npos) << r;
  // Asked for by step, it is not a checkpoint.
  ExpectCleanFailure(Run({"checkpoint", "verify", dir, "--step", "40"}), {"step-000000000040: no manifest"});
  // Only leftovers: nothing to verify.
  fs::create_directories(Path("only/step-000000000005"));
  std::ofstream(Path("only/step-000000000005/params.bin")) << "p";
  ExpectCleanFailure(Run({"checkpoint", "verify", Path("only")}), {"no committed checkpoints"});
}

TEST_F(CheckpointCli, SubcommandsAreNamed) {
  RunResult r = Run({"checkpoint", "frobnicate"});
  ExpectCleanFailure(r, {"unknown subcommand 'frobnicate'", "list, inspect, verify, export"});
  ExpectCleanFailure(Run({"checkpoint"}), {"a subcommand is required", "list, inspect, verify, export"});
  r = Run({"checkpoint", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("List, inspect, verify and export"), std::string::npos) << r;
  ExpectCleanFailure(Run({"checkpoint", "list", WriteThree(), "extra"}), {"extra"});
}

TEST_F(CheckpointCli, UrlsOtherThanS3AreRefusedNotMadeDirectories) {
  // Each of these became a local directory ("S3:/bucket/p", "s3a:/...") and training went on.
  const std::string data = TokenFile("train.bin", 200);
  for (const std::string url : {"S3://bucket/p", "s3:/bucket/p", "s3a://bucket/p"}) {
    RunResult r = Run({"train", "--model", cli_testing::kByteTiny, "--train_data", data, "--max_steps", "1",
                       "--batch_size", "1", "--seq_len", "8", "--sample_tokens", "0", "--eval_batches", "0",
                       "--out_dir", Path("out"), "--checkpoint_dir", url});
    ExpectCleanFailure(r, {"'" + url + "' looks like a URL", "s3://bucket/prefix"});
    ExpectCleanFailure(Run({"checkpoint", "list", url}), {"'" + url + "' looks like a URL"});
    EXPECT_FALSE(fs::exists(Path(url.substr(0, url.find(':') + 1)))) << url;
  }
}

TEST_F(CheckpointCli, BadDirectoriesAreNamed) {
  ExpectCleanFailure(Run({"checkpoint", "list", Path("nowhere")}), {Path("nowhere"), "no such checkpoint directory"});
  EXPECT_FALSE(fs::exists(Path("nowhere")));  // reading never creates it
  std::ofstream(Path("file")) << "x";
  ExpectCleanFailure(Run({"checkpoint", "verify", Path("file")}), {Path("file"), "not a directory"});
  fs::create_directories(Path("empty"));
  RunResult r = Run({"checkpoint", "list", Path("empty")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("no checkpoints"), std::string::npos) << r;
  ExpectCleanFailure(Run({"checkpoint", "verify", Path("empty")}), {"no checkpoints"});
  ExpectCleanFailure(Run({"checkpoint"}), {});
}

}  // namespace
}  // namespace tf
