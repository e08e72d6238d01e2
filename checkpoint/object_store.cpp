#include "checkpoint/object_store.h"

#include <algorithm>
#include <functional>

namespace tf::checkpoint {
namespace {

bool KeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

class PosixStore final : public ObjectStore {
 public:
  PosixStore(std::string root, Env* env) : root_(std::move(root)), env_(env) {}

  Status Put(const std::string& key, std::string_view data) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = Path(key);
    TF_RETURN_IF_ERROR(env_->CreateDirs(path.substr(0, path.rfind('/'))));
    return env_->WriteFileAtomically(path, data);
  }

  // Written and renamed into place without an fsync each; Sync() is one syncfs(2) of the file
  // system (a checkpoint's hundreds of chunks would otherwise pay one fsync each). Written with
  // direct I/O where the file system has it: a chunk is written once and not read back soon, so
  // copying it into the page cache and writing that back would only cost CPU the training needs.
  Status PutDeferred(const std::string& key, std::string_view data) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = Path(key);
    TF_RETURN_IF_ERROR(env_->CreateDirs(path.substr(0, path.rfind('/'))));
    return env_->WriteFileVisible(path, data, /*direct=*/true);
  }
  Status Sync() override { return env_->SyncFileSystem(root_); }

  StatusOr<std::string> Get(const std::string& key) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    auto data = env_->ReadFileToString(Path(key), uint64_t{1} << 40);
    if (!data.ok() && data.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("{}: no object '{}'", root_, key);
    }
    return data;
  }

  Status GetInto(const std::string& key, std::string* out) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    auto f = env_->NewRandomAccessFile(Path(key));
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) return Status::NotFound("{}: no object '{}'", root_, key);
      return f.status();
    }
    out->resize(static_cast<size_t>((*f)->size()));
    return (*f)->ReadExact(0, out->size(), out->data());
  }

  StatusOr<std::vector<std::string>> List(const std::string& prefix) override {
    std::vector<std::string> keys;
    // Walks only the directories a matching key can be under.
    std::function<Status(const std::string&)> walk = [&](const std::string& dir_key) -> Status {
      const std::string dir = dir_key.empty() ? root_ : Path(dir_key);
      TF_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(dir));
      for (const std::string& name : names) {
        if (name.find(".tmp.") != std::string::npos) continue;  // an atomic write in progress or abandoned
        const std::string key = dir_key.empty() ? name : dir_key + "/" + name;
        const size_t n = std::min(key.size(), prefix.size());
        if (key.compare(0, n, prefix, 0, n) != 0) continue;
        TF_ASSIGN_OR_RETURN(const FileInfo info, env_->Stat(dir + "/" + name));
        if (info.is_directory) {
          TF_RETURN_IF_ERROR(walk(key));
        } else if (info.is_regular && key.size() >= prefix.size()) {
          keys.push_back(key);
        }
      }
      return Status::OK();
    };
    TF_RETURN_IF_ERROR(walk(""));
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  Status Delete(const std::string& key) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    TF_ASSIGN_OR_RETURN(const FileInfo info, env_->Stat(Path(key)));
    if (!info.exists) return Status::OK();
    TF_RETURN_IF_ERROR(env_->RemoveFile(Path(key)));
    // Directories the key emptied go too (an object store has no directories to leave behind).
    for (size_t slash = key.rfind('/'); slash != std::string::npos && slash > 0; slash = key.rfind('/', slash - 1)) {
      if (!env_->RemoveDir(Path(key.substr(0, slash))).ok()) break;
    }
    return Status::OK();
  }

  const std::string& location() const override { return root_; }

 private:
  std::string Path(const std::string& key) const { return root_ + "/" + key; }

  const std::string root_;
  Env* const env_;
};

}  // namespace

Status ValidateKey(const std::string& key) {
  bool ok = !key.empty() && key.front() != '/' && key.back() != '/' && key.find(".tmp.") == std::string::npos;
  for (size_t begin = 0; ok && begin <= key.size();) {
    size_t end = key.find('/', begin);
    if (end == std::string::npos) end = key.size();
    const std::string_view segment(key.data() + begin, end - begin);
    ok = !segment.empty() && segment != "." && segment != ".." && std::all_of(segment.begin(), segment.end(), KeyChar);
    begin = end + 1;
  }
  if (!ok) {
    return Status::InvalidArgument("'{}' is not an object key ('/'-separated names of letters, digits, '.', '_', '-', "
                                   "without '.tmp.')",
                                   key);
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<ObjectStore>> OpenPosixStore(const std::string& root, Env* env) {
  if (root.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  TF_RETURN_IF_ERROR(env->CreateDirs(r));
  return std::unique_ptr<ObjectStore>(new PosixStore(r, env));
}

}  // namespace tf::checkpoint
