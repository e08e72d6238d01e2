// Communicator: the collectives data parallelism needs, over one group of ranks, behind one
// interface with three implementations:
//   SingleProcessCommunicator  world size 1 (no MPI, or a group of one): copies or no-ops.
//   MpiCommunicator            CPU ranks: host buffers, MPI non-blocking collectives polled with a
//                              deadline (comm/mpi_communicator.h).
//   NcclCommunicator           GPU ranks: device buffers, NCCL on a communication stream
//                              (comm/nccl_communicator.h, CUDA builds only).
//
// Semantics: every rank calls the same collectives in the same order with the same sizes (the
// reducer guarantees it). A host call returns when the collective is complete on this rank, an
// NCCL one when it is enqueued; overlap with compute comes from the caller (the reducer's thread or
// stream). A host collective not complete within timeout_seconds() returns a DeadlineExceeded-style
// Internal error naming the collective and its size and marks the communicator failed (every later
// call fails at once). Thread safety: one thread at a time per communicator. docs/distributed.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "base/status.h"

namespace tf::comm {

enum class DataType { kF32, kF64, kBF16, kU8 };
size_t DataTypeSize(DataType t);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  virtual const char* name() const = 0;  // "single", "mpi", "nccl"

  // In place: data[0..n) = sum over ranks of data[0..n).
  virtual Status AllReduceSum(void* data, int64_t n, DataType dt) = 0;
  // counts (world entries) partitions send (sum(counts) elements, in rank order) into blocks;
  // recv (counts[rank] elements) = sum over ranks of their block number `rank`.
  // Host communicators (single, MPI) add in rank order: each element is x_0 + x_1 + ... + x_{W-1},
  // starting from rank 0's value, whatever the counts partition, so a sum never depends on which
  // rank owns the element (ZeRO shards and replicated data parallelism agree bit for bit). recv
  // may be send's block number `rank` itself (in place). fp32 and fp64 only (InvalidArgument
  // otherwise). NCCL sums in its own (fixed) order.
  virtual Status ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) = 0;
  // recv (sum(counts) elements) = every rank r's send (counts[r] elements), in rank order. send
  // may be this rank's own block of recv (in place).
  virtual Status AllGatherV(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) = 0;
  // recv (world*bytes) = every rank's send (bytes), in rank order.
  virtual Status AllGather(const void* send, void* recv, size_t bytes) = 0;
  // send and recv hold world blocks of `bytes`; block j of send goes to rank j, and block j of
  // recv comes from rank j.
  virtual Status AllToAll(const void* send, void* recv, size_t bytes) = 0;
  // data (bytes) on every rank = root's data.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;

  double timeout_seconds() const { return timeout_s_; }
  // Clamped to [1 ms, 1e7 s] (larger values, inf included, mean "practically never").
  void set_timeout_seconds(double s) { timeout_s_ = s > 1e7 ? 1e7 : (s < 1e-3 ? 1e-3 : s); }

 protected:
  Communicator(int rank, int world) : rank_(rank), world_(world) {}
  int rank_, world_;
  // TRAINFLOW_COMM_TIMEOUT (seconds, default 300): the longest a collective may take.
  double timeout_s_ = 300.0;
};

class SingleProcessCommunicator final : public Communicator {
 public:
  SingleProcessCommunicator() : Communicator(0, 1) {}
  const char* name() const override { return "single"; }
  Status AllReduceSum(void*, int64_t, DataType) override { return Status::OK(); }
  Status ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) override;
  Status AllGatherV(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) override;
  Status AllGather(const void* send, void* recv, size_t bytes) override;
  Status AllToAll(const void* send, void* recv, size_t bytes) override;
  Status Broadcast(void*, size_t, int root) override;
  Status Barrier() override { return Status::OK(); }
};

// The host communicator for `topology`: SingleProcessCommunicator when world == 1, otherwise an
// MpiCommunicator over a duplicate of MPI_COMM_WORLD (so its traffic never mixes with other MPI
// users). Reads TRAINFLOW_COMM_TIMEOUT.
StatusOr<std::unique_ptr<Communicator>> MakeHostCommunicator(const Topology& topology);
// The host communicator over the ranks of `topology` that pass the same `color` as this one
// (MPI_Comm_split of MPI_COMM_WORLD), ordered as in the world: SingleProcessCommunicator when this
// rank is alone in its color, otherwise an MpiCommunicator over the split. ZeRO replica groups use
// two: color rank / G gives a rank's group of G consecutive ranks (its index there is rank % G),
// color rank % G the ranks across the groups with the same index. Collective: every rank of the
// world calls it, in the same order. REQUIRES: color >= 0. Reads TRAINFLOW_COMM_TIMEOUT.
StatusOr<std::unique_ptr<Communicator>> MakeSplitCommunicator(const Topology& topology, int color);
// In place: data[0..n) = the sum over the ranks of `comm`, bit-identical on every rank, which an
// all-reduce does not promise: ReduceScatterSum (each element added in rank order on one rank) into
// `scratch`, then AllGatherV. fp32; scratch grows to at most ceil(n / world) elements. Returns the
// bytes this rank sent. Collective over `comm`.
StatusOr<int64_t> AllReduceSumIdentical(Communicator& comm, float* data, int64_t n, std::vector<float>* scratch);
// What this process is using its communicators for ("step 12: gradient reduction"), quoted by the
// warnings and timeout errors of waits so a stuck collective says what it was for. Thread-safe.
void SetActivity(std::string what);
std::string CurrentActivity();  // "" when none was set
// " (while <activity>)" or "" — for messages.
std::string ActivitySuffix();

// TRAINFLOW_COMM_TIMEOUT in seconds (default 300); InvalidArgument naming the variable when it is
// not a positive number. Used by every communicator.
StatusOr<double> CommTimeoutFromEnvironment();

}  // namespace tf::comm
