// Run-time loading of optional shared libraries (NCCL, cuDNN, NVML): the binary starts on machines
// without them, and a missing or unusable library is a clear error naming every place searched.
//
// DynamicLibrary owns a dlopen() handle (closed on destruction; not copyable, movable).
// LoadLibrary() tries candidates in order and returns the first one `accept` approves; when the
// override environment variable is set, only the file it names is tried (an explicit choice is never
// silently replaced by another copy). Thread safety: Symbol() on a loaded library is thread-safe.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace tf {

class DynamicLibrary {
 public:
  DynamicLibrary() = default;
  ~DynamicLibrary();
  DynamicLibrary(DynamicLibrary&& o) noexcept
      : handle_(std::exchange(o.handle_, nullptr)), path_(std::move(o.path_)) {}
  DynamicLibrary& operator=(DynamicLibrary&& o) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  // dlopen(path, RTLD_NOW | RTLD_LOCAL); the error carries dlerror().
  static StatusOr<DynamicLibrary> Open(const std::string& path);
  bool loaded() const { return handle_ != nullptr; }
  // The file loaded (resolved to a directory when found through the loader's search path).
  const std::string& path() const { return path_; }
  // nullptr when the library lacks `name`.
  void* Symbol(const char* name) const;
  // Resolves `name` into a function pointer; NotFound naming the library and symbol.
  template <typename Fn>
  Status Resolve(Fn* fn, const char* name) const {
    *fn = reinterpret_cast<Fn>(Symbol(name));
    if (*fn == nullptr) return Status(StatusCode::kNotFound, path_ + " lacks " + name);
    return Status::OK();
  }

 private:
  void* handle_ = nullptr;
  std::string path_;
};

struct LibrarySearch {
  std::string name;          // "libnccl.so.2": for messages
  std::string override_env;  // e.g. "TRAINFLOW_NCCL_LIBRARY"
  // File names or paths; entries with '*' are glob patterns, expanded in sorted order.
  std::vector<std::string> candidates;
  std::string hint;  // appended to the not-found error ("install NCCL or set ...")
};

// The usual places for NVIDIA's libraries: $<home_env>/lib{,64}/<soname>, the loader's search
// path (<soname>), $CUDA_HOME/lib64, and PyTorch's pip wheels (nvidia/<wheel_dir>/lib/<soname>).
std::vector<std::string> NvidiaLibraryCandidates(const std::string& soname, const std::string& home_env,
                                                 const std::string& wheel_dir);

// `accept` (optional) checks a loaded candidate (symbols, version); a rejected one is closed and
// the search goes on, its reason recorded. NotFound lists what was tried and why each failed.
StatusOr<DynamicLibrary> LoadLibrary(const LibrarySearch& search,
                                     const std::function<Status(const DynamicLibrary&)>& accept = nullptr);

}  // namespace tf
