// Building the GradientSync (comm/grad_sync.h) for a backend's gradient buffer: host buffers get
// the host GradientReducer, device buffers an NCCL communicator and the DeviceGradientReducer, with
// the codec configured or chosen by measurement (`auto`). Collective: every rank calls it.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/auto_codec.h"
#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "comm/process_group.h"

namespace tf::comm {

// Where a backend's gradients live.
struct GradientBuffer {
  void* data = nullptr;
  DataType dtype = DataType::kF32;  // host: kF32; device: kF32 or kBF16
  int64_t elements = 0;
  bool on_device = false;
  int device = 0;
  void* compute_stream = nullptr;  // cudaStream_t of the backward pass (device only)
  void* comm_stream = nullptr;     // cudaStream_t for NCCL (device only)
};

struct GradientSyncSetup {
  std::unique_ptr<GradientSync> sync;
  std::string codec;   // the codec in effect
  std::string reason;  // why (for the start-up report)
};

// Builds the synchroniser for `grads`: host buffers reduce over `host`; device buffers get an NCCL
// communicator of `topology` (owned by the returned object). `compression` is a codec name or
// "auto" (measured, comm/auto_codec.h; collective). `ready_order` as GradientReducer::Create.
StatusOr<GradientSyncSetup> MakeGradientSync(const Topology& topology, Communicator* host, const GradientBuffer& grads,
                                             const std::vector<std::pair<int64_t, int64_t>>& ready_order,
                                             ReducerOptions options, const std::string& compression);
// One rank, nothing to send: every call is a no-op.
std::unique_ptr<GradientSync> MakeLocalGradientSync();

}  // namespace tf::comm
