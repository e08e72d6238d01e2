#include "monitor/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>

#include "monitor/assets.h"

namespace tf::monitor {
namespace {

// httplib's task queue with a bound: a full queue blocks the accept thread (never a worker).
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(int threads, int capacity) : capacity_(static_cast<size_t>(capacity)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [&] { return jobs_.size() < capacity_ || shutdown_; });
    jobs_.push_back(std::move(fn));  // after shutdown too: each job closes its socket
    ready_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    ready_.notify_all();
    space_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        space_.notify_one();
      }
      fn();
    }
  }

  const size_t capacity_;
  std::mutex mu_;  // guards jobs_, shutdown_
  std::condition_variable ready_, space_;
  std::deque<std::function<void()>> jobs_;
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

// Constant-time comparison (the token must not leak through response timing).
bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

int64_t IntParam(const httplib::Request& req, const char* name) {
  if (!req.has_param(name)) return 0;
  const std::string v = req.get_param_value(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  return (errno != 0 || end == v.c_str()) ? 0 : static_cast<int64_t>(x);
}

// Why binding host:port fails, from the kernel (httplib reports only false). err: the errno, or
// -1 when the host does not resolve.
struct BindFailure {
  int err = 0;
  std::string why;
};
BindFailure WhyNotBound(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return {-1, fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc))};
  }
  BindFailure f{0, "bound on a second try (another process raced for it?)"};
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0) {
    f = {errno, std::strerror(errno)};
  } else {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) f = {errno, std::strerror(errno)};
    close(fd);
  }
  freeaddrinfo(res);
  return f;
}

}  // namespace

struct MetricsServer::Impl {
  httplib::Server http;
  std::thread thread;
};

Status ParseHostPort(const std::string& text, ServerOptions* options) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::InvalidArgument("metrics address '{}' is not [IPv6]:PORT", text);
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) return Status::InvalidArgument("metrics address '{}' is not HOST:PORT", text);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return Status::InvalidArgument("metrics address '{}': write an IPv6 host in brackets, [::1]:PORT", text);
    }
  }
  if (host.empty()) host = "127.0.0.1";
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535) {
    return Status::InvalidArgument("metrics address '{}': the port must be a number from 0 to 65535", text);
  }
  options->host = host;
  options->port = std::stoi(port);
  return Status::OK();
}

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status::InvalidArgument("metrics_token_file '{}' cannot be read: {}", path, std::strerror(errno));
  std::string line;
  std::getline(f, line);
  const size_t b = line.find_first_not_of(" \t\r\n");
  const size_t e = line.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return Status::InvalidArgument("metrics_token_file '{}' holds no token on its first line", path);
  return line.substr(b, e - b + 1);
}

std::string MetricsServer::url() const {
  return host_.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", host_, port_)
                                               : fmt::format("http://{}:{}", host_, port_);
}

MetricsServer::~MetricsServer() {
  if (impl_) {
    impl_->http.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  }
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Monitor* monitor, const ServerOptions& o) {
  if (o.threads < 1 || o.queue < 1 || o.timeout_s < 1 || o.port_tries < 1 || o.port_stride < 1) {
    return Status::InvalidArgument("metrics server options out of range");
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->impl_ = std::make_unique<Impl>();
  s->host_ = o.host;
  httplib::Server& http = s->impl_->http;
  const int threads = o.threads, queue = o.queue;
  http.new_task_queue = [threads, queue] { return new BoundedPool(threads, queue); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second process bind
  // the same port and silently share it.
  http.set_socket_options([](int fd) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.set_read_timeout(o.timeout_s, 0);
  http.set_write_timeout(o.timeout_s, 0);
  http.set_keep_alive_timeout(o.timeout_s);
  // One request per connection: a polling dashboard tab must not hold a worker between polls.
  http.set_keep_alive_max_count(1);
  http.set_payload_max_length(4096);
  const std::string token = o.token;
  http.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    if (req.method != "GET" && req.method != "HEAD") {
      res.status = 405;
      res.set_header("Allow", "GET, HEAD");
      res.set_content("method not allowed: this endpoint is read-only\n", "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!token.empty()) {
      // The header, or ?token= for a browser opening the dashboard (which then sends the header).
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const bool header_ok = auth.starts_with(prefix) && SameToken(auth.substr(prefix.size()), token);
      const bool query_ok = req.has_param("token") && SameToken(req.get_param_value("token"), token);
      if (!header_ok && !query_ok) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer realm=\"trainflow\"");
        res.set_content("unauthorized: send Authorization: Bearer <token>\n", "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 404) res.set_content("not found\n", "text/plain");
  });
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                   "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'");
    const std::string_view page = DashboardHtml();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  http.Get("/chart.js", [](const httplib::Request&, httplib::Response& res) {
    const std::string_view js = ChartJs();
    res.set_content(js.data(), js.size(), "text/javascript; charset=utf-8");
  });
  http.Get("/metrics", [monitor](const httplib::Request&, httplib::Response& res) {
    res.set_content(monitor->Exposition(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/api/run", [monitor](const httplib::Request&, httplib::Response& res) {
    res.set_content(monitor->RunJson(), "application/json");
  });
  http.Get("/api/steps", [monitor](const httplib::Request& req, httplib::Response& res) {
    res.set_content(monitor->StepsJson(IntParam(req, "after")), "application/json");
  });
  http.Get("/api/events", [monitor](const httplib::Request& req, httplib::Response& res) {
    res.set_content(monitor->EventsJson(IntParam(req, "after")), "application/json");
  });
  http.Get("/api/ranks", [monitor](const httplib::Request&, httplib::Response& res) {
    res.set_content(monitor->RanksJson(), "application/json");
  });

  if (o.port == 0) {
    const int port = http.bind_to_any_port(o.host);
    if (port <= 0) {
      return Status::InvalidArgument("metrics server: cannot bind {}: {}; set metrics_addr to an address of this "
                                     "machine or \"off\"", o.host, WhyNotBound(o.host, 0).why);
    }
    s->port_ = port;
  } else {
    std::string tried;
    for (int k = 0; k < o.port_tries; ++k) {
      const int port = o.port + k * o.port_stride;
      if (port > 65535) break;
      if (http.bind_to_port(o.host, port)) {
        s->port_ = port;
        break;
      }
      const BindFailure f = WhyNotBound(o.host, port);
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", port, f.why);
      if (f.err != EADDRINUSE && f.err != 0) {  // the address, not the port: no other port helps
        return Status::InvalidArgument("metrics server: cannot bind {}:{}: {}; set metrics_addr to an address of "
                                       "this machine or \"off\"", o.host, port, f.why);
      }
    }
    if (s->port_ == 0) {
      return Status::Unavailable("metrics server: cannot bind {}: tried port {}; set metrics_addr to a free "
                                 "HOST:PORT (port 0: any) or \"off\"",
                                 o.host, tried);
    }
    s->moved_from_ = tried;
  }
  MetricsServer* raw = s.get();
  raw->impl_->thread = std::thread([raw] { raw->impl_->http.listen_after_bind(); });
  // httplib's stop() does nothing before the loop runs: wait for it, so the destructor can stop it.
  for (int i = 0; i < 10000 && !raw->impl_->http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!raw->impl_->http.is_running()) return Status::Internal("metrics server: the accept loop did not start");
  return s;
}

}  // namespace tf::monitor
