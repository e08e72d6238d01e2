// ObjectStore: where checkpoints live — a flat namespace of immutable objects named by keys
// ("step-000000000100/params.r0.bin") under a root: a directory on a local or shared POSIX file
// system here, an S3 bucket and prefix later. Put is atomic: an object appears whole or not at all
// (POSIX: temp file, fsync, rename, directory fsync through Env::WriteFileAtomically), so an object
// written last — the manifest — commits everything written before it. No operation relies on
// locking or on rename across directories, so shared mounts (NFS, Lustre, CephFS) behave like a
// local disk given close-to-open consistency (docs/checkpoints.md).
//
// Keys: non-empty, '/'-separated segments of [A-Za-z0-9._-], no segment "." or "..", no ".tmp."
// (the POSIX store's temporary files); anything else is InvalidArgument naming the key. Thread safety: every method may be called from many threads at
// once for distinct keys.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace tf::checkpoint {

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Writes `data` as object `key`, replacing any object of that name atomically.
  virtual Status Put(const std::string& key, std::string_view data) = 0;
  // As Put (atomic), but durable only after the next Sync(): for many objects that one later
  // durable Put (the part list, the manifest) makes count. Stores whose Put is durable anyway (S3)
  // keep the default.
  virtual Status PutDeferred(const std::string& key, std::string_view data) { return Put(key, data); }
  // Makes every object put so far durable.
  virtual Status Sync() { return Status::OK(); }
  // The whole object; NotFound naming it when there is none.
  virtual StatusOr<std::string> Get(const std::string& key) = 0;
  // The same into `out`, reusing its memory where the store can.
  virtual Status GetInto(const std::string& key, std::string* out) {
    TF_ASSIGN_OR_RETURN(*out, Get(key));
    return Status::OK();
  }
  // Every key that starts with `prefix` ("" = all), sorted.
  virtual StatusOr<std::vector<std::string>> List(const std::string& prefix) = 0;
  // Removes the object; OK when it does not exist.
  virtual Status Delete(const std::string& key) = 0;
  // Where the objects are, for messages: "/mnt/nfs/run1".
  virtual const std::string& location() const = 0;
};

// OK when `key` is a valid object key (see above), else InvalidArgument naming it.
Status ValidateKey(const std::string& key);

// A store rooted at directory `root` of `env`'s file system; the directory is created if missing.
// InvalidArgument when `root` exists and is not a directory.
StatusOr<std::unique_ptr<ObjectStore>> OpenPosixStore(const std::string& root, Env* env = Env::Default());

// OK when `location` is "s3://..." or a path that does not start like a URL: InvalidArgument naming
// it for "S3://b/p", "s3:/b", "s3a://b", "gs://b", "file:///x" (any "scheme:/"), which would
// otherwise be taken for a relative directory.
Status CheckLocation(const std::string& location);

// The store `location` names: "s3://bucket/prefix" (checkpoint/s3_store.h, configured from the AWS_*
// environment and ~/.aws), else a POSIX directory of `env`. CheckLocation first.
StatusOr<std::unique_ptr<ObjectStore>> OpenStore(const std::string& location, Env* env = Env::Default());

}  // namespace tf::checkpoint
