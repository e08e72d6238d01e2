// Checkpointer: asynchronous checkpoints of a set of named fp32 tensors (docs/checkpoints.md).
//
// The training thread only copies state into the free half of a double buffer (Begin, fill the
// slots, Submit) and goes on; a writer thread encodes each chunk (checkpoint/chunk_codec.h), puts
// it into the object store, and writes this rank's part list. The checkpoint exists once rank 0 has
// read every rank's part list and put the manifest (Commit; with one rank the writer commits by
// itself). Knows nothing about GPT: the engine (engine/checkpointing.h) says what the tensors are
// and when every rank's part is finished.
//
// World-size independence: a tensor is cut into chunks of chunk_elements whatever the world size.
// A tensor every rank holds (owner -1: parameters, moments) is written in contiguous chunk ranges,
// rank r of W writing chunks OwnedChunks(chunks, r, W) — about 1/W of the bytes each — or, with
// chunks_per_rank, exactly the range a ZeRO shard plan gives it; a tensor only
// one rank holds (its error-feedback residual) is written whole by that rank.
//
// Incremental: with full_every K > 1, every K-th checkpoint is full and the others store, per
// chunk, nothing when it is bit-identical to this rank's last full part (the manifest lists that
// object), else the smallest of its own encoding and an XOR delta against it. Deltas are always
// against a full part, so a restore reads at most two objects per chunk; an incremental part lists
// its base's part list too, so the base is a dependency retention keeps. If this rank's last full
// part failed, the writer writes a full one instead.
//
// Failures (storage full or down) are logged with their cause and counted; they never stop
// training and never touch an earlier checkpoint: objects go under the new step's prefix and the
// manifest is put last. The next checkpoint after a failure is full.
//
// Thread safety: one thread (the training thread) calls the methods; the writer thread is internal.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/byte_buffer.h"
#include "base/status.h"
#include "checkpoint/manifest.h"
#include "checkpoint/object_store.h"

namespace tf::checkpoint {

struct StateTensor {
  std::string name;
  int64_t elements = 0;
  int owner = -1;  // -1: every rank holds it (written in slices); r >= 0: only rank r holds and writes it
};

// The chunks [first, last) of `chunks` that rank r of W writes: contiguous, sizes differing by <= 1.
std::pair<int64_t, int64_t> OwnedChunks(int64_t chunks, int rank, int world);

// The writer thread's name (/proc/PID/task/TID/comm, `top -H`).
inline constexpr char kWriterThreadName[] = "tf-ckpt-writer";

// The key of a manifest's state that names the run which wrote the checkpoint.
inline constexpr const char* kStateRunId = "run_id";

struct CheckpointerOptions {
  int rank = 0, world = 1;
  int64_t chunk_elements = int64_t{4} << 20;  // 16 MiB of fp32 per chunk object
  // > 0: rank r writes chunks [r*k, (r+1)*k) of each tensor every rank holds (its ZeRO shard,
  // comm/shard_plan.h), the last ranks fewer or none; 0: OwnedChunks.
  int64_t chunks_per_rank = 0;
  bool wait_when_busy = true;  // a checkpoint due while both halves are busy: wait for one (else skip it)
  bool compress = true;        // byte planes + zstd (else raw floats)
  int writer_threads = 1;      // chunks encoded and put concurrently (S3: several requests in flight)
  // Run the writer (and its pool) at idle priority (SCHED_IDLE): on cores training keeps busy, it
  // takes only the time they would idle, so it takes longer but barely slows training.
  bool idle_priority = false;
  int zstd_level = 0;          // 0: the chunk codec's default (its fastest level with Huffman coding)
  int full_every = 1;          // 1: every checkpoint full; K: a full one, then K-1 incremental ones
  int keep_last = 0;           // retention on rank 0 after each commit: 0 keeps every checkpoint
  // Retention deletes only checkpoints whose manifest state's kStateRunId is this ("" : any).
  std::string run_id;
  int64_t keep_every_steps = 0;  // also keep those whose step is a multiple of this (0: none)
  std::string code_version;
  // Object and part names carry this tag ("step-N/TAG.params.000000", "step-N/part-TAG-r00000.json"),
  // so a second writer of the same step (a rescue after a failure) never touches the first's objects.
  std::string key_tag;
  // One rank: the writer does not commit by itself; CommitNow does (after the caller's check).
  bool manual_commit = false;
  int buffers = 2;  // 2: double buffering; 1: one half (a one-off writer)
  // Host memory for the buffer halves (the CUDA engine passes pinned memory); nullptr: new[].
  std::function<float*(size_t elements)> allocate;
  std::function<void(float*)> release;
};

struct CheckpointerStats {
  int64_t started = 0, written = 0, failed = 0, skipped = 0, waited = 0;
  double wait_s = 0;              // training time spent waiting for a free half
  double last_write_s = 0;        // writer time of the last part (encode + put)
  int64_t last_bytes = 0;         // stored bytes of the last part
  int64_t last_raw_bytes = 0;     // its uncompressed size
  int64_t bytes_total = 0;
  int64_t last_committed_step = -1;
  int64_t committed_raw_bytes = 0;  // rank 0: the last committed checkpoint's state, uncompressed
  int64_t committed_new_bytes = 0;  // ... and the bytes it stored (objects under its own prefix)
  std::string last_error;
};

class Checkpointer {
 public:
  struct Slot {
    const StateTensor* tensor;
    int64_t begin, end;      // elements of the tensor this rank writes
    std::span<float> data;   // end - begin floats to fill
  };
  struct Snapshot {
    int64_t step = -1;
    std::vector<Slot> slots;  // one per tensor this rank writes, in the order given to Create
   private:
    friend class Checkpointer;
    int half = 0;
  };

  // `store` must outlive nothing: the checkpointer owns it. Allocates both halves now. Refuses
  // (CheckNoNewerFormat) a store holding a checkpoint of a newer format version.
  static StatusOr<std::unique_ptr<Checkpointer>> Create(std::unique_ptr<ObjectStore> store,
                                                        std::vector<StateTensor> tensors, CheckpointerOptions options);
  ~Checkpointer();  // finishes the queued work, then stops the writer
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Whether both halves are busy (Begin would wait or skip).
  bool busy() const;
  // Reserves a free half for `step`: waits for one when busy and wait_when_busy or `always`
  // (counted in stats().wait_s), else returns nullptr (counted as skipped).
  Snapshot* Begin(int64_t step, bool always = false);
  // Hands the filled snapshot to the writer. `ready` runs on the writer thread before it reads the
  // buffer (a device copy's completion); `state` goes into the manifest (rank 0's is used).
  void Submit(Snapshot* snapshot, nlohmann::json state, std::function<Status()> ready = nullptr);
  // Whether this rank's part of checkpoint `step` is finished (written or failed).
  bool PartFinished(int64_t step) const;
  // Rank 0 of several: commit checkpoint `step`, every rank's part being finished, on the writer thread.
  void RequestCommit(int64_t step);
  // Waits until the writer is idle. The status of the last part or commit it finished.
  Status Flush();
  // Rank 0, training thread: commits now (after Flush and a barrier, at the end of a run).
  Status CommitNow(int64_t step);

  CheckpointerStats stats() const;
  ObjectStore& store() { return *store_; }
  const std::vector<StateTensor>& tensors() const { return tensors_; }
  const CheckpointerOptions& options() const { return options_; }

 private:
  struct Half {
    float* data = nullptr;
    Snapshot snapshot;
    bool busy = false;
    bool incremental = false;
    nlohmann::json state;
    std::function<Status()> ready;
  };
  struct Task {
    enum Kind { kWrite, kCommit } kind;
    int half = 0;
    int64_t step = 0;
  };
  // The last full checkpoint of this rank, for incremental ones.
  struct Base {
    std::vector<float> data;                        // every slot, concatenated
    std::vector<std::vector<ObjectEntry>> entries;  // per slot, per chunk
    ObjectEntry part;                               // its part list
    bool ok = false;                                // written whole: incremental parts may refer to it
  };

  Checkpointer() = default;
  void WriterMain();
  Status WritePart(Half& half);
  Status Commit(int64_t step);
  Status Prune(int64_t committed_step);

  CheckpointerOptions options_;
  std::unique_ptr<ObjectStore> store_;
  std::vector<StateTensor> tensors_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // per tensor this rank writes: elements [begin, end)
  std::vector<size_t> tensor_index_;                 // per slot: index into tensors_
  size_t half_elements_ = 0;
  Half halves_[2];
  Base base_;  // writer thread
  std::vector<ByteBuffer> encode_buffers_;  // writer thread: one per writer pool thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool running_task_ = false;
  bool stop_ = false;
  std::map<int64_t, bool> finished_;                // step -> part finished (any outcome)
  std::map<int64_t, nlohmann::json> commit_state_;  // rank 0: step -> state for its manifest
  Status last_status_;
  bool base_begun_ = false;  // a full checkpoint was begun
  int64_t since_full_ = 0;   // incremental ones begun since the last full one
  CheckpointerStats stats_;
  std::thread writer_;
};

// Reads elements [begin, end) of tensor `name` of a checkpoint into `out` (end - begin floats),
// checking every object it reads against the manifest (Corruption naming it) and decoding deltas.
Status ReadTensorRange(ObjectStore& store, const Manifest& manifest, const std::string& name, int64_t begin,
                       int64_t end, std::span<float> out);
// The part list rank r writes for checkpoint `step`.
std::string PartKey(int64_t step, int rank, const std::string& tag = "");

}  // namespace tf::checkpoint
