#include "engine/cli/test_faults.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/env.h"

namespace tf {
namespace {

class EnvironmentFaults : public FaultInjection {
 public:
  Status Start(int rank) override {
    if (!error_.ok()) return error_;
    rank_ = rank;
    if (hang_rank_ != rank || (!hang_marker_.empty() && ::access(hang_marker_.c_str(), F_OK) == 0)) hang_at_ = 0;
    return Status::OK();
  }

  void BeforeForward(int64_t step, int micro) override {
    if (fail_at_ > 0 && step >= fail_at_) {
      spdlog::warn("TRAINFLOW_TEST_FAIL_AT_STEP: rank {} kills itself in step {}", rank_, step);
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    if (delay_ms_ > 0 && micro == 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    if (hang_at_ > 0 && step == hang_at_) {
      spdlog::warn("TRAINFLOW_TEST_HANG_AT: rank {} hangs in step {}", rank_, step);
      if (!hang_marker_.empty()) (void)Env::Default()->WriteFileAtomically(hang_marker_, "hung\n");
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  Status error_ = Status::OK();
  int rank_ = 0;
  int hang_rank_ = -1;
  int64_t hang_at_ = 0;
  std::string hang_marker_;
  int64_t fail_at_ = 0;
  int delay_ms_ = 0;
};

}  // namespace

std::shared_ptr<FaultInjection> TestFaults(const std::function<const char*(const char*)>& getenv) {
  auto f = std::make_shared<EnvironmentFaults>();
  bool any = false;
  if (const char* hang = getenv("TRAINFLOW_TEST_HANG_AT")) {
    any = true;
    // RANK:STEP[:FILE]
    int rank = -1;
    long long at = 0;
    int used = 0;
    if (std::sscanf(hang, "%d:%lld%n", &rank, &at, &used) != 2 || rank < 0 || at < 1 ||
        (hang[used] != '\0' && hang[used] != ':')) {
      f->error_ = Status::InvalidArgument("TRAINFLOW_TEST_HANG_AT='{}': expected RANK:STEP[:FILE]", hang);
      return f;
    }
    f->hang_rank_ = rank;
    f->hang_at_ = at;
    f->hang_marker_ = hang[used] == ':' ? std::string(hang + used + 1) : "";
  }
  // The Slurm tests' hooks: a bad node's tasks fail; jobs slow enough to interrupt.
  for (const char* name : {"TRAINFLOW_TEST_FAIL_AT_STEP", "TRAINFLOW_TEST_STEP_DELAY_MS"}) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') continue;
    any = true;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 1000000000) {
      f->error_ = Status::InvalidArgument("{}='{}': expected a whole number >= 1", name, v);
      return f;
    }
    if (std::string_view(name) == "TRAINFLOW_TEST_FAIL_AT_STEP") {
      f->fail_at_ = n;
    } else {
      f->delay_ms_ = static_cast<int>(std::min<long long>(n, 60000));
    }
  }
  return any ? f : nullptr;
}

std::shared_ptr<FaultInjection> TestFaults() {
  return TestFaults([](const char* name) { return std::getenv(name); });
}

}  // namespace tf
