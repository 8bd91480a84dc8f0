// The staged communicator (parallel.shared_gpu: host): MPI collectives on host memory, the backend's
// buffers copied there and back around each one. NCCL refuses two ranks on one GPU; this carries the
// same collectives for ranks that share GPUs, so every ZeRO stage, FP8 gather, checkpoint and resume path
// runs unchanged above it, at the cost of a round trip through host memory (its throughput is not
// representative; its device memory is that of a real run, without NCCL's own buffers).
//
// The copies are a DeviceStaging: page-locked buffers and a communication stream on the GPU
// (comm_staged_cuda.cu), plain memcpy on the CPU, where the same staged logic runs under CI.
#pragma once
#include <cstddef>
#include <memory>

#include "parallel/comm.hpp"

namespace gpt {

// How the staged communicator reaches the backend's buffers, and how it orders itself with the compute
// stream. Each collective is: to_host (after every compute op queued so far), the MPI collective on the
// host, to_device; both copies are complete when they return, so a collective is complete on return
// and record / wait / join (comm.hpp) only have to order the compute stream after the copies.
class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  // Host memory for `bytes` (page-locked on the GPU), valid until the next call; grows, never shrinks.
  virtual void* host_buffer(size_t bytes) = 0;
  // device -> host, after every op queued on the compute stream so far; complete on return.
  virtual void to_host(void* host, const void* dev, size_t bytes) = 0;
  // host -> device; complete on return (the host buffer may be reused), ordered before the next record.
  virtual void to_device(void* dev, const void* host, size_t bytes) = 0;
  virtual void record(int slot) = 0;
  virtual void wait(int slot) = 0;
  virtual void join() = 0;
};

// Over `host`'s MPI world and `staging`'s copies. Reductions of bf16 buffers are done on the host in
// fp32 and rounded to bf16 once (NCCL rounds each partial sum to bf16 on the way; the staged sum is
// the exact sum rounded once, within fp32's rounding of up to world-1 additions).
std::unique_ptr<Communicator> make_staged_communicator(HostComm& host, std::unique_ptr<DeviceStaging> staging);
// Plain copies: the backend's buffers are host memory (the CPU backend).
std::unique_ptr<DeviceStaging> make_host_copy_staging();
// Page-locked buffers, copies on a communication stream ordered after the backend's compute stream;
// defined by the CUDA build (a stub that throws otherwise).
std::unique_ptr<DeviceStaging> make_cuda_staging(Backend& backend);

}  // namespace gpt
