// What the commands of `trainflow` (engine/cli/*_cmd.cpp) share: how a command is registered on
// the CLI11 app and run, the error report, the number checks of their flags, and loading configs
// and weights the way every command does. cli.cpp registers every command and runs the one parsed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace tf {

struct GPT2Config;
struct TrainConfig;
class GPT2;

// A registered command: whether the command line named it, and running it (the exit code). The
// flags it parses into live as long as the closures.
struct Command {
  std::function<bool()> parsed;
  std::function<int()> run;
};

// Each registers its subcommand (and its flags) on `app`; *_cmd.cpp of the same name.
Command AddTrainCommand(CLI::App& app);
Command AddPrepareCommand(CLI::App& app);
Command AddEvalCommand(CLI::App& app);
Command AddSampleCommand(CLI::App& app);
Command AddExportCommand(CLI::App& app);
Command AddReportCommand(CLI::App& app);
Command AddEnvCommand(CLI::App& app);
Command AddBenchCommand(CLI::App& app);

// Prints the error ("trainflow: error: <code>: <message>", docs/exit-codes.md) and returns the exit
// code its class maps to.
int Fail(const Status& s);

// A whole number in [lo, hi], named as such for anything else ("abc", "1.5", "-1"): CLI11's own
// messages for a non-number are "Value abc not in range" (and its NonNegativeNumber quotes a
// 300-digit range, an unsigned option wraps -1).
CLI::Validator WholeNumber(int64_t lo, int64_t hi);
// A finite number in [lo, hi] (CLI::Range lets NaN and inf through).
CLI::Validator FiniteRange(double lo, double hi);
// A seed: a whole number >= 0 that fits int64.
CLI::Validator SeedValidator();

// The help of --tokenizer-dir (prepare, sample).
extern const char* const kTokenizerDirHelp;

// Model config for a weights file: `model_path` if given, else the config TrainFlow stored in the
// file's metadata, else a Hugging Face config.json beside the file.
StatusOr<GPT2Config> ResolveModelConfig(const std::string& model_path, const std::string& weights_path);
// The model of ResolveModelConfig with the weights loaded, for batch B and length T (<= 0: block_size).
StatusOr<std::unique_ptr<GPT2>> LoadModel(const std::string& model_path, const std::string& weights, int B, int T);

// Model and training configs from files plus the "--key value" overrides in `extras` (paths in a
// file relative to its directory, on the command line to the current one). `adjust` edits the
// training JSON before the overrides apply; without `model_path`, `init_weights` supplies the model.
Status LoadConfigs(const std::string& model_path, const std::string& train_path,
                   const std::vector<std::string>& extras, const std::function<void(nlohmann::json*)>& adjust,
                   GPT2Config* model, TrainConfig* train, const std::string& init_weights = "");

}  // namespace tf
