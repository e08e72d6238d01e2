#include "checkpoint/object_store.h"

#include "base/env.h"
#include "checkpoint/s3_store.h"

namespace tf::checkpoint {

Status CheckLocation(const std::string& location) {
  if (IsS3Url(location)) return Status::OK();
  if (!LooksLikeUrl(location)) return Status::OK();
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
