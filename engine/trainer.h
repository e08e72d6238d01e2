// Trainer: the training loop of one rank. Owns the backend (engine/train_backend.h), the data
// loaders, the gradient synchroniser (comm/grad_sync.h; a no-op for one rank) and the step
// observers (engine/observers.h: progress line, metrics.jsonl, evaluation, sampling, ...).
//
// One step (Step): ZeroGrad; for each of grad_accum_steps micro-batches ForwardBackward with
// grad_scale = 1/accum (micro-batch index = step*accum + micro); on the last one the backend's
// grad-ready hook feeds the GradientSync, which averages buckets over the ranks while backward
// continues; Finish; AdamW (engine/lr_schedule.h). The loss is the mean over ranks and micro-batches.
// The same Step serves one rank, host ranks and GPU ranks, and `trainflow bench` times it.
//
// Data parallelism: rank r of W reads global micro-batch i*W + r (W ranks with batch B train like
// one rank with batch W*B); rank 0 broadcasts the initial weights and alone prints and writes the
// outputs; every rank checks at start that all run the same configs and data. A stop request
// (SIGINT/SIGTERM, base/stop_signal.h) is agreed on in the step's loss reduction, so all ranks
// stop after the same step. Thread safety: one thread.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/env.h"
#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "comm/process_group.h"
#include "comm/shard_plan.h"
#include "engine/anomaly_guard.h"
#include "engine/checkpointing.h"
#include "engine/data/data_loader.h"
#include "engine/fault_injection.h"
#include "engine/train_backend.h"
#include "engine/train_config.h"
#include "engine/train_state.h"
#include "engine/weights_card.h"
#include "model/gpt2.h"
#include "model/tokenizer.h"

namespace tf {

struct StepStats {
  int64_t step = 0;        // steps completed, this one included (1-based)
  float loss = 0.0f;       // mean over the step's micro-batches and the ranks
  float grad_norm = 0.0f;  // before clipping
  double lr = 0.0;
  double ms = 0.0;
  double tokens_per_s = 0.0;  // all ranks together
  // Gradient synchronisation (zeros for one rank without compression): comm/grad_sync.h ReducerStats.
  double comm_exposed_ms = 0.0;
  double comm_ms = 0.0;
  double codec_ms = 0.0;
  int64_t wire_bytes = 0;
  double compression = 0;  // fp32 gradient bytes / bytes sent (0: nothing sent)
  bool last = false;      // step == max_steps
  bool stopping = false;     // the run stops after this step (before max_steps): stop_at_step or a signal
  bool interrupted = false;  // ... because SIGINT/SIGTERM asked: observers skip evaluation and sampling
  std::optional<float> val_loss;  // set by the evaluation observer when it evaluated after this step
  double checkpoint_stall_ms = 0;  // time the loop spent taking a checkpoint's snapshot after this step
  // Parts of ms: reading data, forward+backward (with the communication it hides), waiting for
  // communication (comm_exposed_ms, including the loss reduction), the optimizer update. On a GPU the
  // host waits for the kernels when it reads the gradient norm, so their time lands in compute_ms.
  double data_ms = 0, compute_ms = 0, optimizer_ms = 0;
  // Rank 0, when the monitor gathers them: every rank's data + compute time, by rank (else empty;
  // not kept in TrainResult).
  std::vector<double> rank_busy_ms;
  std::optional<Anomaly> anomaly;  // what the anomaly guard saw (engine/anomaly_guard.h)
  bool update_skipped = false;     // the optimizer update was not applied
};

struct TrainResult {
  std::vector<StepStats> steps;
  std::vector<std::pair<int64_t, float>> val_losses;  // (step, loss); the last is after the final step
  std::vector<std::pair<int64_t, std::string>> samples;
  int64_t final_step = 0;
  bool stopped = false;  // a stop was requested (signal or stop_at_step) before max_steps
};

class Trainer;

// Hooks run after every step, in the order added; an error ends the run with it.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual Status OnStart(Trainer& trainer) { return Status::OK(); }  // before the first step
  virtual Status OnStep(Trainer& trainer, StepStats& stats) = 0;
  // After the last step (or a stop), before the outputs are written.
  virtual Status OnEnd(Trainer& trainer, const TrainResult& result) { return Status::OK(); }
  // The run went back from step `from` (an anomaly, not applied) to checkpoint step `to`.
  virtual Status OnRollback(Trainer& trainer, int64_t from, int64_t to) { return Status::OK(); }
};

class Trainer {
 public:
  struct Options {
    bool print_progress = true;  // progress lines, eval results and samples on stdout (rank 0)
    bool write_outputs = true;   // weights, configs, metrics.jsonl in out_dir (rank 0)
    bool distributed = true;     // join the launcher's process group (false: always world size 1)
    bool evaluate = true;        // the eval and sampling observers
    bool monitor = true;         // the metrics endpoint and dashboard (when metrics_addr is set)
    Env* env = nullptr;          // file system (nullptr: Env::Default())
    // In-memory training tokens instead of the train_data file (`trainflow bench`'s synthetic data).
    std::vector<uint16_t> train_tokens = {};
    // Tests: this rank's loss reads as NaN at the step that reads the data of step N (1-based; the
    // step itself until a rollback skips data), as if that batch made the forward pass overflow.
    int64_t inject_nan_loss_at_step = 0;
    // Tests of the supervisor: faults injected at defined points of the step (nullptr: none).
    std::shared_ptr<FaultInjection> faults = nullptr;
  };
  // Validates the run, loads data (and the tokenizer if samples are wanted), checks out_dir, and
  // initialises, imports (init_from) or resumes (resume_state) the weights. Errors name the key or file.
  static StatusOr<std::unique_ptr<Trainer>> Create(const GPT2Config& model, const TrainConfig& train,
                                                   Options options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  // Steps from step() to max_steps (or a stop), running the observers; then the outputs.
  StatusOr<TrainResult> Run();
  // One optimizer step (number step() + 1); advances step().
  StatusOr<StepStats> Step();
  // Mean loss over micro-batches [0, n_batches) of `loader` (a fixed set, comparable across evals),
  // averaged over the ranks in a data-parallel job.
  StatusOr<float> Evaluate(const DataLoader& loader, int n_batches);
  // The same on one rank's backend (`trainflow eval`): mean over micro-batches [0, n_batches).
  static StatusOr<double> MeanLoss(TrainBackend& backend, const DataLoader& loader, int64_t n_batches);
  // Text sampled from the current weights at this step (rank 0; needs a tokenizer).
  StatusOr<std::string> SampleText();
  // Every rank, before rank 0 samples: gathers the weights for it when they are sharded (ZeRO
  // stage 3); nothing otherwise.
  Status PrepareSampling();

  void AddObserver(std::unique_ptr<StepObserver> observer) { observers_.push_back(std::move(observer)); }
  // Every byte an exact resume needs (engine/train_state.h), and the inverse.
  StatusOr<TrainState> GetState();
  Status SetState(const TrainState& state);
  // What the weights record of the run (engine/weights_card.h), as of this step.
  WeightsCard Card() const;
  // GetState without the tensors.
  TrainState StateMeta() const;
  // Global batch: rows (sequences) per optimizer step over all ranks.
  int64_t rows_per_step() const {
    return int64_t{config_.batch_size} * config_.grad_accum_steps * topology_.world;
  }
  // "resumed from ... (step N, ...)" when the run continues a checkpoint or state file, else "".
  const std::string& resumed_from() const { return resumed_from_; }
  // The step of the checkpoint of checkpoint_dir this run resumed from, or -1.
  int64_t resumed_checkpoint_step() const { return resumed_checkpoint_step_; }
  // Rank 0: warns when a resumed state was written with another world size or thread count (the
  // summation order differs, so results match only up to float rounding).
  void NoteSummationOrder(int world, int threads);
  // The run's id (engine/train_state.h TrainState::run_id).
  const std::string& run_id() const { return run_id_; }
  // Barrier over the ranks without the collective deadline (`activity` names it in timeouts).
  Status Barrier(const std::string& activity);

  int64_t step() const { return step_; }
  TrainBackend& backend() { return *backend_; }
  const comm::Topology& topology() const { return topology_; }
  const TrainConfig& config() const { return config_; }
  const GPT2Config& model_config() const { return model_config_; }
  const Options& options() const { return options_; }
  Env* env() const { return env_; }
  const DataLoader& train_data() const { return *train_data_; }
  // The state one rank holds, by kind (engine/memory_plan.h DescribeStateBytes), as planned at start.
  const std::string& state_bytes_line() const { return state_bytes_line_; }
  // Who owns which range of the flat state (engine/sharded_backend.h TrainShardPlan): over the
  // ranks of one replica group (shard_group_size; all ranks without groups).
  const comm::ShardPlan& shard_plan() const { return plan_; }
  // This rank's index in the plan: its place within its replica group (the rank without groups).
  int shard_rank() const { return topology_.rank % plan_.world; }
  const DataLoader* val_data() const { return val_data_ ? &*val_data_ : nullptr; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  bool data_parallel() const { return data_parallel_; }
  // The codec of gradient synchronisation ("none" for one rank) and why it was chosen.
  const std::string& compression() const { return codec_; }
  const std::string& compression_reason() const { return codec_reason_; }
  comm::GradientSync& gradient_sync() { return *sync_; }
  const std::vector<std::string>& rank_devices() const { return rank_devices_; }
  // The result Run() is building (observers add evaluations and samples to it).
  TrainResult& result() { return result_; }
  // Barrier after rank-0-only work (sampling), without the collective deadline.
  Status WaitForRankZero();
  // The run's checkpoints (nullptr without a checkpoint_dir).
  TrainCheckpointing* checkpointing() { return checkpointing_.get(); }
  // The checkpointer's counters (nullopt without checkpoints).
  std::optional<checkpoint::CheckpointerStats> checkpoint_stats() const;
  // Steps of data skipped by rollbacks: step s reads the data of step s + data_offset().
  int64_t data_offset() const { return data_offset_; }
  // How many ranks pass `flag` = true (one small reduction; `flag` itself for one rank).
  StatusOr<int> CountOverRanks(bool flag);
  // Every rank's `x`, by rank (one all-gather; {x} for one rank).
  StatusOr<std::vector<double>> GatherOverRanks(double x);
  // Rank 0's `bytes` at `data` on every rank (a no-op for one rank).
  Status BroadcastFromRankZero(void* data, size_t bytes);
  // The anomaly guard's (kind, action) pairs, for the metrics' labels.
  std::vector<std::pair<std::string, std::string>> anomaly_label_pairs() const { return guard_->LabelPairs(); }
  // Ask every step's reduction to carry each rank's busy time (StepStats::rank_busy_ms).
  void GatherRankTimes(bool on) { gather_rank_times_ = on && topology_.world > 1; }

 private:
  Trainer() = default;
  Status SetUpDataParallel();
  // Plans this rank's state bytes for the configured stage and refuses, before allocating, a
  // configuration whose ranks' state will not fit this host's memory (engine/memory_plan.h).
  Status PlanMemory();
  Status ResolveTokenizer();
  Status Resume(const std::string& path);
  // Where the run starts: resume_state, else checkpoint_dir (resume), else a stopped run's state
  // in out_dir; refuses an out_dir or checkpoint_dir holding another or a finished run without
  // fresh (docs/checkpoints.md, "Running the same command again").
  Status ResumeOrStart();
  // InvalidArgument naming the committed checkpoints in checkpoint_dir, if any.
  Status RefuseOtherCheckpoints();
  // Removes `path` if it exists.
  Status RemoveIfExists(const std::string& path);
  // Mean over ranks of x[0..n) (x itself for one rank).
  Status SumOverRanks(double* x, int n);
  Status WriteOutputs(const TrainResult& result);
  // The guard's verdict on step `s`: OK to go on (warn, skip), an error to stop, or a rollback.
  Status HandleAnomaly(StepStats& s);
  // Back to the newest committed checkpoint before `anomaly_step`, skipping the data up to it.
  Status RollBack(int64_t anomaly_step);
  // Zeroes a lossy codec's error-feedback residuals (after a rejected gradient).
  Status ClearErrorFeedback();
  std::string StatePath() const;
  // After a stop: how to continue the run ("run the same command again to resume from ...").
  std::string HowToContinue() const;

  GPT2Config model_config_;
  TrainConfig config_;
  Options options_;
  Env* env_ = nullptr;
  comm::Topology topology_;
  comm::ShardPlan plan_;
  std::string state_bytes_line_;
  std::unique_ptr<TrainBackend> backend_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<comm::GradientSync> sync_;
  bool data_parallel_ = false;
  bool reduce_now_ = false;  // the grad-ready hook forwards to sync_ only on the last micro-step
  std::string codec_ = "none", codec_reason_;
  std::vector<std::string> rank_devices_;  // "rank r on host (local rank l): device", every rank
  std::optional<DataLoader> train_data_, val_data_;
  std::unique_ptr<Tokenizer> tokenizer_;
  uint64_t tokenizer_fingerprint_ = 0;  // what the data records (or the loaded files give)
  std::unique_ptr<TrainCheckpointing> checkpointing_;  // declared after backend_: destroyed first
  std::string resumed_from_;
  int64_t resumed_checkpoint_step_ = -1;
  bool final_checkpoint_ = false;  // the end-of-run checkpoint was committed (this rank's part, ranks > 0)
  double ckpt_slots_[TrainCheckpointing::kSlots] = {};  // the step's reduced checkpoint agreement
  std::unique_ptr<GPT2> sampler_model_;  // host copy for sampling
  bool sampling_ = false;                // rank 0 samples (known on every rank)
  bool sampler_ready_ = false;           // PrepareSampling filled sampler_model_ for this step
  std::vector<int32_t> inputs_, targets_;
  std::vector<std::unique_ptr<StepObserver>> observers_;
  TrainResult result_;
  int64_t step_ = 0;
  int64_t data_offset_ = 0;
  bool stop_agreed_ = false;  // the last step's reduction said some rank was asked to stop
  bool gather_rank_times_ = false;
  std::vector<double> reduce_buf_;  // the step's reduction
  std::optional<AnomalyGuard> guard_;
  int consecutive_skips_ = 0;
  int rollbacks_ = 0;
  std::string run_id_;
  std::vector<int64_t> extended_at_;  // steps where `extend` began a new trajectory
};

}  // namespace tf
