#include "engine/cli.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/spdlog.h>

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
#include "model/json_util.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Prints the error ("trainflow: error: <code>: <message>", docs/exit-codes.md) and returns the exit
// code its class maps to.
int Fail(const Status& s) {
  spdlog::error("{}", s.ToString());
  return ExitCodeFor(s.code());
}

constexpr const char* kExitCodesHelp =
    "Exit codes: 0 done; 1 internal error; 2 bad configuration, flag or input (do not retry); 3 peer or\n"
    "communication failure or timeout (retry); 4 I/O error from the OS or storage; 5 stopped by\n"
    "SIGINT/SIGTERM or stop_at_step after finishing a step and writing the outputs (resumable).\n"
    "docs/exit-codes.md has the details.";

// A seed: a whole number >= 0 that fits int64 (CLI11's NonNegativeNumber would quote a 300-digit
// range, and an unsigned option would wrap -1).
CLI::Validator SeedValidator() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (ec != std::errc() || end != v.data() + v.size() || x < 0) {
          return "must be a whole number from 0 to 9223372036854775807, got '" + v + "'";
        }
        return "";
      },
      "INT>=0");
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
      const bool next_is_flag = i + 1 < extras.size() && extras[i + 1].starts_with("--");
      if (i + 1 >= extras.size() || next_is_flag) {
        return Status::InvalidArgument("override --{} has no value{}", key,
                                       next_is_flag ? " (the next argument is " + extras[i + 1] + ")" : "");
      }
      value = extras[++i];
    }
    for (char& ch : key) ch = ch == '-' ? '_' : ch;  // --max-steps == --max_steps
    if (value.empty()) {
      return Status::InvalidArgument("override --{} has an empty value: give one, or leave the flag out to keep "
                                     "the config's",
                                     key);
    }
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
    const std::string source = weights_path + " (metadata trainflow.model_config)";
    TF_ASSIGN_OR_RETURN(json j, ParseJson(it->second, source, /*allow_comments=*/false));
    return ParseModelConfig(j, source);
  }
  const fs::path hf = fs::path(weights_path).parent_path() / "config.json";
  std::error_code ec;
  if (fs::exists(hf, ec)) {
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

// Model and training configs from files plus "--key value" overrides.
Status LoadConfigs(const std::string& model_path, const std::string& train_path,
                   const std::vector<std::string>& extras, const std::function<void(json*)>& adjust,
                   GPT2Config* model, TrainConfig* train) {
  TF_ASSIGN_OR_RETURN(auto overrides, ParseOverrides(extras));
  TF_ASSIGN_OR_RETURN(json model_json, ReadJsonFile(model_path, "model config"));
  json train_json = json::object();
  if (!train_path.empty()) {
    TF_ASSIGN_OR_RETURN(train_json, ReadJsonFile(train_path, "training config"));
  }
  if (adjust) adjust(&train_json);
  ApplyOverrides(overrides, &model_json, &train_json);
  const std::string suffix = overrides.empty() ? "" : " + command-line overrides";
  TF_ASSIGN_OR_RETURN(*model, ParseModelConfig(model_json, model_path + suffix));
  TF_ASSIGN_OR_RETURN(*train, ParseTrainConfig(train_json, (train_path.empty() ? "training options" : train_path) +
                                                               suffix));
  return Status::OK();
}

int CmdTrain(const std::string& model_path, const std::string& train_path, const std::string& init_from,
             const std::vector<std::string>& extras) {
  GPT2Config model;
  TrainConfig train;
  Status s = LoadConfigs(model_path, train_path, extras, [&](json* t) {
    if (!init_from.empty()) (*t)["init_from"] = init_from;
  }, &model, &train);
  if (!s.ok()) return Fail(s);
  auto trainer = Trainer::Create(model, train, Trainer::Options{});
  if (!trainer.ok()) return Fail(trainer.status());
  auto result = (*trainer)->Run();
  if (!result.ok()) return Fail(result.status());
  return result->stopped ? kExitStopped : kExitOk;
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{"TrainFlow: a fault-tolerant GPT-2 training engine (CPU and CUDA backends)", "trainflow"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trainflow 0.1.0");
  app.footer(kExitCodesHelp);

  // train
  auto* train = app.add_subcommand("train", "Train a model: --model M.json --train T.json [--key value overrides]");
  std::string model_path, train_path, init_from;
  train->add_option("--model", model_path, "Model config JSON (configs/*.json)")->required();
  train->add_option("--train", train_path, "Training config JSON");
  auto* init_opt = train->add_option("--init-from", init_from, "Start from Hugging Face GPT-2 safetensors weights");
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
  prepare->add_option("--seed", popt.seed, "Seed of the train/val split")->check(SeedValidator())->capture_default_str();

  // eval
  auto* eval = app.add_subcommand("eval", "Mean loss of weights on a token file");
  std::string weights, data;
  int batch = 4, seq = 0, batches = 16;
  std::string eval_device = "auto";
  eval->add_option("--weights", weights, "safetensors weights (Hugging Face GPT-2 names)")->required();
  eval->add_option("--model", model_path, "Model config (default: from the weights' metadata or config.json)");
  eval->add_option("--data", data, "Token file")->required();
  eval->add_option("--batch-size", batch, "Sequences per batch")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  eval->add_option("--seq-len", seq, "Sequence length (default: block_size)")->check(CLI::Range(1, 1 << 20));
  eval->add_option("--batches", batches, "Number of batches (from the start of the file)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  eval->add_option("--device", eval_device, "auto (cuda when a GPU is visible), cpu or cuda; fp32 either way")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();

  // sample
  auto* sample = app.add_subcommand("sample", "Generate text from weights");
  std::string prompt;
  SampleOptions sopt;
  int64_t sample_seed = static_cast<int64_t>(sopt.seed);
  sample->add_option("--weights", weights, "safetensors weights")->required();
  sample->add_option("--model", model_path, "Model config (default: from the weights' metadata or config.json)");
  sample->add_option("--prompt", prompt, "Prompt text (default: end-of-text, or a newline for byte)");
  sample->add_option("--tokens", sopt.num_tokens, "Tokens to generate")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  sample->add_option("--temperature", sopt.temperature, "Softmax temperature (> 0)")->capture_default_str();
  sample->add_option("--top-k", sopt.top_k, "Keep the k most likely tokens (0 = all)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  sample->add_option("--seed", sample_seed, "Sampling seed (>= 0)")->check(SeedValidator())->capture_default_str();
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
  exp->add_option("--seed", init_seed, "Seed for --init")->check(SeedValidator())->capture_default_str();
  exp->add_option("--out", out_dir, "Output directory")->required();
  exp->add_option("--dtype", dtype, "f32, f16 or bf16")->capture_default_str();

  // env
  auto* env = app.add_subcommand("env", "What this build is and finds here: CUDA, GPUs, cuBLASLt, NCCL, cuDNN, MPI");

  // bench
  auto* bench = app.add_subcommand("bench", "Time the training step `train` runs (median of N, warm-up excluded)");
  BenchOptions bopt;
  std::string bench_train;
  bool no_fuse_residual = false, nondeterministic = false;
  bench->add_option("--model", model_path, "Model config")->required();
  bench->add_option("--train", bench_train, "Training config (batch shape, device, model options)");
  bench->add_option("--steps", bopt.steps, "Timed steps")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_option("--warmup", bopt.warmup, "Untimed warm-up steps")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  bench->add_option("--peak-tflops", bopt.peak_tflops, "CUDA peak for MFU (default H100/H200 dense: bf16 989, fp32 67)");
  bench->add_flag("--gemm-peak", bopt.gemm_peak, "Also measure the SGEMM ceiling (2048^3, the build's GEMM engine)");
  bench->add_flag("--no-fuse-residual", no_fuse_residual, "CUDA: as --fuse-residual false");
  bench->add_flag("--nondeterministic-attention", nondeterministic, "CUDA, attention cudnn: as --deterministic false");
  bench->add_option("--profile-steps", bopt.profile_steps,
                    "CUDA: after the timed steps, N more with the GPU time of each piece of work (table)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  bench->allow_extras();
  bench->footer(
      "Any training config key can be given as --key value (docs/configs.md), defined once for train and bench:\n"
      "  --batch-size 4 --seq-len 64 --grad-accum-steps 1 --threads 0 --device auto|cpu|cuda --dtype bf16|fp32\n"
      "  --attention flash|flash_simt|gemm|cudnn --recompute 0|1|2 --gelu-fusion -1|0|1|2 (-1: the default,\n"
      "  docs/cuda.md) --fuse-residual true|false --deterministic true|false");

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known |= sub->get_name() == argv[1];
    if (!known) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      return Fail(Status::InvalidArgument("unknown command '{}' (commands: {}; see trainflow --help)",
                                          QuoteForMessage(argv[1]), names));
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitBadInput;
  }

  if (train->parsed()) {
    if (init_opt->count() > 0 && init_from.empty()) {
      return Fail(Status::InvalidArgument("--init-from is empty: give a safetensors file, or leave the flag out "
                                          "to start from random weights"));
    }
    return CmdTrain(model_path, train_path, init_from, train->remaining());
  }

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
    auto config = ResolveModelConfig(model_path, weights);
    if (!config.ok()) return Fail(config.status());
    const int T = seq > 0 ? seq : config->block_size;
    if (T > config->block_size) {
      return Fail(Status::InvalidArgument("--seq-len {} exceeds the model's block_size {}", T, config->block_size));
    }
    if (batch <= 0) return Fail(Status::InvalidArgument("--batch-size must be positive, got {}", batch));
    TrainConfig tc;
    tc.batch_size = batch;
    tc.seq_len = T;
    tc.device = eval_device;
    tc.dtype = "fp32";
    auto backend = MakeTrainBackend(*config, tc, comm::Topology{});
    if (!backend.ok()) return Fail(backend.status());
    std::vector<float> params(static_cast<size_t>((*backend)->layout().total()));
    if (Status s = ImportHFWeights(weights, *config, params); !s.ok()) return Fail(s);
    if (Status s = (*backend)->SetParams(params); !s.ok()) return Fail(s);
    auto loader = DataLoader::Open(data, config->vocab_size, batch, T);
    if (!loader.ok()) return Fail(loader.status());
    auto loss = Trainer::MeanLoss(**backend, *loader, batches);
    if (!loss.ok()) return Fail(loss.status());
    fmt::print("eval: {} batches x {} x {} tokens of {}: loss {:.6f} (ppl {:.2f})\n", batches, batch, T, data, *loss,
               std::exp(*loss));
    return 0;
  }

  if (sample->parsed()) {
    if (!(sopt.temperature > 0) || !std::isfinite(sopt.temperature)) {
      return Fail(Status::InvalidArgument("--temperature must be a finite number > 0, got {}", sopt.temperature));
    }
    sopt.seed = static_cast<uint64_t>(sample_seed);
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
    if (Status s = Env::Default()->CheckWritableDir(out_dir); !s.ok()) return Fail(s);
    const GPT2Config& c = model->config();
    const std::string path = (fs::path(out_dir) / "model.safetensors").string();
    Status s = ExportHFWeights(path, c, model->params(), {{"trainflow.model_config", ModelConfigToJson(c).dump()}},
                               dt);
    if (!s.ok()) return Fail(s);
    if (Status w = Env::Default()->WriteFileAtomically(out_dir + "/config.json", HFConfigJson(c)); !w.ok()) {
      return Fail(w);
    }
    fmt::print("export: wrote {} ({}) and config.json\n", path, dtype);
    return 0;
  }

  if (env->parsed()) {
    for (const auto& [name, value] : EnvironmentReport()) fmt::print("{:<10} {}\n", name + ":", value);
    return 0;
  }

  if (bench->parsed()) {
    GPT2Config config;
    TrainConfig tc;
    Status s = LoadConfigs(model_path, bench_train, bench->remaining(), [&](json* t) {
      if (no_fuse_residual) (*t)["fuse_residual"] = false;
      if (nondeterministic) (*t)["deterministic"] = false;
    }, &config, &tc);
    if (!s.ok()) return Fail(s);
    auto r = RunBench(config, tc, bopt);
    if (!r.ok()) return Fail(r.status());
    const std::string where = r->device == "cuda" ? "device=cuda" : fmt::format("threads={}", omp_get_max_threads());
    fmt::print("bench: {} ({:.1f}M params) B={} T={} {}: median {:.2f} ms/step (min {:.2f}, max {:.2f}) "
               "over {} steps after {} warm-up, {:.0f} tokens/s, {:.1f} GFLOP/s (6*params*tokens)\n",
               model_path, NumParameters(config) / 1e6, tc.batch_size, tc.seq_len, where, r->median_ms, r->min_ms,
               r->max_ms, bopt.steps, bopt.warmup, r->tokens_per_s, r->gflops);
    if (r->gemm_peak_gflops > 0) {
      fmt::print("bench: SGEMM ceiling {:.1f} GFLOP/s ({} 2048^3, median); training step at {:.1f}% of it\n",
                 r->gemm_peak_gflops, cpu::gemm_engine_name(), 100.0 * r->gflops / r->gemm_peak_gflops);
    }
    if (r->device == "cuda") {
      fmt::print("bench: {} on CUDA ({}): MFU {:.1f}% (6*params), {:.1f}% with attention FLOPs (llm.c's count); "
                 "device memory {:.2f} GB planned, {:.2f} GB in use\n",
                 tc.dtype, r->cuda_options, 100.0 * r->mfu, 100.0 * r->mfu_with_attention, r->planned_gb,
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
