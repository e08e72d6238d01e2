#include "base/status.h"

#include <cstring>

namespace tf {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIOError: return "I/O error";
    case StatusCode::kCorruption: return "corrupt data";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kUnimplemented: return "unimplemented";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnavailable: return "peer or communication failure";
    case StatusCode::kDeadlineExceeded: return "timeout";
    case StatusCode::kCancelled: return "stopped";
  }
  return "unknown";
}

ExitCode ExitCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruption:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented: return kExitBadInput;
    case StatusCode::kIOError: return kExitIOError;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded: return kExitRetryable;
    case StatusCode::kCancelled: return kExitStopped;
    case StatusCode::kInternal: return kExitInternal;
  }
  return kExitInternal;
}

Status Status::FromErrno(const std::string& what, int err) {
  return Status(StatusCode::kIOError, what + ": " + std::strerror(err));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace tf
