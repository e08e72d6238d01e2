// Training checkpoints on S3 end to end (docs/s3.md, "Checkpoints on S3"): the real `trainflow`
// binary against s3rver on loopback (tests/integration/checkpoint/s3_test_servers.h), behind
// s3_fault_proxy.py where faults are injected, with boto3 (s3_interop.py) as the independent
// reader and writer. One rank unless said otherwise (tests/integration/checkpoint/checkpoint_resume_test.cpp kills
// several ranks and changes world sizes on local disk, through the same object-store interface).
//  - kill -9 while a checkpoint is being written to S3, then --resume auto: bit-identical weights
//    and identical metrics.jsonl records to an uninterrupted run, for full and incremental ones;
//    two MPI ranks (int8, error feedback) sharing one bucket resume bit-identically;
//  - boto3 lists and reads back what training wrote (sizes, xxh64s, manifest checksums) and
//    `trainflow checkpoint list|verify|export s3://...` agree; a checkpoint written to local disk
//    and uploaded by boto3 resumes from S3 and continues bit-identically;
//  - 503s and slow answers are retried and the checkpoints commit; a server killed mid-run fails
//    checkpoints, not training, and the earlier checkpoint still loads; unreachable storage, a
//    missing bucket and refused credentials stop `train` at start with a clear error;
//  - no run's stdout or stderr holds the secret key, the session token or the access key id.
// Every process started here is killed by PID (trainflow by process group) even when a test fails.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/data/token_file.h"
#include "model/safetensors.h"
#include "tests/integration/checkpoint/s3_test_servers.h"
#include "tests/integration/cli_fixture.h"
#include "tests/test_dir.h"

namespace tf {
namespace {

namespace fs = std::filesystem;
using cli_testing::RunResult;
using cli_testing::ExpectSameWeights;
using cli_testing::StepRecords;
using namespace s3_testing;  // NOLINT: the servers, Child and helpers of s3_test_servers.h

// s3rver accepts any secret (it does not check SigV4 signatures), so these are distinctive enough
// to be searched for in every output.
constexpr char kSecret[] = "tf-secret-Vq8rT2xwLm";
constexpr char kSessionToken[] = "tf-token-Kp3mZ9sBd";
constexpr int64_t kSteps = 1000;  // the runs compared with the uninterrupted one
constexpr char kInterval[] = "4";   // a checkpoint due every 4 steps (most are skipped while two are in flight)
constexpr char kChunkMb[] = "0.02";  // ~7 chunk objects per tensor

// The suite's servers and data, made by the first test (one process may run several tests).
struct Suite {
  testing_util::TestDir dir{"tf_s3ckpt_suite"};
  S3rver s3rver;
  FaultProxy proxy;
  bool proxy_started = false;
  std::string train, val;   // token files
  std::string reference;    // out_dir of the uninterrupted kSteps run ("" until made)
};

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

class S3CheckpointTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { suite_.reset(); }

  void SetUp() override {
    if (SkipServerTests()) GTEST_SKIP() << "TRAINFLOW_SKIP_S3_TESTS=1";
    UnsetHttpProxies();
    ASSERT_TRUE(S3rverInstalled());
    ASSERT_TRUE(fs::exists(cli_testing::kBinary)) << cli_testing::kBinary << " is not built";
    ASSERT_FALSE(FindOnPath("python3").empty()) << "python3 (with boto3) is not on PATH";
    if (!suite_) {
      auto s = std::make_unique<Suite>();
      ASSERT_TRUE(s->s3rver.Start(s->dir.path() + "/data", FreePort(), s->dir.path() + "/s3rver.log"));
      s->train = s->dir.path() + "/train.bin";
      s->val = s->dir.path() + "/val.bin";
      ASSERT_TRUE(WriteTokenFile(s->train, cli_testing::LcgByteTokens(30000, 4242)).ok());
      ASSERT_TRUE(WriteTokenFile(s->val, cli_testing::LcgByteTokens(2000, 4243)).ok());
      suite_ = std::move(s);
    } else if (!suite_->s3rver.Running()) {
      ASSERT_TRUE(suite_->s3rver.Restart());  // a test that killed it failed before restarting it
    }
    prefix_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::string Path(const std::string& name) const { return tmp_.path() + "/" + name; }
  std::string Url(const std::string& sub = "") const {
    return fmt::format("s3://{}/{}{}", kBucket, prefix_, sub.empty() ? "" : "/" + sub);
  }
  S3rver& s3rver() { return suite_->s3rver; }
  FaultProxy& Proxy() {
    if (!suite_->proxy_started) {
      EXPECT_TRUE(suite_->proxy.Start(FreePort(), s3rver().port(), suite_->dir.path() + "/proxy.log"));
      suite_->proxy_started = true;
    }
    return suite_->proxy;
  }

  // The environment of a run: credentials, the endpoint, nothing from ~/.aws.
  std::vector<std::string> Env(const std::string& endpoint, const std::string& access_key = kAccessKey) const {
    return {"AWS_ENDPOINT_URL_S3=" + endpoint,
            "AWS_ACCESS_KEY_ID=" + access_key,
            std::string("AWS_SECRET_ACCESS_KEY=") + kSecret,
            std::string("AWS_SESSION_TOKEN=") + kSessionToken,
            "AWS_REGION=us-east-1",
            "AWS_CONFIG_FILE=" + Path("no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE=" + Path("no-aws-credentials"),
            "OMP_NUM_THREADS=1"};
  }

  // `trainflow train` on byte-tiny writing to out_dir `out` (an absolute path).
  std::vector<std::string> Args(const std::string& out, int64_t steps, const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {
        "train", "--model", cli_testing::kByteTiny, "--train_data", suite_->train, "--val_data", suite_->val,
        "--seq_len", "32", "--batch_size", "4", "--max_steps", std::to_string(steps), "--shuffle", "true",
        "--warmup_steps", "5", "--eval_interval", "0", "--eval_batches", "1", "--sample_tokens", "0", "--threads", "1",
        "--log_interval", "1000", "--out_dir", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  std::vector<std::string> WithCheckpoints(const std::string& url, std::vector<std::string> extra = {}) const {
    extra.insert(extra.end(), {"--checkpoint_dir", url, "--checkpoint_interval", kInterval, "--checkpoint_chunk_mb",
                               kChunkMb});
    return extra;
  }

  // Starts `trainflow args` in the test's directory, in its own process group, stdout and stderr to
  // <name>.out and <name>.err.
  void Start(Child& job, const std::string& name, const std::vector<std::string>& args,
             const std::vector<std::string>& env) {
    std::vector<std::string> argv = {cli_testing::kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    ASSERT_TRUE(job.Start(argv, Path(name + ".out"), env, {Path(name + ".err"), tmp_.path(), /*own_group=*/true}));
  }
  // Waits for a started run (killing it at the limit) and collects its outputs.
  RunResult Finish(Child& job, const std::string& name, const std::vector<std::string>& env, double limit_s = 120) {
    const int code = job.Wait(limit_s);
    if (code == -1) ADD_FAILURE() << "trainflow (" << name << ") did not exit within " << limit_s << " s";
    return Collect(name, env, code);
  }
  // The outputs of a run that ended, checked for credentials.
  RunResult Collect(const std::string& name, const std::vector<std::string>& env, int exit_code) {
    RunResult r;
    r.exit_code = exit_code;
    r.out = ReadFile(Path(name + ".out"));
    r.err = ReadFile(Path(name + ".err"));
    ExpectNoCredentials(name, r.out + r.err, env);
    return r;
  }
  RunResult Trainflow(const std::string& name, const std::vector<std::string>& args,
                      const std::vector<std::string>& env) {
    Child job;
    Start(job, name, args, env);
    return Finish(job, name, env);
  }
  // tests/integration/checkpoint/s3_interop.py `args` (boto3 on s3rver directly); its stdout and stderr in *out.
  int Interop(const std::string& name, std::vector<std::string> args, std::string* out) {
    args.insert(args.begin(), {FindOnPath("python3"), Source("tests/integration/checkpoint/s3_interop.py")});
    const std::vector<std::string> env = Env(s3rver().endpoint());
    const int code = RunCommand(args, env, Path(name + ".log"), out);
    ExpectNoCredentials(name, *out, env);
    return code;
  }

  // No credential of `env` (the access key id, the secret key, the session token) is in `text`.
  static void ExpectNoCredentials(const std::string& name, const std::string& text,
                                  const std::vector<std::string>& env) {
    for (const char* var : {"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SESSION_TOKEN="}) {
      for (const std::string& e : env) {
        if (!e.starts_with(var)) continue;
        const std::string value = e.substr(std::strlen(var));
        const size_t at = text.find(value);
        EXPECT_EQ(at, std::string::npos) << name << "'s output holds the value of " << var << " at byte " << at;
      }
    }
  }

  // The uninterrupted kSteps run without checkpoints, made once per process.
  std::string Reference() {
    if (suite_->reference.empty()) {
      const std::string out = suite_->dir.path() + "/reference";
      const RunResult r = Trainflow("reference", Args(out, kSteps, {}), Env(s3rver().endpoint()));
      EXPECT_EQ(r.exit_code, 0) << r;
      if (r.exit_code == 0) suite_->reference = out;
    }
    return suite_->reference;
  }

  // Every step record of `out`'s metrics.jsonl is the reference's record of that step.
  void ExpectReferenceRecords(const std::string& out, size_t expected_records) {
    const auto ref = StepRecords(ReadFile(Reference() + "/metrics.jsonl"));
    const auto got = StepRecords(ReadFile(out + "/metrics.jsonl"));
    EXPECT_EQ(got.size(), expected_records);
    for (const auto& [step, record] : got) {
      ASSERT_TRUE(ref.contains(step)) << "step " << step;
      EXPECT_EQ(record, ref.at(step)) << "step " << step;
    }
  }

  // The checkpoints of s3://kBucket/<prefix> as s3rver keeps them on disk (which the test reads to
  // time its kills without a request of its own): the steps whose MANIFEST.json is complete.
  std::vector<int64_t> CommittedOnS3() const {
    std::vector<int64_t> steps;
    for (const std::string& n : Entries(suite_->s3rver.PrefixDir(prefix_))) {
      if (n.starts_with("step-") && !ManifestOnS3(std::stoll(n.substr(5))).is_discarded()) {
        steps.push_back(std::stoll(n.substr(5)));
      }
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  // The manifest of `step` as stored (discarded while absent or half-written: s3rver writes in place).
  nlohmann::json ManifestOnS3(int64_t step) const {
    const std::string file = suite_->s3rver.ObjectFile(fmt::format("{}/step-{:012d}/MANIFEST.json", prefix_, step));
    return nlohmann::json::parse(ReadFile(file), nullptr, /*allow_exceptions=*/false);
  }
  // Its kind ("full", "incremental"), or "" while it cannot be read (retention may delete it).
  std::string KindOnS3(int64_t step) const {
    const nlohmann::json m = ManifestOnS3(step);
    return m.is_object() && m.contains("kind") && m["kind"].is_string() ? m["kind"].get<std::string>() : "";
  }
  // A step after `step` with objects but no manifest (being written), or -1.
  int64_t InFlightOnS3After(int64_t step) const {
    const std::string root = suite_->s3rver.PrefixDir(prefix_);
    for (const std::string& n : Entries(root)) {
      if (!n.starts_with("step-") || std::stoll(n.substr(5)) <= step) continue;
      bool objects = false, manifest = false;
      for (const std::string& o : Entries(root + "/" + n)) {
        objects |= o.ends_with("._S3rver_object");
        manifest |= o.starts_with("MANIFEST.json.");
      }
      if (objects && !manifest) return std::stoll(n.substr(5));
    }
    return -1;
  }

  // Runs with checkpoints to S3, killed (SIGKILL to its process group) as soon as a checkpoint is
  // being written after a committed one of `kind`; resumed with --resume auto to the end.
  void KillWhileWritingThenResume(const std::vector<std::string>& extra, const std::string& kind) {
    const std::string ref = Reference();
    ASSERT_FALSE(ref.empty());
    const std::string run = Path("run");
    const std::vector<std::string> args = Args(run, kSteps, WithCheckpoints(Url(), extra));
    const std::vector<std::string> env = Env(s3rver().endpoint());
    int64_t committed = -1, in_flight = -1;
    {
      Child job;
      Start(job, "killed", args, env);
      const auto start = Clock::now();
      while (job.Running() && Since(start) < 60) {
        const std::vector<int64_t> c = CommittedOnS3();
        if (!c.empty() && KindOnS3(c.back()) == kind) {
          in_flight = InFlightOnS3After(c.back());
          if (in_flight >= 0) {
            committed = c.back();
            break;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      job.Kill();
      const RunResult killed = Collect("killed", env, -1);
      ASSERT_GE(committed, 0) << "no checkpoint was being written after a committed " << kind
                              << " one before the run ended\n" << killed;
    }
    const RunResult resumed = Trainflow("resumed", args, env);
    ASSERT_EQ(resumed.exit_code, 0) << resumed;
    // The newest committed checkpoint; or the one in flight, if s3rver had received its manifest
    // whole before the kill (S3 completes a PUT it received, whoever sent it).
    auto from = [&](int64_t s) {
      return resumed.out.find(fmt::format("resumed from {}/step-{:012d} (step {}, ", Url(), s, s)) != std::string::npos;
    };
    EXPECT_TRUE(from(committed) || from(in_flight)) << "killed with step " << committed << " committed and step "
                                                    << in_flight << " in flight\n" << resumed;
    if (from(committed)) {
      EXPECT_NE(resumed.out.find(kind + " checkpoint; "), std::string::npos) << resumed;
    }
    ExpectSameWeights(ref, run);
    EXPECT_EQ(StepRecords(ReadFile(run + "/metrics.jsonl")), StepRecords(ReadFile(ref + "/metrics.jsonl")));
    const std::vector<int64_t> after = CommittedOnS3();
    ASSERT_FALSE(after.empty());
    EXPECT_EQ(after.back(), kSteps);
  }

  static std::unique_ptr<Suite> suite_;
  ScopedAwsEnv aws_env_;  // none of the caller's AWS_* settings reaches a run; Env() gives each its own
  testing_util::TestDir tmp_{"tf_s3ckpt"};
  std::string prefix_;  // the test's name: its objects are under s3://kBucket/<prefix_>/
};
std::unique_ptr<Suite> S3CheckpointTest::suite_;

// ---- Exactness --------------------------------------------------------------------------------

TEST_F(S3CheckpointTest, KillNineWhileWritingThenResumeIsBitIdentical) { KillWhileWritingThenResume({}, "full"); }

TEST_F(S3CheckpointTest, KillNineWhileWritingThenResumeIsBitIdenticalIncremental) {
  KillWhileWritingThenResume({"--checkpoint_full_every", "3"}, "incremental");
}

// ---- Interoperability -------------------------------------------------------------------------

TEST_F(S3CheckpointTest, Boto3ReadsWhatTrainingWroteAndTheCheckpointCommandsAgree) {
  const std::vector<std::string> env = Env(s3rver().endpoint());
  // Synchronous checkpoints at 10, 20, 30, 40: full, incremental, full, incremental.
  const RunResult run = Trainflow(
      "run", Args(Path("run"), 40,
                  {"--checkpoint_dir", Url(), "--checkpoint_interval", "10", "--checkpoint_full_every", "2",
                   "--checkpoint_keep_last", "0", "--checkpoint_async", "false", "--checkpoint_chunk_mb", kChunkMb}),
      env);
  ASSERT_EQ(run.exit_code, 0) << run;
  ASSERT_EQ(CommittedOnS3(), (std::vector<int64_t>{10, 20, 30, 40}));
  const std::map<int64_t, std::string> kinds = {{10, "full"}, {20, "incremental"}, {30, "full"}, {40, "incremental"}};

  // boto3 lists the prefix in pages of 7 keys and reads every object every manifest lists: sizes,
  // xxh64s, checksums and chunk coverage as docs/checkpoints.md specifies them.
  std::string boto;
  ASSERT_EQ(Interop("verify", {"verify-manifest", "--endpoint", s3rver().endpoint(), "--bucket", kBucket, "--prefix",
                               prefix_, "--page-size", "7"},
                    &boto),
            0)
      << boto;
  for (const auto& [step, kind] : kinds) {
    const size_t at = boto.find(fmt::format("step-{:012d} {}: ", step, kind));
    ASSERT_NE(at, std::string::npos) << boto;
    EXPECT_TRUE(boto.substr(at, boto.find('\n', at) - at).ends_with(" bytes, ok")) << boto;
  }
  EXPECT_NE(boto.find("verified 4 checkpoints, "), std::string::npos) << boto;
  EXPECT_EQ(boto.find("FAILED"), std::string::npos) << boto;

  // `checkpoint list` shows the same checkpoints and kinds.
  const RunResult list = Trainflow("list", {"checkpoint", "list", Url()}, env);
  ASSERT_EQ(list.exit_code, 0) << list;
  for (const auto& [step, kind] : kinds) {
    const size_t row = list.out.find(fmt::format("\n{:>12}  ", step));
    ASSERT_NE(row, std::string::npos) << list;
    const std::string line = list.out.substr(row + 1, list.out.find('\n', row + 1) - row - 1);
    EXPECT_NE(line.find("  " + kind + " "), std::string::npos) << line;
    EXPECT_NE(line.find("valid"), std::string::npos) << line;
  }
  // `checkpoint verify` reads every object of each.
  const RunResult verify = Trainflow("verify", {"checkpoint", "verify", Url()}, env);
  ASSERT_EQ(verify.exit_code, 0) << verify;
  for (const auto& [step, kind] : kinds) {
    EXPECT_NE(verify.out.find(fmt::format("step {}: ok (", step)), std::string::npos) << verify;
  }
  // `checkpoint export` writes what training wrote at the newest (incremental) checkpoint.
  const RunResult exp = Trainflow("export", {"checkpoint", "export", Url(), "--out", Path("exported")}, env);
  ASSERT_EQ(exp.exit_code, 0) << exp;
  EXPECT_NE(exp.out.find("step 40"), std::string::npos) << exp;
  ExpectSameWeights(Path("run"), Path("exported"));
  auto a = ReadSafetensors(Path("run/model.safetensors"));
  auto b = ReadSafetensors(Path("exported/model.safetensors"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->metadata, b->metadata);

  // Neither check is vacuous: one flipped byte in an object of step 40, changed behind S3's back
  // (in s3rver's file), is found by both, naming the object.
  const nlohmann::json manifest = ManifestOnS3(40);
  std::string victim;
  for (const auto& o : manifest.at("objects")) {
    if (o.contains("tensor") && o.at("key").get<std::string>().starts_with("step-000000000040/")) {
      victim = o.at("key");
      break;
    }
  }
  ASSERT_FALSE(victim.empty()) << manifest.dump();
  const std::string file = s3rver().ObjectFile(prefix_ + "/" + victim);
  std::string bytes = ReadFile(file);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x20;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  ASSERT_EQ(Interop("verify-damaged", {"verify-manifest", "--endpoint", s3rver().endpoint(), "--bucket", kBucket,
                                       "--prefix", prefix_},
                    &boto),
            1)
      << boto;
  EXPECT_NE(boto.find(victim + " has xxh64 "), std::string::npos) << boto;
  const RunResult damaged = Trainflow("verify-damaged", {"checkpoint", "verify", Url(), "--step", "40"}, env);
  EXPECT_EQ(damaged.exit_code, 2) << damaged;  // corruption
  EXPECT_NE(damaged.out.find("step 40: FAILED: " + Url() + "/" + victim + ": xxh64 "), std::string::npos) << damaged;
}

TEST_F(S3CheckpointTest, ALocalCheckpointUploadedByBoto3ResumesFromS3BitIdentically) {
  const std::string ref = Reference();
  ASSERT_FALSE(ref.empty());
  const std::vector<std::string> env = Env(s3rver().endpoint());
  const std::string local = Path("local"), run = Path("run");
  const RunResult first = Trainflow(
      "first", Args(run, kSteps, {"--checkpoint_dir", local, "--checkpoint_interval", "10", "--checkpoint_chunk_mb",
                                  kChunkMb, "--stop_at_step", "20"}),
      env);
  ASSERT_EQ(first.exit_code, 5) << first;  // stopped on request, checkpoints at 10 and 20
  ASSERT_TRUE(fs::exists(local + "/step-000000000020/MANIFEST.json"));
  std::string out;
  ASSERT_EQ(Interop("upload", {"upload-dir", "--endpoint", s3rver().endpoint(), "--bucket", kBucket, "--prefix",
                               prefix_ + "/uploaded", "--dir", local},
                    &out),
            0)
      << out;
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(local)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(out, fmt::format("uploaded {} files\n", files));
  const std::string location = Url("uploaded/step-000000000020");
  const RunResult resumed = Trainflow("resumed", Args(run, kSteps, {"--resume", location}), env);
  ASSERT_EQ(resumed.exit_code, 0) << resumed;
  EXPECT_NE(resumed.out.find("resumed from " + location + " (step 20, "), std::string::npos) << resumed;
  ExpectSameWeights(ref, run);
  EXPECT_EQ(StepRecords(ReadFile(run + "/metrics.jsonl")), StepRecords(ReadFile(ref + "/metrics.jsonl")));
}

// Two MPI ranks write one bucket (int8 with error feedback: each rank's residuals too); rank 0
// reads both part lists from S3 and commits. A 2-rank run resumed from the incremental checkpoint
// of step 20 ends as the run that wrote it: bit-identical weights, the same step records.
TEST_F(S3CheckpointTest, TwoRanksShareOneBucketAndResumeBitIdentically) {
  const std::vector<std::string> env = Env(s3rver().endpoint());
  std::vector<std::string> mpirun;
  std::istringstream words(TF_MPIRUN);
  for (std::string w; words >> w;) mpirun.push_back(w);  // an absolute path (CMake's find_program), then flags
  mpirun.insert(mpirun.end(), {"-np", "2", "-x", "OMP_NUM_THREADS=1", "-x", "OMP_WAIT_POLICY=PASSIVE", "--",
                               cli_testing::kBinary});
  const std::vector<std::string> codec = {"--batch_size", "2", "--compression", "int8", "--error_feedback", "true",
                                          "--bucket_mb", "0.01"};
  auto two_ranks = [&](const std::string& name, const std::string& out, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = mpirun;
    std::vector<std::string> args = Args(out, 40, codec);
    args.insert(args.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), args.begin(), args.end());
    Child job;
    EXPECT_TRUE(job.Start(argv, Path(name + ".out"), env, {Path(name + ".err"), tmp_.path(), /*own_group=*/true}));
    return Finish(job, name, env);
  };
  const RunResult a = two_ranks("a", Path("a"), {"--checkpoint_dir", Url(), "--checkpoint_interval", "10",
                                                 "--checkpoint_full_every", "2", "--checkpoint_keep_last", "0",
                                                 "--checkpoint_when_busy", "wait", "--checkpoint_chunk_mb", kChunkMb});
  ASSERT_EQ(a.exit_code, 0) << a;
  ASSERT_EQ(CommittedOnS3(), (std::vector<int64_t>{10, 20, 30, 40}));
  const nlohmann::json manifest = ManifestOnS3(20);
  EXPECT_EQ(manifest.value("world", 0), 2);
  EXPECT_EQ(manifest.value("kind", ""), "incremental");
  std::vector<std::string> tensors;
  for (const auto& t : manifest.at("tensors")) tensors.push_back(t.at("name"));
  for (const char* name : {"ef.residual.r0", "ef.residual.r1", "ef.server.r0", "ef.server.r1"}) {
    EXPECT_NE(std::find(tensors.begin(), tensors.end(), name), tensors.end()) << name;
  }
  for (const char* part : {"part-r00000.json", "part-r00001.json"}) {
    EXPECT_TRUE(fs::exists(s3rver().ObjectFile(prefix_ + "/step-000000000020/" + part))) << part;
  }
  std::string boto;
  ASSERT_EQ(Interop("verify", {"verify-manifest", "--endpoint", s3rver().endpoint(), "--bucket", kBucket, "--prefix",
                               prefix_},
                    &boto),
            0)
      << boto;
  EXPECT_NE(boto.find("verified 4 checkpoints, "), std::string::npos) << boto;

  const std::string location = Url("step-000000000020");
  const RunResult b = two_ranks("b", Path("b"), {"--resume", location});
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_NE(b.out.find("resumed from " + location + " (step 20, "), std::string::npos) << b;
  ExpectSameWeights(Path("a"), Path("b"));
  const auto ra = StepRecords(ReadFile(Path("a/metrics.jsonl")));
  const auto rb = StepRecords(ReadFile(Path("b/metrics.jsonl")));
  EXPECT_EQ(rb.size(), 20u);
  for (const auto& [step, record] : rb) EXPECT_EQ(record, ra.at(step)) << "step " << step;
}

// ---- Faults -----------------------------------------------------------------------------------

// The first checkpoint's first four PUTs are answered 503 SlowDown (a request has five attempts),
// then six PUTs are answered slowly: the retries are logged, every checkpoint commits, and the run
// is the uninterrupted one. At debug level, so that every request line is searched for credentials.
TEST_F(S3CheckpointTest, ThrottlingAndSlowAnswersAreRetriedAndCheckpointsCommit) {
  const std::string ref = Reference();
  ASSERT_FALSE(ref.empty());
  FaultProxy& proxy = Proxy();
  proxy.Arm("mode=error&count=4&method=PUT&status=503&code=SlowDown");
  std::vector<std::string> env = Env(proxy.endpoint());
  env.push_back("TRAINFLOW_LOG_LEVEL=debug");
  Child job;
  Start(job, "run", Args(Path("run"), kSteps, WithCheckpoints(Url())), env);
  const auto start = Clock::now();
  while (job.Running() && proxy.Faults() < 4 && Since(start) < 60) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(proxy.Faults(), 4);  // the last 503 was answered; the writer is backing off
  proxy.Arm("mode=slow&count=6&method=PUT&delay=0.25");
  const RunResult r = Finish(job, "run", env);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(proxy.Faults(), 6);
  proxy.Arm("mode=pass");
  // Four retry warnings, each naming its object of the first checkpoint (its PUTs may run in
  // parallel: several objects, or one object several times).
  int retries = 0;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("failed: 503 SlowDown: injected by s3_fault_proxy; retrying in ") == std::string::npos) continue;
    ++retries;
    EXPECT_NE(line.find(Url() + "/step-000000000004/"), std::string::npos) << line;
    EXPECT_NE(line.find(": PUT: attempt "), std::string::npos) << line;
  }
  EXPECT_EQ(retries, 4) << r;
  EXPECT_EQ(r.err.find("part failed"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("not committed"), std::string::npos) << r;
  EXPECT_NE(r.out.find(fmt::format("checkpoint step {} committed to {} (", kSteps, Url())), std::string::npos) << r;
  EXPECT_NE(r.out.find(", 0 failed, "), std::string::npos) << r;
  EXPECT_NE(r.err.find("s3: PUT http://127.0.0.1:"), std::string::npos) << "no debug request lines\n" << r;
  const std::vector<int64_t> committed = CommittedOnS3();
  ASSERT_FALSE(committed.empty());
  EXPECT_EQ(committed.back(), kSteps);
  ExpectSameWeights(ref, Path("run"));
}

// s3rver is killed while the checkpoint after a committed one is being written, and restarted on
// the same directory only after the run: every later checkpoint fails, naming the object and the
// endpoint; training runs to the end and exits 0 with the uninterrupted run's weights; the
// committed checkpoint verifies and a run resumed from it continues bit-identically.
TEST_F(S3CheckpointTest, AServerKilledMidRunFailsCheckpointsNotTraining) {
  const std::string ref = Reference();
  ASSERT_FALSE(ref.empty());
  const std::vector<std::string> env = Env(s3rver().endpoint());
  int64_t committed = -1;
  RunResult r;
  {
    Child job;
    Start(job, "run", Args(Path("run"), kSteps, WithCheckpoints(Url())), env);
    const auto start = Clock::now();
    while (job.Running() && Since(start) < 60) {
      const std::vector<int64_t> c = CommittedOnS3();
      if (!c.empty() && InFlightOnS3After(c.back()) >= 0) {  // its manifest's PUT has returned
        committed = c.back();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    s3rver().Kill();
    r = Finish(job, "run", env);
  }
  ASSERT_GE(committed, 0) << "the run ended before a second checkpoint was begun\n" << r;
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("part failed"), std::string::npos) << r;
  EXPECT_NE(r.err.find(Url() + "/step-"), std::string::npos) << r;
  EXPECT_NE(r.err.find(fmt::format("(endpoint {}, 5 attempts", s3rver().endpoint())), std::string::npos) << r;
  EXPECT_NE(r.err.find("training continues"), std::string::npos) << r;
  EXPECT_NE(r.out.find(fmt::format("the final checkpoint (step {}) was not written", kSteps)), std::string::npos) << r;
  ExpectSameWeights(ref, Path("run"));

  ASSERT_TRUE(s3rver().Restart());
  const std::string step = fmt::format("step-{:012d}", committed);
  const RunResult verify = Trainflow("verify", {"checkpoint", "verify", Url(), "--step", std::to_string(committed)}, env);
  EXPECT_EQ(verify.exit_code, 0) << verify;
  EXPECT_NE(verify.out.find(fmt::format("step {}: ok (", committed)), std::string::npos) << verify;
  const RunResult resumed = Trainflow("resumed", Args(Path("resumed"), kSteps, {"--resume", Url(step)}), env);
  ASSERT_EQ(resumed.exit_code, 0) << resumed;
  EXPECT_NE(resumed.out.find(fmt::format("resumed from {} (step {}, ", Url(step), committed)), std::string::npos)
      << resumed;
  ExpectSameWeights(ref, Path("resumed"));
  ExpectReferenceRecords(Path("resumed"), static_cast<size_t>(kSteps - committed));
}

// Storage that cannot be used, or a resume location that holds nothing, stops `train` before the
// first step, with the exit code of its status (docs/exit-codes.md) and the last line on stderr
// naming the location and the cause.
TEST_F(S3CheckpointTest, UnusableStorageOrLocationFailsAtStart) {
  auto last_line = [](const std::string& err) {
    const std::string trimmed = err.substr(0, err.find_last_not_of('\n') + 1);
    return trimmed.substr(trimmed.rfind('\n') + 1);
  };
  // Nothing listening: `unavailable` once the retries are spent (exit 3, "restart").
  const std::string dead = fmt::format("http://127.0.0.1:{}", FreePort());
  const auto start = Clock::now();
  const RunResult unreachable = Trainflow("unreachable", Args(Path("a"), 10, {"--checkpoint_dir", Url()}), Env(dead));
  EXPECT_LT(Since(start), 20.0);
  EXPECT_EQ(unreachable.exit_code, 3) << unreachable;
  const std::string line = last_line(unreachable.err);
  EXPECT_TRUE(line.starts_with("trainflow: error: ")) << unreachable;
  EXPECT_NE(line.find(Url() + ": LIST (opening the store, bucket '" + kBucket + "')"), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("(endpoint {}, 5 attempts", dead)), std::string::npos) << line;
  EXPECT_TRUE(StepRecords(ReadFile(Path("a/metrics.jsonl"))).empty());

  // A bucket that does not exist: `not found` (exit 2, bad configuration).
  const RunResult missing = Trainflow(
      "missing", Args(Path("b"), 10, {"--checkpoint_dir", "s3://no-such-bucket-tf/run"}), Env(s3rver().endpoint()));
  EXPECT_EQ(missing.exit_code, 2) << missing;
  EXPECT_NE(last_line(missing.err).find("404 NoSuchBucket"), std::string::npos) << missing;
  EXPECT_NE(last_line(missing.err).find("'no-such-bucket-tf'"), std::string::npos) << missing;

  // An access key the server does not know: `I/O error` (exit 4, fix the storage), the key, the
  // secret and the token nowhere in the output (Finish checks every run for them).
  const RunResult refused = Trainflow("refused", Args(Path("c"), 10, {"--checkpoint_dir", Url()}),
                                      Env(s3rver().endpoint(), "NOT-A-KEY-tf5Rw"));
  EXPECT_EQ(refused.exit_code, 4) << refused;
  EXPECT_NE(last_line(refused.err).find("403 InvalidAccessKeyId"), std::string::npos) << refused;
  EXPECT_NE(last_line(refused.err).find(Url()), std::string::npos) << refused;

  // A --resume location with no checkpoint (a typo) is refused, not a fresh start.
  const RunResult typo =
      Trainflow("typo", Args(Path("d"), 10, {"--resume", Url("nowhere/step-000000000010")}), Env(s3rver().endpoint()));
  EXPECT_EQ(typo.exit_code, 2) << typo;
  EXPECT_NE(last_line(typo.err).find(Url("nowhere")), std::string::npos) << typo;
  EXPECT_TRUE(StepRecords(ReadFile(Path("d/metrics.jsonl"))).empty());
}

}  // namespace
}  // namespace tf
