// TCP sockets as the endpoints of TrainFlow use them: host:port addresses, a listening socket, a
// connection with a deadline, and this machine's host name. Plain POSIX file descriptors: the
// caller owns what is returned and closes it. Thread-safe (no shared state).
#pragma once
#include <string>
#include <string_view>

#include "base/status.h"

namespace tf {

struct HostPort {
  std::string host;
  int port = 0;
};

// "HOST:PORT", "[IPv6]:PORT" or ":PORT" (host 127.0.0.1); the port is 0..65535. InvalidArgument
// naming the text otherwise.
StatusOr<HostPort> ParseHostPort(std::string_view text);

struct ListenOptions {
  bool numeric_host = false;  // the host must be an IP literal (no name lookup)
  bool non_blocking = false;
  int backlog = 64;
};

// Why a socket call failed: errno of the call (-1 when the host did not resolve) and a message.
struct NetError {
  int err = 0;
  std::string why;
};

// A listening TCP socket on host:port (port 0: any free port), close-on-exec, with SO_REUSEADDR
// only (a second process must not share the port). Returns the fd, or -1 with *error set.
int ListenTcp(const std::string& host, int port, const ListenOptions& options, NetError* error);
// The local port a socket is bound to; 0 when it cannot be read.
int BoundPort(int fd);
// A TCP connection to host:port (numeric or resolved) within timeout_s: a non-blocking socket with
// TCP_NODELAY, or -1 with the reason in *error (may be null).
int ConnectWithin(const std::string& host, int port, double timeout_s, std::string* error);
// Writes all of `data` to a socket (blocking or not) within timeout_s; false on an error, a closed
// peer or the deadline. Never raises SIGPIPE.
bool SendAllWithin(int fd, std::string_view data, double timeout_s);
// This machine's host name (gethostname); "" when the system cannot say.
std::string HostName();

}  // namespace tf
