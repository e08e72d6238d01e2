// Trainer: the training loop for one process (CPU backend). Owns the model, optimizer and data
// loaders for a run; reports progress; evaluates; samples; writes the final weights.
//
// One step: ZeroGrad; for each of grad_accum_steps micro-batches ForwardBackward with
// grad_scale = 1/accum (micro-batch index = step*accum + micro); AdamW (global-norm clip,
// schedule from engine/lr_schedule.h). Later issues hook the gradient reducer into the model's
// grad-ready hook and the checkpointer between steps.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/data_loader.h"
#include "engine/optimizer.h"
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
  double tokens_per_s = 0.0;
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
  };
  // Validates the run, loads data (and the tokenizer if samples are wanted) and initialises or
  // imports the weights. Errors name the offending key or file.
  static StatusOr<std::unique_ptr<Trainer>> Create(const GPT2Config& model, const TrainConfig& train,
                                                   Options options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StatusOr<TrainResult> Run();
  // Mean loss over the first n micro-batches of `loader` (a fixed set, comparable across evals).
  float Evaluate(const DataLoader& loader, int n_batches);
  GPT2& model() { return *model_; }

 private:
  Trainer() = default;
  StepStats Step(int step);
  std::string SampleText(int step);
  Status WriteOutputs(const TrainResult& result);

  GPT2Config model_config_;
  TrainConfig config_;
  Options options_;
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::optional<DataLoader> train_data_, val_data_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace tf
