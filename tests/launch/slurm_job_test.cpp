// A Slurm job without Slurm: the sbatch script a set of options produces (directives, the command it
// runs, the checkpoint and output directories it adds), what submit refuses before writing
// anything, the job directory's files (atomic, owner-only or group-readable, a damaged one read as
// {}), usage.json and job.json's excluded nodes across runs, and the supervisor's options built from
// an allocation.
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch/slurm_job.h"
#include "tests/test_dir.h"

namespace tf::slurm {
namespace {

using Words = std::vector<std::string>;

SubmitContext Context() {
  SubmitContext c;
  c.trainflow = "/opt/tf/trainflow";
  c.cwd = "/home/ann/work";
  c.user = "ann";
  c.now_utc = "2026-01-02T03:04:05Z";
  c.stamp_utc = "20260102-030405";
  return c;
}

TrainJob Train() {
  TrainJob t;
  t.args = {"train", "--model", "configs/gpt2.json", "--train_data", "data/train.bin"};
  t.batch_size = 4;
  t.grad_accum_steps = 2;
  t.seq_len = 64;
  t.out_dir_default = true;
  t.metrics_addr_default = true;
  return t;
}

mode_t Mode(const std::string& path) {
  struct stat st{};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PlanSubmitTest, TheScriptSaysWhatTheOptionsAsk) {
  SubmitOptions o;
  o.nodes = 2;
  o.job.gpus_per_node = 8;
  o.job.min_nodes = 1;
  o.job.supervisor_args = {"--max-restarts", "5", "--quarantine-after", "2", "--late-timeout", "30"};
  o.job.srun_args = {"--cpu-bind=cores"};
  o.time = "4:00:00";
  o.partition = "gpu";
  o.job_name = "gpt";
  o.sbatch_args = {"--mail-type=END"};
  auto job = PlanSubmit(o, Train(), Context());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->name, "gpt");
  EXPECT_EQ(job->dir, "/home/ann/work/trainflow-jobs/gpt");
  EXPECT_EQ(job->ranks_per_node, 8);
  EXPECT_EQ(job->checkpoint_dir, job->dir + "/checkpoints");
  const Words want = {"/opt/tf/trainflow", "slurm", "run", "--dir", job->dir, "--gpus-per-node", "8", "--min-nodes",
                      "1", "--requeue-budget", "10", "--max-restarts", "5", "--quarantine-after", "2",
                      "--late-timeout", "30", "--srun-arg=--cpu-bind=cores", "--", "train", "--model",
                      "configs/gpt2.json", "--train_data", "data/train.bin", "--checkpoint_dir",
                      job->dir + "/checkpoints", "--out_dir", job->dir + "/out"};
  EXPECT_EQ(job->run_argv, want);
  const std::string& s = job->script;
  EXPECT_TRUE(s.starts_with("#!/bin/bash\n# TrainFlow job gpt, written by `trainflow slurm submit` on "
                            "2026-01-02T03:04:05Z for ann.\n"))
      << s;
  for (const std::string line :
       {"# 2 nodes, 8 ranks on each (one per GPU)\n#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=8\n",
        "#SBATCH --gpus-per-node=8\n", "#SBATCH --time=4:00:00\n", "#SBATCH --partition=gpu\n",
        "#SBATCH --signal=B:USR1@120\n", "#SBATCH --requeue\n", "#SBATCH --open-mode=append\n",
        "#SBATCH --output=/home/ann/work/trainflow-jobs/gpt/slurm-%j.out\n", "#SBATCH --chdir=/home/ann/work\n",
        "#SBATCH --mail-type=END\n", "umask 077\n", "exec /opt/tf/trainflow slurm run --dir",
        " \\\n    -- train --model configs/gpt2.json"}) {
    EXPECT_TRUE(Contains(s, line)) << "lacks " << line << "\n" << s;
  }
  EXPECT_FALSE(Contains(s, "--mem=")) << s;
  for (const std::string& line : {std::string("#SBATCH --exclude"), std::string("--account")}) {
    EXPECT_FALSE(Contains(s, line)) << s;
  }
}

TEST(PlanSubmitTest, ConfiguredDirectoriesAreKeptAndS3CheckpointsGetTheJobsPrefix) {
  SubmitOptions o;
  o.job.dir = "jobs/x";
  o.job.group = "";
  o.job_name = "x";
  TrainJob t = Train();
  t.out_dir_default = false;
  t.checkpoint_dir = "s3://bucket/ckpt/";
  auto job = PlanSubmit(o, t, Context());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->dir, "/home/ann/work/jobs/x");
  EXPECT_EQ(job->checkpoint_dir, "s3://bucket/ckpt/ann/x");
  const Words tail(job->run_argv.end() - 2, job->run_argv.end());
  EXPECT_EQ(tail, (Words{"--checkpoint_dir", "s3://bucket/ckpt/ann/x"}));
  o.no_job_prefix = true;
  job = PlanSubmit(o, t, Context());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->checkpoint_dir, "s3://bucket/ckpt/");
  EXPECT_EQ(job->run_argv.back(), "data/train.bin") << "nothing added";
  o.job_name = "";
  job = PlanSubmit(o, t, Context());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->name, "trainflow-20260102-030405");
}

TEST(PlanSubmitTest, BadOptionsAreRefusedNamingTheFlag) {
  struct Case {
    std::function<void(SubmitOptions&)> set;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](SubmitOptions& o) { o.nodes = 0; }, "--nodes 0"},
      {[](SubmitOptions& o) { o.job.min_nodes = 3; }, "--min-nodes 3 > --nodes 1"},
      {[](SubmitOptions& o) { o.job.gpus_per_node = 2, o.job.ranks_per_node = 3; }, "one rank per GPU at most"},
      {[](SubmitOptions& o) { o.job_name = "-x"; }, "--job-name '-x'"},
      {[](SubmitOptions& o) { o.warning_s = 5; }, "--warning 5"},
      {[](SubmitOptions& o) { o.time = "2"; }, "leaves no time before the --warning"},
      {[](SubmitOptions& o) { o.time = "x"; }, "--time"},
      {[](SubmitOptions& o) { o.partition = "a b"; }, "--partition"},
      {[](SubmitOptions& o) { o.sbatch_args = {"--x\n#SBATCH --y"}; }, "--x"},
      {[](SubmitOptions& o) { o.job.srun_args = {"a\nb"}; }, "--srun-arg"},
      {[](SubmitOptions& o) { o.exclude = "n[1-"; }, "--exclude"},
      {[](SubmitOptions& o) { o.job.dir = "/tmp/a b"; }, "--dir"},
      {[](SubmitOptions& o) { o.job.group = "no-such-group-anywhere"; }, "--group 'no-such-group-anywhere'"},
  };
  for (const Case& c : cases) {
    SubmitOptions o;
    o.job_name = "j";
    c.set(o);
    auto job = PlanSubmit(o, Train(), Context());
    ASSERT_FALSE(job.ok()) << c.want;
    EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument) << job.status().ToString();
    EXPECT_TRUE(Contains(job.status().message(), c.want)) << c.want << ": " << job.status().ToString();
  }
}

TEST(JobDirTest, FilesAreAtomicOwnerOnlyAndReadBack) {
  testing_util::TestDir tmp("slurm_job");
  const std::string dir = tmp.path() + "/job";
  ASSERT_TRUE(PrepareJobDir(dir, "").ok());
  EXPECT_EQ(Mode(dir), 0700u);
  ASSERT_TRUE(WriteJobFile(dir + "/job.json", "{\"name\": \"j\", \"exclude\": [\"n2\"]}\n", "").ok());
  EXPECT_EQ(Mode(dir + "/job.json"), 0600u);
  ASSERT_TRUE(WriteJobFile(dir + "/job.sbatch", "#!/bin/bash\n", "", /*executable=*/true).ok());
  EXPECT_EQ(Mode(dir + "/job.sbatch"), 0700u);
  EXPECT_EQ(ReadJobJson(dir + "/job.json").value("name", ""), "j");
  EXPECT_EQ(ReadJobJson(dir + "/missing.json"), nlohmann::json::object());
  std::ofstream(dir + "/bad.json") << "{\"name\": ";
  EXPECT_EQ(ReadJobJson(dir + "/bad.json"), nlohmann::json::object()) << "a damaged file reads as {}";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_FALSE(e.path().string().find(".tmp") != std::string::npos) << "a temp file is left: " << e.path();
  }

  auto excluded = AddExcludedNodes(dir, "", {"n9", "n1", "n2"});
  ASSERT_TRUE(excluded.ok()) << excluded.status().ToString();
  EXPECT_EQ(*excluded, (Words{"n1", "n2", "n9"}));
  EXPECT_EQ(ReadJobJson(dir + "/job.json").value("name", ""), "j") << "the rest of job.json is kept";

  launch::ResourceUsage u;
  u.node_seconds = 7200;
  u.tokens = 1000;
  RunRecord r;
  r.job_id = "41";
  r.outcome = "time_warning";
  ASSERT_TRUE(RecordUsage(dir, "", u, r).ok());
  u.node_seconds = 10800;
  r.job_id = "42";
  r.run = 2;
  r.outcome = "finished";
  auto usage = RecordUsage(dir, "", u, r);
  ASSERT_TRUE(usage.ok()) << usage.status().ToString();
  const nlohmann::json back = ReadJobJson(dir + "/usage.json");
  EXPECT_EQ(back, *usage);
  EXPECT_DOUBLE_EQ(back.value("node_hours", 0.0), 3.0);
  ASSERT_EQ(back["runs"].size(), 2u);
  EXPECT_EQ(back["runs"][0]["job_id"], "41");
  EXPECT_EQ(back["runs"][1]["outcome"], "finished");
  EXPECT_EQ(Mode(dir + "/usage.json"), 0600u);
}

TEST(AllocationTest, RanksPerNodeComeFromTheFlagTheTasksOrTheGpus) {
  Allocation a;
  a.job_id = "7";
  a.nodelist = "n[1-3]";
  a.tasks_per_node = "2(x2),1";
  JobOptions o;
  auto hosts = AllocationHosts(o, a);
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  ASSERT_EQ(hosts->size(), 3u);
  EXPECT_EQ((*hosts)[0].name, "n1");
  EXPECT_EQ((*hosts)[1].slots, 2);
  EXPECT_EQ((*hosts)[2].slots, 1);
  o.ranks_per_node = 4;
  EXPECT_EQ((*AllocationHosts(o, a))[2].slots, 4);
  o.ranks_per_node = 0;
  o.gpus_per_node = 8;
  a.tasks_per_node = "";
  EXPECT_EQ((*AllocationHosts(o, a))[0].slots, 8);
  a.nodelist = "n[1-";
  EXPECT_TRUE(Contains(AllocationHosts(o, a).status().ToString(), "SLURM_JOB_NODELIST"));
  a.nodelist = "n1";
  a.tasks_per_node = "x";
  o.gpus_per_node = 0;
  EXPECT_TRUE(Contains(AllocationHosts(o, a).status().ToString(), "SLURM_TASKS_PER_NODE"));
}

TEST(AllocationTest, TheSupervisorGetsTheJobsHostsSrunAndTheFlagsGiven) {
  Allocation a;
  a.job_id = "7";
  a.nodelist = "n1";
  a.cpus_per_task = "6";
  a.requeues = 2;
  JobOptions o;
  o.dir = "/jobs/j";
  o.gpus_per_node = 2;
  o.min_nodes = 1;
  o.srun_args = {"--cpu-bind=cores"};
  launch::LaunchOptions flags;
  flags.max_restarts = 4;
  flags.late_timeout_s = 17;
  const std::vector<launch::HostEntry> hosts = {{"n1", 2}};
  const launch::LaunchOptions l = JobLaunchOptions(o, Train(), a, hosts, flags, "secret");
  EXPECT_EQ(l.max_restarts, 4);
  EXPECT_EQ(l.late_timeout_s, 17);
  EXPECT_EQ(l.min_ranks, 2);
  EXPECT_EQ(l.heartbeat_host, "127.0.0.1") << "one node";
  EXPECT_EQ(l.launcher, "srun");
  EXPECT_TRUE(l.trainflow.ends_with("slurm_job_test")) << "the ranks run this binary: " << l.trainflow;
  EXPECT_EQ(l.slurm_job_id, "7");
  EXPECT_EQ(l.srun_args, (Words{"--cpus-per-task=6", "--cpu-bind=cores"}));
  EXPECT_EQ(l.state_dir, "/jobs/j/launch");
  EXPECT_EQ(l.global_rows, 4 * 2 * 2);
  EXPECT_EQ(l.tokens_per_step, 4 * 2 * 2 * 64);
  EXPECT_EQ(l.accounted_gpus, 2);
  EXPECT_EQ(l.requeues, 2);
  EXPECT_EQ(l.metrics_token, "secret");
  EXPECT_FALSE(l.wait_for_hosts);
  const Words tail(l.train_args.end() - 4, l.train_args.end());
  EXPECT_EQ(tail, (Words{"--metrics_addr", "127.0.0.1:0", "--metrics_token_file", "/jobs/j/metrics.token"}));
  o.srun_args = {"--cpus-per-task=2"};
  o.heartbeat_addr = "10.0.0.5";
  const launch::LaunchOptions given = JobLaunchOptions(o, Train(), a, hosts, flags, "secret");
  EXPECT_EQ(given.srun_args, (Words{"--cpus-per-task=2"}));
  EXPECT_EQ(given.heartbeat_host, "10.0.0.5");
}

}  // namespace
}  // namespace tf::slurm
