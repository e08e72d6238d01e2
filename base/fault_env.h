// FaultInjectionEnv: an Env for tests that forwards to another Env (normally Env::Default()) and
// injects the failures real storage has: the Nth write, sync or rename fails (EIO), the disk is full
// after N more bytes (ENOSPC, with the write that crosses the limit torn: its prefix lands), and a
// simulated crash that drops everything not yet durable — data appended after the file's last Sync,
// files created and renames done since their directory's last SyncDir (a file a rename replaced
// comes back). Counters are 1-based and count calls through this Env from its creation or Reset().
// Thread safety: all methods are serialised by one mutex.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/env.h"

namespace tf {

struct FaultOptions {
  int64_t fail_write_at = 0;        // the Nth Append fails (0 = never)
  int64_t fail_sync_at = 0;         // the Nth Sync fails
  int64_t fail_rename_at = 0;       // the Nth RenameFile fails
  int64_t enospc_after_bytes = -1;  // appends beyond this many bytes fail with ENOSPC (-1 = never)
  bool torn_write = true;           // a failing Append first writes half of its data
};

class FaultInjectionEnv final : public Env {
 public:
  explicit FaultInjectionEnv(Env* base, FaultOptions options = {});
  ~FaultInjectionEnv() override;
  void Reset(FaultOptions options);  // new faults, counters from zero (durability state kept)
  // Drops everything not durable, as a power cut would; files stay usable through the base Env.
  Status SimulateCrash();
  int64_t writes() const;  // Append calls so far

  StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override;
  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status RemoveFile(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  Status SyncFileSystem(const std::string& path) override;  // everything written so far becomes durable
  Status CreateDirs(const std::string& dir) override;
  StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  StatusOr<uint64_t> FreeSpace(const std::string& path) override;
  StatusOr<FileInfo> Stat(const std::string& path) override;

 private:
  class File;
  struct Durable {
    uint64_t synced = 0;           // bytes known durable
    bool entry_durable = false;    // its directory entry survives a crash
  };
  // A rename not yet made durable by SyncDir: undone by a crash (restoring what it replaced).
  struct PendingRename {
    std::string from, to;
    std::optional<std::string> replaced;  // the previous content of `to`
  };
  Status Inject(int64_t* counter, int64_t at, const std::string& what, const std::string& path);
  StatusOr<std::unique_ptr<WritableFile>> Wrap(const std::string& path, bool append);

  Env* base_;
  mutable std::mutex mu_;
  FaultOptions options_;
  int64_t writes_ = 0, syncs_ = 0, renames_ = 0;
  int64_t bytes_ = 0;
  std::map<std::string, Durable> files_;  // files written through this Env
  std::vector<PendingRename> renames_pending_;
};

}  // namespace tf
