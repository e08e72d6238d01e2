// The engine side of monitor/: builds the run's Monitor (registry and dashboard data), its process
// and GPU collector and its HTTP endpoint from the training config, and the step observer that
// feeds them after every step (StepStats -> monitor::StepRecord, checkpoint counters, evaluations,
// samples, anomalies, rollbacks, the end). Also the model-FLOPs arithmetic behind MFU.
//
// Every rank serves its own endpoint at metrics_addr's port + local rank (docs/monitoring.md) and
// logs "monitor: rank R at http://HOST:PORT/"; rank 0 of several also exports the cross-rank
// summaries, which ride on the step's loss reduction (Trainer::GatherRankTimes). Thread safety: the
// observer runs on the training thread; the server reads the Monitor from its own threads.
#pragma once
#include <memory>
#include <optional>

#include "engine/trainer.h"

namespace tf {

// nullptr when metrics_addr is "off" or "". Errors: the address cannot be bound, the token file
// cannot be read.
StatusOr<std::unique_ptr<StepObserver>> MakeMonitorObserver(Trainer& trainer);

// Training FLOPs per token: 6 x parameters + 12 x layers x seq_len x n_embd (attention scores and
// values, forward and backward).
double FlopsPerToken(const GPT2Config& model, int seq_len);
// The peak TFLOP/s of one rank for MFU: peak_tflops when set; else a known GPU's dense datasheet
// figure for the dtype (bf16 tensor cores; fp32 without TF32), or the CPU's cores x max clock x FMA
// width; nullopt when unknown.
std::optional<double> PeakTflops(const TrainConfig& train, const std::string& device_description);

}  // namespace tf
