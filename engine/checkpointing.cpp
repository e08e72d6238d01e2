#include "engine/checkpointing.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/clock.h"
#include "base/format.h"
#include "base/huge_pages.h"
#include "base/progress.h"
#include "comm/codec.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "engine/trainer.h"

namespace tf {
namespace {

using json = nlohmann::json;
using checkpoint::Checkpointer;
using checkpoint::Manifest;
using checkpoint::ObjectStore;

// The tag of the rescue writer's object names ("step-N/rescue.params.000000", "part-rescue-r00000.json").
constexpr char kRescueTag[] = "rescue";

std::string ResidualName(const char* which, int rank) { return fmt::format("ef.{}.r{}", which, rank); }

json StateJson(const TrainState& s, int64_t rows_per_step, int64_t nr, int64_t ns) {
  return {{"step", s.step},
          {"data_rows", s.data_rows},
          {"rows_per_step", rows_per_step},
          {"data_seed", s.data_seed},
          {"data_shuffle", s.data_shuffle},
          {"data_fingerprint", s.data_fingerprint},
          {"sample_seed", s.sample_seed},
          {"codec", s.codec},
          {"residual_elements", {nr, ns}},
          {"world", s.world},
          {"model_config", json::parse(s.model_config)},
          {"train_config", json::parse(s.train_config)},
          {"model_fingerprint", s.model_fingerprint},
          {"train_fingerprint", s.train_fingerprint},
          {"version", s.version},
          {checkpoint::kStateRunId, s.run_id},
          {"threads", s.threads}};
}

// The manifest's state back into a TrainState (no tensors); Corruption naming what is wrong.
StatusOr<TrainState> StateFromJson(const json& j, const std::string& where) {
  TrainState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.data_rows = j.at("data_rows").get<int64_t>();
    s.data_seed = j.at("data_seed").get<uint64_t>();
    s.data_shuffle = j.at("data_shuffle").get<bool>();
    s.data_fingerprint = j.at("data_fingerprint").get<std::string>();
    s.sample_seed = j.at("sample_seed").get<uint64_t>();
    s.codec = j.at("codec").get<std::string>();
    s.world = j.at("world").get<int>();
    s.model_config = j.at("model_config").dump();
    s.train_config = j.at("train_config").dump();
    s.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    s.train_fingerprint = j.at("train_fingerprint").get<std::string>();
    s.version = j.at("version").get<std::string>();
    s.run_id = j.value(checkpoint::kStateRunId, std::string());
    s.threads = j.value("threads", 0);
  } catch (const json::exception& e) {
    return Status::Corruption("{}: the manifest's state is incomplete or mistyped ({})", where, e.what());
  }
  if (s.step < 0 || s.data_rows < 0 || s.world < 1) {
    return Status::Corruption("{}: the manifest's state has step {}, {} data rows, world {}", where, s.step,
                              s.data_rows, s.world);
  }
  if (Fingerprint(s.model_config) != s.model_fingerprint || Fingerprint(s.train_config) != s.train_fingerprint) {
    return Status::Corruption("{}: the configs in the manifest do not match their fingerprints", where);
  }
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<TrainCheckpointing>> TrainCheckpointing::Create(Trainer& t) {
  const TrainConfig& c = t.config();
  if (c.checkpoint_dir.empty()) return std::unique_ptr<TrainCheckpointing>();
  std::unique_ptr<TrainCheckpointing> tc(new TrainCheckpointing(t));
  TF_ASSIGN_OR_RETURN(auto store, checkpoint::OpenStore(c.checkpoint_dir, t.env()));
  const comm::Topology& topo = t.topology();
  const int64_t P = t.backend().layout().total();
  std::vector<checkpoint::StateTensor> tensors = {{"params", P, -1}, {"adam.m", P, -1}, {"adam.v", P, -1}};
  const auto [nr, ns] = t.gradient_sync().state_sizes();
  for (int r = 0; r < topo.world; ++r) {
    if (nr > 0) tensors.push_back({ResidualName("residual", r), nr, r});
    if (ns > 0) tensors.push_back({ResidualName("server", r), ns, r});
  }
  checkpoint::CheckpointerOptions o;
  o.rank = topo.rank;
  o.world = topo.world;
  // Each rank writes the range the shard plan gives it: its shard under ZeRO, the same range at
  // stage 0. With replica groups the plan is over one group, so only group 0 (ranks below its size)
  // gets chunks; the other ranks write empty parts (the commit waits for every rank's).
  o.chunk_elements = std::max<int64_t>(1, t.shard_plan().chunk_elements);
  o.chunks_per_rank = t.shard_plan().chunks_per_rank;
  o.wait_when_busy = c.checkpoint_when_busy == "wait";
  o.compress = c.checkpoint_compress;
  o.idle_priority = c.checkpoint_writer_priority == "idle";
  // Object stores answer each request after a round trip: several chunks in flight. A local or
  // shared file system gets one writer (it competes with training for the cores).
  o.writer_threads = c.checkpoint_dir.starts_with("s3://") ? 4 : 1;
  o.full_every = c.checkpoint_full_every;
  o.keep_last = c.checkpoint_keep_last;
  o.keep_every_steps = c.checkpoint_keep_every;
  o.code_version = t.StateMeta().version;
  o.run_id = t.run_id();
  TrainBackend* backend = &t.backend();
  o.allocate = [backend](size_t n) { return backend->AllocateHost(n); };
  o.release = [backend](float* p) { backend->FreeHost(p); };
  TF_ASSIGN_OR_RETURN(tc->ckpt_, Checkpointer::Create(std::move(store), std::move(tensors), std::move(o)));
  tc->last_time_ = MonotonicSeconds();
  // A run resumed from this directory at its last step has that checkpoint already.
  if (t.resumed_checkpoint_step() >= 0) tc->last_begun_ = t.resumed_checkpoint_step();
  return tc;
}

void TrainCheckpointing::Contribute(double* slots) {
  const TrainConfig& c = trainer_.config();
  const bool rank0 = trainer_.topology().rank == 0;
  slots[0] = rank0 && c.checkpoint_every_s > 0 && MonotonicSeconds() - last_time_ >= c.checkpoint_every_s ? 1.0 : 0.0;
  slots[1] = ckpt_->busy() ? 1.0 : 0.0;
  slots[2] = !uncommitted_.empty() && ckpt_->PartFinished(uncommitted_.front()) ? 1.0 : 0.0;
}

Status TrainCheckpointing::AfterStep(const double* reduced, StepStats& stats) {
  const comm::Topology& topo = trainer_.topology();
  const TrainConfig& c = trainer_.config();
  const int W = topo.world;
  if (W > 1) {
    if (!uncommitted_.empty() && static_cast<int>(reduced[2] + 0.5) == W) {
      if (topo.rank == 0) ckpt_->RequestCommit(uncommitted_.front());
      uncommitted_.pop_front();
    }
  }
  if (topo.rank == 0) SetCommittedCheckpoint(ckpt_->stats().last_committed_step);
  if (topo.rank == 0 && trainer_.options().print_progress) {
    const checkpoint::CheckpointerStats s = ckpt_->stats();
    if (s.written > reported_) {
      reported_ = s.written;
      fmt::print("checkpoint step {} committed to {} ({} of state, {} stored; rank 0's part written in {:.2f} s)\n",
                 s.last_committed_step, ckpt_->store().location(), FormatBytes(s.committed_raw_bytes),
                 FormatBytes(s.committed_new_bytes), s.last_write_s);
      std::fflush(stdout);
    }
  }
  if (stats.last || stats.stopping) return Status::OK();  // Finish writes the final one
  const bool due = (c.checkpoint_interval > 0 && stats.step % c.checkpoint_interval == 0) || reduced[0] > 0;
  if (!due) return Status::OK();
  if (reduced[1] > 0 && c.checkpoint_when_busy == "skip") {
    // Said the first time and then every 100th, with the count.
    if (topo.rank == 0 && skipped_++ % 100 == 0) {
      spdlog::warn("checkpoint at step {} skipped ({} so far): the two before it are still being written (storage "
                   "slower than the checkpoint interval; checkpoint_when_busy \"wait\" waits instead)",
                   stats.step, skipped_);
    }
    return Status::OK();
  }
  return Take(stats.step, &stats.checkpoint_stall_ms);
}

Status TrainCheckpointing::Take(int64_t step, double* stall_ms, bool always) {
  SetPhase(Phase::kCheckpoint);
  const double t0 = MonotonicSeconds();
  Checkpointer::Snapshot* snap = ckpt_->Begin(step, always);
  if (snap == nullptr) return Status::OK();  // skipped (counted); ranks agreed it would not be
  TrainBackend& backend = trainer_.backend();
  std::vector<float> residual, server;
  bool have_residuals = false;
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t begin = 0, end = 0;
  for (const Checkpointer::Slot& slot : snap->slots) {
    const std::string& name = slot.tensor->name;
    if (name == "params" || name == "adam.m" || name == "adam.v") {
      (name == "params" ? params : name == "adam.m" ? m : v) = slot.data.data();
      begin = slot.begin;
      end = slot.end;
      continue;
    }
    if (!have_residuals) {
      TF_RETURN_IF_ERROR(trainer_.gradient_sync().GetState(&residual, &server));
      have_residuals = true;
    }
    const std::vector<float>& src = name.starts_with("ef.residual.") ? residual : server;
    if (src.size() != slot.data.size()) return Status::Internal("residual '{}' changed size", name);
    std::copy(src.begin(), src.end(), slot.data.begin());
  }
  if (params == nullptr || m == nullptr || v == nullptr) return Status::Internal("checkpoint without the state slots");
  TF_RETURN_IF_ERROR(backend.SnapshotState(begin, end, params, m, v));
  TrainState meta = trainer_.StateMeta();
  const auto [nr, ns] = trainer_.gradient_sync().state_sizes();
  json state = StateJson(meta, trainer_.rows_per_step(), nr, ns);
  state["weights_card"] = trainer_.Card().ToMetadata();  // for `trainflow checkpoint export`
  ckpt_->Submit(snap, std::move(state), [&backend] { return backend.WaitSnapshot(); });
  if (trainer_.topology().world > 1) uncommitted_.push_back(step);
  // The synchronous baseline: this rank's part is written (and, alone, committed) before going on.
  if (!trainer_.config().checkpoint_async) (void)ckpt_->Flush();
  last_begun_ = step;
  last_time_ = MonotonicSeconds();
  if (stall_ms != nullptr) *stall_ms = (last_time_ - t0) * 1000.0;
  return Status::OK();
}

StatusOr<std::string> StateHash(Trainer& trainer) {
  TF_ASSIGN_OR_RETURN(TrainState s, trainer.GetState());
  XXH64_state_t* h = XXH64_createState();
  if (h == nullptr) return Status::Internal("XXH64_createState failed");
  XXH64_reset(h, 0);
  for (const std::vector<float>* v : {&s.params, &s.adam_m, &s.adam_v}) {
    XXH64_update(h, v->data(), v->size() * sizeof(float));
  }
  const int64_t position[4] = {s.step, s.data_rows, 0, 0};  // 32 bytes: xxhash reads in 32-byte stripes
  XXH64_update(h, position, sizeof(position));
  const uint64_t d = XXH64_digest(h);
  XXH64_freeState(h);
  return fmt::format("{:016x}", d);
}

StatusOr<TrainCheckpointing::Rescue> TrainCheckpointing::RescueWrite() {
  SetPhase(Phase::kRescue);
  const int64_t step = trainer_.step();
  const auto [nr, ns] = trainer_.gradient_sync().state_sizes();
  if (nr > 0 || ns > 0) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("the state of step {} is not rescued: codec {} keeps error-feedback residuals, which "
                              "the failed reduction may have half updated",
                              step, trainer_.compression()));
  }
  if (trainer_.backend().collective_state()) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("the state of step {} is not rescued: under zero_stage {} no rank holds all of it",
                              step, trainer_.config().zero_stage));
  }
  Rescue r;
  r.step = step;
  TF_ASSIGN_OR_RETURN(r.hash, StateHash(trainer_));
  // This rank's checkpoint writes in flight finish first (a commit queued before the failure too).
  if (Status f = ckpt_->Flush(); !f.ok()) spdlog::warn("before the rescue: {}", f.ToString());
  if (ckpt_->stats().last_committed_step == step || trainer_.resumed_checkpoint_step() == step) {
    r.already = true;
    return r;
  }
  if (auto m = checkpoint::ReadManifest(ckpt_->store(), step); m.ok()) {
    r.already = true;
    return r;
  }
  const checkpoint::CheckpointerOptions& regular = ckpt_->options();
  checkpoint::CheckpointerOptions o;
  o.rank = 0;
  o.world = 1;
  o.chunk_elements = regular.chunk_elements;
  o.compress = regular.compress;
  o.writer_threads = regular.writer_threads;
  o.code_version = regular.code_version;
  o.key_tag = kRescueTag;
  o.manual_commit = true;
  o.buffers = 1;
  const int64_t P = trainer_.backend().layout().total();
  std::vector<checkpoint::StateTensor> tensors = {{"params", P, -1}, {"adam.m", P, -1}, {"adam.v", P, -1}};
  TF_ASSIGN_OR_RETURN(auto store, checkpoint::OpenStore(trainer_.config().checkpoint_dir, trainer_.env()));
  TF_ASSIGN_OR_RETURN(rescue_, Checkpointer::Create(std::move(store), std::move(tensors), std::move(o)));
  Checkpointer::Snapshot* snap = rescue_->Begin(step, /*always=*/true);
  float* ptr[3] = {};
  for (const Checkpointer::Slot& slot : snap->slots) {
    const std::string& name = slot.tensor->name;
    ptr[name == "params" ? 0 : name == "adam.m" ? 1 : 2] = slot.data.data();
  }
  TrainBackend& backend = trainer_.backend();
  TF_RETURN_IF_ERROR(backend.SnapshotState(0, P, ptr[0], ptr[1], ptr[2]));
  TF_RETURN_IF_ERROR(backend.WaitSnapshot());
  json state = StateJson(trainer_.StateMeta(), trainer_.rows_per_step(), 0, 0);
  state["weights_card"] = trainer_.Card().ToMetadata();
  state["rescued"] = true;
  rescue_->Submit(snap, std::move(state));
  TF_RETURN_IF_ERROR(rescue_->Flush().WithContext(fmt::format("writing the rescue checkpoint of step {}", step)));
  rescue_step_ = step;
  rescue_committed_ = false;
  return r;
}

Status TrainCheckpointing::RescueCommit() {
  if (!rescue_ || rescue_step_ < 0) return Status::Internal("RescueCommit without RescueWrite");
  TF_RETURN_IF_ERROR(rescue_->CommitNow(rescue_step_));
  rescue_committed_ = true;
  SetCommittedCheckpoint(rescue_step_);
  return Status::OK();
}

Status TrainCheckpointing::RescueDiscard() {
  if (!rescue_ || rescue_step_ < 0) return Status::OK();
  if (rescue_committed_) {
    return Status::Internal("the rescue checkpoint of step {} is committed; it is not discarded", rescue_step_);
  }
  const int64_t step = rescue_step_;
  rescue_step_ = -1;  // whatever happens below, it is never committed
  ObjectStore& store = rescue_->store();
  // The part list first: without it the chunks are never read, even if deleting them fails.
  Status s = store.Delete(checkpoint::PartKey(step, 0, kRescueTag));
  if (s.ok()) {
    StatusOr<std::vector<std::string>> keys =
        store.List(fmt::format("{}/{}.", checkpoint::CheckpointPrefix(step), kRescueTag));
    s = keys.status();
    for (size_t i = 0; s.ok() && keys.ok() && i < keys->size(); ++i) s = store.Delete((*keys)[i]);
  }
  rescue_.reset();
  return s.WithContext(fmt::format("discarding the rescue checkpoint of step {}", step));
}

Status TrainCheckpointing::CommitPending() {
  SetPhase(Phase::kCheckpoint);
  Status mine = ckpt_->Flush();
  if (!mine.ok()) spdlog::error("checkpoint write failed: {}", mine.ToString());
  if (trainer_.topology().world > 1) {
    TF_RETURN_IF_ERROR(trainer_.Barrier("writing the pending checkpoints"));
    if (trainer_.topology().rank == 0) {
      for (int64_t s : uncommitted_) {
        if (Status c = ckpt_->CommitNow(s); !c.ok()) {
          spdlog::error("checkpoint of step {} not committed: {}", s, c.ToString());
        }
      }
    }
    uncommitted_.clear();
    // Every rank sees the commits before it lists the checkpoints.
    TF_RETURN_IF_ERROR(trainer_.Barrier("committing the pending checkpoints"));
  }
  return Status::OK();
}

StatusOr<bool> TrainCheckpointing::Finish(int64_t step) {
  const comm::Topology& topo = trainer_.topology();
  // Resumed at the last step and nothing trained: the checkpoint it resumed from is the final one.
  if (step == trainer_.resumed_checkpoint_step() && ckpt_->stats().started == 0) return true;
  if (last_begun_ != step) {
    // The final checkpoint is always taken: it waits for a free half whatever the policy.
    TF_RETURN_IF_ERROR(Take(step, nullptr, /*always=*/true));
  }
  Status mine = ckpt_->Flush();
  if (topo.world > 1) {
    // Every rank's parts are written (or failed) before rank 0 commits.
    TF_RETURN_IF_ERROR(trainer_.Barrier(fmt::format("writing the checkpoint of step {}", step)));
    if (topo.rank == 0) {
      Status last;
      for (int64_t s : uncommitted_) {
        last = ckpt_->CommitNow(s);
        if (!last.ok()) spdlog::error("checkpoint of step {} not committed: {}", s, last.ToString());
      }
      mine = uncommitted_.empty() ? mine : last;
    }
    uncommitted_.clear();
  }
  const checkpoint::CheckpointerStats s = ckpt_->stats();
  const bool committed = s.last_committed_step == step;
  if (topo.rank == 0) SetCommittedCheckpoint(s.last_committed_step);
  if (topo.rank == 0 && trainer_.options().print_progress) {
    if (committed) {
      fmt::print("checkpoint step {} committed to {} ({} of state, {} stored; rank 0's part written in {:.2f} s; {} "
                 "checkpoint{} written, {} failed, {} skipped)\n",
                 step, ckpt_->store().location(), FormatBytes(s.committed_raw_bytes),
                 FormatBytes(s.committed_new_bytes), s.last_write_s, s.written,
                 s.written == 1 ? "" : "s", s.failed, s.skipped + skipped_);
    } else {
      fmt::print("the final checkpoint (step {}) was not written: {}\n", step,
                 mine.ok() ? s.last_error : mine.ToString());
    }
    std::fflush(stdout);
  }
  return topo.rank == 0 ? committed : mine.ok();
}

namespace {

// Where `location` points: the store root and a step, or -1 for "the newest in the root".
struct Location {
  std::string root;
  int64_t step = -1;
};

Location ParseLocation(std::string loc) {
  while (loc.size() > 1 && loc.back() == '/') loc.pop_back();
  if (loc.ends_with(std::string("/") + checkpoint::kManifestName)) {
    loc.resize(loc.size() - std::string(checkpoint::kManifestName).size() - 1);
  }
  const size_t slash = loc.rfind('/');
  const std::string last = slash == std::string::npos ? loc : loc.substr(slash + 1);
  const int64_t step = checkpoint::StepOfKey(last);
  if (step >= 0 && last == checkpoint::CheckpointPrefix(step)) {
    return {slash == std::string::npos ? "." : loc.substr(0, slash), step};
  }
  return {loc, -1};
}

// Reads one checkpoint into a TrainState for this rank (verifying every object it reads).
StatusOr<TrainState> Load(Trainer& t, ObjectStore& store, const Manifest& m, std::string* notes) {
  const std::string where = fmt::format("{}/{}", store.location(), checkpoint::CheckpointPrefix(m.step));
  TF_ASSIGN_OR_RETURN(TrainState s, StateFromJson(m.state, where));
  if (s.step != m.step) return Status::Corruption("{}: the state says step {}", where, s.step);
  const int64_t P = t.backend().layout().total();
  const checkpoint::TensorEntry* pt = m.FindTensor("params");
  if (pt == nullptr || pt->elements != P) {
    return Status::InvalidArgument("{} holds {} parameters, this model has {} (model config {} there)", where,
                                   pt == nullptr ? 0 : pt->elements, P, s.model_config);
  }
  // A sharded run reads only what this rank keeps: its shard of the moments (and, at ZeRO stage 3,
  // of the parameters).
  int64_t b = 0, e = P;
  if (t.backend().collective_state()) {
    b = t.shard_plan().begin(t.shard_rank());
    e = t.shard_plan().end(t.shard_rank());
  }
  const bool params_sliced = t.backend().params_collective();
  s.slice_begin = b;
  for (std::vector<float>* v : {&s.params, &s.adam_m, &s.adam_v}) {
    const auto n = static_cast<size_t>(v == &s.params && !params_sliced ? P : e - b);
    v->reserve(n);
    AdviseHugePages(v->data(), n * sizeof(float));
    v->resize(n);
  }
  TF_RETURN_IF_ERROR(checkpoint::ReadTensorRange(store, m, "params", params_sliced ? b : 0, params_sliced ? e : P,
                                                 s.params));
  TF_RETURN_IF_ERROR(checkpoint::ReadTensorRange(store, m, "adam.m", b, e, s.adam_m));
  TF_RETURN_IF_ERROR(checkpoint::ReadTensorRange(store, m, "adam.v", b, e, s.adam_v));

  // Error-feedback residuals (policy in engine/checkpointing.h).
  const comm::Topology& topo = t.topology();
  const auto [nr, ns] = t.gradient_sync().state_sizes();
  const int old_world = s.world;
  t.NoteSummationOrder(old_world, s.threads);
  s.ef_residual.assign(static_cast<size_t>(nr), 0.0f);
  s.ef_server.assign(static_cast<size_t>(ns), 0.0f);
  const bool saved = m.FindTensor(ResidualName("residual", 0)) != nullptr || m.FindTensor(ResidualName("server", 0)) != nullptr;
  if (nr + ns > 0 && saved && s.codec != t.compression()) {
    *notes += fmt::format("; the error-feedback residuals of codec {} were dropped (this run uses {})", s.codec,
                          t.compression());
  } else if (nr + ns > 0 && saved) {
    auto read = [&](const char* which, int r, std::vector<float>& out) -> Status {
      const std::string name = ResidualName(which, r);
      const checkpoint::TensorEntry* e = m.FindTensor(name);
      if (e == nullptr) return Status::Corruption("{}: no tensor '{}' though rank {} of {} wrote it", where, name, r, old_world);
      if (e->elements != static_cast<int64_t>(out.size())) {
        return Status::Corruption("{}: '{}' has {} elements, this run's reducer keeps {}", where, name, e->elements, out.size());
      }
      return checkpoint::ReadTensorRange(store, m, name, 0, e->elements, out);
    };
    if (old_world == topo.world) {
      if (nr > 0) TF_RETURN_IF_ERROR(read("residual", topo.rank, s.ef_residual));
      if (ns > 0) TF_RETURN_IF_ERROR(read("server", topo.rank, s.ef_server));
    } else {
      std::vector<float> one;
      std::vector<double> sum_r(static_cast<size_t>(nr), 0.0), sum_s(static_cast<size_t>(ns), 0.0);
      for (int r = 0; r < old_world; ++r) {
        if (nr > 0) {
          one.assign(static_cast<size_t>(nr), 0.0f);
          TF_RETURN_IF_ERROR(read("residual", r, one));
          for (size_t i = 0; i < one.size(); ++i) sum_r[i] += one[i];
        }
        if (ns > 0) {
          one.assign(static_cast<size_t>(ns), 0.0f);
          TF_RETURN_IF_ERROR(read("server", r, one));
          for (size_t i = 0; i < one.size(); ++i) sum_s[i] += one[i];
        }
      }
      for (size_t i = 0; i < s.ef_residual.size(); ++i) s.ef_residual[i] = static_cast<float>(sum_r[i] / old_world);
      if (ns > 0) {
        // Keep this rank's shards of the summed server residual.
        TF_ASSIGN_OR_RETURN(const comm::CodecConfig codec, comm::ParseCodec(t.compression()));
        for (const comm::Bucket& b : t.gradient_sync().buckets()) {
          const auto [lo, hi] = comm::ShardOf(b, topo.rank, topo.world, codec);
          for (int64_t i = lo; i < hi; ++i) s.ef_server[static_cast<size_t>(i)] = static_cast<float>(sum_s[static_cast<size_t>(i)]);
        }
      }
      *notes += fmt::format("; error-feedback residuals of {} ranks redistributed to {}", old_world, topo.world);
    }
  }
  s.codec = t.compression();
  s.rank = topo.rank;
  s.world = topo.world;
  return s;
}

}  // namespace

StatusOr<std::string> ResumeFromCheckpoint(Trainer& t, int64_t* step, int64_t before_step, int64_t* loaded) {
  const TrainConfig& c = t.config();
  if (c.resume == "none") return std::string();
  const bool automatic = c.resume == "auto";
  if (automatic && c.checkpoint_dir.empty()) return std::string();
  const Location loc = automatic ? Location{c.checkpoint_dir, -1} : ParseLocation(c.resume);
  if (!automatic) {
    // An explicit location must exist: a typo must not start a fresh run.
    if (!loc.root.starts_with("s3://") && !t.env()->Stat(loc.root).ok()) {
      return Status::NotFound("resume: {} does not exist", c.resume);
    }
  }
  TF_ASSIGN_OR_RETURN(auto store, checkpoint::OpenStore(loc.root, t.env()));
  TF_ASSIGN_OR_RETURN(std::vector<checkpoint::Listed> all, checkpoint::ListCheckpoints(*store));
  if (before_step >= 0) std::erase_if(all, [&](const checkpoint::Listed& l) { return l.step >= before_step; });
  if (loc.step >= 0) {
    std::erase_if(all, [&](const checkpoint::Listed& l) { return l.step != loc.step; });
    if (all.empty()) {
      return Status::NotFound("resume: no checkpoint at {} ({} holds no checkpoint of step {})", c.resume, loc.root,
                              loc.step);
    }
  }
  const bool rank0 = t.topology().rank == 0 && t.options().print_progress;
  const double t0 = MonotonicSeconds();
  std::string skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Status problem = it->problem;
    std::string notes;
    if (problem.ok()) {
      auto state = Load(t, *store, *it->manifest, &notes);
      if (state.ok()) {
        // Every rank must resume the same checkpoint (a rank that saw a damaged object differs).
        if (t.topology().world > 1) {
          TF_RETURN_IF_ERROR(comm::CheckSameOnAllRanks(std::to_string(it->step), "resumed checkpoint step"));
        }
        const checkpoint::Manifest& m = *it->manifest;
        TF_RETURN_IF_ERROR(t.SetState(*state).WithContext(
            fmt::format("resuming from {}/{}", store->location(), checkpoint::CheckpointPrefix(m.step))));
        uint64_t bytes = 0;
        for (const auto& o : m.objects) bytes += o.bytes;
        // (Only a checkpoint of checkpoint_dir itself stands for this run's own.)
        if (store->location() == c.checkpoint_dir) *step = m.step;
        if (loaded != nullptr) *loaded = m.step;
        return fmt::format("resumed from {}/{} (step {}, written {} by {} rank{}, {} checkpoint; {} objects, {} "
                           "verified by xxh64; restored in {:.2f} s){}{}",
                           store->location(), checkpoint::CheckpointPrefix(m.step), m.step, m.created, m.world,
                           m.world == 1 ? "" : "s", m.kind, m.objects.size(), FormatBytes(bytes),
                           MonotonicSeconds() - t0, notes, skipped);
      }
      problem = state.status();
    }
    // Damaged or incomplete: fall back to an older one. Anything else (a config that does not fit,
    // storage that does not answer) is the user's to see, not a reason to go back in time.
    const StatusCode code = problem.code();
    if (!automatic || (code != StatusCode::kCorruption && code != StatusCode::kNotFound)) return problem;
    if (rank0) spdlog::warn("checkpoint step {} is not usable: {}; trying the previous one", it->step, problem.message());
    skipped += fmt::format("; skipped step {} ({})", it->step, problem.message());
  }
  if (!automatic) return Status::NotFound("resume: no usable checkpoint in {}", loc.root);
  if (!all.empty() && rank0) spdlog::warn("no usable checkpoint in {}: starting from step 0", store->location());
  return std::string();
}

}  // namespace tf
