// Host memory as the kernel reports it, for start-up checks that refuse a run which would not fit
// instead of being killed by the OOM killer mid-run. Reads go through Env. Thread-safe.
//
// MemAvailable (/proc/meminfo) is the kernel's estimate of the memory a new allocation can get
// without swapping (free memory plus reclaimable page cache), for the whole machine. A process in a
// cgroup with a memory limit (a container, a Slurm job with ConstrainRAMSpace) is killed at that
// limit whatever MemAvailable says: AvailableHostMemory takes the tighter of the two.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "base/env.h"
#include "base/status.h"

namespace tf {

inline constexpr char kProcMeminfo[] = "/proc/meminfo";

// MemAvailable in bytes from meminfo's text ("MemAvailable:   24197176 kB"); Corruption naming
// `source` when the line is missing or malformed.
StatusOr<int64_t> ParseMemAvailable(std::string_view meminfo, const std::string& source);

// MemAvailable of the file at `path` (read to its end: /proc files report size 0), in bytes.
StatusOr<int64_t> HostMemAvailable(Env* env, const std::string& path = kProcMeminfo);

// Where AvailableHostMemory looks (tests point it at a fake tree).
struct SystemMemoryPaths {
  std::string meminfo = kProcMeminfo;
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

struct HostMemory {
  int64_t available = 0;  // bytes
  std::string source;     // where it was read, for messages
};

// The memory a new allocation of this process can get: MemAvailable, or the room under the
// tightest memory limit of this process's cgroup and its ancestors when that is less (limit -
// usage + inactive file cache, which the kernel reclaims first; cgroup v2 memory.max or v1
// memory.limit_in_bytes). An unreadable or absent cgroup counts as no limit; only a meminfo that
// cannot be read is an error.
StatusOr<HostMemory> AvailableHostMemory(Env* env, const SystemMemoryPaths& paths = {});

}  // namespace tf
