// The S3 object store: ObjectStore (checkpoint/object_store.h) over Amazon S3 or an S3-compatible
// service, through libcurl with SigV4 signing (docs/s3.md). "s3://bucket/prefix" holds object
// `key` as S3 key "prefix/key". Put is one PutObject, or a multipart upload (parts in parallel,
// aborted on failure) above part_bytes — atomic either way, as S3 makes an object visible only
// once written whole. Get HEADs the object for its size and ETag, then reads it with one GET or,
// above part_bytes, parallel ranged GETs pinned to the ETag, and checks the length.
// List reads pages of at most 1000 keys, each answer at most 8 MiB (a larger one is refused while it
// arrives, never held), and at most S3Options::max_list_keys keys in all. Transient failures (5xx, 429/SlowDown, RequestTimeout, timeouts, refused or dropped
// connections) are retried with exponential backoff and full jitter, bounded in attempts and time;
// other errors are returned at once, naming the operation, the s3:// key, the endpoint and S3's
// error code and message. Credentials never appear in messages or logs.
//
// Thread safety: every method may be called from many threads at once (as object_store.h asks).
// A store owns a pool of curl handles (its connections); it is not copyable.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "checkpoint/object_store.h"

namespace tf::checkpoint {

struct S3Options {            // every field has a sensible default; FromEnvironment fills them
  std::string endpoint;       // "http://127.0.0.1:4568"; "" = https://s3.<region>.amazonaws.com
  std::string region;         // AWS_REGION / AWS_DEFAULT_REGION / profile's region; default "us-east-1"
  std::string access_key, secret_key, session_token;  // never printed or logged; no keys: unsigned requests
  enum class Addressing { kAuto, kPath, kVirtualHost } addressing = Addressing::kAuto;  // auto: path for a custom endpoint, virtual-host for AWS
  int64_t part_bytes = 16 << 20;      // multipart part size (objects larger than this use multipart upload)
  int parallelism = 4;                // concurrent part uploads / ranged downloads per object
  int max_attempts = 5;               // retries with exponential backoff + full jitter on 5xx, 429/SlowDown, timeouts, dropped connections
  double base_backoff_s = 0.2, max_backoff_s = 10.0;
  double connect_timeout_s = 10, request_timeout_s = 120;  // plus a low-speed limit so a stalled transfer fails
  int64_t max_list_keys = 10'000'000;  // a List of more keys fails (OutOfRange) instead of growing without bound
  int64_t max_list_bytes = int64_t{512} << 20;  // ... or of more bytes of key names (bounds the memory it holds)
};

// Reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_DEFAULT_REGION,
// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE,
// ~/.aws/credentials and ~/.aws/config (ini; [profile x] in config). Env vars win over files.
// NotFound when AWS_PROFILE names a profile neither file has; IOError for a file that exists but
// cannot be read. Other fields keep S3Options' defaults.
StatusOr<S3Options> S3OptionsFromEnvironment();

// url: "s3://bucket/optional/prefix". InvalidArgument naming the url when malformed, or naming the
// option when `options` are out of range (part_bytes in [5 MiB, 5 GiB], parallelism in [1, 64],
// max_attempts in [1, 100], positive timeouts). Lists at most one key of the prefix, so a missing
// bucket (NotFound), refused credentials (IOError) or an unreachable endpoint (Unavailable) is
// reported here, naming the bucket and endpoint.
StatusOr<std::unique_ptr<ObjectStore>> OpenS3Store(const std::string& url, const S3Options& options);

bool IsS3Url(const std::string& s);  // starts with "s3://"

// Building blocks, exposed for tests (tests/checkpoint/s3_store_test.cpp).
namespace s3_internal {

struct S3Url {
  std::string bucket;
  std::string prefix;  // "" or ending in '/': "runs/a/"
};
StatusOr<S3Url> ParseS3Url(const std::string& url);

// The request URL for S3 key `s3_key` ("" = the bucket) with an already canonical `query` (sorted
// name=value pairs, values encoded by UriEncode; "" = none). REQUIRES: options validated.
std::string RequestUrl(const S3Options& options, const std::string& bucket, const std::string& s3_key,
                       const std::string& query);
// RFC 3986 percent-encoding of everything but A-Z a-z 0-9 - _ . ~ (upper-case hex), as SigV4 wants.
std::string UriEncode(std::string_view s);
// Decodes any percent-encoding; '+' becomes ' ' when plus_is_space (S3's encoding-type=url).
std::string UriDecode(std::string_view s, bool plus_is_space = false);
// The unescaped text of each <tag>…</tag> element in `xml`, in document order (entities &amp; &lt;
// &gt; &quot; &apos; &#N; &#xN; decoded; CDATA kept verbatim).
std::vector<std::string> XmlElementTexts(std::string_view xml, std::string_view tag);

}  // namespace s3_internal
}  // namespace tf::checkpoint
