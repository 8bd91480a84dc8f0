// The staged communicator's copies on the GPU (comm_staged.hpp): page-locked host buffers, and a
// communication stream that waits for everything queued on the compute stream before it copies a
// buffer out, as NCCL's does before a collective (comm_nccl.cu). Each copy is waited for before the
// host goes on (the host reduces what came out; the host buffer is reused by the next collective), so
// a collective is complete when it returns; the events that record / wait / join pass to the compute
// stream are then the same as NCCL's and order it after the copies back. Every CUDA call runs inside
// kernel_boundary, so a failure reaches the caller as a gpt::Error.
#include <cuda_runtime.h>

#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/kernel_boundary.cuh"
#include "kernels/check.cuh"
#include "parallel/comm_staged.hpp"

namespace gpt {

namespace {

class CudaStaging final : public DeviceStaging {
 public:
  explicit CudaStaging(Backend& backend) : compute_(static_cast<cudaStream_t>(backend.stream())) {
    if (!compute_) throw Error(kExitFailure, "the staged GPU communicator needs a CUDA backend (no compute stream)");
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  }
  ~CudaStaging() override {
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : slots_)
      if (e) cudaEventDestroy(e);
    cudaEventDestroy(ready_);
    cudaEventDestroy(joined_);
    if (host_) cudaFreeHost(host_);
    cudaStreamDestroy(stream_);
  }

  void* host_buffer(size_t bytes) override {
    if (bytes <= host_bytes_) return host_;
    kernel_boundary([&] {
      if (host_) CUDA_CHECK(cudaFreeHost(host_));
      host_ = nullptr;
      host_bytes_ = 0;
      CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocDefault));
      host_bytes_ = bytes;
    });
    return host_;
  }
  void to_host(void* host, const void* dev, size_t bytes) override {
    kernel_boundary([&] {
      CUDA_CHECK(cudaEventRecord(ready_, compute_));  // after every compute op queued so far
      CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      if (bytes) CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    });
  }
  void to_device(void* dev, const void* host, size_t bytes) override {
    kernel_boundary([&] {
      if (bytes) CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    });
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
  cudaEvent_t slot_event(int slot) {
    if (slot < 0) throw Error(kExitFailure, "Communicator event slot must be >= 0");
    if (size_t(slot) >= slots_.size()) slots_.resize(slot + 1, nullptr);
    if (!slots_[slot]) CUDA_CHECK(cudaEventCreateWithFlags(&slots_[slot], cudaEventDisableTiming));
    return slots_[slot];
  }

  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, joined_ = nullptr;
  std::vector<cudaEvent_t> slots_;
  void* host_ = nullptr;
  size_t host_bytes_ = 0;
};

}  // namespace

std::unique_ptr<DeviceStaging> make_cuda_staging(Backend& backend) {
  return kernel_boundary([&] { return std::make_unique<CudaStaging>(backend); });
}

std::string cuda_pci_bus_id(int device) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
    cudaGetLastError();  // no such device: clear the error, report none
    return "";
  }
  return id;
}

}  // namespace gpt
