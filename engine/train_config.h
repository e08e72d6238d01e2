// Training configuration: everything about a run that is not the model's shape, parsed from JSON
// with strict validation (unknown keys, wrong types and impossible values are InvalidArgument
// naming the key and the source). A key's default is its member's initializer below; its type,
// range, check and meaning are its row in the one table of keys in train_config.cpp, from which
// the reader, TrainConfigToJson, `train --help` and docs/configs.md's keys table all come.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/json.h"  // ReadJsonFile
#include "base/status.h"
#include "model/config.h"

namespace tf {

enum class LrDecay { kCosine, kLinear, kConstant };

struct TrainConfig {
  // Batch shape.
  int batch_size = 4;        // B: sequences per micro-batch
  int seq_len = 64;          // T: tokens per sequence (<= model block_size)
  int grad_accum_steps = 1;  // micro-batches per optimizer step (gradients averaged)
  int64_t max_steps = 100;   // optimizer steps
  // AdamW.
  double lr = 6e-4;
  double min_lr = 6e-5;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // Schedule: linear warm-up over warmup_steps, then lr_decay down to min_lr at max_steps.
  int warmup_steps = 0;
  LrDecay lr_decay = LrDecay::kCosine;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
  // Evaluation, logging, sampling (intervals in steps; 0 = only at the end / never for samples).
  int eval_interval = 0;
  int eval_batches = 8;
  int log_interval = 1;
  int sample_interval = 0;
  int sample_tokens = 128;
  double sample_temperature = 0.8;
  int sample_top_k = 0;  // 0 = no top-k filter
  std::string sample_prompt;
  // Data, output, misc.
  std::string train_data;
  std::string val_data;
  std::string tokenizer = "auto";  // "auto", "byte" or "gpt2"
  std::string tokenizer_dir;
  std::string out_dir = "out";
  std::string init_from;  // safetensors file with Hugging Face GPT-2 names, or "" for a fresh init
  // Exact resume (engine/train_state.h) and reruns (docs/checkpoints.md, "Running the same
  // command again").
  std::string resume_state;
  bool save_state = false;
  int64_t stop_at_step = 0;
  bool fresh = false;
  bool extend = false;
  // Checkpoints (checkpoint/, docs/checkpoints.md).
  std::string checkpoint_dir;
  int64_t checkpoint_interval = 0;
  double checkpoint_every_s = 0;
  std::string resume = "auto";
  int checkpoint_keep_last = 3;
  int64_t checkpoint_keep_every = 0;
  int checkpoint_full_every = 1;
  std::string checkpoint_when_busy = "skip";
  std::string checkpoint_writer_priority = "normal";  // or "idle"
  bool checkpoint_async = true;  // false: wait for each write (the synchronous baseline)
  double checkpoint_chunk_mb = 16;
  bool checkpoint_compress = true;
  uint64_t seed = 1337;
  int threads = 0;  // OpenMP threads; 0 = all cores
  bool shuffle = false;
  // Backend ("auto", "cpu", "cuda") and the CUDA backend's options (model/gpt2_cuda.h, docs/cuda.md).
  std::string device = "auto";
  std::string dtype = "bf16";
  std::string attention = "flash";
  int recompute = 0;
  int gelu_fusion = -1;  // -1: model/gpt2_cuda.h's default
  bool fuse_residual = true;
  bool deterministic = true;
  // Data parallelism (comm/, docs/distributed.md).
  std::string compression = "none";
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool error_feedback = true;
  // ZeRO: 0 replicates the training state on every rank; 1 shards the optimizer moments (and, on a
  // GPU, the fp32 master weights), 2 also the gradients, 3 also the parameters (docs/distributed.md).
  int zero_stage = 0;
  // ZeRO replica groups (hybrid sharding): the state is sharded within groups of this many
  // consecutive ranks and replicated across the groups; 0: one group of all ranks. Must divide the
  // world size (CheckShardGroupSize).
  int shard_group_size = 0;
  // Monitoring (monitor/, docs/monitoring.md).
  std::string metrics_addr = "127.0.0.1:9470";
  std::string metrics_token_file;
  double peak_tflops = 0;
  // Anomaly guards (engine/anomaly_guard.h).
  std::string anomaly_nonfinite = "stop";
  std::string anomaly_spike = "warn";
  double anomaly_zscore = 8.0;
  int anomaly_window = 100;
  int anomaly_max_skips = 10;      // consecutive skipped updates before the run stops
  int anomaly_max_rollbacks = 3;   // rollbacks in one process before the run stops

  int64_t tokens_per_step() const { return int64_t{batch_size} * seq_len * grad_accum_steps; }
};

StatusOr<TrainConfig> ParseTrainConfig(const nlohmann::json& j, const std::string& source);
nlohmann::json TrainConfigToJson(const TrainConfig& config);

// Applies "--key value" overrides: a key of the model config goes to `model`, any other to
// `train` (validated later by the parsers, so unknown keys are still rejected). The value is
// parsed as JSON when it is valid JSON (numbers, true/false), else taken as a string.
// Rewrites the relative paths among `train`'s keys (train_data, out_dir, ...) as absolute paths
// under `base_dir` (itself made absolute against the current directory); s3:// locations and
// resume's "auto" and "none" stay as they are.
void ResolveConfigPaths(const std::string& base_dir, nlohmann::json* train);
// Whether `key` is a training config key of type boolean (a bare `--key` on the command line
// means true).
bool IsBooleanTrainKey(const std::string& key);
// The model config keys, then every training config key with its type, default and help (one per
// line), for `train --help`.
std::string ConfigKeysHelp();
// The lines of ConfigKeysHelp for the training config keys `keys` (unknown ones left out).
std::string TrainKeysHelp(const std::vector<std::string>& keys);
// The keys table of docs/configs.md ("| key | type | default | meaning |", one row per key).
std::string TrainConfigKeysMarkdown();

void ApplyOverrides(const std::vector<std::pair<std::string, std::string>>& overrides, nlohmann::json* model,
                    nlohmann::json* train);

// Cross-checks a run: seq_len <= block_size, and so on. Messages name both keys.
Status ValidateRun(const GPT2Config& model, const TrainConfig& train);
// shard_group_size against zero_stage and, when world > 0, the world size it must divide:
// InvalidArgument naming the keys and numbers.
Status CheckShardGroupSize(const TrainConfig& train, int world);
// OK when tokenizer `kind` has exactly the model's vocab_size (or is unknown); else InvalidArgument
// "<whose> tokenizer 'byte' has 256 tokens, but the model has vocab_size 50257: <what to do>".
Status CheckTokenizerFitsModel(const std::string& kind, const GPT2Config& model, const std::string& whose);

}  // namespace tf
