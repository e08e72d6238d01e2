#include "engine/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

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

  TF_ASSIGN_OR_RETURN(auto train_loader, DataLoader::Open(train.train_data, model.vocab_size, train.batch_size,
                                                          train.seq_len, 0, 1, train.shuffle, train.seed));
  t->train_data_.emplace(std::move(train_loader));
  if (!train.val_data.empty()) {
    TF_ASSIGN_OR_RETURN(auto val_loader,
                        DataLoader::Open(train.val_data, model.vocab_size, train.batch_size, train.seq_len));
    t->val_data_.emplace(std::move(val_loader));
  }
  if (options.print_progress && (train.sample_tokens > 0)) {
    TF_ASSIGN_OR_RETURN(t->tokenizer_, MakeTokenizer(train.tokenizer, train.tokenizer_dir));
  }
  TF_ASSIGN_OR_RETURN(t->model_, GPT2::Create(model, train.batch_size, train.seq_len));
  if (train.init_from.empty()) {
    t->model_->InitWeights(train.seed);
  } else {
    TF_RETURN_IF_ERROR(ImportHFWeights(train.init_from, model, t->model_->params()));
  }
  try {
    t->optimizer_ = std::make_unique<AdamW>(
        t->model_->layout(), AdamWConfig{train.beta1, train.beta2, train.eps, train.weight_decay, train.grad_clip});
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument("out of memory allocating AdamW state ({:.2f} GiB)",
                                   2.0 * t->model_->layout().total() * 4 / double(1 << 30));
  }
  const size_t bt = static_cast<size_t>(train.batch_size) * static_cast<size_t>(train.seq_len);
  t->inputs_.resize(bt);
  t->targets_.resize(bt);
  return t;
}

float Trainer::Evaluate(const DataLoader& loader, int n_batches) {
  double sum = 0.0;
  for (int i = 0; i < n_batches; ++i) {
    loader.Load(i, inputs_.data(), targets_.data());
    sum += model_->Forward(inputs_.data(), targets_.data(), loader.B(), loader.T());
  }
  return n_batches > 0 ? static_cast<float>(sum / n_batches) : 0.0f;
}

StepStats Trainer::Step(int step) {
  const auto t0 = Clock::now();
  const int accum = config_.grad_accum_steps;
  model_->ZeroGrad();
  double loss = 0.0;
  for (int micro = 0; micro < accum; ++micro) {
    train_data_->Load(int64_t{step} * accum + micro, inputs_.data(), targets_.data());
    loss += model_->ForwardBackward(inputs_.data(), targets_.data(), config_.batch_size, config_.seq_len,
                                    1.0f / static_cast<float>(accum));
  }
  StepStats s;
  s.step = step;
  s.loss = static_cast<float>(loss / accum);
  s.lr = LearningRate(config_, step);
  s.grad_norm = optimizer_->Step(model_->params(), model_->grads(), s.lr, int64_t{step} + 1);
  s.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(config_.tokens_per_step()) / (s.ms / 1000.0);
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
  std::vector<int32_t> ids = Sample(*model_, prompt, o);
  return config_.sample_prompt + tokenizer_->Decode(ids);
}

StatusOr<TrainResult> Trainer::Run() {
  TrainResult result;
  const bool print = options_.print_progress;
  const int max_steps = config_.max_steps;
  if (print) {
    fmt::print("model: {} layers, {} heads, {} embd, vocab {} (padded {}), {:.2f}M parameters\n",
               model_config_.n_layer, model_config_.n_head, model_config_.n_embd, model_config_.vocab_size,
               model_config_.padded_vocab_size, NumParameters(model_config_) / 1e6);
    fmt::print("train: {} steps x {} tokens (B={}, T={}, accum={}), {} threads; data {} tokens, val {} tokens\n",
               max_steps, config_.tokens_per_step(), config_.batch_size, config_.seq_len, config_.grad_accum_steps,
               omp_get_max_threads(), train_data_->num_tokens(), val_data_ ? val_data_->num_tokens() : 0);
    std::fflush(stdout);
  }
  auto evaluate = [&](int step) {
    if (!val_data_ || config_.eval_batches == 0) return;
    const float v = Evaluate(*val_data_, config_.eval_batches);
    result.val_losses.emplace_back(step, v);
    if (print) {
      fmt::print("eval  step {:>5} | val loss {:.4f} (ppl {:.2f})\n", step, v, std::exp(v));
      std::fflush(stdout);
    }
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

  if (config_.eval_interval > 0) evaluate(0);
  double ema_ms = 0.0;
  for (int step = 0; step < max_steps; ++step) {
    StepStats s = Step(step);
    if (!std::isfinite(s.loss)) {
      return Status::Internal("loss became {} at step {} (lr {:.3g}); lower lr or check the data", s.loss, step, s.lr);
    }
    result.steps.push_back(s);
    ema_ms = step == 0 ? s.ms : (step == 1 ? s.ms : 0.9 * ema_ms + 0.1 * s.ms);  // step 0 includes warm-up
    const bool last = step + 1 == max_steps;
    if (print && (step % config_.log_interval == 0 || last)) {
      fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.4f} | {:>8.0f} tok/s | {:>7.1f} ms | ETA {}\n",
                 step + 1, max_steps, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.ms,
                 FormatDuration(ema_ms * (max_steps - step - 1) / 1000.0));
      std::fflush(stdout);
    }
    if (!last && config_.eval_interval > 0 && (step + 1) % config_.eval_interval == 0) evaluate(step + 1);
    if (!last && config_.sample_interval > 0 && (step + 1) % config_.sample_interval == 0) sample(step + 1);
  }
  evaluate(max_steps);
  sample(max_steps);
  if (options_.write_outputs) TF_RETURN_IF_ERROR(WriteOutputs(result));
  return result;
}

Status Trainer::WriteOutputs(const TrainResult& result) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(config_.out_dir, ec);
  if (ec) return Status::IOError("cannot create out_dir '{}': {}", config_.out_dir, ec.message());
  const std::string weights = (fs::path(config_.out_dir) / "model.safetensors").string();
  TF_RETURN_IF_ERROR(ExportHFWeights(weights, model_config_, model_->params(),
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
    metrics += nlohmann::json{{"step", s.step + 1}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
                              {"ms", s.ms},         {"tokens_per_s", s.tokens_per_s}}
                   .dump() +
               "\n";
  }
  for (const auto& [step, loss] : result.val_losses) {
    metrics += nlohmann::json{{"step", step}, {"val_loss", loss}}.dump() + "\n";
  }
  TF_RETURN_IF_ERROR(write_text(fs::path(config_.out_dir) / "metrics.jsonl", metrics));
  if (options_.print_progress) fmt::print("wrote {} (Hugging Face GPT-2 safetensors) and configs\n", weights);
  return Status::OK();
}

}  // namespace tf
