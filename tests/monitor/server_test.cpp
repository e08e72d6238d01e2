// The metrics endpoint over real sockets on loopback: what it serves, what it refuses (other
// methods and paths, requests without the token, peers on another address than the one bound),
// moving on from a port in use, staying bounded under a flood of idle connections, and the
// Monitor's bounded history and JSON answers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "monitor/assets.h"
#include "monitor/metrics.h"
#include "monitor/server.h"
#include "tests/test_net.h"

namespace tf::monitor {
namespace {

using json = nlohmann::json;

RunInfo Info(int world = 1) {
  RunInfo i;
  i.run_id = "test-run";
  i.version = "trainflow test";
  i.model = "tiny";
  i.device = "cpu";
  i.compression = "none";
  i.world = world;
  i.max_steps = 100;
  i.anomaly_series = {{"nonfinite_loss", "stop"}, {"loss_spike", "warn"}};
  return i;
}

StepRecord Record(int64_t step) {
  StepRecord r;
  r.step = step;
  r.loss = 5.0 - 0.01 * step;
  r.lr = 1e-3;
  r.grad_norm = 1.0;
  r.tokens_per_s = 1000;
  r.step_s = 0.01;
  return r;
}

std::unique_ptr<MetricsServer> StartOn(const Monitor& m, ServerOptions o) {
  auto s = MetricsServer::Start(&m, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

using testing_util::Listener;

// A TCP connection to 127.0.0.1:port (the fd), or -1. send_timeout_ms > 0: connect() gives up
// after that long (a full backlog makes it retry).
int ConnectLoopback(int port, int send_timeout_ms = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (send_timeout_ms > 0) {
    timeval limit{send_timeout_ms / 1000, (send_timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  ::close(fd);
  return -1;
}

// Whether a TCP connection to host:port is accepted.
bool Connects(const char* host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host, &a.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

TEST(ReadTokenFileTest, FirstLineTrimmedAndEmptyRejected) {
  const std::string path = ::testing::TempDir() + "/token_" + std::to_string(::getpid());
  std::ofstream(path) << "  s3cret-token \nsecond line\n";
  auto t = ReadTokenFile(path);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "s3cret-token");
  std::ofstream(path) << "\n";
  EXPECT_FALSE(ReadTokenFile(path).ok());
  std::filesystem::remove(path);
  auto missing = ReadTokenFile(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

TEST(MetricsServerTest, ServesMetricsDashboardAndApiAndNothingElse) {
  Monitor m(Info());
  m.RecordStep(Record(1));
  m.RecordStep(Record(2));
  m.AddEvent("eval", 2, "validation loss 4.9");
  auto s = StartOn(m, {.port = 0});
  ASSERT_TRUE(s);
  httplib::Client c("127.0.0.1", s->port());
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(r->body.find("trainflow_step 2"), std::string::npos);
  EXPECT_NE(r->body.find("trainflow_run_info{"), std::string::npos);
  EXPECT_NE(r->body.find("trainflow_anomalies_total{action=\"stop\",kind=\"nonfinite_loss\"} 0"), std::string::npos);
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<html"), std::string::npos);
  EXPECT_NE(page->body.find("/chart.js"), std::string::npos);
  auto chart = c.Get("/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_NE(chart->body.find("Chart.js v3"), std::string::npos);
  auto steps = c.Get("/api/steps?after=1");
  ASSERT_TRUE(steps);
  json j = json::parse(steps->body);
  ASSERT_EQ(j["steps"].size(), 1u);
  EXPECT_EQ(j["steps"][0]["step"], 2);
  EXPECT_EQ(j["last_step"], 2);
  auto events = c.Get("/api/events?after=0");
  ASSERT_TRUE(events);
  EXPECT_EQ(json::parse(events->body)["events"][0]["message"], "validation loss 4.9");
  auto run = c.Get("/api/run");
  ASSERT_TRUE(run);
  EXPECT_EQ(json::parse(run->body)["run_id"], "test-run");
  EXPECT_TRUE(c.Head("/metrics"));
  // Nothing else: other paths, other methods.
  for (const char* path : {"/etc/passwd", "/api", "/metrics/x", "/../metrics"}) {
    auto nf = c.Get(path);
    ASSERT_TRUE(nf) << path;
    EXPECT_EQ(nf->status, 404) << path;
  }
  auto post = c.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  auto del = c.Delete("/api/run");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  auto put = c.Put("/", "x", "text/plain");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 405);
}

TEST(MetricsServerTest, AfterMustBeAnInteger) {
  Monitor m(Info());
  m.RecordEval(0, 5.5);
  for (int64_t i = 1; i <= 3; ++i) m.RecordStep(Record(i));
  m.AddEvent("eval", 3, "validation loss 4.9");
  auto s = StartOn(m, {.port = 0});
  ASSERT_TRUE(s);
  httplib::Client c("127.0.0.1", s->port());
  for (const char* path : {"/api/steps?after=junk", "/api/steps?after=2x", "/api/steps?after=%201",
                           "/api/steps?after=99999999999999999999", "/api/events?after=junk"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 400) << path;
    EXPECT_NE(r->body.find("after must be an integer"), std::string::npos) << path << ": " << r->body;
  }
  // Absent (or empty): everything, the evaluation before the first step included.
  for (const char* path : {"/api/steps", "/api/steps?after=", "/api/steps?after=-1"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    ASSERT_EQ(r->status, 200) << path;
    EXPECT_EQ(json::parse(r->body)["steps"].size(), 4u) << path;
  }
  auto r = c.Get("/api/steps?after=2");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["steps"].size(), 1u);
}

TEST(MetricsServerTest, TokenRequiredOnEveryPathWhenSet) {
  Monitor m(Info());
  auto s = StartOn(m, {.port = 0, .token = "good-token"});
  ASSERT_TRUE(s);
  httplib::Client c("127.0.0.1", s->port());
  for (const char* path : {"/metrics", "/", "/chart.js", "/api/run", "/api/steps", "/nope"}) {
    auto none = c.Get(path);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401) << path;
    EXPECT_EQ(none->body.find("trainflow_"), std::string::npos);
    auto wrong = c.Get(path, {{"Authorization", "Bearer bad-token"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << path;
    auto prefix = c.Get(path, {{"Authorization", "Bearer good-toke"}});
    ASSERT_TRUE(prefix);
    EXPECT_EQ(prefix->status, 401) << path;
  }
  auto lower = c.Get("/metrics", {{"Authorization", "bearer good-token"}});  // schemes are case-insensitive
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->status, 200);
  auto ok = c.Get("/metrics", {{"Authorization", "Bearer good-token"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_NE(ok->body.find("trainflow_run_info"), std::string::npos);
  // A browser opens the dashboard with ?token=; a wrong one is refused the same way.
  auto page = c.Get("/?token=good-token");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  auto bad_query = c.Get("/api/run?token=good-tokenX");
  ASSERT_TRUE(bad_query);
  EXPECT_EQ(bad_query->status, 401);
}

TEST(MetricsServerTest, LoopbackOnlyByDefault) {
  Monitor m(Info());
  ServerOptions defaults;
  EXPECT_EQ(defaults.host, "127.0.0.1");
  auto s = StartOn(m, {.port = 0});
  ASSERT_TRUE(s);
  // Bound to 127.0.0.1 alone: a peer reaching this machine on any other address is refused (127.0.0.2
  // stands in for another interface's address, without sending traffic off the machine).
  EXPECT_TRUE(Connects("127.0.0.1", s->port()));
  EXPECT_FALSE(Connects("127.0.0.2", s->port()));
  // Exposing it is deliberate: bound to every address, the same peer gets in.
  auto open = StartOn(m, {.host = "0.0.0.0", .port = 0});
  ASSERT_TRUE(open);
  EXPECT_TRUE(Connects("127.0.0.2", open->port()));
}

TEST(MetricsServerTest, PortInUseMovesOnAndSaysSo) {
  Monitor m(Info());
  Listener busy;
  auto s = StartOn(m, {.port = busy.port, .port_stride = 1, .port_tries = 16});
  ASSERT_TRUE(s);
  EXPECT_NE(s->port(), busy.port);
  EXPECT_GT(s->port(), busy.port);
  EXPECT_NE(s->moved_from().find(std::to_string(busy.port)), std::string::npos) << s->moved_from();
  EXPECT_NE(s->moved_from().find("in use"), std::string::npos) << s->moved_from();
  // A second server never shares a bound port (no SO_REUSEPORT).
  auto t = MetricsServer::Start(&m, {.port = s->port(), .port_tries = 1});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(std::to_string(s->port())), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("metrics_addr"), std::string::npos);
  // An address that is not this machine's is an error at once.
  auto bad = MetricsServer::Start(&m, {.host = "192.0.2.1", .port = 9470});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("192.0.2.1"), std::string::npos) << bad.status().ToString();
}

int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

TEST(MetricsServerTest, IdleConnectionsNeitherBlockRecordingNorGrowThreads) {
  Monitor m(Info());
  auto s = StartOn(m, {.port = 0, .threads = 2, .queue = 2, .timeout_s = 1});
  ASSERT_TRUE(s);
  const int threads_before = ThreadCount();
  // Clients that connect and never send a byte: more than the workers and the queue hold.
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) {
    if (const int fd = ConnectLoopback(s->port(), /*send_timeout_ms=*/200); fd >= 0) idle.push_back(fd);
  }
  // The training thread's calls do not wait for the server.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= 2000; ++i) m.RecordStep(Record(i));
  const double record_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(record_s, 0.9) << "recording waited for the server (its read timeout is 1 s)";
  EXPECT_LE(ThreadCount(), threads_before) << "the server started threads per connection";
  // Once the idle clients time out, the server answers again.
  httplib::Client c("127.0.0.1", s->port());
  c.set_read_timeout(30, 0);
  c.set_connection_timeout(30, 0);
  auto r = c.Get("/api/run");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  for (int fd : idle) ::close(fd);
}

// Sends `bytes` on a fresh connection and returns everything the server answers before it closes
// (reads time out after 10 s).
std::string Exchange(int port, const std::string& bytes) {
  const int fd = ConnectLoopback(port);
  std::string out;
  if (fd >= 0) {
    timeval limit{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    char buf[65536];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  return out;
}

TEST(MetricsServerTest, HostileRequestsAreBounded) {
  Monitor m(Info());
  auto s = StartOn(m, {.port = 0, .timeout_s = 1});
  ASSERT_TRUE(s);
  // A request line that never ends: cut at 8 KiB, not read into memory without bound.
  const std::string endless = Exchange(s->port(), "GET /" + std::string(1 << 20, 'a'));
  EXPECT_TRUE(endless.empty() || endless.starts_with("HTTP/1.1 431")) << endless.substr(0, 80);
  // Endless headers: the same.
  std::string many = "GET /metrics HTTP/1.1\r\n";
  for (int i = 0; i < 5000; ++i) many += "X-Filler: 0123456789\r\n";
  EXPECT_TRUE(Exchange(s->port(), many).starts_with("HTTP/1.1 431"));
  // Many ranges: the whole file once, not a part per range.
  std::string ranges = "bytes=0-";
  for (int i = 0; i < 1000; ++i) ranges += ",0-";
  const std::string chart = Exchange(s->port(), "GET /chart.js HTTP/1.1\r\nRange: " + ranges + "\r\n\r\n");
  ASSERT_TRUE(chart.starts_with("HTTP/1.1 200")) << chart.substr(0, 80);
  EXPECT_LT(chart.size(), ChartJs().size() + 1024);
  // A name that resolves to loopback but is not an address (DNS rebinding) is refused.
  EXPECT_TRUE(Exchange(s->port(), "GET /api/run HTTP/1.1\r\nHost: evil.example:80\r\n\r\n").starts_with("HTTP/1.1 403"));
  for (const char* host : {"localhost:9470", "127.0.0.1:9470", "[::1]:9470", "LOCALHOST"}) {
    const std::string ok = Exchange(s->port(), std::string("GET /api/run HTTP/1.1\r\nHost: ") + host + "\r\n\r\n");
    EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << host << ": " << ok.substr(0, 80);
  }
  EXPECT_TRUE(Exchange(s->port(), "garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
  // A client that sends a byte now and then is cut off at the deadline, not kept forever.
  const int fd = ConnectLoopback(s->port());
  ASSERT_GE(fd, 0);
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {  // up to 10 s of drips against a 1 s deadline
    closed = ::send(fd, "G", 1, MSG_NOSIGNAL) < 0;
    char c;
    closed = closed || ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::close(fd);
  EXPECT_TRUE(closed) << "a dripping client kept its connection for 10 s";
}

TEST(MetricsServerTest, StopsWhileClientsHang) {
  Monitor m(Info());
  auto s = StartOn(m, {.port = 0, .threads = 1, .queue = 1, .timeout_s = 30});
  ASSERT_TRUE(s);
  // Clients that connect and send half a request: the one worker and the queue are taken, and the
  // accept thread waits for room.
  std::vector<int> hanging;
  for (int i = 0; i < 4; ++i) {
    const int fd = ConnectLoopback(s->port());
    ASSERT_GE(fd, 0);
    ::send(fd, "GET /met", 8, MSG_NOSIGNAL);
    hanging.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  s.reset();  // must return without waiting out the 30 s deadline (ctest's timeout would catch a hang)
  for (int fd : hanging) ::close(fd);
}

TEST(MonitorTest, HistoryIsBoundedAndKeepsTheWholeRun) {
  Monitor m(Info());
  const int64_t n = 3 * static_cast<int64_t>(Monitor::kMaxRecords);
  for (int64_t i = 1; i <= n; ++i) m.RecordStep(Record(i));
  std::vector<int64_t> steps;
  int64_t after = 0;
  for (int pages = 0; pages < 100; ++pages) {
    json j = json::parse(m.StepsJson(after));
    if (j["steps"].empty()) break;
    EXPECT_LE(j["steps"].size(), Monitor::kMaxRecordsPerAnswer);
    for (const auto& s : j["steps"]) steps.push_back(s["step"].get<int64_t>());
    after = steps.back();
  }
  ASSERT_LE(steps.size(), Monitor::kMaxRecords);
  EXPECT_GT(steps.size(), Monitor::kMaxRecords / 2);
  EXPECT_LE(steps.front(), 4) << "the start of the run was lost";
  EXPECT_EQ(steps.back(), n);
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
}

TEST(MonitorTest, RollbackDropsLaterStepsAndAdvancesGeneration) {
  Monitor m(Info());
  for (int i = 1; i <= 50; ++i) m.RecordStep(Record(i));
  m.RecordRollback(40);
  json j = json::parse(m.StepsJson(0));
  EXPECT_EQ(j["generation"], 1);
  EXPECT_EQ(j["last_step"], 40);
  EXPECT_EQ(j["steps"].size(), 40u);
  EXPECT_NE(m.Exposition().find("trainflow_rollbacks_total 1"), std::string::npos);
}

TEST(MonitorTest, EventsAreBoundedAndNonFiniteIsNull) {
  Monitor m(Info());
  m.AddEvent("anomaly", 1, "kept: samples have their own ring");
  for (size_t i = 0; i < Monitor::kMaxEvents + 10; ++i) m.AddEvent("sample", 1, "text \xff with a bad byte");
  json j = json::parse(m.EventsJson(0));
  ASSERT_EQ(j["events"].size(), Monitor::kMaxSamples + 1);
  EXPECT_EQ(j["events"][0]["kind"], "anomaly");
  EXPECT_EQ(j["events"][1]["id"], static_cast<int64_t>(Monitor::kMaxEvents + 11 - Monitor::kMaxSamples + 1));
  for (size_t i = 0; i < Monitor::kMaxEvents + 5; ++i) m.AddEvent("eval", 2, "e");
  j = json::parse(m.EventsJson(0));
  EXPECT_EQ(j["events"].size(), Monitor::kMaxEvents + Monitor::kMaxSamples);
  StepRecord r = Record(1);
  r.loss = std::nan("");
  m.RecordStep(r);
  json s = json::parse(m.StepsJson(0));
  EXPECT_TRUE(s["steps"][0]["loss"].is_null());
  EXPECT_NE(m.Exposition().find("trainflow_loss Nan"), std::string::npos);  // prometheus-cpp's spelling; Prometheus parses it
}

// trainflow_eval_loss has no sample before the first evaluation (a 0 would read as a loss); the
// evaluation before the first step is a record of its own, holding only val_loss.
TEST(MonitorTest, EvalLossAbsentUntilTheFirstEvaluation) {
  Monitor m(Info());
  m.RecordStep(Record(1));
  std::string text = m.Exposition();
  EXPECT_EQ(text.find("\ntrainflow_eval_loss"), std::string::npos) << text;
  m.RecordEval(1, 4.25);
  text = m.Exposition();
  EXPECT_NE(text.find("\ntrainflow_eval_loss 4.25"), std::string::npos) << text;

  Monitor before(Info());
  before.RecordEval(0, 5.5);
  before.RecordStep(Record(1));
  EXPECT_NE(before.Exposition().find("\ntrainflow_eval_loss 5.5"), std::string::npos);
  json j = json::parse(before.StepsJson(-1));
  ASSERT_EQ(j["steps"].size(), 2u) << j;
  EXPECT_EQ(j["steps"][0], (json{{"step", 0}, {"val_loss", 5.5}, {"time_unix", j["steps"][0]["time_unix"]}}));
  EXPECT_EQ(j["steps"][1]["step"], 1);
  EXPECT_FALSE(j["steps"][1].contains("val_loss"));
}

TEST(MonitorTest, RankZeroSummarisesTheRanks) {
  RunInfo info = Info(3);
  Monitor m(info);
  StepRecord r = Record(7);
  r.rank_busy_s = {0.10, 0.25, 0.12};
  m.RecordStep(r);
  const std::string text = m.Exposition();
  EXPECT_NE(text.find("trainflow_slowest_rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("trainflow_rank_busy_seconds{rank=\"1\"} 0.25"), std::string::npos);
  EXPECT_NE(text.find("trainflow_rank_busy_spread_seconds 0.15"), std::string::npos);
  json steps = json::parse(m.StepsJson(0));
  EXPECT_EQ(steps["steps"][0]["slowest_rank"], 1);
  json ranks = json::parse(m.RanksJson());
  ASSERT_EQ(ranks["ranks"].size(), 3u);
  EXPECT_EQ(ranks["ranks"][2]["busy_s"], 0.12);
}

}  // namespace
}  // namespace tf::monitor
