#include "engine/cli/command.h"

#include <charconv>
#include <filesystem>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/json.h"
#include "engine/train_config.h"
#include "engine/weights_card.h"
#include "model/gpt2.h"
#include "model/gpt2_weights.h"

namespace tf {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

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

}  // namespace

const char* const kTokenizerDirHelp =
    "Directory with GPT-2's encoder.json and vocab.bpe (default: $TRAINFLOW_TOKENIZER_DIR, else "
    "third_party/gpt2-tokenizer beside the binary's build/; docs/tokenizers.md)";

int Fail(const Status& s) {
  spdlog::error("{}", s.ToString());
  return ExitCodeFor(s.code());
}

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

CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi) {
          return fmt::format("'{}' is not a number in [{}, {}]", text, lo, hi);
        }
        return "";
      },
      fmt::format("FLOAT in [{} - {}]", lo, hi));
}

CLI::Validator SeedValidator() { return WholeNumber(0, INT64_MAX); }

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


Status LoadConfigs(const std::string& model_path, const std::string& train_path,
                   const std::vector<std::string>& extras, const std::function<void(json*)>& adjust,
                   GPT2Config* model, TrainConfig* train, const std::string& init_weights) {
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

}  // namespace tf
