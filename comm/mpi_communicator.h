// MpiCommunicator: the CPU implementation of Communicator (comm/communicator.h) over MPI.
//
// Each collective is started non-blocking (MPI_Iallreduce, ...) and then polled with MPI_Test
// until it completes or the deadline (timeout_seconds()) passes. ReduceScatterSum is an
// all-to-all-v (MPI_Ialltoallv) into a reusable scratch buffer followed by a rank-order sum on the
// owner, so its results do not depend on the counts partition (MPI_Reduce_scatter's order may). The poll never sleeps (Open MPI
// moves data only inside MPI calls; a sleeping poller starves TCP transfers) but yields the core
// on every turn, so runnable compute threads go first. On timeout or MPI error the
// communicator is marked failed (MPI cannot cancel a collective) and later calls fail at once;
// the caller reports the error and exits, and the launcher tears the job down.
//
// Ownership: owns a duplicate of the communicator it was built from (freed in the destructor).
// Thread safety: one thread at a time (MPI is initialised with MPI_THREAD_MULTIPLE, so that thread
// may be a different one from the thread that created it).
#pragma once
#include <mpi.h>

#include <atomic>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace tf::comm {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `base` (MPI_COMM_WORLD by default). REQUIRES: MPI is initialised.
  static StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm base = MPI_COMM_WORLD);
  ~MpiCommunicator() override;

  const char* name() const override { return "mpi"; }
  Status AllReduceSum(void* data, int64_t n, DataType dt) override;
  Status ReduceScatterSum(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) override;
  Status AllGatherV(const void* send, void* recv, std::span<const int64_t> counts, DataType dt) override;
  Status AllGather(const void* send, void* recv, size_t bytes) override;
  Status AllToAll(const void* send, void* recv, size_t bytes) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int world) : Communicator(rank, world), comm_(comm) {}
  // Polls `req` to completion or deadline; `what` names the collective for errors.
  Status Wait(MPI_Request* req, const char* what, size_t bytes);
  Status CheckUsable(const char* what) const;

  MPI_Comm comm_;
  std::atomic<bool> failed_{false};
  // ReduceScatterSum's receive blocks ((world - 1) * counts[rank] elements; doubles for alignment),
  // kept between calls so the reducer's buckets reuse one allocation.
  std::vector<double> scratch_;
};

}  // namespace tf::comm
