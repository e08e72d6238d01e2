// Env: the file-system interface every file TrainFlow reads or writes goes through (in the spirit of
// LevelDB's Env), so that tests can inject faults (base/fault_env.h). Env::Default() is POSIX.
//
// Errors name the path and carry errno's text ("writing 'out/model.safetensors': No space left on
// device"). Opening for reading refuses anything but a regular file (a directory, a FIFO, a device)
// without blocking. WriteFileAtomically is the only way outputs are written: temp file in the same
// directory, fsync, rename over the target, fsync of the directory — a failed or killed write leaves
// the previous file intact (and no temp file after a failure that returns).
//
// Thread safety: Env methods are thread-safe; a file object is used by one thread at a time.
// Ownership: file objects close themselves on destruction (unsynced data is then not guaranteed).
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tf {

// Address and length granularity of direct I/O (O_DIRECT): the page size, a multiple of every
// common device's logical block size.
inline constexpr size_t kDirectIoAlignment = 4096;

class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to n bytes into dst; returns how many (0 at end of file).
  virtual StatusOr<size_t> Read(size_t n, char* dst) = 0;
  virtual const std::string& path() const = 0;
};

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Exactly n bytes at offset, or Corruption ("truncated") / IOError.
  virtual Status ReadExact(uint64_t offset, size_t n, char* dst) const = 0;
  virtual uint64_t size() const = 0;  // at open time
  virtual const std::string& path() const = 0;
};

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  virtual Status Sync() = 0;   // data and metadata durable (fsync)
  virtual Status Close() = 0;  // idempotent
  virtual const std::string& path() const = 0;
};

struct FileInfo {
  bool exists = false, is_regular = false, is_directory = false;
  uint64_t size = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();  // POSIX; lives for the process

  virtual StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) = 0;
  virtual StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) = 0;
  // Creates or truncates.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Creates or appends at the end.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) = 0;
  // As NewWritableFile, but the file's whole kDirectIoAlignment blocks appended from an address
  // aligned to kDirectIoAlignment bypass the page cache (O_DIRECT: no copy into the cache, no
  // cache pages to allocate or write back; durable only after Sync/SyncFileSystem all the same).
  // Anything else, and every file system without O_DIRECT (tmpfs), is written as usual. The
  // default (for wrapping Envs) is NewWritableFile.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewDirectWritableFile(const std::string& path);
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  // Removes an empty directory (IOError naming it otherwise, e.g. when it is not empty).
  virtual Status RemoveDir(const std::string& dir);
  // Makes everything written to the file system holding `path` durable (syncfs(2)): one call for
  // many files written with WriteFileVisible, instead of an fsync each.
  virtual Status SyncFileSystem(const std::string& path);
  virtual Status SyncDir(const std::string& dir) = 0;
  // mkdir -p; InvalidArgument when a component exists and is not a directory.
  virtual Status CreateDirs(const std::string& dir) = 0;
  virtual StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;  // names, sorted
  virtual StatusOr<uint64_t> FreeSpace(const std::string& path) = 0;  // bytes available to this user
  virtual StatusOr<FileInfo> Stat(const std::string& path) = 0;

  // Writes the whole file atomically as described above; `write` appends the content.
  Status WriteFileAtomically(const std::string& path, const std::function<Status(WritableFile*)>& write);
  Status WriteFileAtomically(const std::string& path, std::string_view content);
  // The same, but not yet durable: temp file, rename, no fsync (SyncFileSystem later). Readers see
  // the whole file or none; after a crash before SyncFileSystem the file may be empty or missing,
  // so only write this way what a later durable write (a manifest) makes count.
  // direct: through NewDirectWritableFile (for big buffers written once and not read back soon).
  Status WriteFileVisible(const std::string& path, std::string_view content, bool direct = false);
  // The whole file; InvalidArgument when it is larger than max_bytes.
  StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes = uint64_t{1} << 30);
  // Fails early (before hours of work) when `dir` cannot hold outputs: creates it and a probe file.
  Status CheckWritableDir(const std::string& dir);
};

// open(2) for writing (O_WRONLY | O_CREAT | O_CLOEXEC | flags) that refuses, without blocking, a
// path that is not a regular file (a FIFO, a directory, a device): for a descriptor handed on (a
// child's log); everything else writes through Env. The descriptor is blocking.
StatusOr<int> OpenRegularForWrite(const std::string& path, int flags, mode_t mode);

// "scheme:/..." (s3://b/p, S3:/b, http:/x): a location, never made a local path.
bool LooksLikeUrl(const std::string& path);

// The directory part of a path ("." for a bare file name).
std::string DirName(const std::string& path);

}  // namespace tf
