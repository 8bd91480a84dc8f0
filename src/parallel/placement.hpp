// Where each rank runs: its node and its local rank there, which picks its GPU (one GPU per local rank,
// or several ranks on one GPU with parallel.shared_gpu: host).
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

// The GPU a local rank takes among the `visible` ones, or -1 for none: the only one there is (the
// launcher bound one GPU to each task), else GPU local_rank; with `shared` (parallel.shared_gpu: host)
// local rank modulo the GPUs, so that several ranks take turns on each.
int gpu_of_local_rank(int local_rank, int visible, bool shared);

// A rank's GPU as the ranks of a node compare them at start-up.
struct RankGpu {
  std::string node;  // RankPlace::node
  std::string id;    // the GPU's PCI bus id ("0000:19:00.0"); empty: no GPU for this rank
  int visible = 0;   // GPUs this rank sees (0: none at all, nothing to compare)
};

// Empty when every rank of every node has a GPU of its own, else the reason why not, for rank 0 to print
// once: the first node where two ranks share a GPU or a rank has none (its ranks, its GPUs, what to do).
// NCCL takes one GPU per rank; a run started that way would fail in NCCL's start, after the plan.
std::string gpu_sharing_problem(const std::vector<RankGpu>& ranks);

}  // namespace gpt
