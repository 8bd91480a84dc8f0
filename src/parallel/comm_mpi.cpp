// MPI: host agreement for every run, and the data collectives of the CPU backend; the host comm of a
// command that runs without MPI.
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "parallel/comm.hpp"

#define MPI_CHECK(call)                                                                    \
  do {                                                                                     \
    int rc_ = (call);                                                                      \
    if (rc_ != MPI_SUCCESS) {                                                              \
      char msg_[MPI_MAX_ERROR_STRING];                                                     \
      int len_ = 0;                                                                        \
      MPI_Error_string(rc_, msg_, &len_);                                                  \
      ::gpt::throw_check_failure("MPI", #call, std::string(msg_, len_), __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

namespace gpt {
namespace {

MPI_Datatype mpi_type(DType t) {
  if (t != DType::F32) throw Error(kExitFailure, "MPI collectives carry fp32 only (the CPU backend's dtype)");
  return MPI_FLOAT;
}

int as_int(size_t n) {
  if (n > size_t(INT32_MAX)) throw Error(kExitFailure, "MPI message of " + std::to_string(n) + " elements is too large");
  return int(n);
}

class MpiHostComm final : public HostComm {
 public:
  MpiHostComm(int* argc, char*** argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
      own_ = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    // The launcher's local rank comes first: it numbers the ranks of each node as the allocation placed
    // them, whatever the MPI library takes a node to be. MPI_COMM_TYPE_SHARED (one shared-memory domain)
    // is the fallback; where several Slurm nodes share one machine it is not the same thing.
    MPI_Comm local;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    std::string from = "MPI_COMM_TYPE_SHARED";
    auto getenv = [](const char* k) { return std::getenv(k); };
    if (auto env = local_rank_from_env(getenv, rank_, world_)) {
      local_rank_ = env->rank;
      from = env->from;
    }
    const std::string mismatch = launch_mismatch(getenv, world_);
    if (!mismatch.empty()) std::cerr << "warning: " << mismatch << "\n";
    gather_placement(from);
  }
  ~MpiHostComm() override {
    MPI_Comm_free(&comm_);
    if (own_) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::vector<RankPlace> placement() const override { return placement_; }
  double sum(double x) override {
    double r = 0;
    MPI_CHECK(MPI_Allreduce(&x, &r, 1, MPI_DOUBLE, MPI_SUM, comm_));
    return r;
  }
  long max(long x) override {
    long r = 0;
    MPI_CHECK(MPI_Allreduce(&x, &r, 1, MPI_LONG, MPI_MAX, comm_));
    return r;
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    MPI_CHECK(MPI_Bcast(buf, as_int(bytes), MPI_BYTE, root, comm_));
  }
  std::vector<std::string> all_gather_text(const std::string& mine) override {
    const int n = as_int(mine.size());
    std::vector<int> counts(static_cast<size_t>(world_)), displs(static_cast<size_t>(world_));
    MPI_CHECK(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_));
    size_t total = 0;
    for (int r = 0; r < world_; ++r) {
      displs[size_t(r)] = as_int(total);
      total += size_t(counts[size_t(r)]);
    }
    std::string all(total, '\0');
    MPI_CHECK(MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, comm_));
    std::vector<std::string> out;
    for (int r = 0; r < world_; ++r) out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(counts[size_t(r)])));
    return out;
  }
  [[noreturn]] void abort(int status) override {
    std::cerr.flush();
    std::cout.flush();
    if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);
  }
  void* mpi_comm() override { return &comm_; }

 private:
  // One fixed-size record per rank, all-gathered: the run log and the start-up line show them.
  void gather_placement(const std::string& from) {
    struct Record {
      char node[MPI_MAX_PROCESSOR_NAME];
      char from[32];
      int local_rank;
    };
    Record mine{};
    int len = 0;
    MPI_CHECK(MPI_Get_processor_name(mine.node, &len));
    std::strncpy(mine.from, from.c_str(), sizeof mine.from - 1);
    mine.local_rank = local_rank_;
    std::vector<Record> all(static_cast<size_t>(world_));
    MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_));
    for (const Record& r : all) placement_.push_back({r.node, r.local_rank, r.from});
  }

  MPI_Comm comm_;
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  std::vector<RankPlace> placement_;
  bool own_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(HostComm& host) : comm_(*static_cast<MPI_Comm*>(host.mpi_comm())) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_reduce_sum(void* buf, size_t count, DType t) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(count), mpi_type(t), MPI_SUM, comm_));
  }
  void all_reduce_max(float* buf, size_t count) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(count), MPI_FLOAT, MPI_MAX, comm_));
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType t) override {
    tmp_.resize(count * dtype_size(t));
    MPI_CHECK(MPI_Reduce_scatter_block(send, tmp_.data(), as_int(count), mpi_type(t), MPI_SUM, comm_));
    std::memcpy(recv, tmp_.data(), tmp_.size());
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    gather(send, recv, count, count * dtype_size(t), mpi_type(t));
  }
  void all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    gather(send, recv, bytes, bytes, MPI_BYTE);
  }
  void record(int) override {}
  void wait(int) override {}
  void join() override {}

 private:
  void gather(const void* send, void* recv, size_t count, size_t bytes, MPI_Datatype t) {
    if (send == static_cast<char*>(recv) + bytes * rank_) {
      MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, as_int(count), t, comm_));
    } else {
      MPI_CHECK(MPI_Allgather(send, as_int(count), t, recv, as_int(count), t, comm_));
    }
    count_gathered(bytes);
  }

  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  std::vector<char> tmp_;
};

// No MPI: rank and world size from the launcher's environment, a pair taken only when both are whole
// numbers with rank < size. mpirun's first: inside a Slurm job its ranks also carry the SLURM_* of the
// step they were started from (parallel/placement.hpp reads local ranks in the same order).
class SoloHostComm final : public HostComm {
 public:
  SoloHostComm() {
    static const std::pair<const char*, const char*> kLaunchers[] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},  // OpenMPI's mpirun
        {"PMI_RANK", "PMI_SIZE"},                          // MPICH's and Intel MPI's mpiexec
        {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},          // srun
    };
    for (const auto& [rank_var, size_var] : kLaunchers) {
      const long rank = count(rank_var), size = count(size_var);
      if (rank >= 0 && size > 0 && rank < size) {
        rank_ = int(rank);
        world_ = int(size);
        return;
      }
    }
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return 0; }  // nothing that only reads and prints picks a device
  int local_size() const override { return 1; }
  double sum(double x) override { return x; }
  long max(long x) override { return x; }
  void broadcast(void*, size_t, int root) override {
    if (root != rank_) throw Error(kExitFailure, "broadcast from rank " + std::to_string(root) + " without MPI");
  }
  [[noreturn]] void abort(int status) override {
    std::cerr.flush();
    std::cout.flush();
    std::_Exit(status);
  }
  void* mpi_comm() override { throw Error(kExitFailure, "this command runs without MPI, so it has no communicator"); }

 private:
  // A whole non-negative decimal number from the environment, or -1.
  static long count(const char* var) {
    const char* s = std::getenv(var);
    if (!s || !*s) return -1;
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    return (*end || v < 0 || v > INT32_MAX) ? -1 : v;
  }
  int rank_ = 0, world_ = 1;
};

}  // namespace

std::vector<std::string> HostComm::all_gather_text(const std::string& mine) {
  std::vector<std::string> out;
  for (int r = 0; r < world(); ++r) {
    uint64_t n = r == rank() ? mine.size() : 0;
    broadcast(&n, sizeof n, r);
    std::string text = r == rank() ? mine : std::string(n, '\0');
    if (n) broadcast(text.data(), n, r);
    out.push_back(text);
  }
  return out;
}

std::unique_ptr<HostComm> make_solo_host_comm() { return std::make_unique<SoloHostComm>(); }
std::unique_ptr<HostComm> make_host_comm(int* argc, char*** argv) { return std::make_unique<MpiHostComm>(argc, argv); }
std::unique_ptr<Communicator> make_mpi_communicator(HostComm& host) { return std::make_unique<MpiCommunicator>(host); }

}  // namespace gpt
