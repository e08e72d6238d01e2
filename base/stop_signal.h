// A process-wide stop request: SIGINT/SIGTERM set a flag that the training loop polls after each
// step (finish the step, write the outputs, exit with kExitStopped). A second signal of either kind
// restores the default action and re-raises it, so an impatient Ctrl-C still ends the process —
// unless `escalate` is false (a rank under `trainflow launch`: the launcher's teardown signals must
// not cut short a survivor's rescue; the supervisor ends it, with SIGKILL at worst).
// Thread safety: the flag is a lock-free atomic; Install is called once by main() before threads.
#pragma once

namespace tf {

void InstallStopSignalHandlers(bool escalate = true);
bool StopRequested();
int StopSignal();       // the signal that asked (0 = none, or a programmatic request)
void RequestStop();     // as a signal would (tests, stop_at_step)
void ClearStopRequest();

}  // namespace tf
