#include "engine/checkpoint_cli.h"

#include <fmt/format.h>

#include "checkpoint/manifest.h"
#include "checkpoint/object_store.h"

namespace tf {

struct CheckpointCommands {
  CLI::App* group = nullptr;
  CLI::App *list = nullptr, *inspect = nullptr, *verify = nullptr;
  std::string dir;
  int64_t step = -1;  // -1: the newest (inspect) or all (verify)
};

namespace {

using checkpoint::Listed;
using checkpoint::Manifest;

std::string Bytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  if (n < (uint64_t{1} << 20)) return fmt::format("{:.1f} KiB", n / 1024.0);
  if (n < (uint64_t{1} << 30)) return fmt::format("{:.1f} MiB", n / double(1 << 20));
  return fmt::format("{:.2f} GiB", n / double(1 << 30));
}

uint64_t TotalBytes(const Manifest& m) {
  uint64_t n = 0;
  for (const auto& o : m.objects) n += o.bytes;
  return n;
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
  c->group = app.add_subcommand("checkpoint", "List, inspect and verify the checkpoints in a directory");
  c->group->require_subcommand(1);
  c->list = c->group->add_subcommand("list", "Each checkpoint: step, time, kind, size, and whether its manifest is valid");
  c->inspect = c->group->add_subcommand("inspect", "Print a checkpoint's manifest (default: the newest valid one)");
  c->verify = c->group->add_subcommand("verify", "Read every object and check its size and checksum (default: all)");
  for (CLI::App* sub : {c->list, c->inspect, c->verify}) {
    sub->add_option("DIR", c->dir, "Checkpoint directory")->required();
  }
  for (CLI::App* sub : {c->inspect, c->verify}) {
    sub->add_option("--step", c->step, "The checkpoint of this step")->check(CLI::Range(int64_t{0}, INT64_MAX));
  }
  return c;
}

bool CheckpointCommandParsed(const CheckpointCommands& c) { return c.group->parsed(); }

Status RunCheckpointCommand(const CheckpointCommands& c) {
  // Reading only: a directory that does not exist is an error, not created.
  TF_ASSIGN_OR_RETURN(const FileInfo info, Env::Default()->Stat(c.dir));
  if (!info.exists) return Status::NotFound("{}: no such checkpoint directory", c.dir);
  if (!info.is_directory) return Status::InvalidArgument("{}: not a directory", c.dir);
  TF_ASSIGN_OR_RETURN(auto store, checkpoint::OpenPosixStore(c.dir));
  TF_ASSIGN_OR_RETURN(const std::vector<Listed> all, checkpoint::ListCheckpoints(*store));

  if (c.list->parsed()) {
    if (all.empty()) {
      fmt::print("{}: no checkpoints\n", c.dir);
      return Status::OK();
    }
    fmt::print("{:>12}  {:<20}  {:<11}  {:>7}  {:>10}  {}\n", "step", "created", "kind", "objects", "size", "state");
    for (const Listed& l : all) {
      if (l.manifest) {
        const Manifest& m = *l.manifest;
        fmt::print("{:>12}  {:<20}  {:<11}  {:>7}  {:>10}  manifest valid (objects unverified: `verify` reads them)\n",
                   l.step, m.created, m.kind, m.objects.size(), Bytes(TotalBytes(m)));
      } else {
        fmt::print("{:>12}  {:<20}  {:<11}  {:>7}  {:>10}  invalid: {}\n", l.step, "-", "-", "-", "-", l.problem.message());
      }
    }
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
  int bad = 0;
  Status first_problem;
  for (const Listed& l : chosen) {
    Status s = l.problem;
    if (s.ok()) s = checkpoint::VerifyCheckpoint(*store, *l.manifest);
    if (s.ok()) {
      fmt::print("step {}: ok ({} objects, {}, checksums match)\n", l.step, l.manifest->objects.size(),
                 Bytes(TotalBytes(*l.manifest)));
    } else {
      fmt::print("step {}: FAILED: {}\n", l.step, s.message());
      if (bad++ == 0) first_problem = s;
    }
  }
  if (bad == 0) return Status::OK();
  return Status(first_problem.code(), fmt::format("{} of {} checkpoint{} in {} failed verification (first: {})", bad,
                                                  chosen.size(), chosen.size() == 1 ? "" : "s", c.dir,
                                                  first_problem.message()));
}

}  // namespace tf
