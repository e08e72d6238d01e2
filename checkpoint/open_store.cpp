#include "checkpoint/object_store.h"
#include "checkpoint/s3_store.h"

namespace tf::checkpoint {

StatusOr<std::unique_ptr<ObjectStore>> OpenStore(const std::string& location, Env* env) {
  if (IsS3Url(location)) {
    TF_ASSIGN_OR_RETURN(const S3Options options, S3OptionsFromEnvironment());
    return OpenS3Store(location, options);
  }
  return OpenPosixStore(location, env);
}

}  // namespace tf::checkpoint
