#include "launch/heartbeat.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "base/backoff.h"
#include "base/json.h"
#include "launch/protocol.h"
#include "base/net.h"
#include "base/progress.h"
#include "base/random.h"
#include "base/sha256.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kGreeting[] = "trainflow-heartbeat 1 ";
constexpr double kAuthDeadlineS = 5.0;
constexpr int kMaxConnections = 4096;
// Connections not yet authenticated: at most this many; a new one pushes out the oldest, so that a
// crowd of idle strangers cannot keep a rank that reconnects out (a handshake takes milliseconds).
constexpr int kMaxUnauthenticated = 64;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return !s.empty();
}

// Reads what is available into `buf`; false on EOF or error.
bool ReadSome(int fd, std::string* buf, std::string* error) {
  char tmp[8192];
  while (true) {
    const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n > 0) {
      buf->append(tmp, static_cast<size_t>(n));
      if (n < static_cast<ssize_t>(sizeof(tmp))) return true;
      continue;
    }
    if (n == 0) {
      *error = "connection closed";
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == EINTR) continue;
    *error = std::strerror(errno);
    return false;
  }
}

// Splits complete lines off `buf`; false when a line is too long.
bool TakeLines(std::string* buf, std::vector<std::string>* lines) {
  size_t start = 0;
  while (true) {
    const size_t nl = buf->find('\n', start);
    if (nl == std::string::npos) break;
    lines->push_back(buf->substr(start, nl - start));
    start = nl + 1;
  }
  buf->erase(0, start);
  return buf->size() <= kMaxHeartbeatLine;
}

}  // namespace

// ---- Session ---------------------------------------------------------------------------------

HeartbeatSession::HeartbeatSession(const std::string& secret, const std::string& server_nonce,
                                   const std::string& client_nonce, bool is_server)
    : key_(HmacSha256Hex(secret, server_nonce + " " + client_nonce)),
      send_dir_(is_server ? 's' : 'c'),
      recv_dir_(is_server ? 'c' : 's') {}

std::string HeartbeatSession::Seal(const json& body) {
  const std::string text = body.dump();
  const uint64_t seq = ++send_seq_;
  const std::string mac = HmacSha256Hex(key_, fmt::format("{} {} {}", send_dir_, seq, text));
  return fmt::format("{} {} {}\n", mac, seq, text);
}

StatusOr<json> HeartbeatSession::Open(const std::string& line) {
  const size_t a = line.find(' ');
  const size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
  if (b == std::string::npos) return Status::InvalidArgument("not a heartbeat frame");
  const std::string mac = line.substr(0, a), seq_text = line.substr(a + 1, b - a - 1), text = line.substr(b + 1);
  uint64_t seq = 0;
  try {
    size_t used = 0;
    seq = std::stoull(seq_text, &used);
    if (used != seq_text.size()) throw std::invalid_argument("seq");
  } catch (const std::exception&) {
    return Status::InvalidArgument("a heartbeat frame with a bad sequence number");
  }
  const std::string want = HmacSha256Hex(key_, fmt::format("{} {} {}", recv_dir_, seq, text));
  if (!ConstantTimeEqual(mac, want)) return Status::InvalidArgument("a heartbeat frame with a wrong MAC");
  if (seq != recv_seq_ + 1) {
    return Status::InvalidArgument("a heartbeat frame out of sequence ({} after {}): replayed or lost", seq,
                                   recv_seq_);
  }
  StatusOr<json> parsed = ParseJson(text, "a heartbeat frame", /*allow_comments=*/false);
  if (!parsed.ok()) return parsed.status();
  json body = std::move(*parsed);
  if (!body.is_object()) return Status::InvalidArgument("a heartbeat frame whose body is not a JSON object");
  recv_seq_ = seq;
  return body;
}

// ---- Client ----------------------------------------------------------------------------------

struct HeartbeatClient::Impl {
  HeartbeatClientOptions options;
  CommandHandler handler;
  std::string host;
  int port = 0;
  int wake_fd = -1;
  std::atomic<bool> stop{false};
  std::atomic<bool> connected{false};
  std::atomic<bool> poke{false};
  std::mutex mu;
  std::deque<json> queue;  // guarded by mu
  std::thread thread;

  void Wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof(one));
  }
  void Drain() {
    uint64_t v = 0;
    (void)!::read(wake_fd, &v, sizeof(v));
  }
  // Sleeps up to s seconds or until woken.
  void WaitFor(double s) {
    pollfd p{wake_fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(s * 1000)) > 0) Drain();
  }

  int Connect() { return ConnectWithin(host, port, 1.0, nullptr); }

  json Heartbeat() const {
    const ProgressSnapshot p = ReadProgress();
    namespace field = protocol::field;
    json hb = {{field::kType, protocol::msg::kHeartbeat},
               {field::kStep, p.step},
               {field::kPhase, PhaseName(p.phase)},
               {field::kProgress, p.progress},
               {field::kCheckpoint, p.checkpoint_step},
               {field::kStepTime, p.step_time},
               {field::kStartStep, p.start_step},
               {field::kFirstStepTime, p.first_step_time},
               {field::kCheckpointBytes, p.checkpoint_bytes}};
    if (std::string url = MetricsUrl(); !url.empty()) hb[field::kMetricsUrl] = std::move(url);
    return hb;
  }

  // One connection, until it fails or stop.
  void Serve(int fd) {
    std::string buf, error;
    const auto greet_end = Clock::now() + std::chrono::seconds(2);
    std::vector<std::string> lines;
    while (lines.empty()) {
      const double left = Seconds(greet_end - Clock::now());
      if (left <= 0 || stop) return;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
      if (!ReadSome(fd, &buf, &error) || !TakeLines(&buf, &lines)) return;
    }
    const std::string& greeting = lines[0];
    if (!greeting.starts_with(kGreeting)) return;
    const std::string server_nonce = greeting.substr(sizeof(kGreeting) - 1);
    if (!IsHex(server_nonce) || server_nonce.size() > 128) return;
    const std::string client_nonce = RandomHex(16);
    HeartbeatSession session(options.secret, server_nonce, client_nonce, /*is_server=*/false);
    json hello = options.identity;
    hello[protocol::field::kType] = protocol::msg::kHello;
    if (!SendAllWithin(fd, "HELLO " + client_nonce + "\n" + session.Seal(hello), 2.0)) return;
    connected = true;
    auto next_hb = Clock::now();
    lines.erase(lines.begin());
    while (!stop) {
      for (const std::string& line : lines) {
        StatusOr<json> cmd = session.Open(line);
        if (!cmd.ok()) return;  // the server is not ours (or broken): reconnect
        handler(*cmd);
      }
      lines.clear();
      std::string out;
      if (poke.exchange(false) || Clock::now() >= next_hb) {
        out += session.Seal(Heartbeat());
        next_hb = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(options.interval_s));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        while (!queue.empty()) {
          out += session.Seal(queue.front());
          queue.pop_front();
        }
      }
      if (!out.empty() && !SendAllWithin(fd, out, 2.0)) return;
      const double wait = std::max(0.0, Seconds(next_hb - Clock::now()));
      pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      const int n = ::poll(p, 2, static_cast<int>(wait * 1000) + 1);
      if (n <= 0) continue;
      if (p[1].revents & POLLIN) Drain();
      if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!ReadSome(fd, &buf, &error) || !TakeLines(&buf, &lines)) {
          // Commands that arrived with the close still count.
          for (const std::string& line : lines) {
            StatusOr<json> cmd = session.Open(line);
            if (cmd.ok()) handler(*cmd);
          }
          return;
        }
      }
    }
    // Stopping: what is queued goes out (a last "bye"), within a moment.
    std::string out;
    {
      std::lock_guard<std::mutex> lock(mu);
      while (!queue.empty()) {
        out += session.Seal(queue.front());
        queue.pop_front();
      }
    }
    if (!out.empty()) (void)SendAllWithin(fd, out, 1.0);
  }

  void Run() {
    // Ahead of the training threads when the system allows it (root, CAP_SYS_NICE or RLIMIT_NICE):
    // on a loaded machine a heartbeat then still goes out on time. Else the thread keeps the
    // process's priority and the supervisor's late timeout covers the delay.
    errno = 0;
    const int nice_now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
    if (errno == 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), std::max(-20, nice_now - 10));
    int failures = 0;  // connection attempts failed in a row
    while (!stop) {
      const int fd = Connect();
      if (fd < 0) {
        WaitFor(ExponentialDelay(0.05, 2, failures, std::max(0.05, options.interval_s)));
        if (failures < 64) ++failures;
        continue;
      }
      failures = 0;
      Serve(fd);
      connected = false;
      ::close(fd);
      {
        // Unkept messages are for the connection that is gone.
        std::lock_guard<std::mutex> lock(mu);
        std::erase_if(queue, [](const json& j) { return !j.value("keep", false); });
      }
      if (!stop) WaitFor(0.05);
    }
  }
};

StatusOr<std::unique_ptr<HeartbeatClient>> HeartbeatClient::Start(HeartbeatClientOptions options,
                                                                  CommandHandler handler) {
  if (options.secret.empty()) return Status::InvalidArgument("the heartbeat channel needs a secret");
  if (!(options.interval_s > 0 && options.interval_s <= 3600)) {
    return Status::InvalidArgument("heartbeat interval {} s: expected 0 < interval <= 3600", options.interval_s);
  }
  StatusOr<HostPort> parsed = tf::ParseHostPort(options.address);
  if (!parsed.ok()) return parsed.status().WithContext("the supervisor's address");
  const HostPort addr = *parsed;
  if (addr.port == 0) return Status::InvalidArgument("the supervisor's address '{}' has no port", options.address);
  std::unique_ptr<HeartbeatClient> c(new HeartbeatClient());
  c->impl_ = std::make_unique<Impl>();
  Impl& i = *c->impl_;
  i.options = std::move(options);
  i.handler = std::move(handler);
  i.host = addr.host;
  i.port = addr.port;
  i.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (i.wake_fd < 0) return Status::IOError("eventfd: {}", std::strerror(errno));
  i.thread = std::thread([&i] { i.Run(); });
  return c;
}

HeartbeatClient::~HeartbeatClient() {
  if (!impl_) return;
  impl_->stop = true;
  impl_->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  ::close(impl_->wake_fd);
}

void HeartbeatClient::Send(json body, bool keep) {
  if (!keep && !impl_->connected) return;
  if (keep) body["keep"] = true;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->queue.size() >= 1024) impl_->queue.pop_front();  // bounded: the oldest goes
    impl_->queue.push_back(std::move(body));
  }
  impl_->Wake();
}

bool HeartbeatClient::connected() const { return impl_->connected; }

void HeartbeatClient::Poke() {
  impl_->poke = true;
  impl_->Wake();
}

// ---- Server ----------------------------------------------------------------------------------

struct HeartbeatServer::Impl {
  struct Conn {
    int fd = -1;
    std::string peer, buf, server_nonce;
    std::unique_ptr<HeartbeatSession> session;  // after HELLO
    bool authenticated = false;                  // after a valid identity frame
    Clock::time_point accepted;
  };
  std::string secret;
  int listen_fd = -1;
  int port = 0;
  int next_id = 1;
  std::map<int, Conn> conns;
  std::vector<Event> pending;  // closes found by Send

  void Drop(int id, Event::Kind kind, const std::string& why) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    Event e{it->second.authenticated ? kind : Event::kRejected, id, {}, it->second.peer, why};
    ::close(it->second.fd);
    conns.erase(it);
    pending.push_back(std::move(e));
  }

  void Accept() {
    while (true) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (static_cast<int>(conns.size()) >= kMaxConnections) {
        ::close(fd);
        continue;
      }
      int unauthenticated = 0, oldest = -1;
      for (const auto& [id, c] : conns) {
        if (c.authenticated) continue;
        ++unauthenticated;
        if (oldest < 0) oldest = id;  // ids grow with time
      }
      if (unauthenticated >= kMaxUnauthenticated) {
        Drop(oldest, Event::kRejected, fmt::format("pushed out: more than {} connections waiting to authenticate",
                                                   kMaxUnauthenticated));
      }
      char host[INET6_ADDRSTRLEN] = "?";
      int peer_port = 0;
      if (ss.ss_family == AF_INET) {
        const auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        peer_port = ntohs(a->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        const auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
        ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        peer_port = ntohs(a->sin6_port);
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Conn c;
      c.fd = fd;
      c.peer = fmt::format("{}:{}", host, peer_port);
      c.server_nonce = RandomHex(16);
      c.accepted = Clock::now();
      const int id = next_id++;
      if (!SendAllWithin(fd, kGreeting + c.server_nonce + "\n", 1.0)) {
        ::close(fd);
        continue;
      }
      conns.emplace(id, std::move(c));
    }
  }

  void Read(int id, std::vector<Event>* out) {
    Conn& c = conns.at(id);
    std::string error;
    std::vector<std::string> lines;
    const bool open = ReadSome(c.fd, &c.buf, &error);
    if (!TakeLines(&c.buf, &lines)) {
      Drop(id, Event::kClosed, fmt::format("a line longer than {} bytes", kMaxHeartbeatLine));
      return;
    }
    for (const std::string& line : lines) {
      if (!c.session) {
        const std::string nonce = line.starts_with("HELLO ") ? line.substr(6) : "";
        if (!IsHex(nonce) || nonce.size() > 128) {
          Drop(id, Event::kRejected, "not a heartbeat client (no HELLO)");
          return;
        }
        c.session = std::make_unique<HeartbeatSession>(secret, c.server_nonce, nonce, /*is_server=*/true);
        continue;
      }
      StatusOr<json> body = c.session->Open(line);
      if (!body.ok()) {
        Drop(id, Event::kRejected, body.status().message());
        return;
      }
      if (!c.authenticated) {
        if (body->value(protocol::field::kType, "") != protocol::msg::kHello) {
          Drop(id, Event::kRejected, "the first message is not a hello");
          return;
        }
        c.authenticated = true;
        out->push_back(Event{Event::kHello, id, std::move(*body), c.peer, ""});
        continue;
      }
      out->push_back(Event{Event::kMessage, id, std::move(*body), c.peer, ""});
    }
    if (!open) Drop(id, Event::kClosed, error);
  }
};

StatusOr<std::unique_ptr<HeartbeatServer>> HeartbeatServer::Listen(const std::string& host, int port,
                                                                  std::string secret) {
  if (secret.empty()) return Status::InvalidArgument("the heartbeat channel needs a secret");
  NetError error;
  const int fd = ListenTcp(host, port, {.numeric_host = true, .non_blocking = true, .backlog = 256}, &error);
  if (fd < 0) {
    if (error.err == -1) return Status::InvalidArgument("heartbeat address: {}", error.why);
    return Status::IOError("cannot listen for heartbeats on {}:{}: {}", host, port, error.why);
  }
  std::unique_ptr<HeartbeatServer> s(new HeartbeatServer());
  s->impl_ = std::make_unique<Impl>();
  s->impl_->secret = std::move(secret);
  s->impl_->listen_fd = fd;
  s->impl_->port = BoundPort(fd);
  return s;
}

HeartbeatServer::~HeartbeatServer() {
  if (!impl_) return;
  for (auto& [id, c] : impl_->conns) ::close(c.fd);
  ::close(impl_->listen_fd);
}

int HeartbeatServer::port() const { return impl_->port; }
int HeartbeatServer::connections() const { return static_cast<int>(impl_->conns.size()); }

std::vector<HeartbeatServer::Event> HeartbeatServer::Poll(double timeout_s) {
  Impl& m = *impl_;
  std::vector<Event> out = std::move(m.pending);
  m.pending.clear();
  // Connections that did not authenticate in time.
  const auto now = Clock::now();
  std::vector<int> late;
  for (const auto& [id, c] : m.conns) {
    if (!c.authenticated && Seconds(now - c.accepted) > kAuthDeadlineS) late.push_back(id);
  }
  for (int id : late) m.Drop(id, Event::kRejected, "did not authenticate within 5 s");
  std::vector<pollfd> fds;
  std::vector<int> ids;
  fds.push_back({m.listen_fd, POLLIN, 0});
  for (const auto& [id, c] : m.conns) {
    fds.push_back({c.fd, POLLIN, 0});
    ids.push_back(id);
  }
  const int wait_ms = out.empty() && m.pending.empty() ? static_cast<int>(std::max(0.0, timeout_s) * 1000) : 0;
  if (::poll(fds.data(), fds.size(), wait_ms) > 0) {
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0 && m.conns.count(ids[i - 1])) m.Read(ids[i - 1], &out);
    }
    if (fds[0].revents & POLLIN) m.Accept();
  }
  for (Event& e : m.pending) out.push_back(std::move(e));
  m.pending.clear();
  return out;
}

bool HeartbeatServer::Send(int conn, const json& body) {
  auto it = impl_->conns.find(conn);
  if (it == impl_->conns.end() || !it->second.authenticated) return false;
  if (!SendAllWithin(it->second.fd, it->second.session->Seal(body), 1.0)) {
    impl_->Drop(conn, Event::kClosed, "send failed");
    return false;
  }
  return true;
}

void HeartbeatServer::Close(int conn) {
  auto it = impl_->conns.find(conn);
  if (it == impl_->conns.end()) return;
  ::close(it->second.fd);
  impl_->conns.erase(it);
}

}  // namespace tf::launch
