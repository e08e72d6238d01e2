#include "base/log.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace tf {

int RankFromEnvironment() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0 && r < (1 << 24)) return static_cast<int>(r);
    }
  }
  return -1;
}

Status InitLogging(const LogOptions& options) {
  const std::string who = options.rank >= 0 ? fmt::format("trainflow[rank {}]", options.rank) : "trainflow";
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_pattern(who + ": %l: %v");
  std::vector<spdlog::sink_ptr> sinks{console};
  Status status;
  if (!options.file.empty()) {
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file, /*truncate=*/false);
      file->set_pattern("%Y-%m-%dT%H:%M:%S.%e " + who + ": %l: %v");
      sinks.push_back(file);
    } catch (const spdlog::spdlog_ex& e) {
      status = Status::IOError("cannot open log file '{}': {}", options.file, e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("trainflow", sinks.begin(), sinks.end());
  const spdlog::level::level_enum level = spdlog::level::from_str(options.level);
  const bool known = level != spdlog::level::off || options.level == "off";
  logger->set_level(known ? level : spdlog::level::info);
  logger->flush_on(spdlog::level::debug);  // every line reaches the file before a crash
  spdlog::set_default_logger(logger);
  if (!known) {
    return Status::InvalidArgument("log level must be debug, info, warning, error or off, got '{}'", options.level);
  }
  return status;
}

}  // namespace tf
