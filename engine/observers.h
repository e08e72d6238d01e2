// The built-in step observers (engine/trainer.h StepObserver), added by Trainer::Create in this
// order: evaluation (val loss at step 0 when eval_interval > 0, every eval_interval steps and at the
// end), sampling (every sample_interval steps and at the end, rank 0), the progress line (rank 0,
// stdout) and metrics.jsonl (rank 0: one JSON line per step, appended and flushed as the step
// ends, holding that step's evaluation; the evaluation before training is an "eval" event line). The checkpointer, metrics registry and heartbeat are added the
// same way. Thread safety: run on the training thread.
#pragma once
#include <memory>
#include <string>

#include "engine/trainer.h"

namespace tf {

std::unique_ptr<StepObserver> MakeEvalObserver();
std::unique_ptr<StepObserver> MakeSampleObserver();
std::unique_ptr<StepObserver> MakeProgressObserver();
// Appends to `path` (created fresh at the first step of a run from step 0, appended to on resume).
std::unique_ptr<StepObserver> MakeMetricsJsonlObserver(std::string path);

}  // namespace tf
