// Where each rank runs: its node and its local rank there, which picks its GPU (one GPU per local rank).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gpt {

struct RankPlace {
  std::string node;             // MPI_Get_processor_name: the host as the rank sees it
  int local_rank = 0;           // among the ranks of its node
  std::string local_rank_from;  // the variable it was read from, or "MPI_COMM_TYPE_SHARED"
};

struct LocalRank {
  int rank = 0;
  std::string from;
};

// The local rank the launcher gave this process, from its environment (getenv: name -> value or
// nullptr): OpenMPI's mpirun sets OMPI_COMM_WORLD_LOCAL_RANK, srun sets SLURM_LOCALID. Each is taken
// only when the same launcher's rank and size variables name this very rank of this world, so that
// variables a process merely inherited (the batch step's SLURM_LOCALID=0 under mpirun, say) are never
// read as its own. nullopt when no launcher says: the caller asks MPI (MPI_COMM_TYPE_SHARED).
std::optional<LocalRank> local_rank_from_env(const std::function<const char*(const char*)>& getenv, int rank,
                                             int world);

// Empty, or a warning when srun started this process as one of several tasks but MPI sees it alone
// (world 1): srun's --mpi plugin does not wire up this MPI library, so each task would run by itself.
std::string launch_mismatch(const std::function<const char*(const char*)>& getenv, int world);

// "4 ranks on 2 nodes: n1 (ranks 0-1), n2 (ranks 2-3); local rank from SLURM_LOCALID", at most a few
// nodes named.
std::string describe_placement(const std::vector<RankPlace>& ranks);

}  // namespace gpt
