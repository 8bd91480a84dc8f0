// Local ranks from the launcher's environment, and the start-up line that describes where ranks run.
#include <map>
#include <string>

#include "test_util.hpp"
#include "parallel/placement.hpp"

using namespace gpt;

namespace {
using Env = std::map<std::string, std::string>;

std::optional<LocalRank> from(const Env& env, int rank, int world) {
  return local_rank_from_env(
      [&](const char* k) {
        auto it = env.find(k);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      rank, world);
}
}  // namespace

TEST(Placement, srun_task_takes_slurm_localid) {
  // rank 3 of 4 under srun -N2 --ntasks-per-node=2: the second task of the second node
  const auto lr = from({{"SLURM_LOCALID", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"}}, 3, 4);
  EXPECT_TRUE(lr && lr->rank == 1 && lr->from == "SLURM_LOCALID");
}

TEST(Placement, mpirun_in_a_slurm_job_takes_openmpi_over_inherited_slurm_variables) {
  // mpirun's ranks inherit SLURM_LOCALID=0 and the SLURM_PROCID of the daemon that started them
  const Env env{{"SLURM_LOCALID", "0"},        {"SLURM_PROCID", "1"},        {"SLURM_STEP_NUM_TASKS", "2"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}};
  const auto lr = from(env, 3, 4);
  EXPECT_TRUE(lr && lr->rank == 1 && lr->from == "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST(Placement, variables_of_another_rank_or_world_are_not_taken) {
  // the batch step's variables in every rank of a launcher that sets none of its own
  const Env batch{{"SLURM_LOCALID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  EXPECT_TRUE(!from(batch, 2, 4));
  EXPECT_TRUE(!from(batch, 0, 4));  // rank 0 too: the world is not the step's
  // the batch shell has no step task count: nothing to check the rank against
  EXPECT_TRUE(!from({{"SLURM_LOCALID", "0"}, {"SLURM_PROCID", "0"}}, 0, 1));
  EXPECT_TRUE(!from({}, 0, 1));
}

TEST(Placement, malformed_or_impossible_values_are_not_taken) {
  for (const char* bad : {"", "x", "-1", "1x", "4"}) {
    const auto lr = from({{"SLURM_LOCALID", bad}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"}}, 1, 4);
    EXPECT_TRUE(!lr) << std::string("SLURM_LOCALID='") + bad + "' was taken";
  }
}

TEST(Placement, warns_when_srun_tasks_each_see_a_world_of_one) {
  const Env env{{"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_PROCID", "2"}, {"SLURM_MPI_TYPE", "none"}};
  auto get = [&](const char* k) {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const std::string w = launch_mismatch(get, 1);
  EXPECT_TRUE(w.find("srun started 4 tasks") != std::string::npos && w.find("--mpi=none") != std::string::npos) << w;
  EXPECT_TRUE(launch_mismatch(get, 4).empty());  // wired up: one world of 4
  EXPECT_TRUE(launch_mismatch([](const char*) { return nullptr; }, 1).empty());  // not under srun
}

TEST(Placement, describes_nodes_and_where_local_ranks_came_from) {
  const std::vector<RankPlace> two{{"n1", 0, "SLURM_LOCALID"}, {"n1", 1, "SLURM_LOCALID"},
                                   {"n2", 0, "SLURM_LOCALID"}, {"n2", 1, "SLURM_LOCALID"}};
  EXPECT_TRUE(describe_placement(two) ==
                "4 ranks on 2 nodes: n1 (ranks 0-1), n2 (ranks 2-3); local rank from SLURM_LOCALID") << describe_placement(two);
  const std::vector<RankPlace> cyclic{{"a", 0, "X"}, {"b", 0, "X"}, {"a", 1, "Y"}};
  EXPECT_TRUE(describe_placement(cyclic) == "3 ranks on 2 nodes: a (ranks 0,2), b (rank 1); local rank from X (2), Y (1)") << describe_placement(cyclic);
  std::vector<RankPlace> many;
  for (int r = 0; r < 12; ++r) many.push_back({"n" + std::to_string(r / 2), r % 2, "SLURM_LOCALID"});
  EXPECT_TRUE(describe_placement(many).find("n3 (ranks 6-7), ... (2 more);") != std::string::npos) << describe_placement(many);
}


TEST(GpuSharing, local_ranks_take_gpus_in_turn_only_when_shared) {
  EXPECT_EQ(gpu_of_local_rank(1, 1, false), 0);  // the launcher bound one GPU to each task
  EXPECT_EQ(gpu_of_local_rank(1, 2, false), 1);
  EXPECT_EQ(gpu_of_local_rank(2, 2, false), -1);  // more local ranks than GPUs
  EXPECT_EQ(gpu_of_local_rank(2, 2, true), 0);
  EXPECT_EQ(gpu_of_local_rank(5, 4, true), 1);
  EXPECT_EQ(gpu_of_local_rank(0, 0, true), -1);  // no GPU at all
}

TEST(GpuSharing, a_gpu_of_its_own_per_rank_is_no_problem) {
  // 2 nodes of 2 GPUs; the same bus id on different nodes is another GPU
  const std::vector<RankGpu> ok{{"a", "0000:19:00.0", 2}, {"a", "0000:3b:00.0", 2},
                                {"b", "0000:19:00.0", 2}, {"b", "0000:3b:00.0", 2}};
  EXPECT_EQ(gpu_sharing_problem(ok), "");
  // one GPU bound to each task (CUDA_VISIBLE_DEVICES per rank): each sees 1, all differ
  EXPECT_EQ(gpu_sharing_problem({{"a", "0000:19:00.0", 1}, {"a", "0000:3b:00.0", 1}}), "");
  // no GPU anywhere: nothing to compare (the plan says there is no CUDA device)
  EXPECT_EQ(gpu_sharing_problem({{"a", "", 0}, {"a", "", 0}}), "");
}

TEST(GpuSharing, two_ranks_on_one_gpu_are_named_with_what_to_do) {
  const std::string m = gpu_sharing_problem({{"h200-1", "0000:19:00.0", 1}, {"h200-1", "0000:19:00.0", 1}});
  EXPECT_EQ(m.rfind("2 ranks on node h200-1, which has 1 GPU for them: ranks 0-1 share GPU 0000:19:00.0. ", 0), 0u) << m;
  EXPECT_NE(m.find("start at most 1 rank per node (mpirun -np 1 on one node)"), std::string::npos) << m;
  EXPECT_NE(m.find("parallel.shared_gpu: host"), std::string::npos) << m;
}

TEST(GpuSharing, more_local_ranks_than_gpus_and_further_nodes_are_counted) {
  // node a: 3 ranks for 2 GPUs (local rank 2 finds none); node b: 2 ranks on its one GPU; node c fine
  const std::vector<RankGpu> r{{"a", "0000:19:00.0", 2}, {"a", "0000:3b:00.0", 2}, {"a", "", 2},
                               {"b", "0000:19:00.0", 1}, {"b", "0000:19:00.0", 1}, {"c", "0000:19:00.0", 1}};
  const std::string m = gpu_sharing_problem(r);
  EXPECT_EQ(m.rfind("3 ranks on node a, which has 2 GPUs for them: rank 2 has none. ", 0), 0u) << m;
  EXPECT_NE(m.find("start at most 2 ranks per node"), std::string::npos) << m;
  EXPECT_NE(m.find("(and 1 more node alike)"), std::string::npos) << m;
}
