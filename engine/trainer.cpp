#include "engine/trainer.h"

#include "base/json.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/spdlog.h>

#include "base/progress.h"
#include "base/stop_signal.h"
#include "engine/lr_schedule.h"
#include "engine/memory_plan.h"
#include "engine/sharded_backend.h"
#include "engine/monitoring.h"
#include "engine/run_report.h"
#include "engine/observers.h"
#include "engine/sampler.h"
#include "engine/weights_card.h"
#include "model/gpt2_weights.h"

namespace tf {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// "extended_at": the steps where `extend` changed max_steps or the schedule (a new trajectory from there).
std::string TrajectoryJson(const TrainConfig& c, int world, const std::vector<int64_t>& extended_at) {
  const json all = TrainConfigToJson(c);
  json t = json::object();
  for (const std::string& k : TrajectoryKeys()) {
    if (all.contains(k)) t[k] = all[k];
  }
  t["rows_per_step"] = int64_t{c.batch_size} * c.grad_accum_steps * world;
  if (!extended_at.empty()) t["extended_at"] = extended_at;
  return t.dump();
}

// The keys `extend` may change: the length of the run and its learning-rate schedule.
bool ExtendableKey(const std::string& key) {
  return key == "max_steps" || key == "lr" || key == "min_lr" || key == "warmup_steps" || key == "lr_decay";
}

int Threads() { return omp_get_max_threads(); }

}  // namespace

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const GPT2Config& model, const TrainConfig& train,
                                                   Options options) {
  TF_RETURN_IF_ERROR(ValidateConfig(model));
  TF_RETURN_IF_ERROR(ValidateRun(model, train));
  std::unique_ptr<Trainer> t(new Trainer());
  t->model_config_ = model;
  t->config_ = train;
  t->options_ = options;
  t->options_.train_tokens.clear();
  t->env_ = options.env != nullptr ? options.env : Env::Default();
  if (train.threads > 0) omp_set_num_threads(train.threads);
  if (options.distributed) {
    TF_ASSIGN_OR_RETURN(t->topology_, comm::InitProcessGroup());
  }
  if (options.faults != nullptr) TF_RETURN_IF_ERROR(options.faults->Start(t->topology_.rank));
  const comm::Topology& topo = t->topology_;
  if (topo.world > 1) {
    // Every rank must run the same job: compare configs before anything else talks.
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(ModelConfigToJson(model).dump(), "model config"));
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(TrainConfigToJson(train).dump(), "training config"));
  }
  TF_RETURN_IF_ERROR(CheckShardGroupSize(train, topo.world));
  // Outputs are checked now, not after hours of training.
  if (options.write_outputs && topo.rank == 0) {
    if (train.out_dir.empty()) return Status::InvalidArgument("training config key 'out_dir' is empty");
    TF_RETURN_IF_ERROR(t->env_->CheckWritableDir(train.out_dir));
  }

  if (options.train_tokens.empty()) {
    TF_ASSIGN_OR_RETURN(auto loader, DataLoader::Open(train.train_data, model.vocab_size, train.batch_size,
                                                      train.seq_len, topo.rank, topo.world, train.shuffle, train.seed));
    t->train_data_.emplace(std::move(loader));
  } else {
    TF_ASSIGN_OR_RETURN(auto loader, DataLoader::FromTokens(std::move(options.train_tokens), model.vocab_size,
                                                            train.batch_size, train.seq_len, topo.rank, topo.world,
                                                            train.shuffle, train.seed, "synthetic tokens"));
    t->train_data_.emplace(std::move(loader));
  }
  if (!train.val_data.empty()) {
    TF_ASSIGN_OR_RETURN(auto val_loader, DataLoader::Open(train.val_data, model.vocab_size, train.batch_size,
                                                          train.seq_len, topo.rank, topo.world));
    t->val_data_.emplace(std::move(val_loader));
  }
  if (topo.world > 1) {
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(t->train_data_->Fingerprint(), "training data"));
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(t->val_data_ ? t->val_data_->Fingerprint() : "", "validation data"));
  }
  TF_RETURN_IF_ERROR(t->ResolveTokenizer());

  // Sharded within replica groups of shard_group_size ranks (all of them by default).
  t->plan_ = TrainShardPlan(model, train, train.shard_group_size > 0 ? train.shard_group_size : topo.world);
  TF_RETURN_IF_ERROR(t->PlanMemory());
  TF_ASSIGN_OR_RETURN(t->backend_, MakeTrainBackend(model, train, topo, t->plan_));
  if (!UsesCuda(train) && options.print_progress && topo.rank == 0 &&
      (train.attention != "flash" || train.recompute != 0 || train.gelu_fusion != -1 || !train.fuse_residual)) {
    spdlog::warn("attention \"{}\", recompute {}, gelu_fusion {}, fuse_residual {} apply to the CUDA backend only; "
                 "the CPU backend ignores them",
                 train.attention, train.recompute, train.gelu_fusion, train.fuse_residual);
  }

  TF_RETURN_IF_ERROR(t->SetUpDataParallel());
  if (const auto [first, host] = t->backend_->HostParams(); train.init_from.empty() && !host.empty()) {
    // Every rank draws the same values into what it keeps (a ZeRO stage-3 shard: only those): no
    // whole-model copy, nothing to broadcast.
    InitGPT2Weights(model, train.seed, host, /*parallel=*/false, first);
  } else {
    std::vector<float> params(static_cast<size_t>(t->backend_->layout().total()));
    if (train.init_from.empty()) {
      InitGPT2Weights(model, train.seed, params);
    } else {
      TF_RETURN_IF_ERROR(ImportHFWeights(train.init_from, model, params, t->env_).WithContext("init_from"));
    }
    if (t->comm_ && topo.world > 1) {
      // Same start on every rank, whatever each read.
      TF_RETURN_IF_ERROR(t->comm_->Broadcast(params.data(), params.size() * sizeof(float), 0));
    }
    TF_RETURN_IF_ERROR(t->backend_->SetParams(params));
  }
  TF_RETURN_IF_ERROR(t->ResumeOrStart());
  TF_ASSIGN_OR_RETURN(t->checkpointing_, TrainCheckpointing::Create(*t));
  AnomalyGuard::Options go;
  TF_ASSIGN_OR_RETURN(go.nonfinite, ParseAnomalyAction(train.anomaly_nonfinite));
  TF_ASSIGN_OR_RETURN(go.spike, ParseAnomalyAction(train.anomaly_spike));
  go.zscore = train.anomaly_zscore;
  go.window = train.anomaly_window;
  t->guard_.emplace(go);
  const size_t bt = static_cast<size_t>(train.batch_size) * static_cast<size_t>(train.seq_len);
  t->inputs_.resize(bt);
  t->targets_.resize(bt);

  // In this order: the progress line (and the banner) first, then what the step's evaluation and
  // sample print, then the metrics record that includes the validation loss.
  if (options.print_progress && topo.rank == 0) t->AddObserver(MakeProgressObserver());
  if (options.evaluate) {
    t->AddObserver(MakeEvalObserver());
    t->AddObserver(MakeSampleObserver());
  }
  if (options.write_outputs && topo.rank == 0) {
    t->AddObserver(MakeMetricsJsonlObserver(train.out_dir + "/metrics.jsonl"));
  }
  if (options.monitor) {
    TF_ASSIGN_OR_RETURN(std::unique_ptr<StepObserver> monitor, MakeMonitorObserver(*t));
    if (monitor) t->AddObserver(std::move(monitor));
  }
  return t;
}

Trainer::~Trainer() = default;

Status Trainer::PlanMemory() {
  const bool cuda = UsesCuda(config_);
  const StateDevice device = !cuda ? StateDevice::kCpu
                             : config_.dtype == "bf16" ? StateDevice::kCudaBf16
                                                       : StateDevice::kCudaFp32;
  // The CUDA model plans its own device buffers (and refuses what does not fit); the CPU's
  // activation arena is known before anything is allocated.
  const int64_t activations = cuda ? 0 : GPT2::ActivationBytes(model_config_, config_.batch_size, config_.seq_len);
  const int64_t shard = plan_.shard_elements;
  auto plan_for = [&](int stage) { return PlanStateBytes(model_config_, device, stage, shard, activations); };
  state_bytes_line_ = DescribeStateBytes(plan_for(config_.zero_stage), config_.zero_stage, plan_.world);
  if (cuda) return Status::OK();
  TF_ASSIGN_OR_RETURN(const MemoryBudget budget, HostMemoryBudget(env_, topology_.local_world));
  return CheckStateFits(config_.zero_stage, plan_.world, plan_for, budget);
}

// The tokenizer is the data's: what train.bin records (val.bin must agree), else what the config
// says, else what the vocabulary implies. The model must fit it exactly.
Status Trainer::ResolveTokenizer() {
  const TokenFileTokenizer& rec = train_data_->tokenizer();
  std::string kind = config_.tokenizer;
  if (val_data_ && !rec.kind.empty() && !val_data_->tokenizer().kind.empty() && !(val_data_->tokenizer() == rec)) {
    const TokenFileTokenizer& v = val_data_->tokenizer();
    return Status::InvalidArgument("{} ({} tokenizer, fingerprint {:016x}) and {} ({} tokenizer, fingerprint {:016x}) "
                                   "were tokenized differently: prepare them together with `trainflow prepare`",
                                   train_data_->name(), rec.kind, rec.fingerprint, val_data_->name(), v.kind,
                                   v.fingerprint);
  }
  if (!rec.kind.empty()) {
    if (kind != "auto" && kind != rec.kind) {
      return Status::InvalidArgument("{} was tokenized with the {} tokenizer, but the training config says "
                                     "\"tokenizer\": \"{}\": set it to \"{}\" or leave it out (auto takes the data's)",
                                     train_data_->name(), rec.kind, kind, rec.kind);
    }
    kind = rec.kind;
    TF_RETURN_IF_ERROR(CheckTokenizerFitsModel(kind, model_config_, train_data_->name() + "'s"));
  } else if (kind == "auto") {
    kind = TokenizerKindForVocab(model_config_.vocab_size);
  }
  config_.tokenizer = kind.empty() ? "auto" : kind;
  tokenizer_fingerprint_ = rec.fingerprint;
  const bool prints = options_.print_progress && topology_.rank == 0;
  sampling_ = options_.evaluate && options_.print_progress && config_.sample_tokens != 0 && !kind.empty();
  if (!options_.evaluate || !prints || config_.sample_tokens == 0) return Status::OK();
  if (kind.empty()) {
    spdlog::warn("no samples: {} records no tokenizer and vocab_size {} fits none (set \"tokenizer\")",
                 train_data_->name(), model_config_.vocab_size);
    return Status::OK();
  }
  TF_ASSIGN_OR_RETURN(tokenizer_, MakeTokenizer(kind, config_.tokenizer_dir));
  if (rec.fingerprint != 0 && tokenizer_->fingerprint() != rec.fingerprint) {
    spdlog::warn("the {} tokenizer files found here (fingerprint {:016x}) are not the ones {} was prepared with "
                 "({:016x}): samples may decode wrongly",
                 kind, tokenizer_->fingerprint(), train_data_->name(), rec.fingerprint);
  }
  if (tokenizer_fingerprint_ == 0) tokenizer_fingerprint_ = tokenizer_->fingerprint();
  return Status::OK();
}

Status Trainer::SetUpDataParallel() {
  // ZeRO stages 1-3 reduce inside the backend, one rank or several.
  std::unique_ptr<comm::GradientSync> own = backend_->TakeGradientSync();
  const bool sharded = own != nullptr;
  sync_ = sharded ? std::move(own) : comm::MakeLocalGradientSync();
  auto hook = [this](int64_t begin, int64_t end) {
    if (reduce_now_) sync_->MarkReady(begin, end);
  };
  if (sharded) backend_->SetGradReadyHook(hook);
  if (topology_.world == 1 && config_.compression == "none") return Status::OK();
  data_parallel_ = true;
  // The host communicator also carries the loss/eval averages and the initial broadcast on GPUs.
  TF_ASSIGN_OR_RETURN(comm_, comm::MakeHostCommunicator(topology_));
  {  // Every rank's host and device, for the start-up report.
    constexpr size_t kLine = 256;  // fixed-size records; a longer line is cut, still terminated
    std::string mine = fmt::format("rank {} on {} (local rank {}): {}", topology_.rank, topology_.hostname,
                                   topology_.local_rank, backend_->Describe());
    mine.resize(kLine - 1);
    mine.resize(kLine, '\0');
    std::string all(kLine * static_cast<size_t>(topology_.world), '\0');
    TF_RETURN_IF_ERROR(comm_->AllGather(mine.data(), all.data(), kLine));
    for (int r = 0; r < topology_.world; ++r) {
      rank_devices_.emplace_back(all.c_str() + kLine * static_cast<size_t>(r));
    }
  }
  if (sharded) {
    codec_ = "none";
    const int G = plan_.world;
    codec_reason_ = fmt::format("zero_stage {}: each unit's gradient is reduce-scattered to its owners as backward "
                                "finishes it{}",
                                config_.zero_stage,
                                G == topology_.world ? ""
                                                     : fmt::format(", within replica groups of {} ranks, then summed "
                                                                   "across the {} groups",
                                                                   G, topology_.world / G));
    return Status::OK();
  }
  comm::ReducerOptions ro;
  ro.bucket_bytes = static_cast<int64_t>(config_.bucket_mb * (1 << 20));
  ro.first_bucket_bytes = static_cast<int64_t>(config_.first_bucket_mb * (1 << 20));
  ro.error_feedback = config_.error_feedback;
  ro.seed = config_.seed;
  TF_ASSIGN_OR_RETURN(comm::GradientSyncSetup setup,
                      comm::MakeGradientSync(topology_, comm_.get(), backend_->gradient_buffer(),
                                             GradReadyRanges(backend_->layout()), ro, config_.compression));
  sync_ = std::move(setup.sync);
  codec_ = setup.codec;
  codec_reason_ = setup.reason;
  backend_->SetGradReadyHook(hook);
  return Status::OK();
}

Status Trainer::WaitForRankZero() {
  if (topology_.world == 1 || !comm_) return Status::OK();
  // Rank 0 alone samples (minutes for a large model on a CPU): the others wait here without the
  // collective deadline rather than time out in the next step's reduction.
  const double deadline = comm_->timeout_seconds();
  comm::SetActivity(fmt::format("waiting for rank 0 to finish sampling after step {}", step_));
  comm_->set_timeout_seconds(1e7);
  Status s = comm_->Barrier();
  comm_->set_timeout_seconds(deadline);
  return s;
}

Status Trainer::Barrier(const std::string& activity) {
  if (topology_.world == 1 || !comm_) return Status::OK();
  const double deadline = comm_->timeout_seconds();
  comm::SetActivity(activity);
  comm_->set_timeout_seconds(1e7);
  Status s = comm_->Barrier();
  comm_->set_timeout_seconds(deadline);
  return s;
}

StatusOr<int> Trainer::CountOverRanks(bool flag) {
  double x = flag ? 1.0 : 0.0;
  TF_RETURN_IF_ERROR(SumOverRanks(&x, 1));
  return static_cast<int>(x + 0.5);
}

StatusOr<std::vector<double>> Trainer::GatherOverRanks(double x) {
  std::vector<double> all(static_cast<size_t>(topology_.world), x);
  if (topology_.world == 1 || !comm_) return all;
  TF_RETURN_IF_ERROR(comm_->AllGather(&x, all.data(), sizeof(double)));
  return all;
}

Status Trainer::BroadcastFromRankZero(void* data, size_t bytes) {
  if (topology_.world == 1 || !comm_) return Status::OK();
  return comm_->Broadcast(data, bytes, 0);
}

Status Trainer::SumOverRanks(double* x, int n) {
  if (topology_.world == 1 || !comm_) return Status::OK();
  return comm_->AllReduceSum(x, n, comm::DataType::kF64);
}

StatusOr<double> Trainer::MeanLoss(TrainBackend& backend, const DataLoader& loader, int64_t n_batches) {
  std::vector<int32_t> inputs(static_cast<size_t>(loader.B()) * loader.T()), targets(inputs.size());
  double sum = 0.0;
  for (int64_t i = 0; i < n_batches; ++i) {
    loader.Load(i, inputs.data(), targets.data());
    TF_ASSIGN_OR_RETURN(float loss, backend.Forward(inputs.data(), targets.data(), loader.B(), loader.T()));
    AdvanceProgress();
    sum += loss;
  }
  return n_batches > 0 ? sum / static_cast<double>(n_batches) : 0.0;
}

StatusOr<float> Trainer::Evaluate(const DataLoader& loader, int n_batches) {
  SetPhase(Phase::kEval);
  TF_ASSIGN_OR_RETURN(double mean, MeanLoss(*backend_, loader, n_batches));
  if (data_parallel_) comm::SetActivity(fmt::format("evaluating after step {}", step_));
  SetPhase(Phase::kCommunication);
  TF_RETURN_IF_ERROR(SumOverRanks(&mean, 1));
  return static_cast<float>(mean / topology_.world);
}

StatusOr<StepStats> Trainer::Step() {
  const int64_t step = step_;
  const int64_t data_step = step + data_offset_;
  const auto t0 = Clock::now();
  auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  const int accum = config_.grad_accum_steps;
  StepStats s;
  s.step = step + 1;
  s.lr = LearningRate(config_, step);
  TF_RETURN_IF_ERROR(backend_->ZeroGrad());
  sync_->BeginStep(step);
  for (int micro = 0; micro < accum; ++micro) {
    SetPhase(Phase::kData);
    const auto td = Clock::now();
    train_data_->Load(data_step * accum + micro, inputs_.data(), targets_.data());
    s.data_ms += ms_since(td);
    // Gradient accumulation: only the last micro-step's backward produces final gradients.
    reduce_now_ = micro == accum - 1;
    SetPhase(Phase::kCompute);
    if (options_.faults != nullptr) options_.faults->BeforeForward(step + 1, micro);
    TF_RETURN_IF_ERROR(backend_->ForwardBackwardAccumulate(inputs_.data(), targets_.data(), config_.batch_size,
                                                           config_.seq_len, 1.0f / static_cast<float>(accum)));
  }
  reduce_now_ = false;
  SetPhase(Phase::kCommunication);
  if (data_parallel_) comm::SetActivity(fmt::format("step {}: reducing the gradients", step + 1));
  TF_RETURN_IF_ERROR(sync_->Finish());
  // The norm and the loss are read before the update (on a GPU, the step's one synchronisation), so
  // the anomaly guard can keep a bad update from being applied.
  TF_ASSIGN_OR_RETURN(s.grad_norm, backend_->GradNorm());
  TF_ASSIGN_OR_RETURN(double loss_sum, backend_->TakeLossSum());
  if (options_.inject_nan_loss_at_step == data_step + 1) loss_sum = std::nan("");
  TF_ASSIGN_OR_RETURN(const comm::ReducerStats r, sync_->LastStats());
  const double busy_ms = std::max(0.0, ms_since(t0) - r.exposed_ms);
  // One small reduction carries the loss, the stop flag, rank 0's gradient norm (so every rank
  // judges the same value, even where a norm's reduction grid differs between GPU models), the
  // checkpoint agreement and (for the monitor) every rank's busy time in its own slot.
  constexpr int kCkpt = 3;
  constexpr int kFixed = kCkpt + TrainCheckpointing::kSlots;
  const int n = kFixed + (gather_rank_times_ ? topology_.world : 0);
  reduce_buf_.assign(static_cast<size_t>(n), 0.0);
  reduce_buf_[0] = loss_sum / accum;
  reduce_buf_[1] = StopRequested() ? 1.0 : 0.0;
  reduce_buf_[2] = topology_.rank == 0 ? static_cast<double>(s.grad_norm) : 0.0;
  if (checkpointing_) checkpointing_->Contribute(reduce_buf_.data() + kCkpt);
  if (gather_rank_times_) reduce_buf_[kFixed + topology_.rank] = busy_ms;
  if (data_parallel_) comm::SetActivity(fmt::format("step {}: averaging the loss", step + 1));
  const auto tr = Clock::now();
  TF_RETURN_IF_ERROR(SumOverRanks(reduce_buf_.data(), n));
  const double reduce_ms = ms_since(tr);
  s.loss = static_cast<float>(reduce_buf_[0] / topology_.world);
  stop_agreed_ = reduce_buf_[1] > 0;
  s.grad_norm = static_cast<float>(reduce_buf_[2]);
  std::copy(reduce_buf_.begin() + kCkpt, reduce_buf_.begin() + kFixed, ckpt_slots_);
  if (gather_rank_times_ && topology_.rank == 0) s.rank_busy_ms.assign(reduce_buf_.begin() + kFixed, reduce_buf_.end());
  s.comm_exposed_ms = r.exposed_ms + reduce_ms;
  s.comm_ms = r.comm_ms;
  s.codec_ms = r.codec_ms;
  s.wire_bytes = r.wire_bytes;
  s.compression = r.compression();
  s.compute_ms = std::max(0.0, busy_ms - s.data_ms);
  // Every rank has the same loss and norm, so every rank reaches the same verdict.
  s.anomaly = guard_->Check(s.loss, s.grad_norm);
  SetPhase(Phase::kOptimizer);
  if (!s.anomaly || s.anomaly->action == AnomalyAction::kWarn) {
    const auto to = Clock::now();
    TF_RETURN_IF_ERROR(backend_->ApplyUpdate(s.lr, step + 1));
    s.optimizer_ms = ms_since(to);
    s.wire_bytes += backend_->update_wire_bytes();
  } else {
    s.update_skipped = true;
  }
  s.ms = ms_since(t0);
  s.tokens_per_s = static_cast<double>(config_.tokens_per_step()) * topology_.world / (s.ms / 1000.0);
  step_ = step + 1;
  SetStepsDone(step_);
  return s;
}

StatusOr<std::string> Trainer::SampleText() {
  if (!tokenizer_) return Status::Internal("SampleText without a tokenizer");
  SetPhase(Phase::kSample);
  std::vector<int32_t> prompt = tokenizer_->Encode(config_.sample_prompt);
  if (prompt.empty()) {
    const int eot = tokenizer_->eot_token();
    prompt.push_back(eot >= 0 ? eot : '\n');
  }
  SampleOptions o;
  o.num_tokens = config_.sample_tokens;
  o.temperature = config_.sample_temperature;
  o.top_k = config_.sample_top_k;
  o.seed = config_.seed + static_cast<uint64_t>(step_);
  if (!sampler_model_) {
    TF_ASSIGN_OR_RETURN(sampler_model_, GPT2::Create(model_config_, 1, config_.seq_len));
  }
  if (!sampler_ready_) TF_RETURN_IF_ERROR(backend_->GetParams(sampler_model_->params()));
  sampler_ready_ = false;
  std::vector<int32_t> ids = Sample(*sampler_model_, prompt, o);
  return config_.sample_prompt + tokenizer_->Decode(ids);
}

Status Trainer::PrepareSampling() {
  if (!backend_->params_collective() || !sampling_) return Status::OK();
  if (topology_.rank != 0) return backend_->GetParams({});  // takes part, keeps nothing
  if (!sampler_model_) {
    TF_ASSIGN_OR_RETURN(sampler_model_, GPT2::Create(model_config_, 1, config_.seq_len));
  }
  TF_RETURN_IF_ERROR(backend_->GetParams(sampler_model_->params()));
  sampler_ready_ = true;
  return Status::OK();
}

StatusOr<TrainState> Trainer::GetState() {
  TrainState s = StateMeta();
  const size_t P = static_cast<size_t>(backend_->layout().total());
  s.params.resize(P);
  s.adam_m.resize(P);
  s.adam_v.resize(P);
  TF_RETURN_IF_ERROR(backend_->GetParams(s.params));
  TF_RETURN_IF_ERROR(backend_->GetOptimizerState(s.adam_m, s.adam_v));
  TF_RETURN_IF_ERROR(sync_->GetState(&s.ef_residual, &s.ef_server));
  return s;
}

TrainState Trainer::StateMeta() const {
  TrainState s;
  s.step = step_;
  s.rank = topology_.rank;
  s.world = topology_.world;
  s.data_rows = (step_ + data_offset_) * rows_per_step();
  s.data_seed = config_.seed;
  s.data_shuffle = config_.shuffle;
  s.data_fingerprint = train_data_->Fingerprint();
  s.sample_seed = config_.seed;
  s.codec = codec_;
  s.model_config = ModelConfigToJson(model_config_).dump();
  s.train_config = TrajectoryJson(config_, topology_.world, extended_at_);
  s.run_id = run_id_;
  s.threads = Threads();
  s.model_fingerprint = Fingerprint(s.model_config);
  s.train_fingerprint = Fingerprint(s.train_config);
  s.version = "trainflow 0.1.0";
  return s;
}

Status Trainer::SetState(const TrainState& s) {
  const std::string model = ModelConfigToJson(model_config_).dump();
  if (s.model_config != model) {
    return Status::InvalidArgument("the training state is for model {}, this run's model is {}", s.model_config,
                                   model);
  }
  // Name the first trajectory key that differs.
  const json mine = json::parse(TrajectoryJson(config_, topology_.world, {}));
  StatusOr<json> parsed = ParseJson(s.train_config, "the training state's training config", false);
  if (!parsed.ok()) return Status::Corruption("{}", parsed.status().message());
  const json theirs = std::move(*parsed);
  if (!theirs.is_object()) return Status::Corruption("the training state's training config is not a JSON object");
  if (theirs.value("rows_per_step", int64_t{-1}) != rows_per_step()) {
    return Status::InvalidArgument(
        "the global batch is {} rows per step here ({} rank{} x batch_size {} x grad_accum_steps {}) but {} in the "
        "training state: an exact resume needs the same global batch (ranks x batch_size x grad_accum_steps)",
        rows_per_step(), topology_.world, topology_.world == 1 ? "" : "s", config_.batch_size,
        config_.grad_accum_steps, theirs.value("rows_per_step", int64_t{-1}));
  }
  // Rows read = (step + steps of data skipped by rollbacks) x rows per step.
  if (s.data_rows % rows_per_step() != 0 || s.data_rows < s.step * rows_per_step()) {
    return Status::InvalidArgument("the training state read {} data rows in {} steps: not a whole number of steps of "
                                   "{} rows, at least one per step",
                                   s.data_rows, s.step, rows_per_step());
  }
  bool extended = false;
  for (const std::string& k : TrajectoryKeys()) {
    if (!theirs.contains(k) || theirs[k] != mine[k]) {
      if (config_.extend && ExtendableKey(k) && theirs.contains(k)) {
        extended = true;
        continue;
      }
      return Status::InvalidArgument(
          "training config key '{}' is {} in this run but {} in the training state: an exact resume needs the same "
          "value{}",
          k, mine[k].dump(), theirs.contains(k) ? theirs[k].dump() : "absent",
          ExtendableKey(k) ? fmt::format(" (to continue that run from its step {} with this {} instead, a new "
                                         "trajectory from there, add --extend)",
                                         s.step, k)
                           : "");
    }
  }
  if (s.data_fingerprint != train_data_->Fingerprint()) {
    return Status::InvalidArgument("the training data differs from the run that wrote the state ({} there, {} here)",
                                   s.data_fingerprint, train_data_->Fingerprint());
  }
  if (s.codec != codec_) {
    return Status::InvalidArgument("the state was written with gradient codec {}, this run uses {}", s.codec, codec_);
  }
  if ((!s.ef_residual.empty() || !s.ef_server.empty()) && (s.world != topology_.world || s.rank != topology_.rank)) {
    return Status::InvalidArgument("the state holds rank {} of {}'s error-feedback residuals; this is rank {} of {}",
                                   s.rank, s.world, topology_.rank, topology_.world);
  }
  if (s.step > config_.max_steps) {
    return Status::InvalidArgument("the training state is at step {}, beyond max_steps {}", s.step, config_.max_steps);
  }
  if (extended && s.step == config_.max_steps) {
    return Status::InvalidArgument("--extend continues the run at step {} with max_steps {}: nothing to train; raise "
                                   "max_steps",
                                   s.step, config_.max_steps);
  }
  extended_at_.clear();
  if (theirs.contains("extended_at") && theirs["extended_at"].is_array()) {
    for (const json& e : theirs["extended_at"]) {
      if (e.is_number_integer()) extended_at_.push_back(e.get<int64_t>());
    }
  }
  if (extended) extended_at_.push_back(s.step);
  if (!s.run_id.empty()) run_id_ = s.run_id;
  NoteSummationOrder(s.world, s.threads);
  TF_RETURN_IF_ERROR(backend_->SetStateSlice(s.slice_begin, s.params, s.adam_m, s.adam_v));
  TF_RETURN_IF_ERROR(sync_->SetState(s.ef_residual, s.ef_server));
  step_ = s.step;
  SetStepsDone(step_);
  data_offset_ = s.data_rows / rows_per_step() - s.step;
  return Status::OK();
}

std::string Trainer::StatePath() const {
  // One file per rank: all hold the whole state; ranks > 0 differ only in their residuals.
  const std::string base = config_.out_dir + "/train_state";
  return topology_.world > 1 && topology_.rank > 0 ? fmt::format("{}.rank{}.safetensors", base, topology_.rank)
                                                   : base + ".safetensors";
}

Status Trainer::Resume(const std::string& path) {
  std::string mine = path;
  if (topology_.world > 1 && topology_.rank > 0) {
    const std::string ext = ".safetensors";
    const std::string stem = path.ends_with(ext) ? path.substr(0, path.size() - ext.size()) : path;
    mine = fmt::format("{}.rank{}{}", stem, topology_.rank, ext);
    // A state written by fewer ranks: every rank's file holds the whole state (SetState refuses
    // residuals of another rank).
    if (auto info = env_->Stat(mine); info.ok() && !info->exists) mine = path;
  }
  TF_ASSIGN_OR_RETURN(TrainState s, ReadTrainState(mine, env_));
  return SetState(s).WithContext(fmt::format("resuming from '{}'", mine));
}

void Trainer::NoteSummationOrder(int world, int threads) {
  if (topology_.rank != 0 || !options_.print_progress) return;
  std::string what;
  if (world != topology_.world) what = fmt::format("{} rank{} then, {} now", world, world == 1 ? "" : "s", topology_.world);
  if (!UsesCuda(config_) && threads > 0 && threads != Threads()) {
    what += fmt::format("{}{} thread{} per rank then, {} now", what.empty() ? "" : "; ", threads,
                        threads == 1 ? "" : "s", Threads());
  }
  if (what.empty()) return;
  spdlog::warn("the run that wrote this state ran with another summation order ({}): the resumed run matches an "
               "uninterrupted one only up to float rounding, not bit for bit (docs/checkpoints.md)",
               what);
}

Status Trainer::ResumeOrStart() {
  const TrainConfig& c = config_;
  // A restart under `trainflow launch` continues the job: --fresh applied to its first start.
  const char* generation = std::getenv("TRAINFLOW_LAUNCH_GENERATION");
  const bool fresh = c.fresh && (generation == nullptr || std::atoll(generation) <= 1);
  run_id_ = NewRunId();
  run_id_.resize(16, '0');
  TF_RETURN_IF_ERROR(BroadcastFromRankZero(run_id_.data(), run_id_.size()));
  const std::string fresh_hint = "--fresh starts a new run there instead";
  if (!c.resume_state.empty()) {
    TF_RETURN_IF_ERROR(Resume(c.resume_state));
    resumed_from_ = fmt::format("resumed at step {} from {}", step_, c.resume_state);
    return Status::OK();
  }
  const bool location = c.resume != "auto" && c.resume != "none";
  if (!fresh && (!c.checkpoint_dir.empty() || location)) {
    if (c.resume == "none") TF_RETURN_IF_ERROR(RefuseOtherCheckpoints());
    auto line = ResumeFromCheckpoint(*this, &resumed_checkpoint_step_);
    if (!line.ok()) {
      if (line.status().code() != StatusCode::kInvalidArgument || c.resume != "auto") return line.status();
      return line.status().WithContext(fmt::format("cannot resume from checkpoint_dir {} (if its checkpoints are another "
                                                   "run's, {}, or choose another checkpoint_dir)",
                                                   c.checkpoint_dir, fresh_hint));
    }
    resumed_from_ = *line;
    if (!resumed_from_.empty()) return Status::OK();
  }
  if (fresh || !options_.write_outputs) return Status::OK();
  // What an earlier run left in out_dir: a stopped run's state is resumed, anything else refused.
  const std::string state_path = c.out_dir + "/train_state.safetensors";
  const std::string weights_path = c.out_dir + "/model.safetensors";
  TF_ASSIGN_OR_RETURN(const FileInfo state_info, env_->Stat(state_path));
  std::string found;  // what out_dir holds, for every rank to agree on
  std::optional<TrainState> meta;
  if (state_info.exists) {
    TF_ASSIGN_OR_RETURN(meta, ReadTrainStateMeta(state_path, env_));
    found = fmt::format("state {}", meta->step);
  } else {
    TF_ASSIGN_OR_RETURN(const FileInfo w, env_->Stat(weights_path));
    if (w.exists) found = "weights";
  }
  if (topology_.world > 1) {
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(found, fmt::format("what out_dir {} holds", c.out_dir)));
  }
  if (found.empty()) {
    if (c.extend) {
      return Status::InvalidArgument("--extend continues a run, but neither out_dir {} nor checkpoint_dir ('{}') "
                                     "holds a training state",
                                     c.out_dir, c.checkpoint_dir);
    }
    return Status::OK();
  }
  if (!meta) {
    auto card = ReadWeightsCard(weights_path);
    const std::string step = card.ok() && card->step >= 0 ? fmt::format(" of step {}", card->step) : "";
    return Status::InvalidArgument(
        "out_dir {} already holds a run's outputs ({}{}) and no training state to resume: pass --fresh to replace "
        "them, or choose another out_dir{}",
        c.out_dir, weights_path, step,
        c.extend ? " (--extend needs the run's training state: save_state true or a checkpoint_dir)" : "");
  }
  StatusOr<json> their_config = ParseJson(meta->train_config, "the training state's training config", false);
  const json theirs = their_config.ok() ? std::move(*their_config) : json();
  const int64_t their_max = theirs.is_object() ? theirs.value("max_steps", int64_t{-1}) : -1;
  if (meta->step >= their_max && !c.extend) {
    return Status::InvalidArgument(
        "out_dir {} holds a finished run ({}, step {} of {}): pass --extend --max_steps N to continue it, --fresh to "
        "replace it, or choose another out_dir",
        c.out_dir, state_path, meta->step, their_max);
  }
  if (Status s = Resume(state_path); !s.ok()) {
    if (s.code() != StatusCode::kInvalidArgument) return s;
    return Status::InvalidArgument("cannot resume the training state in out_dir {} (step {}): {}; if it is another "
                                   "run's, pass --fresh to start over there, or choose another out_dir",
                                   c.out_dir, meta->step, s.message());
  }
  resumed_from_ = fmt::format("resuming the stopped run in out_dir from {} (step {}); --fresh starts over instead",
                              state_path, step_);
  return Status::OK();
}

Status Trainer::RemoveIfExists(const std::string& path) {
  TF_ASSIGN_OR_RETURN(const FileInfo info, env_->Stat(path));
  return info.exists ? env_->RemoveFile(path) : Status::OK();
}

Status Trainer::RefuseOtherCheckpoints() {
  TF_ASSIGN_OR_RETURN(auto store, checkpoint::OpenStore(config_.checkpoint_dir, env_));
  TF_ASSIGN_OR_RETURN(const std::vector<checkpoint::Listed> all, checkpoint::ListCheckpoints(*store));
  std::vector<int64_t> steps;
  for (const checkpoint::Listed& l : all) {
    if (l.manifest) steps.push_back(l.step);
  }
  if (steps.empty()) return Status::OK();
  return Status::InvalidArgument(
      "checkpoint_dir {} holds checkpoints of step{} {} and resume is \"none\": pass --fresh to start a new run "
      "there anyway (checkpoints of the same steps are replaced; retention never deletes the others), resume "
      "\"auto\" to continue them, or choose another checkpoint_dir",
      store->location(), steps.size() == 1 ? "" : "s", fmt::join(steps, ", "));
}

WeightsCard Trainer::Card() const {
  WeightsCard card;
  card.model = model_config_;
  card.step = step_;
  card.tokenizer = config_.tokenizer == "auto" ? "" : config_.tokenizer;
  card.tokenizer_fingerprint = card.tokenizer == "gpt2" ? tokenizer_fingerprint_ : 0;
  card.seq_len = config_.seq_len;
  card.world = topology_.world;
  card.train_config = TrainConfigToJson(config_);
  return card;
}

std::optional<checkpoint::CheckpointerStats> Trainer::checkpoint_stats() const {
  if (!checkpointing_) return std::nullopt;
  return checkpointing_->stats();
}

Status Trainer::HandleAnomaly(StepStats& s) {
  const Anomaly& a = *s.anomaly;
  const std::string what = a.Describe(s.step);
  if (topology_.rank == 0) spdlog::warn("anomaly: {}", what);
  auto notify = [&] {  // the observers count and log it; no evaluation or sampling of this state
    s.interrupted = true;
    for (auto& o : observers_) TF_RETURN_IF_ERROR(o->OnStep(*this, s));
    return Status::OK();
  };
  switch (a.action) {
    case AnomalyAction::kOff:
    case AnomalyAction::kWarn:
      return Status::OK();
    case AnomalyAction::kSkip:
      // A lossy codec's error feedback already holds part of the rejected gradient (all of it NaN
      // for a non-finite one): it starts again from zero.
      TF_RETURN_IF_ERROR(ClearErrorFeedback());
      if (++consecutive_skips_ <= config_.anomaly_max_skips) return Status::OK();
      TF_RETURN_IF_ERROR(notify());
      return Status::Internal("anomaly: {}; {} updates in a row were skipped (anomaly_max_skips {}): stopping. Lower "
                              "lr, check the data, or resume from a checkpoint",
                              what, consecutive_skips_, config_.anomaly_max_skips);
    case AnomalyAction::kStop:
      TF_RETURN_IF_ERROR(notify());
      if (a.kind == "nonfinite_loss") {
        return Status::Internal("loss became {} at step {} (lr {:.3g}); lower lr or check the data (the update was not "
                                "applied; anomaly_nonfinite chooses what happens)",
                                a.value, s.step, s.lr);
      }
      return Status::Internal("anomaly: {}; the update was not applied and the run stops", what);
    case AnomalyAction::kRollback:
      TF_RETURN_IF_ERROR(notify());
      if (rollbacks_ >= config_.anomaly_max_rollbacks) {
        return Status::Internal("anomaly: {}; the run already rolled back {} time{} (anomaly_max_rollbacks): stopping",
                                what, rollbacks_, rollbacks_ == 1 ? "" : "s");
      }
      return RollBack(s.step);
  }
  return Status::OK();
}

Status Trainer::ClearErrorFeedback() {
  const auto [residual, server] = sync_->state_sizes();
  if (residual == 0 && server == 0) return Status::OK();
  const std::vector<float> r(static_cast<size_t>(residual), 0.0f), v(static_cast<size_t>(server), 0.0f);
  return sync_->SetState(r, v);
}

Status Trainer::RollBack(int64_t anomaly_step) {
  const int64_t offset_at_anomaly = data_offset_;
  // Checkpoints in flight are written and committed (a failed one is never loaded), then every rank
  // loads the newest committed checkpoint.
  TF_RETURN_IF_ERROR(checkpointing_->CommitPending());
  checkpointing_.reset();
  const std::string resume = config_.resume;
  config_.resume = "auto";
  int64_t own = -1, to = -1;
  StatusOr<std::string> line = ResumeFromCheckpoint(*this, &own, /*before_step=*/anomaly_step, &to);
  config_.resume = resume;
  if (!line.ok()) return line.status().WithContext(fmt::format("rolling back after the anomaly at step {}", anomaly_step));
  if (to < 0) {
    return Status::Internal("anomaly at step {}: no checkpoint in {} to roll back to (the first is written at step {})",
                            anomaly_step, config_.checkpoint_dir, config_.checkpoint_interval);
  }
  // Step `to` + 1 reads the data after the anomalous step's: the steps between are skipped too.
  data_offset_ = anomaly_step + offset_at_anomaly - to;
  if (data_offset_ < offset_at_anomaly) {
    return Status::Internal("rollback from step {} loaded step {}, not an earlier one", anomaly_step, to);
  }
  TF_ASSIGN_OR_RETURN(checkpointing_, TrainCheckpointing::Create(*this));
  auto after = [to](const auto& x) { return x.first > to; };
  std::erase_if(result_.steps, [to](const StepStats& x) { return x.step > to; });
  std::erase_if(result_.val_losses, after);
  std::erase_if(result_.samples, after);
  guard_->Reset();
  consecutive_skips_ = 0;
  ++rollbacks_;
  if (options_.print_progress && topology_.rank == 0) {
    fmt::print("rollback: anomaly at step {}; back to the checkpoint of step {}, skipping {} steps of data (now {} in "
               "all)\n",
               anomaly_step, to, anomaly_step - to, data_offset_);
    std::fflush(stdout);
  }
  for (auto& o : observers_) TF_RETURN_IF_ERROR(o->OnRollback(*this, anomaly_step, to));
  return Status::OK();
}

StatusOr<TrainResult> Trainer::Run() {
  result_ = TrainResult{};
  const int64_t max_steps = config_.max_steps;
  for (auto& o : observers_) TF_RETURN_IF_ERROR(o->OnStart(*this));
  SetStepsDone(step_);
  SetStartStep(step_);
  bool stopped = false;
  while (step_ < max_steps) {
    TF_ASSIGN_OR_RETURN(StepStats s, Step());
    if (s.anomaly && s.anomaly->action == AnomalyAction::kRollback) {
      TF_RETURN_IF_ERROR(HandleAnomaly(s));
      continue;
    }
    if (s.anomaly) TF_RETURN_IF_ERROR(HandleAnomaly(s));
    if (!s.update_skipped) consecutive_skips_ = 0;
    const bool planned = config_.stop_at_step > 0 && s.step >= config_.stop_at_step;
    s.last = s.step == max_steps;
    s.stopping = (stop_agreed_ || planned) && !s.last;
    s.interrupted = stop_agreed_ && !s.last;  // stop soon: no evaluation or sampling
    if (checkpointing_) TF_RETURN_IF_ERROR(checkpointing_->AfterStep(ckpt_slots_, s));
    for (auto& o : observers_) TF_RETURN_IF_ERROR(o->OnStep(*this, s));
    const bool stopping = s.stopping;
    s.rank_busy_ms = {};
    result_.steps.push_back(std::move(s));
    if (stopping) {
      stopped = true;
      break;
    }
  }
  result_.final_step = step_;
  result_.stopped = stopped;
  // The final checkpoint (a failed one is reported, and the outputs are still written).
  if (checkpointing_) {
    SetPhase(Phase::kCheckpoint);
    TF_ASSIGN_OR_RETURN(final_checkpoint_, checkpointing_->Finish(step_));
  }
  for (auto& o : observers_) TF_RETURN_IF_ERROR(o->OnEnd(*this, result_));
  if (options_.write_outputs) TF_RETURN_IF_ERROR(WriteOutputs(result_));
  if (stopped && options_.print_progress && topology_.rank == 0) {
    // One line before the exit code 5, which launchers (mpirun) report as an abort.
    fmt::print("stopped after step {} of {}: a clean, resumable stop (exit code 5); {}\n", step_, max_steps,
               HowToContinue());
    std::fflush(stdout);
  }
  return result_;
}

std::string Trainer::HowToContinue() const {
  const bool in_checkpoint = !config_.checkpoint_dir.empty() && final_checkpoint_;
  if (in_checkpoint) {
    return config_.resume == "auto" ? "run the same command to resume"
                                    : fmt::format("run the same command with --resume auto to resume from {}",
                                                  config_.checkpoint_dir);
  }
  const std::string state = StatePath();
  if (!config_.resume_state.empty() && config_.resume_state != state) {
    return fmt::format("to resume, run the same command with --resume_state {}", state);
  }
  return fmt::format("run the same command again to resume from {}", state);
}

Status Trainer::WriteOutputs(const TrainResult& result) {
  SetPhase(Phase::kFinishing);
  // Every rank saves its state when asked (stops always save it: a stopped run is meant to resume).
  // (A stopped run whose final checkpoint failed keeps its state this way too.)
  if (config_.save_state || (result.stopped && !final_checkpoint_)) {
    TF_ASSIGN_OR_RETURN(TrainState state, GetState());
    TF_RETURN_IF_ERROR(WriteTrainState(StatePath(), state, env_));
  } else {
    // A state an earlier run left here would be resumed by the next run in place of these outputs.
    TF_RETURN_IF_ERROR(RemoveIfExists(StatePath()));
  }
  if (topology_.rank == 0) {  // the files of ranks this run does not have
    for (int r = std::max(topology_.world, 1);; ++r) {
      const std::string extra = fmt::format("{}/train_state.rank{}.safetensors", config_.out_dir, r);
      TF_ASSIGN_OR_RETURN(const FileInfo info, env_->Stat(extra));
      if (!info.exists) break;
      TF_RETURN_IF_ERROR(env_->RemoveFile(extra));
    }
  }
  std::vector<float> params;
  if (topology_.rank == 0) {
    params.resize(static_cast<size_t>(backend_->layout().total()));
    TF_RETURN_IF_ERROR(backend_->GetParams(params));
  } else if (backend_->params_collective()) {  // sharded parameters: every rank takes part in the gather
    TF_RETURN_IF_ERROR(backend_->GetParams({}));
  }
  if (topology_.rank != 0) return Status::OK();
  const std::string dir = config_.out_dir;
  const std::string weights = dir + "/model.safetensors";
  const WeightsCard card = Card();
  const std::map<std::string, std::string> meta = card.ToMetadata();
  // The run's files go in as one set: each is written under a temporary name, and only when all
  // are written are they renamed into place, so a failed write (a full disk) leaves the previous
  // run's set whole instead of mixing the two.
  const std::vector<std::pair<std::string, std::string>> side = {
      {"config.json", HFConfigJson(model_config_, card.tokenizer)},
      {"model_config.json", ModelConfigToJson(model_config_).dump(2) + "\n"},
      {"train_config.json", TrainConfigToJson(config_).dump(2) + "\n"}};
  auto staged = [&](const std::string& name) { return fmt::format("{}/{}.new-{}", dir, name, ::getpid()); };
  if (Status s = ExportHFWeights(staged("model.safetensors"), model_config_, params, meta, SafetensorsDtype::kF32, env_);
      !s.ok()) {
    // Keep the trained weights somewhere: the run's work must not be lost with the write.
    const char* tmp = std::getenv("TMPDIR");
    const std::string rescue = fmt::format("{}/trainflow-rescue-{}", tmp != nullptr && *tmp ? tmp : "/tmp", ::getpid());
    Status kept = Env::Default()->CreateDirs(rescue);
    if (kept.ok()) kept = ExportHFWeights(rescue + "/model.safetensors", model_config_, params, meta);
    if (kept.ok()) {
      return Status(s.code(), s.message() + fmt::format("; the trained weights were saved to {}/model.safetensors "
                                                        "instead",
                                                        rescue));
    }
    return Status(s.code(), s.message() + "; saving them elsewhere failed too: " + kept.message());
  }
  for (const auto& [name, content] : side) {
    if (Status s = env_->WriteFileAtomically(staged(name), content); !s.ok()) {
      for (const auto& [other, unused] : side) (void)RemoveIfExists(staged(other));
      return Status(s.code(), s.message() + fmt::format("; {}'s files are unchanged, the trained weights are in {}",
                                                        dir, staged("model.safetensors")));
    }
  }
  TF_RETURN_IF_ERROR(env_->RenameFile(staged("model.safetensors"), weights));
  for (const auto& [name, unused] : side) TF_RETURN_IF_ERROR(env_->RenameFile(staged(name), dir + "/" + name));
  // The curves for whoever did not watch: out_dir/report.html. A failure costs only the report (an
  // earlier run's is removed: it would describe other weights).
  if (!result.steps.empty() && options_.write_outputs) {
    if (auto report = WriteRunReport(dir, "", env_); !report.ok()) {
      spdlog::warn("no report.html: {}", report.status().ToString());
      (void)RemoveIfExists(dir + "/report.html");
    }
  }
  if (options_.print_progress) {
    fmt::print("wrote {} (Hugging Face GPT-2 safetensors, step {}) and configs\n", weights, step_);
    std::fflush(stdout);
  }
  return Status::OK();
}

}  // namespace tf
