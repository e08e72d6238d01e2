// Token file reader/writer. Format: docs/formats.md ("Token files").
#include "engine/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <initializer_list>
#include <limits>
#include <utility>

namespace tf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are read by copying little-endian bytes straight into memory");
static_assert(kTokenFileMagicLowHalf == 55432 && kTokenFileMagicHighHalf == 308);

// Owns a file descriptor; not copyable.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int Close() {  // reports close() errors (delayed write errors surface here)
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

Status PreadExact(int fd, const std::string& path, uint64_t offset, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("reading " + path, errno);
    }
    if (r == 0) return Status::Corruption("{}: unexpected end of file at byte {}", path, offset);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::OK();
}

Status WriteAll(int fd, const std::string& what, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("writing " + what, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// Writes `parts` to <path>.tmp, fsyncs, renames over <path>, fsyncs the directory. On any
// failure the temporary is removed and <path> is left as it was.
Status WriteFileAtomically(const std::string& path,
                           std::initializer_list<std::pair<const void*, size_t>> parts) {
  const std::string tmp = path + ".tmp";
  Status s;
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return Status::FromErrno("creating " + tmp, errno);
    for (const auto& [buf, n] : parts) {
      s = WriteAll(fd.get(), tmp, buf, n);
      if (!s.ok()) break;
    }
    if (s.ok() && ::fsync(fd.get()) != 0) s = Status::FromErrno("fsync " + tmp, errno);
    if (s.ok() && fd.Close() != 0) s = Status::FromErrno("closing " + tmp, errno);
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::FromErrno("renaming " + tmp + " to " + path, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return Status::FromErrno("opening directory " + dir, errno);
  if (::fsync(dfd.get()) != 0) return Status::FromErrno("fsync directory " + dir, errno);
  return Status::OK();
}

}  // namespace

StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound("{}: no such token file", path);
    return Status::FromErrno("opening " + path, errno);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument("{}: not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return Status::Corruption("{}: token file is empty", path);

  int32_t first = 0;
  if (size >= sizeof(first)) TF_RETURN_IF_ERROR(PreadExact(fd.get(), path, 0, &first, 4));
  uint64_t data_offset = 0;
  uint64_t count = 0;
  if (size >= sizeof(first) && first == kTokenFileMagic) {
    if (size < kTokenFileHeaderBytes)
      return Status::Corruption(
          "{}: starts with the token-file magic but is {} bytes, shorter than the {} byte header",
          path, size, kTokenFileHeaderBytes);
    int32_t header[kTokenFileHeaderInts];
    TF_RETURN_IF_ERROR(PreadExact(fd.get(), path, 0, header, kTokenFileHeaderBytes));
    if (header[1] != kTokenFileVersion)
      return Status::Corruption("{}: token file version {} is not supported (expected {}{})",
                                path, header[1], kTokenFileVersion,
                                header[1] == 2 ? "; version 2 holds uint32 tokens" : "");
    if (header[2] < 0)
      return Status::Corruption("{}: header token count {} is negative", path, header[2]);
    count = static_cast<uint64_t>(header[2]);
    const uint64_t expected = kTokenFileHeaderBytes + count * sizeof(uint16_t);
    if (size != expected)
      return Status::Corruption(
          "{}: header says {} tokens, so the file should be {} bytes, but it is {} bytes ({})",
          path, count, expected, size, size < expected ? "truncated" : "trailing bytes");
    data_offset = kTokenFileHeaderBytes;
  } else {
    if (size % 2 != 0)
      return Status::Corruption(
          "{}: bare uint16 token stream has odd length {} bytes (expected a multiple of 2)", path,
          size);
    count = size / 2;
  }
  std::vector<uint16_t> tokens(count);
  TF_RETURN_IF_ERROR(
      PreadExact(fd.get(), path, data_offset, tokens.data(), count * sizeof(uint16_t)));
  return tokens;
}

Status WriteTokenFile(const std::string& path, std::span<const uint16_t> tokens,
                      bool with_header) {
  const size_t data_bytes = tokens.size() * sizeof(uint16_t);
  if (!with_header) {
    if (tokens.empty())
      return Status::InvalidArgument("{}: a bare token stream must hold at least one token",
                                     path);
    return WriteFileAtomically(path, {{tokens.data(), data_bytes}});
  }
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return Status::InvalidArgument("{}: {} tokens do not fit the header's int32 count", path,
                                   tokens.size());
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  return WriteFileAtomically(path, {{header, kTokenFileHeaderBytes}, {tokens.data(), data_bytes}});
}

Status ValidateTokens(std::span<const uint16_t> tokens, int vocab_size, const std::string& path) {
  if (vocab_size <= 0)
    return Status::InvalidArgument("{}: vocab size {} must be positive", path, vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int>(tokens[i]) >= vocab_size)
      return Status::InvalidArgument("{}: token id {} at position {} is >= vocab size {}", path,
                                     tokens[i], i, vocab_size);
  }
  return Status::OK();
}

}  // namespace tf
