#include "comm/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>
#include <nlohmann/json.hpp>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/json.h"
#include "base/net.h"
#include "comm/mpi_util.h"

namespace tf::comm {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0 || x > (1 << 24)) return fallback;
  return static_cast<int>(x);
}

// The first top-level key whose value differs between two JSON objects, as "key 'k' is A on rank 0
// and B on rank R"; "" when either is not a JSON object or none differs.
std::string FirstDifference(const std::string& zero, const std::string& mine, int rank) {
  const auto pa = ParseJson(zero, "rank 0's configuration", /*allow_comments=*/false);
  const auto pb = ParseJson(mine, fmt::format("rank {}'s configuration", rank), /*allow_comments=*/false);
  if (!pa.ok() || !pb.ok() || !pa->is_object() || !pb->is_object()) return "";
  const nlohmann::json& a = *pa;
  const nlohmann::json& b = *pb;
  std::vector<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.push_back(k);
  for (const auto& [k, v] : b.items()) {
    if (!a.contains(k)) keys.push_back(k);
  }
  for (const std::string& k : keys) {
    const std::string va = a.contains(k) ? a[k].dump() : "absent", vb = b.contains(k) ? b[k].dump() : "absent";
    if (va != vb) return fmt::format("key '{}' is {} on rank 0 and {} on rank {}", k, va, vb, rank);
  }
  return "";
}

// Broadcasts a string of any length from `root`.
Status BroadcastString(std::string* s, int root) {
  unsigned long long n = s->size();
  TF_MPI_RETURN_IF_ERROR(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD));
  s->resize(static_cast<size_t>(n));
  if (n > 0) TF_MPI_RETURN_IF_ERROR(MPI_Bcast(s->data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD));
  return Status::OK();
}

void FinalizeMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::mutex g_init_mu;
bool g_initialised = false;   // guarded by g_init_mu
Topology g_topology;          // written once under g_init_mu, then read-only
Status g_init_status;         // the first InitProcessGroup's result

Status InitLocked() {
  const EnvironmentHint hint = ReadLauncherEnvironment();
  Topology t;
  t.hostname = HostName();
  if (t.hostname.empty()) t.hostname = "unknown";
  t.launcher = hint.launcher;
  const char* force = std::getenv("TRAINFLOW_MPI");
  const bool forbid = force != nullptr && std::string(force) == "0";
  const bool forced = force != nullptr && std::string(force) == "1";
  if (forbid || (!forced && hint.world <= 1)) {
    g_topology = t;  // world 1, no MPI
    return Status::OK();
  }
  if (forced && hint.world <= 1) t.launcher = "forced";

  int already = 0;
  MPI_Initialized(&already);
  if (already) {  // someone else started MPI: it must still allow our communication thread
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      return Status::Internal("MPI was initialised elsewhere with thread level {}, but TrainFlow needs "
                              "MPI_THREAD_MULTIPLE",
                              provided);
    }
  } else {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Init_thread");
    std::atexit(FinalizeMpi);
    if (provided < MPI_THREAD_MULTIPLE) {
      return Status::Internal("the MPI library provides thread level {} but TrainFlow needs MPI_THREAD_MULTIPLE "
                              "(its communication thread runs beside the compute thread); use an MPI built "
                              "with thread support (Debian's Open MPI has it)",
                              provided);
    }
  }
  // Errors come back as codes (converted to Status) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &t.rank));
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &t.world));
  if (hint.world > 1 && hint.world_known && hint.world != t.world) {
    return Status::InvalidArgument(
        "the launcher ({}) started {} ranks but MPI reports a world of {}: the program was probably "
        "launched by a different MPI than the one it was built with (TrainFlow uses Open MPI {}.{})",
        hint.launcher, hint.world, t.world, MPI_VERSION, MPI_SUBVERSION);
  }
  MPI_Comm local = MPI_COMM_NULL;
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local));
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_rank(local, &t.local_rank));
  TF_MPI_RETURN_IF_ERROR(MPI_Comm_size(local, &t.local_world));
  // Node index: nodes are ordered by their lowest world rank (the rank of local rank 0).
  int leader = t.local_rank == 0 ? t.rank : -1;
  TF_MPI_RETURN_IF_ERROR(MPI_Bcast(&leader, 1, MPI_INT, 0, local));
  MPI_Comm_free(&local);
  std::vector<int> leaders(static_cast<size_t>(t.world));
  TF_MPI_RETURN_IF_ERROR(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  t.num_nodes = static_cast<int>(leaders.size());
  t.node = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) - leaders.begin());
  t.mpi = true;
  g_topology = t;
  return Status::OK();
}

}  // namespace

std::string Topology::Describe() const {
  const bool even = num_nodes > 0 && world % num_nodes == 0;
  return fmt::format("{} rank{} on {} node{} ({}){}; this is rank {} = node {} local rank {} of {} on host {}", world,
                     world == 1 ? "" : "s", num_nodes, num_nodes == 1 ? "" : "s",
                     even ? fmt::format("{} per node", world / num_nodes) : std::string("uneven"),
                     mpi ? fmt::format(", launched by {}", launcher) : std::string(", no launcher"), rank, node,
                     local_rank, local_world, hostname);
}

EnvironmentHint ReadLauncherEnvironment() {
  EnvironmentHint h;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    h.launcher = "mpirun";
    h.world = EnvInt("OMPI_COMM_WORLD_SIZE", 1);
    h.rank = EnvInt("OMPI_COMM_WORLD_RANK", 0);
    h.local_rank = EnvInt("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    h.local_world = EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (std::getenv("SLURM_NTASKS") != nullptr && std::getenv("SLURM_PROCID") != nullptr &&
             std::getenv("SLURM_STEP_ID") != nullptr) {
    // Inside an srun step (SLURM_STEP_ID distinguishes it from a batch script's environment).
    h.launcher = "srun";
    h.world = EnvInt("SLURM_NTASKS", 1);
    h.rank = EnvInt("SLURM_PROCID", 0);
    h.local_rank = EnvInt("SLURM_LOCALID", 0);
    const int nodes = std::max(1, EnvInt("SLURM_NNODES", 1));
    h.local_world = EnvInt("SLURM_NTASKS_PER_NODE", (h.world + nodes - 1) / nodes);
  } else if (std::getenv("PMI_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr) {
    h.launcher = "pmi";
    h.world_known = std::getenv("PMI_SIZE") != nullptr;
    h.world = EnvInt("PMI_SIZE", 2);  // PMIx alone does not name the size: "several", checked by MPI
    h.rank = EnvInt("PMI_RANK", EnvInt("PMIX_RANK", 0));
    h.local_rank = EnvInt("MPI_LOCALRANKID", 0);
    h.local_world = EnvInt("MPI_LOCALNRANKS", 1);
  }
  if (h.world < 1) h.world = 1;
  return h;
}

StatusOr<Topology> InitProcessGroup() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  if (!g_initialised) {
    g_init_status = InitLocked();
    g_initialised = true;
  }
  TF_RETURN_IF_ERROR(g_init_status);
  return g_topology;
}

void AbortProcessGroupOnError(int code) {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return;
  MPI_Finalized(&finalized);
  if (finalized) return;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world <= 1) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

uint64_t Fingerprint(const std::string& value) { return XXH64(value.data(), value.size(), 0x7472666c6f77ULL); }

Status CheckSameOnAllRanks(const std::string& value, const std::string& what) {
  TF_ASSIGN_OR_RETURN(Topology t, InitProcessGroup());
  if (t.world == 1) return Status::OK();
  unsigned long long mine = Fingerprint(value);
  std::vector<unsigned long long> all(static_cast<size_t>(t.world));
  TF_MPI_RETURN_IF_ERROR(
      MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD));
  std::vector<int> differ;
  for (int r = 1; r < t.world; ++r) {
    if (all[static_cast<size_t>(r)] != all[0]) differ.push_back(r);
  }
  if (differ.empty()) return Status::OK();
  // Every rank saw the same fingerprints, so all take part in naming the first differing key: rank
  // 0's value goes to everyone, and the first differing rank's finding comes back to everyone.
  std::string zero = t.rank == 0 ? value : std::string();
  TF_RETURN_IF_ERROR(BroadcastString(&zero, 0));
  std::string detail = t.rank == differ.front() ? FirstDifference(zero, value, t.rank) : std::string();
  TF_RETURN_IF_ERROR(BroadcastString(&detail, differ.front()));
  return Status::InvalidArgument("rank{} {} {} a different {} than rank 0{}: every rank must be started with the same "
                                 "configs and data",
                                 differ.size() == 1 ? "" : "s", fmt::join(differ, ", "),
                                 differ.size() == 1 ? "has" : "have", what, detail.empty() ? "" : " (" + detail + ")");
}

}  // namespace tf::comm
