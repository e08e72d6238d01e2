#include "checkpoint/checkpointer.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/huge_pages.h"
#include "base/parallel.h"
#include "base/progress.h"
#include "checkpoint/chunk_codec.h"

namespace tf::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string ChunkKey(int64_t step, const std::string& tag, const std::string& tensor, int64_t chunk) {
  return fmt::format("{}/{}{}.{:06d}", CheckpointPrefix(step), tag.empty() ? "" : tag + ".", tensor, chunk);
}

}  // namespace

std::pair<int64_t, int64_t> OwnedChunks(int64_t chunks, int rank, int world) {
  const int64_t base = chunks / world, extra = chunks % world;
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  return {first, first + base + (rank < extra ? 1 : 0)};
}

std::string PartKey(int64_t step, int rank, const std::string& tag) {
  return fmt::format("{}/part-{}r{:05d}.json", CheckpointPrefix(step), tag.empty() ? "" : tag + "-", rank);
}

StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(std::unique_ptr<ObjectStore> store,
                                                             std::vector<StateTensor> tensors,
                                                             CheckpointerOptions options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return Status::InvalidArgument("checkpointer for rank {} of {}", options.rank, options.world);
  }
  if (options.chunk_elements < 1) return Status::InvalidArgument("chunk_elements {} < 1", options.chunk_elements);
  if (options.full_every < 1) return Status::InvalidArgument("full_every {} < 1", options.full_every);
  if (options.buffers != 1 && options.buffers != 2) return Status::InvalidArgument("buffers {}: 1 or 2", options.buffers);
  // Checkpoints of a newer format are neither read nor overwritten (nor pruned) by this build.
  TF_RETURN_IF_ERROR(CheckNoNewerFormat(*store));
  std::unique_ptr<Checkpointer> c(new Checkpointer());
  c->options_ = std::move(options);
  c->store_ = std::move(store);
  c->tensors_ = std::move(tensors);
  const CheckpointerOptions& o = c->options_;
  for (size_t i = 0; i < c->tensors_.size(); ++i) {
    const StateTensor& t = c->tensors_[i];
    TF_RETURN_IF_ERROR(ValidateKey(t.name).WithContext("checkpoint tensor name"));
    if (t.owner >= o.world) return Status::InvalidArgument("tensor '{}' owned by rank {} of {}", t.name, t.owner, o.world);
    if (t.owner >= 0 && t.owner != o.rank) continue;
    int64_t begin = 0, end = t.elements;
    if (t.owner < 0) {
      const int64_t chunks = (t.elements + o.chunk_elements - 1) / o.chunk_elements;
      auto [first, last] = OwnedChunks(chunks, o.rank, o.world);
      if (o.chunks_per_rank > 0) {
        first = std::min(chunks, o.chunks_per_rank * o.rank);
        last = std::min(chunks, first + o.chunks_per_rank);
      }
      begin = std::min(first * o.chunk_elements, t.elements);
      end = std::min(last * o.chunk_elements, t.elements);
    }
    c->ranges_.emplace_back(begin, end);
    c->tensor_index_.push_back(i);
    c->half_elements_ += static_cast<size_t>(end - begin);
  }
  if (o.buffers == 1) c->halves_[1].busy = true;  // never used
  for (int h = 0; h < o.buffers; ++h) {
    Half& half = c->halves_[h];
    const size_t n = std::max<size_t>(c->half_elements_, 1);
    half.data = o.allocate ? o.allocate(n) : static_cast<float*>(AllocateLarge(n * sizeof(float)));
    if (half.data == nullptr) {
      return Status::Internal("cannot allocate {:.1f} MiB for a checkpoint buffer", n * 4.0 / (1 << 20));
    }
    // Touched now, so the first snapshot does not pay the page faults.
    std::memset(half.data, 0, n * sizeof(float));
    half.snapshot.half = h;
    size_t offset = 0;
    for (size_t s = 0; s < c->ranges_.size(); ++s) {
      const auto [begin, end] = c->ranges_[s];
      half.snapshot.slots.push_back(
          {&c->tensors_[c->tensor_index_[s]], begin, end,
           std::span<float>(half.data + offset, static_cast<size_t>(end - begin))});
      offset += static_cast<size_t>(end - begin);
    }
  }
  c->writer_ = std::thread([p = c.get()] { p->WriterMain(); });
  return c;
}

Checkpointer::~Checkpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  for (Half& h : halves_) {
    if (h.data == nullptr) continue;
    if (options_.release) {
      options_.release(h.data);
    } else {
      FreeLarge(h.data);
    }
  }
}

bool Checkpointer::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return halves_[0].busy && halves_[1].busy;
}

Checkpointer::Snapshot* Checkpointer::Begin(int64_t step, bool always) {
  std::unique_lock<std::mutex> lock(mu_);
  if (halves_[0].busy && halves_[1].busy) {
    if (!options_.wait_when_busy && !always) {
      ++stats_.skipped;
      return nullptr;
    }
    const auto t0 = Clock::now();
    cv_.wait(lock, [&] { return !halves_[0].busy || !halves_[1].busy; });
    ++stats_.waited;
    stats_.wait_s += SecondsSince(t0);
  }
  Half& h = !halves_[0].busy ? halves_[0] : halves_[1];
  h.busy = true;
  h.snapshot.step = step;
  // Full or incremental by the schedule; the writer makes it full after all when this rank's last
  // full part failed (its objects are not there to refer to).
  h.incremental = options_.full_every > 1 && base_begun_ && since_full_ + 1 < options_.full_every;
  if (h.incremental) {
    ++since_full_;
  } else {
    since_full_ = 0;
    base_begun_ = true;
  }
  ++stats_.started;
  finished_[step] = false;
  return &h.snapshot;
}

void Checkpointer::Submit(Snapshot* snapshot, json state, std::function<Status()> ready) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Half& h = halves_[snapshot->half];
    h.state = state.is_object() ? std::move(state) : json::object();
    h.ready = std::move(ready);
    if (options_.rank == 0) commit_state_[snapshot->step] = h.state;
    queue_.push_back({Task::kWrite, snapshot->half, snapshot->step});
  }
  cv_.notify_all();
}

bool Checkpointer::PartFinished(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = finished_.find(step);
  return it != finished_.end() && it->second;
}

void Checkpointer::RequestCommit(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({Task::kCommit, 0, step});
  }
  cv_.notify_all();
}

Status Checkpointer::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !running_task_; });
  return last_status_;
}

Status Checkpointer::CommitNow(int64_t step) {
  TF_RETURN_IF_ERROR(Flush());
  Status s = Commit(step);
  std::lock_guard<std::mutex> lock(mu_);
  last_status_ = s;
  return s;
}

CheckpointerStats Checkpointer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Checkpointer::WriterMain() {
  (void)pthread_setname_np(pthread_self(), kWriterThreadName);  // for top -H, perf and tests
  if (options_.idle_priority) {
    // Linux: this thread only (and the pool threads it starts, which inherit the policy).
    sched_param param{};
    if (const int err = pthread_setschedparam(pthread_self(), SCHED_IDLE, &param); err != 0) {
      spdlog::warn("checkpoint writer: cannot run at idle priority ({}); it runs at normal priority",
                   std::strerror(err));
    }
  }
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = queue_.front();
      queue_.pop_front();
      running_task_ = true;
    }
    Status s;
    if (task.kind == Task::kWrite) {
      Half& half = halves_[task.half];
      const auto t0 = Clock::now();
      s = WritePart(half);
      const double seconds = SecondsSince(t0);
      if (!s.ok()) {
        spdlog::error("checkpoint of step {}: rank {}'s part failed after {:.1f} s: {}; training continues, the "
                      "next checkpoint is attempted at the next interval",
                      task.step, options_.rank, seconds, s.ToString());
      }
      std::lock_guard<std::mutex> lock(mu_);
      half.busy = false;
      half.ready = nullptr;
      finished_[task.step] = true;
      stats_.last_write_s = seconds;
      if (!s.ok()) {
        ++stats_.failed;
        stats_.last_error = s.ToString();
        commit_state_.erase(task.step);
      }
    }
    if (s.ok() && (task.kind == Task::kCommit || (options_.world == 1 && !options_.manual_commit))) {
      s = Commit(task.step);
      if (!s.ok()) {
        spdlog::error("checkpoint of step {} not committed: {}; training continues", task.step, s.ToString());
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.failed;
        stats_.last_error = s.ToString();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_status_ = s;
      running_task_ = false;
      // Forget finished steps long gone (the engine asks only about recent ones).
      while (finished_.size() > 16) finished_.erase(finished_.begin());
    }
    cv_.notify_all();
  }
}

Status Checkpointer::WritePart(Half& half) {
  if (half.ready) TF_RETURN_IF_ERROR(half.ready().WithContext("copying the state for the checkpoint"));
  const int64_t step = half.snapshot.step;
  const bool incremental = half.incremental && base_.ok;
  const int64_t C = options_.chunk_elements;
  ChunkCodecOptions codec;
  if (options_.zstd_level != 0) codec.zstd_level = options_.zstd_level;
  codec.try_planes = options_.compress;
  Manifest part;
  part.step = step;
  part.kind = incremental ? kKindIncremental : kKindFull;
  part.code_version = options_.code_version;
  part.world = options_.world;
  part.state = {{"rank", options_.rank}};
  const bool keep_base = options_.full_every > 1 && !incremental;
  if (keep_base) {
    base_.ok = false;  // until this part is written whole
    base_.data.assign(half.data, half.data + half_elements_);
    base_.entries.assign(half.snapshot.slots.size(), {});
  } else if (incremental) {
    // The base's part list is listed as a plain object: the base is a dependency (kept by
    // retention, checked by verify) even when no chunk refers to it.
    part.objects.push_back(base_.part);
  }
  // One job per chunk of this rank; `threads` of them at a time (puts to S3 are latency-bound).
  struct Job {
    size_t slot;
    int64_t chunk, index;  // index: among the slot's chunks
    std::span<const float> data, base;
  };
  std::vector<Job> jobs;
  int64_t raw_bytes = 0;
  size_t offset = 0;
  for (size_t s = 0; s < half.snapshot.slots.size(); ++s) {
    const Slot& slot = half.snapshot.slots[s];
    const StateTensor& t = *slot.tensor;
    part.tensors.push_back({t.name, t.elements, C});
    // This rank's chunks: none when there are fewer chunks than ranks.
    const int64_t first = slot.begin / C;
    for (int64_t c = first; slot.begin < slot.end && c * C < slot.end; ++c) {
      const int64_t b = c * C, e = std::min(b + C, t.elements);
      const auto at = static_cast<size_t>(b - slot.begin), n = static_cast<size_t>(e - b);
      std::span<const float> base;
      if (incremental) base = std::span<const float>(base_.data.data() + offset + at, n);
      jobs.push_back({s, c, c - first, slot.data.subspan(at, n), base});
      raw_bytes += static_cast<int64_t>(n * sizeof(float));
    }
    offset += slot.data.size();
  }
  // Per job: its entry and, for a delta, its base listed as a plain object.
  std::vector<ObjectEntry> entries(jobs.size());
  std::vector<std::optional<ObjectEntry>> bases(jobs.size());
  const size_t threads = std::clamp<size_t>(static_cast<size_t>(std::max(options_.writer_threads, 1)), 1, jobs.size() + 1);
  // One encode buffer per thread, kept across checkpoints: a fresh 16 MiB buffer per chunk costs
  // its page faults, on some VMs as much time as writing it.
  if (encode_buffers_.size() < threads) encode_buffers_.resize(threads);
  auto work = [&](size_t j, ByteBuffer& bytes) -> Status {
    const Job& job = jobs[j];
    const StateTensor& t = *half.snapshot.slots[job.slot].tensor;
    ObjectEntry& entry = entries[j];
    ChunkEncoding encoding;
    if (incremental) {
      const ObjectEntry& prior = base_.entries[job.slot][static_cast<size_t>(job.index)];
      if (std::memcmp(job.data.data(), job.base.data(), job.data.size_bytes()) == 0) {
        entry = prior;  // unchanged: the full checkpoint's object serves
        return Status::OK();
      }
      encoding = EncodeChunkInto(job.data, job.base, codec, bytes);
      if (encoding == ChunkEncoding::kXorPlanes) {
        entry.base = prior.key;
        // The base object is listed too (as a plain object), so it is verified and kept.
        ObjectEntry listed;
        listed.key = prior.key;
        listed.bytes = prior.bytes;
        listed.xxh64 = prior.xxh64;
        bases[j] = std::move(listed);
      }
    } else {
      encoding = EncodeChunkInto(job.data, {}, codec, bytes);
    }
    entry.encoding = std::string(EncodingName(encoding));
    entry.key = ChunkKey(step, options_.key_tag, t.name, job.chunk);
    entry.bytes = bytes.size();
    entry.xxh64 = XXH64(bytes.data(), bytes.size(), 0);
    entry.tensor = t.name;
    entry.chunk = job.chunk;
    AdvanceProgress();
    return store_->PutDeferred(entry.key, bytes.view());
  };
  TF_RETURN_IF_ERROR(ParallelFor(jobs.size(), threads, [&](size_t j, size_t k) { return work(j, encode_buffers_[k]); }));
  int64_t stored_bytes = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (bases[j]) part.objects.push_back(*bases[j]);
    if (StepOfKey(entries[j].key) == step) stored_bytes += static_cast<int64_t>(entries[j].bytes);
    if (keep_base) base_.entries[jobs[j].slot].push_back(entries[j]);
    part.objects.push_back(std::move(entries[j]));
  }
  // Every chunk durable before the part list that makes them count.
  TF_RETURN_IF_ERROR(store_->Sync());
  const std::string part_text = SerializeManifest(part);
  TF_RETURN_IF_ERROR(store_->Put(PartKey(step, options_.rank, options_.key_tag), part_text));
  if (keep_base) {
    base_.part.key = PartKey(step, options_.rank, options_.key_tag);
    base_.part.bytes = part_text.size();
    base_.part.xxh64 = XXH64(part_text.data(), part_text.size(), 0);
    base_.ok = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.last_bytes = stored_bytes;
  stats_.last_raw_bytes = raw_bytes;
  stats_.bytes_total += stored_bytes;
  AddCheckpointBytes(stored_bytes);
  return Status::OK();
}

Status Checkpointer::Commit(int64_t step) {
  Manifest m;
  m.step = step;
  m.code_version = options_.code_version;
  m.world = options_.world;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = commit_state_.find(step);
    if (it == commit_state_.end()) {
      return Status::Internal("checkpoint of step {}: this rank's part was not written", step);
    }
    m.state = it->second;
    commit_state_.erase(it);
  }
  for (int r = 0; r < options_.world; ++r) {
    auto text = store_->Get(PartKey(step, r, options_.key_tag));
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) {
        return Status::NotFound("checkpoint of step {}: rank {}'s part is missing from {} (its write failed: see "
                                "that rank's log; or the checkpoint directory is not shared by all hosts)",
                                step, r, store_->location());
      }
      return text.status();
    }
    TF_ASSIGN_OR_RETURN(Manifest part,
                        ParseManifest(*text, store_->location() + "/" + PartKey(step, r, options_.key_tag), /*complete=*/false));
    if (part.step != step || part.world != options_.world) {
      return Status::Corruption("{}/{}: a part of step {} of {} ranks, expected step {} of {}", store_->location(),
                                PartKey(step, r, options_.key_tag), part.step, part.world, step, options_.world);
    }
    if (part.kind == kKindIncremental) m.kind = kKindIncremental;
    for (TensorEntry& t : part.tensors) {
      if (const TensorEntry* have = m.FindTensor(t.name); have == nullptr) {
        m.tensors.push_back(std::move(t));
      } else if (!(*have == t)) {
        return Status::Corruption("checkpoint of step {}: ranks disagree on tensor '{}'", step, t.name);
      }
    }
    for (ObjectEntry& o : part.objects) m.objects.push_back(std::move(o));
  }
  std::sort(m.tensors.begin(), m.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  // The manifest must describe a whole checkpoint before it commits one.
  const std::string text = SerializeManifest(m);
  TF_ASSIGN_OR_RETURN(Manifest checked, ParseManifest(text, fmt::format("checkpoint of step {}", step)));
  int64_t raw = 0, stored = 0;
  for (const TensorEntry& t : checked.tensors) raw += t.elements * 4;
  const std::string prefix = CheckpointPrefix(step) + "/";
  for (const ObjectEntry& o : checked.objects) stored += o.key.starts_with(prefix) ? static_cast<int64_t>(o.bytes) : 0;
  TF_RETURN_IF_ERROR(CommitManifest(*store_, std::move(checked)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.written;
    stats_.committed_raw_bytes = raw;
    stats_.committed_new_bytes = stored;
    stats_.last_committed_step = step;
  }
  if (Status s = Prune(step); !s.ok()) spdlog::warn("pruning old checkpoints: {}", s.ToString());
  return Status::OK();
}

Status Checkpointer::Prune(int64_t committed) {
  if (options_.keep_last <= 0) return Status::OK();
  TF_ASSIGN_OR_RETURN(std::vector<Listed> all, ListCheckpoints(*store_));
  std::set<int64_t> keep;
  int kept_last = 0;
  int64_t newest_full = -1;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step > committed) {
      keep.insert(it->step);  // being written
      continue;
    }
    if (!it->manifest) {
      // Garbage of a failed or crashed write goes; a manifest that could not be read (storage
      // unavailable) is no reason to delete anything.
      const StatusCode code = it->problem.code();
      if (code != StatusCode::kNotFound && code != StatusCode::kCorruption) keep.insert(it->step);
      continue;
    }
    // Another run's checkpoints (a directory shared by runs) are never this run's to delete.
    const auto id = it->manifest->state.find(kStateRunId);
    if (!options_.run_id.empty() && (id == it->manifest->state.end() || *id != options_.run_id)) {
      keep.insert(it->step);
      continue;
    }
    const bool recent = kept_last < options_.keep_last;
    const bool milestone = options_.keep_every_steps > 0 && it->step % options_.keep_every_steps == 0;
    // The newest full checkpoint is the base of incremental ones to come.
    const bool base = newest_full < 0 && it->manifest->kind == kKindFull;
    if (base) newest_full = it->step;
    if (recent || milestone || base) {
      if (recent) ++kept_last;
      for (int64_t d : Dependencies(*it->manifest)) keep.insert(d);
    }
  }
  for (const Listed& l : all) {
    if (keep.contains(l.step)) continue;
    TF_ASSIGN_OR_RETURN(const std::vector<std::string> keys, store_->List(CheckpointPrefix(l.step) + "/"));
    // The manifest goes first: a half-deleted checkpoint must not look valid.
    const std::string manifest = CheckpointPrefix(l.step) + "/" + kManifestName;
    TF_RETURN_IF_ERROR(store_->Delete(manifest));
    for (const std::string& k : keys) {
      if (k != manifest) TF_RETURN_IF_ERROR(store_->Delete(k));
    }
  }
  return Status::OK();
}

Status ReadTensorRange(ObjectStore& store, const Manifest& m, const std::string& name, int64_t begin, int64_t end,
                       std::span<float> out) {
  const TensorEntry* t = m.FindTensor(name);
  if (t == nullptr) return Status::NotFound("checkpoint of step {} has no tensor '{}'", m.step, name);
  if (begin < 0 || end > t->elements || begin > end || out.size() != static_cast<size_t>(end - begin)) {
    return Status::InvalidArgument("reading elements [{}, {}) of tensor '{}' ({} elements) into {} floats", begin, end,
                                   name, t->elements, out.size());
  }
  std::map<int64_t, const ObjectEntry*> chunks;
  std::map<std::string, const ObjectEntry*> by_key;
  for (const ObjectEntry& o : m.objects) {
    if (o.tensor == name) chunks[o.chunk] = &o;
    by_key[o.key] = &o;
  }
  const int64_t C = t->chunk_elements;
  std::vector<float> base, full;
  std::string data, base_bytes;  // reused: fresh 16 MiB buffers per chunk would page-fault anew
  for (int64_t c = begin / C; c * C < end; ++c) {
    const ObjectEntry* o = chunks.at(c);  // ParseManifest checked every chunk is listed
    const int64_t b = c * C, e = std::min(b + C, t->elements);
    TF_RETURN_IF_ERROR(store.GetInto(o->key, &data));
    TF_RETURN_IF_ERROR(CheckObject(store, *o, data));
    base.clear();
    if (!o->base.empty()) {
      // A delta's base is an earlier checkpoint's chunk, listed there: its size and checksum are
      // recorded with the delta's entry in that checkpoint's manifest, not here, so check what is
      // decoded instead (the codec's own checks and the sizes).
      auto base_entry = by_key.find(o->base);
      TF_RETURN_IF_ERROR(store.GetInto(o->base, &base_bytes));
      if (base_entry != by_key.end()) TF_RETURN_IF_ERROR(CheckObject(store, *base_entry->second, base_bytes));
      base.resize(static_cast<size_t>(e - b));
      TF_RETURN_IF_ERROR(DecodeChunk(base_bytes, {}, base).WithContext(fmt::format("{}/{}", store.location(), o->base)));
    }
    const std::string where = fmt::format("{}/{}", store.location(), o->key);
    if (b >= begin && e <= end) {  // the whole chunk is wanted: decode in place
      TF_RETURN_IF_ERROR(DecodeChunk(data, base, out.subspan(static_cast<size_t>(b - begin), static_cast<size_t>(e - b)))
                             .WithContext(where));
      continue;
    }
    full.resize(static_cast<size_t>(e - b));
    TF_RETURN_IF_ERROR(DecodeChunk(data, base, full).WithContext(where));
    const int64_t lo = std::max(b, begin), hi = std::min(e, end);
    std::copy(full.begin() + (lo - b), full.begin() + (hi - b), out.begin() + (lo - begin));
  }
  return Status::OK();
}

}  // namespace tf::checkpoint
