#include "monitor/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/env.h"
#include "base/net.h"
#include "monitor/assets.h"

namespace tf::monitor {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestHead = 8192;  // request line and headers; more: 431

// Constant-time comparison (the token must not leak through response timing).
bool SameToken(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(s[i + 1]) && std::isxdigit(s[i + 2])) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i] == '+' ? ' ' : s[i]);
    }
  }
  return out;
}

// The value of `key` in a query string ("" when absent).
std::string QueryParam(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == key) return eq == std::string_view::npos ? "" : PercentDecode(pair.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return "";
}

// A query's integer parameter: nullopt when absent or empty (and *bad when not a whole integer).
constexpr int64_t kNoValue = std::numeric_limits<int64_t>::min();
std::optional<int64_t> IntParam(const std::string& v, bool* bad) {
  *bad = false;
  if (v.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(v[0]))) {
    *bad = true;
    return std::nullopt;
  }
  return static_cast<int64_t>(x);
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

// A Host header a page served from a loopback address can legitimately send: an IP literal or
// localhost (a DNS name pointing at 127.0.0.1 is how a rebinding attack reaches the endpoint).
bool HostHeaderAllowed(std::string_view host) {
  if (host.empty()) return true;  // HTTP/1.0
  std::string name(host);
  if (name.front() == '[') return name.find(']') != std::string::npos;  // an IPv6 literal
  if (const size_t colon = name.rfind(':'); colon != std::string::npos) name.resize(colon);
  if (IEquals(name, "localhost")) return true;
  in_addr a{};
  return inet_pton(AF_INET, name.c_str(), &a) == 1;
}

struct Request {
  std::string method, path, query;
  std::string authorization, host;
};

// Parses the head ("GET /x?y HTTP/1.1\r\nName: value\r\n...\r\n\r\n"); false when malformed.
bool ParseHead(std::string_view head, Request* r) {
  const size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1 || !line.substr(sp2 + 1).starts_with("HTTP/1.")) return false;
  r->method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (target.empty() || target.front() != '/') return false;
  const size_t q = target.find('?');
  r->path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) r->query = std::string(target.substr(q + 1));
  for (size_t pos = eol + 2; pos < head.size();) {
    const size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos || end == pos) break;
    const std::string_view h = head.substr(pos, end - pos);
    pos = end + 2;
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos) return false;
    std::string_view value = h.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (IEquals(h.substr(0, colon), "authorization")) r->authorization = std::string(value);
    if (IEquals(h.substr(0, colon), "host")) r->host = std::string(value);
  }
  return true;
}

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    default: return "Error";
  }
}

// Milliseconds left until `deadline` (0 when past).
int MsLeft(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms > 0 ? static_cast<int>(std::min<int64_t>(ms, 1 << 30)) : 0;
}

}  // namespace

struct MetricsServer::Impl {
  const MetricsSource* monitor = nullptr;
  ServerOptions options;
  bool loopback = true;
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: written once by Stop() to end the accept loop
  std::thread acceptor;
  std::vector<std::thread> workers;
  std::mutex mu;  // guards queue, active, stopping
  std::condition_variable ready, space;
  std::deque<int> queue;  // accepted connections waiting for a worker
  std::set<int> active;   // connections being served (shut down by Stop())
  bool stopping = false;

  ~Impl() {
    Stop();
    if (listen_fd >= 0) close(listen_fd);
    if (wake_fd >= 0) close(wake_fd);
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      stopping = true;
      for (int fd : active) shutdown(fd, SHUT_RDWR);  // a worker blocked in poll() wakes at once
    }
    if (wake_fd >= 0) {
      const uint64_t one = 1;
      (void)!write(wake_fd, &one, sizeof(one));
    }
    ready.notify_all();
    space.notify_all();
    if (acceptor.joinable()) acceptor.join();
    for (std::thread& w : workers) {
      if (w.joinable()) w.join();
    }
    for (int fd : queue) close(fd);
    queue.clear();
  }

  void AcceptLoop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue;  // the peer gave up, or out of descriptors for now
      std::unique_lock<std::mutex> lock(mu);
      // A full queue makes this thread wait (the kernel's backlog holds the rest).
      space.wait(lock, [&] { return queue.size() < static_cast<size_t>(options.queue) || stopping; });
      if (stopping) {
        close(fd);
        return;
      }
      queue.push_back(fd);
      ready.notify_one();
    }
  }

  void Work() {
    for (;;) {
      int fd = -1;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready.wait(lock, [&] { return !queue.empty() || stopping; });
        if (stopping) return;
        fd = queue.front();
        queue.pop_front();
        active.insert(fd);
        space.notify_one();
      }
      Serve(fd);
      std::lock_guard<std::mutex> lock(mu);
      active.erase(fd);
      close(fd);
    }
  }

  // One request on `fd` (non-blocking): its head read within timeout_s and at most kMaxRequestHead
  // bytes, the answer written within timeout_s; then the connection closes.
  void Serve(int fd) {
    std::string head;
    char buf[2048];
    const Clock::time_point read_deadline = Clock::now() + std::chrono::seconds(options.timeout_s);
    for (;;) {
      if (head.find("\r\n\r\n") != std::string::npos) break;
      if (head.size() >= kMaxRequestHead) {
        Response r{431, "text/plain; charset=utf-8", "request head too large\n", {}};
        Send(fd, r, false);
        return;
      }
      pollfd p{fd, POLLIN, 0};
      const int left = MsLeft(read_deadline);
      if (left == 0 || poll(&p, 1, left) <= 0) return;  // too slow, or stopping: close
      const ssize_t n = recv(fd, buf, std::min(sizeof(buf), kMaxRequestHead - head.size()), 0);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        return;
      }
      head.append(buf, static_cast<size_t>(n));
    }
    Request req;
    Response res;
    if (!ParseHead(head, &req)) {
      res = Response{400, "text/plain; charset=utf-8", "bad request\n", {}};
    } else {
      // A source's failure (an allocation, a malformed snapshot) answers 500; it must not end the process.
      try {
        Route(req, &res);
      } catch (const std::exception& e) {
        res = Response{500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what() + "\n", {}};
      }
    }
    Send(fd, res, req.method == "HEAD");
  }

  void Route(const Request& req, Response* res) const {
    if (req.method != "GET" && req.method != "HEAD") {
      *res = Response{405, "text/plain; charset=utf-8", "method not allowed: this endpoint is read-only\n",
                      {{"Allow", "GET, HEAD"}}};
      return;
    }
    if (loopback && !HostHeaderAllowed(req.host)) {
      *res = Response{403, "text/plain; charset=utf-8", "Host not allowed: use the address, or localhost\n", {}};
      return;
    }
    if (!options.token.empty()) {
      const std::string_view auth = req.authorization;
      const bool header_ok = auth.size() > 7 && IEquals(auth.substr(0, 7), "bearer ") &&
                             SameToken(auth.substr(7), options.token);
      // ?token= for a browser opening the dashboard (its script then sends the header).
      const bool query_ok = SameToken(QueryParam(req.query, "token"), options.token);
      if (!header_ok && !query_ok) {
        *res = Response{401, "text/plain; charset=utf-8", "unauthorized: send Authorization: Bearer <token>\n",
                        {{"WWW-Authenticate", "Bearer realm=\"trainflow\""}}};
        return;
      }
    }
    const std::string& p = req.path;
    const bool ui = monitor->dashboard();
    if (!ui && p != "/metrics" && p != "/api/run") {
      *res = Response{404, "text/plain; charset=utf-8", "not found\n", {}};
    } else if (p == "/") {
      *res = Response{200, "text/html; charset=utf-8", std::string(DashboardHtml()),
                      {{"Content-Security-Policy",
                        "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"}}};
    } else if (p == "/chart.js") {
      *res = Response{200, "text/javascript; charset=utf-8", std::string(ChartJs()), {}};
    } else if (p == "/metrics") {
      *res = Response{200, "text/plain; version=0.0.4; charset=utf-8", monitor->Exposition(), {}};
    } else if (p == "/api/run") {
      *res = Response{200, "application/json", monitor->RunJson(), {}};
    } else if (p == "/api/steps" || p == "/api/events") {
      // ?after=N: the records of steps (events of ids) after N; absent: all of them.
      const std::string after = QueryParam(req.query, "after");
      bool bad = false;
      const int64_t from = IntParam(after, &bad).value_or(kNoValue);
      if (bad) {
        *res = Response{400, "text/plain; charset=utf-8",
                        fmt::format("bad request: after must be an integer ({}; absent: all of them)\n",
                                    p == "/api/steps" ? "a step: the records of later steps" : "an event id: later events"),
                        {}};
      } else {
        *res = Response{200, "application/json", p == "/api/steps" ? monitor->StepsJson(from) : monitor->EventsJson(from),
                        {}};
      }
    } else if (p == "/api/ranks") {
      *res = Response{200, "application/json", monitor->RanksJson(), {}};
    } else {
      *res = Response{404, "text/plain; charset=utf-8", "not found\n", {}};
    }
  }

  void Send(int fd, const Response& r, bool head_only) const {
    std::string out = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n"
        "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n",
        r.status, Reason(r.status), r.content_type, r.body.size());
    for (const auto& [k, v] : r.headers) out += fmt::format("{}: {}\r\n", k, v);
    out += "\r\n";
    if (!head_only) out += r.body;
    (void)SendAllWithin(fd, out, options.timeout_s);  // a reader too slow: given up
  }
};

Status ParseHostPort(const std::string& text, ServerOptions* options) {
  TF_ASSIGN_OR_RETURN(const HostPort hp, tf::ParseHostPort(text));
  options->host = hp.host;
  options->port = hp.port;
  return Status::OK();
}

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  constexpr uint64_t kMaxTokenFileBytes = 64 << 10;
  StatusOr<std::string> text = Env::Default()->ReadFileToString(path, kMaxTokenFileBytes);
  if (!text.ok()) return text.status().WithContext("metrics_token_file");
  const std::string line = text->substr(0, text->find('\n'));
  const size_t b = line.find_first_not_of(" \t\r\n");
  const size_t e = line.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return Status::InvalidArgument("metrics_token_file '{}' holds no token on its first line", path);
  return line.substr(b, e - b + 1);
}

std::string MetricsServer::url() const {
  return host_.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", host_, port_)
                                               : fmt::format("http://{}:{}", host_, port_);
}

MetricsServer::~MetricsServer() = default;  // Impl's destructor stops and joins

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsSource* monitor, const ServerOptions& o) {
  if (o.threads < 1 || o.queue < 1 || o.timeout_s < 1 || o.port_tries < 1 || o.port_stride < 1) {
    return Status::InvalidArgument("metrics server options out of range");
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->impl_ = std::make_unique<Impl>();
  Impl& impl = *s->impl_;
  impl.monitor = monitor;
  impl.options = o;
  impl.loopback = IsLoopbackHost(o.host);
  s->host_ = o.host;
  NetError f;
  if (o.port == 0) {
    impl.listen_fd = ListenTcp(o.host, 0, {}, &f);
    if (impl.listen_fd < 0) {
      return Status::InvalidArgument("metrics server: cannot bind {}: {}; set metrics_addr to an address of this "
                                     "machine or \"off\"", o.host, f.why);
    }
  } else {
    std::string tried;
    for (int k = 0; k < o.port_tries; ++k) {
      const int port = o.port + k * o.port_stride;
      if (port > 65535) break;
      impl.listen_fd = ListenTcp(o.host, port, {}, &f);
      if (impl.listen_fd >= 0) break;
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", port, f.why);
      if (f.err != EADDRINUSE) {  // the address, not the port: no other port helps
        return Status::InvalidArgument("metrics server: cannot bind {}:{}: {}; set metrics_addr to an address of "
                                       "this machine or \"off\"", o.host, port, f.why);
      }
    }
    if (impl.listen_fd < 0) {
      return Status::Unavailable("metrics server: cannot bind {}: tried port {}; set metrics_addr to a free "
                                 "HOST:PORT (port 0: any) or \"off\"",
                                 o.host, tried);
    }
    s->moved_from_ = tried;
  }
  s->port_ = BoundPort(impl.listen_fd);
  impl.wake_fd = eventfd(0, EFD_CLOEXEC);
  if (impl.wake_fd < 0) return Status::FromErrno("metrics server: eventfd", errno);
  for (int i = 0; i < o.threads; ++i) impl.workers.emplace_back([&impl] { impl.Work(); });
  impl.acceptor = std::thread([&impl] { impl.AcceptLoop(); });
  return s;
}

}  // namespace tf::monitor
