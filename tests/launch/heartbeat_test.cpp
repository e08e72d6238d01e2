// The supervisor's heartbeat channel (launch/heartbeat.h) over real loopback sockets: framing and
// authentication, commands both ways, reconnection, and what a stranger or a replay gets.
#include "launch/heartbeat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/progress.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
using Event = HeartbeatServer::Event;

TEST(HeartbeatSessionTest, SealsAndOpensBothWays) {
  HeartbeatSession server("secret", "aa", "bb", true), client("secret", "aa", "bb", false);
  for (int i = 0; i < 3; ++i) {
    std::string line = client.Seal({{"type", "hb"}, {"step", i}});
    line.pop_back();  // '\n'
    auto body = server.Open(line);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ((*body)["step"], i);
  }
  std::string down = server.Seal({{"type", "abort"}});
  down.pop_back();
  EXPECT_TRUE(client.Open(down).ok());
}

TEST(HeartbeatSessionTest, RejectsTamperingReplayReflectionAndOtherKeys) {
  HeartbeatSession server("secret", "aa", "bb", true), client("secret", "aa", "bb", false);
  std::string line = client.Seal({{"type", "hb"}, {"step", 1}});
  line.pop_back();
  std::string tampered = line;
  tampered.replace(tampered.find("\"step\":1"), 8, "\"step\":9");
  EXPECT_FALSE(server.Open(tampered).ok());
  ASSERT_TRUE(server.Open(line).ok());
  EXPECT_FALSE(server.Open(line).ok()) << "a replayed frame must be refused";
  // A frame the server sent, reflected back at it, has the wrong direction.
  HeartbeatSession server2("secret", "aa", "bb", true);
  std::string own = server2.Seal({{"type", "hb"}});
  own.pop_back();
  HeartbeatSession server3("secret", "aa", "bb", true);
  EXPECT_FALSE(server3.Open(own).ok());
  // Another secret, or another connection's nonces.
  HeartbeatSession other("other", "aa", "bb", false), other_nonce("secret", "aa", "cc", false);
  std::string a = other.Seal({{"type", "hb"}}), b = other_nonce.Seal({{"type", "hb"}});
  a.pop_back();
  b.pop_back();
  HeartbeatSession fresh("secret", "aa", "bb", true);
  EXPECT_FALSE(fresh.Open(a).ok());
  EXPECT_FALSE(fresh.Open(b).ok());
  EXPECT_FALSE(fresh.Open("garbage").ok());
  EXPECT_FALSE(fresh.Open("0 1 {}").ok());
}

// Polls the server until `pred` holds over the events seen so far (or 10 s pass).
std::vector<Event> PollUntil(HeartbeatServer& s, const std::function<bool(const std::vector<Event>&)>& pred) {
  std::vector<Event> all;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred(all) && std::chrono::steady_clock::now() < end) {
    for (Event& e : s.Poll(0.05)) all.push_back(std::move(e));
  }
  return all;
}

bool Has(const std::vector<Event>& events, Event::Kind kind, const std::string& type = "") {
  for (const Event& e : events) {
    if (e.kind == kind && (type.empty() || e.body.value("type", "") == type)) return true;
  }
  return false;
}

TEST(HeartbeatTest, ClientSendsIdentityHeartbeatsAndMessagesAndGetsCommands) {
  auto server = HeartbeatServer::Listen("127.0.0.1", 0, "s3cret");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::mutex mu;
  std::vector<json> commands;
  HeartbeatClientOptions o;
  o.address = "127.0.0.1:" + std::to_string((*server)->port());
  o.secret = "s3cret";
  o.interval_s = 0.05;
  o.identity = {{"rank", 3}, {"generation", 7}};
  SetPhase(Phase::kCompute);
  SetStepsDone(42);
  auto client = HeartbeatClient::Start(o, [&](const json& c) {
    std::lock_guard<std::mutex> lock(mu);
    commands.push_back(c);
  });
  ASSERT_TRUE(client.ok());
  auto events = PollUntil(**server, [](const std::vector<Event>& ev) {
    int hb = 0;
    for (const Event& e : ev) hb += e.kind == Event::kMessage && e.body.value("type", "") == "hb";
    return hb >= 3;
  });
  ASSERT_TRUE(Has(events, Event::kHello));
  int conn = -1;
  for (const Event& e : events) {
    if (e.kind == Event::kHello) {
      EXPECT_EQ(e.body["rank"], 3);
      EXPECT_EQ(e.body["generation"], 7);
      conn = e.conn;
    }
    if (e.kind == Event::kMessage) {
      EXPECT_EQ(e.body["phase"], "compute");
      EXPECT_EQ(e.body["step"], 42);
    }
  }
  (*client)->Send({{"type", "failed"}, {"step", 41}});
  events = PollUntil(**server, [](const std::vector<Event>& ev) { return Has(ev, Event::kMessage, "failed"); });
  EXPECT_TRUE(Has(events, Event::kMessage, "failed"));
  ASSERT_TRUE((*server)->Send(conn, {{"type", "rescue"}, {"mode", "write"}}));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    std::lock_guard<std::mutex> lock(mu);
    if (!commands.empty()) break;
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_EQ(commands[0]["mode"], "write");
}

TEST(HeartbeatTest, ClientReconnectsToANewServerOnTheSamePort) {
  auto server = HeartbeatServer::Listen("127.0.0.1", 0, "k");
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  HeartbeatClientOptions o;
  o.address = "127.0.0.1:" + std::to_string(port);
  o.secret = "k";
  o.interval_s = 0.05;
  o.identity = {{"rank", 0}};
  auto client = HeartbeatClient::Start(o, [](const json&) {});
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(Has(PollUntil(**server, [](const auto& ev) { return Has(ev, Event::kHello); }), Event::kHello));
  server->reset();  // the supervisor dies
  auto again = HeartbeatServer::Listen("127.0.0.1", port, "k");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto events = PollUntil(**again, [](const auto& ev) { return Has(ev, Event::kMessage, "hb"); });
  EXPECT_TRUE(Has(events, Event::kHello));
  EXPECT_TRUE(Has(events, Event::kMessage, "hb"));
}

TEST(HeartbeatTest, WrongSecretAndStrangersAreRejected) {
  auto server = HeartbeatServer::Listen("127.0.0.1", 0, "right");
  ASSERT_TRUE(server.ok());
  HeartbeatClientOptions o;
  o.address = "127.0.0.1:" + std::to_string((*server)->port());
  o.secret = "wrong";
  o.interval_s = 0.05;
  auto client = HeartbeatClient::Start(o, [](const json&) {});
  ASSERT_TRUE(client.ok());
  auto events = PollUntil(**server, [](const auto& ev) { return Has(ev, Event::kRejected); });
  EXPECT_TRUE(Has(events, Event::kRejected));
  EXPECT_FALSE(Has(events, Event::kHello));
  EXPECT_FALSE(Has(events, Event::kMessage));
  client->reset();
  // A raw stranger: a plain-text line, then an endless line.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string junk = "HELLO zz\n{\"type\":\"hello\",\"rank\":0}\n";
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  events = PollUntil(**server, [](const auto& ev) { return Has(ev, Event::kRejected); });
  EXPECT_TRUE(Has(events, Event::kRejected));
  EXPECT_FALSE(Has(events, Event::kHello));
  ::close(fd);
  EXPECT_EQ((*server)->connections(), 0);
}

TEST(HeartbeatTest, IdleStrangersAreBoundedAndARankStillGetsIn) {
  auto server = HeartbeatServer::Listen("127.0.0.1", 0, "k");
  ASSERT_TRUE(server.ok());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::vector<int> strangers;
  for (int i = 0; i < 300; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    strangers.push_back(fd);
    if (i % 16 == 0) (void)(*server)->Poll(0);
  }
  for (int i = 0; i < 20; ++i) (void)(*server)->Poll(0.01);
  EXPECT_LE((*server)->connections(), 64) << "idle connections waiting to authenticate are bounded";
  // A rank connecting now authenticates and heartbeats although the strangers stay connected.
  HeartbeatClientOptions o;
  o.address = "127.0.0.1:" + std::to_string((*server)->port());
  o.secret = "k";
  o.interval_s = 0.05;
  o.identity = {{"rank", 0}};
  auto client = HeartbeatClient::Start(o, [](const json&) {});
  ASSERT_TRUE(client.ok());
  auto events = PollUntil(**server, [](const auto& ev) { return Has(ev, Event::kMessage, "hb"); });
  EXPECT_TRUE(Has(events, Event::kHello));
  EXPECT_TRUE(Has(events, Event::kMessage, "hb"));
  for (int fd : strangers) ::close(fd);
}

TEST(HeartbeatTest, BadOptionsAreErrors) {
  HeartbeatClientOptions o;
  o.address = "127.0.0.1:1";
  EXPECT_FALSE(HeartbeatClient::Start(o, [](const json&) {}).ok()) << "no secret";
  o.secret = "x";
  o.address = "not an address";
  EXPECT_FALSE(HeartbeatClient::Start(o, [](const json&) {}).ok());
  o.address = "127.0.0.1:0";
  EXPECT_FALSE(HeartbeatClient::Start(o, [](const json&) {}).ok()) << "no port";
  EXPECT_FALSE(HeartbeatServer::Listen("127.0.0.1", 0, "").ok());
  EXPECT_FALSE(HeartbeatServer::Listen("not-an-ip", 0, "x").ok());
}

}  // namespace
}  // namespace tf::launch
