#include "engine/cli/checkpoint_cli.h"

#include <fmt/format.h>

#include "base/format.h"
#include "base/json.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/object_store.h"
#include "checkpoint/s3_store.h"
#include "engine/weights_card.h"
#include "model/gpt2_weights.h"

namespace tf {

struct CheckpointCommands {
  CLI::App* group = nullptr;
  CLI::App *list = nullptr, *inspect = nullptr, *verify = nullptr, *exp = nullptr;
  std::string dir, out, dtype = "fp32";
  int64_t step = -1;  // -1: the newest (inspect) or all (verify)
};

namespace {

using checkpoint::Listed;
using checkpoint::Manifest;

uint64_t TotalBytes(const Manifest& m) {
  uint64_t n = 0;
  for (const auto& o : m.objects) n += o.bytes;
  return n;
}
// Bytes this checkpoint stored itself (an incremental one also lists objects of earlier ones).
uint64_t OwnBytes(const Manifest& m) {
  uint64_t n = 0;
  const std::string prefix = checkpoint::CheckpointPrefix(m.step) + "/";
  for (const auto& o : m.objects) n += o.key.starts_with(prefix) ? o.bytes : 0;
  return n;
}
uint64_t StateBytes(const Manifest& m) {
  uint64_t n = 0;
  for (const auto& t : m.tensors) n += static_cast<uint64_t>(t.elements) * 4;
  return n;
}
std::string DependsOn(const Manifest& m) {
  std::string out;
  for (int64_t d : checkpoint::Dependencies(m)) {
    if (d != m.step) out += fmt::format("{}{}", out.empty() ? "" : ",", d);
  }
  return out.empty() ? "-" : out;
}

StatusOr<Listed> Find(const std::vector<Listed>& all, int64_t step, const std::string& where) {
  for (const Listed& l : all) {
    if (l.step == step) return l;
  }
  return Status::NotFound("{}: no checkpoint of step {}", where, step);
}

}  // namespace

std::shared_ptr<CheckpointCommands> AddCheckpointCommands(CLI::App& app) {
  auto c = std::make_shared<CheckpointCommands>();
  c->group = app.add_subcommand("checkpoint", "List, inspect, verify and export the checkpoints in a directory");
  // At most one subcommand; a missing or unknown one is named by RunCheckpointCommand.
  c->group->require_subcommand(0, 1);
  c->group->allow_extras();
  c->list = c->group->add_subcommand("list", "Each checkpoint: step, time, kind, size, and whether its manifest is valid");
  c->inspect = c->group->add_subcommand("inspect", "Print a checkpoint's manifest (default: the newest valid one)");
  c->verify = c->group->add_subcommand("verify", "Read every object and check its size and checksum (default: all)");
  c->exp = c->group->add_subcommand(
      "export", "Write a checkpoint's weights as Hugging Face GPT-2 files (model.safetensors + config.json)");
  for (CLI::App* sub : {c->list, c->inspect, c->verify, c->exp}) {
    sub->add_option("DIR", c->dir, "Checkpoint directory or s3://bucket/prefix")->required();
  }
  c->exp->add_option("--out", c->out, "Output directory")->required();
  c->exp->add_option("--dtype", c->dtype, "fp32, fp16 or bf16")->capture_default_str();
  for (CLI::App* sub : {c->inspect, c->verify, c->exp}) {
    sub->add_option("--step", c->step, "The checkpoint of this step")->check(CLI::Range(int64_t{0}, INT64_MAX));
  }
  return c;
}

bool CheckpointCommandParsed(const CheckpointCommands& c) { return c.group->parsed(); }

Status RunCheckpointCommand(const CheckpointCommands& c) {
  const std::vector<std::string> extra = c.group->remaining(/*recurse=*/true);
  if (c.group->get_subcommands().empty()) {
    std::string names;
    for (const CLI::App* sub : {c.list, c.inspect, c.verify, c.exp}) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (extra.empty()) return Status::InvalidArgument("checkpoint: a subcommand is required ({})", names);
    return Status::InvalidArgument("checkpoint: unknown subcommand '{}' (subcommands: {}; see trainflow checkpoint "
                                   "--help)",
                                   QuoteForMessage(extra.front()), names);
  }
  if (!extra.empty()) {
    const std::string sub = c.group->get_subcommands().front()->get_name();
    return Status::InvalidArgument("checkpoint {}: unexpected argument '{}' (see trainflow checkpoint {} --help)", sub,
                                   QuoteForMessage(extra.front()), sub);
  }
  // Reading only: a directory that does not exist is an error, not created.
  TF_RETURN_IF_ERROR(checkpoint::CheckLocation(c.dir));
  if (!checkpoint::IsS3Url(c.dir)) {
    TF_ASSIGN_OR_RETURN(const FileInfo info, Env::Default()->Stat(c.dir));
    if (!info.exists) return Status::NotFound("{}: no such checkpoint directory", c.dir);
    if (!info.is_directory) return Status::InvalidArgument("{}: not a directory", c.dir);
  }
  TF_ASSIGN_OR_RETURN(auto store, checkpoint::OpenStore(c.dir));
  TF_ASSIGN_OR_RETURN(const std::vector<Listed> all, checkpoint::ListCheckpoints(*store));

  if (c.list->parsed()) {
    if (all.empty()) {
      fmt::print("{}: no checkpoints\n", c.dir);
      return Status::OK();
    }
    fmt::print("{:>12}  {:<20}  {:<11}  {:>5}  {:>7}  {:>10}  {:>10}  {:<10}  {}\n", "step", "created", "kind", "ranks",
               "objects", "state", "stored", "depends", "manifest");
    for (const Listed& l : all) {
      if (l.manifest) {
        const Manifest& m = *l.manifest;
        fmt::print("{:>12}  {:<20}  {:<11}  {:>5}  {:>7}  {:>10}  {:>10}  {:<10}  valid (objects unverified: `verify` "
                   "reads them)\n",
                   l.step, m.created, m.kind, m.world, m.objects.size(), FormatBytes(StateBytes(m)), FormatBytes(OwnBytes(m)),
                   DependsOn(m));
      } else {
        const char* what = checkpoint::IsUncommitted(l)            ? "uncommitted"
                           : checkpoint::IsNewerFormat(l.problem) ? "newer format"
                                                                  : "invalid";
        fmt::print("{:>12}  {:<20}  {:<11}  {:>5}  {:>7}  {:>10}  {:>10}  {:<10}  {}: {}\n", l.step, "-", "-", "-",
                   "-", "-", "-", "-", what, l.problem.message());
      }
    }
    return Status::OK();
  }

  if (c.exp->parsed()) {
    SafetensorsDtype dt;
    if (c.dtype == "fp32" || c.dtype == "f32") dt = SafetensorsDtype::kF32;
    else if (c.dtype == "fp16" || c.dtype == "f16") dt = SafetensorsDtype::kF16;
    else if (c.dtype == "bf16") dt = SafetensorsDtype::kBF16;
    else return Status::InvalidArgument("--dtype must be fp32, fp16 or bf16, got '{}'", c.dtype);
    const Manifest* m = nullptr;
    for (auto it = all.rbegin(); it != all.rend() && m == nullptr; ++it) {
      if (c.step >= 0 && it->step != c.step) continue;
      if (!it->manifest) {
        if (c.step >= 0) return it->problem;
        continue;
      }
      m = &*it->manifest;
    }
    if (m == nullptr) {
      return c.step >= 0 ? Status::NotFound("{}: no checkpoint of step {}", c.dir, c.step)
                         : Status::NotFound("{}: no checkpoint with a valid manifest", c.dir);
    }
    const std::string where = fmt::format("{}/{}", store->location(), checkpoint::CheckpointPrefix(m->step));
    if (!m->state.contains("weights_card") || !m->state["weights_card"].is_object()) {
      return Status::Corruption("{}: the manifest's state has no weights card", where);
    }
    std::map<std::string, std::string> meta;
    for (const auto& [k, v] : m->state["weights_card"].items()) {
      if (!v.is_string()) return Status::Corruption("{}: weights card entry '{}' is not a string", where, k);
      meta[k] = v.get<std::string>();
    }
    TF_ASSIGN_OR_RETURN(const WeightsCard card, WeightsCardFromMetadata(meta, where));
    if (!card.model) return Status::Corruption("{}: the weights card has no model config", where);
    const checkpoint::TensorEntry* params = m->FindTensor("params");
    if (params == nullptr) return Status::Corruption("{}: no tensor 'params'", where);
    std::vector<float> values(static_cast<size_t>(params->elements));
    TF_RETURN_IF_ERROR(checkpoint::ReadTensorRange(*store, *m, "params", 0, params->elements, values));
    TF_RETURN_IF_ERROR(Env::Default()->CheckWritableDir(c.out));
    const std::string path = c.out + "/model.safetensors";
    TF_RETURN_IF_ERROR(ExportHFWeights(path, *card.model, values, card.ToMetadata(), dt));
    TF_RETURN_IF_ERROR(
        Env::Default()->WriteFileAtomically(c.out + "/config.json", HFConfigJson(*card.model, card.tokenizer, dt)));
    fmt::print("checkpoint export: wrote {} (step {}, {}) and config.json\n", path, m->step, c.dtype);
    return Status::OK();
  }

  if (c.inspect->parsed()) {
    if (c.step >= 0) {
      TF_ASSIGN_OR_RETURN(const Listed l, Find(all, c.step, c.dir));
      if (!l.manifest) return l.problem;
      fmt::print("{}", checkpoint::SerializeManifest(*l.manifest));
      return Status::OK();
    }
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->manifest) {
        fmt::print("{}", checkpoint::SerializeManifest(*it->manifest));
        return Status::OK();
      }
    }
    return Status::NotFound("{}: no checkpoint with a valid manifest", c.dir);
  }

  // verify
  std::vector<Listed> chosen;
  if (c.step >= 0) {
    TF_ASSIGN_OR_RETURN(Listed l, Find(all, c.step, c.dir));
    chosen.push_back(std::move(l));
  } else {
    chosen = all;
  }
  if (chosen.empty()) return Status::NotFound("{}: no checkpoints", c.dir);
  int bad = 0, uncommitted = 0;
  Status first_problem;
  for (const Listed& l : chosen) {
    // Leftovers of an interrupted write are not damage, unless that very step was asked for.
    if (checkpoint::IsUncommitted(l) && c.step < 0) {
      fmt::print("step {}: uncommitted, not a checkpoint: {}\n", l.step, l.problem.message());
      ++uncommitted;
      continue;
    }
    Status s = l.problem;
    if (s.ok()) s = checkpoint::VerifyCheckpoint(*store, *l.manifest);
    if (s.ok()) {
      fmt::print("step {}: ok ({} objects, {}, checksums match)\n", l.step, l.manifest->objects.size(),
                 FormatBytes(TotalBytes(*l.manifest)));
    } else {
      fmt::print("step {}: FAILED: {}\n", l.step, s.message());
      if (bad++ == 0) first_problem = s;
    }
  }
  const size_t committed = chosen.size() - static_cast<size_t>(uncommitted);
  if (committed == 0) return Status::NotFound("{}: no committed checkpoints", c.dir);
  if (bad == 0) return Status::OK();
  return Status(first_problem.code(), fmt::format("{} of {} checkpoint{} in {} failed verification (first: {})", bad,
                                                  committed, committed == 1 ? "" : "s", c.dir,
                                                  first_problem.message()));
}

}  // namespace tf
