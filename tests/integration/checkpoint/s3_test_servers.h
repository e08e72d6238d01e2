// Servers and child processes for the S3 tests (s3_store_test.cpp, s3_checkpoint_test.cpp), on
// loopback only: s3rver (a local S3-compatible server installed by scripts/install_s3rver.sh, run
// with Node), tests/integration/checkpoint/s3_fault_proxy.py in front of it, and Child, a process killed by PID
// (or by process group) in its destructor and by the kernel when the test process dies first
// (PR_SET_PDEATHSIG). Without s3rver the server tests fail, naming the install script;
// TRAINFLOW_SKIP_S3_TESTS=1 skips them. ScopedAwsEnv isolates a test from the caller's AWS_*
// settings and restores them.
//
// Every owner of a process (Child, S3rver, FaultProxy) is not copyable. Not thread-safe: one test
// thread uses them.
#pragma once
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <curl/curl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace tf::s3_testing {

using Clock = std::chrono::steady_clock;

inline constexpr char kBucket[] = "tf-test";  // created by S3rver::Start (--configure-bucket)
inline constexpr char kAccessKey[] = "S3RVER";  // the key id s3rver knows; it does not check SigV4 secrets

inline double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline std::string Source(const std::string& rel) { return std::string(TF_SOURCE_DIR) + "/" + rel; }
inline std::string S3rverScript() { return Source("third_party/s3rver/node_modules/s3rver/bin/s3rver.js"); }
inline bool SkipServerTests() {
  const char* v = std::getenv("TRAINFLOW_SKIP_S3_TESTS");
  return v != nullptr && std::string(v) == "1";
}
// Failure naming the install script when s3rver is missing.
inline ::testing::AssertionResult S3rverInstalled() {
  if (::access(S3rverScript().c_str(), R_OK) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "s3rver is not installed (" << S3rverScript()
                                       << " is missing): run scripts/install_s3rver.sh (scripts/install_deps.sh "
                                          "calls it), or set TRAINFLOW_SKIP_S3_TESTS=1 to skip the S3 server tests";
}
// Loopback only: no request of ours, boto3's or the proxy's goes through a configured HTTP proxy.
inline void UnsetHttpProxies() {
  for (const char* v : {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}) {
    ::unsetenv(v);
  }
}

inline std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = dir + "/" + name;
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

inline bool PortOpen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct ChildOptions {
  std::string err_log;     // stderr's file; "" = the same file as stdout
  std::string cwd;         // "" = this process's
  bool own_group = false;  // its own process group, which Kill() kills whole
};

// A child process running argv[0] (a path) with stdout to `log`; killed (SIGKILL) by Kill() or the
// destructor, and by the kernel when this process dies first.
class Child {
 public:
  Child() = default;
  ~Child() { Kill(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // env: extra "NAME=value" entries, which win over this process's.
  bool Start(const std::vector<std::string>& argv, const std::string& log, const std::vector<std::string>& env = {},
             const ChildOptions& options = {}) {
    Kill();
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    const std::string& err_log = options.err_log.empty() ? log : options.err_log;
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {  // only async-signal-safe calls until exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      if (options.own_group) ::setpgid(0, 0);
      if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(127);
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = err_log == log ? out : ::open(err_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int in = ::open("/dev/null", O_RDONLY);
      if (out >= 0) ::dup2(out, 1);
      if (err >= 0) ::dup2(err, 2);
      if (in >= 0) ::dup2(in, 0);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    if (options.own_group) ::setpgid(pid, pid);  // also here, so that Kill() right away reaches the group
    pid_ = pid;
    group_ = options.own_group;
    return true;
  }
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == 0) return true;
    if (r == pid_) status_ = Decode(status);
    pid_ = -1;
    return false;
  }
  // Waits up to `seconds` for the exit: its code, 128 + the signal that ended it, or -1 when it was
  // killed at the limit (or never started).
  int Wait(double seconds) {
    const auto start = Clock::now();
    while (Running()) {
      if (Since(start) > seconds) {
        Kill();
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }
  // SIGKILL to the child (its whole group if it has one), then reaps it.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(group_ ? -pid_ : pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    status_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  static int Decode(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  }
  pid_t pid_ = -1;
  bool group_ = false;
  int status_ = -1;
};

// Starts `child` and waits (at most `seconds`) until it accepts connections on `port`.
inline ::testing::AssertionResult StartServer(Child& child, const std::vector<std::string>& argv,
                                              const std::string& log, int port, double seconds) {
  if (!child.Start(argv, log)) return ::testing::AssertionFailure() << "cannot fork for " << argv[0];
  const auto start = Clock::now();
  while (!PortOpen(port)) {
    if (!child.Running()) {
      return ::testing::AssertionFailure() << argv[0] << " " << argv[1] << " exited before listening on port " << port
                                           << "; its output:\n" << ReadFile(log);
    }
    if (Since(start) > seconds) {
      child.Kill();
      return ::testing::AssertionFailure() << argv[1] << " did not listen on port " << port << " within " << seconds
                                           << " s; its output:\n" << ReadFile(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return ::testing::AssertionSuccess();
}

// s3rver on 127.0.0.1:port storing into `dir`, with bucket kBucket and *.s3.localhost as the
// virtual-host domain. It keeps object `key` of bucket B in the file dir/B/<key>._S3rver_object,
// then writes <key>._S3rver_object.md5 and <key>._S3rver_metadata.json beside it, all in place: a
// kill mid-PUT can leave an object S3 would never show, and a half-written metadata file makes
// s3rver answer 500 to every listing of its prefix. Restart() therefore first removes the objects
// whose metadata file is missing or not JSON (PUTs that did not complete), as S3's atomic PUT would.
class S3rver {
 public:
  S3rver() = default;
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  ::testing::AssertionResult Start(const std::string& dir, int port, const std::string& log) {
    dir_ = dir;
    port_ = port;
    log_ = log;
    return Restart();
  }
  // Starts it again on the same directory and port (after Kill()), without its unfinished PUTs.
  ::testing::AssertionResult Restart() {
    DropUnfinishedObjects();
    const std::string node = FindOnPath("node");
    if (node.empty()) return ::testing::AssertionFailure() << "node is not on PATH (scripts/install_deps.sh)";
    // s3rver 3.7.1 encrypts continuation tokens with DES, which Node >= 17 (OpenSSL 3) has only in
    // OpenSSL's legacy provider.
    static const bool legacy = std::system((node + " --openssl-legacy-provider -e 0 >/dev/null 2>&1").c_str()) == 0;
    std::vector<std::string> argv = {node};
    if (legacy) argv.push_back("--openssl-legacy-provider");
    for (const std::string& a : {S3rverScript(), std::string("-d"), dir_, std::string("-a"), std::string("127.0.0.1"),
                                 std::string("-p"), std::to_string(port_), std::string("--silent"),
                                 std::string("--service-endpoint"), std::string("localhost"),
                                 std::string("--configure-bucket"), std::string(kBucket)}) {
      argv.push_back(a);
    }
    return StartServer(child_, argv, log_, port_, 30);
  }
  void Kill() { child_.Kill(); }
  bool Running() { return child_.Running(); }
  // REQUIRES: not running.
  void DropUnfinishedObjects() {
    namespace fs = std::filesystem;
    const std::string object = "._S3rver_object";
    std::vector<std::string> unfinished;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string path = it->path().string();
      if (!path.ends_with(object)) continue;
      const std::string base = path.substr(0, path.size() - object.size());
      const std::string metadata = ReadFile(base + "._S3rver_metadata.json");
      if (!nlohmann::json::accept(metadata)) unfinished.push_back(base);
    }
    for (const std::string& base : unfinished) {
      for (const char* suffix : {"._S3rver_object", "._S3rver_object.md5", "._S3rver_metadata.json"}) {
        fs::remove(base + suffix, ec);
      }
    }
  }
  int port() const { return port_; }
  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }
  // Where s3rver keeps the objects of kBucket whose keys start with `prefix/`.
  std::string PrefixDir(const std::string& prefix) const { return dir_ + "/" + kBucket + "/" + prefix; }
  // The file holding object `key` of kBucket.
  std::string ObjectFile(const std::string& key) const { return dir_ + "/" + kBucket + "/" + key + "._S3rver_object"; }

 private:
  std::string dir_, log_;
  int port_ = 0;
  Child child_;
};

inline size_t AppendToString(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// tests/integration/checkpoint/s3_fault_proxy.py on 127.0.0.1:port in front of 127.0.0.1:upstream.
class FaultProxy {
 public:
  FaultProxy() = default;
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  ::testing::AssertionResult Start(int port, int upstream, const std::string& log) {
    port_ = port;
    const std::string python = FindOnPath("python3");
    if (python.empty()) return ::testing::AssertionFailure() << "python3 is not on PATH";
    return StartServer(child_, {python, Source("tests/integration/checkpoint/s3_fault_proxy.py"), "--port", std::to_string(port),
                                "--upstream-port", std::to_string(upstream)},
                       log, port, 30);
  }
  // GET /__proxy/<what>, parsed; null when the proxy does not answer.
  nlohmann::json Control(const std::string& what) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL* h = curl_easy_init();
    std::string body;
    const std::string url = fmt::format("http://127.0.0.1:{}/__proxy/{}", port_, what);
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, AppendToString);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    const CURLcode code = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (code != CURLE_OK) return nullptr;
    return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  }
  // Arms a fault (s3_fault_proxy.py's config query) and clears the counters.
  void Arm(const std::string& query) { ASSERT_FALSE(Control("config?" + query).is_null()) << query; }
  nlohmann::json Stats() { return Control("stats"); }
  int Requests() { return Stats().value("requests", -1); }
  int Faults() { return Stats().value("faults", -1); }
  int Kind(const std::string& kind) {
    const nlohmann::json s = Stats();
    return s.contains("kinds") ? s["kinds"].value(kind, 0) : -1;
  }
  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }
  int port() const { return port_; }

 private:
  int port_ = 0;
  Child child_;
};

// Runs argv (argv[0] a path) with extra env entries; its stdout and stderr in *output.
inline int RunCommand(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      const std::string& log, std::string* output, double seconds = 60) {
  Child child;
  if (!child.Start(argv, log, env)) return -1;
  const int status = child.Wait(seconds);
  *output = ReadFile(log);
  return status;
}

// Saves the variables S3OptionsFromEnvironment reads, unsets them (all but HOME), and restores
// them on destruction.
class ScopedAwsEnv {
 public:
  ScopedAwsEnv() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v == nullptr ? std::optional<std::string>() : std::optional<std::string>(v));
      if (std::string(name) != "HOME") ::unsetenv(name);
    }
  }
  ~ScopedAwsEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedAwsEnv(const ScopedAwsEnv&) = delete;
  ScopedAwsEnv& operator=(const ScopedAwsEnv&) = delete;
  void Set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

 private:
  static constexpr const char* kNames[] = {
      "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
      "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
      "HOME"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace tf::s3_testing
