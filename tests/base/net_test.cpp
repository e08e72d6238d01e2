// Tests for base/net.h: host:port parsing, a listening socket (any free port, a port in use, a host
// that is not an IP literal), a connection with a deadline and why it failed, sending all of a
// buffer, the host name.
#include "base/net.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(NetTest, ParseHostPortAcceptsAndRejects) {
  StatusOr<HostPort> a = ParseHostPort("127.0.0.1:9470");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9470);
  a = ParseHostPort(":0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 0);
  a = ParseHostPort("[::1]:80");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 80);
  a = ParseHostPort("node-7.cluster:65535");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "node-7.cluster");
  for (const char* bad : {"9470", "host:", "host:http", "host:70000", "::1:80", "[::1]80", "h:-1", "h:123456"}) {
    const StatusOr<HostPort> r = ParseHostPort(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
}

TEST(NetTest, ListenConnectSend) {
  NetError error;
  const int listener = ListenTcp("127.0.0.1", 0, {}, &error);
  ASSERT_GE(listener, 0) << error.why;
  const int port = BoundPort(listener);
  ASSERT_GT(port, 0);

  // The port is taken: a second listener fails with EADDRINUSE (no SO_REUSEPORT sharing).
  EXPECT_LT(ListenTcp("127.0.0.1", port, {.non_blocking = true}, &error), 0);
  EXPECT_EQ(error.err, EADDRINUSE) << error.why;

  std::string why;
  const int client = ConnectWithin("127.0.0.1", port, 1.0, &why);
  ASSERT_GE(client, 0) << why;
  const int server = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  const std::string message(100000, 'x');  // more than one send() on a small socket buffer
  std::string received;
  EXPECT_TRUE(SendAllWithin(client, message, 5.0));
  ::shutdown(client, SHUT_WR);
  char buf[8192];
  for (ssize_t n; (n = ::read(server, buf, sizeof(buf))) > 0;) received.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(received, message);
  ::close(server);
  ::close(client);

  ::close(listener);
  EXPECT_LT(ConnectWithin("127.0.0.1", port, 1.0, &why), 0);
  EXPECT_NE(why.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << why;
  EXPECT_NE(why.find("refused"), std::string::npos) << why;
}

TEST(NetTest, SendToAClosedPeerFails) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[1]);
  EXPECT_FALSE(SendAllWithin(fds[0], "hello", 1.0));  // EPIPE, and no SIGPIPE
  ::close(fds[0]);
}

TEST(NetTest, NumericHostRefusesNames) {
  NetError error;
  EXPECT_LT(ListenTcp("not-an-ip", 0, {.numeric_host = true}, &error), 0);
  EXPECT_EQ(error.err, -1);
  EXPECT_NE(error.why.find("cannot resolve 'not-an-ip'"), std::string::npos) << error.why;
}

TEST(NetTest, HostNameIsThisMachines) {
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  EXPECT_EQ(HostName(), name);
}

}  // namespace
}  // namespace tf
