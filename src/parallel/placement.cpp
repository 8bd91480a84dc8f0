#include "parallel/placement.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>

#include "base/format.hpp"

namespace gpt {

namespace {

// A whole non-negative decimal number, or -1.
long parse_count(const char* s) {
  if (!s || !*s) return -1;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  return (errno || *end || v < 0) ? -1 : v;
}

}  // namespace

std::optional<LocalRank> local_rank_from_env(const std::function<const char*(const char*)>& getenv, int rank,
                                             int world) {
  struct Launcher {
    const char *local, *rank, *size;
  };
  // mpirun first: inside a Slurm job its ranks also carry the SLURM_* of the step they were started from.
  static const Launcher kLaunchers[] = {
      {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"SLURM_LOCALID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},
  };
  for (const Launcher& l : kLaunchers) {
    const long local = parse_count(getenv(l.local));
    if (local < 0 || local >= world) continue;
    if (parse_count(getenv(l.rank)) != rank || parse_count(getenv(l.size)) != world) continue;
    return LocalRank{int(local), l.local};
  }
  return std::nullopt;
}

std::string launch_mismatch(const std::function<const char*(const char*)>& getenv, int world) {
  const long tasks = parse_count(getenv("SLURM_STEP_NUM_TASKS"));
  if (world != 1 || tasks <= 1 || parse_count(getenv("SLURM_PROCID")) < 0) return "";
  const char* mpi = getenv("SLURM_MPI_TYPE");
  return "srun started " + std::to_string(tasks) + " tasks (SLURM_STEP_NUM_TASKS) but MPI sees a world of 1" +
         (mpi ? std::string(" under srun --mpi=") + mpi : std::string()) +
         ": srun's MPI plugin does not start this MPI library's ranks, so each task runs alone (see `srun "
         "--mpi=list`; SRUN_MPI or LAUNCHER=mpirun in slurm/lib.sh)";
}

std::string describe_placement(const std::vector<RankPlace>& ranks) {
  constexpr size_t kNamed = 4;  // nodes named in full; a job of hundreds gets a count
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_node;
  std::map<std::string, int> by_source;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto& list = by_node[ranks[r].node];
    if (list.empty()) order.push_back(ranks[r].node);
    list.push_back(int(r));
    ++by_source[ranks[r].local_rank_from];
  }
  std::string s = std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank" : " ranks") + " on " +
                  std::to_string(order.size()) + (order.size() == 1 ? " node: " : " nodes: ");
  for (size_t i = 0; i < order.size() && i < kNamed; ++i)
    s += (i ? ", " : "") + order[i] + " (" + (by_node[order[i]].size() == 1 ? "rank " : "ranks ") +
         ranges_text(by_node[order[i]]) + ")";
  if (order.size() > kNamed) s += ", ... (" + std::to_string(order.size() - kNamed) + " more)";
  s += "; local rank from ";
  bool first = true;
  for (const auto& [from, n] : by_source) {
    s += (first ? "" : ", ") + from + (by_source.size() > 1 ? " (" + std::to_string(n) + ")" : "");
    first = false;
  }
  return s;
}

int gpu_of_local_rank(int local_rank, int visible, bool shared) {
  if (visible <= 0 || local_rank < 0) return -1;
  if (visible == 1) return 0;
  if (shared) return local_rank % visible;
  return local_rank < visible ? local_rank : -1;
}

std::string gpu_sharing_problem(const std::vector<RankGpu>& ranks) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_node;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto& list = by_node[ranks[r].node];
    if (list.empty()) order.push_back(ranks[r].node);
    list.push_back(int(r));
  }
  std::string first;
  int nodes = 0;
  for (const std::string& node : order) {
    std::map<std::string, std::vector<int>> by_gpu;  // PCI bus id -> its ranks
    std::vector<int> none;
    int visible = 0;
    for (int r : by_node[node]) {
      const RankGpu& g = ranks[size_t(r)];
      visible = std::max(visible, g.visible);
      if (!g.id.empty()) by_gpu[g.id].push_back(r);
      else if (g.visible > 0) none.push_back(r);  // a rank without any GPU leaves the check to the plan
    }
    std::string shared;
    for (const auto& [id, rs] : by_gpu)
      if (rs.size() > 1) shared += std::string(shared.empty() ? "" : ", ") + "ranks " + ranges_text(rs) + " share GPU " + id;
    if (shared.empty() && none.empty()) continue;
    if (++nodes > 1) continue;
    const int gpus = std::max(visible, int(by_gpu.size()));
    const size_t n = by_node[node].size();
    first = std::to_string(n) + " ranks on node " + node + ", which has " + std::to_string(gpus) +
            (gpus == 1 ? " GPU" : " GPUs") + " for them: " + shared +
            (none.empty() ? "" : std::string(shared.empty() ? "" : "; ") + (none.size() == 1 ? "rank " : "ranks ") +
                                     ranges_text(none) + (none.size() == 1 ? " has" : " have") + " none") +
            ". NCCL takes one GPU per rank: start at most " + std::to_string(gpus) +
            (gpus == 1 ? " rank" : " ranks") + " per node (mpirun -np " + std::to_string(gpus) +
            " on one node), or set parallel.shared_gpu: host to run several ranks on each GPU, their collectives "
            "staged through host memory (for tests and memory measurements: the throughput is not representative)";
  }
  if (nodes > 1) first += " (and " + std::to_string(nodes - 1) + " more node" + (nodes > 2 ? "s" : "") + " alike)";
  return first;
}

}  // namespace gpt
