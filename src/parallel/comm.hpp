// Collectives between ranks. One interface; MPI carries it on the CPU (host buffers), NCCL on GPUs
// (device buffers, on a communication stream that overlaps the compute stream), and with
// parallel.shared_gpu: host MPI again for GPUs that several ranks share, the buffers staged through
// page-locked host memory (comm_staged.hpp).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "base/common.hpp"
#include "parallel/placement.hpp"

namespace gpt {

class Backend;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Data collectives on the backend's buffers. On the GPU they are queued on the communication stream
  // after all compute queued so far; on the CPU they complete before returning.
  virtual void all_reduce_sum(void* buf, size_t count, DType t) = 0;
  virtual void all_reduce_max(float* buf, size_t count) = 0;  // fp32; NaN wins
  // send holds world()*count elements; rank r receives the sum of every rank's r-th piece.
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t count, DType t) = 0;
  // send holds count elements; recv gets world()*count, rank r's piece at r*count.
  virtual void all_gather(const void* send, void* recv, size_t count, DType t) = 0;
  // The same for bytes (FP8 weights): send holds `bytes`, recv gets world()*bytes.
  virtual void all_gather_bytes(const void* send, void* recv, size_t bytes) = 0;
  // Bytes this rank has received from the other ranks through all-gathers so far (the traffic of
  // gathering parameters: ZeRO-3 before each use, ZeRO-1/2 after each update)
  uint64_t gathered_bytes() const { return gathered_; }
  // Events on the communication stream: record(slot) after some collectives; wait(slot) makes the
  // compute stream wait for them. join() makes compute wait for every collective queued so far.
  virtual void record(int slot) = 0;
  virtual void wait(int slot) = 0;
  virtual void join() = 0;

 protected:
  void count_gathered(size_t bytes_each) { gathered_ += uint64_t(world() - 1) * bytes_each; }

 private:
  uint64_t gathered_ = 0;
};

// Host-side agreement between ranks (MPI, or this process alone: make_solo_host_comm).
class HostComm {
 public:
  virtual ~HostComm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;  // ranks sharing this node's memory
  // Every rank's node and local rank, gathered at start (empty where unknown: test doubles).
  virtual std::vector<RankPlace> placement() const { return {}; }
  virtual double sum(double x) = 0;
  virtual long max(long x) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // Every rank's `mine`, in rank order, on every rank. This default broadcasts from each rank in turn
  // (test doubles); MPI gathers them in one collective.
  virtual std::vector<std::string> all_gather_text(const std::string& mine);
  // Ends every rank now with this status (MPI_Abort), after the caller printed why.
  [[noreturn]] virtual void abort(int status) = 0;
  virtual void* mpi_comm() = 0;  // MPI_Comm*, for building NCCL on top
};

std::unique_ptr<HostComm> make_host_comm(int* argc, char*** argv);
// This process without MPI, for the commands that only read and print (--help, --list, --dry-run,
// export): MPI's start costs seconds and may print the library's warnings. Its rank and world size are
// the launcher's (mpirun, srun; rank 0 of 1 without one), so that under a launcher rank 0 alone prints
// and a dry run plans for the world it was started in. Its collectives cover this process alone: each
// process agrees with itself, which is every rank's outcome where every rank reads the same input.
std::unique_ptr<HostComm> make_solo_host_comm();
// MPI collectives on host buffers (the CPU backend).
std::unique_ptr<Communicator> make_mpi_communicator(HostComm& host);
// NCCL collectives on device buffers, bootstrapped through MPI; defined by the CUDA build.
std::unique_ptr<Communicator> make_nccl_communicator(HostComm& host, Backend& backend);
// MPI collectives on the backend's buffers staged through host memory (parallel.shared_gpu: host): on
// the GPU page-locked buffers and the CUDA build's copies (comm_staged_cuda.cu), on the CPU plain copies.
std::unique_ptr<Communicator> make_staged_communicator(HostComm& host, Backend& backend);

// Collective: the ranks of each node compare the GPUs they will take (gpu_of_local_rank of their local
// rank, by PCI bus id) before any work; ranks that would share one, unless `shared`, are an input error
// that every rank raises together (AgreedError, said once by rank 0). Ranks on the CPU (`cuda` false)
// compare nothing, except under the testing hook GPT2_TRAIN_GPU_ID=ID: every rank, on the CPU too,
// then reports GPU ID as its own, as ranks started on one GPU do.
void check_gpu_sharing(HostComm& host, bool cuda, bool shared);
// The PCI bus id of CUDA device `device` ("0000:19:00.0"), empty without it; defined by the CUDA build.
std::string cuda_pci_bus_id(int device);

}  // namespace gpt
