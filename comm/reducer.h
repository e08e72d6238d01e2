// GradientReducer (host buffers): averages a flat fp32 gradient buffer over the ranks of a
// Communicator, bucket by bucket, overlapping with the backward pass that produces it.
//
// Buckets are planned once from the order in which the model announces final gradient ranges
// (GradReadyRanges, model/parameters.h): consecutive ranges merged under bucket_bytes (the first
// under first_bucket_bytes), larger ones split; buckets are contiguous, so no gather copy.
// MarkReady() counts a bucket down; a complete bucket is reduced on the reducer's communication
// thread while backward continues; Finish() waits for all. Every algorithm (none, dense codecs,
// topk) gives bit-identical results on every rank; error-feedback residuals are training state
// (GetState/SetState). Algorithms and ordering: docs/distributed.md, "Gradient reduction".
//
// Thread safety: MarkReady/Finish/BeginStep from one (compute) thread; the communication thread
// touches a bucket's gradient range only between its completion and Finish(); the caller must not
// write a range after announcing it; the communicator belongs to the reducer's thread mid-step.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/codec.h"
#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "base/aligned_buffer.h"

namespace tf::comm {

// Splits `ready_order` ranges into buckets as described above. Pure; exposed for tests.
std::vector<Bucket> PlanBuckets(const std::vector<std::pair<int64_t, int64_t>>& ready_order, int64_t bucket_bytes,
                                int64_t first_bucket_bytes);
// Checks that ready_order tiles [0, n) exactly once (InvalidArgument naming the gap otherwise).
Status CheckTiles(const std::vector<std::pair<int64_t, int64_t>>& ready_order, int64_t n);
// The flat range [begin, end) of bucket b owned by rank r of W in the two-phase algorithms: equal
// shards rounded up to 16 elements (and to the codec block for int8/sign), the last ones shorter
// or empty. Shared by the host and device reducers.
std::pair<int64_t, int64_t> ShardOf(const Bucket& b, int r, int W, const CodecConfig& codec);
// splitmix64 finaliser, for reproducible per-(step, bucket, rank, shard) codec seeds.
uint64_t MixSeed(uint64_t x);

class GradientReducer final : public GradientSync {
 public:
  // `grads` must outlive the reducer. ready_order must cover grads exactly once (checked).
  static StatusOr<std::unique_ptr<GradientReducer>> Create(Communicator* comm, std::span<float> grads,
                                                           const std::vector<std::pair<int64_t, int64_t>>& ready_order,
                                                           const ReducerOptions& options);
  ~GradientReducer() override;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Starts a step: every bucket waits for its ranges again. `step` seeds stochastic rounding.
  void BeginStep(int64_t step) override;
  // [begin, end) of the gradient buffer is final for this step. Must be one of the ranges of
  // ready_order, or a union of consecutive ones.
  void MarkReady(int64_t begin, int64_t end) override;
  // Waits until every bucket is reduced; afterwards grads hold the rank average. Errors: a
  // collective failed or timed out, or some range was never marked ready (names it).
  Status Finish() override;

  const std::vector<Bucket>& buckets() const override { return buckets_; }
  StatusOr<ReducerStats> LastStats() override { return stats_; }
  const ReducerOptions& options() const override { return options_; }
  // Error feedback: worker and server residuals (grads.size() each, when the codec keeps them).
  std::pair<int64_t, int64_t> state_sizes() const override { return {residual_.size(), server_residual_.size()}; }
  Status GetState(std::vector<float>* residual, std::vector<float>* server) override;
  Status SetState(std::span<const float> residual, std::span<const float> server) override;

 private:
  GradientReducer(Communicator* comm, std::span<float> grads, const ReducerOptions& options);
  void ThreadMain();
  Status ReduceBucket(int index);
  Status ReduceExact(const Bucket& b);
  Status ReduceDense(const Bucket& b, uint64_t seed);
  Status ReduceSparse(const Bucket& b, uint64_t seed);
  // Shard [begin, end) of bucket b owned by rank r (aligned to the codec block for dense codecs).
  std::pair<int64_t, int64_t> Shard(const Bucket& b, int r) const;

  Communicator* comm_;
  std::span<float> grads_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  AlignedBuffer residual_, server_residual_;
  // Scratch (communication thread only): encoded send/receive buffers and an fp32 shard.
  std::vector<unsigned char> send_, recv_;
  AlignedBuffer shard_;

  // Guarded by mu_: pending counts, the queue, completion, the first error, stats accumulation.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> pending_;  // elements not yet marked ready, per bucket
  std::deque<int> queue_;
  int done_ = 0;
  Status error_;
  bool stop_ = false;
  int64_t step_ = 0;
  ReducerStats stats_, running_;
  std::thread thread_;
};

}  // namespace tf::comm
