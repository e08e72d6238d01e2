// A checkpoint's manifest and the commit protocol (docs/checkpoints.md). A checkpoint of step s is
// the objects under key prefix CheckpointPrefix(s) plus its manifest, which lists every object
// with its size and xxh64 and carries its own checksum. Writing puts the objects first and the
// manifest last (ObjectStore::Put is atomic), so a checkpoint without a valid manifest does not
// exist: a crash mid-write leaves earlier checkpoints as they were. Reading checks the manifest's
// checksum, format and version, and VerifyCheckpoint every object's size and checksum, naming the
// object with what was expected and found.
//
// The manifest is JSON: {"format", "version", "step", "kind", "created", "code_version", "world",
// "state" (an object for the caller: configs, data position, seeds), "objects": [{"key", "bytes",
// "xxh64"}], "checksum"}, the checksum being the xxh64 (16 hex digits) of the compact dump of
// everything else. Functions are thread-safe as far as the store is.
#pragma once
#include <cstdint>
#include <optional>
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

struct ObjectEntry {
  std::string key;  // relative to the checkpoint's prefix
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
  bool operator==(const ObjectEntry&) const = default;
};

struct Manifest {
  int64_t step = 0;
  std::string kind = "full";   // "full" (later: "incremental")
  std::string created;         // UTC, ISO 8601; filled by WriteCheckpoint when empty
  std::string code_version;
  int world = 1;               // ranks that wrote it
  nlohmann::json state = nlohmann::json::object();
  std::vector<ObjectEntry> objects;
};

// "step-000000000100": the key prefix of step's checkpoint (12 digits sort as numbers).
std::string CheckpointPrefix(int64_t step);

std::string SerializeManifest(const Manifest& manifest);
// Corruption naming `source` for anything malformed: not JSON, a wrong checksum, another format or
// an unknown version, a missing or mistyped field, an invalid or repeated object key.
StatusOr<Manifest> ParseManifest(std::string_view text, const std::string& source);

// Puts each (key, bytes) object under CheckpointPrefix(manifest.step), records its size and xxh64
// in the manifest, then puts the manifest. REQUIRES: keys valid and distinct.
Status WriteCheckpoint(ObjectStore& store, Manifest manifest,
                       const std::vector<std::pair<std::string, std::string>>& objects);

// A checkpoint directory found in the store: its manifest when it reads and parses, else why not.
struct Listed {
  int64_t step = 0;
  std::optional<Manifest> manifest;
  Status problem;  // OK when manifest is set
};
// Every step prefix in the store, ascending.
StatusOr<std::vector<Listed>> ListCheckpoints(ObjectStore& store);

// Reads every object of the checkpoint and checks its size and xxh64: Corruption naming the object,
// the expected and the found values; NotFound naming a missing object.
Status VerifyCheckpoint(ObjectStore& store, const Manifest& manifest);

// The newest checkpoint whose manifest parses and whose objects verify; each newer one that fails is
// appended to `skipped` with its problem. NotFound when there is none.
StatusOr<Manifest> NewestValidCheckpoint(ObjectStore& store, std::vector<std::pair<int64_t, Status>>* skipped);

}  // namespace tf::checkpoint
