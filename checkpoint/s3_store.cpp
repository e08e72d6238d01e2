// The S3 object store (checkpoint/s3_store.h; docs/s3.md): options from the environment, URLs,
// SHA-256 and minimal XML, one HTTP request through libcurl with retries, and the store on top.
#include "checkpoint/s3_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/backoff.h"
#include "base/env.h"
#include "base/parallel.h"
#include "base/sha256.h"
#include "base/utf8.h"

namespace tf::checkpoint {
namespace s3_internal {
namespace {

// ---- XML: the few elements S3's responses need, without a parser dependency.

std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 9, "<![CDATA[") == 0) {
      const size_t end = s.find("]]>", i + 9);
      const size_t stop = end == std::string_view::npos ? s.size() : end;
      out.append(s.substr(i + 9, stop - (i + 9)));
      i = end == std::string_view::npos ? s.size() : end + 3;
      continue;
    }
    if (s[i] != '&') {
      out.push_back(s[i++]);
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 10) {
      out.push_back(s[i++]);
      continue;
    }
    const std::string_view name = s.substr(i + 1, semi - i - 1);
    bool known = true;
    if (name == "amp") {
      out.push_back('&');
    } else if (name == "lt") {
      out.push_back('<');
    } else if (name == "gt") {
      out.push_back('>');
    } else if (name == "quot") {
      out.push_back('"');
    } else if (name == "apos") {
      out.push_back('\'');
    } else if (name.size() >= 2 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      const std::string digits(name.substr(hex ? 2 : 1));
      char* end = nullptr;
      const unsigned long cp = digits.empty() ? 0 : std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      known = !digits.empty() && end != nullptr && *end == '\0' && cp > 0 && cp <= 0x10FFFF;
      if (known) AppendUtf8(static_cast<uint32_t>(cp), &out);
    } else {
      known = false;
    }
    if (known) {
      i = semi + 1;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// The raw (still escaped) content of each <tag>…</tag> or <tag/> element, in document order.
std::vector<std::string_view> XmlElementsRaw(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    const size_t after = pos + open.size();
    if (after >= xml.size()) break;
    const char c = xml[after];
    if (c != '>' && c != '/' && c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      pos = after;  // a longer tag name that starts with `tag`
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {  // <tag/>
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

}  // namespace

std::string UriEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string UriDecode(std::string_view s, bool plus_is_space) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(plus_is_space && s[i] == '+' ? ' ' : s[i]);
    }
  }
  return out;
}

std::vector<std::string> XmlElementTexts(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  for (std::string_view raw : XmlElementsRaw(xml, tag)) out.push_back(XmlUnescape(raw));
  return out;
}

StatusOr<S3Url> ParseS3Url(const std::string& url) {
  if (!IsS3Url(url)) return Status::InvalidArgument("'{}' is not an S3 URL (s3://bucket/optional/prefix)", url);
  const std::string rest = url.substr(5);
  const size_t slash = rest.find('/');
  S3Url out;
  out.bucket = rest.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  const std::string& b = out.bucket;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  const bool bucket_ok = b.size() >= 3 && b.size() <= 63 && alnum(b.front()) && alnum(b.back()) &&
                         b.find("..") == std::string::npos &&
                         std::all_of(b.begin(), b.end(), [&](char c) { return alnum(c) || c == '.' || c == '-'; });
  if (!bucket_ok) {
    return Status::InvalidArgument("'{}': '{}' is not an S3 bucket name (3 to 63 of a-z, 0-9, '.', '-', starting "
                                   "and ending with a letter or digit)",
                                   url, b);
  }
  if (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty()) {
    if (!ValidateKey(prefix).ok()) {
      return Status::InvalidArgument("'{}': the prefix '{}' is not '/'-separated names of letters, digits, '.', "
                                     "'_', '-'",
                                     url, prefix);
    }
    out.prefix = prefix + "/";
  }
  return out;
}

std::string RequestUrl(const S3Options& options, const std::string& bucket, const std::string& s3_key,
                       const std::string& query) {
  std::string endpoint = options.endpoint.empty() ? fmt::format("https://s3.{}.amazonaws.com", options.region)
                                                  : options.endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const bool virtual_host =
      options.addressing == S3Options::Addressing::kVirtualHost ||
      (options.addressing == S3Options::Addressing::kAuto && options.endpoint.empty() &&
       bucket.find('.') == std::string::npos);  // a dotted bucket breaks TLS as a host name
  std::string url;
  if (virtual_host) {
    const size_t scheme_end = endpoint.find("://");
    const size_t host_begin = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    url = endpoint.substr(0, host_begin) + bucket + "." + endpoint.substr(host_begin) + "/" + s3_key;
  } else {
    url = endpoint + "/" + bucket;
    if (!s3_key.empty()) url += "/" + s3_key;
  }
  if (!query.empty()) url += "?" + query;
  return url;
}

}  // namespace s3_internal

bool IsS3Url(const std::string& s) { return s.rfind("s3://", 0) == 0; }

// ---- S3OptionsFromEnvironment -----------------------------------------------------------------
namespace {

using IniFile = std::map<std::string, std::map<std::string, std::string>>;  // section -> key -> value

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// An AWS ini file; a missing file is empty. Indented lines under "key =" (no value) are that key's
// sub-settings, stored as "key.sub" ("s3 =\n  addressing_style = path" -> "s3.addressing_style").
StatusOr<IniFile> ReadIni(const std::string& path) {
  IniFile ini;
  if (path.empty()) return ini;
  TF_ASSIGN_OR_RETURN(const FileInfo info, Env::Default()->Stat(path));
  if (!info.exists) return ini;
  TF_ASSIGN_OR_RETURN(const std::string text, Env::Default()->ReadFileToString(path, 1 << 20));
  std::string section, parent;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view raw(text.data() + begin, end - begin);
    begin = end + 1;
    const std::string line = Trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(std::string_view(line).substr(1, line.size() - 2));
      parent.clear();
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos || section.empty()) continue;
    const std::string key = Trim(std::string_view(line).substr(0, eq));
    const std::string value = Trim(std::string_view(line).substr(eq + 1));
    const bool indented = raw[0] == ' ' || raw[0] == '\t';
    if (indented && !parent.empty()) {
      ini[section][parent + "." + key] = value;
      continue;
    }
    parent = value.empty() ? key : "";
    ini[section][key] = value;
  }
  return ini;
}

const std::map<std::string, std::string>* Section(const IniFile& ini, const std::string& name) {
  const auto it = ini.find(name);
  return it == ini.end() ? nullptr : &it->second;
}

std::string Value(const std::map<std::string, std::string>* section, const std::string& key) {
  if (section == nullptr) return "";
  const auto it = section->find(key);
  return it == section->end() ? "" : it->second;
}

}  // namespace

StatusOr<S3Options> S3OptionsFromEnvironment() {
  S3Options o;
  const std::string home = GetEnv("HOME");
  std::string credentials_path = GetEnv("AWS_SHARED_CREDENTIALS_FILE");
  if (credentials_path.empty() && !home.empty()) credentials_path = home + "/.aws/credentials";
  std::string config_path = GetEnv("AWS_CONFIG_FILE");
  if (config_path.empty() && !home.empty()) config_path = home + "/.aws/config";
  const std::string profile_env = GetEnv("AWS_PROFILE");
  const std::string profile = profile_env.empty() ? "default" : profile_env;

  TF_ASSIGN_OR_RETURN(const IniFile credentials, ReadIni(credentials_path));
  TF_ASSIGN_OR_RETURN(const IniFile config, ReadIni(config_path));
  const auto* cred = Section(credentials, profile);
  const auto* conf = Section(config, "profile " + profile);
  if (conf == nullptr && profile == "default") conf = Section(config, "default");
  if (!profile_env.empty() && cred == nullptr && conf == nullptr) {
    return Status::NotFound("AWS_PROFILE '{}' is neither a section of '{}' nor a [profile {}] of '{}'", profile,
                            credentials_path, profile, config_path);
  }

  if (!GetEnv("AWS_ACCESS_KEY_ID").empty()) {
    o.access_key = GetEnv("AWS_ACCESS_KEY_ID");
    o.secret_key = GetEnv("AWS_SECRET_ACCESS_KEY");
    o.session_token = GetEnv("AWS_SESSION_TOKEN");
  } else {
    for (const auto* section : {cred, conf}) {
      if (!Value(section, "aws_access_key_id").empty()) {
        o.access_key = Value(section, "aws_access_key_id");
        o.secret_key = Value(section, "aws_secret_access_key");
        o.session_token = Value(section, "aws_session_token");
        break;
      }
    }
  }
  for (const std::string& region :
       {GetEnv("AWS_REGION"), GetEnv("AWS_DEFAULT_REGION"), Value(conf, "region"), std::string("us-east-1")}) {
    if (!region.empty()) {
      o.region = region;
      break;
    }
  }
  for (const std::string& endpoint : {GetEnv("AWS_ENDPOINT_URL_S3"), GetEnv("AWS_ENDPOINT_URL"),
                                      Value(conf, "s3.endpoint_url"), Value(conf, "endpoint_url")}) {
    if (!endpoint.empty()) {
      o.endpoint = endpoint;
      break;
    }
  }
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  const std::string style = Value(conf, "s3.addressing_style");
  if (style == "path") o.addressing = S3Options::Addressing::kPath;
  if (style == "virtual") o.addressing = S3Options::Addressing::kVirtualHost;
  return o;
}

// ---- HTTP through libcurl ---------------------------------------------------------------------
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kMinPartBytes = int64_t{5} << 20;   // S3's minimum part (all but the last)
constexpr int64_t kMaxPartBytes = int64_t{5} << 30;   // and maximum
constexpr int64_t kMaxParts = 10000;
constexpr size_t kMaxErrorBody = 64 << 10;            // of an error response kept for its message
constexpr int kMaxListPages = 100'000;               // with max_list_keys, ends a server's endless pages
constexpr int kListPageKeys = 1000;                   // asked of each LIST page (S3's most)
// A LIST page of kListPageKeys keys of at most 1024 bytes each, percent-encoded, with their
// metadata fits easily; a larger answer is refused, not held.
constexpr size_t kMaxListPageBytes = size_t{8} << 20;
constexpr int kMaxGetRestarts = 3;                     // the object changed between ranged reads
const char* const kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::string_view body;             // PUT / POST payload; outlives the call
  std::string payload_sha256;        // of body; "" = of the empty payload
  std::string range;                 // "first-last" (bytes), "" = whole
  std::vector<std::string> headers;  // "Name: value", signed with the rest
  char* sink = nullptr;              // when set, a 2xx body goes here (at most sink_size bytes)
  size_t sink_size = 0;
  size_t max_body = 0;               // without a sink: a 2xx body of more bytes fails (0: any size)
};

struct HttpResponse {
  long status = 0;
  std::string body;                            // a 2xx body (no sink), or the start of an error body
  size_t sink_bytes = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string s3_code, s3_message;             // from an error body
};

// Why an attempt failed: retryable or not, and the Status code when it is the last word.
struct Problem {
  bool retryable = false;
  StatusCode code = StatusCode::kIOError;
  std::string reason;
};

// The result of a call: OK with the final response, or the error (response holds the last one).
struct CallResult {
  Status status;
  HttpResponse response;
  int attempts = 0;
};

// Extra checks of a 2xx response (a short ranged body, an error inside a 200).
using ResponseCheck = std::function<std::optional<Problem>(const HttpResponse&)>;

Status GlobalInit() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) return Status::Internal("curl_global_init failed: {}", curl_easy_strerror(code));
  return Status::OK();
}

struct TransferState {
  CURL* handle = nullptr;
  HttpResponse* response = nullptr;
  char* sink = nullptr;
  size_t sink_size = 0;
  size_t max_body = 0;
  bool sink_overflow = false;  // more than sink_size, or than max_body without a sink
  std::string_view upload;
  size_t upload_pos = 0;
};

bool Is2xx(long status) { return status >= 200 && status < 300; }

size_t WriteCallback(char* data, size_t size, size_t n, void* user) {
  auto* st = static_cast<TransferState*>(user);
  const size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(st->handle, CURLINFO_RESPONSE_CODE, &status);
  HttpResponse& r = *st->response;
  if (!Is2xx(status)) {
    if (r.body.size() < kMaxErrorBody) r.body.append(data, std::min(bytes, kMaxErrorBody - r.body.size()));
    return bytes;
  }
  if (st->sink == nullptr) {
    if (st->max_body > 0 && r.body.size() + bytes > st->max_body) {
      st->sink_overflow = true;
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    r.body.append(data, bytes);
    return bytes;
  }
  if (r.sink_bytes + bytes > st->sink_size) {
    st->sink_overflow = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  std::memcpy(st->sink + r.sink_bytes, data, bytes);
  r.sink_bytes += bytes;
  return bytes;
}

size_t HeaderCallback(char* data, size_t size, size_t n, void* user) {
  auto* st = static_cast<TransferState*>(user);
  const size_t bytes = size * n;
  const std::string_view line(data, bytes);
  if (line.rfind("HTTP/", 0) == 0) {
    st->response->headers.clear();  // a new response (after "100 Continue")
    return bytes;
  }
  const size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    st->response->headers[name] = Trim(line.substr(colon + 1));
  }
  return bytes;
}

size_t ReadCallback(char* buffer, size_t size, size_t n, void* user) {
  auto* st = static_cast<TransferState*>(user);
  const size_t bytes = std::min(size * n, st->upload.size() - st->upload_pos);
  std::memcpy(buffer, st->upload.data() + st->upload_pos, bytes);
  st->upload_pos += bytes;
  return bytes;
}

int SeekCallback(void* user, curl_off_t offset, int origin) {
  auto* st = static_cast<TransferState*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > st->upload.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  st->upload_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

// Idle curl handles, each keeping its connections alive for the next request.
class HandlePool {
 public:
  HandlePool() = default;
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;
  ~HandlePool() {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }
  CURL* Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    return curl_easy_init();
  }
  void Release(CURL* h) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(h);
  }

 private:
  std::mutex mu_;
  std::vector<CURL*> idle_;  // guarded by mu_
};

bool RetryableCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      return true;
    default:
      return false;
  }
}

// The problem with an HTTP error response (status >= 300).
Problem HttpProblem(const HttpResponse& r) {
  Problem p;
  p.reason = std::to_string(r.status);
  if (!r.s3_code.empty()) p.reason += " " + r.s3_code;
  if (!r.s3_message.empty()) p.reason += ": " + r.s3_message;
  if (r.s3_code.empty() && r.s3_message.empty()) {
    std::string snippet = r.body.substr(0, 200);
    std::replace_if(snippet.begin(), snippet.end(), [](unsigned char c) { return c < 0x20 || c > 0x7e; }, ' ');
    p.reason += snippet.empty() ? " (no error body)" : ": " + Trim(snippet);
  }
  const std::vector<std::string> endpoint = s3_internal::XmlElementTexts(r.body, "Endpoint");
  if (!endpoint.empty()) p.reason += fmt::format(" (S3 says: use endpoint '{}')", endpoint[0]);
  const std::vector<std::string> region = s3_internal::XmlElementTexts(r.body, "Region");
  if (!region.empty()) p.reason += fmt::format(" (S3 says: region '{}')", region[0]);
  const bool slow = r.s3_code == "SlowDown" || r.s3_code == "RequestTimeout" || r.s3_code == "InternalError" ||
                    r.s3_code == "ServiceUnavailable" || r.s3_code == "Throttling";
  p.retryable = r.status >= 500 || r.status == 429 || slow;
  if (p.retryable) {
    p.code = StatusCode::kUnavailable;
  } else if (r.status == 404) {
    p.code = StatusCode::kNotFound;
  } else if (r.status == 301 || r.status == 307 || r.s3_code == "AuthorizationHeaderMalformed") {
    p.code = StatusCode::kInvalidArgument;  // the wrong endpoint or region for this bucket
  } else {
    p.code = StatusCode::kIOError;  // refused: 403 and the rest of 4xx
  }
  return p;
}

// ---- The store --------------------------------------------------------------------------------

class S3Store final : public ObjectStore {
 public:
  S3Store(S3Options options, s3_internal::S3Url url)
      : options_(std::move(options)),
        bucket_(std::move(url.bucket)),
        prefix_(std::move(url.prefix)),
        location_("s3://" + bucket_ + (prefix_.empty() ? "" : "/" + prefix_.substr(0, prefix_.size() - 1))),
        endpoint_(options_.endpoint.empty() ? fmt::format("https://s3.{}.amazonaws.com", options_.region)
                                            : options_.endpoint),
        sigv4_("aws:amz:" + options_.region + ":s3") {}
  S3Store(const S3Store&) = delete;
  S3Store& operator=(const S3Store&) = delete;

  Status Put(const std::string& key, std::string_view data) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    if (static_cast<int64_t>(data.size()) <= options_.part_bytes) {
      HttpRequest req;
      req.method = "PUT";
      req.url = ObjectUrl(key, "");
      req.body = data;
      req.payload_sha256 = Sha256Hex(data);
      req.headers = {"Content-Type: application/octet-stream"};
      return Call(Display(key) + ": PUT", req).status;
    }
    return PutMultipart(key, data);
  }

  StatusOr<std::string> Get(const std::string& key) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    for (int restart = 0;; ++restart) {
      bool changed = false;
      auto got = GetOnce(key, &changed);
      if (!changed) return got;
      if (restart + 1 >= kMaxGetRestarts) {
        return Status::Unavailable("{}: GET failed: the object was replaced while it was read, {} times",
                                   Display(key), kMaxGetRestarts);
      }
      spdlog::warn("{}: the object was replaced while it was read; reading it again", Display(key));
    }
  }

  StatusOr<std::vector<std::string>> List(const std::string& prefix) override {
    const std::string full = prefix_ + prefix;
    std::vector<std::string> keys;
    int64_t key_bytes = 0;
    std::set<std::string> tokens_seen;
    std::string token;
    for (int page = 0;; ++page) {
      if (page >= kMaxListPages) return Status::OutOfRange("{}: LIST did not end after {} pages", location_, page);
      std::string query;
      if (!token.empty()) query += "continuation-token=" + s3_internal::UriEncode(token) + "&";
      query += fmt::format("encoding-type=url&list-type=2&max-keys={}&prefix={}", kListPageKeys,
                           s3_internal::UriEncode(full));
      HttpRequest req;
      req.method = "GET";
      req.url = ObjectUrl("", query);
      req.max_body = kMaxListPageBytes;
      const CallResult r = Call(fmt::format("{}: LIST of '{}'", location_, prefix), req);
      if (!r.status.ok()) return r.status;
      const std::string& xml = r.response.body;
      const std::vector<std::string> encoding = s3_internal::XmlElementTexts(xml, "EncodingType");
      const bool url_encoded = !encoding.empty() && encoding[0] == "url";
      for (std::string_view contents : s3_internal::XmlElementsRaw(xml, "Contents")) {
        const std::vector<std::string> k = s3_internal::XmlElementTexts(contents, "Key");
        if (k.empty()) continue;
        // S3 encodes a space as '+' here (and a '+' as %2B), as HTML forms do.
        std::string name = url_encoded ? s3_internal::UriDecode(k[0], /*plus_is_space=*/true) : k[0];
        if (name.rfind(full, 0) != 0 || name.size() <= prefix_.size() || name.back() == '/') continue;
        if (static_cast<int64_t>(keys.size()) >= options_.max_list_keys) {
          return Status::OutOfRange("{}: LIST of '{}' holds more than {} keys (S3Options::max_list_keys; endpoint {})",
                                    location_, prefix, options_.max_list_keys, endpoint_);
        }
        keys.push_back(name.substr(prefix_.size()));
        key_bytes += static_cast<int64_t>(keys.back().size());
        if (key_bytes > options_.max_list_bytes) {
          return Status::OutOfRange("{}: LIST of '{}' holds more than {} bytes of key names (S3Options::max_list_bytes; "
                                    "endpoint {})",
                                    location_, prefix, options_.max_list_bytes, endpoint_);
        }
      }
      const std::vector<std::string> truncated = s3_internal::XmlElementTexts(xml, "IsTruncated");
      if (truncated.empty() || truncated[0] != "true") break;
      const std::vector<std::string> next = s3_internal::XmlElementTexts(xml, "NextContinuationToken");
      if (next.empty() || next[0].empty() || !tokens_seen.insert(next[0]).second) {
        return Status::Internal("{}: LIST of '{}' returned a truncated page without a new continuation token "
                                "(endpoint {})",
                                location_, prefix, endpoint_);
      }
      token = next[0];
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  }

  Status Delete(const std::string& key) override {
    TF_RETURN_IF_ERROR(ValidateKey(key));
    HttpRequest req;
    req.method = "DELETE";
    req.url = ObjectUrl(key, "");
    const CallResult r = Call(Display(key) + ": DELETE", req);
    if (!r.status.ok() && r.response.status == 404 && r.response.s3_code != "NoSuchBucket") return Status::OK();
    return r.status;
  }

  const std::string& location() const override { return location_; }

  // Lists at most one key, so that a missing bucket, refused credentials or a wrong endpoint show
  // up when the store is opened.
  Status Probe() {
    HttpRequest req;
    req.method = "GET";
    req.url = ObjectUrl("", "list-type=2&max-keys=1&prefix=" + s3_internal::UriEncode(prefix_));
    req.max_body = kMaxListPageBytes;
    const CallResult r = Call(fmt::format("{}: LIST (opening the store, bucket '{}')", location_, bucket_), req);
    return r.status;
  }

 private:
  std::string Display(const std::string& key) const { return location_ + "/" + key; }
  std::string ObjectUrl(const std::string& key, const std::string& query) const {
    return s3_internal::RequestUrl(options_, bucket_, key.empty() ? "" : prefix_ + key, query);
  }

  // One attempt of `req`.
  HttpResponse PerformOnce(const HttpRequest& req, CURLcode* code, std::string* curl_error,
                           bool* sink_overflow) {
    HttpResponse response;
    CURL* h = pool_.Acquire();
    if (h == nullptr) {
      *code = CURLE_FAILED_INIT;
      *curl_error = "curl_easy_init failed";
      return response;
    }
    curl_easy_reset(h);
    TransferState st;
    st.handle = h;
    st.response = &response;
    st.sink = req.sink;
    st.sink_size = req.sink_size;
    st.max_body = req.max_body;
    st.upload = req.body;
    char errbuf[CURL_ERROR_SIZE] = {};
    curl_slist* headers = nullptr;
    auto add_header = [&](const std::string& line) {
      curl_slist* next = curl_slist_append(headers, line.c_str());
      if (next != nullptr) headers = next;
    };
    add_header("x-amz-content-sha256: " + (req.payload_sha256.empty() ? kEmptySha256 : req.payload_sha256));
    if (!options_.session_token.empty()) add_header("x-amz-security-token: " + options_.session_token);
    for (const std::string& line : req.headers) add_header(line);

    const long low_speed_time = std::clamp(static_cast<long>(std::ceil(options_.request_timeout_s)), 1L, 30L);
    curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "trainflow-s3/1");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, low_speed_time);
    if (!options_.access_key.empty()) {
      curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4_.c_str());
      curl_easy_setopt(h, CURLOPT_USERNAME, options_.access_key.c_str());
      curl_easy_setopt(h, CURLOPT_PASSWORD, options_.secret_key.c_str());
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteCallback);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, HeaderCallback);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &st);
    if (!req.range.empty()) curl_easy_setopt(h, CURLOPT_RANGE, req.range.c_str());
    if (req.method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (req.method == "PUT") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadCallback);
      curl_easy_setopt(h, CURLOPT_READDATA, &st);
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekCallback);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, &st);
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    } else if (req.method == "POST") {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.data() != nullptr ? req.body.data() : "");
    } else if (req.method == "DELETE") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    } else {
      curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    }
    *code = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
    *curl_error = errbuf[0] != '\0' ? std::string(errbuf) : std::string(curl_easy_strerror(*code));
    *sink_overflow = st.sink_overflow;
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);
    curl_slist_free_all(headers);
    pool_.Release(h);
    if (!Is2xx(response.status) && response.status != 0) {
      const std::vector<std::string> code_text = s3_internal::XmlElementTexts(response.body, "Code");
      const std::vector<std::string> message = s3_internal::XmlElementTexts(response.body, "Message");
      if (!code_text.empty()) response.s3_code = code_text[0];
      if (!message.empty()) response.s3_message = message[0];
    }
    return response;
  }

  // `req` with retries: transient problems are retried with exponential backoff and full jitter, at
  // most options_.max_attempts attempts; anything else fails at once. `what` starts each message.
  CallResult Call(const std::string& what, const HttpRequest& req, const ResponseCheck& check = nullptr) {
    CallResult result;
    const Clock::time_point start = Clock::now();
    for (int attempt = 1;; ++attempt) {
      CURLcode code = CURLE_OK;
      std::string curl_error;
      bool sink_overflow = false;
      const Clock::time_point t0 = Clock::now();
      result.response = PerformOnce(req, &code, &curl_error, &sink_overflow);
      result.attempts = attempt;
      std::optional<Problem> problem;
      if (code != CURLE_OK) {
        problem.emplace();
        problem->retryable = RetryableCurlError(code) && !sink_overflow;
        problem->code = code == CURLE_OPERATION_TIMEDOUT ? StatusCode::kDeadlineExceeded : StatusCode::kUnavailable;
        problem->reason = !sink_overflow ? fmt::format("{} (curl error {})", curl_error, static_cast<int>(code))
                          : req.sink != nullptr
                              ? fmt::format("the server sent more than the {} bytes asked for", req.sink_size)
                              : fmt::format("the answer is larger than the {} bytes allowed", req.max_body);
        if (sink_overflow && req.sink == nullptr) problem->code = StatusCode::kOutOfRange;
      } else if (!Is2xx(result.response.status)) {
        problem = HttpProblem(result.response);
      } else if (check) {
        problem = check(result.response);
      }
      spdlog::debug("s3: {} {} -> {} {} ({} ms)", req.method, req.url, result.response.status,
                    problem ? problem->reason : "OK",
                    std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
      if (!problem) return result;
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (!problem->retryable || attempt >= options_.max_attempts) {
        auto request_id = result.response.headers.find("x-amz-request-id");
        result.status = Status(
            problem->code,
            fmt::format("{} failed: {} (endpoint {}{}, {} attempt{} in {:.1f} s)", what, problem->reason, endpoint_,
                        request_id == result.response.headers.end() ? "" : ", request id " + request_id->second,
                        attempt, attempt == 1 ? "" : "s", elapsed));
        return result;
      }
      const double delay = Backoff(attempt);
      spdlog::warn("{}: attempt {} of {} failed: {}; retrying in {:.2f} s", what, attempt, options_.max_attempts,
                   problem->reason, delay);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    }
  }

  // Full jitter: uniform in [0, min(max_backoff, base * 2^(attempt-1))].
  double Backoff(int attempt) const {
    return FullJitter(ExponentialDelay(options_.base_backoff_s, 2, attempt - 1, options_.max_backoff_s));
  }

  // Runs task(0..n-1) on up to options_.parallelism threads; the first error stops the rest.
  Status RunParallel(size_t n, const std::function<Status(size_t)>& task) {
    return ParallelFor(n, static_cast<size_t>(options_.parallelism), [&](size_t i, size_t) { return task(i); });
  }

  Status PutMultipart(const std::string& key, std::string_view data) {
    const int64_t size = static_cast<int64_t>(data.size());
    const int64_t part = std::max(options_.part_bytes, (size + kMaxParts - 1) / kMaxParts);
    if (part > kMaxPartBytes) {
      return Status::InvalidArgument("{}: {} bytes is more than S3 takes in one object", Display(key), size);
    }
    const size_t parts = static_cast<size_t>((size + part - 1) / part);
    const std::string what = fmt::format("{}: PUT (multipart upload of {} bytes in {} parts)", Display(key), size, parts);

    HttpRequest create;
    create.method = "POST";
    create.url = ObjectUrl(key, "uploads=");
    create.headers = {"Content-Type: application/octet-stream"};
    const CallResult created = Call(what + ", CreateMultipartUpload", create);
    if (!created.status.ok()) return created.status;
    const std::vector<std::string> ids = s3_internal::XmlElementTexts(created.response.body, "UploadId");
    if (ids.empty() || ids[0].empty()) {
      return Status::IOError("{} failed: the server's answer to CreateMultipartUpload has no UploadId (endpoint {})",
                             what, endpoint_);
    }
    const std::string upload_id = s3_internal::UriEncode(ids[0]);

    std::vector<std::string> etags(parts);
    Status s = RunParallel(parts, [&](size_t i) -> Status {
      HttpRequest req;
      req.method = "PUT";
      req.url = ObjectUrl(key, fmt::format("partNumber={}&uploadId={}", i + 1, upload_id));
      req.body = data.substr(i * part, static_cast<size_t>(part));
      req.payload_sha256 = Sha256Hex(req.body);
      const CallResult r = Call(fmt::format("{}, part {}", what, i + 1), req, [](const HttpResponse& resp) {
        std::optional<Problem> p;
        if (resp.headers.count("etag") == 0) p = Problem{false, StatusCode::kIOError, "no ETag in the answer"};
        return p;
      });
      if (r.status.ok()) etags[i] = r.response.headers.at("etag");
      return r.status;
    });
    if (s.ok()) s = CompleteMultipart(key, what, upload_id, etags, size);
    if (s.ok()) return s;

    HttpRequest abort;
    abort.method = "DELETE";
    abort.url = ObjectUrl(key, "uploadId=" + upload_id);
    const CallResult aborted = Call(what + ", AbortMultipartUpload", abort);
    if (aborted.status.ok() || aborted.response.status == 404) {
      return Status(s.code(), s.message() + " (the upload was aborted; no object was written)");
    }
    return Status(s.code(), s.message() + "; then aborting the upload failed too, so its parts stay until a "
                                          "lifecycle rule removes them: " + aborted.status.message());
  }

  Status CompleteMultipart(const std::string& key, const std::string& what, const std::string& upload_id,
                           const std::vector<std::string>& etags, int64_t size) {
    std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
    for (size_t i = 0; i < etags.size(); ++i) {
      std::string etag;
      for (char c : etags[i]) {
        if (c == '&') etag += "&amp;";
        else if (c == '<') etag += "&lt;";
        else if (c == '>') etag += "&gt;";
        else etag += c;
      }
      xml += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", i + 1, etag);
    }
    xml += "</CompleteMultipartUpload>";
    HttpRequest req;
    req.method = "POST";
    req.url = ObjectUrl(key, "uploadId=" + upload_id);
    req.body = xml;
    req.payload_sha256 = Sha256Hex(xml);
    req.headers = {"Content-Type: application/xml"};
    // S3 may answer 200 and put the error in the body.
    const CallResult r = Call(what + ", CompleteMultipartUpload", req, [](const HttpResponse& resp) {
      std::optional<Problem> p;
      if (resp.body.find("<Error>") != std::string::npos) {
        HttpResponse e = resp;
        const std::vector<std::string> c = s3_internal::XmlElementTexts(resp.body, "Code");
        const std::vector<std::string> m = s3_internal::XmlElementTexts(resp.body, "Message");
        e.s3_code = c.empty() ? "" : c[0];
        e.s3_message = m.empty() ? "" : m[0];
        p = HttpProblem(e);
      }
      return p;
    });
    // A retried Complete whose first try succeeded finds no upload: check that the object is there.
    if (!r.status.ok() && r.attempts > 1 && r.response.s3_code == "NoSuchUpload") {
      HttpRequest head;
      head.method = "HEAD";
      head.url = ObjectUrl(key, "");
      const CallResult h = Call(Display(key) + ": HEAD", head);
      const auto length = h.response.headers.find("content-length");
      const auto etag = h.response.headers.find("etag");
      if (h.status.ok() && length != h.response.headers.end() && length->second == std::to_string(size) &&
          etag != h.response.headers.end() &&
          etag->second.find(fmt::format("-{}", etags.size())) != std::string::npos) {
        return Status::OK();
      }
    }
    return r.status;
  }

  // The whole object: HEAD for its size and ETag, then one GET, or parallel ranged GETs for an
  // object larger than part_bytes, each pinned to the ETag (If-Match). *changed when the object was
  // replaced meanwhile.
  StatusOr<std::string> GetOnce(const std::string& key, bool* changed) {
    const std::string what = Display(key) + ": GET";
    HttpRequest head;
    head.method = "HEAD";
    head.url = ObjectUrl(key, "");
    const CallResult h = Call(what + " (HEAD)", head);
    HttpRequest get;
    get.method = "GET";
    get.url = head.url;
    if (!h.status.ok() && h.response.status != 404) return h.status;
    if (!h.status.ok()) {
      // A HEAD answer has no body to say why: the GET's error names NoSuchKey or NoSuchBucket (or
      // the object has just appeared).
      CallResult r = Call(what, get, [](const HttpResponse& resp) { return LengthProblem(resp, resp.body.size()); });
      if (!r.status.ok()) return r.status;
      return std::move(r.response.body);
    }
    const std::string etag = Header(h.response, "etag");
    const std::string length = Header(h.response, "content-length");
    char* end = nullptr;
    const long long total = std::strtoll(length.c_str(), &end, 10);
    if (length.empty() || *end != '\0' || total < 0) {
      return Status::IOError("{} failed: HEAD answered Content-Length '{}' (endpoint {})", what, length, endpoint_);
    }
    if (!etag.empty()) get.headers = {"If-Match: " + etag};
    const int64_t part = options_.part_bytes;
    if (total <= part) {
      CallResult r = Call(what, get, [&](const HttpResponse& resp) -> std::optional<Problem> {
        if (static_cast<long long>(resp.body.size()) != total) {
          return Problem{true, StatusCode::kUnavailable,
                         fmt::format("{} bytes arrived, HEAD said {}", resp.body.size(), total)};
        }
        return std::nullopt;
      });
      if (r.response.status == 412) *changed = true;
      if (!r.status.ok()) return r.status;
      return std::move(r.response.body);
    }

    std::string out(static_cast<size_t>(total), '\0');
    const size_t ranges = static_cast<size_t>((total + part - 1) / part);
    std::atomic<bool> replaced{false};
    Status s = RunParallel(ranges, [&](size_t i) -> Status {
      const int64_t lo = static_cast<int64_t>(i) * part;
      const int64_t hi = std::min<int64_t>(total, lo + part) - 1;
      HttpRequest req = get;
      req.range = fmt::format("{}-{}", lo, hi);
      req.sink = out.data() + lo;
      req.sink_size = static_cast<size_t>(hi - lo + 1);
      const CallResult r = Call(fmt::format("{} (bytes {}-{} of {})", what, lo, hi, total), req,
                                [&](const HttpResponse& resp) -> std::optional<Problem> {
                                  int64_t b = 0, e = 0, t = 0;
                                  if (resp.status != 206 || !ParseContentRange(resp, &b, &e, &t) || b != lo ||
                                      e != hi || t != total || resp.sink_bytes != req.sink_size) {
                                    return Problem{true, StatusCode::kUnavailable,
                                                   fmt::format("asked for bytes {}-{}, got {} with Content-Range "
                                                               "'{}' and {} bytes",
                                                               lo, hi, resp.status, Header(resp, "content-range"),
                                                               resp.sink_bytes)};
                                  }
                                  return std::nullopt;
                                });
      if (r.response.status == 412) replaced = true;
      return r.status;
    });
    if (replaced) *changed = true;
    if (!s.ok()) return s;
    return out;
  }

  static std::string Header(const HttpResponse& r, const std::string& name) {
    const auto it = r.headers.find(name);
    return it == r.headers.end() ? "" : it->second;
  }

  // "bytes first-last/total".
  static bool ParseContentRange(const HttpResponse& r, int64_t* first, int64_t* last, int64_t* total) {
    const std::string v = Header(r, "content-range");
    long long a = 0, b = 0, t = 0;
    if (std::sscanf(v.c_str(), "bytes %lld-%lld/%lld", &a, &b, &t) != 3 || a < 0 || b < a || t <= b) return false;
    *first = a;
    *last = b;
    *total = t;
    return true;
  }

  // A body shorter or longer than its Content-Length (curl catches most; this is the backstop).
  static std::optional<Problem> LengthProblem(const HttpResponse& r, size_t got) {
    const std::string length = Header(r, "content-length");
    if (!length.empty() && length != std::to_string(got)) {
      return Problem{true, StatusCode::kUnavailable,
                     fmt::format("the body has {} bytes, Content-Length says {}", got, length)};
    }
    return std::nullopt;
  }

  const S3Options options_;
  const std::string bucket_;
  const std::string prefix_;    // "" or ending in '/'
  const std::string location_;  // "s3://bucket/prefix"
  const std::string endpoint_;  // for messages
  const std::string sigv4_;     // CURLOPT_AWS_SIGV4's "aws:amz:<region>:s3"
  HandlePool pool_;
};

Status ValidateOptions(const S3Options& o) {
  if (!o.endpoint.empty()) {
    const bool scheme = o.endpoint.rfind("http://", 0) == 0 || o.endpoint.rfind("https://", 0) == 0;
    const size_t host = o.endpoint.find("://") + 3;
    if (!scheme || host >= o.endpoint.size() ||
        o.endpoint.find_first_of(" \t\r\n?#@") != std::string::npos) {
      return Status::InvalidArgument("S3 endpoint '{}' is not an http:// or https:// URL", o.endpoint);
    }
  }
  if (!std::all_of(o.region.begin(), o.region.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
      })) {
    return Status::InvalidArgument("S3 region '{}' is not a region name (a-z, 0-9, '-')", o.region);
  }
  if (o.access_key.empty() != o.secret_key.empty()) {
    return Status::InvalidArgument("S3 credentials need both an access key and a secret key (only the {} is set)",
                                   o.access_key.empty() ? "secret key" : "access key");
  }
  if (o.access_key.empty() && !o.session_token.empty()) {
    return Status::InvalidArgument("an S3 session token needs an access key and a secret key");
  }
  if (o.part_bytes < kMinPartBytes || o.part_bytes > kMaxPartBytes) {
    return Status::InvalidArgument("S3 part_bytes {} is outside S3's part sizes [{}, {}]", o.part_bytes,
                                   kMinPartBytes, kMaxPartBytes);
  }
  if (o.parallelism < 1 || o.parallelism > 64) {
    return Status::InvalidArgument("S3 parallelism {} is outside [1, 64]", o.parallelism);
  }
  if (o.max_attempts < 1 || o.max_attempts > 100) {
    return Status::InvalidArgument("S3 max_attempts {} is outside [1, 100]", o.max_attempts);
  }
  if (o.max_list_keys < 1) return Status::InvalidArgument("S3 max_list_keys {} is not positive", o.max_list_keys);
  if (o.max_list_bytes < 1) return Status::InvalidArgument("S3 max_list_bytes {} is not positive", o.max_list_bytes);
  if (!(o.base_backoff_s >= 0) || !(o.max_backoff_s >= o.base_backoff_s) || o.max_backoff_s > 3600) {
    return Status::InvalidArgument("S3 backoff {} s .. {} s is not 0 <= base <= max <= 3600", o.base_backoff_s,
                                   o.max_backoff_s);
  }
  if (!(o.connect_timeout_s > 0) || !(o.request_timeout_s > 0) || o.connect_timeout_s > 3600 ||
      o.request_timeout_s > 86400) {
    return Status::InvalidArgument("S3 timeouts (connect {} s, request {} s) must be positive", o.connect_timeout_s,
                                   o.request_timeout_s);
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<ObjectStore>> OpenS3Store(const std::string& url, const S3Options& options) {
  TF_ASSIGN_OR_RETURN(s3_internal::S3Url parsed, s3_internal::ParseS3Url(url));
  S3Options o = options;
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (o.region.empty()) o.region = "us-east-1";
  TF_RETURN_IF_ERROR(ValidateOptions(o).WithContext(url));
  TF_RETURN_IF_ERROR(GlobalInit());
  auto store = std::make_unique<S3Store>(std::move(o), std::move(parsed));
  TF_RETURN_IF_ERROR(store->Probe());
  return std::unique_ptr<ObjectStore>(std::move(store));
}

}  // namespace tf::checkpoint
