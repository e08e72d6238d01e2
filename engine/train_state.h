// TrainState: every byte an exact resume needs, as host copies (Trainer::GetState / SetState).
// The data order, the learning-rate schedule and the sampling seeds are pure functions of the step
// and the seeds (engine/data/data_loader.h, engine/lr_schedule.h), so the step, the global rows read and
// the seeds stand for their "RNG state"; the fingerprints make a resume refuse a different model,
// data or trajectory-changing configuration instead of silently diverging.
//
// WriteTrainState/ReadTrainState store one as safetensors (named fp32 tensors plus metadata; format
// in docs/formats.md, "Training state"), written atomically through an Env. The checkpointer stores
// the same fields. Thread safety: values.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace tf {

struct TrainState {
  int64_t step = 0;                  // optimizer steps completed
  std::vector<float> params;         // fp32 master weights, ParameterLayout order
  std::vector<float> adam_m, adam_v;  // AdamW moments, same layout
  // Loaded for a sharded run (ZeRO): the moments (and, when shorter than the model, the
  // parameters) hold elements [slice_begin, slice_begin + adam_m.size()) only. 0 with whole vectors.
  int64_t slice_begin = 0;
  // This rank's error-feedback residuals (comm/grad_sync.h GetState; empty for exact codecs).
  std::vector<float> ef_residual, ef_server;
  int rank = 0, world = 1;           // whose residuals they are
  // Data order: global micro-batch rows consumed so far, the shuffle seed and on/off.
  int64_t data_rows = 0;
  uint64_t data_seed = 0;
  bool data_shuffle = false;
  std::string data_fingerprint;      // DataLoader::Fingerprint of the training data
  uint64_t sample_seed = 0;          // samples at step s use sample_seed + s
  std::string codec;                 // the gradient codec the residuals belong to
  // Canonical JSON of the model config and of the trajectory-relevant training keys, and their
  // xxh64 fingerprints (hex).
  std::string model_config, train_config, model_fingerprint, train_fingerprint;
  std::string version;               // trainflow version that wrote it
  // The run this state belongs to: 16 hex digits drawn when a run starts at step 0 and kept by
  // every resume (checkpoint retention deletes only its own run's checkpoints); "" in older files.
  std::string run_id;
  int threads = 0;                   // CPU threads per rank of the run that wrote it; 0: not recorded
};

// The training keys that change the trajectory of the numbers (all but logging, evaluation,
// sampling, output and stop_at_step; max_steps is one, as the learning-rate decay depends on it):
// a resume must match them.
std::vector<std::string> TrajectoryKeys();
// Hex xxh64 of `text`.
std::string Fingerprint(const std::string& text);

Status WriteTrainState(const std::string& path, const TrainState& state, Env* env = Env::Default());
StatusOr<TrainState> ReadTrainState(const std::string& path, Env* env = Env::Default());
// The same without the tensors (only the file's header is read).
StatusOr<TrainState> ReadTrainStateMeta(const std::string& path, Env* env = Env::Default());
// A fresh run id (TrainState::run_id).
std::string NewRunId();

}  // namespace tf
