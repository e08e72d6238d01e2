// The supervisor's state machine (launch/supervisor_machine.h) driven through a fake cluster: a
// fake clock, launcher, remote shell and heartbeat transport (launch/seams.h) stand in for time,
// mpirun, ssh and the ranks, so every row of docs/fault-tolerance.md's detection table, the rescue
// exchange, the restart budget and backoff, adoption, quarantine, readmission and resize run in
// milliseconds without a process. The real job control (launch/job_control.h) builds the mpirun
// command lines and the probe scripts the fakes answer.
#include "launch/supervisor_machine.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/fault_env.h"
#include "launch/protocol.h"
#include "tests/test_dir.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
using Event = HeartbeatTransport::Event;
namespace msg = protocol::msg;
namespace field = protocol::field;

// What a simulated rank does.
enum class Mode {
  kTrain,     // heartbeats and steps every interval
  kStopped,   // SIGSTOP: silent, /proc says T
  kSilent,    // alive (S), silent: late
  kStalled,   // heartbeats without progress: hung
};

struct FakeRank {
  int rank = 0;
  int64_t generation = 0;
  std::string host;
  int64_t pid = 0;
  int conn = -1;
  bool connected = false, alive = true, said_hello = false;
  Mode mode = Mode::kTrain;
  int64_t step = 0;
  uint64_t progress = 0;
  double next_hb = 0;
  std::string hash = "00000000000000aa";
};

// One object for the clock, the launcher, the remote shell and the transport: the cluster.
class FakeCluster : public Clock, public ProcessLauncher, public RemoteShell, public HeartbeatTransport {
 public:
  // ---- knobs the tests set ----
  int64_t start_step = 0;       // where every generation resumes
  int64_t finish_at = 5;        // ranks exit 0 after this step
  bool connect = true;          // the ranks connect (false: they never start)
  int64_t launcher_fails = 0;   // generations up to this one: mpirun exits with 1 after 2 s, no rank starts
  std::set<std::string> unreachable, cut_off, unhealthy;
  // Called at each heartbeat of a training rank (after its step advanced): the test's faults.
  std::function<void(FakeRank&)> on_step;
  // Called when a rank gets "abort": by default it reports a retryable failure and lingers.
  std::function<void(FakeRank&)> on_abort;

  // ---- what the tests read ----
  std::vector<double> launches;           // Mono() of each launch
  std::vector<std::vector<std::string>> argvs;
  std::vector<json> to_ranks;             // every command sent, with "to" = rank
  int discards = 0, commits = 0;
  std::vector<std::string> killed;        // "host:pid" of the kill scripts
  std::vector<std::string> health_checked;

  double interval = 1.0;
  std::map<int, FakeRank> ranks;          // current generation
  int64_t mpirun_pid = 0, mpirun_start = 42;
  bool mpirun_alive = false;
  int mpirun_status = 0;
  int port_listened = -1;

  // ---- Clock ----
  double Mono() override { return now_; }
  double Wall() override { return 1.7e9 + now_; }
  void Sleep(double s) override { now_ += s; }

  // ---- ProcessLauncher ----
  StatusOr<int64_t> Start(const LaunchCommand& c) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    launches.push_back(now_);
    argvs.push_back(c.argv);
    int64_t generation = 0;
    for (const auto& [k, v] : c.env) {
      if (k == "TRAINFLOW_LAUNCH_GENERATION") generation = std::stoll(v);
    }
    ranks.clear();
    generation_ = generation;
    int rank = 0;
    for (size_t i = 0; i + 1 < c.argv.size(); ++i) {
      if (c.argv[i] != "--host") continue;
      const std::string h = c.argv[i + 1];
      const std::string name = h.substr(0, h.find(':'));
      const int n = std::stoi(h.substr(h.find(':') + 1));
      for (int k = 0; k < n; ++k, ++rank) {
        FakeRank r;
        r.rank = rank;
        r.generation = generation;
        r.host = name;
        r.pid = next_pid_++;
        r.step = start_step;
        r.next_hb = now_ + 0.1;
        ranks[rank] = r;
      }
    }
    mpirun_pid = next_pid_++;
    mpirun_alive = true;
    mpirun_status = 0;
    return mpirun_pid;
  }
  bool Ended(int64_t pid, int* status) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (pid != mpirun_pid || mpirun_alive) return false;
    *status = mpirun_status;
    return true;
  }
  bool Running(int64_t pid, int64_t start_time) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return pid == mpirun_pid && start_time == mpirun_start && mpirun_alive;
  }
  int64_t StartTime(int64_t pid) override { return mpirun_start; }
  void KillSession(int64_t pid) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (pid != mpirun_pid) return;
    mpirun_alive = false;
    mpirun_status = 9;  // killed by SIGKILL
    for (auto& [n, r] : ranks) Die(r);
  }
  void Reap(int64_t) override {}
  std::optional<std::string> Stat(int64_t) override { return std::nullopt; }
  std::string Cmdline(int64_t) override { return ""; }
  void Kill(int64_t) override {}

  // ---- RemoteShell ----
  int Run(const std::string& host, const std::string& script, double, std::string* out) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (script.find("health --quiet") != std::string::npos) {
      health_checked.push_back(host);
      return unhealthy.count(host) ? 1 : 0;
    }
    if (unreachable.count(host)) return 255;
    std::smatch m;
    if (std::regex_search(script, m, std::regex(R"(cat /proc/(\d+)/stat)"))) {
      FakeRank* r = ByPid(std::stoll(m[1]));
      if (r == nullptr || !r->alive) return 1;
      *out = fmt::format("{} (trainflow) {} 1 2 3", r->pid, r->mode == Mode::kStopped ? 'T' : 'S');
      return 0;
    }
    if (script.find("health --reach") != std::string::npos) return cut_off.count(host) ? kExitRetryable : 0;
    if (std::regex_search(script, m, std::regex(R"(for p in (\d+) )"))) {
      killed.push_back(fmt::format("{}:{}", host, m[1].str()));
      if (FakeRank* r = ByPid(std::stoll(m[1]))) Die(*r);
      return 0;
    }
    return 0;
  }
  int RunHere(const std::vector<std::string>&, double, std::string*) override { return 0; }
  bool IsLocal(const std::string&) override { return false; }

  // ---- HeartbeatTransport ----
  int port() const override { return 7777; }
  std::vector<Event> Poll(double timeout_s) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    now_ += timeout_s;
    if (mpirun_alive && generation_ <= launcher_fails && now_ - launches.back() > 2) {
      mpirun_alive = false;
      mpirun_status = 1 << 8;  // exit 1
    }
    for (auto& [n, r] : ranks) {
      if (!r.alive || now_ < r.next_hb) continue;
      r.next_hb = now_ + interval;
      if (!r.said_hello) {
        if (!connect || generation_ <= launcher_fails) continue;
        r.said_hello = r.connected = true;
        r.conn = next_conn_++;
        Push(Event::kHello, r.conn,
              {{field::kType, msg::kHello}, {field::kRank, r.rank}, {field::kGeneration, r.generation},
               {field::kHost, r.host}, {field::kPid, r.pid}, {field::kPpid, r.pid - 1}});
        continue;
      }
      if (!r.connected || r.mode == Mode::kStopped || r.mode == Mode::kSilent || lingering_.count(n)) continue;
      if (r.mode == Mode::kTrain) {
        if (r.step >= finish_at) {
          Goodbye(r, 0);
          continue;
        }
        ++r.step;
        ++r.progress;
        if (on_step) on_step(r);
        if (!r.alive || !r.connected || r.mode != Mode::kTrain) continue;
      }
      Push(Event::kMessage, r.conn,
            {{field::kType, msg::kHeartbeat}, {field::kStep, r.step}, {field::kPhase, "compute"},
             {field::kProgress, r.progress}, {field::kCheckpoint, r.step}, {field::kStepTime, Wall()},
             {field::kStartStep, start_step}});
    }
    std::vector<Event> out;
    out.swap(events_);
    return out;
  }
  bool Send(int conn, const json& body) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    FakeRank* r = ByConn(conn);
    if (r == nullptr) return false;
    json logged = body;
    logged["to"] = r->rank;
    to_ranks.push_back(logged);
    const std::string type = body.value(field::kType, "");
    if (type == msg::kStop) {
      Goodbye(*r, kExitStopped);
    } else if (type == msg::kAbort) {
      if (on_abort) {
        on_abort(*r);
      } else {
        Fail(*r, kExitRetryable);
      }
    } else if (type == msg::kRescue) {
      const bool write = body.value(field::kMode, "") == protocol::kModeWrite;
      Push(Event::kMessage, conn,
            {{field::kType, write ? msg::kRescued : msg::kHash}, {field::kOk, true}, {field::kStep, r->step},
             {field::kHash, r->hash}, {field::kAlready, false}, {field::kSeconds, 0.1}});
    } else if (type == msg::kCommit) {
      ++commits;
      Push(Event::kMessage, conn, {{field::kType, msg::kCommitted}, {field::kOk, true}, {field::kStep, r->step}});
    } else if (type == msg::kDiscard) {
      ++discards;
      Push(Event::kMessage, conn, {{field::kType, msg::kDiscarded}, {field::kOk, true}, {field::kStep, r->step}});
    } else if (type == msg::kExit) {
      Die(*r);
    }
    return true;
  }
  void Close(int conn) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (FakeRank* r = ByConn(conn)) r->connected = false;
  }

  // ---- faults, from on_step (the lock is held) ----
  // The process dies: its connection closes without a goodbye.
  void Die(FakeRank& r) {
    if (!r.alive) return;
    r.alive = false;
    if (r.connected) {
      r.connected = false;
      Push(Event::kClosed, r.conn, json());
    }
    lingering_.erase(r.rank);
    MaybeEndMpirun();
  }
  // The rank reports its own failure and lingers for the rescue.
  void Fail(FakeRank& r, int code) {
    lingering_.insert(r.rank);
    Push(Event::kMessage, r.conn,
          {{field::kType, msg::kFailed}, {field::kExitCode, code}, {field::kError, "peer failure"},
           {field::kStep, r.step}, {field::kRescuable, code == kExitRetryable}});
  }

 private:
  void Push(Event::Kind kind, int conn, json body) {
    Event e{kind, conn, std::move(body), "fake", ""};
    events_.push_back(std::move(e));
  }
  void Goodbye(FakeRank& r, int code) {
    Push(Event::kMessage, r.conn, {{field::kType, msg::kExit}, {field::kExitCode, code}, {field::kStep, r.step}});
    r.alive = false;
    r.connected = false;
    Push(Event::kClosed, r.conn, json());
    MaybeEndMpirun();
  }
  void MaybeEndMpirun() {
    for (auto& [n, r] : ranks) {
      if (r.alive) return;
    }
    mpirun_alive = false;
  }
  FakeRank* ByConn(int conn) {
    for (auto& [n, r] : ranks) {
      if (r.conn == conn && r.alive) return &r;
    }
    return nullptr;
  }
  FakeRank* ByPid(int64_t pid) {
    for (auto& [n, r] : ranks) {
      if (r.pid == pid) return &r;
    }
    return nullptr;
  }

  std::recursive_mutex mu_;
  double now_ = 1000;
  int64_t next_pid_ = 5000;
  int next_conn_ = 1;
  int64_t generation_ = 0;
  std::vector<Event> events_;
  std::set<int> lingering_;
};

class FakeSignals : public SignalSource {
 public:
  void Install() override {}
  int stops() override { return stops_; }
  int warnings() override { return 0; }
  int stops_ = 0;
};

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    o_.hosts = {{"n1", 1}, {"n2", 1}};
    o_.min_ranks = 1;
    o_.max_ranks = 2;
    o_.max_restarts = 5;
    o_.state_dir = dir_.path() + "/launch";
    o_.heartbeat_interval_s = 1.0;
    o_.late_timeout_s = 20;
    o_.startup_timeout_s = 30;
    o_.rescue_timeout_s = 10;
    o_.global_rows = 8;
    o_.max_batch_size = 4;
    o_.has_checkpoints = true;
    o_.metrics_addr = "off";
    o_.trainflow = "/opt/trainflow";
    o_.train_args = {"train", "--model", "m.json"};
    o_.health_interval_s = 5;
    o_.backoff.first_s = 0;
    o_.backoff.base_s = 1;
    o_.backoff.factor = 2;
    o_.backoff.max_s = 60;
    o_.backoff.reset_after_s = 1e9;
  }
  SupervisorWorld World() {
    SupervisorWorld w;
    w.env = env_;
    w.clock = &c_;
    w.launcher = &c_;
    w.shell = &c_;
    w.signals = &signals_;
    w.pid = 4242;
    w.listen = [this](const std::string&, int port,
                      const std::string&) -> StatusOr<std::unique_ptr<HeartbeatTransport>> {
      c_.port_listened = port;
      return std::unique_ptr<HeartbeatTransport>(new Forward(&c_));
    };
    return w;
  }
  int RunIt() {
    Supervisor s(o_, &outcome_, World());
    return s.Run();
  }
  std::vector<json> Incidents() {
    std::vector<json> out;
    std::ifstream f(o_.state_dir + "/incidents.jsonl");
    for (std::string line; std::getline(f, line);) out.push_back(json::parse(line));
    return out;
  }
  // The first incident of `kind`; fails the test when there is none.
  json First(const std::string& kind) {
    for (const json& i : Incidents()) {
      if (i.value("kind", "") == kind) return i;
    }
    ADD_FAILURE() << "no incident of kind " << kind;
    return json::object();
  }
  json State() {
    std::ifstream f(o_.state_dir + "/state.json");
    return json::parse(f);
  }
  // The n-th launch's "-np" counts, as "n1:1,n2:1".
  std::string Placement(size_t n) {
    std::string out;
    const auto& argv = c_.argvs.at(n);
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--host") out += (out.empty() ? "" : ",") + argv[i + 1];
    }
    return out;
  }
  std::string Flag(size_t n, const std::string& flag) {
    const auto& argv = c_.argvs.at(n);
    for (size_t i = argv.size() - 1; i > 0; --i) {
      if (argv[i - 1] == flag) return argv[i];
    }
    return "";
  }

  // The transport the supervisor owns, forwarding to the cluster.
  class Forward : public HeartbeatTransport {
   public:
    explicit Forward(FakeCluster* c) : c_(c) {}
    int port() const override { return c_->port(); }
    std::vector<Event> Poll(double t) override { return c_->Poll(t); }
    bool Send(int conn, const json& body) override { return c_->Send(conn, body); }
    void Close(int conn) override { c_->Close(conn); }

   private:
    FakeCluster* c_;
  };

  testing_util::TestDir dir_{"supervisor"};
  LaunchOptions o_;
  FakeCluster c_;
  FakeSignals signals_;
  Env* env_ = Env::Default();
  SupervisorOutcome outcome_;
};

// Applies `fault` to rank `rank` of generation `generation` when it completes step `step`.
std::function<void(FakeRank&)> At(int64_t step, int rank, int64_t generation, std::function<void(FakeRank&)> fault) {
  return [=](FakeRank& r) {
    if (r.step == step && r.rank == rank && r.generation == generation) fault(r);
  };
}

TEST_F(SupervisorTest, RunsTheJobToTheEnd) {
  EXPECT_EQ(RunIt(), kExitOk);
  EXPECT_EQ(outcome_.reason, "finished");
  EXPECT_EQ(outcome_.final_step, 5);
  ASSERT_EQ(c_.argvs.size(), 1u);
  EXPECT_EQ(Placement(0), "n1:1,n2:1");
  EXPECT_EQ(Flag(0, "--batch_size"), "4");
  EXPECT_EQ(Flag(0, "--grad_accum_steps"), "1");
  EXPECT_EQ(State().value("status", ""), "done");
  EXPECT_EQ(State().value("restarts", -1), 0);
}

TEST_F(SupervisorTest, DeadRankIsDetectedRescuedAndRestarted) {
  c_.on_step = At(3, 1, 1, [this](FakeRank& r) { c_.Die(r); });
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("dead");
  EXPECT_EQ(i.value("rank", -1), 1);
  EXPECT_EQ(i.value("host", ""), "n2");
  EXPECT_TRUE(i["rescue"].value("ok", false)) << i.dump();
  EXPECT_EQ(i["rescue"].value("writer", -1), 0);
  EXPECT_EQ(c_.commits, 1);
  EXPECT_EQ(i.value("restart", 0), 1);
  EXPECT_EQ(c_.argvs.size(), 2u);
  EXPECT_EQ(c_.launches[1] - c_.launches[0] < 15, true);  // the first restart is immediate
}

TEST_F(SupervisorTest, StoppedRankIsNamedWithinTwoIntervals) {
  c_.on_step = At(3, 1, 1, [](FakeRank& r) { r.mode = Mode::kStopped; });
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("hung");
  EXPECT_EQ(i.value("rank", -1), 1);
  EXPECT_NE(i.value("detail", "").find("stopped (SIGSTOP"), std::string::npos) << i.dump();
  EXPECT_LE(i.value("detected_after_s", 99.0), 3.5);
  ASSERT_FALSE(c_.killed.empty());
  EXPECT_EQ(c_.killed[0].substr(0, 3), "n2:");  // the culprit is killed first, through the remote shell
}

TEST_F(SupervisorTest, LostHostDoesNotAnswerTheRemoteShell) {
  c_.on_step = At(3, 1, 1, [this](FakeRank& r) {
    r.mode = Mode::kSilent;
    c_.unreachable.insert("n2");
  });
  c_.on_abort = [this](FakeRank& r) {
    c_.unreachable.clear();  // the host comes back for the restart
    c_.Fail(r, kExitRetryable);
  };
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("lost_host");
  EXPECT_EQ(i.value("host", ""), "n2");
  EXPECT_NE(i.value("detail", "").find("did not answer the remote shell"), std::string::npos);
}

TEST_F(SupervisorTest, PartitionedRankIsCutOff) {
  c_.on_step = At(3, 1, 1, [this](FakeRank& r) {
    r.mode = Mode::kSilent;
    c_.cut_off.insert("n2");
  });
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("unresponsive");
  EXPECT_EQ(i.value("rank", -1), 1);
  EXPECT_NE(i.value("detail", "").find("network partition"), std::string::npos) << i.dump();
  EXPECT_FALSE(i.value("late", false));
  EXPECT_EQ(State()["failures_by_host"].value("n2", 0), 1);
}

TEST_F(SupervisorTest, LateRankIsNotAFailure) {
  c_.finish_at = 15;
  double silent_at = 0;
  c_.on_step = [&](FakeRank& r) {
    if (r.rank == 1 && r.step == 2 && silent_at == 0) {
      r.mode = Mode::kSilent;
      silent_at = c_.Mono();
    }
    // Silent for 8 s (under --late-timeout 20 s), then heartbeating again.
    FakeRank& late = c_.ranks[1];
    if (late.mode == Mode::kSilent && c_.Mono() - silent_at > 8) late.mode = Mode::kTrain;
  };
  EXPECT_EQ(RunIt(), kExitOk);
  EXPECT_EQ(State().value("late", 0), 1);
  EXPECT_EQ(State().value("restarts", -1), 0);
  EXPECT_TRUE(Incidents().empty());
}

TEST_F(SupervisorTest, LateRankBecomesUnresponsiveAfterTheLateTimeoutWithoutBlamingItsHost) {
  o_.quarantine.max_failures = 1;
  c_.on_step = At(3, 1, 1, [](FakeRank& r) { r.mode = Mode::kSilent; });
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("unresponsive");
  EXPECT_TRUE(i.value("late", false));
  EXPECT_GT(i.value("detected_after_s", 0.0), o_.late_timeout_s);
  EXPECT_TRUE(i["quarantined"].empty());
  EXPECT_EQ(State()["failures_by_host"].size(), 0u);
}

TEST_F(SupervisorTest, HungRankMakesNoProgress) {
  o_.hang_timeouts[Phase::kCompute] = 10;
  c_.on_step = At(3, 0, 1, [](FakeRank& r) { r.mode = Mode::kStalled; });
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("hung");
  EXPECT_EQ(i.value("rank", -1), 0);
  EXPECT_NE(i.value("detail", "").find("no progress: rank 0 on n1 (compute"), std::string::npos) << i.dump();
}

TEST_F(SupervisorTest, RanksOwnFailureCountsAgainstItsHost) {
  c_.on_step = At(3, 1, 1, [this](FakeRank& r) { c_.Fail(r, kExitIOError); });
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("failed");
  EXPECT_EQ(i.value("rank", -1), 1);
  EXPECT_EQ(i.value("exit_code", 0), kExitIOError);
  EXPECT_EQ(State()["failures_by_host"].value("n2", 0), 1);
}

TEST_F(SupervisorTest, BadInputStopsWithoutRestart) {
  c_.on_step = At(1, 0, 1, [this](FakeRank& r) { c_.Fail(r, kExitBadInput); });
  EXPECT_EQ(RunIt(), kExitBadInput);
  EXPECT_EQ(outcome_.reason, "bad_input");
  EXPECT_EQ(c_.argvs.size(), 1u);
}

TEST_F(SupervisorTest, LauncherThatDiesIsAFailure) {
  // mpirun of the first generation exits with 1 before any rank connects.
  c_.launcher_fails = 1;
  EXPECT_EQ(RunIt(), kExitOk);
  const json i = First("launcher");
  EXPECT_NE(i.value("detail", "").find("mpirun exited with 1"), std::string::npos) << i.dump();
  EXPECT_EQ(c_.argvs.size(), 2u);
}

TEST_F(SupervisorTest, RanksThatNeverStartHitTheStartupTimeout) {
  c_.connect = false;
  o_.max_restarts = 0;
  EXPECT_EQ(RunIt(), kExitRetryable);
  const json i = First("startup");
  EXPECT_NE(i.value("detail", "").find("did not start within 30 s"), std::string::npos) << i.dump();
  EXPECT_EQ(outcome_.reason, "budget");
}

TEST_F(SupervisorTest, FailedCrossCheckDiscardsTheRescue) {
  o_.hosts = {{"n1", 1}, {"n2", 1}, {"n3", 1}};
  o_.max_ranks = 3;
  o_.global_rows = 12;
  c_.on_step = At(3, 2, 1, [this](FakeRank& r) {
    c_.ranks[1].hash = "00000000000000bb";  // the survivors disagree
    c_.Die(r);
  });
  EXPECT_EQ(RunIt(), kExitOk);
  const json rescue = First("dead")["rescue"];
  EXPECT_EQ(rescue.value("writer", -1), 0);
  EXPECT_EQ(rescue.value("checker", -1), 1);
  EXPECT_EQ(rescue.value("cross_check", ""), "mismatch");
  EXPECT_FALSE(rescue.value("ok", true));
  EXPECT_TRUE(rescue.value("discarded", false));
  EXPECT_EQ(c_.discards, 1);
  EXPECT_EQ(c_.commits, 0);
  bool discard_to_writer = false;
  for (const json& m : c_.to_ranks) {
    if (m.value(field::kType, "") == msg::kDiscard) discard_to_writer = m.value("to", -1) == 0;
  }
  EXPECT_TRUE(discard_to_writer);
}

TEST_F(SupervisorTest, MatchingCrossCheckCommits) {
  o_.hosts = {{"n1", 1}, {"n2", 1}, {"n3", 1}};
  o_.max_ranks = 3;
  o_.global_rows = 12;
  c_.on_step = At(3, 2, 1, [this](FakeRank& r) { c_.Die(r); });
  EXPECT_EQ(RunIt(), kExitOk);
  const json rescue = First("dead")["rescue"];
  EXPECT_EQ(rescue.value("cross_check", ""), "match");
  EXPECT_TRUE(rescue.value("ok", false));
  EXPECT_EQ(c_.commits, 1);
  EXPECT_EQ(c_.discards, 0);
}

TEST_F(SupervisorTest, RestartBudgetAndBackoff) {
  o_.max_restarts = 3;
  o_.quarantine.max_failures = 100;
  c_.on_step = [this](FakeRank& r) {
    if (r.rank == 1 && r.step == 2) c_.Die(r);  // every generation
  };
  EXPECT_EQ(RunIt(), kExitRetryable);
  EXPECT_EQ(outcome_.reason, "budget");
  ASSERT_EQ(c_.launches.size(), 4u);  // the first launch and 3 restarts
  EXPECT_EQ(State().value("restarts", 0), 4);
  // Backoff: the first restart at once, then 1 s, 2 s (each generation runs ~2 s before it fails).
  const double run = c_.launches[1] - c_.launches[0];
  EXPECT_NEAR(c_.launches[2] - c_.launches[1], run + 1, 0.5);
  EXPECT_NEAR(c_.launches[3] - c_.launches[2], run + 2, 0.5);
}

TEST_F(SupervisorTest, AdoptsTheRunningJobAfterASupervisorRestart) {
  // A supervisor killed while its generation 3 ran: the job is still there.
  c_.interval = o_.heartbeat_interval_s;
  LaunchCommand cmd;
  cmd.argv = {"mpirun", "-np", "1", "--host", "n1:1", ":", "-np", "1", "--host", "n2:1"};
  cmd.env = {{"TRAINFLOW_LAUNCH_GENERATION", "3"}};
  ASSERT_TRUE(c_.Start(cmd).ok());
  c_.argvs.clear();
  c_.launches.clear();
  std::filesystem::create_directories(o_.state_dir);
  json job = {{"generation", 3}, {"mpirun_pid", c_.mpirun_pid}, {"mpirun_start", c_.mpirun_start},
              {"port", 7777}, {"world", 2}, {"batch_size", 4}, {"grad_accum_steps", 1},
              {"hosts", "n1 slots=1\nn2 slots=1\n"}, {"log", o_.state_dir + "/gen-0003.log"}};
  json st = {{"version", 1}, {"generation", 3}, {"restarts", 1}, {"status", "running"}, {"job", job}};
  std::ofstream(o_.state_dir + "/state.json") << st.dump();
  EXPECT_EQ(RunIt(), kExitOk);
  EXPECT_EQ(c_.port_listened, 7777);  // the same port: the ranks reconnect
  EXPECT_TRUE(c_.argvs.empty());       // nothing launched
  EXPECT_EQ(First("supervisor_restart").value("generation", 0), 3);
  EXPECT_EQ(State().value("restarts", 0), 1);  // the count of a supervisor that did not end goes on
}

TEST_F(SupervisorTest, ResumesWhenTheAdoptedJobIsGone) {
  std::filesystem::create_directories(o_.state_dir);
  json job = {{"generation", 3}, {"mpirun_pid", 99999}, {"mpirun_start", 1}, {"port", 7777}, {"world", 2},
              {"ranks", {{{"rank", 0}, {"host", "n1"}, {"pid", 123}, {"ppid", 122}}}}};
  json st = {{"version", 1}, {"generation", 3}, {"status", "running"}, {"job", job}};
  std::ofstream(o_.state_dir + "/state.json") << st.dump();
  EXPECT_EQ(RunIt(), kExitOk);
  ASSERT_FALSE(c_.killed.empty());
  EXPECT_EQ(c_.killed[0], "n1:123");  // what was left of it is ended
  ASSERT_EQ(c_.argvs.size(), 1u);
  EXPECT_EQ(State()["job"].is_null(), true);
  EXPECT_EQ(Flag(0, "--grad_accum_steps"), "1");
}

TEST_F(SupervisorTest, QuarantineShrinksReadmissionGrows) {
  o_.quarantine.max_failures = 1;
  c_.finish_at = 40;
  c_.unhealthy.insert("n2");
  c_.on_step = At(3, 1, 1, [this](FakeRank& r) { c_.Die(r); });
  auto base = c_.on_step;
  c_.on_step = [&, base](FakeRank& r) {
    base(r);
    // The host heals while generation 2 runs on n1 alone.
    if (r.generation == 2 && r.step == 10) c_.unhealthy.clear();
  };
  EXPECT_EQ(RunIt(), kExitOk);
  const json dead = First("dead");
  ASSERT_EQ(dead["quarantined"].size(), 1u);
  EXPECT_EQ(dead["quarantined"][0], "n2");
  ASSERT_GE(c_.argvs.size(), 3u);
  // Shrunk: one rank with twice the accumulation keeps the global batch of 8 rows.
  EXPECT_EQ(Placement(1), "n1:1");
  EXPECT_EQ(Flag(1, "--batch_size"), "4");
  EXPECT_EQ(Flag(1, "--grad_accum_steps"), "2");
  EXPECT_EQ(First("readmitted").value("host", ""), "n2");
  const json grow = First("grow");
  EXPECT_EQ(grow.value("from", 0), 1);
  EXPECT_EQ(grow.value("to", 0), 2);
  // Grown back at a checkpoint boundary: the stop, then 2 ranks again.
  EXPECT_EQ(Placement(2), "n1:1,n2:1");
  EXPECT_EQ(Flag(2, "--grad_accum_steps"), "1");
  EXPECT_GE(std::count(c_.health_checked.begin(), c_.health_checked.end(), "n2"), 2);
}

TEST_F(SupervisorTest, SigtermStopsTheRanksAtACheckpoint) {
  c_.finish_at = 50;
  c_.on_step = At(3, 0, 1, [this](FakeRank&) { signals_.stops_ = 1; });
  EXPECT_EQ(RunIt(), kExitStopped);
  EXPECT_EQ(outcome_.reason, "stopped");
  int stops = 0;
  for (const json& m : c_.to_ranks) stops += m.value(field::kType, "") == msg::kStop;
  EXPECT_EQ(stops, 2);
  EXPECT_EQ(c_.argvs.size(), 1u);
  EXPECT_EQ(State().value("ended", ""), "stopped");
}

TEST_F(SupervisorTest, StateWriteFailuresLeaveThePreviousState) {
  FaultInjectionEnv faulty(Env::Default());
  StateStore store(&faulty, o_.state_dir, false);
  ASSERT_TRUE(store.Lock(1).ok());
  ASSERT_TRUE(store.SaveState({{"version", 1}, {"generation", 1}}).ok());
  FaultOptions f;
  f.fail_rename_at = 1;
  faulty.Reset(f);
  EXPECT_FALSE(store.SaveState({{"version", 1}, {"generation", 2}}).ok());
  auto st = store.LoadState();
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->has_value());
  EXPECT_EQ((**st).value("generation", 0), 1);
  StateStore second(Env::Default(), o_.state_dir, false);
  EXPECT_NE(second.Lock(2).message().find("another supervisor (pid 1)"), std::string::npos);
}

}  // namespace
}  // namespace tf::launch
