// Host memory as the kernel reports it (/proc/meminfo), for start-up checks that refuse a run
// which would not fit instead of being killed by the OOM killer mid-run. Reads go through Env.
// Pure functions; thread-safe.
//
// MemAvailable is the kernel's estimate of the memory a new allocation can get without swapping
// (free memory plus reclaimable page cache). It is the machine's figure: a cgroup memory limit
// (a container, a Slurm job) is not applied to it.
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

}  // namespace tf
