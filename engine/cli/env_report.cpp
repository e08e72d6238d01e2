#include "engine/cli/env_report.h"

#include <mpi.h>
#include <omp.h>

#include <thread>

#include <fmt/format.h>

#include "comm/process_group.h"
#include "engine/cli/command.h"
#include "engine/train_backend.h"
#include "kernels/matmul.h"

#if defined(TF_WITH_CUDA)
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "comm/nccl_communicator.h"
#include "kernels/cuda_runtime.h"
#include "kernels/cudnn_attention.h"
#endif

namespace tf {
#if defined(TF_WITH_CUDA)
namespace {

// "13.0" from CUDA's 13000.
std::string CudaVersion(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, v % 1000 / 10) : "none"; }

}  // namespace
#endif

std::vector<std::pair<std::string, std::string>> EnvironmentReport() {
  std::vector<std::pair<std::string, std::string>> r;
  r.emplace_back("build", fmt::format("C++ {} ({}), CUDA backend {}", __cplusplus, __VERSION__,
                                      TrainBackendHasCuda() ? "yes" : "no (CPU only)"));
  r.emplace_back("CPU", fmt::format("{} hardware threads, OpenMP {} threads, GEMM engine {}",
                                    std::thread::hardware_concurrency(), omp_get_max_threads(),
                                    cpu::gemm_engine_name()));
#if defined(TF_WITH_CUDA)
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  r.emplace_back("CUDA", fmt::format("driver {}, runtime {} (built with {})", CudaVersion(driver), CudaVersion(runtime),
                                     CudaVersion(CUDART_VERSION)));
  const int gpus = cuda::DeviceCount();
  r.emplace_back("GPUs", gpus == 0 ? std::string("none visible") : fmt::format("{}", gpus));
  for (int d = 0; d < gpus; ++d) r.emplace_back(fmt::format("  cuda:{}", d), cuda::DeviceDescription(d));
  const size_t lt = cublasLtGetVersion();
  r.emplace_back("cuBLASLt", fmt::format("{}.{}.{}", lt / 10000, lt / 100 % 100, lt % 100));
  r.emplace_back("NCCL", comm::NcclDescription());
  r.emplace_back("cuDNN", cuda::CudnnLibraryDescription());
#else
  r.emplace_back("CUDA", "not built (configure with the CUDA toolkit for the GPU backend)");
#endif
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  std::string mpi_version = "unknown";
  if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) {
    mpi_version = std::string(mpi, static_cast<size_t>(len));
    if (const size_t nl = mpi_version.find_first_of("\n,"); nl != std::string::npos) mpi_version.resize(nl);
  }
  const comm::EnvironmentHint hint = comm::ReadLauncherEnvironment();
  r.emplace_back("MPI", fmt::format("{}; launcher {}, rank {} of {}{}", mpi_version, hint.launcher, hint.rank,
                                    hint.world, hint.world_known ? "" : " (size not given by the launcher)"));
  return r;
}

Command AddEnvCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("env", "What this build is and finds here: CUDA, GPUs, cuBLASLt, NCCL, cuDNN, MPI");
  return {[cmd] { return cmd->parsed(); },
          [] {
            for (const auto& [name, value] : EnvironmentReport()) fmt::print("{:<10} {}\n", name + ":", value);
            return 0;
          }};
}

}  // namespace tf
