// RangeProfiler: where the GPU time of a training step goes, by named range (e.g. "matmul fwd",
// "attention bwd"), timed with CUDA events on one stream — no host synchronisation until
// Collect(), so profiling does not change the order or overlap of the work it measures (an event
// record is a few hundred nanoseconds of GPU time between kernels).
//
// Usage: Create() once (it pre-creates the events), then Begin("name") before each piece of stream
// work (a Begin closes the range before it; End() closes the last), then Collect() for the totals.
// Ranges are sequential on the stream (not nested). Beyond `max_ranges` per collection further
// ranges are dropped and counted. Only built with the CUDA backend. Not thread-safe.
#pragma once
#if defined(TF_WITH_CUDA)
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "base/status.h"

namespace tf::cuda {

class RangeProfiler {
 public:
  struct Total {
    std::string name;
    double ms = 0;  // summed over the collected ranges with this name
    int count = 0;
  };
  static StatusOr<std::unique_ptr<RangeProfiler>> Create(cudaStream_t stream, int max_ranges = 4096);
  ~RangeProfiler();
  RangeProfiler(const RangeProfiler&) = delete;
  RangeProfiler& operator=(const RangeProfiler&) = delete;

  // `name` must outlive Collect() (string literals).
  void Begin(const char* name);
  void End();
  // Waits for the stream; the totals per name in first-seen order since the last Collect().
  StatusOr<std::vector<Total>> Collect();
  // Ranges dropped for lack of events since the last Collect().
  int dropped() const { return dropped_; }

 private:
  explicit RangeProfiler(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;  // 2 per range
  std::vector<const char*> names_;   // per recorded range
  int open_ = -1;                    // index of the range begun and not ended, or -1
  int dropped_ = 0;
  cudaError_t error_ = cudaSuccess;  // first failed event record
};

}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
