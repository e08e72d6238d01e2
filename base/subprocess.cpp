#include "base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace tf {

void ExecWithOutput(const std::vector<std::string>& argv, int out_fd) {
  ::dup2(out_fd, 1);
  ::dup2(out_fd, 2);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

int RunCommand(const std::vector<std::string>& argv, double timeout_s, std::string* output) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return -2;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return -2;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ExecWithOutput(argv, pipefd[1]);
  }
  ::close(pipefd[1]);
  ::fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  bool done = false;
  char buf[4096];
  while (true) {
    ssize_t n;
    while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) {
      if (output != nullptr && output->size() < 65536) output->append(buf, static_cast<size_t>(n));
    }
    if (!done && ::waitpid(pid, &status, WNOHANG) == pid) done = true;
    if (done && n <= 0) break;
    if (!done && std::chrono::steady_clock::now() > end) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(pipefd[0]);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (done && n == 0) break;
  }
  ::close(pipefd[0]);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string SelfExecutable(const std::string& fallback) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? fallback : exe.string();
}

}  // namespace tf
