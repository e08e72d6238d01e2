#include "engine/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "comm/auto_codec.h"
#include "engine/lr_schedule.h"
#include "engine/sampler.h"
#include "model/gpt2_weights.h"

namespace tf {
namespace {

using Clock = std::chrono::steady_clock;

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

// Printable form of sampled text: keeps newlines, replaces other control bytes.
std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '\n' || ch == '\t' || ch >= 0x20) out += static_cast<char>(ch);
    else out += '?';
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const GPT2Config& model, const TrainConfig& train,
                                                   Options options) {
  TF_RETURN_IF_ERROR(ValidateConfig(model));
  TF_RETURN_IF_ERROR(ValidateRun(model, train));
  std::unique_ptr<Trainer> t(new Trainer());
  t->model_config_ = model;
  t->config_ = train;
  t->options_ = options;
  if (train.threads > 0) omp_set_num_threads(train.threads);
  if (options.distributed) {
    TF_ASSIGN_OR_RETURN(t->topology_, comm::InitProcessGroup());
  }
  const comm::Topology& topo = t->topology_;
  if (topo.world > 1) {
    // Every rank must run the same job: compare configs before anything else talks.
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(ModelConfigToJson(model).dump(), "model config"));
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(TrainConfigToJson(train).dump(), "training config"));
  }

  TF_ASSIGN_OR_RETURN(auto train_loader, DataLoader::Open(train.train_data, model.vocab_size, train.batch_size,
                                                          train.seq_len, topo.rank, topo.world, train.shuffle,
                                                          train.seed));
  t->train_data_.emplace(std::move(train_loader));
  if (!train.val_data.empty()) {
    TF_ASSIGN_OR_RETURN(auto val_loader, DataLoader::Open(train.val_data, model.vocab_size, train.batch_size,
                                                          train.seq_len, topo.rank, topo.world));
    t->val_data_.emplace(std::move(val_loader));
  }
  if (topo.world > 1) {
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(t->train_data_->Fingerprint(), "training data"));
    TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(t->val_data_ ? t->val_data_->Fingerprint() : "", "validation data"));
  }
  if (options.print_progress && topo.rank == 0 && (train.sample_tokens > 0)) {
    TF_ASSIGN_OR_RETURN(t->tokenizer_, MakeTokenizer(train.tokenizer, train.tokenizer_dir));
  }

  // Backend: "auto" takes the GPU when the build has CUDA and one is visible.
  const AdamWConfig adamw{train.beta1, train.beta2, train.eps, train.weight_decay, train.grad_clip};
  const int gpus = CudaDeviceCount();
  const bool cuda = train.device == "cuda" || (train.device == "auto" && gpus > 0);
  if (cuda) {
    if (gpus == 0) {
      return Status::InvalidArgument("device \"cuda\" requested but no CUDA GPU is visible{} (use device \"cpu\" or "
                                     "\"auto\")",
                                     TrainBackendHasCuda() ? "" : " and this trainflow was built without CUDA");
    }
    if (topo.local_rank >= gpus) {
      return Status::InvalidArgument("rank {} is local rank {} on host {}, but only {} GPU{} visible there: start at "
                                     "most one rank per GPU",
                                     topo.rank, topo.local_rank, topo.hostname, gpus, gpus == 1 ? " is" : "s are");
    }
    const CudaBackendOptions cuda_options{.dtype = train.dtype, .attention = train.attention,
                                          .recompute = train.recompute, .gelu_fusion = train.gelu_fusion,
                                          .deterministic = train.deterministic};
    TF_ASSIGN_OR_RETURN(t->backend_, MakeCudaBackend(model, train.batch_size, train.seq_len, adamw, cuda_options,
                                                     topo.local_rank));
  } else {
    TF_ASSIGN_OR_RETURN(t->backend_, MakeCpuBackend(model, train.batch_size, train.seq_len, adamw));
    // The CUDA model's options mean nothing here: say so rather than ignore them silently.
    if (options.print_progress && topo.rank == 0 &&
        (train.attention != "flash" || train.recompute != 0 || train.gelu_fusion != -1)) {
      fmt::print("note: attention \"{}\", recompute {}, gelu_fusion {} apply to the CUDA backend only; the CPU "
                 "backend ignores them\n",
                 train.attention, train.recompute, train.gelu_fusion);
    }
  }

  std::vector<float> params(static_cast<size_t>(t->backend_->layout().total()));
  if (train.init_from.empty()) {
    InitGPT2Weights(model, train.seed, params);
  } else {
    TF_RETURN_IF_ERROR(ImportHFWeights(train.init_from, model, params));
  }
  TF_RETURN_IF_ERROR(t->SetUpDataParallel());
  if (t->comm_ && topo.world > 1) {
    // Same start on every rank, whatever each read or initialised.
    TF_RETURN_IF_ERROR(t->comm_->Broadcast(params.data(), params.size() * sizeof(float), 0));
  }
  TF_RETURN_IF_ERROR(t->backend_->SetParams(params));
  const size_t bt = static_cast<size_t>(train.batch_size) * static_cast<size_t>(train.seq_len);
  t->inputs_.resize(bt);
  t->targets_.resize(bt);
  return t;
}

Trainer::~Trainer() = default;

Status Trainer::SetUpDataParallel() {
  const bool compress = config_.compression != "none";
  if (topology_.world == 1 && !compress) return Status::OK();
  // The host communicator also carries the loss/eval averages and the initial broadcast on GPUs.
  TF_ASSIGN_OR_RETURN(comm_, comm::MakeHostCommunicator(topology_));
  {  // Every rank's host and device, for the start-up report.
    constexpr size_t kLine = 160;
    std::string mine = fmt::format("rank {} on {} (local rank {}): {}", topology_.rank, topology_.hostname,
                                   topology_.local_rank, backend_->Describe());
    mine.resize(kLine, '\0');
    std::string all(kLine * static_cast<size_t>(topology_.world), '\0');
    TF_RETURN_IF_ERROR(comm_->AllGather(mine.data(), all.data(), kLine));
    for (int r = 0; r < topology_.world; ++r) rank_devices_.emplace_back(all.c_str() + kLine * static_cast<size_t>(r));
  }
  comm::ReducerOptions ro;
  ro.bucket_bytes = static_cast<int64_t>(config_.bucket_mb * (1 << 20));
  ro.first_bucket_bytes = static_cast<int64_t>(config_.first_bucket_mb * (1 << 20));
  ro.error_feedback = config_.error_feedback;
  ro.seed = config_.seed;
  if (backend_->host_grads().empty()) {  // gradients on a device: NCCL + the device reducer
    if (config_.compression == "auto") {
      TF_ASSIGN_OR_RETURN(comm::CodecChoice choice, backend_->ChooseDeviceCodec(topology_, ro, comm_.get()));
      ro.codec = choice.codec;
      compression_reason_ = choice.reason;
    } else {
      TF_ASSIGN_OR_RETURN(ro.codec, comm::ParseCodec(config_.compression));
      compression_reason_ = "device reducer over NCCL";
    }
    device_codec_ = comm::CodecName(ro.codec);
    TF_RETURN_IF_ERROR(backend_->SetUpDeviceDataParallel(topology_, ro));
    device_dp_ = true;
    return Status::OK();
  }
  const auto ranges = GradReadyRanges(backend_->layout());
  if (config_.compression == "auto") {
    TF_ASSIGN_OR_RETURN(comm::CodecChoice choice, comm::ChooseCodec(comm_.get(), backend_->layout().total(), ro));
    ro.codec = choice.codec;
    compression_reason_ = choice.reason;
  } else {
    TF_ASSIGN_OR_RETURN(ro.codec, comm::ParseCodec(config_.compression));
    compression_reason_ = "as configured";
  }
  TF_ASSIGN_OR_RETURN(reducer_, comm::GradientReducer::Create(comm_.get(), backend_->host_grads(), ranges, ro));
  backend_->SetGradReadyHook([this](int64_t begin, int64_t end) {
    if (reduce_this_micro_step_) reducer_->MarkReady(begin, end);
  });
  return Status::OK();
}

std::string Trainer::compression() const {
  if (reducer_) return comm::CodecName(reducer_->options().codec);
  return device_dp_ ? device_codec_ : "none";
}

Status Trainer::WaitForRankZero() {
  if (topology_.world == 1 || !comm_) return Status::OK();
  // Rank 0 alone samples (minutes for a large model on a CPU): the others wait here without the
  // collective deadline rather than time out in the next step's reduction.
  const double deadline = comm_->timeout_seconds();
  comm_->set_timeout_seconds(1e7);
  Status s = comm_->Barrier();
  comm_->set_timeout_seconds(deadline);
  return s;
}

StatusOr<double> Trainer::MeanOverRanks(double x) {
  if (topology_.world == 1 || !comm_) return x;
  TF_RETURN_IF_ERROR(comm_->AllReduceSum(&x, 1, comm::DataType::kF64));
  return x / topology_.world;
}

StatusOr<float> Trainer::Evaluate(const DataLoader& loader, int n_batches) {
  double sum = 0.0;
  for (int i = 0; i < n_batches; ++i) {
    loader.Load(i, inputs_.data(), targets_.data());
    TF_ASSIGN_OR_RETURN(float loss, backend_->Forward(inputs_.data(), targets_.data(), loader.B(), loader.T()));
    sum += loss;
  }
  TF_ASSIGN_OR_RETURN(double mean, MeanOverRanks(n_batches > 0 ? sum / n_batches : 0.0));
  return static_cast<float>(mean);
}

StatusOr<StepStats> Trainer::Step(int step) {
  const auto t0 = Clock::now();
  const int accum = config_.grad_accum_steps;
  TF_RETURN_IF_ERROR(backend_->ZeroGrad());
  if (reducer_) reducer_->BeginStep(step);
  if (device_dp_) backend_->BeginDeviceReduction(step);
  for (int micro = 0; micro < accum; ++micro) {
    train_data_->Load(int64_t{step} * accum + micro, inputs_.data(), targets_.data());
    // Gradient accumulation: only the last micro-step's backward produces final gradients.
    reduce_this_micro_step_ = reducer_ != nullptr && micro == accum - 1;
    backend_->set_reduce_on_backward(device_dp_ && micro == accum - 1);
    TF_RETURN_IF_ERROR(backend_->ForwardBackwardAccumulate(inputs_.data(), targets_.data(), config_.batch_size,
                                                           config_.seq_len, 1.0f / static_cast<float>(accum)));
  }
  reduce_this_micro_step_ = false;
  backend_->set_reduce_on_backward(false);
  StepStats s;
  if (device_dp_) TF_RETURN_IF_ERROR(backend_->FinishDeviceReduction());
  if (reducer_) {
    TF_RETURN_IF_ERROR(reducer_->Finish());
    const comm::ReducerStats& r = reducer_->last_stats();
    s.comm_exposed_ms = r.exposed_ms;
    s.comm_ms = r.comm_ms;
    s.codec_ms = r.codec_ms;
    s.wire_bytes = r.wire_bytes;
  }
  s.step = step;
  s.lr = LearningRate(config_, step);
  TF_ASSIGN_OR_RETURN(s.grad_norm, backend_->OptimizerStep(s.lr, int64_t{step} + 1));
  // Read once per step, after the optimizer (on a GPU, the step's single synchronisation point).
  TF_ASSIGN_OR_RETURN(const double loss_sum, backend_->TakeLossSum());
  TF_ASSIGN_OR_RETURN(const double mean_loss, MeanOverRanks(loss_sum / accum));
  s.loss = static_cast<float>(mean_loss);
  if (device_dp_) {
    TF_ASSIGN_OR_RETURN(const comm::ReducerStats r, backend_->DeviceReductionStats());
    s.comm_exposed_ms = r.exposed_ms;
    s.wire_bytes = r.wire_bytes;
  }
  s.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(config_.tokens_per_step()) * topology_.world / (s.ms / 1000.0);
  return s;
}

std::string Trainer::SampleText(int step) {
  std::vector<int32_t> prompt = tokenizer_->Encode(config_.sample_prompt);
  if (prompt.empty()) {
    const int eot = tokenizer_->eot_token();
    prompt.push_back(eot >= 0 ? eot : '\n');
  }
  SampleOptions o;
  o.num_tokens = config_.sample_tokens;
  o.temperature = config_.sample_temperature;
  o.top_k = config_.sample_top_k;
  o.seed = config_.seed + static_cast<uint64_t>(step);
  if (!sampler_model_) {
    auto m = GPT2::Create(model_config_, 1, config_.seq_len);
    if (!m.ok()) return "(sampling failed: " + m.status().ToString() + ")";
    sampler_model_ = std::move(m).value();
  }
  if (Status st = backend_->GetParams(sampler_model_->params()); !st.ok()) {
    return "(sampling failed: " + st.ToString() + ")";
  }
  std::vector<int32_t> ids = Sample(*sampler_model_, prompt, o);
  return config_.sample_prompt + tokenizer_->Decode(ids);
}

StatusOr<TrainResult> Trainer::Run() {
  TrainResult result;
  const bool print = options_.print_progress && topology_.rank == 0;
  const int max_steps = config_.max_steps;
  const bool dp = reducer_ != nullptr || device_dp_;
  if (print) {
    fmt::print("model: {} layers, {} heads, {} embd, vocab {} (padded {}), {:.2f}M parameters\n",
               model_config_.n_layer, model_config_.n_head, model_config_.n_embd, model_config_.vocab_size,
               model_config_.padded_vocab_size, NumParameters(model_config_) / 1e6);
    fmt::print("device: {}\n", backend_->Describe());
    if (topology_.world > 1 || dp) {
      fmt::print("data parallel: {}\n", topology_.Describe());
      for (const std::string& line : rank_devices_) fmt::print("  {}\n", line);
      if (device_dp_) {
        fmt::print("gradient reduction: on the GPU, compression {} ({})\n", compression(), compression_reason_);
      } else if (reducer_) {
        fmt::print("gradient reduction: {} buckets (first {:.2f} MiB, then up to {:.2f} MiB), compression {} ({})\n",
                   reducer_->buckets().size(), reducer_->buckets().front().size() * 4 / double(1 << 20),
                   config_.bucket_mb, compression(), compression_reason_);
      }
    }
    fmt::print("train: {} steps x {} tokens (B={}, T={}, accum={}, ranks={}); data {} tokens, val {} tokens\n",
               max_steps, config_.tokens_per_step() * topology_.world, config_.batch_size, config_.seq_len,
               config_.grad_accum_steps, topology_.world, train_data_->num_tokens(),
               val_data_ ? val_data_->num_tokens() : 0);
    std::fflush(stdout);
  }
  auto evaluate = [&](int step) -> Status {
    if (!val_data_ || config_.eval_batches == 0) return Status::OK();
    TF_ASSIGN_OR_RETURN(const float v, Evaluate(*val_data_, config_.eval_batches));
    result.val_losses.emplace_back(step, v);
    if (print) {
      fmt::print("eval  step {:>5} | val loss {:.4f} (ppl {:.2f})\n", step, v, std::exp(v));
      std::fflush(stdout);
    }
    return Status::OK();
  };
  auto sample = [&](int step) {
    if (!tokenizer_ || config_.sample_tokens == 0) return;
    std::string text = SampleText(step);
    result.samples.emplace_back(step, text);
    if (print) {
      fmt::print("sample step {:>5} ----------------------------------------\n{}\n"
                 "--------------------------------------------------------\n",
                 step, Printable(text));
      std::fflush(stdout);
    }
  };

  if (config_.eval_interval > 0) TF_RETURN_IF_ERROR(evaluate(0));
  double ema_ms = 0.0;
  for (int step = 0; step < max_steps; ++step) {
    TF_ASSIGN_OR_RETURN(StepStats s, Step(step));
    if (!std::isfinite(s.loss)) {
      return Status::Internal("loss became {} at step {} (lr {:.3g}); lower lr or check the data", s.loss, step, s.lr);
    }
    result.steps.push_back(s);
    ema_ms = step == 0 ? s.ms : (step == 1 ? s.ms : 0.9 * ema_ms + 0.1 * s.ms);  // step 0 includes warm-up
    const bool last = step + 1 == max_steps;
    if (print && (step % config_.log_interval == 0 || last)) {
      std::string comm;
      if (dp) {
        comm = fmt::format(" | comm {:.0f} ms exposed, {:.1f} MB sent", s.comm_exposed_ms, s.wire_bytes / 1e6);
        if (s.comm_ms > 0) comm += fmt::format(" at {:.2f} GB/s", s.wire_bytes / (s.comm_ms * 1e6));
      }
      fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.4f} | {:>8.0f} tok/s | {:>7.1f} ms{} | ETA {}\n",
                 step + 1, max_steps, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.ms, comm,
                 FormatDuration(ema_ms * (max_steps - step - 1) / 1000.0));
      std::fflush(stdout);
    }
    if (!last && config_.eval_interval > 0 && (step + 1) % config_.eval_interval == 0) {
      TF_RETURN_IF_ERROR(evaluate(step + 1));
    }
    if (!last && config_.sample_interval > 0 && (step + 1) % config_.sample_interval == 0) {
      sample(step + 1);
      TF_RETURN_IF_ERROR(WaitForRankZero());
    }
  }
  TF_RETURN_IF_ERROR(evaluate(max_steps));
  sample(max_steps);
  if (options_.write_outputs && topology_.rank == 0) TF_RETURN_IF_ERROR(WriteOutputs(result));
  return result;
}

Status Trainer::WriteOutputs(const TrainResult& result) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(config_.out_dir, ec);
  if (ec) return Status::IOError("cannot create out_dir '{}': {}", config_.out_dir, ec.message());
  const std::string weights = (fs::path(config_.out_dir) / "model.safetensors").string();
  std::vector<float> params(static_cast<size_t>(backend_->layout().total()));
  TF_RETURN_IF_ERROR(backend_->GetParams(params));
  TF_RETURN_IF_ERROR(ExportHFWeights(weights, model_config_, params,
                                     {{"trainflow.model_config", ModelConfigToJson(model_config_).dump()},
                                      {"trainflow.step", std::to_string(config_.max_steps)}}));
  auto write_text = [](const fs::path& path, const std::string& text) -> Status {
    std::ofstream out(path);
    out << text;
    out.close();
    if (!out) return Status::IOError("cannot write '{}'", path.string());
    return Status::OK();
  };
  TF_RETURN_IF_ERROR(write_text(fs::path(config_.out_dir) / "config.json", HFConfigJson(model_config_)));
  TF_RETURN_IF_ERROR(
      write_text(fs::path(config_.out_dir) / "model_config.json", ModelConfigToJson(model_config_).dump(2) + "\n"));
  TF_RETURN_IF_ERROR(
      write_text(fs::path(config_.out_dir) / "train_config.json", TrainConfigToJson(config_).dump(2) + "\n"));
  std::string metrics;
  for (const StepStats& s : result.steps) {
    nlohmann::json line{{"step", s.step + 1}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
                        {"ms", s.ms},         {"tokens_per_s", s.tokens_per_s}};
    if (reducer_ || device_dp_) {
      line["comm_exposed_ms"] = s.comm_exposed_ms;
      line["comm_ms"] = s.comm_ms;
      line["codec_ms"] = s.codec_ms;
      line["wire_bytes"] = s.wire_bytes;
      if (s.comm_ms > 0) line["comm_GBps"] = s.wire_bytes / (s.comm_ms * 1e6);  // achieved, inside collectives
    }
    metrics += line.dump() + "\n";
  }
  for (const auto& [step, loss] : result.val_losses) {
    metrics += nlohmann::json{{"step", step}, {"val_loss", loss}}.dump() + "\n";
  }
  TF_RETURN_IF_ERROR(write_text(fs::path(config_.out_dir) / "metrics.jsonl", metrics));
  if (options_.print_progress) fmt::print("wrote {} (Hugging Face GPT-2 safetensors) and configs\n", weights);
  return Status::OK();
}

}  // namespace tf
