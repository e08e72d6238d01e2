// The rank's side of the rescue exchange (launch/rank_agent.h) against a real heartbeat server on
// loopback, with a fake RescueTarget: the failure report, write / hash, commit and the discard
// that follows a failed cross-check, each answered as launch/protocol.h says.
#include "launch/rank_agent.h"

#include <stdlib.h>

#include <chrono>
#include <future>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "base/status.h"
#include "launch/heartbeat.h"
#include "launch/protocol.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
using Server = launch::HeartbeatServer;
namespace msg = protocol::msg;
namespace field = protocol::field;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

class FakeTarget : public RescueTarget {
 public:
  int64_t step() const override { return 7; }
  bool rescuable() const override { return true; }
  StatusOr<std::string> Hash() override { return std::string("00000000000000aa"); }
  StatusOr<Written> Write() override {
    ++writes;
    return Written{7, "00000000000000aa", false};
  }
  Status Commit() override {
    ++commits;
    return Status::OK();
  }
  Status Discard() override {
    ++discards;
    return discard_status;
  }
  int writes = 0, commits = 0, discards = 0;
  Status discard_status;
};

class RankAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = Server::Listen("127.0.0.1", 0, kSecret);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    ::setenv("TRAINFLOW_SUPERVISOR", ("127.0.0.1:" + std::to_string(server_->port())).c_str(), 1);
    ::setenv("TRAINFLOW_SUPERVISOR_SECRET", kSecret, 1);
    ::setenv("TRAINFLOW_HEARTBEAT_INTERVAL", "0.05", 1);
    ::setenv("TRAINFLOW_LAUNCH_GENERATION", "1", 1);
    auto agent = RankAgent::FromEnvironment();
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    ASSERT_NE(*agent, nullptr);
    agent_ = std::move(*agent);
    const std::optional<Server::Event> hello =
        Await([](const Server::Event& e) { return e.kind == Server::Event::kHello; });
    ASSERT_TRUE(hello.has_value());
    conn_ = hello->conn;
  }
  void TearDown() override {
    agent_.reset();
    for (const char* v : {"TRAINFLOW_SUPERVISOR", "TRAINFLOW_SUPERVISOR_SECRET", "TRAINFLOW_HEARTBEAT_INTERVAL",
                          "TRAINFLOW_LAUNCH_GENERATION"}) {
      ::unsetenv(v);
    }
  }

  // The first event (within 5 s) that `match` accepts.
  template <typename Match>
  std::optional<Server::Event> Await(Match match) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < end) {
      for (Server::Event& e : server_->Poll(0.05)) {
        if (match(e)) return std::move(e);
      }
    }
    return std::nullopt;
  }
  // The next message of type `type` from the rank.
  json AwaitMessage(const char* type) {
    auto e = Await([&](const Server::Event& e) {
      return e.kind == Server::Event::kMessage && e.body.value(field::kType, "") == type;
    });
    EXPECT_TRUE(e.has_value()) << "no '" << type << "' within 5 s";
    return e ? e->body : json::object();
  }
  // Lingers on another thread after a retryable failure; the first message is the failure report.
  std::future<int> StartLinger(FakeTarget* target) {
    auto f = std::async(std::launch::async, [this, target] {
      return agent_->Linger(target, Status::Unavailable("a peer is gone"), kExitRetryable);
    });
    const json failed = AwaitMessage(msg::kFailed);
    EXPECT_EQ(failed.value(field::kStep, int64_t{-1}), 7);
    EXPECT_TRUE(failed.value(field::kRescuable, false));
    EXPECT_EQ(failed.value(field::kExitCode, 0), kExitRetryable);
    return f;
  }
  int Exit(std::future<int>& linger) {
    server_->Send(conn_, {{field::kType, msg::kExit}, {field::kCode, kExitRetryable}, {field::kReason, "test"}});
    EXPECT_EQ(linger.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    return linger.get();
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<RankAgent> agent_;
  int conn_ = -1;
};

TEST_F(RankAgentTest, WritesAndCommitsTheRescue) {
  FakeTarget target;
  std::future<int> linger = StartLinger(&target);
  server_->Send(conn_, {{field::kType, msg::kRescue}, {field::kMode, protocol::kModeWrite}});
  const json written = AwaitMessage(msg::kRescued);
  EXPECT_TRUE(written.value(field::kOk, false));
  EXPECT_EQ(written.value(field::kHash, ""), "00000000000000aa");
  EXPECT_EQ(written.value(field::kStep, int64_t{-1}), 7);
  server_->Send(conn_, {{field::kType, msg::kCommit}});
  EXPECT_TRUE(AwaitMessage(msg::kCommitted).value(field::kOk, false));
  EXPECT_EQ(Exit(linger), kExitRetryable);
  EXPECT_EQ(target.writes, 1);
  EXPECT_EQ(target.commits, 1);
  EXPECT_EQ(target.discards, 0);
}

TEST_F(RankAgentTest, HashesForTheCrossCheck) {
  FakeTarget target;
  std::future<int> linger = StartLinger(&target);
  server_->Send(conn_, {{field::kType, msg::kRescue}, {field::kMode, protocol::kModeHash}});
  const json hashed = AwaitMessage(msg::kHash);
  EXPECT_TRUE(hashed.value(field::kOk, false));
  EXPECT_EQ(hashed.value(field::kHash, ""), "00000000000000aa");
  EXPECT_EQ(Exit(linger), kExitRetryable);
  EXPECT_EQ(target.writes, 0);
}

TEST_F(RankAgentTest, DiscardsTheRescueAfterAFailedCrossCheck) {
  FakeTarget target;
  std::future<int> linger = StartLinger(&target);
  server_->Send(conn_, {{field::kType, msg::kRescue}, {field::kMode, protocol::kModeWrite}});
  AwaitMessage(msg::kRescued);
  server_->Send(conn_, {{field::kType, msg::kDiscard}});
  const json discarded = AwaitMessage(msg::kDiscarded);
  EXPECT_TRUE(discarded.value(field::kOk, false));
  EXPECT_EQ(discarded.value(field::kStep, int64_t{-1}), 7);
  EXPECT_EQ(target.discards, 1);
  EXPECT_EQ(target.commits, 0);
  EXPECT_EQ(Exit(linger), kExitRetryable);
}

TEST_F(RankAgentTest, ADiscardThatFailsIsReported) {
  FakeTarget target;
  target.discard_status = Status::IOError("cannot delete 'step-7/part-rescue-r00000.json'");
  std::future<int> linger = StartLinger(&target);
  server_->Send(conn_, {{field::kType, msg::kDiscard}});
  const json discarded = AwaitMessage(msg::kDiscarded);
  EXPECT_FALSE(discarded.value(field::kOk, true));
  EXPECT_NE(discarded.value(field::kError, "").find("part-rescue"), std::string::npos);
  EXPECT_EQ(Exit(linger), kExitRetryable);
}

}  // namespace
}  // namespace tf::launch
