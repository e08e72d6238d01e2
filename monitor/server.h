// MetricsServer: the HTTP endpoint of one rank — /metrics (Prometheus text), the dashboard (/,
// /chart.js) and its JSON API (/api/run, /api/steps, /api/events, /api/ranks), all read from a
// MetricsSource (monitor/metrics.h: a rank's Monitor; the supervisor serves /metrics and /api/run
// only). Paths and formats: docs/monitoring.md.
//
// Safety: binds 127.0.0.1 unless told otherwise; GET and HEAD only (others 405); no other paths
// (404); with a token, every request must carry "Authorization: Bearer <token>" or ?token=<token>
// (else 401); on a loopback address, a Host header must be an IP literal or localhost (403: a DNS
// rebinding page cannot read it). Bounded by construction: an accept thread and a fixed pool of
// workers fed by a bounded queue (when full, the accept thread waits and the kernel's backlog holds
// the rest); each connection gets one request whose head must arrive within timeout_s and 8 KiB,
// and an answer written within timeout_s; then it closes. No client can stall or grow the training
// process, or keep the server from stopping.
//
// Lifetime: Start() binds and starts serving; the destructor shuts down every connection and joins
// every thread (within a moment). The source must outlive the server. Thread safety: port()/url()
// from any thread.
#pragma once
#include <memory>
#include <string>

#include "base/status.h"
#include "monitor/metrics.h"

namespace tf::monitor {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 9470;          // 0: any free port
  int port_stride = 1;      // a port in use: try port + k * port_stride
  int port_tries = 16;      // ... for k < port_tries
  std::string token = "";   // "": no authentication
  int threads = 4;          // worker threads
  int queue = 16;           // connections waiting for a worker
  int timeout_s = 5;        // read and write timeouts
};

// tf::ParseHostPort (base/net.h) into options.host / port.
Status ParseHostPort(const std::string& text, ServerOptions* options);
// The token in `path`: its first line without surrounding whitespace. Empty or unreadable is an
// error naming the file.
StatusOr<std::string> ReadTokenFile(const std::string& path);

class MetricsServer {
 public:
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsSource* source, const ServerOptions& options);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "http://HOST:PORT" (IPv6 hosts in brackets).
  std::string url() const;
  // Ports tried before the one bound (in use or unavailable): for the log.
  const std::string& moved_from() const { return moved_from_; }

 private:
  MetricsServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;  // the threads (they use only what Impl holds)
  std::string host_;
  int port_ = 0;
  std::string moved_from_;
};

}  // namespace tf::monitor
