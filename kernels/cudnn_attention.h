// Causal self-attention through cuDNN's fused flash-attention engines (cuDNN 9 graph/backend API),
// an optional alternative to our own kernels/flash_attention.h with exactly its contract for bf16:
//   qkv (B,T,3C) bf16: q, k, v side by side per token, NH heads of hs = C/NH (q of head h at columns
//   [h*hs, (h+1)*hs), k at C + ..., v at 2C + ...); out, dout (B,T,C) bf16 heads concatenated; dqkv
//   like qkv, overwritten; lse (B,NH,T) fp32 = natural log of each row's softmax denominator,
//   log sum_{s<=t} exp(q_t.k_s / sqrt(hs)). Scale 1/sqrt(hs), causal (key <= query).
// cuDNN is not linked: libcudnn.so.9 is dlopen()ed on first use (search order in LoadCudnn;
// TRAINFLOW_CUDNN_LIBRARY names the file). Without cuDNN, without a GPU or with a cuDNN older than
// 9.10.2, Create() returns a Status saying what was tried. Plans are built once per (B, T, C, NH,
// direction) and cached, so a training step builds nothing. options.deterministic (the default):
// the backward writes dQ directly (cuDNN's dS workspace, ~400 MB at B=16, T=1024, NH=12); false:
// dQ accumulated with fp32 atomics (faster, less memory, not bit-reproducible).
// Graphs, workspace, determinism: docs/cuda.md, "cuDNN attention" and "kernels/cudnn_attention.h".
//
// Thread safety: none; one object per thread/stream user. Not copyable. Only built with TF_WITH_CUDA.
#pragma once
#if defined(TF_WITH_CUDA)
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kernels/cuda_runtime.h"

namespace tf::cuda {

struct CudnnAttentionOptions {
  bool deterministic = true;  // backward without dQ atomics (see above)
};

class CudnnAttention {
 public:
  enum class Direction { kForward, kBackward };

  // Loads cuDNN, checks its version and creates a cuDNN handle on the current CUDA device.
  static StatusOr<std::unique_ptr<CudnnAttention>> Create(CudnnAttentionOptions options = {});
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Device workspace Forward/Backward need at this shape, in bytes (may be 0). Builds and caches the
  // plan (host work plus, for the backward on cuDNN <= 9.15 with T % 128 != 0, a small synchronous
  // upload), so the model can plan its memory at Create(). REQUIRES: the shape rules of Forward.
  StatusOr<size_t> WorkspaceBytes(Direction dir, int B, int T, int C, int NH);

  // out (B,T,C), lse (B,NH,T) from qkv (B,T,3C), on `stream`, no host synchronisation (after the plan
  // exists). workspace: device memory of at least WorkspaceBytes(kForward, ...) bytes, 256-byte
  // aligned (as cudaMalloc returns), clobbered. REQUIRES: dt == kBF16 (fp32 -> InvalidArgument), B, T,
  // NH >= 1, C % NH == 0, hs = C/NH a multiple of 8 and <= 128, device pointers 16-byte aligned.
  Status Forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH, DType dt, void* workspace,
                 size_t workspace_bytes, cudaStream_t stream);
  // dqkv (B,T,3C) overwritten from dout (B,T,C) and the forward's qkv, out, lse. workspace: at least
  // WorkspaceBytes(kBackward, ...) bytes, 256-byte aligned. REQUIRES: as Forward.
  Status Backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, int B, int T,
                  int C, int NH, DType dt, void* workspace, size_t workspace_bytes, cudaStream_t stream);

  // Plans built so far (a second call with the same shape and direction builds none).
  int plans_built() const { return plans_built_; }
  // "cuDNN 91900 (/path/libcudnn.so.9)" and per cached plan its engine, for logs.
  std::string Describe() const;
  const CudnnAttentionOptions& options() const { return options_; }

  // Builds and finalizes every tensor and operation descriptor of the graph for this shape without a
  // handle or GPU (the operation graph itself needs a handle): lets a CPU-only test check attribute
  // names, types and values against the real library. `cudnn_version` 0 = the loaded library's.
  static Status CheckGraphOnHost(Direction dir, int B, int T, int C, int NH, CudnnAttentionOptions options = {},
                                 int64_t cudnn_version = 0);

  // Plans the graph for a device described in cuDNN's JSON form (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR,
  // cuDNN >= 9.8) with no GPU at all: the operation graph, the heuristics and the engines' run-time
  // compilation happen on the host; finalizing an execution plan then stops at loading the compiled
  // kernel into the (absent) driver. Needs libcuda.so.1 loadable (the toolkit's stub will do).
  // For CI checks that cuDNN's fused engines accept the graphs.
  struct DescribedDevicePlan {
    int engine_configs = 0;        // heuristics mode A's engine configurations
    int64_t config_workspace = -1; // the first configuration's workspace (bytes)
    bool compiled = false;         // its plan got as far as loading the compiled kernel (or finalized)
    std::string plan_status;       // what finalizing its plan answered
  };
  static StatusOr<DescribedDevicePlan> PlanOnDescribedDevice(Direction dir, int B, int T, int C, int NH,
                                                             const std::string& device_json,
                                                             CudnnAttentionOptions options = {});

  struct Plan;  // defined in the .cpp

 private:
  CudnnAttention() = default;
  StatusOr<Plan*> GetPlan(Direction dir, int B, int T, int C, int NH);

  CudnnAttentionOptions options_;
  void* handle_ = nullptr;  // cudnnHandle_t
  int device_ = 0;
  int plans_built_ = 0;
  std::map<std::tuple<int, int, int, int, int>, std::unique_ptr<Plan>> plans_;
};

// Whether libcudnn.so.9 (>= 9.10.2) can be loaded in this process (cached after the first call); the
// error names every path tried. Needs no GPU.
Status CudnnLibraryStatus();
// "9.19.0 from /path/libcudnn.so.9", or "not available: <what was tried>" (for `trainflow env`).
std::string CudnnLibraryDescription();
// Loads exactly `path` (no search, no caching) and checks symbols and version: for tests and tools.
Status ProbeCudnnLibrary(const std::string& path);

}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
