#include "base/system_memory.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "base/format.h"

namespace tf {
namespace {

// Longer than any meminfo (about 1.5 KiB) or cgroup file read here.
constexpr size_t kMaxFileBytes = size_t{1} << 20;
// cgroup v1 writes "no limit" as a number near INT64_MAX (page-rounded); anything from here up is none.
constexpr int64_t kNoLimit = int64_t{1} << 62;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

// Removes and returns the first line of *text (without its newline).
std::string_view NextLine(std::string_view* text) {
  const size_t eol = std::min(text->find('\n'), text->size());
  const std::string_view line = text->substr(0, eol);
  text->remove_prefix(std::min(eol + 1, text->size()));
  return line;
}

// The whole file, read to its end (/proc and cgroup files report size 0).
StatusOr<std::string> ReadSmallFile(Env* env, const std::string& path) {
  TF_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, env->NewSequentialFile(path));
  std::string text;
  char buf[4096];
  for (;;) {
    TF_ASSIGN_OR_RETURN(const size_t n, file->Read(sizeof(buf), buf));
    if (n == 0) return text;
    text.append(buf, n);
    if (text.size() > kMaxFileBytes) return Status::Corruption("'{}' is longer than {} bytes", path, kMaxFileBytes);
  }
}

std::optional<int64_t> ParseCount(std::string_view s) {
  s = Trim(s);
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

// The value of `key` in a "key value" per line file (cgroup memory.stat).
std::optional<int64_t> StatValue(std::string_view text, std::string_view key) {
  while (!text.empty()) {
    const std::string_view line = NextLine(&text);
    if (line.size() > key.size() && line.starts_with(key) && line[key.size()] == ' ') {
      return ParseCount(line.substr(key.size() + 1));
    }
  }
  return std::nullopt;
}

// The files of one cgroup version's memory controller.
struct CgroupFiles {
  std::string dir;  // the controller's mount
  const char* limit;
  const char* usage;
  const char* inactive_file;  // key in memory.stat
};

// The room under one cgroup's limit; nullopt when it has none (or it cannot be read).
std::optional<int64_t> CgroupRoom(Env* env, const CgroupFiles& files, const std::string& dir, int64_t* limit) {
  auto limit_text = ReadSmallFile(env, dir + "/" + files.limit);
  if (!limit_text.ok()) return std::nullopt;
  const std::optional<int64_t> max = ParseCount(*limit_text);  // v2's "max" does not parse: no limit
  if (!max || *max >= kNoLimit) return std::nullopt;
  auto usage_text = ReadSmallFile(env, dir + "/" + files.usage);
  const std::optional<int64_t> usage = usage_text.ok() ? ParseCount(*usage_text) : std::nullopt;
  if (!usage) return std::nullopt;
  auto stat_text = ReadSmallFile(env, dir + "/memory.stat");
  const int64_t cache = stat_text.ok() ? StatValue(*stat_text, files.inactive_file).value_or(0) : 0;
  *limit = *max;
  return std::max<int64_t>(0, *max - std::max<int64_t>(0, *usage - cache));
}

}  // namespace

StatusOr<int64_t> ParseMemAvailable(std::string_view meminfo, const std::string& source) {
  constexpr std::string_view kKey = "MemAvailable:";
  for (std::string_view text = meminfo; !text.empty();) {
    const std::string_view line = NextLine(&text);
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
  TF_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(env, path));
  return ParseMemAvailable(text, "'" + path + "'");
}

StatusOr<HostMemory> AvailableHostMemory(Env* env, const SystemMemoryPaths& paths) {
  HostMemory best;
  TF_ASSIGN_OR_RETURN(best.available, HostMemAvailable(env, paths.meminfo));
  best.source = "MemAvailable in " + paths.meminfo;

  // /proc/self/cgroup: "hierarchy-id:controllers:path"; cgroup v1's memory controller has its own
  // line and mount, v2 has the single line "0::path" and one mount.
  auto self = ReadSmallFile(env, paths.self_cgroup);
  if (!self.ok()) return best;
  std::optional<CgroupFiles> files;
  std::string path;
  std::string_view text = *self;
  while (!text.empty()) {
    const std::string_view line = NextLine(&text);
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string_view cgroup = Trim(line.substr(c2 + 1));
    bool memory = false;
    for (std::string_view rest = controllers; !rest.empty();) {
      const size_t comma = std::min(rest.find(','), rest.size());
      memory = memory || rest.substr(0, comma) == "memory";
      rest.remove_prefix(std::min(comma + 1, rest.size()));
    }
    if (memory) {
      files = CgroupFiles{paths.cgroup_root + "/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                          "total_inactive_file"};
      path = std::string(cgroup);
      break;
    }
    if (line.starts_with("0::") && !files) {
      files = CgroupFiles{paths.cgroup_root, "memory.max", "memory.current", "inactive_file"};
      path = std::string(cgroup);
    }
  }
  if (!files) return best;
  // From the process's cgroup up to the mount's root. Inside a container the mount may be the
  // container's own cgroup, where the deeper directories do not exist: they are skipped.
  for (;;) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string dir = path == "/" || path.empty() ? files->dir : files->dir + path;
    int64_t limit = 0;
    if (const std::optional<int64_t> room = CgroupRoom(env, *files, dir, &limit); room && *room < best.available) {
      best.available = *room;
      best.source = fmt::format("the room under the memory limit of cgroup {} ({} {})", dir, files->limit,
                                FormatBytes(static_cast<uint64_t>(limit)));
    }
    if (path.empty() || path == "/") return best;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
  }
}

}  // namespace tf
