#include "launch/seams.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/net.h"
#include "base/subprocess.h"

namespace tf::launch {
namespace {

class RealClock final : public Clock {
 public:
  double Mono() override { return MonotonicSeconds(); }
  double Wall() override { return UnixSeconds(); }
  void Sleep(double seconds) override { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }
};

std::string ReadProcFile(int64_t pid, const char* name, bool* found) {
  std::ifstream f(fmt::format("/proc/{}/{}", pid, name));
  *found = static_cast<bool>(f);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

class PosixLauncher final : public ProcessLauncher {
 public:
  StatusOr<int64_t> Start(const LaunchCommand& c) override {
    for (const auto& [name, value] : c.env) ::setenv(name.c_str(), value.c_str(), 1);
    const pid_t pid = ::fork();
    if (pid < 0) return Status::IOError("fork: {}", std::strerror(errno));
    if (pid == 0) {
      ::setsid();
      for (const auto& [name, value] : c.child_env) {
        if (value.empty()) {
          ::unsetenv(name.c_str());
        } else {
          ::setenv(name.c_str(), value.c_str(), 1);
        }
      }
      ExecWithOutput(c.argv, c.log_fd);
    }
    for (const std::string& name : c.forget) ::unsetenv(name.c_str());
    return static_cast<int64_t>(pid);
  }
  bool Ended(int64_t pid, int* status) override {
    return ::waitpid(static_cast<pid_t>(pid), status, WNOHANG) == pid;
  }
  bool Running(int64_t pid, int64_t start_time) override {
    return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) == 0 && StartTime(pid) == start_time;
  }
  // Field 22 of /proc/PID/stat (start time in clock ticks): tells a process from a later one with its PID.
  int64_t StartTime(int64_t pid) override {
    bool found = false;
    const std::string text = ReadProcFile(pid, "stat", &found);
    const size_t close = text.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 22 && rest >> field; ++i) {
      if (i == 22) return std::stoll(field);
    }
    return -1;
  }
  void KillSession(int64_t pid) override { ::kill(-static_cast<pid_t>(pid), SIGKILL); }
  void Reap(int64_t pid) override { ::waitpid(static_cast<pid_t>(pid), nullptr, 0); }
  std::optional<std::string> Stat(int64_t pid) override {
    bool found = false;
    std::string text = ReadProcFile(pid, "stat", &found);
    if (!found) return std::nullopt;
    return text;
  }
  std::string Cmdline(int64_t pid) override {
    bool found = false;
    return ReadProcFile(pid, "cmdline", &found);
  }
  void Kill(int64_t pid) override { ::kill(static_cast<pid_t>(pid), SIGKILL); }
};

class CommandShell final : public RemoteShell {
 public:
  CommandShell(std::string rsh_agent, std::string srun, std::string slurm_job_id)
      : rsh_agent_(std::move(rsh_agent)), srun_(std::move(srun)), slurm_job_id_(std::move(slurm_job_id)) {}
  int Run(const std::string& host, const std::string& script, double timeout_s, std::string* output) override {
    return RunCommand(Argv(host, script), timeout_s, output);
  }
  int RunHere(const std::vector<std::string>& argv, double timeout_s, std::string* output) override {
    return RunCommand(argv, timeout_s, output);
  }
  bool IsLocal(const std::string& host) override {
    return host == "localhost" || host.starts_with("127.") || host == HostName();
  }

 private:
  std::vector<std::string> Argv(const std::string& host, const std::string& script) const {
    if (!srun_.empty()) {
      // A helper step beside the job's (--overlap: it needs none of the step's resources).
      return {srun_, "--overlap", "--jobid=" + slurm_job_id_, "--nodes=1", "--ntasks=1", "--nodelist=" + host,
              "--quiet", "--mpi=none", "--job-name=trainflow-helper", "/bin/sh", "-c", script};
    }
    std::vector<std::string> argv;
    std::istringstream words(rsh_agent_.empty() ? std::string("ssh") : rsh_agent_);
    for (std::string w; words >> w;) argv.push_back(w);
    argv.push_back(host);
    argv.push_back(script);
    return argv;
  }

  const std::string rsh_agent_, srun_, slurm_job_id_;
};

class ServerTransport final : public HeartbeatTransport {
 public:
  explicit ServerTransport(std::unique_ptr<HeartbeatServer> server) : server_(std::move(server)) {}
  int port() const override { return server_->port(); }
  std::vector<Event> Poll(double timeout_s) override { return server_->Poll(timeout_s); }
  bool Send(int conn, const nlohmann::json& body) override { return server_->Send(conn, body); }
  void Close(int conn) override { server_->Close(conn); }

 private:
  std::unique_ptr<HeartbeatServer> server_;
};

std::atomic<int> g_signals{0};
std::atomic<int> g_warnings{0};
extern "C" void OnSupervisorSignal(int) { g_signals.fetch_add(1); }
extern "C" void OnSupervisorWarning(int) { g_warnings.fetch_add(1); }

class PosixSignals final : public SignalSource {
 public:
  void Install() override {
    struct sigaction sa{};
    sa.sa_handler = OnSupervisorSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    struct sigaction warn{};
    warn.sa_handler = OnSupervisorWarning;
    sigemptyset(&warn.sa_mask);
    ::sigaction(SIGUSR1, &warn, nullptr);
  }
  int stops() override { return g_signals.load(); }
  int warnings() override { return g_warnings.load(); }
};

}  // namespace

Clock* SystemClock() {
  static RealClock clock;
  return &clock;
}

ProcessLauncher* SystemLauncher() {
  static PosixLauncher launcher;
  return &launcher;
}

std::unique_ptr<RemoteShell> NewCommandShell(std::string rsh_agent, std::string srun, std::string slurm_job_id) {
  return std::make_unique<CommandShell>(std::move(rsh_agent), std::move(srun), std::move(slurm_job_id));
}

TransportFactory HeartbeatServerTransport() {
  return [](const std::string& host, int port,
            const std::string& secret) -> StatusOr<std::unique_ptr<HeartbeatTransport>> {
    TF_ASSIGN_OR_RETURN(auto server, HeartbeatServer::Listen(host, port, secret));
    return std::unique_ptr<HeartbeatTransport>(std::make_unique<ServerTransport>(std::move(server)));
  };
}

SignalSource* ProcessSignals() {
  static PosixSignals signals;
  return &signals;
}

}  // namespace tf::launch
