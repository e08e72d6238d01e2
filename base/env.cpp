// Env's POSIX implementation and the helpers built on the interface (atomic writes, whole-file reads).
#include "base/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace tf {
namespace {

Status Errno(const std::string& what, const std::string& path, int err) {
  return Status(StatusCode::kIOError, fmt::format("{} '{}': {} (errno {})", what, path, std::strerror(err), err));
}

Status NotRegular(const std::string& path, mode_t mode) {
  return Status::InvalidArgument("'{}' is {}, not a regular file", path,
                                 S_ISDIR(mode)    ? "a directory"
                                 : S_ISFIFO(mode) ? "a FIFO (named pipe)"
                                 : S_ISSOCK(mode) ? "a socket"
                                                  : "a device");
}

// Opens `path` for reading without blocking on a FIFO, then insists on a regular file.
StatusOr<int> OpenRegularForRead(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("'{}' does not exist", path);
    return Errno("cannot open", path, err);
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotRegular(path, st.st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { ::close(fd_); }
  StatusOr<size_t> Read(size_t n, char* dst) override {
    while (true) {
      const ssize_t r = ::read(fd_, dst, n);
      if (r >= 0) return static_cast<size_t>(r);
      if (errno != EINTR) return Errno("reading", path_, errno);
    }
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }
  Status ReadExact(uint64_t offset, size_t n, char* dst) const override {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Errno("reading", path_, errno);
      }
      if (r == 0) {
        return Status::Corruption("'{}' is truncated: wanted {} bytes at offset {}, the file ends at {}", path_, n,
                                  offset, offset + done);
      }
      done += static_cast<size_t>(r);
    }
    return Status::OK();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class PosixWritableFile final : public WritableFile {
 public:
  // direct: fd was opened with O_DIRECT (see Env::NewDirectWritableFile).
  PosixWritableFile(std::string path, int fd, bool direct = false)
      : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixWritableFile() override { (void)Close(); }
  Status Append(std::string_view data) override {
    if (fd_ < 0) return Status::Internal("'{}': append after close", path_);
    if (direct_) {
      // The aligned whole blocks of an aligned buffer go straight to the device; the file offset
      // stays aligned until a tail, which (like anything unaligned) is written through the page
      // cache from then on.
      const size_t blocks = data.size() / kDirectIoAlignment * kDirectIoAlignment;
      if (reinterpret_cast<uintptr_t>(data.data()) % kDirectIoAlignment == 0 && blocks > 0) {
        TF_RETURN_IF_ERROR(WriteAll(data.substr(0, blocks)));
        data.remove_prefix(blocks);
      }
      if (!data.empty()) {
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
          return Errno("cannot leave direct I/O for", path_, errno);
        }
        direct_ = false;
      }
    }
    return WriteAll(data);
  }
  Status WriteAll(std::string_view data) {
    while (!data.empty()) {
      const ssize_t w = ::write(fd_, data.data(), data.size());
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("writing", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(w));
    }
    return Status::OK();
  }
  Status Sync() override {
    if (fd_ < 0) return Status::Internal("'{}': sync after close", path_);
    if (::fsync(fd_) != 0) return Errno("fsync of", path_, errno);
    return Status::OK();
  }
  Status Close() override {
    if (fd_ < 0) return Status::OK();
    const int r = ::close(fd_);
    fd_ = -1;
    if (r != 0 && errno != EINTR) return Errno("closing", path_, errno);
    return Status::OK();
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  bool direct_;
};

class PosixEnv final : public Env {
 public:
  StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    uint64_t size = 0;
    TF_ASSIGN_OR_RETURN(const int fd, OpenRegularForRead(path, &size));
    return std::unique_ptr<SequentialFile>(new PosixSequentialFile(path, fd));
  }
  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    uint64_t size = 0;
    TF_ASSIGN_OR_RETURN(const int fd, OpenRegularForRead(path, &size));
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd, size));
  }
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return Open(path, O_TRUNC);
  }
  StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override {
    return Open(path, O_APPEND);
  }
  StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_TRUNC | O_DIRECT, 0666);
    if (fd >= 0) return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, /*direct=*/true));
    if (errno != EINVAL) return Errno("cannot create", path, errno);
    return Open(path, O_TRUNC);  // a file system without O_DIRECT (tmpfs): through the page cache
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return Errno("cannot rename '" + from + "' to", to, errno);
    return Status::OK();
  }
  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Errno("cannot remove", path, errno);
    return Status::OK();
  }
  Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Errno("cannot open directory", dir, errno);
    const int r = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    // Some file systems (and /dev/shm) refuse fsync on directories; their renames are as durable
    // as they get.
    if (r != 0 && err != EINVAL && err != ENOTSUP) return Errno("fsync of directory", dir, err);
    return Status::OK();
  }
  Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return Status::InvalidArgument("empty directory name");
    std::string prefix;
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      prefix = dir.substr(0, pos);
      if (prefix.empty() || prefix == "/" ) continue;
      struct stat st{};
      if (::stat(prefix.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument("'{}' exists and is not a directory", prefix);
        continue;
      }
      if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) return Errno("cannot create directory", prefix, errno);
    }
    return Status::OK();
  }
  StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Errno("cannot list directory", dir, errno);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
  StatusOr<uint64_t> FreeSpace(const std::string& path) override {
    struct statvfs s{};
    if (::statvfs(path.c_str(), &s) != 0) return Errno("cannot query free space of", path, errno);
    return static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
  }
  StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat st{};
    FileInfo info;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return info;
      return Errno("cannot stat", path, errno);
    }
    info.exists = true;
    info.is_regular = S_ISREG(st.st_mode);
    info.is_directory = S_ISDIR(st.st_mode);
    info.size = static_cast<uint64_t>(st.st_size);
    return info;
  }

 private:
  StatusOr<std::unique_ptr<WritableFile>> Open(const std::string& path, int mode) {
    TF_ASSIGN_OR_RETURN(const int fd, OpenRegularForWrite(path, mode, 0666));
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
};

}  // namespace

StatusOr<int> OpenRegularForWrite(const std::string& path, int flags, mode_t mode) {
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of blocking; with one, fstat
  // refuses it below.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | flags, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == ENXIO) return NotRegular(path, S_IFIFO);
    return Errno((flags & O_APPEND) != 0 ? "cannot open for appending" : "cannot create", path, err);
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd);
    return NotRegular(path, m);
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

bool LooksLikeUrl(const std::string& path) {
  const size_t colon = path.find(':');
  return colon != std::string::npos && colon > 0 && colon < path.find('/') && colon + 1 < path.size() &&
         path[colon + 1] == '/';
}

Env* Env::Default() {
  static Env* env = new PosixEnv();
  return env;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status Env::WriteFileAtomically(const std::string& path, const std::function<Status(WritableFile*)>& write) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter.fetch_add(1));
  Status s = [&]() -> Status {
    TF_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, NewWritableFile(tmp));
    TF_RETURN_IF_ERROR(write(f.get()));
    TF_RETURN_IF_ERROR(f->Sync());
    TF_RETURN_IF_ERROR(f->Close());
    return RenameFile(tmp, path);
  }();
  if (!s.ok()) {
    (void)RemoveFile(tmp);  // may not exist
    return s.WithContext(fmt::format("writing '{}' (the previous file, if any, is unchanged)", path));
  }
  return SyncDir(DirName(path)).WithContext(fmt::format("writing '{}'", path));
}

StatusOr<std::unique_ptr<WritableFile>> Env::NewDirectWritableFile(const std::string& path) {
  return NewWritableFile(path);
}

Status Env::WriteFileVisible(const std::string& path, std::string_view content, bool direct) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.v{}", path, ::getpid(), counter.fetch_add(1));
  Status s = [&]() -> Status {
    TF_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, direct ? NewDirectWritableFile(tmp) : NewWritableFile(tmp));
    TF_RETURN_IF_ERROR(f->Append(content));
    TF_RETURN_IF_ERROR(f->Close());
    return RenameFile(tmp, path);
  }();
  if (!s.ok()) {
    (void)RemoveFile(tmp);
    return s.WithContext(fmt::format("writing '{}' (the previous file, if any, is unchanged)", path));
  }
  return Status::OK();
}

Status Env::SyncFileSystem(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path, errno);
  const int r = ::syncfs(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) return Errno("cannot sync the file system of", path, err);
  return Status::OK();
}

Status Env::RemoveDir(const std::string& dir) {
  if (::rmdir(dir.c_str()) != 0) return Errno("cannot remove directory", dir, errno);
  return Status::OK();
}

Status Env::WriteFileAtomically(const std::string& path, std::string_view content) {
  return WriteFileAtomically(path, [content](WritableFile* f) { return f->Append(content); });
}

StatusOr<std::string> Env::ReadFileToString(const std::string& path, uint64_t max_bytes) {
  TF_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, NewRandomAccessFile(path));
  if (f->size() > max_bytes) {
    return Status::InvalidArgument("'{}' is {} bytes, more than the {} allowed here", path, f->size(), max_bytes);
  }
  std::string out(static_cast<size_t>(f->size()), '\0');
  TF_RETURN_IF_ERROR(f->ReadExact(0, out.size(), out.data()));
  return out;
}

Status Env::CheckWritableDir(const std::string& dir) {
  // Outputs are local: "s3://b/o" or "S3:/b" would silently become directories named "s3:".
  if (LooksLikeUrl(dir)) {
    return Status::InvalidArgument("'{}' looks like a URL; this output must be a local directory", dir);
  }
  TF_ASSIGN_OR_RETURN(const FileInfo info, Stat(dir));
  if (info.exists && !info.is_directory) return Status::InvalidArgument("'{}' exists and is not a directory", dir);
  TF_RETURN_IF_ERROR(CreateDirs(dir));
  const std::string probe = fmt::format("{}/.trainflow-write-probe.{}", dir, ::getpid());
  Status s = [&]() -> Status {
    TF_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, NewWritableFile(probe));
    TF_RETURN_IF_ERROR(f->Append("probe"));
    return f->Close();
  }();
  (void)RemoveFile(probe);
  return s.WithContext(fmt::format("output directory '{}' is not writable", dir));
}

}  // namespace tf
