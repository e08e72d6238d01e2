#include "base/fault_env.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tf {

Status FaultInjectionEnv::Inject(int64_t* counter, int64_t at, const std::string& what, const std::string& path) {
  ++*counter;
  if (at > 0 && *counter == at) {
    return Status(StatusCode::kIOError, fmt::format("{} '{}': {} (errno {}) [injected]", what, path,
                                                    std::strerror(EIO), EIO));
  }
  return Status::OK();
}

// A writable file that counts its bytes and reports appends/syncs to the Env.
class FaultInjectionEnv::File final : public WritableFile {
 public:
  File(FaultInjectionEnv* env, std::unique_ptr<WritableFile> base, uint64_t start)
      : env_(env), base_(std::move(base)), pos_(start) {}
  Status Append(std::string_view data) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    Status fault = env_->Inject(&env_->writes_, env_->options_.fail_write_at, "writing", path());
    size_t allowed = data.size();
    if (fault.ok() && env_->options_.enospc_after_bytes >= 0 &&
        env_->bytes_ + static_cast<int64_t>(data.size()) > env_->options_.enospc_after_bytes) {
      allowed = static_cast<size_t>(std::max<int64_t>(0, env_->options_.enospc_after_bytes - env_->bytes_));
      fault = Status(StatusCode::kIOError, fmt::format("writing '{}': {} (errno {}) [injected]", path(),
                                                       std::strerror(ENOSPC), ENOSPC));
    } else if (!fault.ok()) {
      allowed = env_->options_.torn_write ? data.size() / 2 : 0;
    }
    if (allowed > 0) {
      TF_RETURN_IF_ERROR(base_->Append(data.substr(0, allowed)));
      pos_ += allowed;
      env_->bytes_ += static_cast<int64_t>(allowed);
    }
    return fault;
  }
  Status Sync() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    TF_RETURN_IF_ERROR(env_->Inject(&env_->syncs_, env_->options_.fail_sync_at, "fsync of", path()));
    TF_RETURN_IF_ERROR(base_->Sync());
    env_->files_[path()].synced = pos_;
    return Status::OK();
  }
  Status Close() override { return base_->Close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectionEnv* env_;
  std::unique_ptr<WritableFile> base_;
  uint64_t pos_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* base, FaultOptions options) : base_(base), options_(options) {}
FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::Reset(FaultOptions options) {
  std::lock_guard<std::mutex> lock(mu_);
  options_ = options;
  writes_ = syncs_ = renames_ = bytes_ = 0;
}

int64_t FaultInjectionEnv::writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::Wrap(const std::string& path, bool append) {
  std::lock_guard<std::mutex> lock(mu_);
  TF_ASSIGN_OR_RETURN(const FileInfo before, base_->Stat(path));
  auto f = append ? base_->NewAppendableFile(path) : base_->NewWritableFile(path);
  if (!f.ok()) return f.status();
  const bool known = files_.contains(path);
  Durable& d = files_[path];
  if (!before.exists) {
    d = Durable{};  // a new directory entry: not durable until SyncDir of its directory
  } else if (!known) {
    d = Durable{append ? before.size : 0, true};  // a file from before: what it keeps is durable
  } else if (!append) {
    d.synced = 0;  // truncated
  }
  const uint64_t start = append ? before.size : 0;
  return std::unique_ptr<WritableFile>(new File(this, std::move(f).value(), start));
}

StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  return Wrap(path, false);
}
StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewAppendableFile(const std::string& path) {
  return Wrap(path, true);
}

StatusOr<std::unique_ptr<SequentialFile>> FaultInjectionEnv::NewSequentialFile(const std::string& path) {
  return base_->NewSequentialFile(path);
}
StatusOr<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(const std::string& path) {
  return base_->NewRandomAccessFile(path);
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mu_);
  TF_RETURN_IF_ERROR(Inject(&renames_, options_.fail_rename_at, "cannot rename '" + from + "' to", to));
  PendingRename pending{from, to, std::nullopt};
  if (auto old = base_->ReadFileToString(to); old.ok()) pending.replaced = std::move(old).value();
  TF_RETURN_IF_ERROR(base_->RenameFile(from, to));
  Durable moved = files_.count(from) ? files_[from] : Durable{};
  files_.erase(from);
  moved.entry_durable = false;
  files_[to] = moved;
  renames_pending_.push_back(std::move(pending));
  return Status::OK();
}

Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  files_.erase(path);
  return base_->RemoveFile(path);
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  TF_RETURN_IF_ERROR(base_->SyncDir(dir));
  for (auto& [path, d] : files_) {
    if (DirName(path) == dir) d.entry_durable = true;
  }
  std::erase_if(renames_pending_, [&](const PendingRename& r) { return DirName(r.to) == dir; });
  return Status::OK();
}

Status FaultInjectionEnv::SyncFileSystem(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  TF_RETURN_IF_ERROR(Inject(&syncs_, options_.fail_sync_at, "cannot sync the file system of", path));
  TF_RETURN_IF_ERROR(base_->SyncFileSystem(path));
  for (auto& [file, d] : files_) {
    d.entry_durable = true;
    TF_ASSIGN_OR_RETURN(const FileInfo info, base_->Stat(file));
    d.synced = info.exists ? info.size : 0;
  }
  renames_pending_.clear();
  return Status::OK();
}

Status FaultInjectionEnv::SimulateCrash() {
  std::lock_guard<std::mutex> lock(mu_);
  // Undo renames newest first: the file goes back to its old name, the replaced one comes back.
  for (auto it = renames_pending_.rbegin(); it != renames_pending_.rend(); ++it) {
    TF_RETURN_IF_ERROR(base_->RenameFile(it->to, it->from));
    if (files_.count(it->to)) {
      files_[it->from] = files_[it->to];
      files_.erase(it->to);
    }
    if (it->replaced) {
      TF_RETURN_IF_ERROR(base_->WriteFileAtomically(it->to, *it->replaced));
      files_.erase(it->to);
    }
  }
  renames_pending_.clear();
  for (auto it = files_.begin(); it != files_.end();) {
    const auto& [path, d] = *it;
    if (!d.entry_durable) {
      (void)base_->RemoveFile(path);
    } else if (::truncate(path.c_str(), static_cast<off_t>(d.synced)) != 0 && errno != ENOENT) {
      return Status::FromErrno("simulated crash: truncating '" + path + "'", errno);
    }
    it = files_.erase(it);
  }
  return Status::OK();
}

Status FaultInjectionEnv::CreateDirs(const std::string& dir) { return base_->CreateDirs(dir); }
StatusOr<std::vector<std::string>> FaultInjectionEnv::ListDir(const std::string& dir) { return base_->ListDir(dir); }
StatusOr<uint64_t> FaultInjectionEnv::FreeSpace(const std::string& path) { return base_->FreeSpace(path); }
StatusOr<FileInfo> FaultInjectionEnv::Stat(const std::string& path) { return base_->Stat(path); }

}  // namespace tf
