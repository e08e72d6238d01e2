#include "engine/train_state.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "base/random.h"
#include "model/safetensors.h"

namespace tf {
namespace {

constexpr const char* kFormat = "trainflow.train_state";
constexpr int kFormatVersion = 1;

StatusOr<int64_t> GetInt(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) return Status::Corruption("{}: training state lacks '{}'", path, key);
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument(key);
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return Status::Corruption("{}: training state '{}' = '{}' is not an integer", path, key, it->second);
  }
}

}  // namespace

std::vector<std::string> TrajectoryKeys() {
  // batch_size and grad_accum_steps are not: with the world size they make the global batch
  // ("rows_per_step"), which is (Trainer::SetState), so a run may resume at another world size.
  return {"seq_len",  "lr",          "min_lr",    "beta1",
          "beta2",      "eps",      "weight_decay",     "warmup_steps", "lr_decay", "grad_clip",
          "seed",       "shuffle",  "max_steps", "dtype",            "compression",  "bucket_mb", "first_bucket_mb",
          "error_feedback", "attention", "recompute", "gelu_fusion", "fuse_residual", "deterministic"};
}

std::string Fingerprint(const std::string& text) {
  return fmt::format("{:016x}", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
}

Status WriteTrainState(const std::string& path, const TrainState& s, Env* env) {
  const int64_t P = static_cast<int64_t>(s.params.size());
  if (static_cast<int64_t>(s.adam_m.size()) != P || static_cast<int64_t>(s.adam_v.size()) != P) {
    return Status::InvalidArgument("{}: training state with {} parameters but {} / {} moments", path, P,
                                   s.adam_m.size(), s.adam_v.size());
  }
  std::vector<TensorView> tensors = {{"params", {P}, s.params.data()},
                                     {"adam.m", {P}, s.adam_m.data()},
                                     {"adam.v", {P}, s.adam_v.data()}};
  if (!s.ef_residual.empty()) {
    tensors.push_back({"ef.residual", {static_cast<int64_t>(s.ef_residual.size())}, s.ef_residual.data()});
  }
  if (!s.ef_server.empty()) {
    tensors.push_back({"ef.server", {static_cast<int64_t>(s.ef_server.size())}, s.ef_server.data()});
  }
  const std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"format_version", std::to_string(kFormatVersion)},
      {"step", std::to_string(s.step)},
      {"rank", std::to_string(s.rank)},
      {"world", std::to_string(s.world)},
      {"data_rows", std::to_string(s.data_rows)},
      {"data_seed", std::to_string(s.data_seed)},
      {"data_shuffle", s.data_shuffle ? "1" : "0"},
      {"data_fingerprint", s.data_fingerprint},
      {"sample_seed", std::to_string(s.sample_seed)},
      {"codec", s.codec},
      {"model_config", s.model_config},
      {"train_config", s.train_config},
      {"model_fingerprint", s.model_fingerprint},
      {"train_fingerprint", s.train_fingerprint},
      {"version", s.version},
      {"run_id", s.run_id},
      {"threads", std::to_string(s.threads)}};
  return WriteSafetensors(path, tensors, meta, SafetensorsDtype::kF32, env);
}

namespace {

StatusOr<TrainState> StateFromMetadata(const std::map<std::string, std::string>& m, const std::string& path) {
  if (auto it = m.find("format"); it == m.end() || it->second != kFormat) {
    return Status::InvalidArgument("{}: not a TrainFlow training state (metadata 'format' is not '{}')", path,
                                   kFormat);
  }
  TF_ASSIGN_OR_RETURN(const int64_t version, GetInt(m, "format_version", path));
  if (version != kFormatVersion) {
    return Status::InvalidArgument("{}: training state format version {} (this trainflow reads {})", path, version,
                                   kFormatVersion);
  }
  TrainState s;
  TF_ASSIGN_OR_RETURN(s.step, GetInt(m, "step", path));
  TF_ASSIGN_OR_RETURN(const int64_t rank, GetInt(m, "rank", path));
  TF_ASSIGN_OR_RETURN(const int64_t world, GetInt(m, "world", path));
  TF_ASSIGN_OR_RETURN(s.data_rows, GetInt(m, "data_rows", path));
  TF_ASSIGN_OR_RETURN(const int64_t data_seed, GetInt(m, "data_seed", path));
  TF_ASSIGN_OR_RETURN(const int64_t shuffle, GetInt(m, "data_shuffle", path));
  TF_ASSIGN_OR_RETURN(const int64_t sample_seed, GetInt(m, "sample_seed", path));
  if (s.step < 0 || s.data_rows < 0 || world < 1 || rank < 0 || rank >= world) {
    return Status::Corruption("{}: training state has step {}, rank {} of {}, {} data rows", path, s.step, rank, world,
                              s.data_rows);
  }
  s.rank = static_cast<int>(rank);
  s.world = static_cast<int>(world);
  s.data_seed = static_cast<uint64_t>(data_seed);
  s.data_shuffle = shuffle != 0;
  s.sample_seed = static_cast<uint64_t>(sample_seed);
  for (const char* key : {"data_fingerprint", "codec", "model_config", "train_config", "model_fingerprint",
                          "train_fingerprint", "version"}) {
    if (!m.contains(key)) return Status::Corruption("{}: training state lacks '{}'", path, key);
  }
  s.data_fingerprint = m.at("data_fingerprint");
  s.codec = m.at("codec");
  s.model_config = m.at("model_config");
  s.train_config = m.at("train_config");
  s.model_fingerprint = m.at("model_fingerprint");
  s.train_fingerprint = m.at("train_fingerprint");
  s.version = m.at("version");
  if (Fingerprint(s.model_config) != s.model_fingerprint || Fingerprint(s.train_config) != s.train_fingerprint) {
    return Status::Corruption("{}: training state's config fingerprints do not match its configs", path);
  }
  if (auto it = m.find("run_id"); it != m.end()) s.run_id = it->second;
  if (m.contains("threads")) {
    TF_ASSIGN_OR_RETURN(const int64_t threads, GetInt(m, "threads", path));
    s.threads = static_cast<int>(std::clamp<int64_t>(threads, 0, 1 << 20));
  }
  return s;
}

}  // namespace

StatusOr<TrainState> ReadTrainStateMeta(const std::string& path, Env* env) {
  TF_ASSIGN_OR_RETURN(const auto meta, ReadSafetensorsMetadata(path, env));
  return StateFromMetadata(meta, path);
}

std::string NewRunId() { return RandomHex(8); }

StatusOr<TrainState> ReadTrainState(const std::string& path, Env* env) {
  TF_ASSIGN_OR_RETURN(SafetensorsContents c, ReadSafetensors(path, env));
  TF_ASSIGN_OR_RETURN(TrainState s, StateFromMetadata(c.metadata, path));
  for (NamedTensor& t : c.tensors) {
    if (t.name == "params") s.params = std::move(t.data);
    else if (t.name == "adam.m") s.adam_m = std::move(t.data);
    else if (t.name == "adam.v") s.adam_v = std::move(t.data);
    else if (t.name == "ef.residual") s.ef_residual = std::move(t.data);
    else if (t.name == "ef.server") s.ef_server = std::move(t.data);
    else return Status::Corruption("{}: unexpected tensor '{}' in a training state", path, t.name);
  }
  if (s.params.empty() || s.adam_m.size() != s.params.size() || s.adam_v.size() != s.params.size()) {
    return Status::Corruption("{}: training state holds {} parameters and {} / {} moments", path, s.params.size(),
                              s.adam_m.size(), s.adam_v.size());
  }
  return s;
}

}  // namespace tf
