// `trainflow env`: what this build is and what it finds on this machine — the build (compiler, CUDA
// backend), CPU threads and GEMM engine, CUDA driver/runtime and GPUs, cuBLASLt, NCCL and cuDNN (both
// loaded at run time: version and path, or what was tried), MPI library and launcher. The first
// thing to run when a GPU or multi-process setup misbehaves (like DeepSpeed's ds_report or PyTorch's
// collect_env). Loads NCCL/cuDNN if present; starts no MPI and no CUDA work beyond queries. The
// command: AddEnvCommand (engine/cli/command.h), in env_report.cpp.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace tf {

// (name, value) lines, in print order.
std::vector<std::pair<std::string, std::string>> EnvironmentReport();

}  // namespace tf
