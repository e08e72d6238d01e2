// `trainflow bench`: times Trainer::Step — the step `trainflow train` runs, on the backend the
// training config selects (CPU or CUDA, every model option from engine/train_config.h) — on
// synthetic tokens, on one rank or on every rank of an mpirun/srun job (data parallelism, ZeRO
// with --zero-stage N, rank 0 reporting). Warm-up steps are excluded; reports the median (and min/max) of N steps,
// tokens/s and the achieved FLOP rate counting 6 * params * tokens per step; on CUDA also MFU and,
// with profile_steps, each piece of GPU work against its roofline (model/step_work.h). The
// command and its flags: AddBenchCommand (engine/cli/command.h), in bench.cpp.
#pragma once
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/train_config.h"
#include "model/config.h"

namespace tf {

struct BenchOptions {
  int steps = 20, warmup = 3;
  bool gemm_peak = false;  // also measure the machine's SGEMM rate in the same run (CPU)
  double peak_tflops = 0;  // CUDA: the device's peak for MFU (0 = its datasheet figure, engine/monitoring.h; else H100's)
  // CUDA: after the timed steps, this many more steps with every piece of GPU work timed by name
  // (cuda::RangeProfiler), printed as a table (0 = none).
  int profile_steps = 0;
};

struct BenchResult {
  std::string device;  // the device the steps ran on: "cpu" or "cuda"
  std::string describe;  // the backend's description
  double median_ms = 0, min_ms = 0, max_ms = 0, tokens_per_s = 0, gflops = 0;
  double gemm_peak_gflops = 0;  // 0 when not measured
  double mfu = 0;               // CUDA: achieved FLOP/s over peak_tflops
  // CUDA: the same with llm.c's count, 6 * params + 6 * n_layer * n_embd * T FLOPs per token (the
  // causal attention's score and value products included), for comparing with its MFU figures.
  double mfu_with_attention = 0;
  double planned_gb = 0;      // CUDA: the model's planned device buffers (GPT2Cuda::memory().total)
  double device_used_gb = 0;  // CUDA: device memory in use after the steps (cudaMemGetInfo), all of it
  std::string cuda_options;   // CUDA: the model options in effect, defaults resolved
  // CUDA with profile_steps > 0: GPU ms per step by piece of work, largest first.
  struct ProfileRow {
    std::string name;
    double ms_per_step = 0;
    double calls_per_step = 0;
    // The piece's least time at the peak FLOP rate and the measured copy bandwidth (model/step_work.h);
    // < 0 when the work model has no such piece.
    double roofline_ms = -1;
  };
  std::vector<ProfileRow> profile;
  // CUDA with profile_steps > 0: the device-to-device copy bandwidth measured for the roofline (GB/s),
  // and the whole step at the roofline (every modelled piece at its ceiling): its ms and the MFU
  // (6*params count) that would give — the most this structure of the step can reach.
  double copy_gbs = 0;
  double peak_tflops = 0;  // CUDA: the peak the MFU and the roofline use
  int rank = 0, world = 1;             // under mpirun/srun: every rank runs the steps, rank 0 reports
  std::vector<double> peak_rss_bytes;  // each rank's peak resident set size after the steps, by rank
  double peak_rss_max = 0;             // the largest of them
  std::string state_bytes;             // the state one rank holds, as planned (engine/memory_plan.h)
  double roofline_step_ms = 0;
  double roofline_mfu = 0;
};

// `train` supplies the batch shape (batch_size, seq_len, grad_accum_steps), the device and the
// model options; its data, output and evaluation keys are ignored.
StatusOr<BenchResult> RunBench(const GPT2Config& config, TrainConfig train, const BenchOptions& options);
// Median GFLOP/s of a float GEMM through the build's engine (cpu::matmul_forward) (n x k) @ (k x m), warm-up excluded: the machine ceiling.
double MeasureGemmPeak(int n, int k, int m, int reps);

}  // namespace tf
