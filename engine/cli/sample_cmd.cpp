// `trainflow sample`: text from weights, with the run's tokenizer, temperature and top-k.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "engine/cli/command.h"
#include "engine/sampler.h"
#include "engine/train_config.h"
#include "engine/weights_card.h"
#include "model/gpt2.h"
#include "model/tokenizer.h"

namespace tf {
namespace {

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

Command AddSampleCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Generate text from weights");
  struct Args {
    SampleArgs sample;
    int64_t seed = 0;
    CLI::Option *temperature_opt = nullptr, *top_k_opt = nullptr;
  };
  auto a = std::make_shared<Args>();
  SampleArgs& sa = a->sample;
  a->seed = static_cast<int64_t>(sa.options.seed);
  cmd->add_option("--weights", sa.weights, "safetensors weights")->required();
  cmd->add_option("--model", sa.model_path, "Model config (default: from the weights' metadata or config.json)");
  cmd->add_option("--prompt", sa.prompt, "Prompt text (default: end-of-text, or a newline for byte)");
  cmd->add_option("--tokens", sa.options.num_tokens, "Tokens to generate")
      ->check(WholeNumber(0, 1 << 20))
      ->capture_default_str();
  a->temperature_opt = cmd->add_option("--temperature", sa.options.temperature,
                                       "Softmax temperature, 0 = greedy (default: the training run's "
                                       "sample_temperature, else 0.8)");
  a->top_k_opt = cmd->add_option("--top-k", sa.options.top_k,
                                 "Keep the k most likely tokens, 0 = all (default: the training run's "
                                 "sample_top_k, else 0)")
                     ->check(WholeNumber(0, 1 << 24));
  cmd->add_option("--seed", a->seed, "Sampling seed (>= 0)")->check(SeedValidator())->capture_default_str();
  cmd->add_option("--tokenizer", sa.tokenizer, "byte or gpt2 (default: the one the weights record)");
  cmd->add_option("--tokenizer-dir", sa.tokenizer_dir, kTokenizerDirHelp);
  return {[cmd] { return cmd->parsed(); },
          [a] {
            SampleArgs sa = a->sample;
            sa.options.seed = static_cast<uint64_t>(a->seed);
            sa.temperature_given = a->temperature_opt->count() > 0;
            sa.top_k_given = a->top_k_opt->count() > 0;
            return CmdSample(sa);
          }};
}

}  // namespace tf
