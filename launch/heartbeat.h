// The supervisor's channel to the ranks of a job (launch/supervisor.h, launch/rank_agent.h):
// heartbeats up, commands down, over TCP with every message authenticated by the job's secret.
// Wire format (docs/fault-tolerance.md "Heartbeat protocol"): the server greets each connection
// with "trainflow-heartbeat 1 <server nonce>\n"; the client answers "HELLO <client nonce>\n"; every
// later line in either direction is "<mac> <seq> <json>\n" with mac = HMAC-SHA256(K, "<dir> <seq>
// <json>"), K = HMAC-SHA256(secret, "<server nonce> <client nonce>"), dir "c" (to the server) or
// "s", and seq 1, 2, 3, ... per direction — so a process without the secret can neither inject nor
// replay a heartbeat or a command. Lines are at most kMaxHeartbeatLine bytes.
//
// HeartbeatClient: one thread that connects (and reconnects: the supervisor may restart), sends
// the identity and then a heartbeat every interval (base/progress.h's phase, step and counter) and
// whatever Send() queued, and hands each command to the handler on its own thread. It never blocks
// the training thread. HeartbeatServer: single-threaded, driven by Poll(); bounded (connections,
// line length, 5 s to authenticate). Thread safety: the client's Send/connected from any thread;
// the server from one thread.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/net.h"
#include "base/random.h"
#include "base/status.h"

namespace tf::launch {

inline constexpr size_t kMaxHeartbeatLine = 64 * 1024;

// One direction-aware authenticated session (both ends of a connection hold one).
class HeartbeatSession {
 public:
  HeartbeatSession(const std::string& secret, const std::string& server_nonce, const std::string& client_nonce,
                   bool is_server);
  // "<mac> <seq> <json>\n" for `body` (advances the send sequence).
  std::string Seal(const nlohmann::json& body);
  // The body of a received line (without '\n'); an error when the MAC, the sequence or the JSON is wrong.
  StatusOr<nlohmann::json> Open(const std::string& line);

 private:
  std::string key_;
  char send_dir_, recv_dir_;
  uint64_t send_seq_ = 0, recv_seq_ = 0;
};

struct HeartbeatClientOptions {
  std::string address;          // "HOST:PORT" of the supervisor
  std::string secret;
  double interval_s = 1.0;      // between heartbeats
  nlohmann::json identity;      // sent first on every connection (rank, host, pid, generation, ...)
};

class HeartbeatClient {
 public:
  using CommandHandler = std::function<void(const nlohmann::json& command)>;
  // Starts the thread (connecting in the background). Errors: a malformed address or empty secret.
  static StatusOr<std::unique_ptr<HeartbeatClient>> Start(HeartbeatClientOptions options, CommandHandler handler);
  ~HeartbeatClient();  // stops and joins the thread (after trying to send what is queued, ~1 s at most)
  HeartbeatClient(const HeartbeatClient&) = delete;
  HeartbeatClient& operator=(const HeartbeatClient&) = delete;

  // Queues `body` (its "type" says what it is) and wakes the thread. Dropped when not connected
  // unless `keep` (then sent after the next connect).
  void Send(nlohmann::json body, bool keep = false);
  bool connected() const;
  // Sends a heartbeat now (a phase change worth reporting at once).
  void Poke();

 private:
  HeartbeatClient() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class HeartbeatServer {
 public:
  struct Event {
    enum Kind { kHello, kMessage, kClosed, kRejected } kind;
    int conn = -1;
    nlohmann::json body;  // kHello: the identity; kMessage: the message
    std::string peer;     // "ip:port"
    std::string error;    // kClosed / kRejected: why
  };
  // Binds host:port (port 0: any free port). Errors name the address.
  static StatusOr<std::unique_ptr<HeartbeatServer>> Listen(const std::string& host, int port, std::string secret);
  ~HeartbeatServer();
  HeartbeatServer(const HeartbeatServer&) = delete;
  HeartbeatServer& operator=(const HeartbeatServer&) = delete;

  int port() const;
  // Waits up to timeout_s for activity and returns what happened (possibly nothing).
  std::vector<Event> Poll(double timeout_s);
  // Sends to an authenticated connection; false when it is gone.
  bool Send(int conn, const nlohmann::json& body);
  void Close(int conn);
  int connections() const;

 private:
  HeartbeatServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tf::launch
