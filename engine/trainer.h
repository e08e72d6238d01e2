// Trainer: the training loop of one rank. Owns the backend (CPU or CUDA model + optimizer, see
// engine/train_backend.h), the data loaders, and — in a data-parallel job — the communicator and
// the gradient reducer; reports progress; evaluates; samples; writes the final weights.
//
// One step: ZeroGrad; for each of grad_accum_steps micro-batches ForwardBackward with
// grad_scale = 1/accum (micro-batch index = step*accum + micro); on the last micro-batch only, the
// model's grad-ready hook feeds the reducer, which averages buckets over the ranks while backward
// continues (comm/reducer.h); wait for the reducer; AdamW (global-norm clip, schedule from
// engine/lr_schedule.h). The reported loss is the mean over ranks and micro-batches.
//
// Data parallelism: with world size W (comm/process_group.h), rank r reads global micro-batch
// i*W + r, so W ranks with batch B train exactly like one rank with batch W*B. Rank 0 broadcasts
// the initial weights and alone prints, samples and writes outputs. At start every rank checks
// that all ranks have the same model config, training config and data.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "engine/data_loader.h"
#include "engine/train_backend.h"
#include "engine/train_config.h"
#include "model/gpt2.h"
#include "model/tokenizer.h"

namespace tf {

struct StepStats {
  int step = 0;
  float loss = 0.0f;       // mean over the step's micro-batches
  float grad_norm = 0.0f;  // before clipping
  double lr = 0.0;
  double ms = 0.0;
  double tokens_per_s = 0.0;  // all ranks together
  // Data parallel (zeros when world size is 1 and no compression): comm/reducer.h ReducerStats.
  double comm_exposed_ms = 0.0;
  double comm_ms = 0.0;
  double codec_ms = 0.0;
  int64_t wire_bytes = 0;
};

struct TrainResult {
  std::vector<StepStats> steps;
  std::vector<std::pair<int, float>> val_losses;  // (step, loss); the last is after the final step
  std::vector<std::pair<int, std::string>> samples;
};

class Trainer {
 public:
  struct Options {
    bool print_progress = true;  // progress lines, eval results and samples on stdout
    bool write_outputs = true;   // weights, configs and metrics.jsonl in out_dir
    bool distributed = true;     // join the launcher's process group (false: always world size 1)
  };
  // Validates the run, loads data (and the tokenizer if samples are wanted) and initialises or
  // imports the weights. Errors name the offending key or file.
  static StatusOr<std::unique_ptr<Trainer>> Create(const GPT2Config& model, const TrainConfig& train,
                                                   Options options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StatusOr<TrainResult> Run();
  // Mean loss over the first n micro-batches of `loader` (a fixed set, comparable across evals).
  // In a data-parallel job each rank evaluates its shard and the mean is over all ranks.
  StatusOr<float> Evaluate(const DataLoader& loader, int n_batches);
  TrainBackend& backend() { return *backend_; }
  const comm::Topology& topology() const { return topology_; }
  // The codec chosen for gradient reduction ("none" when there is no reducer).
  std::string compression() const;
  ~Trainer();

 private:
  Trainer() = default;
  Status SetUpDataParallel();
  StatusOr<StepStats> Step(int step);
  // Barrier after rank-0-only work (sampling), without the collective deadline.
  Status WaitForRankZero();
  // Mean of `x` over ranks (x itself when world size is 1).
  StatusOr<double> MeanOverRanks(double x);
  std::string SampleText(int step);
  Status WriteOutputs(const TrainResult& result);

  GPT2Config model_config_;
  TrainConfig config_;
  Options options_;
  comm::Topology topology_;
  std::unique_ptr<TrainBackend> backend_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<comm::GradientReducer> reducer_;
  bool reduce_this_micro_step_ = false;  // the grad-ready hook forwards to the reducer only then
  bool device_dp_ = false;               // the backend reduces device gradients itself (NCCL)
  std::string device_codec_;             // its codec (chosen by auto or configured)
  std::string compression_reason_;       // why this codec (printed at start)
  std::vector<std::string> rank_devices_;  // "rank r on host (local rank l): device", every rank
  std::optional<DataLoader> train_data_, val_data_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GPT2> sampler_model_;  // host copy for sampling when the backend is a device
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace tf
