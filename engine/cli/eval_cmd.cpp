// `trainflow eval`: the mean loss of weights on a token file; every default is the training run
// the weights record (docs/data.md).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/env.h"
#include "base/json.h"
#include "engine/cli/command.h"
#include "engine/data/data_loader.h"
#include "engine/sharded_backend.h"
#include "engine/train_backend.h"
#include "engine/train_config.h"
#include "engine/trainer.h"
#include "engine/weights_card.h"
#include "model/gpt2_weights.h"

namespace tf {
namespace {

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
  auto backend = MakeTrainBackend(*config, tc, comm::Topology{}, TrainShardPlan(*config, tc, 1));
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

}  // namespace

Command AddEvalCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Mean loss of weights on a token file");
  auto ea = std::make_shared<EvalArgs>();
  cmd->add_option("--weights", ea->weights, "safetensors weights (Hugging Face GPT-2 names)")->required();
  cmd->add_option("--model", ea->model_path, "Model config (default: from the weights' metadata or config.json)");
  cmd->add_option("--data", ea->data, "Token file (default: the training run's val_data, recorded in the weights)");
  cmd->add_option("--batch-size", ea->batch, "Sequences per batch (default: the training run's, else 4)")
      ->check(WholeNumber(1, 1 << 16));
  cmd->add_option("--seq-len", ea->seq, "Sequence length (default: the trained one, else block_size)")
      ->check(WholeNumber(1, 1 << 20));
  cmd->add_option("--batches", ea->batches,
                   "N batches from the start of the file, or 'all': the whole file once (default: the training "
                   "run's evaluation, else all)");
  cmd->add_flag("--wrap", ea->wrap, "Allow --batches beyond the end of the file (it is read again from the start)");
  cmd->add_option("--device", ea->device, "auto (cuda when a GPU is visible), cpu or cuda; fp32 either way")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  return {[cmd] { return cmd->parsed(); }, [ea] { return CmdEval(*ea); }};
}

}  // namespace tf
