// FaultInjection: the points where tests of the supervisor and the scheduler make a rank fail on
// purpose (hang, die, run slowly), called by the Trainer (engine/trainer.h) when
// Trainer::Options::faults is set, and never otherwise. `trainflow train` sets it from the
// TRAINFLOW_TEST_* variables (engine/cli/test_faults.h; docs/fault-tolerance.md "Testing hooks").
// Thread safety: called from the training thread only.
#pragma once
#include <cstdint>

#include "base/status.h"

namespace tf {

class FaultInjection {
 public:
  virtual ~FaultInjection() = default;
  // Once, when the rank is known (after joining the process group, before any data is read). An
  // error ends Trainer::Create with it.
  virtual Status Start(int rank) { return Status::OK(); }
  // In step `step` (1-based), before micro-batch `micro`'s forward pass, in phase compute. May
  // sleep, never return (a hang) or end the process.
  virtual void BeforeForward(int64_t step, int micro) {}
};

}  // namespace tf
