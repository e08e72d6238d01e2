// trainflow: the single binary. Only main() turns errors into exit codes (base/status.h ExitCode,
// docs/exit-codes.md).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "base/log.h"
#include "base/status.h"
#include "base/stop_signal.h"
#include "comm/process_group.h"
#include "engine/cli/cli.h"
#include "launch/rank_agent.h"

int main(int argc, char** argv) {
  tf::LogOptions log;
  log.rank = tf::RankFromEnvironment();
  if (const char* level = std::getenv("TRAINFLOW_LOG_LEVEL")) log.level = level;
  if (const char* file = std::getenv("TRAINFLOW_LOG_FILE")) log.file = file;
  if (tf::Status s = tf::InitLogging(log); !s.ok()) spdlog::warn("{}", s.message());
  // SIGINT/SIGTERM stop `train` after the step in progress (it polls the request); every other
  // command ends at once, as a signal's default action does (nothing else polls it).
  const char* command = nullptr;
  for (int i = 1; i < argc && command == nullptr; ++i) {
    if (argv[i][0] != '-') command = argv[i];
  }
  if (command != nullptr && std::strcmp(command, "train") == 0) {
    tf::InstallStopSignalHandlers(/*escalate=*/!tf::launch::SupervisedProcess());
  }
  // Library code reports errors as Status; this is the last line of defence against an exception
  // escaping from a dependency (e.g. allocation failure in a standard container).
  int rc = tf::kExitInternal;
  try {
    rc = tf::RunCli(argc, argv);
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory");
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  // A rank that fails alone in a data-parallel job must take the job down: its peers may be
  // waiting in a collective it will never join (MPI_Finalize would wait for them in turn).
  if (rc != tf::kExitOk && rc != tf::kExitStopped) {
    // Under `trainflow launch` the supervisor tears the job down (after the survivors' rescue,
    // which MPI_Abort would cut short); MPI_Finalize would wait for peers that are gone.
    if (tf::launch::SupervisedProcess()) tf::launch::QuickExit(rc);
    tf::comm::AbortProcessGroupOnError(rc);
  }
  return rc;
}
