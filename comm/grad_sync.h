// GradientSync: the one interface the training step uses to average gradients over the ranks,
// whatever holds them — GradientReducer (comm/reducer.h: host fp32 buffers over a host
// Communicator) or DeviceGradientReducer (comm/device_reducer.h: device buffers over NCCL) — and a
// local no-op for one rank without compression (comm/grad_sync_setup.h builds them). Per step:
// BeginStep; MarkReady for each range the backward pass finishes (the backend's grad-ready hook);
// Finish (the gradients are then the rank average — on a device, ordered before later work on the
// compute stream — with the communicator's deadline applied); LastStats.
//
// The error-feedback residuals of lossy codecs are training state: GetState/SetState copy them
// (worker residual, then the owner's server residual; empty when the codec keeps none).
// Thread safety: one (compute) thread calls every method.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "comm/codec.h"

namespace tf::comm {

struct ReducerOptions {
  int64_t bucket_bytes = int64_t{25} << 20;      // PyTorch DDP's default bucket_cap_mb = 25
  int64_t first_bucket_bytes = int64_t{1} << 20;  // DDP's first bucket: start communicating early
  CodecConfig codec;                              // kNone: exact fp32 average
  bool error_feedback = true;                     // lossy codecs: carry what was not sent
  uint64_t seed = 0;                              // stochastic rounding streams
};

struct Bucket {
  int64_t begin = 0, end = 0;  // flat range of the gradient buffer
  int64_t size() const { return end - begin; }
};

// Per-step measurements (of the last finished step).
struct ReducerStats {
  int buckets = 0;
  int64_t raw_bytes = 0;     // fp32 bytes averaged (the gradient size)
  int64_t wire_bytes = 0;    // bytes this rank sent, counting a ring/pairwise algorithm per collective
  double comm_ms = 0;        // time inside collectives (communication thread)
  double codec_ms = 0;       // time encoding/decoding (communication thread)
  double exposed_ms = 0;     // time Finish() waited: communication not hidden behind backward
  int overlapped_buckets = 0;  // buckets already reduced when Finish() was called (hidden by backward)
  double busbw_gbps() const { return comm_ms > 0 ? wire_bytes / (comm_ms * 1e6) : 0.0; }
  double compression() const { return wire_bytes > 0 ? static_cast<double>(raw_bytes) / wire_bytes : 0.0; }
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual void BeginStep(int64_t step) = 0;
  virtual void MarkReady(int64_t begin, int64_t end) = 0;
  virtual Status Finish() = 0;
  // Of the last finished step (a device reducer synchronises on its timing events).
  virtual StatusOr<ReducerStats> LastStats() = 0;
  virtual const std::vector<Bucket>& buckets() const = 0;
  virtual const ReducerOptions& options() const = 0;
  // Element counts of the two residuals GetState fills (0 when absent).
  virtual std::pair<int64_t, int64_t> state_sizes() const = 0;
  virtual Status GetState(std::vector<float>* residual, std::vector<float>* server) = 0;
  // REQUIRES: sizes equal state_sizes() (InvalidArgument otherwise).
  virtual Status SetState(std::span<const float> residual, std::span<const float> server) = 0;
};

// A synchroniser without codec state (no error-feedback residuals): the local no-op, the ZeRO
// stages' reduce-scatter. SetState accepts only empty residuals.
class StatelessGradientSync : public GradientSync {
 public:
  std::pair<int64_t, int64_t> state_sizes() const override { return {0, 0}; }
  Status GetState(std::vector<float>* residual, std::vector<float>* server) override {
    residual->clear();
    server->clear();
    return Status::OK();
  }
  Status SetState(std::span<const float> residual, std::span<const float> server) override {
    if (!residual.empty() || !server.empty()) {
      return Status::InvalidArgument("error-feedback state given, but this run has no lossy gradient codec");
    }
    return Status::OK();
  }
};

}  // namespace tf::comm
