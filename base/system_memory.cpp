#include "base/system_memory.h"

#include <charconv>
#include <limits>
#include <memory>

namespace tf {
namespace {

// Longer than any meminfo (about 1.5 KiB); a file beyond it is not meminfo.
constexpr size_t kMaxMeminfoBytes = size_t{1} << 20;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

StatusOr<int64_t> ParseMemAvailable(std::string_view meminfo, const std::string& source) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t pos = 0;
  while (pos < meminfo.size()) {
    size_t eol = meminfo.find('\n', pos);
    if (eol == std::string_view::npos) eol = meminfo.size();
    const std::string_view line = meminfo.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.starts_with(kKey)) continue;
    std::string_view rest = Trim(line.substr(kKey.size()));
    int64_t kib = -1;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
    const std::string_view unit = Trim(rest.substr(static_cast<size_t>(end - rest.data())));
    if (ec != std::errc() || kib < 0 || unit != "kB" || kib > std::numeric_limits<int64_t>::max() / 1024) {
      return Status::Corruption("{}: cannot read '{}' (expected 'MemAvailable: <n> kB')", source, line);
    }
    return kib * 1024;
  }
  return Status::Corruption("{} has no MemAvailable line (Linux 3.14 or later writes one)", source);
}

StatusOr<int64_t> HostMemAvailable(Env* env, const std::string& path) {
  TF_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, env->NewSequentialFile(path));
  std::string text;
  char buf[4096];
  for (;;) {
    TF_ASSIGN_OR_RETURN(const size_t n, file->Read(sizeof(buf), buf));
    if (n == 0) break;
    text.append(buf, n);
    if (text.size() > kMaxMeminfoBytes) {
      return Status::Corruption("'{}' is longer than {} bytes: not a meminfo file", path, kMaxMeminfoBytes);
    }
  }
  return ParseMemAvailable(text, "'" + path + "'");
}

}  // namespace tf
