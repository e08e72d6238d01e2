#include "engine/train_config.h"

#include "base/env.h"
#include "base/json.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/codec.h"
#include "model/tokenizer.h"
#include "monitor/server.h"

namespace tf {
namespace {

using json = nlohmann::json;

// One entry per key: how to read it into a TrainConfig. Declared in one table so that the set of
// accepted keys, their types and the error messages stay in one place.
struct Field {
  const char* type;  // for messages
  std::function<Status(const json&, TrainConfig*, const std::string& key)> read;
  bool path = false;  // a file or directory (ResolveConfigPaths)
};

Status TypeError(const std::string& key, const char* type, const json& v) {
  return Status::InvalidArgument("training config key '{}' must be {}, got {}", key, type, JsonForMessage(v));
}

// An integer in [min_value, max_value] (a JSON integer; a value outside int64 is out of range).
template <typename T>
Field IntIn(T TrainConfig::*member, int64_t min_value, int64_t max_value) {
  return {"an integer", [=](const json& v, TrainConfig* c, const std::string& key) -> Status {
            if (!v.is_number_integer()) return TypeError(key, "an integer", v);
            if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max_value)) {
              return Status::InvalidArgument("training config key '{}' must be at most {}, got {}", key, max_value,
                                             JsonForMessage(v));
            }
            const int64_t x = v.get<int64_t>();
            if (x < min_value || x > max_value) {
              return Status::InvalidArgument("training config key '{}' must be in [{}, {}], got {}", key, min_value,
                                             max_value, x);
            }
            c->*member = static_cast<T>(x);
            return Status::OK();
          }};
}
Field Int(int TrainConfig::*member, int min_value) { return IntIn(member, min_value, (int64_t{1} << 31) - 1); }

Field Real(double TrainConfig::*member, double min_value, double max_value) {
  return {"a number", [=](const json& v, TrainConfig* c, const std::string& key) -> Status {
            if (!v.is_number()) return TypeError(key, "a number", v);
            const double x = v.get<double>();
            if (!(x >= min_value && x <= max_value)) {
              return Status::InvalidArgument("training config key '{}' must be in [{}, {}], got {}", key, min_value,
                                             max_value, x);
            }
            c->*member = x;
            return Status::OK();
          }};
}

Field Str(std::string TrainConfig::*member) {
  return {"a string", [member](const json& v, TrainConfig* c, const std::string& key) -> Status {
            if (!v.is_string()) return TypeError(key, "a string", v);
            c->*member = v.get<std::string>();
            return Status::OK();
          }};
}

Field Path(std::string TrainConfig::*member) {
  Field f = Str(member);
  f.path = true;
  return f;
}

Field Bool(bool TrainConfig::*member) {
  return {"a boolean", [member](const json& v, TrainConfig* c, const std::string& key) -> Status {
            if (!v.is_boolean()) return TypeError(key, "true or false", v);
            c->*member = v.get<bool>();
            return Status::OK();
          }};
}

// The model config keys an override may set (model/config.h).
constexpr const char* kModelKeys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "block_size", "padded_vocab_size"};

const std::map<std::string, Field>& Fields() {
  static const auto* fields = new std::map<std::string, Field>{
      {"batch_size", Int(&TrainConfig::batch_size, 1)},
      {"seq_len", Int(&TrainConfig::seq_len, 1)},
      {"grad_accum_steps", IntIn(&TrainConfig::grad_accum_steps, 1, 1 << 16)},
      {"max_steps", IntIn(&TrainConfig::max_steps, 0, int64_t{1} << 53)},
      {"lr", Real(&TrainConfig::lr, 0.0, 10.0)},
      {"min_lr", Real(&TrainConfig::min_lr, 0.0, 10.0)},
      {"beta1", Real(&TrainConfig::beta1, 0.0, 0.999999)},
      {"beta2", Real(&TrainConfig::beta2, 0.0, 0.999999999)},
      {"eps", Real(&TrainConfig::eps, 1e-30, 1.0)},
      {"weight_decay", Real(&TrainConfig::weight_decay, 0.0, 10.0)},
      {"warmup_steps", Int(&TrainConfig::warmup_steps, 0)},
      {"lr_decay",
       {"a string", [](const json& v, TrainConfig* c, const std::string& key) -> Status {
          if (!v.is_string()) return TypeError(key, "a string", v);
          const std::string s = v.get<std::string>();
          if (s == "cosine") c->lr_decay = LrDecay::kCosine;
          else if (s == "linear") c->lr_decay = LrDecay::kLinear;
          else if (s == "constant") c->lr_decay = LrDecay::kConstant;
          else return Status::InvalidArgument("training config key 'lr_decay' must be cosine, linear or constant, got '{}'", s);
          return Status::OK();
        }}},
      {"grad_clip", Real(&TrainConfig::grad_clip, 0.0, 1e30)},
      {"eval_interval", Int(&TrainConfig::eval_interval, 0)},
      {"eval_batches", Int(&TrainConfig::eval_batches, 0)},
      {"log_interval", Int(&TrainConfig::log_interval, 1)},
      {"sample_interval", Int(&TrainConfig::sample_interval, 0)},
      {"sample_tokens", Int(&TrainConfig::sample_tokens, 0)},
      {"sample_temperature", Real(&TrainConfig::sample_temperature, 0.0, 100.0)},
      {"sample_top_k", Int(&TrainConfig::sample_top_k, 0)},
      {"sample_prompt", Str(&TrainConfig::sample_prompt)},
      {"train_data", Path(&TrainConfig::train_data)},
      {"val_data", Path(&TrainConfig::val_data)},
      {"tokenizer", Str(&TrainConfig::tokenizer)},
      {"tokenizer_dir", Path(&TrainConfig::tokenizer_dir)},
      {"out_dir", Path(&TrainConfig::out_dir)},
      {"init_from", Path(&TrainConfig::init_from)},
      {"resume_state", Path(&TrainConfig::resume_state)},
      {"save_state", Bool(&TrainConfig::save_state)},
      {"stop_at_step", IntIn(&TrainConfig::stop_at_step, 0, int64_t{1} << 53)},
      {"fresh", Bool(&TrainConfig::fresh)},
      {"extend", Bool(&TrainConfig::extend)},
      {"checkpoint_dir", Path(&TrainConfig::checkpoint_dir)},
      {"checkpoint_interval", IntIn(&TrainConfig::checkpoint_interval, 0, int64_t{1} << 53)},
      {"checkpoint_every_s", Real(&TrainConfig::checkpoint_every_s, 0.0, 1e9)},
      {"resume", Path(&TrainConfig::resume)},
      {"checkpoint_keep_last", IntIn(&TrainConfig::checkpoint_keep_last, 0, 1 << 20)},
      {"checkpoint_keep_every", IntIn(&TrainConfig::checkpoint_keep_every, 0, int64_t{1} << 53)},
      {"checkpoint_full_every", IntIn(&TrainConfig::checkpoint_full_every, 1, 1 << 20)},
      {"checkpoint_when_busy", Str(&TrainConfig::checkpoint_when_busy)},
      {"checkpoint_writer_priority", Str(&TrainConfig::checkpoint_writer_priority)},
      {"checkpoint_async", Bool(&TrainConfig::checkpoint_async)},
      {"checkpoint_chunk_mb", Real(&TrainConfig::checkpoint_chunk_mb, 1.0 / 256, 4096.0)},
      {"checkpoint_compress", Bool(&TrainConfig::checkpoint_compress)},
      {"seed",
       {"an integer", [](const json& v, TrainConfig* c, const std::string& key) -> Status {
          if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
            return TypeError(key, "a non-negative integer", v);
          }
          c->seed = v.get<uint64_t>();
          return Status::OK();
        }}},
      {"threads", IntIn(&TrainConfig::threads, 0, 1024)},
      {"shuffle", Bool(&TrainConfig::shuffle)},
      {"device", Str(&TrainConfig::device)},
      {"dtype", Str(&TrainConfig::dtype)},
      {"attention", Str(&TrainConfig::attention)},
      {"recompute", Int(&TrainConfig::recompute, 0)},
      {"gelu_fusion", Int(&TrainConfig::gelu_fusion, -1)},
      {"fuse_residual", Bool(&TrainConfig::fuse_residual)},
      {"deterministic", Bool(&TrainConfig::deterministic)},
      {"compression", Str(&TrainConfig::compression)},
      {"bucket_mb", Real(&TrainConfig::bucket_mb, 1e-6, 1e6)},
      {"first_bucket_mb", Real(&TrainConfig::first_bucket_mb, 1e-6, 1e6)},
      {"metrics_addr", Str(&TrainConfig::metrics_addr)},
      {"metrics_token_file", Path(&TrainConfig::metrics_token_file)},
      {"peak_tflops", Real(&TrainConfig::peak_tflops, 0.0, 1e9)},
      {"anomaly_nonfinite", Str(&TrainConfig::anomaly_nonfinite)},
      {"anomaly_spike", Str(&TrainConfig::anomaly_spike)},
      {"anomaly_zscore", Real(&TrainConfig::anomaly_zscore, 0.5, 1e6)},
      {"anomaly_window", IntIn(&TrainConfig::anomaly_window, 2, 1 << 20)},
      {"anomaly_max_skips", IntIn(&TrainConfig::anomaly_max_skips, 1, 1 << 30)},
      {"anomaly_max_rollbacks", IntIn(&TrainConfig::anomaly_max_rollbacks, 0, 1 << 30)},
      {"error_feedback", Bool(&TrainConfig::error_feedback)},
  };
  return *fields;
}

const char* LrDecayName(LrDecay d) {
  switch (d) {
    case LrDecay::kCosine: return "cosine";
    case LrDecay::kLinear: return "linear";
    case LrDecay::kConstant: return "constant";
  }
  return "?";
}

}  // namespace

StatusOr<TrainConfig> ParseTrainConfig(const json& j, const std::string& source) {
  if (!j.is_object()) return Status::InvalidArgument("{}: training config must be a JSON object", source);
  TrainConfig c;
  const auto& fields = Fields();
  for (const auto& [key, value] : j.items()) {
    if (key.starts_with("_")) continue;  // comments
    auto it = fields.find(key);
    if (it == fields.end()) return Status::InvalidArgument("{}: unknown training config key '{}'", source, key);
    Status s = it->second.read(value, &c, key);
    if (!s.ok()) return s.WithContext(source);
  }
  if (c.min_lr > c.lr) {
    return Status::InvalidArgument("{}: min_lr ({}) must not exceed lr ({}); set min_lr too", source, c.min_lr, c.lr);
  }
  if (c.tokenizer != "auto" && c.tokenizer != "byte" && c.tokenizer != "gpt2") {
    return Status::InvalidArgument("{}: training config key 'tokenizer' must be \"auto\", \"byte\" or \"gpt2\", got "
                                   "'{}'",
                                   source, c.tokenizer);
  }
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda") {
    return Status::InvalidArgument("{}: training config key 'device' must be \"auto\", \"cpu\" or \"cuda\", got '{}'",
                                   source, c.device);
  }
  if (c.dtype != "bf16" && c.dtype != "fp32") {
    return Status::InvalidArgument("{}: training config key 'dtype' must be \"bf16\" or \"fp32\", got '{}'", source,
                                   c.dtype);
  }
  if (c.attention != "flash" && c.attention != "flash_simt" && c.attention != "gemm" && c.attention != "cudnn") {
    return Status::InvalidArgument(
        "{}: training config key 'attention' must be \"flash\", \"flash_simt\", \"gemm\" or \"cudnn\", got '{}'",
        source, c.attention);
  }
  if (c.recompute > 2) {
    return Status::InvalidArgument("{}: training config key 'recompute' must be 0, 1 or 2, got {}", source,
                                   c.recompute);
  }
  if (c.gelu_fusion > 2) {
    return Status::InvalidArgument("{}: training config key 'gelu_fusion' must be -1, 0, 1 or 2, got {}", source,
                                   c.gelu_fusion);
  }
  if (c.compression != "auto") {
    if (auto codec = comm::ParseCodec(c.compression); !codec.ok()) {
      return Status::InvalidArgument("{}: training config key 'compression': {}", source, codec.status().message());
    }
  }
  if (c.checkpoint_when_busy != "skip" && c.checkpoint_when_busy != "wait") {
    return Status::InvalidArgument("{}: training config key 'checkpoint_when_busy' must be \"skip\" or \"wait\", got '{}'",
                                   source, c.checkpoint_when_busy);
  }
  if (c.checkpoint_writer_priority != "idle" && c.checkpoint_writer_priority != "normal") {
    return Status::InvalidArgument(
        "{}: training config key 'checkpoint_writer_priority' must be \"idle\" or \"normal\", got '{}'", source,
        c.checkpoint_writer_priority);
  }
  if (c.metrics_addr != "off" && !c.metrics_addr.empty()) {
    monitor::ServerOptions o;
    if (Status st = monitor::ParseHostPort(c.metrics_addr, &o); !st.ok()) {
      return Status::InvalidArgument("{}: training config key 'metrics_addr': {}", source, st.message());
    }
  }
  for (const auto& [key, value, allowed] :
       {std::tuple<const char*, const std::string&, const char*>{"anomaly_nonfinite", c.anomaly_nonfinite,
                                                                 "\"warn\", \"skip\", \"stop\" or \"rollback\""},
        {"anomaly_spike", c.anomaly_spike, "\"off\", \"warn\", \"skip\", \"stop\" or \"rollback\""}}) {
    const bool ok = value == "warn" || value == "skip" || value == "stop" || value == "rollback" ||
                    (value == "off" && std::string_view(key) == "anomaly_spike");
    if (!ok) return Status::InvalidArgument("{}: training config key '{}' must be {}, got '{}'", source, key, allowed, value);
    if (value == "rollback" && c.checkpoint_dir.empty()) {
      return Status::InvalidArgument("{}: training config key '{}' is \"rollback\", which needs checkpoints: set "
                                     "checkpoint_dir (and checkpoint_interval)",
                                     source, key);
    }
  }
  if (c.resume.empty()) {
    return Status::InvalidArgument("{}: training config key 'resume' is empty: use \"auto\", \"none\" or a checkpoint's "
                                   "location",
                                   source);
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
  if (c.tokens_per_step() > (int64_t{1} << 40)) {
    return Status::InvalidArgument("{}: batch_size x seq_len x grad_accum_steps is too large", source);
  }
  return c;
}

json TrainConfigToJson(const TrainConfig& c) {
  return {{"batch_size", c.batch_size},
          {"seq_len", c.seq_len},
          {"grad_accum_steps", c.grad_accum_steps},
          {"max_steps", c.max_steps},
          {"lr", c.lr},
          {"min_lr", c.min_lr},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"weight_decay", c.weight_decay},
          {"warmup_steps", c.warmup_steps},
          {"lr_decay", LrDecayName(c.lr_decay)},
          {"grad_clip", c.grad_clip},
          {"eval_interval", c.eval_interval},
          {"eval_batches", c.eval_batches},
          {"log_interval", c.log_interval},
          {"sample_interval", c.sample_interval},
          {"sample_tokens", c.sample_tokens},
          {"sample_temperature", c.sample_temperature},
          {"sample_top_k", c.sample_top_k},
          {"sample_prompt", c.sample_prompt},
          {"train_data", c.train_data},
          {"val_data", c.val_data},
          {"tokenizer", c.tokenizer},
          {"tokenizer_dir", c.tokenizer_dir},
          {"out_dir", c.out_dir},
          {"init_from", c.init_from},
          {"resume_state", c.resume_state},
          {"save_state", c.save_state},
          {"stop_at_step", c.stop_at_step},
          {"fresh", c.fresh},
          {"extend", c.extend},
          {"checkpoint_dir", c.checkpoint_dir},
          {"checkpoint_interval", c.checkpoint_interval},
          {"checkpoint_every_s", c.checkpoint_every_s},
          {"resume", c.resume},
          {"checkpoint_keep_last", c.checkpoint_keep_last},
          {"checkpoint_keep_every", c.checkpoint_keep_every},
          {"checkpoint_full_every", c.checkpoint_full_every},
          {"checkpoint_when_busy", c.checkpoint_when_busy},
          {"checkpoint_writer_priority", c.checkpoint_writer_priority},
          {"checkpoint_async", c.checkpoint_async},
          {"checkpoint_chunk_mb", c.checkpoint_chunk_mb},
          {"checkpoint_compress", c.checkpoint_compress},
          {"seed", c.seed},
          {"threads", c.threads},
          {"shuffle", c.shuffle},
          {"device", c.device},
          {"dtype", c.dtype},
          {"attention", c.attention},
          {"recompute", c.recompute},
          {"gelu_fusion", c.gelu_fusion},
          {"fuse_residual", c.fuse_residual},
          {"deterministic", c.deterministic},
          {"compression", c.compression},
          {"bucket_mb", c.bucket_mb},
          {"first_bucket_mb", c.first_bucket_mb},
          {"error_feedback", c.error_feedback},
          {"metrics_addr", c.metrics_addr},
          {"metrics_token_file", c.metrics_token_file},
          {"peak_tflops", c.peak_tflops},
          {"anomaly_nonfinite", c.anomaly_nonfinite},
          {"anomaly_spike", c.anomaly_spike},
          {"anomaly_zscore", c.anomaly_zscore},
          {"anomaly_window", c.anomaly_window},
          {"anomaly_max_skips", c.anomaly_max_skips},
          {"anomaly_max_rollbacks", c.anomaly_max_rollbacks}};
}

void ApplyOverrides(const std::vector<std::pair<std::string, std::string>>& overrides, json* model, json* train) {
  for (const auto& [key, text] : overrides) {
    StatusOr<json> parsed = ParseJson(text, "--" + key, /*allow_comments=*/false);
    json value = parsed.ok() ? std::move(*parsed) : json(text);
    if (value.is_object() || value.is_array()) value = text;
    // String-typed keys take the text as given: --out_dir 2024, --sample_prompt true.
    if (auto it = Fields().find(key); it != Fields().end() && std::string(it->second.type) == "a string") value = text;
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
    auto it = Fields().find(key);
    if (it == Fields().end() || !it->second.path || !value.is_string()) continue;
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
  auto it = Fields().find(key);
  return it != Fields().end() && std::string(it->second.type) == "a boolean";
}

std::string ConfigKeysHelp() {
  const json defaults = TrainConfigToJson(TrainConfig{});
  std::string out = "Model config keys:";
  for (const char* k : kModelKeys) out += fmt::format(" --{}", k);
  out += "\nTraining config keys:\n";
  for (const auto& [key, field] : Fields()) {
    const std::string d = defaults.contains(key) ? defaults[key].dump() : "";
    out += fmt::format("  --{:<28} {}{}\n", key, field.path ? "a path" : field.type,
                       d.empty() || d == "\"\"" ? "" : ", default " + d);
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
