#include "checkpoint/object_store.h"

#include <cctype>

#include "checkpoint/s3_store.h"

namespace tf::checkpoint {

Status CheckLocation(const std::string& location) {
  if (IsS3Url(location)) return Status::OK();
  // RFC 3986: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then ':'.
  auto scheme_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.'; };
  size_t i = 0;
  while (i < location.size() && scheme_char(location[i])) ++i;
  const bool url_like = i > 0 && std::isalpha(static_cast<unsigned char>(location[0])) &&
                        location.compare(i, 2, ":/") == 0;
  if (!url_like) return Status::OK();
  return Status::InvalidArgument(
      "checkpoint location '{}' looks like a URL, but the only one supported is s3://bucket/prefix (lower-case, two "
      "slashes); for a local directory whose name holds ':/', write it as ./{}",
      location, location);
}

StatusOr<std::unique_ptr<ObjectStore>> OpenStore(const std::string& location, Env* env) {
  TF_RETURN_IF_ERROR(CheckLocation(location));
  if (IsS3Url(location)) {
    TF_ASSIGN_OR_RETURN(const S3Options options, S3OptionsFromEnvironment());
    return OpenS3Store(location, options);
  }
  return OpenPosixStore(location, env);
}

}  // namespace tf::checkpoint
