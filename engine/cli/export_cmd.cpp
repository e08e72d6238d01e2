// `trainflow export`: Hugging Face GPT-2 files (model.safetensors + config.json) from weights, or
// from a freshly initialised model.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/env.h"
#include "base/json.h"
#include "engine/cli/command.h"
#include "engine/weights_card.h"
#include "model/gpt2.h"
#include "model/gpt2_weights.h"
#include "model/safetensors.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

struct ExportArgs {
  std::string weights, model_path, out_dir, dtype = "fp32";
  uint64_t init_seed = 0;
  bool init = false;  // a freshly initialised model instead of weights
};

int CmdExport(const ExportArgs& a) {
  if (a.init == !a.weights.empty()) return Fail(Status::InvalidArgument("export: give exactly one of --weights and --init"));
  SafetensorsDtype dt;
  if (a.dtype == "fp32" || a.dtype == "f32") dt = SafetensorsDtype::kF32;
  else if (a.dtype == "fp16" || a.dtype == "f16") dt = SafetensorsDtype::kF16;
  else if (a.dtype == "bf16") dt = SafetensorsDtype::kBF16;
  else return Fail(Status::InvalidArgument("--dtype must be fp32, fp16 or bf16, got '{}'", QuoteForMessage(a.dtype)));
  std::unique_ptr<GPT2> model;
  WeightsCard card;
  if (a.init) {
    if (a.model_path.empty()) return Fail(Status::InvalidArgument("export --init needs --model"));
    auto config = LoadModelConfig(a.model_path);
    if (!config.ok()) return Fail(config.status());
    auto m = GPT2::Create(*config, 1, 1);
    if (!m.ok()) return Fail(m.status());
    model = std::move(*m);
    model->InitWeights(a.init_seed);
  } else {
    auto c = ReadWeightsCard(a.weights);  // carried over: tokenizer, trained length, training config
    if (!c.ok()) return Fail(c.status());
    card = std::move(*c);
    auto m = LoadModel(a.model_path, a.weights, 1, 1);
    if (!m.ok()) return Fail(m.status());
    model = std::move(*m);
  }
  if (Status s = Env::Default()->CheckWritableDir(a.out_dir); !s.ok()) return Fail(s);
  const GPT2Config& c = model->config();
  card.model = c;
  const std::string path = (fs::path(a.out_dir) / "model.safetensors").string();
  Status s = ExportHFWeights(path, c, model->params(), card.ToMetadata(), dt);
  if (!s.ok()) return Fail(s);
  if (Status w = Env::Default()->WriteFileAtomically(a.out_dir + "/config.json", HFConfigJson(c, card.tokenizer, dt));
      !w.ok()) {
    return Fail(w);
  }
  fmt::print("export: wrote {} ({}) and config.json\n", path, dt == SafetensorsDtype::kF32   ? "fp32"
                                                              : dt == SafetensorsDtype::kF16 ? "fp16"
                                                                                             : "bf16");
  return 0;
}

}  // namespace

Command AddExportCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Write Hugging Face GPT-2 files (model.safetensors + config.json)");
  auto a = std::make_shared<ExportArgs>();
  cmd->add_option("--weights", a->weights, "Weights to export (any safetensors with GPT-2 names)");
  cmd->add_option("--model", a->model_path, "Model config (required with --init)");
  cmd->add_flag("--init", a->init, "Export a freshly initialised model instead of --weights");
  cmd->add_option("--seed", a->init_seed, "Seed for --init")->check(SeedValidator())->capture_default_str();
  cmd->add_option("--out", a->out_dir, "Output directory")->required();
  cmd->add_option("--dtype", a->dtype, "fp32, fp16 or bf16 (as train's --dtype; f32 and f16 are accepted too)")
      ->capture_default_str();
  return {[cmd] { return cmd->parsed(); }, [a] { return CmdExport(*a); }};
}

}  // namespace tf
