// Status / StatusOr: how every library function in TrainFlow reports failure.
//
// Library code never exits or throws across module boundaries; it returns a Status that
// carries a code and a human-readable message naming the problem (the key, the file, the
// shape). Only main() turns a Status into an exit code. Context is added on the way up with
// WithContext(), so a message reads "loading configs/x.json: key 'n_head': expected integer".
//
// Thread safety: values; safe to copy between threads.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

// nvcc's front end cannot compile fmt's headers (its consteval format-string checks); .cu files see
// Status without the fmt-based factories and build messages as plain strings.
#if !defined(__CUDACC__)
#include <fmt/format.h>
#endif

namespace tf {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad config value, flag, shape or file content supplied by the user
  kNotFound,         // a file, key or tensor that should exist does not
  kIOError,          // the operating system refused (errno attached to the message)
  kCorruption,       // a file exists but its bytes are not what the format says
  kOutOfRange,       // an index or size outside what is allowed
  kUnimplemented,    // asked for a feature this build does not have
  kInternal,         // a broken invariant or a failing library call (CUDA, cuBLAS, ...)
  kUnavailable,      // a peer rank or the communication library failed (retrying may help)
  kDeadlineExceeded, // a collective or peer did not answer within its deadline (retrying may help)
  kCancelled,        // stopped on request (SIGINT/SIGTERM) before the work was done
};

const char* StatusCodeName(StatusCode code);

// The process exit codes main() returns (docs/exit-codes.md; `trainflow --help` lists them). A
// supervisor acts on them: 2 stops the job, 3 and 4 are worth a restart, 5 means "resume me".
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,      // a bug or an unexpected library failure
  kExitBadInput = 2,      // bad configuration, flag or input file: do not retry
  kExitRetryable = 3,     // a peer or communication failure, or a timeout: retry
  kExitIOError = 4,       // the OS or storage refused (disk full, permissions): retry once fixed
  kExitStopped = 5,       // stopped by SIGINT/SIGTERM after finishing a step and writing outputs
};
ExitCode ExitCodeFor(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
#if !defined(__CUDACC__)
  template <typename... Args>
  static Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status IOError(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kIOError, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status Corruption(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kCorruption, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status OutOfRange(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status Unimplemented(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kUnimplemented, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status Internal(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status Unavailable(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status DeadlineExceeded(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kDeadlineExceeded, fmt::format(f, std::forward<Args>(args)...));
  }
  // errno-style failure: "<what>: <strerror(err)>".
#endif
  static Status FromErrno(const std::string& what, int err);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>" (or "OK").
  std::string ToString() const;
  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT
  StatusOr(T value) : value_(std::move(value)) {}                                  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok()
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tf

#define TF_STATUS_CONCAT_INNER(a, b) a##b
#define TF_STATUS_CONCAT(a, b) TF_STATUS_CONCAT_INNER(a, b)

// Evaluates expr (a Status); returns it from the current function if it is not OK.
#define TF_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::tf::Status tf_status_ = (expr);            \
    if (!tf_status_.ok()) return tf_status_;     \
  } while (0)

// TF_ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define TF_ASSIGN_OR_RETURN(lhs, expr) \
  TF_ASSIGN_OR_RETURN_IMPL(TF_STATUS_CONCAT(tf_statusor_, __LINE__), lhs, expr)
#define TF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
