// NCCL collectives on device buffers. One communicator per process, one GPU per local rank (the
// backend has already made it current). The unique id is made on rank 0 and broadcast through the
// host communicator (MPI). Collectives run on a separate communication stream: each one first waits
// for an event recorded on the compute stream, so it sees every compute op queued before it; record /
// wait / join pass events the other way (see comm.hpp). Every CUDA and NCCL call runs inside
// kernel_boundary, so a failure reaches the caller as a gpt::Error.
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/kernel_boundary.cuh"
#include "parallel/comm.hpp"
#include "kernels/check.cuh"

namespace gpt {

namespace {

ncclDataType_t nccl_type(DType t) { return t == DType::F32 ? ncclFloat32 : ncclBfloat16; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(HostComm& host, Backend& backend)
      : rank_(host.rank()), world_(host.world()), compute_(static_cast<cudaStream_t>(backend.stream())) {
    if (!compute_) throw Error(kExitFailure, "NCCL communicator needs a CUDA backend (no compute stream)");
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    host.broadcast(&id, sizeof(id), 0);
    NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : slots_)
      if (e) cudaEventDestroy(e);
    cudaEventDestroy(ready_);
    cudaEventDestroy(joined_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void all_reduce_sum(void* buf, size_t count, DType t) override {
    kernel_boundary([&] {
      after_compute();
      NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, comm_, stream_));
    });
  }
  void all_reduce_max(float* buf, size_t count) override {
    kernel_boundary([&] {
      after_compute();
      NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclMax, comm_, stream_));
    });
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType t) override {
    kernel_boundary([&] {
      after_compute();
      NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, comm_, stream_));
    });
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    kernel_boundary([&] {
      after_compute();
      NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), comm_, stream_));
    });
    count_gathered(count * dtype_size(t));
  }
  void all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    kernel_boundary([&] {
      after_compute();
      NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_));
    });
    count_gathered(bytes);
  }
  void record(int slot) override {
    kernel_boundary([&] { CUDA_CHECK(cudaEventRecord(slot_event(slot), stream_)); });
  }
  void wait(int slot) override {
    kernel_boundary([&] { CUDA_CHECK(cudaStreamWaitEvent(compute_, slot_event(slot), 0)); });
  }
  void join() override {
    kernel_boundary([&] {
      CUDA_CHECK(cudaEventRecord(joined_, stream_));
      CUDA_CHECK(cudaStreamWaitEvent(compute_, joined_, 0));
    });
  }

 private:
  // the communication stream waits for everything queued on the compute stream so far
  void after_compute() {
    CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  cudaEvent_t slot_event(int slot) {
    if (slot < 0) throw Error(kExitFailure, "Communicator event slot must be >= 0");
    if (size_t(slot) >= slots_.size()) slots_.resize(slot + 1, nullptr);
    if (!slots_[slot]) CUDA_CHECK(cudaEventCreateWithFlags(&slots_[slot], cudaEventDisableTiming));
    return slots_[slot];
  }

  int rank_, world_;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, joined_ = nullptr;
  std::vector<cudaEvent_t> slots_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(HostComm& host, Backend& backend) {
  return kernel_boundary([&] { return std::make_unique<NcclCommunicator>(host, backend); });
}

}  // namespace gpt
