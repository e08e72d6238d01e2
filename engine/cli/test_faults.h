// The fault injection of `trainflow train` for the chaos and Slurm tests (engine/fault_injection.h),
// from environment variables (docs/fault-tolerance.md "Testing hooks"):
//   TRAINFLOW_TEST_HANG_AT=RANK:STEP[:FILE]  rank RANK hangs (heartbeating) in the forward pass of
//       step STEP; with FILE only once: the file is created when the hang begins, and a rank started
//       while it exists does not hang.
//   TRAINFLOW_TEST_FAIL_AT_STEP=N            every rank kills itself (SIGKILL) in step N or later.
//   TRAINFLOW_TEST_STEP_DELAY_MS=N           every step sleeps N ms (at most 60000): slow jobs.
// A malformed value is an InvalidArgument from Start (so Trainer::Create fails with it).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "engine/fault_injection.h"

namespace tf {

// nullptr when none of the variables is set. `getenv` reads a variable (nullptr: unset).
std::shared_ptr<FaultInjection> TestFaults(const std::function<const char*(const char*)>& getenv);
// The same from this process's environment.
std::shared_ptr<FaultInjection> TestFaults();

}  // namespace tf
