// `trainflow slurm submit [options] -- train ...` writes a readable sbatch script for a training job
// and submits it; `trainflow slurm run` is what that script runs inside the allocation: the
// supervisor (launch/supervisor.h) launching the ranks with `srun --mpi=pmix` on the allocation's
// nodes, which checkpoints and requeues the job before its time limit (SIGUSR1), checkpoints on
// preemption, isolates failing nodes and resubmits the job without them when too few remain, and
// reports what the job used. Registered on the CLI app by AddSlurmCommands; RunSlurmCommand runs
// the one parsed and returns the exit code. docs/slurm.md.
#pragma once
#include <memory>

#include <CLI/CLI.hpp>

namespace tf {

struct SlurmCommands;
std::shared_ptr<SlurmCommands> AddSlurmCommands(CLI::App& app);
bool SlurmCommandParsed(const SlurmCommands& commands);
int RunSlurmCommand(const SlurmCommands& commands);

}  // namespace tf
