// The scheduling layer's command lines through the real binary: `trainflow launch`, `health` and
// `slurm submit` refuse what they cannot run (absurd numbers, a missing launcher, host names that a
// remote shell reads as options, command lines over the kernel's limit, values that would become
// lines or options of their own in an sbatch script) with exit 2 and a message, before anything
// runs, and leave nothing behind.
#include <sys/stat.h>

#include "engine/cli/supervisor_flags.h"
#include "tests/integration/cli_fixture.h"
#include "tests/test_net.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::kByteTiny;
using cli_testing::RunResult;
namespace fs = std::filesystem;

class LaunchCli : public CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    train_bin_ = TokenFile("train.bin", 400);
  }
  std::vector<std::string> Job() const {
    return {"--", "train", "--model", kByteTiny, "--train_data", train_bin_, "--max_steps", "1", "--batch_size", "1",
            "--seq_len", "8", "--sample_tokens", "0", "--eval_batches", "0", "--metrics_addr", "off", "--out_dir",
            Path("out")};
  }
  RunResult Launch(std::vector<std::string> flags) {
    std::vector<std::string> args = {"launch", "--state-dir", Path("launch"), "--metrics-addr", "off"};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto job = Job();
    args.insert(args.end(), job.begin(), job.end());
    return Run(args);
  }
  RunResult Submit(std::vector<std::string> flags) {
    std::vector<std::string> args = {"slurm", "submit", "--job-name", "j"};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto job = Job();
    args.insert(args.end(), job.begin(), job.end());
    return Run(args);
  }
  std::string train_bin_;
};

TEST_F(LaunchCli, AbsurdNumbersAndAMissingLauncherAreRefusedBeforeAnything) {
  struct Case {
    std::vector<std::string> flags;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--heartbeat-interval", "nan"}, "--heartbeat-interval"},
      {{"--heartbeat-interval", "inf"}, "--heartbeat-interval"},
      {{"--startup-timeout", "-1"}, "--startup-timeout"},
      {{"--rescue-timeout", "nan"}, "--rescue-timeout"},
      {{"--backoff-max", "-5"}, "--backoff-max"},
      {{"--late-timeout", "nan"}, "--late-timeout"},
      {{"--heartbeat-interval", "1", "--late-timeout", "1.5"}, "--late-timeout 1.5 s is shorter than two"},
      {{"--mpirun", "/nonexistent/mpirun"}, "--mpirun '/nonexistent/mpirun' is not an executable file"},
      {{"--mpirun", "no-such-launcher-anywhere"}, "not found on PATH"},
      {{"--heartbeat-addr", "junk:x"}, "--heartbeat-addr"},
      {{"--heartbeat-addr", "127.0.0.1:99999"}, "--heartbeat-addr"},
      {{"--hang-timeout", "=5"}, "a phase name before '='"},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult r = Launch(c.flags);
    EXPECT_EQ(r.exit_code, 2) << fmt::format("{}", fmt::join(c.flags, " ")) << "\n" << r;
    EXPECT_NE((r.out + r.err).find(c.needle), std::string::npos) << c.needle << "\n" << r;
    EXPECT_EQ((r.out + r.err).find("generation 1"), std::string::npos) << "nothing is launched\n" << r;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "no restart loop";
  }
}

TEST_F(LaunchCli, AHostNamedLikeAnOptionIsRefused) {
  std::ofstream(Path("hosts")) << "localhost slots=1\n-oProxyCommand=touch slots=1\n";
  const RunResult r = Launch({"--hostfile", Path("hosts"), "--heartbeat-addr", "127.0.0.1"});
  ExpectCleanFailure(r, {"line 2", "starts with '-'"});
}

TEST_F(LaunchCli, AHostfileOrStateThatIsNoRegularFileIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  fs::create_directories(Path("adir"));
  for (const std::string& h : {Path("fifo"), Path("adir")}) {
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult r = Launch({"--hostfile", h, "--heartbeat-addr", "127.0.0.1"});
    ExpectCleanFailure(r, {h, "not a regular file"});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  }
  // --status on a state dir whose state.json is a FIFO, a directory, or nested 100,000 deep.
  fs::create_directories(Path("st1"));
  ASSERT_EQ(::mkfifo(Path("st1/state.json").c_str(), 0600), 0);
  fs::create_directories(Path("st2/state.json"));
  fs::create_directories(Path("st3"));
  {
    std::ofstream deep(Path("st3/state.json"));
    deep << "{\"version\": 1, \"status\": ";
    for (int i = 0; i < 100000; ++i) deep << "{\"a\":";
    deep << "1";
    for (int i = 0; i < 100000; ++i) deep << "}";
    deep << "}";
  }
  // The supervisor's own files in its state dir: incidents.jsonl and a launch's log.
  for (const std::string name : {"incidents.jsonl", "gen-0001.log"}) {
    const std::string state = Path("sf-" + name);
    fs::create_directories(state);
    ASSERT_EQ(::mkfifo((state + "/" + name).c_str(), 0600), 0);
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = Run({"launch", "--np", "1", "--state-dir", state, "--metrics-addr", "off", "--max-restarts", "0",
                       "--mpirun", "/bin/false", "--", "train", "--model", kByteTiny, "--train_data", train_bin_,
                       "--max_steps", "1", "--metrics_addr", "off", "--out_dir", Path("o-" + name)});
    EXPECT_NE(r.exit_code, 0) << r;
    EXPECT_NE((r.out + r.err).find("FIFO"), std::string::npos) << r;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << name;
  }
  for (const auto& [dir, needle] : std::vector<std::pair<std::string, std::string>>{
           {"st1", "not a regular file"}, {"st2", "not a regular file"}, {"st3", "nested more than 64 levels"}}) {
    const RunResult r = Run({"launch", "--status", "--state-dir", Path(dir)});
    ExpectCleanFailure(r, {needle});
  }
}

TEST_F(LaunchCli, ACommandLineOverTheKernelsLimitIsABadInputNotARetry) {
  // 10,000 hosts: one mpirun app context each would exceed ARG_MAX. Nothing is started.
  std::ofstream hosts(Path("hosts"));
  for (int i = 0; i < 10000; ++i) hosts << fmt::format("node{:05d}.cluster.example slots=1\n", i);
  hosts.close();
  const RunResult r = Launch({"--hostfile", Path("hosts"), "--heartbeat-addr", "127.0.0.1", "--max-restarts", "3"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE((r.out + r.err).find("ARG_MAX"), std::string::npos) << r;
  EXPECT_EQ((r.out + r.err).find("restarting"), std::string::npos) << r;
}

TEST_F(LaunchCli, HealthReachTellsAnOpenPortFromAClosedOne) {
  testing_util::Listener open;
  const std::string addr = fmt::format("127.0.0.1:{}", open.port);
  RunResult r = Run({"health", "--reach", addr, "--timeout", "2"});
  EXPECT_EQ(r.exit_code, 0) << r;
  open.close();
  r = Run({"health", "--reach", addr, "--timeout", "2"});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_NE(r.err.find("cannot connect to " + addr), std::string::npos) << r;
  r = Run({"health", "--reach", "not an address"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

TEST_F(LaunchCli, SlurmValuesThatWouldInjectIntoTheScriptAreRefused) {
  struct Case {
    std::vector<std::string> flags;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--partition", "gpu\ntouch /tmp/x"}, "--partition"},
      {{"--qos", "high\n#SBATCH --uid=0"}, "--qos"},
      {{"--constraint", "a100 --uid=0"}, "--constraint"},
      {{"--account", "a --uid=0"}, "--account"},
      {{"--account", "-Aother"}, "starts with '-'"},
      {{"--mem", "lots"}, "--mem 'lots'"},
      {{"--mem", "200G\n"}, "--mem"},
      {{"--sbatch-arg=--mail-type=END --uid=0"}, "--sbatch-arg"},
      {{"--sbatch-arg=--mail-type=END\n#SBATCH --uid=0"}, "--sbatch-arg"},
      {{"--dir", Path("train.bin")}, "exists and is not a directory"},
      {{"--dir", Path("q\ntouch /tmp/x #")}, "--dir"},
      {{"--dir", Path("a b")}, "a space"},
      {{"--exclude", "a;b$(id)"}, "--exclude"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> flags = c.flags;
    flags.push_back("--dry-run");
    const RunResult r = Submit(flags);
    EXPECT_EQ(r.exit_code, 2) << c.needle << "\n" << r;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.needle << "\n" << r;
    EXPECT_EQ(r.out.find("#SBATCH"), std::string::npos) << "no script is printed\n" << r;
  }
  // Accepted values (a comma list, a feature expression, a size) make a script.
  const RunResult ok = Submit({"--partition", "gpu,debug", "--constraint", "a100&(ib|roce)", "--mem", "200G",
                               "--qos", "high", "--account", "team_a", "--dry-run"});
  EXPECT_EQ(ok.exit_code, 0) << ok;
  EXPECT_NE(ok.out.find("#SBATCH --constraint=a100&(ib|roce)"), std::string::npos) << ok;
}

TEST_F(LaunchCli, AnSbatchArgBeforeTheDoubleDashTakesOneWord) {
  // Right before the "--" that starts the train command.
  const RunResult r = Submit({"--dry-run", "--sbatch-arg=--mail-type=END"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("#SBATCH --mail-type=END\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("train"), std::string::npos) << "the train command is in the script\n" << r;
  const RunResult spaced = Submit({"--dry-run", "--sbatch-arg", "--mail-type=END"});
  EXPECT_EQ(spaced.exit_code, 0) << spaced;
  EXPECT_NE(spaced.out.find("#SBATCH --mail-type=END\n"), std::string::npos) << spaced;
}

TEST_F(LaunchCli, SubmitWithoutAClusterIsAConfigurationErrorAndLeavesNothing) {
  // No sbatch at all.
  RunResult r = Submit({"--sbatch", "/nonexistent/sbatch"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("/nonexistent/sbatch"), std::string::npos) << r;
  EXPECT_FALSE(fs::exists(Path("trainflow-jobs"))) << "nothing is written";
  // An sbatch that cannot reach its controller.
  const std::string fake = Path("sbatch");
  std::ofstream(fake) << "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Unable to contact slurm "
                         "controller (connect failure)' >&2\nexit 1\n";
  ::chmod(fake.c_str(), 0755);
  for (int attempt = 0; attempt < 2; ++attempt) {
    r = Submit({"--sbatch", fake});
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_NE(r.err.find("Unable to contact slurm controller"), std::string::npos) << r;
    EXPECT_NE(r.err.find("nothing was submitted"), std::string::npos) << r;
    EXPECT_FALSE(fs::exists(Path("trainflow-jobs"))) << "attempt " << attempt << " left a job directory";
  }
  // Into an existing directory: what was there stays, nothing new is left.
  fs::create_directories(Path("jobdir"));
  std::ofstream(Path("jobdir/keep")) << "x";
  r = Submit({"--sbatch", fake, "--dir", Path("jobdir")});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(fs::exists(Path("jobdir/keep")));
  EXPECT_FALSE(fs::exists(Path("jobdir/job.sbatch")));
  EXPECT_FALSE(fs::exists(Path("jobdir/job.sbatch.pending")));
}

TEST_F(LaunchCli, AnUnknownSlurmCommandIsNamed) {
  const RunResult r = Run({"slurm", "frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("unknown slurm command 'frobnicate'"), std::string::npos) << r;
  const RunResult none = Run({"slurm"});
  EXPECT_EQ(none.exit_code, 2) << none;
}

TEST_F(LaunchCli, SlurmTakesTheSupervisorFlagsOfLaunchAndPassesThemOn) {
  // The script's command as one line (it breaks long lines with " \\\n   ").
  auto flat = [](std::string s) {
    for (size_t at; (at = s.find(" \\\n   ")) != std::string::npos;) s.erase(at, 6);
    return s;
  };
  const RunResult defaults = Submit({"--dry-run"});
  ASSERT_EQ(defaults.exit_code, 0) << defaults;
  EXPECT_NE(flat(defaults.out).find("--requeue-budget 10 --max-restarts 10 --quarantine-after 2 "), std::string::npos)
      << defaults;
  EXPECT_EQ(defaults.out.find("--late-timeout"), std::string::npos) << "defaults are not repeated\n" << defaults;
  const RunResult r = Submit({"--dry-run", "--rescue-timeout", "90", "--hang-timeout", "compute=60", "--backoff-max",
                              "5", "--late-timeout", "30"});
  ASSERT_EQ(r.exit_code, 0) << r;
  for (const std::string part : {"--late-timeout 30", "--hang-timeout compute=60", "--rescue-timeout 90",
                                 "--backoff-max 5"}) {
    EXPECT_NE(flat(r.out).find(part), std::string::npos) << part << "\n" << r;
  }
  const RunResult bad = Submit({"--dry-run", "--hang-timeout", "nope=5"});
  EXPECT_EQ(bad.exit_code, 2) << bad;
  EXPECT_NE(bad.err.find("unknown phase 'nope'"), std::string::npos) << bad;
}

// ---- the supervisor's flags, without the binary ----------------------------------------------------

TEST(SupervisorFlagsTest, DefaultsAreTheSupervisorsAndRenderedFlagsParseBack) {
  const launch::LaunchOptions d;
  const SupervisorFlags f;
  EXPECT_EQ(f.max_restarts, d.max_restarts);
  EXPECT_EQ(f.quarantine_after, d.quarantine.max_failures);
  EXPECT_EQ(f.late_timeout_s, d.late_timeout_s);
  EXPECT_EQ(f.backoff_reset_s, d.backoff.reset_after_s);
  EXPECT_EQ(SupervisorFlagArgs(f), (std::vector<std::string>{"--max-restarts", std::to_string(d.max_restarts),
                                                             "--quarantine-after",
                                                             std::to_string(d.quarantine.max_failures)}));
  SupervisorFlags given;
  CLI::App app;
  AddSupervisorFlags(&app, &given);
  app.parse("--max-restarts 4 --heartbeat-interval 0.5 --late-timeout 7.5 --hang-timeout 30,compute=60 "
            "--startup-timeout 20 --rescue-timeout 9 --quarantine-after 1 --quarantine-window 60 --backoff-max 2 "
            "--backoff-reset 3",
            false);
  const std::vector<std::string> words = SupervisorFlagArgs(given);
  SupervisorFlags back;
  CLI::App again;
  AddSupervisorFlags(&again, &back);
  std::vector<std::string> reversed(words.rbegin(), words.rend());
  again.parse(reversed);
  EXPECT_EQ(SupervisorFlagArgs(back), words);
  launch::LaunchOptions o;
  ASSERT_TRUE(ApplySupervisorFlags(back, &o).ok());
  EXPECT_EQ(o.max_restarts, 4);
  EXPECT_EQ(o.heartbeat_interval_s, 0.5);
  EXPECT_EQ(o.late_timeout_s, 7.5);
  EXPECT_EQ(o.hang_timeouts.at(Phase::kData), 30);
  EXPECT_EQ(o.hang_timeouts.at(Phase::kCompute), 60);
  EXPECT_EQ(o.startup_timeout_s, 20);
  EXPECT_EQ(o.rescue_timeout_s, 9);
  EXPECT_EQ(o.quarantine.max_failures, 1);
  EXPECT_EQ(o.quarantine.window_s, 60);
  EXPECT_EQ(o.backoff.max_s, 2);
  EXPECT_EQ(o.backoff.reset_after_s, 3);
}

TEST(SupervisorFlagsTest, ApplyRefusesALateTimeoutUnderTwoIntervalsAndABadHangTimeout) {
  SupervisorFlags f;
  f.heartbeat_interval_s = 1;
  f.late_timeout_s = 1.5;
  launch::LaunchOptions o;
  Status s = ApplySupervisorFlags(f, &o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--late-timeout 1.5 s is shorter than two"), std::string::npos) << s.ToString();
  f.late_timeout_s = 60;
  for (const std::string bad : {"0", "x", "=5", "compute=", "nope=5", "2e6"}) {
    f.hang_timeouts = bad;
    s = ApplySupervisorFlags(f, &o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--hang-timeout"), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace tf
