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
  // "auto" (what the token files record, else what the vocabulary implies), "byte" or "gpt2";
  // tokenizer_dir: the GPT-2 files ("" = search, model/tokenizer.h FindGpt2TokenizerDir).
  std::string tokenizer = "auto";
  std::string tokenizer_dir;
  std::string out_dir = "out";
  std::string init_from;  // safetensors file with Hugging Face GPT-2 names, or "" for a fresh init
  // Exact resume (engine/train_state.h): start from this training state file ("" = step 0);
  // save_state: also write out_dir/train_state.safetensors (one per rank) with the outputs;
  // stop_at_step: stop after this step as a SIGTERM would (state saved, exit code 5); 0 = never.
  std::string resume_state;
  bool save_state = false;
  int64_t stop_at_step = 0;
  // A rerun into an out_dir or checkpoint_dir that an earlier run left (docs/checkpoints.md,
  // "Running the same command again"): fresh starts over at step 0 whatever is there; extend
  // continues that run's state with this run's max_steps and schedule (a new trajectory from the
  // resumed step on).
  bool fresh = false;
  bool extend = false;
  // Checkpoints (checkpoint/, docs/checkpoints.md): where (a directory on a local or shared file
  // system, or s3://bucket/prefix), how often (steps and/or seconds; a stop and the end of the run
  // always write one), what to resume from ("auto": the newest valid checkpoint in checkpoint_dir,
  // if any; "none"; or one checkpoint's location), retention, incremental checkpoints (a full one
  // every checkpoint_full_every), the policy when one is due while two are still being written
  // ("skip" or "wait"), the chunk size and compression.
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
  // Backend: "auto" (cuda when a GPU is visible and the build has CUDA, else cpu), "cpu", "cuda";
  // dtype of the CUDA backend's parameters/activations/gradients: "bf16" or "fp32".
  std::string device = "auto";
  std::string dtype = "bf16";
  // CUDA backend model options (model/gpt2_cuda.h, docs/cuda.md): attention "flash" (fused kernels
  // of our own), "flash_simt" (their SIMT path), "gemm" (cuBLAS, stores the T x T probabilities) or
  // "cudnn" (cuDNN's fused attention, bf16, libcudnn.so.9 loaded at run time);
  // activation recomputation 0 (store all), 1 (GELU) or 2 (GELU and LayerNorms; the least memory).
  std::string attention = "flash";
  int recompute = 0;
  // GELU in the MLP GEMMs' cuBLASLt epilogues: -1 default (model/gpt2_cuda.h), 0 off, 1 forward,
  // 2 forward and backward.
  int gelu_fusion = -1;
  // false: separate residual-add kernels instead of folding them into the GEMM epilogues.
  bool fuse_residual = true;
  // false: cuDNN attention's faster backward with fp32 atomics (runs are then not bit-reproducible).
  bool deterministic = true;
  // Data parallelism (comm/, docs/distributed.md): gradient compression codec ("none", "bf16",
  // "fp16", "int8", "int8-sr", "sign", "topk:D", or "auto" = measure and choose at start),
  // reducer bucket sizes, and error feedback for lossy codecs.
  std::string compression = "none";
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool error_feedback = true;
  // Monitoring (monitor/, docs/monitoring.md): the HTTP endpoint every rank serves (/metrics and
  // the dashboard) at HOST:PORT + local rank ("off" or "": none; port 0: any free port), an
  // optional bearer-token file, and the peak TFLOP/s per rank for MFU (0: known GPUs' datasheet
  // figure, the CPU's from its cores, clock and vector width).
  std::string metrics_addr = "127.0.0.1:9470";
  std::string metrics_token_file;
  double peak_tflops = 0;
  // Anomaly guards (engine/anomaly_guard.h): the action on a non-finite loss or gradient norm and
  // on a spike (log(1 + value) more than anomaly_zscore standard deviations above the mean of the
  // last anomaly_window accepted steps'): "warn", "skip" (the update is not applied), "stop", "rollback"
  // (to the newest checkpoint, skipping the data since), or "off" (spikes only).
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
// The keys table of docs/configs.md ("| key | type | default | meaning |", one row per key).
std::string TrainConfigKeysMarkdown();

void ApplyOverrides(const std::vector<std::pair<std::string, std::string>>& overrides, nlohmann::json* model,
                    nlohmann::json* train);

// Cross-checks a run: seq_len <= block_size, and so on. Messages name both keys.
Status ValidateRun(const GPT2Config& model, const TrainConfig& train);
// OK when tokenizer `kind` has exactly the model's vocab_size (or is unknown); else InvalidArgument
// "<whose> tokenizer 'byte' has 256 tokens, but the model has vocab_size 50257: <what to do>".
Status CheckTokenizerFitsModel(const std::string& kind, const GPT2Config& model, const std::string& whose);

}  // namespace tf
