#include "base/stop_signal.h"

#include <signal.h>

#include <atomic>

namespace tf {
namespace {

std::atomic<int> g_stop{0};      // 0: none; -1: programmatic; else the signal number
std::atomic<int> g_signals{0};   // signals received
std::atomic<bool> g_escalate{true};

extern "C" void OnStopSignal(int sig) {
  if (g_signals.fetch_add(1) >= 1 && g_escalate.load()) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop.store(sig);
}

}  // namespace

void InstallStopSignalHandlers(bool escalate) {
  g_escalate.store(escalate);
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool StopRequested() { return g_stop.load() != 0; }
int StopSignal() { return g_stop.load() > 0 ? g_stop.load() : 0; }
void RequestStop() {
  int expected = 0;
  g_stop.compare_exchange_strong(expected, -1);
}
void ClearStopRequest() {
  g_stop.store(0);
  g_signals.store(0);
}

}  // namespace tf
