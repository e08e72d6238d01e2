#include "engine/train_config.h"

#include "base/env.h"
#include "base/json.h"
#include "base/net.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/codec.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

using json = nlohmann::json;

// How one key is read from JSON into a TrainConfig, written back (TrainConfigToJson), checked once
// every key is read, and described (its type and range, for `train --help` and docs/configs.md).
struct Field {
  const char* json_type;  // "an integer", "a number", "a string", "a boolean": what overrides parse to
  std::string type;       // as documented: "int >= 1", "number in [0, 10]", "`skip` or `wait`", "path"
  std::function<Status(const json&, TrainConfig*, const std::string& key)> read;
  std::function<json(const TrainConfig&)> write;
  // After every key is read: a value outside the key's set, or one that needs another key.
  std::function<Status(const TrainConfig&, const std::string& key)> check;
  bool path = false;  // a file or directory (ResolveConfigPaths)
};

// One training config key: its field, a one-line help (`train --help`) and the meaning column of
// docs/configs.md's keys table (markdown; "" = the help). The default is the TrainConfig member's
// initializer.
struct Option {
  const char* name;
  Field field;
  const char* help;
  const char* doc = "";
};

Status TypeError(const std::string& key, const char* type, const json& v) {
  return Status::InvalidArgument("training config key '{}' must be {}, got {}", key, type, JsonForMessage(v));
}

// A range as documented: a bound at the representation's limit is left out.
template <typename T>
std::string RangeText(const char* what, T min_value, T max_value, bool open_above) {
  return open_above ? fmt::format("{} >= {}", what, min_value) : fmt::format("{} in [{}, {}]", what, min_value, max_value);
}

template <typename T>
Field Member(T TrainConfig::*member, const char* json_type, std::string type,
             std::function<Status(const json&, TrainConfig*, const std::string& key)> read) {
  return {json_type, std::move(type), std::move(read), [member](const TrainConfig& c) { return json(c.*member); }, {}};
}

// An integer in [min_value, max_value] (a JSON integer; a value outside int64 is out of range).
template <typename T>
Field IntIn(T TrainConfig::*member, int64_t min_value, int64_t max_value) {
  const bool open = max_value == (int64_t{1} << 31) - 1 || max_value == (int64_t{1} << 53);
  return Member(member, "an integer", RangeText("int", min_value, max_value, open),
                [=](const json& v, TrainConfig* c, const std::string& key) -> Status {
                  if (!v.is_number_integer()) return TypeError(key, "an integer", v);
                  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max_value)) {
                    return Status::InvalidArgument("training config key '{}' must be at most {}, got {}", key,
                                                   max_value, JsonForMessage(v));
                  }
                  const int64_t x = v.get<int64_t>();
                  if (x < min_value || x > max_value) {
                    return Status::InvalidArgument("training config key '{}' must be in [{}, {}], got {}", key,
                                                   min_value, max_value, x);
                  }
                  c->*member = static_cast<T>(x);
                  return Status::OK();
                });
}
Field Int(int TrainConfig::*member, int min_value) { return IntIn(member, min_value, (int64_t{1} << 31) - 1); }

Field Real(double TrainConfig::*member, double min_value, double max_value) {
  return Member(member, "a number", RangeText("number", min_value, max_value, max_value >= 1e30),
                [=](const json& v, TrainConfig* c, const std::string& key) -> Status {
                  if (!v.is_number()) return TypeError(key, "a number", v);
                  const double x = v.get<double>();
                  if (!(x >= min_value && x <= max_value)) {
                    return Status::InvalidArgument("training config key '{}' must be in [{}, {}], got {}", key,
                                                   min_value, max_value, x);
                  }
                  c->*member = x;
                  return Status::OK();
                });
}

Field Str(std::string TrainConfig::*member) {
  return Member(member, "a string", "string", [member](const json& v, TrainConfig* c, const std::string& key) -> Status {
    if (!v.is_string()) return TypeError(key, "a string", v);
    c->*member = v.get<std::string>();
    return Status::OK();
  });
}

Field Path(std::string TrainConfig::*member) {
  Field f = Str(member);
  f.type = "path";
  f.path = true;
  return f;
}

Field Bool(bool TrainConfig::*member) {
  return Member(member, "a boolean", "boolean", [member](const json& v, TrainConfig* c, const std::string& key) -> Status {
    if (!v.is_boolean()) return TypeError(key, "true or false", v);
    c->*member = v.get<bool>();
    return Status::OK();
  });
}

// "a, b or c", each item formatted by `item`.
template <typename T, typename F>
std::string ListText(const std::vector<T>& items, F item) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + item(items[i]);
  }
  return out;
}

// A string key whose value must be one of `allowed`.
Field StrOneOf(std::string TrainConfig::*member, std::vector<std::string> allowed) {
  Field f = Str(member);
  f.type = ListText(allowed, [](const std::string& s) { return fmt::format("`{}`", s); });
  const std::string message = ListText(allowed, [](const std::string& s) { return fmt::format("\"{}\"", s); });
  f.check = [member, allowed, message](const TrainConfig& c, const std::string& key) -> Status {
    for (const std::string& a : allowed) {
      if (c.*member == a) return Status::OK();
    }
    return Status::InvalidArgument("training config key '{}' must be {}, got '{}'", key, message, c.*member);
  };
  return f;
}

// An int key read as Int(member, allowed.front()) whose value must then be one of `allowed`.
Field IntOneOf(int TrainConfig::*member, std::vector<int> allowed) {
  Field f = Int(member, allowed.front());
  const std::string message = ListText(allowed, [](int x) { return std::to_string(x); });
  f.type = ListText(allowed, [](int x) { return fmt::format("`{}`", x); });
  f.check = [member, allowed, message](const TrainConfig& c, const std::string& key) -> Status {
    for (int a : allowed) {
      if (c.*member == a) return Status::OK();
    }
    return Status::InvalidArgument("training config key '{}' must be {}, got {}", key, message, c.*member);
  };
  return f;
}

// An anomaly action: one of `allowed`; "rollback" needs checkpoints.
Field AnomalyAction(std::string TrainConfig::*member, std::vector<std::string> allowed) {
  Field f = StrOneOf(member, std::move(allowed));
  f.check = [member, one_of = f.check](const TrainConfig& c, const std::string& key) -> Status {
    TF_RETURN_IF_ERROR(one_of(c, key));
    if (c.*member == "rollback" && c.checkpoint_dir.empty()) {
      return Status::InvalidArgument("training config key '{}' is \"rollback\", which needs checkpoints: set "
                                     "checkpoint_dir (and checkpoint_interval)",
                                     key);
    }
    return Status::OK();
  };
  return f;
}

const char* LrDecayName(LrDecay d) {
  switch (d) {
    case LrDecay::kCosine: return "cosine";
    case LrDecay::kLinear: return "linear";
    case LrDecay::kConstant: return "constant";
  }
  return "?";
}

Field LrDecayField() {
  return {"a string", "`cosine`, `linear` or `constant`",
          [](const json& v, TrainConfig* c, const std::string& key) -> Status {
            if (!v.is_string()) return TypeError(key, "a string", v);
            const std::string s = v.get<std::string>();
            if (s == "cosine") c->lr_decay = LrDecay::kCosine;
            else if (s == "linear") c->lr_decay = LrDecay::kLinear;
            else if (s == "constant") c->lr_decay = LrDecay::kConstant;
            else return Status::InvalidArgument("training config key 'lr_decay' must be cosine, linear or constant, got '{}'", s);
            return Status::OK();
          },
          [](const TrainConfig& c) { return json(LrDecayName(c.lr_decay)); },
          {}};
}

Field SeedField() {
  return Member(&TrainConfig::seed, "an integer", "int >= 0",
                [](const json& v, TrainConfig* c, const std::string& key) -> Status {
                  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
                    return TypeError(key, "a non-negative integer", v);
                  }
                  c->seed = v.get<uint64_t>();
                  return Status::OK();
                });
}

// A string key with a check of its own (`check` sees the value).
Field StrChecked(std::string TrainConfig::*member, std::function<Status(const std::string&)> check) {
  Field f = Str(member);
  f.check = [member, check](const TrainConfig& c, const std::string& key) -> Status {
    if (Status s = check(c.*member); !s.ok()) {
      return Status::InvalidArgument("training config key '{}': {}", key, s.message());
    }
    return Status::OK();
  };
  return f;
}

// The model config keys an override may set (model/config.h).
constexpr const char* kModelKeys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "block_size", "padded_vocab_size"};

// Every training config key, in the order docs/configs.md lists them. The reader, TrainConfigToJson,
// `train --help` and that keys table (TrainConfigKeysMarkdown) all come from here.
const std::vector<Option>& Options() {
  using C = TrainConfig;
  static const auto* options = new std::vector<Option>{
      {"batch_size", Int(&C::batch_size, 1), "B, sequences per micro-batch"},
      {"seq_len", Int(&C::seq_len, 1), "T, tokens per sequence", "T, ≤ `block_size`"},
      {"grad_accum_steps", IntIn(&C::grad_accum_steps, 1, 1 << 16),
       "micro-batches per optimizer step; gradients are averaged"},
      {"max_steps", IntIn(&C::max_steps, 0, int64_t{1} << 53), "optimizer steps",
       "optimizer steps (the step counter is 64-bit); part of the trajectory, as the learning-rate decay depends on "
       "it"},
      {"lr", Real(&C::lr, 0.0, 10.0), "peak learning rate"},
      {"min_lr", Real(&C::min_lr, 0.0, 10.0), "final learning rate (at most lr)",
       "final learning rate, ≤ `lr`"},
      {"warmup_steps", Int(&C::warmup_steps, 0), "linear warm-up steps",
       "linear warm-up: step s < warmup uses lr·(s+1)/warmup"},
      {"lr_decay", LrDecayField(), "decay from lr to min_lr at max_steps",
       "decay from lr to min_lr at max_steps (`engine/lr_schedule.h`)"},
      {"beta1", Real(&C::beta1, 0.0, 0.999999), "AdamW beta1",
       "AdamW (PyTorch semantics, bias-corrected), as `beta2` and `eps`"},
      {"beta2", Real(&C::beta2, 0.0, 0.999999999), "AdamW beta2"},
      {"eps", Real(&C::eps, 1e-30, 1.0), "AdamW epsilon"},
      {"weight_decay", Real(&C::weight_decay, 0.0, 10.0), "decoupled weight decay",
       "decoupled; applied to tensors with ≥ 2 dims (matrices, embeddings) only"},
      {"grad_clip", Real(&C::grad_clip, 0.0, 1e30), "global-norm gradient clip; 0 disables",
       "global-norm clip (as `torch.nn.utils.clip_grad_norm_`); 0 disables"},
      {"eval_interval", Int(&C::eval_interval, 0), "evaluate every k steps (and at step 0); 0 = only at the end"},
      {"eval_batches", Int(&C::eval_batches, 0), "validation micro-batches per evaluation"},
      {"log_interval", Int(&C::log_interval, 1), "progress line every k steps"},
      {"sample_interval", Int(&C::sample_interval, 0), "print a sample every k steps",
       "print a sample every k steps; one is always printed at the end when `sample_tokens > 0`"},
      {"sample_tokens", Int(&C::sample_tokens, 0), "tokens per sample during training",
       "tokens per sample during training; the context window slides within `seq_len`, the length the model was "
       "trained at"},
      {"sample_temperature", Real(&C::sample_temperature, 0.0, 100.0), "sampling temperature (0 = greedy)",
       "sampling temperature (0 = greedy). Recorded in the weights, as `sample_top_k`: `trainflow sample` uses the "
       "same temperature and top-k by default"},
      {"sample_top_k", Int(&C::sample_top_k, 0), "sample from the k most likely tokens (0 = all)"},
      {"sample_prompt", Str(&C::sample_prompt), "the samples' prompt"},
      {"train_data", Path(&C::train_data), "training token file", "training token file (`docs/data.md`)"},
      {"val_data", Path(&C::val_data), "validation token file (optional)"},
      {"tokenizer", StrOneOf(&C::tokenizer, {"auto", "byte", "gpt2"}), "the data's tokenizer",
       "the data's tokenizer: `auto` takes what the token files record (else what the vocabulary implies: 256 byte, "
       "50257 gpt2); `byte`/`gpt2` must agree with the files, and the model's `vocab_size` must be the tokenizer's. "
       "It decodes samples and is recorded in the weights"},
      {"tokenizer_dir", Path(&C::tokenizer_dir), "where gpt2's encoder.json and vocab.bpe are",
       "where `gpt2`'s `encoder.json` + `vocab.bpe` are (`\"\"`: `$TRAINFLOW_TOKENIZER_DIR`, then beside the binary — "
       "docs/tokenizers.md)"},
      {"out_dir", Path(&C::out_dir), "the run's outputs: weights, configs, metrics.jsonl, report.html, train.log",
       "final `model.safetensors` (Hugging Face names; metadata: the model and training configs, the step reached, "
       "the tokenizer, the trained `seq_len` — docs/formats.md, \"Weights metadata\"), `config.json` (HF), "
       "`model_config.json`, `train_config.json`, all written atomically; and `metrics.jsonl`, one JSON record per "
       "finished step appended as the step ends (`step`, `loss`, `lr`, `grad_norm`, `ms` and its parts `data_ms`, "
       "`compute_ms`, `optimizer_ms`, `tokens_per_s`, `mfu`, `rss_bytes`, `peak_rss_bytes`, the communication figures in data-parallel "
       "runs, `val_loss` at steps that evaluate, `checkpoint_stall_ms`, `update_skipped`) and event records "
       "(`{\"event\": \"anomaly\"\\|\"rollback\", \"step\": ..., \"message\": ...}`, and `{\"event\": \"eval\", "
       "\"step\": 0, \"val_loss\": ...}` for the evaluation before the first step); at the end, `report.html`, the "
       "curves (docs/monitoring.md); `train.log`, what rank 0's console shows, appended run after run (not under "
       "`trainflow launch`, which keeps its jobs' logs, nor when `TRAINFLOW_LOG_FILE` names a log file). The final "
       "files (weights, `config.json`, `model_config.json`, `train_config.json`) are written as one set: all under "
       "temporary names first, then renamed into place, so a failed write (a full disk) leaves the previous run's "
       "set whole and says where this run's weights are; `metrics.jsonl` is the running run's from its first step "
       "(only a run that starts over, `--fresh`, replaces an earlier run's). Checked for writability before the "
       "first step"},
      {"resume_state", Path(&C::resume_state), "continue exactly from a training state file",
       "continue exactly from a training state file (`OUT/train_state.safetensors`; ranks > 0 read their "
       "`train_state.rankR.safetensors`): weights, moments, step, data position, residuals. The model, training "
       "data and trajectory keys must match (docs/formats.md, \"Training state\"); logging, evaluation, sampling, "
       "output keys and `stop_at_step` may differ. Resuming into the same `out_dir` drops `metrics.jsonl` records "
       "of steps after the resumed one. Without it, a run whose `out_dir` holds a stopped run's state resumes that "
       "state (docs/checkpoints.md, \"Running the same command again\")"},
      {"save_state", Bool(&C::save_state), "also write the training state with the outputs",
       "also write the training state with the outputs (a stop without a checkpoint directory always writes it)"},
      {"fresh", Bool(&C::fresh), "start over at step 0, ignoring an earlier run's state and checkpoints",
       "start over at step 0 in an `out_dir` or `checkpoint_dir` an earlier run left, ignoring its state and "
       "checkpoints (docs/checkpoints.md, \"Running the same command again\"). Under `trainflow launch` it applies "
       "to the first start only: a restart after a failure resumes"},
      {"extend", Bool(&C::extend), "continue a run's state with a different max_steps or schedule",
       "continue a run's training state (in `out_dir`, `checkpoint_dir` or `resume_state`) with a different "
       "`max_steps` or learning-rate schedule (`lr`, `min_lr`, `warmup_steps`, `lr_decay`): the new schedule "
       "applies from the resumed step on, a new trajectory recorded in the state (`\"extended_at\": [step, ...]` "
       "in its training config)"},
      {"stop_at_step", IntIn(&C::stop_at_step, 0, int64_t{1} << 53), "stop after this step as SIGTERM would; 0 = never",
       "stop after this step as SIGTERM would: outputs and state (or a checkpoint) written, exit code 5 "
       "(docs/exit-codes.md); 0 = never"},
      {"checkpoint_dir", Path(&C::checkpoint_dir), "checkpoints: a directory or s3://bucket/prefix",
       "checkpoints (docs/checkpoints.md): a directory on a local or shared file system, or `s3://bucket/prefix` "
       "(docs/s3.md); every rank writes its share"},
      {"checkpoint_interval", IntIn(&C::checkpoint_interval, 0, int64_t{1} << 53), "a checkpoint every N steps",
       "a checkpoint every N steps (0 = none), as well as every `checkpoint_every_s`; a stop and the end of a run "
       "always write one"},
      {"checkpoint_every_s", Real(&C::checkpoint_every_s, 0.0, 1e9), "a checkpoint every S seconds (0 = none)"},
      {"resume", [] {
         Field f = Path(&C::resume);
         f.check = [](const C& c, const std::string&) -> Status {
           if (!c.resume.empty()) return Status::OK();
           return Status::InvalidArgument("training config key 'resume' is empty: use \"auto\", \"none\" or a "
                                          "checkpoint's location");
         };
         return f;
       }(),
       "auto, none, or a checkpoint's location",
       "`auto`: the newest valid checkpoint in `checkpoint_dir` (a damaged one is reported and the previous used), "
       "or a fresh start; `none` (refused while `checkpoint_dir` holds committed checkpoints, unless `fresh`); or a "
       "checkpoint's location (`DIR/step-000000000400`, or `DIR` for its newest). Needs the same model, data, "
       "trajectory keys and global batch (ranks × `batch_size` × `grad_accum_steps`); the world size may change"},
      {"checkpoint_keep_last", IntIn(&C::checkpoint_keep_last, 0, 1 << 20),
       "retention: the newest N checkpoints (0 = all)",
       "retention: the newest N (0 = keep every checkpoint), plus those `checkpoint_keep_every` keeps, plus what "
       "they depend on"},
      {"checkpoint_keep_every", IntIn(&C::checkpoint_keep_every, 0, int64_t{1} << 53),
       "retention: also keep checkpoints whose step is a multiple of M (0 = none)"},
      {"checkpoint_full_every", IntIn(&C::checkpoint_full_every, 1, 1 << 20),
       "incremental checkpoints: a full one every K (1 = always full)"},
      {"checkpoint_when_busy", StrOneOf(&C::checkpoint_when_busy, {"skip", "wait"}),
       "a checkpoint due while the two before it are still being written"},
      {"checkpoint_writer_priority", StrOneOf(&C::checkpoint_writer_priority, {"idle", "normal"}),
       "the checkpoint writer's CPU priority",
       "the checkpoint writer's CPU priority: `normal`, or `idle` (`SCHED_IDLE`: only the time the cores would "
       "otherwise idle; writes take longer, training slows less; docs/checkpoints.md says when not to)"},
      {"checkpoint_async", Bool(&C::checkpoint_async), "false: the loop waits for each checkpoint to be written",
       "false: the loop waits for each checkpoint to be written (for comparison; the stall is then the whole write)"},
      {"checkpoint_chunk_mb", Real(&C::checkpoint_chunk_mb, 1.0 / 256, 4096.0), "chunk size (MiB) of the stored tensors"},
      {"checkpoint_compress", Bool(&C::checkpoint_compress), "byte planes + zstd (lossless), or raw"},
      {"init_from", Path(&C::init_from), "start from a safetensors file with GPT-2 names"},
      {"seed", SeedField(), "weight init and sampling",
       "weight init and sampling; a run is bit-reproducible for a seed and thread count"},
      {"threads", IntIn(&C::threads, 0, 1024), "OpenMP threads (0 = OMP_NUM_THREADS or all cores)",
       "OpenMP threads (0 = `OMP_NUM_THREADS` or all cores)"},
      {"shuffle", Bool(&C::shuffle), "random (seeded, resumable) window starts instead of the sequential stream"},
      {"device", StrOneOf(&C::device, {"auto", "cpu", "cuda"}), "the backend",
       "`auto`: the GPU of this rank's local rank when the build has CUDA and one is visible, else the CPU"},
      {"dtype", StrOneOf(&C::dtype, {"bf16", "fp32"}), "CUDA storage type of parameters, activations and gradients",
       "CUDA storage type of parameters, activations and gradients (`bf16`: fp32 master weights and moments)"},
      {"attention", StrOneOf(&C::attention, {"flash", "flash_simt", "gemm", "cudnn"}), "CUDA attention",
       "CUDA attention: `flash` (fused kernels, tensor cores in bf16 at head size 64/128), `flash_simt` (the same "
       "kernels' SIMT path), `gemm` (cuBLAS GEMMs; stores the T×T probabilities, so far more memory), `cudnn` "
       "(cuDNN's fused flash attention: bf16 only, needs libcudnn.so.9 ≥ 9.10.2 at run time — docs/cuda.md)"},
      {"recompute", IntOneOf(&C::recompute, {0, 1, 2}), "CUDA activation recomputation in backward",
       "CUDA activation recomputation in backward: `0` store everything, `1` recompute the GELU output, `2` also the "
       "two LayerNorm outputs per layer (least memory; e.g. GPT-2 1558M at T=1024 with B=24 on 80 GB — "
       "docs/cuda.md)"},
      {"fuse_residual", Bool(&C::fuse_residual), "CUDA: fold the residual additions into the GEMM epilogues",
       "CUDA: fold the residual additions into the GEMM epilogues; `false` uses separate kernels"},
      {"deterministic", Bool(&C::deterministic), "CUDA, attention cudnn: false takes the faster atomic backward",
       "CUDA with `\"attention\": \"cudnn\"`: `false` takes cuDNN's faster attention backward that accumulates dQ "
       "with fp32 atomics (runs are then not bit-reproducible); everything else is deterministic either way"},
      {"gelu_fusion", IntOneOf(&C::gelu_fusion, {-1, 0, 1, 2}),
       "CUDA: the MLP's GELU in the GEMM epilogues (-1: the default, currently 0 for both dtypes)",
       "CUDA: the MLP's GELU in the cuBLASLt GEMM epilogues: `0` separate kernels, `1` forward, `2` forward and "
       "backward, `-1` the default (currently 0; docs/cuda.md)"},
      {"compression", StrChecked(&C::compression, [](const std::string& v) {
         return v == "auto" ? Status::OK() : comm::ParseCodec(v).status();
       }), "gradient codec for data-parallel reduction",
       "gradient codec for data-parallel reduction: `none`, `bf16`, `fp16`, `int8`, `int8-sr`, `sign`, `topk:D` "
       "(0 < D ≤ 1), or `auto` (measured at start); docs/distributed.md, docs/compression.md"},
      {"bucket_mb", Real(&C::bucket_mb, 1e-6, 1e6), "gradient bucket size (MiB) of the reducer"},
      {"first_bucket_mb", Real(&C::first_bucket_mb, 1e-6, 1e6), "size of the first bucket (MiB)",
       "size of the first bucket (MiB), so communication starts early in backward"},
      {"error_feedback", Bool(&C::error_feedback), "lossy codecs carry what was not sent into the next step"},
      {"zero_stage", IntOneOf(&C::zero_stage, {0, 1, 2, 3}), "ZeRO: shard the training state over the ranks",
       "ZeRO sharding of the training state over the ranks: `0` every rank holds all of it; `1` the optimizer moments "
       "(and a GPU's fp32 master weights) are sharded, `2` also the gradients, `3` also the parameters (gathered "
       "layer by layer); the same weights bit for bit (docs/distributed.md, \"ZeRO\")"},
      {"shard_group_size", Int(&C::shard_group_size, 0),
       "ZeRO replica groups: shard within groups of this many ranks (0: all)",
       "ZeRO replica groups (hybrid sharding): with `zero_stage` 1-3 the state is sharded within groups of this "
       "many consecutive ranks (a node) and replicated across the groups; must divide the number of ranks; `0` one "
       "group of all ranks (docs/distributed.md, \"ZeRO\")"},
      {"metrics_addr", StrChecked(&C::metrics_addr, [](const std::string& v) {
         return v == "off" || v.empty() ? Status::OK() : ParseHostPort(v).status();
       }), "metrics endpoint and dashboard HOST:PORT (+ local rank); off: none",
       "every rank's metrics endpoint and dashboard (docs/monitoring.md) at `HOST:PORT` + local rank; a port in use "
       "moves on to a free one (logged); `\"off\"` or `\"\"`: none; port 0: any free port. Loopback unless an "
       "address is given deliberately"},
      {"metrics_token_file", Path(&C::metrics_token_file), "a file holding the endpoint's bearer token",
       "a file whose first line is a bearer token every request must carry (header `Authorization: Bearer`, or "
       "`?token=`)"},
      {"peak_tflops", Real(&C::peak_tflops, 0.0, 1e9), "one rank's peak TFLOP/s for MFU (0: known figure)",
       "one rank's peak TFLOP/s for MFU; 0: a known GPU's dense datasheet figure for the dtype (bf16 tensor cores; "
       "fp32 without TF32), or the CPU's cores × max clock × FMA width; MFU is left out when unknown"},
      {"anomaly_nonfinite", AnomalyAction(&C::anomaly_nonfinite, {"warn", "skip", "stop", "rollback"}),
       "a NaN/Inf loss or gradient norm",
       "a NaN/Inf loss or gradient norm: `warn` (apply the update anyway), `skip` (do not apply it), `stop` (end the "
       "run with an error, exit code 1), `rollback` (to the newest checkpoint, skipping the data since; needs "
       "`checkpoint_dir`)"},
      {"anomaly_spike", AnomalyAction(&C::anomaly_spike, {"off", "warn", "skip", "stop", "rollback"}),
       "a loss or gradient-norm spike", "a loss or gradient-norm spike: `off`, or an action as above"},
      {"anomaly_zscore", Real(&C::anomaly_zscore, 0.5, 1e6), "a spike: z standard deviations above the mean",
       "a spike: log(1 + value) more than z standard deviations (at least 0.02) above the mean of the last "
       "`anomaly_window` accepted steps"},
      {"anomaly_window", IntIn(&C::anomaly_window, 2, 1 << 20), "accepted steps a spike is measured against",
       "the N accepted steps a spike is measured against; nothing is flagged before N/4 steps"},
      {"anomaly_max_skips", IntIn(&C::anomaly_max_skips, 1, 1 << 30),
       "consecutive skipped updates before the run stops"},
      {"anomaly_max_rollbacks", IntIn(&C::anomaly_max_rollbacks, 0, 1 << 30),
       "rollbacks in one process before the run stops"},
  };
  return *options;
}

const Option* FindOption(const std::string& key) {
  static const auto* by_name = [] {
    auto* m = new std::map<std::string, const Option*>;
    for (const Option& o : Options()) (*m)[o.name] = &o;
    return m;
  }();
  auto it = by_name->find(key);
  return it == by_name->end() ? nullptr : it->second;
}

// A default as documented: JSON, numbers in their shortest form (6e-05, not 6.0000000000000002e-05).
std::string DefaultText(const json& v) {
  if (v.is_number_float()) return fmt::format("{}", v.get<double>());
  return v.dump();
}

}  // namespace

StatusOr<TrainConfig> ParseTrainConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return Status::InvalidArgument("{}: training config must be a JSON object", source);
  TrainConfig c;
  for (const auto& [key, value] : j.items()) {
    if (key.starts_with("_")) continue;  // comments
    const Option* o = FindOption(key);
    if (o == nullptr) return Status::InvalidArgument("{}: unknown training config key '{}'", source, key);
    Status s = o->field.read(value, &c, key);
    if (!s.ok()) return s.WithContext(source);
  }
  if (c.min_lr > c.lr) {
    return Status::InvalidArgument("{}: min_lr ({}) must not exceed lr ({}); set min_lr too", source, c.min_lr, c.lr);
  }
  for (const Option& o : Options()) {
    if (!o.field.check) continue;
    if (Status s = o.field.check(c, o.name); !s.ok()) return s.WithContext(source);
  }
  if (c.resume != "auto" && c.resume != "none" && !c.resume_state.empty()) {
    return Status::InvalidArgument("{}: training config keys 'resume' ({}) and 'resume_state' ({}) both name a state to "
                                   "start from: keep one",
                                   source, c.resume, c.resume_state);
  }
  if (c.fresh && (c.extend || !c.resume_state.empty() || (c.resume != "auto" && c.resume != "none"))) {
    return Status::InvalidArgument("{}: training config key 'fresh' starts over at step 0, but '{}' names a state to "
                                   "continue: keep one",
                                   source, c.extend ? "extend" : !c.resume_state.empty() ? "resume_state" : "resume");
  }
  if (c.zero_stage > 0 && c.compression != "none" && c.compression != "auto") {
    return Status::InvalidArgument("{}: zero_stage {} reduces the gradients exactly (compression \"none\"), but "
                                   "compression is \"{}\": the codecs' two-phase exchange and error feedback keep a "
                                   "whole gradient on every rank; use zero_stage 0 with a codec, or compression none",
                                   source, c.zero_stage, c.compression);
  }
  if (Status g = CheckShardGroupSize(c, 0); !g.ok()) return g.WithContext(source);
  if (c.tokens_per_step() > (int64_t{1} << 40)) {
    return Status::InvalidArgument("{}: batch_size x seq_len x grad_accum_steps is too large", source);
  }
  return c;
}

json TrainConfigToJson(const TrainConfig& c) {
  json out = json::object();
  for (const Option& o : Options()) out[o.name] = o.field.write(c);
  return out;
}

void ApplyOverrides(const std::vector<std::pair<std::string, std::string>>& overrides, json* model, json* train) {
  for (const auto& [key, text] : overrides) {
    StatusOr<json> parsed = ParseJson(text, "--" + key, /*allow_comments=*/false);
    json value = parsed.ok() ? std::move(*parsed) : json(text);
    if (value.is_object() || value.is_array()) value = text;
    // String-typed keys take the text as given: --out-dir 2024, --sample-prompt true.
    if (const Option* o = FindOption(key); o != nullptr && std::string_view(o->field.json_type) == "a string") {
      value = text;
    }
    bool is_model = false;
    for (const char* k : kModelKeys) is_model |= key == k;
    (is_model ? *model : *train)[key] = value;
  }
}

void ResolveConfigPaths(const std::string& base_dir, json* train) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path base = fs::absolute(base_dir.empty() ? fs::path(".") : fs::path(base_dir), ec);
  for (auto& [key, value] : train->items()) {
    const Option* o = FindOption(key);
    if (o == nullptr || !o->field.path || !value.is_string()) continue;
    const std::string v = value.get<std::string>();
    if (v.empty() || (key == "resume" && (v == "auto" || v == "none"))) continue;
    // A URL or anything shaped like one ("s3://", "S3://", "s3:/", "s3a://") is left as given: the
    // store refuses what it cannot open, instead of it becoming a local directory.
    if (LooksLikeUrl(v)) continue;
    if (fs::path(v).is_absolute()) continue;
    value = (base / v).lexically_normal().string();
  }
}

bool IsBooleanTrainKey(const std::string& key) {
  const Option* o = FindOption(key);
  return o != nullptr && std::string_view(o->field.json_type) == "a boolean";
}

namespace {

// The documented spelling of a key's flag: --max-steps (--max_steps is an alias).
std::string Flag(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

// One line of `train --help`: the flag, type, default and help.
std::string HelpLine(const Option& o) {
  static const TrainConfig defaults;
  std::string type = o.field.type;
  std::erase(type, '`');
  const std::string d = DefaultText(o.field.write(defaults));
  return fmt::format("  {:<30} {}{}: {}\n", Flag(o.name), type, d == "\"\"" ? "" : ", default " + d, o.help);
}

}  // namespace

std::string ConfigKeysHelp() {
  std::string out = "Model config keys:";
  for (const char* k : kModelKeys) out += " " + Flag(k);
  out += "\nTraining config keys:\n";
  for (const Option& o : Options()) out += HelpLine(o);
  return out;
}

std::string TrainKeysHelp(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) {
    if (const Option* o = FindOption(k)) out += HelpLine(*o);
  }
  return out;
}

std::string TrainConfigKeysMarkdown() {
  const TrainConfig defaults;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const Option& o : Options()) {
    out += fmt::format("| `{}` | {} | `{}` | {} |\n", o.name, o.field.type, DefaultText(o.field.write(defaults)),
                       *o.doc != '\0' ? o.doc : o.help);
  }
  return out;
}


Status ValidateRun(const GPT2Config& model, const TrainConfig& train) {
  if (train.seq_len > model.block_size) {
    return Status::InvalidArgument("seq_len {} is longer than the model's block_size {}", train.seq_len,
                                   model.block_size);
  }
  if (train.tokenizer != "auto") TF_RETURN_IF_ERROR(CheckTokenizerFitsModel(train.tokenizer, model, "the training config's"));
  return Status::OK();
}

Status CheckShardGroupSize(const TrainConfig& train, int world) {
  const int g = train.shard_group_size;
  if (g == 0) return Status::OK();
  if (train.zero_stage == 0) {
    return Status::InvalidArgument("training config key 'shard_group_size' ({}) shards the state within groups of "
                                   "ranks, but zero_stage is 0 (nothing sharded): set zero_stage 1, 2 or 3, or "
                                   "shard_group_size 0",
                                   g);
  }
  if (world > 0 && world % g != 0) {
    return Status::InvalidArgument("training config key 'shard_group_size' {} does not divide the {} ranks of this "
                                   "job: replica groups of {} ranks cannot cover {} ranks; use a divisor of {}, or 0 "
                                   "for one group of all ranks",
                                   g, world, g, world, world);
  }
  return Status::OK();
}

Status CheckTokenizerFitsModel(const std::string& kind, const GPT2Config& model, const std::string& whose) {
  const int v = TokenizerVocabSize(kind);
  if (v == 0 || v == model.vocab_size) return Status::OK();
  const std::string hint =
      kind == "byte" ? "train a byte-level model (e.g. --model configs/model/byte-small.json), or tokenize the data "
                       "with `trainflow prepare --tokenizer gpt2` for a GPT-2-vocabulary model"
                     : "train a model with vocab_size 50257 (e.g. --model configs/model/gpt2-124m.json), or tokenize "
                       "the data with `trainflow prepare --tokenizer byte` for a byte-level model";
  return Status::InvalidArgument("{} tokenizer '{}' has {} tokens, but the model has vocab_size {}: {}", whose, kind, v,
                                 model.vocab_size, hint);
}

}  // namespace tf
