#include "engine/cli/cli.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/spdlog.h>

#include "base/env.h"
#include "base/json.h"
#include "base/log.h"
#include "engine/cli/bench.h"
#include "engine/cli/checkpoint_cli.h"
#include "engine/cli/env_report.h"
#include "engine/cli/launch_cli.h"
#include "engine/cli/rescue_target.h"
#include "engine/cli/slurm_cli.h"
#include "engine/cli/test_faults.h"
#include "engine/data/data_loader.h"
#include "engine/data/prepare.h"
#include "engine/run_report.h"
#include "engine/sampler.h"
#include "engine/train_config.h"
#include "engine/trainer.h"
#include "engine/weights_card.h"
#include "kernels/matmul.h"
#include "launch/rank_agent.h"
#include "model/gpt2.h"
#include "model/gpt2_weights.h"
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

// A whole number in [lo, hi], named as such for anything else ("abc", "1.5", "-1"): CLI11's own
// messages for a non-number are "Value abc not in range" (and its NonNegativeNumber quotes a
// 300-digit range, an unsigned option wraps -1).
CLI::Validator WholeNumber(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi) {
          return fmt::format("must be a whole number from {} to {}, got '{}'", lo, hi, v);
        }
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

// A seed: a whole number >= 0 that fits int64.
CLI::Validator SeedValidator() { return WholeNumber(0, INT64_MAX); }

// "--key value" / "--key=value" pairs left over after CLI11 parsed the known flags.
StatusOr<std::vector<std::pair<std::string, std::string>>> ParseOverrides(const std::vector<std::string>& extras) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& a = extras[i];
    if (!a.starts_with("--") || a.size() == 2) {
      return Status::InvalidArgument("unexpected argument '{}' (overrides are --key value)", a);
    }
    std::string key = a.substr(2), value;
    for (char& ch : key) ch = ch == '-' ? '_' : ch;  // --max-steps == --max_steps
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = a.substr(2 + eq + 1);
      key = key.substr(0, eq);
    } else {
      const bool next_is_flag = i + 1 < extras.size() && extras[i + 1].starts_with("--");
      if ((i + 1 >= extras.size() || next_is_flag) && IsBooleanTrainKey(key)) {
        value = "true";  // --fresh alone
      } else if (i + 1 >= extras.size() || next_is_flag) {
        return Status::InvalidArgument("override --{} has no value{}", key,
                                       next_is_flag ? " (the next argument is " + extras[i + 1] + ")" : "");
      } else {
        value = extras[++i];
      }
    }
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
  TF_ASSIGN_OR_RETURN(const WeightsCard card, ReadWeightsCard(weights_path));
  if (card.model) return *card.model;
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
                   GPT2Config* model, TrainConfig* train, const std::string& init_weights = "") {
  TF_ASSIGN_OR_RETURN(auto overrides, ParseOverrides(extras));
  json model_json;
  std::string model_source = model_path;
  if (model_path.empty() && !init_weights.empty()) {  // the model the weights carry
    TF_ASSIGN_OR_RETURN(const GPT2Config from_weights, ResolveModelConfig("", init_weights));
    model_json = ModelConfigToJson(from_weights);
    model_source = "the model config of " + init_weights;
  } else if (model_path.empty()) {
    return Status::InvalidArgument("--model is required (a model config such as configs/model/byte-small.json), "
                                   "unless --init-from gives weights that carry their config");
  } else {
    TF_ASSIGN_OR_RETURN(model_json, ReadJsonFile(model_path, "model config"));
  }
  json train_json = json::object();
  if (!train_path.empty()) {
    TF_ASSIGN_OR_RETURN(train_json, ReadJsonFile(train_path, "training config"));
    // Paths in a config file are the file's own: relative to its directory, whatever the cwd.
    if (train_json.is_object()) ResolveConfigPaths(fs::path(train_path).parent_path().string(), &train_json);
  }
  if (adjust) adjust(&train_json);
  ApplyOverrides(overrides, &model_json, &train_json);
  // The rest (command-line paths) are relative to the current directory; all are recorded absolute.
  if (train_json.is_object()) ResolveConfigPaths("", &train_json);
  const std::string suffix = overrides.empty() ? "" : " + command-line overrides";
  TF_ASSIGN_OR_RETURN(*model, ParseModelConfig(model_json, model_source + suffix));
  TF_ASSIGN_OR_RETURN(*train, ParseTrainConfig(train_json, (train_path.empty() ? "training options" : train_path) +
                                                               suffix));
  return Status::OK();
}

// Copies what this process writes to stdout and stderr into a log file as well (appended), from
// Start until destruction: each stream is redirected into a pipe whose reader thread passes every
// chunk on to the original stream and to the file. Not copyable; the destructor flushes both
// streams, puts them back and waits for the readers.
class ConsoleCopy {
 public:
  static std::unique_ptr<ConsoleCopy> Start(const std::string& path) {
    const auto info = Env::Default()->Stat(path);
    if (!info.ok() || (info->exists && !info->is_regular)) return nullptr;  // a FIFO or device: no copy
    auto file = Env::Default()->NewAppendableFile(path);
    if (!file.ok()) return nullptr;
    std::unique_ptr<ConsoleCopy> c(new ConsoleCopy());
    c->file_ = std::move(*file);
    std::fflush(stdout);
    std::fflush(stderr);
    for (int i = 0; i < 2; ++i) {
      Stream& st = c->streams_[i];
      st.fd = i + 1;
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) break;
      st.saved = ::fcntl(st.fd, F_DUPFD_CLOEXEC, 3);
      st.out = st.saved >= 0 ? ::fdopen(st.saved, "w") : nullptr;
      if (st.out == nullptr || ::dup2(p[1], st.fd) < 0) {
        ::close(p[0]);
        ::close(p[1]);
        break;
      }
      ::close(p[1]);
      st.reader = std::thread([c = c.get(), &st, in = p[0]] {
        char buf[4096];
        for (;;) {
          const ssize_t n = ::read(in, buf, sizeof(buf));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          std::fwrite(buf, 1, static_cast<size_t>(n), st.out);
          std::fflush(st.out);
          std::lock_guard<std::mutex> lock(c->mu_);
          if (c->file_ && !c->file_->Append(std::string_view(buf, static_cast<size_t>(n))).ok()) c->file_.reset();
        }
        ::close(in);
      });
    }
    return c;
  }
  ConsoleCopy(const ConsoleCopy&) = delete;
  ConsoleCopy& operator=(const ConsoleCopy&) = delete;
  ~ConsoleCopy() {
    std::fflush(stdout);
    std::fflush(stderr);
    for (Stream& st : streams_) {
      if (!st.reader.joinable()) continue;
      ::dup2(st.saved, st.fd);  // closes the pipe's write end: the reader sees its end
      st.reader.join();
      std::fclose(st.out);
    }
    if (file_) (void)file_->Close();
  }

 private:
  ConsoleCopy() = default;
  struct Stream {
    int fd = -1, saved = -1;
    std::FILE* out = nullptr;  // the original stream
    std::thread reader;
  };
  std::mutex mu_;  // guards file_
  std::unique_ptr<WritableFile> file_;
  Stream streams_[2];
};

int CmdTrain(const std::string& model_path, const std::string& train_path, const std::string& init_from,
             const std::vector<std::string>& extras) {
  GPT2Config model;
  TrainConfig train;
  Status s = LoadConfigs(model_path, train_path, extras, [&](json* t) {
    if (!init_from.empty()) (*t)["init_from"] = init_from;
  }, &model, &train, init_from);
  // Under `trainflow launch`: heartbeats from start-up on, and the rescue after a failure.
  auto agent = launch::RankAgent::FromEnvironment();
  if (!agent.ok()) return Fail(agent.status());
  auto fail = [&](Trainer* t, const Status& st) {
    const int code = Fail(st);
    if (!*agent) return code;
    std::optional<TrainerRescue> target;
    if (t != nullptr) target.emplace(*t);
    const int rc = (*agent)->Linger(target ? &*target : nullptr, st, code);
    (*agent)->Finish(rc);
    // No destructors: the trainer's communicator and threads wait for peers that are gone.
    launch::QuickExit(rc);
    return rc;
  };
  if (!s.ok()) return fail(nullptr, s);
  // The default out_dir ("out", not in any file or flag) is recorded absolute like the others.
  if (std::error_code ec; !train.out_dir.empty() && !LooksLikeUrl(train.out_dir)) {
    const fs::path abs = fs::absolute(train.out_dir, ec);
    if (!ec) train.out_dir = abs.lexically_normal().string();
  }
  // out_dir/train.log: what rank 0's console shows, appended run after run (the supervisor of
  // `trainflow launch` keeps the logs of its jobs itself).
  std::unique_ptr<ConsoleCopy> console;
  if (!*agent && RankFromEnvironment() <= 0 && !train.out_dir.empty() && !LooksLikeUrl(train.out_dir) &&
      std::getenv("TRAINFLOW_LOG_FILE") == nullptr &&
      Env::Default()->CreateDirs(train.out_dir).ok()) {
    console = ConsoleCopy::Start(train.out_dir + "/train.log");
  }
  auto trainer = Trainer::Create(model, train, Trainer::Options{.faults = TestFaults()});
  if (!trainer.ok()) return fail(nullptr, trainer.status());
  auto result = (*trainer)->Run();
  if (!result.ok()) return fail(trainer->get(), result.status());
  const int rc = result->stopped ? kExitStopped : kExitOk;
  if (*agent) (*agent)->Finish(rc);
  return rc;
}

struct EvalArgs {
  std::string weights, model_path, data;
  std::string batches;  // "N", "all", or "" (the run's evaluation, else all)
  int batch = 0, seq = 0;  // 0: the run's, else a default
  bool wrap = false;
  std::string device = "auto";
};

// `trainflow eval` (docs/data.md): every default is the training run the weights record, so the
// validation figure it printed is reproduced.
int CmdEval(EvalArgs a) {
  auto card = ReadWeightsCard(a.weights);
  if (!card.ok()) return Fail(card.status());
  auto config = ResolveModelConfig(a.model_path, a.weights);
  if (!config.ok()) return Fail(config.status());
  std::vector<std::string> from_run;
  if (a.data.empty()) {
    a.data = card->RunString("val_data").value_or("");
    if (a.data.empty()) return Fail(Status::InvalidArgument("eval: give --data TOKEN_FILE (the weights record no val_data)"));
    if (auto info = Env::Default()->Stat(a.data); info.ok() && !info->exists) {
      return Fail(Status::InvalidArgument("eval: the validation data the weights record, {}, is not there (moved or "
                                          "deleted): pass --data TOKEN_FILE",
                                          a.data));
    }
    from_run.push_back("data");
  }
  if (a.batch == 0) {
    const int64_t run_batch = card->RunInt("batch_size").value_or(0);
    if (run_batch > 0) from_run.push_back("batch size");
    a.batch = run_batch > 0 ? static_cast<int>(run_batch) : 4;
  }
  const int T = a.seq > 0 ? a.seq : card->seq_len > 0 ? card->seq_len : config->block_size;
  if (a.seq == 0 && card->seq_len > 0) from_run.push_back("sequence length");
  if (T > config->block_size) {
    return Fail(Status::InvalidArgument("--seq-len {} exceeds the model's block_size {}", T, config->block_size));
  }
  int64_t batches = -1;  // -1: the whole file once
  bool run_batches = false;
  if (a.batches.empty()) {
    const int64_t eb = card->RunInt("eval_batches").value_or(0);
    if (eb > 0) {
      batches = eb * std::max(card->world, 1);  // every rank evaluated eb batches of its own
      run_batches = true;
      from_run.push_back("batches");
    }
  } else if (a.batches != "all") {
    const auto [end, ec] = std::from_chars(a.batches.data(), a.batches.data() + a.batches.size(), batches);
    if (ec != std::errc() || end != a.batches.data() + a.batches.size() || batches < 1) {
      return Fail(Status::InvalidArgument("--batches must be a whole number >= 1 or 'all', got '{}'",
                                          QuoteForMessage(a.batches)));
    }
  }
  auto loader = DataLoader::Open(a.data, config->vocab_size, a.batch, T);
  if (!loader.ok()) return Fail(loader.status());
  const std::string model_tok = card->TokenizerFor(*config);
  if (const TokenFileTokenizer& rec = loader->tokenizer();
      !rec.kind.empty() && !model_tok.empty() &&
      (rec.kind != model_tok ||
       (card->tokenizer_fingerprint != 0 && rec.fingerprint != 0 && rec.fingerprint != card->tokenizer_fingerprint))) {
    return Fail(Status::InvalidArgument("{} was tokenized with the {} tokenizer ({:016x}), the model with {} ({:016x}): "
                                        "its loss would mean nothing",
                                        a.data, rec.kind, rec.fingerprint, model_tok, card->tokenizer_fingerprint));
  }
  const int64_t rows = (loader->num_tokens() - 1) / T;  // whole sequences of T+1 tokens in one pass
  const int64_t full = rows / a.batch;
  if (rows == 0) {
    return Fail(Status::InvalidArgument("{} holds {} tokens, fewer than one sequence of {} + 1: pass a smaller "
                                        "--seq-len",
                                        a.data, loader->num_tokens(), T));
  }
  std::string note;
  if (batches > full && !(a.wrap || run_batches)) {
    return Fail(Status::InvalidArgument("{} holds {} batch{} of {} x {} tokens; --batches {} would read it again "
                                        "from the start: pass --batches all (the whole file once) or add --wrap",
                                        a.data, full, full == 1 ? "" : "es", a.batch, T, batches));
  }
  if (batches > full) {
    note = full == 0 ? std::string("; the file holds less than one batch, so its start repeats")
                     : fmt::format("; the file holds {} whole batch{}, so batches after that repeat its start", full,
                                   full == 1 ? "" : "es");
  }
  TrainConfig tc;
  tc.batch_size = a.batch;
  tc.seq_len = T;
  tc.device = a.device;
  tc.dtype = "fp32";
  auto backend = MakeTrainBackend(*config, tc, comm::Topology{});
  if (!backend.ok()) return Fail(backend.status());
  std::vector<float> params(static_cast<size_t>((*backend)->layout().total()));
  if (Status s = ImportHFWeights(a.weights, *config, params); !s.ok()) return Fail(s);
  if (Status s = (*backend)->SetParams(params); !s.ok()) return Fail(s);
  double loss = 0;
  std::string what;
  if (batches >= 0) {
    auto l = Trainer::MeanLoss(**backend, *loader, batches);
    if (!l.ok()) return Fail(l.status());
    loss = *l;
    what = fmt::format("{} batch{} x {} x {} tokens", batches, batches == 1 ? "" : "es", a.batch, T);
  } else {  // the whole file once: the full batches, then the rows that are left as one smaller batch
    const int tail = static_cast<int>(rows % a.batch);
    auto l = Trainer::MeanLoss(**backend, *loader, full);
    if (!l.ok()) return Fail(l.status());
    double sum = *l * static_cast<double>(full * a.batch);
    if (tail > 0) {
      std::vector<int32_t> in(static_cast<size_t>(a.batch) * T), tg(in.size());
      loader->Load(full, in.data(), tg.data());
      auto t = (*backend)->Forward(in.data(), tg.data(), tail, T);
      if (!t.ok()) return Fail(t.status());
      sum += static_cast<double>(*t) * tail;
    }
    loss = sum / static_cast<double>(rows);
    what = fmt::format("the whole file once: {} sequences x {} tokens ({} tokens left over)", rows, T,
                       loader->num_tokens() - 1 - rows * T);
  }
  fmt::print("eval: {} of {}: loss {:.6f} (ppl {:.2f}){}\n", what, a.data, loss, std::exp(loss), note);
  if (!from_run.empty()) {
    fmt::print("eval: {} from the training run recorded in the weights (step {}){}\n", fmt::join(from_run, ", "),
               card->step, batches >= 0 ? "; --batches all for the whole file" : "");
  }
  return 0;
}

struct SampleArgs {
  std::string weights, model_path, prompt;
  std::string tokenizer, tokenizer_dir;  // "": the weights' tokenizer; "": search for the GPT-2 files
  SampleOptions options;
  bool temperature_given = false, top_k_given = false;  // else the run's sample_temperature, sample_top_k
};

// `trainflow sample`: the run's tokenizer, temperature and top-k, with the context window sliding
// within the trained length (positions past it were never trained).
int CmdSample(SampleArgs a) {
  auto card = ReadWeightsCard(a.weights);
  if (!card.ok()) return Fail(card.status());
  auto config = ResolveModelConfig(a.model_path, a.weights);
  if (!config.ok()) return Fail(config.status());
  SampleOptions& o = a.options;
  if (!a.temperature_given) o.temperature = card->RunNumber("sample_temperature").value_or(o.temperature);
  if (!a.top_k_given) o.top_k = static_cast<int>(card->RunInt("sample_top_k").value_or(o.top_k));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return Fail(Status::InvalidArgument("--temperature must be a finite number >= 0 (0 = greedy), got {}",
                                        o.temperature));
  }
  if (o.top_k < 0) return Fail(Status::InvalidArgument("--top-k must be >= 0"));
  const std::string model_tok = card->TokenizerFor(*config);
  if (!a.tokenizer.empty() && !model_tok.empty() && a.tokenizer != model_tok) {
    return Fail(Status::InvalidArgument("{} was trained with the {} tokenizer{}; --tokenizer {} would decode its "
                                        "tokens into garbage: leave --tokenizer out or pass {}",
                                        a.weights, model_tok, card->tokenizer.empty() ? " (its vocabulary says so)" : "",
                                        a.tokenizer, model_tok));
  }
  if (a.tokenizer.empty()) a.tokenizer = model_tok;
  if (a.tokenizer.empty()) {
    return Fail(Status::InvalidArgument("{} records no tokenizer and its vocab_size {} fits none: pass --tokenizer "
                                        "byte or gpt2",
                                        a.weights, config->vocab_size));
  }
  if (Status s = CheckTokenizerFitsModel(a.tokenizer, *config, "the"); !s.ok()) return Fail(s);
  auto tok = MakeTokenizer(a.tokenizer, a.tokenizer_dir);
  if (!tok.ok()) return Fail(tok.status());
  if (card->tokenizer_fingerprint != 0 && (*tok)->fingerprint() != card->tokenizer_fingerprint) {
    spdlog::warn("the {} tokenizer files found here (fingerprint {:016x}) differ from the ones the model was "
                 "trained with ({:016x}): the text may decode wrongly",
                 a.tokenizer, (*tok)->fingerprint(), card->tokenizer_fingerprint);
  }
  const int window = card->seq_len > 0 ? card->seq_len : config->block_size;
  auto model = LoadModel(a.model_path, a.weights, 1, window);
  if (!model.ok()) return Fail(model.status());
  std::vector<int32_t> ids = (*tok)->Encode(a.prompt);
  if (ids.empty()) ids.push_back((*tok)->eot_token() >= 0 ? (*tok)->eot_token() : '\n');
  spdlog::info("sample: tokenizer {}, temperature {}{}, top-k {}, context window {} tokens{}", a.tokenizer,
               o.temperature, o.temperature == 0 ? " (greedy)" : "", o.top_k, window,
               card->seq_len > 0 ? " (the trained length)" : "");
  std::vector<int32_t> out = Sample(**model, ids, o);
  fmt::print("{}{}\n", a.prompt, (*tok)->Decode(out));
  return 0;
}

}  // namespace

Status ResolveTrainCommand(const std::vector<std::string>& args, GPT2Config* model, TrainConfig* train) {
  if (args.empty() || args[0] != "train") {
    return Status::InvalidArgument("the command to supervise must be `train ...` (after --), got '{}'",
                                   args.empty() ? "" : args[0]);
  }
  std::string model_path, train_path, init_from;
  std::vector<std::string> extras;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string* into = a == "--model" ? &model_path : a == "--train" ? &train_path : a == "--init-from" ? &init_from
                                                                                                        : nullptr;
    if (into != nullptr) {
      if (i + 1 >= args.size()) return Status::InvalidArgument("train: {} has no value", a);
      *into = args[++i];
      continue;
    }
    extras.push_back(a);
  }
  return LoadConfigs(model_path, train_path, extras, [&](json* t) {
    if (!init_from.empty()) (*t)["init_from"] = init_from;
  }, model, train, init_from);
}

std::string DashedFlag(std::string arg) {
  if (!arg.starts_with("--")) return arg;
  const size_t end = std::min(arg.find('='), arg.size());
  std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return arg;
}

// Every flag of every command is accepted as --word-word and --word_word: the names of the
// arguments before a bare "--" (what follows it is another command's, passed on as given) are
// rewritten with dashes, which is how the commands declare them.
std::vector<std::string> NormalizeFlags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    args[i] = DashedFlag(args[i]);
  }
  return args;
}

int RunCli(int argc, char** argv) {
  std::vector<std::string> normalized = NormalizeFlags(argc, argv);
  std::vector<char*> normalized_argv;
  for (std::string& a : normalized) normalized_argv.push_back(a.data());
  normalized_argv.push_back(nullptr);
  argv = normalized_argv.data();
  CLI::App app{"TrainFlow: a fault-tolerant GPT-2 training engine (CPU and CUDA backends)", "trainflow"};
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  app.set_version_flag("--version", "trainflow 0.1.0");

  // train
  auto* train = app.add_subcommand("train", "Train a model: --model M.json --train T.json [--key value overrides]");
  std::string model_path, train_path, init_from;
  train->add_option("--model", model_path,
                    "Model config JSON (configs/model/*.json); optional with --init-from weights that carry it");
  train->add_option("--train", train_path, "Training config JSON");
  auto* init_opt = train->add_option("--init-from", init_from, "Start from Hugging Face GPT-2 safetensors weights");
  train->allow_extras();
  train->footer("Any training or model config key can be given as --key value (--max_steps 50 --lr 1e-3 --n_layer "
                "2; a boolean key alone means true: --fresh); every key, its default and meaning: docs/configs.md.\n" +
                ConfigKeysHelp());

  // prepare
  auto* prepare = app.add_subcommand("prepare", "Tokenize text files into train.bin / val.bin token files");
  PrepareOptions popt;
  std::string tok_kind, tok_dir, delimiter;
  const std::string tok_dir_help =
      "Directory with GPT-2's encoder.json and vocab.bpe (default: $TRAINFLOW_TOKENIZER_DIR, else "
      "third_party/gpt2-tokenizer beside the binary's build/; docs/tokenizers.md)";
  prepare->add_option("--input", popt.inputs, "Text files or directories (read recursively)")->required();
  prepare->add_option("--out-dir", popt.out_dir, "Output directory")->required();
  prepare->add_option("--tokenizer", tok_kind, "byte or gpt2")->default_str("byte");
  prepare->add_option("--tokenizer-dir", tok_dir, tok_dir_help);
  auto* delim_opt = prepare->add_option("--delimiter", delimiter,
                                        "A line equal to this separates documents (fortune files: %); \"\" = blank "
                                        "lines; default: one document per file");
  prepare->add_option("--val-fraction", popt.val_fraction,
                      "Fraction of the pieces (documents, long ones cut at ~16 KiB) for validation; 0 = none")
      ->capture_default_str();
  prepare->add_option("--seed", popt.seed, "Seed of the train/val split")->check(SeedValidator())->capture_default_str();

  // eval
  auto* eval = app.add_subcommand("eval", "Mean loss of weights on a token file");
  EvalArgs ea;
  eval->add_option("--weights", ea.weights, "safetensors weights (Hugging Face GPT-2 names)")->required();
  eval->add_option("--model", ea.model_path, "Model config (default: from the weights' metadata or config.json)");
  eval->add_option("--data", ea.data, "Token file (default: the training run's val_data, recorded in the weights)");
  eval->add_option("--batch-size", ea.batch, "Sequences per batch (default: the training run's, else 4)")
      ->check(WholeNumber(1, 1 << 16));
  eval->add_option("--seq-len", ea.seq, "Sequence length (default: the trained one, else block_size)")
      ->check(WholeNumber(1, 1 << 20));
  eval->add_option("--batches", ea.batches,
                   "N batches from the start of the file, or 'all': the whole file once (default: the training "
                   "run's evaluation, else all)");
  eval->add_flag("--wrap", ea.wrap, "Allow --batches beyond the end of the file (it is read again from the start)");
  eval->add_option("--device", ea.device, "auto (cuda when a GPU is visible), cpu or cuda; fp32 either way")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();

  // sample
  auto* sample = app.add_subcommand("sample", "Generate text from weights");
  SampleArgs sa;
  int64_t sample_seed = static_cast<int64_t>(sa.options.seed);
  sample->add_option("--weights", sa.weights, "safetensors weights")->required();
  sample->add_option("--model", sa.model_path, "Model config (default: from the weights' metadata or config.json)");
  sample->add_option("--prompt", sa.prompt, "Prompt text (default: end-of-text, or a newline for byte)");
  sample->add_option("--tokens", sa.options.num_tokens, "Tokens to generate")
      ->check(WholeNumber(0, 1 << 20))
      ->capture_default_str();
  auto* temp_opt = sample->add_option("--temperature", sa.options.temperature,
                                      "Softmax temperature, 0 = greedy (default: the training run's "
                                      "sample_temperature, else 0.8)");
  auto* topk_opt = sample->add_option("--top-k", sa.options.top_k,
                                      "Keep the k most likely tokens, 0 = all (default: the training run's "
                                      "sample_top_k, else 0)")
                       ->check(WholeNumber(0, 1 << 24));
  sample->add_option("--seed", sample_seed, "Sampling seed (>= 0)")->check(SeedValidator())->capture_default_str();
  sample->add_option("--tokenizer", sa.tokenizer, "byte or gpt2 (default: the one the weights record)");
  sample->add_option("--tokenizer-dir", sa.tokenizer_dir, tok_dir_help);

  // export
  auto* exp = app.add_subcommand("export", "Write Hugging Face GPT-2 files (model.safetensors + config.json)");
  std::string weights;
  std::string out_dir, dtype = "fp32";
  uint64_t init_seed = 0;
  bool fresh = false;
  exp->add_option("--weights", weights, "Weights to export (any safetensors with GPT-2 names)");
  exp->add_option("--model", model_path, "Model config (required with --init)");
  exp->add_flag("--init", fresh, "Export a freshly initialised model instead of --weights");
  exp->add_option("--seed", init_seed, "Seed for --init")->check(SeedValidator())->capture_default_str();
  exp->add_option("--out", out_dir, "Output directory")->required();
  exp->add_option("--dtype", dtype, "fp32, fp16 or bf16 (as train's --dtype; f32 and f16 are accepted too)")
      ->capture_default_str();

  // report
  auto* report = app.add_subcommand("report", "Write a self-contained HTML report of a run's curves (metrics.jsonl)");
  std::string report_dir, report_out;
  report->add_option("RUN_DIR", report_dir, "The run's out_dir (holding metrics.jsonl)")->required();
  report->add_option("--out", report_out, "Output file (default: RUN_DIR/report.html)");

  // env
  const auto checkpoints = AddCheckpointCommands(app);
  const auto launch = AddLaunchCommands(app);
  const auto slurm = AddSlurmCommands(app);

  auto* env = app.add_subcommand("env", "What this build is and finds here: CUDA, GPUs, cuBLASLt, NCCL, cuDNN, MPI");

  // bench
  auto* bench = app.add_subcommand("bench", "Time the training step `train` runs (median of N, warm-up excluded)");
  BenchOptions bopt;
  std::string bench_train;
  bool no_fuse_residual = false, nondeterministic = false;
  bench->add_option("--model", model_path, "Model config")->required();
  bench->add_option("--train", bench_train, "Training config (batch shape, device, model options)");
  bench->add_option("--steps", bopt.steps, "Timed steps")->check(WholeNumber(1, 1 << 20))->capture_default_str();
  bench->add_option("--warmup", bopt.warmup, "Untimed warm-up steps")->check(WholeNumber(0, 1 << 20))->capture_default_str();
  bench->add_option("--peak-tflops", bopt.peak_tflops, "CUDA peak for MFU (default: the GPU's dense datasheet figure, docs/monitoring.md; unknown GPUs: H100's bf16 989, fp32 67)")
      ->check(FiniteRange(0, 1e6));
  bench->add_flag("--gemm-peak", bopt.gemm_peak, "Also measure the SGEMM ceiling (2048^3, the build's GEMM engine)");
  bench->add_flag("--no-fuse-residual", no_fuse_residual, "CUDA: as --fuse-residual false");
  bench->add_flag("--nondeterministic-attention", nondeterministic, "CUDA, attention cudnn: as --deterministic false");
  bench->add_option("--profile-steps", bopt.profile_steps,
                    "CUDA: after the timed steps, N more with the GPU time of each piece of work (table)")
      ->check(WholeNumber(0, 100))
      ->capture_default_str();
  bench->allow_extras();
  bench->footer(
      "Any training config key can be given as --key value (docs/configs.md), defined once for train and bench:\n"
      "  --batch-size 4 --seq-len 64 --grad-accum-steps 1 --threads 0 --device auto|cpu|cuda --dtype bf16|fp32\n"
      "  --attention flash|flash_simt|gemm|cudnn --recompute 0|1|2 --gelu-fusion -1|0|1|2 (-1: the default,\n"
      "  currently 0 for both dtypes, docs/cuda.md) --fuse-residual true|false --deterministic true|false");

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
    if (tok_kind.empty()) tok_kind = "byte";
    if (delim_opt->count() > 0) popt.delimiter = delimiter;
    auto tok = MakeTokenizer(tok_kind, tok_dir);
    if (!tok.ok()) return Fail(tok.status());
    auto r = PrepareData(popt, **tok);
    if (!r.ok()) return Fail(r.status());
    std::string skipped;
    if (r->skipped_binary > 0) skipped += fmt::format(", {} binary skipped", r->skipped_binary);
    if (r->skipped_symlinks > 0) skipped += fmt::format(", {} symbolic links skipped", r->skipped_symlinks);
    fmt::print("prepare: {} file{}{}, {} document{} in {} pieces, tokenizer {}\n", r->files, r->files == 1 ? "" : "s",
               skipped, r->documents, r->documents == 1 ? "" : "s", r->pieces, tok_kind);
    fmt::print("prepare: {}: {} tokens\n", r->train_path, r->train_tokens);
    if (!r->val_path.empty()) {
      fmt::print("prepare: {}: {} tokens ({} of {} pieces, {:.1f}% of the tokens)\n", r->val_path, r->val_tokens,
                 r->val_pieces, r->pieces, 100.0 * r->val_tokens / double(r->val_tokens + r->train_tokens));
    } else {
      fmt::print("prepare: no validation split ({}){}\n",
                 popt.val_fraction == 0 ? "--val-fraction 0" : "too little text to split",
                 r->removed_old_val ? "; removed the earlier val.bin, which belonged to other data" : "");
    }
    return 0;
  }

  if (eval->parsed()) return CmdEval(ea);
  if (report->parsed()) {
    auto path = WriteRunReport(report_dir, report_out, Env::Default());
    if (!path.ok()) return Fail(path.status());
    fmt::print("report: {}\n", *path);
    return 0;
  }
  if (sample->parsed()) {
    sa.options.seed = static_cast<uint64_t>(sample_seed);
    sa.temperature_given = temp_opt->count() > 0;
    sa.top_k_given = topk_opt->count() > 0;
    return CmdSample(sa);
  }

  if (exp->parsed()) {
    if (fresh == !weights.empty()) return Fail(Status::InvalidArgument("export: give exactly one of --weights and --init"));
    SafetensorsDtype dt;
    if (dtype == "fp32" || dtype == "f32") dt = SafetensorsDtype::kF32;
    else if (dtype == "fp16" || dtype == "f16") dt = SafetensorsDtype::kF16;
    else if (dtype == "bf16") dt = SafetensorsDtype::kBF16;
    else return Fail(Status::InvalidArgument("--dtype must be fp32, fp16 or bf16, got '{}'", QuoteForMessage(dtype)));
    std::unique_ptr<GPT2> model;
    WeightsCard card;
    if (fresh) {
      if (model_path.empty()) return Fail(Status::InvalidArgument("export --init needs --model"));
      auto config = LoadModelConfig(model_path);
      if (!config.ok()) return Fail(config.status());
      auto m = GPT2::Create(*config, 1, 1);
      if (!m.ok()) return Fail(m.status());
      model = std::move(*m);
      model->InitWeights(init_seed);
    } else {
      auto c = ReadWeightsCard(weights);  // carried over: tokenizer, trained length, training config
      if (!c.ok()) return Fail(c.status());
      card = std::move(*c);
      auto m = LoadModel(model_path, weights, 1, 1);
      if (!m.ok()) return Fail(m.status());
      model = std::move(*m);
    }
    if (Status s = Env::Default()->CheckWritableDir(out_dir); !s.ok()) return Fail(s);
    const GPT2Config& c = model->config();
    card.model = c;
    const std::string path = (fs::path(out_dir) / "model.safetensors").string();
    Status s = ExportHFWeights(path, c, model->params(), card.ToMetadata(), dt);
    if (!s.ok()) return Fail(s);
    if (Status w = Env::Default()->WriteFileAtomically(out_dir + "/config.json", HFConfigJson(c, card.tokenizer, dt));
        !w.ok()) {
      return Fail(w);
    }
    fmt::print("export: wrote {} ({}) and config.json\n", path, dt == SafetensorsDtype::kF32   ? "fp32"
                                                                : dt == SafetensorsDtype::kF16 ? "fp16"
                                                                                               : "bf16");
    return 0;
  }

  if (LaunchCommandParsed(*launch)) return RunLaunchCommand(*launch);
  if (SlurmCommandParsed(*slurm)) return RunSlurmCommand(*slurm);
  if (CheckpointCommandParsed(*checkpoints)) {
    const Status s = RunCheckpointCommand(*checkpoints);
    return s.ok() ? kExitOk : Fail(s);
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
    fmt::print("bench: {} ({} params) B={} T={} {}: median {:.2f} ms/step (min {:.2f}, max {:.2f}) "
               "over {} steps after {} warm-up, {:.0f} tokens/s, {:.1f} GFLOP/s (6*params*tokens)\n",
               model_path, FormatParameterCount(NumParameters(config)), tc.batch_size, tc.seq_len, where, r->median_ms, r->min_ms,
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
    // Only what was measured: MFU and device memory exist on a GPU, the GEMM ceiling with --gemm-peak.
    std::string result = fmt::format("BENCH_RESULT ms_per_step={:.3f} tokens_per_s={:.1f} gflops={:.2f}", r->median_ms,
                                     r->tokens_per_s, r->gflops);
    if (r->gemm_peak_gflops > 0) result += fmt::format(" gemm_peak_gflops={:.2f}", r->gemm_peak_gflops);
    if (r->device == "cuda") {
      result += fmt::format(" mfu={:.4f} mfu_with_attention={:.4f} device_used_gb={:.2f}", r->mfu,
                            r->mfu_with_attention, r->device_used_gb);
    }
    fmt::print("{}\n", result);
    return 0;
  }
  return 2;
}

}  // namespace tf
