#include "engine/cli.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "engine/bench.h"
#include "engine/env_report.h"
#include "engine/data_loader.h"
#include "engine/prepare.h"
#include "engine/sampler.h"
#include "engine/train_config.h"
#include "engine/trainer.h"
#include "kernels/matmul.h"
#include "model/gpt2.h"
#include "model/gpt2_weights.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

int Fail(const Status& s) {
  std::fprintf(stderr, "trainflow: error: %s\n", s.ToString().c_str());
  return 1;
}

// "--key value" / "--key=value" pairs left over after CLI11 parsed the known flags.
StatusOr<std::vector<std::pair<std::string, std::string>>> ParseOverrides(const std::vector<std::string>& extras) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& a = extras[i];
    if (!a.starts_with("--") || a.size() == 2) {
      return Status::InvalidArgument("unexpected argument '{}' (overrides are --key value)", a);
    }
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      if (i + 1 >= extras.size()) return Status::InvalidArgument("override --{} has no value", key);
      value = extras[++i];
    }
    for (char& ch : key) ch = ch == '-' ? '_' : ch;  // --max-steps == --max_steps
    out.emplace_back(key, value);
  }
  return out;
}

// Model config for a weights file: --model if given, else the config TrainFlow stored in the
// file's metadata, else a Hugging Face config.json beside the file.
StatusOr<GPT2Config> ResolveModelConfig(const std::string& model_path, const std::string& weights_path) {
  if (!model_path.empty()) return LoadModelConfig(model_path);
  TF_ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(weights_path));
  if (auto it = contents.metadata.find("trainflow.model_config"); it != contents.metadata.end()) {
    json j = json::parse(it->second, nullptr, false);
    return ParseModelConfig(j, weights_path + " (metadata)");
  }
  const fs::path hf = fs::path(weights_path).parent_path() / "config.json";
  if (fs::exists(hf)) {
    TF_ASSIGN_OR_RETURN(json j, ReadJsonFile(hf.string(), "Hugging Face config"));
    try {
      GPT2Config c;
      c.n_layer = j.at("n_layer").get<int>();
      c.n_head = j.at("n_head").get<int>();
      c.n_embd = j.at("n_embd").get<int>();
      c.vocab_size = j.at("vocab_size").get<int>();
      c.block_size = j.at("n_positions").get<int>();
      c.padded_vocab_size = DefaultPaddedVocab(c.vocab_size);
      TF_RETURN_IF_ERROR(ValidateConfig(c));
      return c;
    } catch (const json::exception& e) {
      return Status::InvalidArgument("{}: not a GPT-2 config ({})", hf.string(), e.what());
    }
  }
  return Status::InvalidArgument("{}: no model config in its metadata and no config.json beside it; pass --model",
                                 weights_path);
}

StatusOr<std::unique_ptr<GPT2>> LoadModel(const std::string& model_path, const std::string& weights, int B, int T) {
  TF_ASSIGN_OR_RETURN(GPT2Config config, ResolveModelConfig(model_path, weights));
  if (T <= 0) T = config.block_size;
  if (T > config.block_size) {
    return Status::InvalidArgument("sequence length {} exceeds the model's block_size {}", T, config.block_size);
  }
  TF_ASSIGN_OR_RETURN(std::unique_ptr<GPT2> model, GPT2::Create(config, B, T));
  TF_RETURN_IF_ERROR(ImportHFWeights(weights, config, model->params()));
  return model;
}

int CmdTrain(const std::string& model_path, const std::string& train_path, const std::string& init_from,
             const std::vector<std::string>& extras) {
  auto overrides = ParseOverrides(extras);
  if (!overrides.ok()) return Fail(overrides.status());
  auto model_json = ReadJsonFile(model_path, "model config");
  if (!model_json.ok()) return Fail(model_json.status());
  json train_json = json::object();
  if (!train_path.empty()) {
    auto tj = ReadJsonFile(train_path, "training config");
    if (!tj.ok()) return Fail(tj.status());
    train_json = *tj;
  }
  if (!init_from.empty()) train_json["init_from"] = init_from;
  ApplyOverrides(*overrides, &*model_json, &train_json);
  const std::string suffix = overrides->empty() ? "" : " + command-line overrides";
  auto model = ParseModelConfig(*model_json, model_path + suffix);
  if (!model.ok()) return Fail(model.status());
  auto train = ParseTrainConfig(train_json, (train_path.empty() ? "training options" : train_path) + suffix);
  if (!train.ok()) return Fail(train.status());
  auto trainer = Trainer::Create(*model, *train, Trainer::Options{});
  if (!trainer.ok()) return Fail(trainer.status());
  auto result = (*trainer)->Run();
  if (!result.ok()) return Fail(result.status());
  return 0;
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{"TrainFlow: GPT-2 training engine (CPU backend)", "trainflow"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trainflow 0.1.0");

  // train
  auto* train = app.add_subcommand("train", "Train a model: --model M.json --train T.json [--key value overrides]");
  std::string model_path, train_path, init_from;
  train->add_option("--model", model_path, "Model config JSON (configs/*.json)")->required();
  train->add_option("--train", train_path, "Training config JSON");
  train->add_option("--init-from", init_from, "Start from Hugging Face GPT-2 safetensors weights");
  train->allow_extras();
  train->footer("Any training or model config key can be overridden: --max_steps 50 --lr 1e-3 --n_layer 2");

  // prepare
  auto* prepare = app.add_subcommand("prepare", "Tokenize text files into train.bin / val.bin token files");
  PrepareOptions popt;
  std::string tok_kind = "byte", tok_dir = "third_party/gpt2-tokenizer";
  prepare->add_option("--input", popt.inputs, "Text files or directories")->required();
  prepare->add_option("--out-dir", popt.out_dir, "Output directory")->required();
  prepare->add_option("--tokenizer", tok_kind, "byte or gpt2")->capture_default_str();
  prepare->add_option("--tokenizer-dir", tok_dir, "Directory with encoder.json and vocab.bpe")->capture_default_str();
  prepare->add_option("--delimiter", popt.delimiter, "A line equal to this separates documents (fortune: %)");
  prepare->add_option("--val-fraction", popt.val_fraction, "Fraction of documents for validation")
      ->capture_default_str();
  prepare->add_option("--seed", popt.seed, "Seed of the train/val split")->capture_default_str();

  // eval
  auto* eval = app.add_subcommand("eval", "Mean loss of weights on a token file");
  std::string weights, data;
  int batch = 4, seq = 0, batches = 16;
  eval->add_option("--weights", weights, "safetensors weights (Hugging Face GPT-2 names)")->required();
  eval->add_option("--model", model_path, "Model config (default: from the weights' metadata or config.json)");
  eval->add_option("--data", data, "Token file")->required();
  eval->add_option("--batch-size", batch, "Sequences per batch")->capture_default_str();
  eval->add_option("--seq-len", seq, "Sequence length (default: block_size)");
  eval->add_option("--batches", batches, "Number of batches (from the start of the file)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  // sample
  auto* sample = app.add_subcommand("sample", "Generate text from weights");
  std::string prompt;
  SampleOptions sopt;
  sample->add_option("--weights", weights, "safetensors weights")->required();
  sample->add_option("--model", model_path, "Model config (default: from the weights' metadata or config.json)");
  sample->add_option("--prompt", prompt, "Prompt text (default: end-of-text, or a newline for byte)");
  sample->add_option("--tokens", sopt.num_tokens, "Tokens to generate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sample->add_option("--temperature", sopt.temperature, "Softmax temperature (> 0)")->capture_default_str();
  sample->add_option("--top-k", sopt.top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str();
  sample->add_option("--seed", sopt.seed, "Sampling seed")->capture_default_str();
  sample->add_option("--tokenizer", tok_kind, "byte or gpt2")->capture_default_str();
  sample->add_option("--tokenizer-dir", tok_dir, "Directory with encoder.json and vocab.bpe")->capture_default_str();

  // export
  auto* exp = app.add_subcommand("export", "Write Hugging Face GPT-2 files (model.safetensors + config.json)");
  std::string out_dir, dtype = "f32";
  uint64_t init_seed = 0;
  bool fresh = false;
  exp->add_option("--weights", weights, "Weights to export (any safetensors with GPT-2 names)");
  exp->add_option("--model", model_path, "Model config (required with --init)");
  exp->add_flag("--init", fresh, "Export a freshly initialised model instead of --weights");
  exp->add_option("--seed", init_seed, "Seed for --init")->capture_default_str();
  exp->add_option("--out", out_dir, "Output directory")->required();
  exp->add_option("--dtype", dtype, "f32, f16 or bf16")->capture_default_str();

  // env
  auto* env = app.add_subcommand("env", "What this build is and finds here: CUDA, GPUs, cuBLASLt, NCCL, cuDNN, MPI");

  // bench
  auto* bench = app.add_subcommand("bench", "Time training steps (median of N, warm-up excluded)");
  BenchOptions bopt;
  bench->add_option("--model", model_path, "Model config")->required();
  bench->add_option("--batch-size", bopt.batch, "B")->capture_default_str();
  bench->add_option("--seq-len", bopt.seq, "T")->capture_default_str();
  bench->add_option("--steps", bopt.steps, "Timed steps")->capture_default_str();
  bench->add_option("--warmup", bopt.warmup, "Untimed warm-up steps")->capture_default_str();
  bench->add_option("--threads", bopt.threads, "OpenMP threads (0 = all)")->capture_default_str();
  bench->add_option("--device", bopt.device, "auto (cuda when a GPU is visible), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  bench->add_option("--dtype", bopt.dtype, "CUDA storage type: bf16 or fp32")->capture_default_str();
  bench->add_option("--peak-tflops", bopt.peak_tflops, "CUDA peak for MFU (default H100/H200 dense: bf16 989, fp32 67)");
  bench->add_flag("--gemm-peak", bopt.gemm_peak, "Also measure the SGEMM ceiling (2048^3, the build's GEMM engine)");
  bench->add_option("--attention", bopt.attention, "CUDA attention: flash, flash_simt, gemm or cudnn")
      ->check(CLI::IsMember({"flash", "flash_simt", "gemm", "cudnn"}))
      ->capture_default_str();
  bench->add_option("--recompute", bopt.recompute, "CUDA activation recomputation: 0, 1 (GELU) or 2 (+LayerNorms)")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  bench->add_option("--gelu-fusion", bopt.gelu_fusion,
                    "CUDA GELU in the GEMM epilogues: 0 none, 1 forward, 2 forward+backward, -1 auto (bf16 2, fp32 0)")
      ->check(CLI::Range(-1, 2))
      ->capture_default_str();
  bench->add_flag("!--no-fuse-residual", bopt.fuse_residual,
                  "CUDA: separate residual-add kernels instead of folding them into the GEMMs");
  bench->add_flag("!--nondeterministic-attention", bopt.deterministic_attention,
                  "CUDA, --attention cudnn: the backward with fp32 atomics for dQ (faster, not bit-reproducible)");
  bench->add_option("--profile-steps", bopt.profile_steps,
                    "CUDA: after the timed steps, N more with the GPU time of each piece of work (table)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (train->parsed()) return CmdTrain(model_path, train_path, init_from, train->remaining());

  if (prepare->parsed()) {
    auto tok = MakeTokenizer(tok_kind, tok_dir);
    if (!tok.ok()) return Fail(tok.status());
    auto r = PrepareData(popt, **tok);
    if (!r.ok()) return Fail(r.status());
    fmt::print("prepare: {} files, {} documents -> {} ({} docs, {} tokens), {} ({} docs, {} tokens), tokenizer {}\n",
               r->files, r->documents, r->train_path, r->train_documents, r->train_tokens,
               r->val_tokens ? r->val_path : "(no val split)", r->val_documents, r->val_tokens, tok_kind);
    return 0;
  }

  if (eval->parsed()) {
    auto model = LoadModel(model_path, weights, batch, seq);
    if (!model.ok()) return Fail(model.status());
    GPT2& m = **model;
    auto loader = DataLoader::Open(data, m.config().vocab_size, batch, m.max_seq());
    if (!loader.ok()) return Fail(loader.status());
    std::vector<int32_t> in(static_cast<size_t>(batch) * m.max_seq()), tg(in.size());
    double sum = 0;
    for (int i = 0; i < batches; ++i) {
      loader->Load(i, in.data(), tg.data());
      sum += m.Forward(in.data(), tg.data(), batch, m.max_seq());
    }
    const double loss = sum / std::max(1, batches);
    fmt::print("eval: {} batches x {} x {} tokens of {}: loss {:.6f} (ppl {:.2f})\n", batches, batch, m.max_seq(),
               data, loss, std::exp(loss));
    return 0;
  }

  if (sample->parsed()) {
    if (!(sopt.temperature > 0)) return Fail(Status::InvalidArgument("--temperature must be > 0"));
    if (sopt.top_k < 0) return Fail(Status::InvalidArgument("--top-k must be >= 0"));
    auto tok = MakeTokenizer(tok_kind, tok_dir);
    if (!tok.ok()) return Fail(tok.status());
    auto model = LoadModel(model_path, weights, 1, 0);
    if (!model.ok()) return Fail(model.status());
    std::vector<int32_t> ids = (*tok)->Encode(prompt);
    if (ids.empty()) ids.push_back((*tok)->eot_token() >= 0 ? (*tok)->eot_token() : '\n');
    for (int32_t id : ids) {
      if (id >= (*model)->config().vocab_size) {
        return Fail(Status::InvalidArgument("prompt token {} is outside the model's vocabulary ({}); wrong --tokenizer?",
                                            id, (*model)->config().vocab_size));
      }
    }
    std::vector<int32_t> out = Sample(**model, ids, sopt);
    fmt::print("{}{}\n", prompt, (*tok)->Decode(out));
    return 0;
  }

  if (exp->parsed()) {
    if (fresh == !weights.empty()) return Fail(Status::InvalidArgument("export: give exactly one of --weights and --init"));
    std::unique_ptr<GPT2> model;
    if (fresh) {
      if (model_path.empty()) return Fail(Status::InvalidArgument("export --init needs --model"));
      auto config = LoadModelConfig(model_path);
      if (!config.ok()) return Fail(config.status());
      auto m = GPT2::Create(*config, 1, 1);
      if (!m.ok()) return Fail(m.status());
      model = std::move(*m);
      model->InitWeights(init_seed);
    } else {
      auto m = LoadModel(model_path, weights, 1, 1);
      if (!m.ok()) return Fail(m.status());
      model = std::move(*m);
    }
    SafetensorsDtype dt;
    if (dtype == "f32") dt = SafetensorsDtype::kF32;
    else if (dtype == "f16") dt = SafetensorsDtype::kF16;
    else if (dtype == "bf16") dt = SafetensorsDtype::kBF16;
    else return Fail(Status::InvalidArgument("--dtype must be f32, f16 or bf16, got '{}'", dtype));
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return Fail(Status::IOError("cannot create '{}': {}", out_dir, ec.message()));
    const GPT2Config& c = model->config();
    const std::string path = (fs::path(out_dir) / "model.safetensors").string();
    Status s = ExportHFWeights(path, c, model->params(), {{"trainflow.model_config", ModelConfigToJson(c).dump()}},
                               dt);
    if (!s.ok()) return Fail(s);
    std::ofstream cfg(fs::path(out_dir) / "config.json");
    cfg << HFConfigJson(c);
    if (!cfg) return Fail(Status::IOError("cannot write {}/config.json", out_dir));
    fmt::print("export: wrote {} ({}) and config.json\n", path, dtype);
    return 0;
  }

  if (env->parsed()) {
    for (const auto& [name, value] : EnvironmentReport()) fmt::print("{:<10} {}\n", name + ":", value);
    return 0;
  }

  if (bench->parsed()) {
    auto config = LoadModelConfig(model_path);
    if (!config.ok()) return Fail(config.status());
    auto r = RunBench(*config, bopt);
    if (!r.ok()) return Fail(r.status());
    const std::string where = r->device == "cuda" ? "device=cuda" : fmt::format("threads={}", omp_get_max_threads());
    fmt::print("bench: {} ({:.1f}M params) B={} T={} {}: median {:.2f} ms/step (min {:.2f}, max {:.2f}) "
               "over {} steps after {} warm-up, {:.0f} tokens/s, {:.1f} GFLOP/s (6*params*tokens)\n",
               model_path, NumParameters(*config) / 1e6, bopt.batch, bopt.seq, where, r->median_ms, r->min_ms,
               r->max_ms, bopt.steps, bopt.warmup, r->tokens_per_s, r->gflops);
    if (r->gemm_peak_gflops > 0) {
      fmt::print("bench: SGEMM ceiling {:.1f} GFLOP/s ({} 2048^3, median); training step at {:.1f}% of it\n",
                 r->gemm_peak_gflops, cpu::gemm_engine_name(), 100.0 * r->gflops / r->gemm_peak_gflops);
    }
    if (r->device == "cuda") {
      fmt::print("bench: {} on CUDA ({}): MFU {:.1f}% (6*params), {:.1f}% with attention FLOPs (llm.c's count); "
                 "device memory {:.2f} GB planned, {:.2f} GB in use\n",
                 bopt.dtype, r->cuda_options, 100.0 * r->mfu, 100.0 * r->mfu_with_attention, r->planned_gb,
                 r->device_used_gb);
    }
    if (!r->profile.empty()) {
      double total = 0;
      for (const auto& row : r->profile) total += row.ms_per_step;
      fmt::print("bench: GPU time per step by piece of work ({} profiled steps; {:.2f} ms in all); roofline = the "
                 "piece's least time at {:.0f} TFLOP/s and the measured {:.0f} GB/s copy bandwidth:\n",
                 bopt.profile_steps, total, r->peak_tflops, r->copy_gbs);
      for (const auto& row : r->profile) {
        const std::string roof = row.roofline_ms < 0 ? std::string("  roofline -")
                                                     : fmt::format("  roofline {:8.3f} ms, at {:5.1f}%", row.roofline_ms,
                                                                   100.0 * row.roofline_ms / row.ms_per_step);
        fmt::print("PROFILE {:<18} {:8.3f} ms {:5.1f}%  {:6.1f} calls{}\n", row.name, row.ms_per_step,
                   100.0 * row.ms_per_step / total, row.calls_per_step, roof);
      }
      fmt::print("bench: roofline step {:.2f} ms (every piece at its ceiling): MFU {:.1f}% at most with this "
                 "structure of the step; measured {:.2f} ms\n",
                 r->roofline_step_ms, 100.0 * r->roofline_mfu, r->median_ms);
    }
    fmt::print("BENCH_RESULT ms_per_step={:.3f} tokens_per_s={:.1f} gflops={:.2f} gemm_peak_gflops={:.2f} mfu={:.4f} "
               "mfu_with_attention={:.4f} device_used_gb={:.2f}\n",
               r->median_ms, r->tokens_per_s, r->gflops, r->gemm_peak_gflops, r->mfu, r->mfu_with_attention,
               r->device_used_gb);
    return 0;
  }
  return 2;
}

}  // namespace tf
