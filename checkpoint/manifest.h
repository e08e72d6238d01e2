// A checkpoint's manifest and the commit protocol (docs/checkpoints.md). A checkpoint of step s is
// the objects its manifest lists plus the manifest itself, CheckpointPrefix(s)/MANIFEST.json, which
// records every object's size and xxh64 and carries its own checksum. Writing puts the objects
// first and the manifest last (ObjectStore::Put is atomic), so a checkpoint without a valid
// manifest does not exist: a crash mid-write leaves earlier checkpoints as they were. Reading checks
// the manifest's checksum, format and version, and VerifyCheckpoint every object's size and
// checksum, naming the object with what was expected and found.
//
// Tensors: the state is a set of logical fp32 tensors ("params", "adam.m", "ef.residual.r1"), each
// stored as fixed-size chunks (elements [i*chunk, (i+1)*chunk)), one object per chunk, whatever the
// number of ranks that wrote them: any world size reads any checkpoint. An object entry names its
// tensor, chunk and encoding (checkpoint/chunk_codec.h); keys are relative to the store's root, so
// an incremental checkpoint can list an unchanged chunk stored by an earlier checkpoint, or a
// chunk encoded as a delta against one ("base"). Everything such keys point into is a dependency
// (Dependencies) that retention keeps.
//
// The manifest is JSON: {"format", "version", "step", "kind", "created", "code_version", "world",
// "state" (an object for the caller: configs, data position, seeds), "tensors": [{"name",
// "elements", "chunk_elements"}], "objects": [{"key", "bytes", "xxh64", and for chunks "tensor",
// "chunk", "encoding", "base"}], "checksum"}, the checksum being the xxh64 (16 hex digits) of the
// compact dump of everything else. Functions are thread-safe as far as the store is.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "checkpoint/object_store.h"

namespace tf::checkpoint {

inline constexpr const char* kManifestFormat = "trainflow.checkpoint";
inline constexpr int kManifestVersion = 1;
inline constexpr const char* kManifestName = "MANIFEST.json";
inline constexpr const char* kKindFull = "full";
inline constexpr const char* kKindIncremental = "incremental";

struct ObjectEntry {
  std::string key;  // relative to the store's root: "step-000000000100/params.000003"
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;  // of the stored bytes
  // Chunk objects: which tensor and chunk they hold, how (chunk_codec.h EncodingName), and for a
  // delta the key of the object it is a delta against. Plain objects: tensor "", chunk -1.
  std::string tensor;
  int64_t chunk = -1;
  std::string encoding;
  std::string base;
  bool operator==(const ObjectEntry&) const = default;
};

struct TensorEntry {
  std::string name;
  int64_t elements = 0;
  int64_t chunk_elements = 0;
  int64_t chunks() const { return chunk_elements > 0 ? (elements + chunk_elements - 1) / chunk_elements : 0; }
  bool operator==(const TensorEntry&) const = default;
};

struct Manifest {
  int64_t step = 0;
  std::string kind = kKindFull;  // or kKindIncremental (some chunks are deltas or earlier objects)
  std::string created;           // UTC, ISO 8601; filled by WriteCheckpoint/CommitManifest when empty
  std::string code_version;
  int world = 1;                 // ranks that wrote it
  nlohmann::json state = nlohmann::json::object();
  std::vector<TensorEntry> tensors;
  std::vector<ObjectEntry> objects;
  const TensorEntry* FindTensor(const std::string& name) const;
};

// "step-000000000100": the key prefix of step's checkpoint (12 digits sort as numbers).
std::string CheckpointPrefix(int64_t step);
// The step of a key under a checkpoint prefix ("step-000000000100/x" -> 100), or -1.
int64_t StepOfKey(std::string_view key);

std::string SerializeManifest(const Manifest& manifest);
// Unimplemented naming `source` and the version needed for a manifest of a newer format version
// (written by a newer build: neither damage to skip nor garbage to overwrite or delete).
// Corruption naming `source` for anything malformed: not JSON (or nested more than kMaxJsonDepth),
// a wrong checksum, another format or an older version, a missing or mistyped field, an invalid or repeated object key, a chunk of an
// undeclared tensor, a tensor with a missing (when `complete`: one rank's part lists only its own)
// or repeated chunk.
StatusOr<Manifest> ParseManifest(std::string_view text, const std::string& source, bool complete = true);

// Puts each (key, bytes) object under CheckpointPrefix(manifest.step) ("name" -> "step-.../name"),
// records its size and xxh64 in the manifest, then puts the manifest. REQUIRES: keys valid and
// distinct. (Plain objects; the checkpointer writes chunks itself and calls CommitManifest.)
Status WriteCheckpoint(ObjectStore& store, Manifest manifest,
                       const std::vector<std::pair<std::string, std::string>>& objects);
// Puts the manifest of objects already written (the commit).
Status CommitManifest(ObjectStore& store, Manifest manifest);

// A checkpoint directory found in the store: its manifest when it reads and parses, else why not.
struct Listed {
  int64_t step = 0;
  std::optional<Manifest> manifest;
  Status problem;  // OK when manifest is set
};
// Every step prefix in the store, ascending.
StatusOr<std::vector<Listed>> ListCheckpoints(ObjectStore& store);
// A step prefix without a manifest: what an interrupted or failed write leaves (ReadManifest's
// NotFound). Not a checkpoint, and not damage to one.
inline bool IsUncommitted(const Listed& l) { return !l.manifest && l.problem.code() == StatusCode::kNotFound; }
// Whether a Listed problem is a manifest of a newer format version (see ParseManifest).
inline bool IsNewerFormat(const Status& problem) { return problem.code() == StatusCode::kUnimplemented; }
// The problem of the first checkpoint in the store whose manifest is of a newer format version: a
// store that holds one is not written to (its steps would be overwritten). OK when there is none.
Status CheckNoNewerFormat(ObjectStore& store);
// The manifest of one checkpoint (NotFound / Corruption naming it).
StatusOr<Manifest> ReadManifest(ObjectStore& store, int64_t step);

// Checks one object's bytes against its entry: Corruption naming the object, the expected and the
// found size or xxh64.
Status CheckObject(const ObjectStore& store, const ObjectEntry& entry, std::string_view data);
// Reads every object of the checkpoint and checks it: NotFound naming a missing object.
Status VerifyCheckpoint(ObjectStore& store, const Manifest& manifest);

// The steps of the checkpoints whose objects this one lists or uses as bases (itself included).
std::set<int64_t> Dependencies(const Manifest& manifest);

// The newest checkpoint whose manifest parses and whose objects verify; each newer one that fails is
// appended to `skipped` with its problem. NotFound when there is none.
StatusOr<Manifest> NewestValidCheckpoint(ObjectStore& store, std::vector<std::pair<int64_t, Status>>* skipped);

}  // namespace tf::checkpoint
