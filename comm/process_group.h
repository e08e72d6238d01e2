// Process-group bootstrap: who am I in a data-parallel job? Rank, world size, local rank (on this
// node), node index and node count — from MPI when the process was started by a launcher (mpirun,
// srun, or any PMI/PMIx launcher), world size 1 when it was started plainly.
//
// Launcher detection reads the environment first (Open MPI: OMPI_COMM_WORLD_*; Slurm: SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES, SLURM_NODEID; PMI/PMIx: PMI_RANK, PMI_SIZE, PMIX_RANK,
// MPI_LOCALRANKID), so a GPU can be chosen before MPI starts; when the environment names more
// than one rank, MPI is initialised (MPI_THREAD_MULTIPLE) and its answers are authoritative: local
// ranks come from MPI_Comm_split_type(SHARED) and nodes from the ranks' host groups.
// TRAINFLOW_MPI=1 forces MPI initialisation (e.g. a singleton run that should still use MPI),
// TRAINFLOW_MPI=0 forbids it (world size 1 whatever the environment says).
//
// Ownership: MPI is initialised at most once per process, by the first InitProcessGroup(), and
// finalised at process exit (std::atexit). Thread safety: InitProcessGroup() is safe to call from
// several threads (one initialises, the others wait); the Topology it returns is immutable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace tf::comm {

struct Topology {
  int rank = 0;
  int world = 1;
  int local_rank = 0;   // index among the ranks on this node
  int local_world = 1;  // ranks on this node
  int node = 0;         // index of this node (nodes ordered by their lowest rank)
  int num_nodes = 1;
  bool mpi = false;            // MPI is initialised and world may be > 1
  std::string launcher = "none";  // "mpirun", "srun", "pmi", "forced" or "none"
  std::string hostname;
  // One line for logs: "2 ranks on 1 node (2 per node); rank 0 = node 0 local 0 on host foo".
  std::string Describe() const;
};

// What the environment says before MPI starts (world 1 when nothing is set). Pure; for tests.
struct EnvironmentHint {
  int rank = 0, world = 1, local_rank = 0, local_world = 1;
  bool world_known = true;  // false when the launcher names no size (PMIx): world is then a guess
  std::string launcher = "none";
};
EnvironmentHint ReadLauncherEnvironment();

// Initialises (once) and returns the process topology. Errors: MPI failed to start, or the
// environment and MPI disagree about the world size (a launcher/MPI-library mismatch, which would
// otherwise start N independent single-rank jobs).
StatusOr<Topology> InitProcessGroup();

// Consistency check across ranks (collective: every rank must call it with its own value):
// all-gathers a 64-bit fingerprint of `what` and returns an error naming the ranks whose value
// differs from rank 0's, e.g. "ranks 1, 3 have a different training config than rank 0".
// Returns OK at once when world == 1. REQUIRES: InitProcessGroup() succeeded.
Status CheckSameOnAllRanks(const std::string& value, const std::string& what);

// For main() after an error: in a multi-rank MPI job, flushes stdio and calls MPI_Abort(code), which
// ends every rank (a failing rank must not leave its peers waiting in a collective, nor wait in
// MPI_Finalize for them); otherwise returns and the caller exits normally.
void AbortProcessGroupOnError(int code);

// 64-bit fingerprint used by CheckSameOnAllRanks (xxhash64).
uint64_t Fingerprint(const std::string& value);

}  // namespace tf::comm
