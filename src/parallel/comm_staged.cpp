// The staged communicator: the backend's buffers copied to host memory, MPI's collective there (the CPU
// backend's communicator), copied back. Also the start-up comparison of the ranks' GPUs.
#include "parallel/comm_staged.hpp"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.hpp"
#include "parallel/agree.hpp"
#include "parallel/placement.hpp"

namespace gpt {

namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(HostComm& host, std::unique_ptr<DeviceStaging> staging)
      : mpi_(make_mpi_communicator(host)), staging_(std::move(staging)) {}

  int rank() const override { return mpi_->rank(); }
  int world() const override { return mpi_->world(); }

  void all_reduce_sum(void* buf, size_t count, DType t) override {
    float* x = stage_in(buf, count, t);
    mpi_->all_reduce_sum(x, count, DType::F32);
    stage_out(buf, x, count, t);
  }
  void all_reduce_max(float* buf, size_t count) override {
    float* x = stage_in(buf, count, DType::F32);
    mpi_->all_reduce_max(x, count);
    stage_out(buf, x, count, DType::F32);
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType t) override {
    float* x = stage_in(send, count * size_t(world()), t);
    mpi_->reduce_scatter_sum(x, x, count, DType::F32);  // the MPI communicator reduces into its own buffer
    stage_out(recv, x, count, t);
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    gather(send, recv, count * dtype_size(t));
  }
  void all_gather_bytes(const void* send, void* recv, size_t bytes) override { gather(send, recv, bytes); }
  void record(int slot) override { staging_->record(slot); }
  void wait(int slot) override { staging_->wait(slot); }
  void join() override { staging_->join(); }

 private:
  // The device buffer's `count` elements as fp32 on the host: fp32 as copied, bf16 widened (exactly).
  float* stage_in(const void* dev, size_t count, DType t) {
    void* raw = staging_->host_buffer(count * dtype_size(t));
    staging_->to_host(raw, dev, count * dtype_size(t));
    if (t == DType::F32) return static_cast<float*>(raw);
    wide_.resize(count);
    const uint16_t* h = static_cast<const uint16_t*>(raw);
    for (size_t i = 0; i < count; ++i) wide_[i] = bf16_to_f32(h[i]);
    return wide_.data();
  }
  // The first `count` fp32 values of x into the device buffer in its dtype (bf16 rounded to nearest even).
  void stage_out(void* dev, const float* x, size_t count, DType t) {
    if (t == DType::F32) {
      staging_->to_device(dev, x, count * 4);  // x is the host buffer stage_in returned
      return;
    }
    uint16_t* h = static_cast<uint16_t*>(staging_->host_buffer(count * 2));
    for (size_t i = 0; i < count; ++i) h[i] = f32_to_bf16(x[i]);
    staging_->to_device(dev, h, count * 2);
  }
  // Bytes need no conversion: this rank's piece into its place in the host buffer, MPI's in-place gather
  // fills the others, the whole buffer goes back.
  void gather(const void* send, void* recv, size_t bytes) {
    char* h = static_cast<char*>(staging_->host_buffer(bytes * size_t(world())));
    char* mine = h + bytes * size_t(rank());
    staging_->to_host(mine, send, bytes);
    mpi_->all_gather_bytes(mine, h, bytes);
    staging_->to_device(recv, h, bytes * size_t(world()));
    count_gathered(bytes);
  }

  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<DeviceStaging> staging_;
  std::vector<float> wide_;  // bf16 reductions in fp32
};

// The CPU backend's buffers are host memory: copies are memcpy, and every op is complete when it returns.
class HostCopyStaging final : public DeviceStaging {
 public:
  void* host_buffer(size_t bytes) override {
    if (buf_.size() < bytes) buf_.resize(bytes);
    return buf_.data();
  }
  void to_host(void* host, const void* dev, size_t bytes) override {
    if (bytes && host != dev) std::memmove(host, dev, bytes);
  }
  void to_device(void* dev, const void* host, size_t bytes) override {
    if (bytes && host != dev) std::memmove(dev, host, bytes);
  }
  void record(int) override {}
  void wait(int) override {}
  void join() override {}

 private:
  std::vector<char> buf_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(HostComm& host, std::unique_ptr<DeviceStaging> staging) {
  return std::make_unique<StagedCommunicator>(host, std::move(staging));
}

std::unique_ptr<DeviceStaging> make_host_copy_staging() { return std::make_unique<HostCopyStaging>(); }

std::unique_ptr<Communicator> make_staged_communicator(HostComm& host, Backend& backend) {
  return make_staged_communicator(host, backend.stream() ? make_cuda_staging(backend) : make_host_copy_staging());
}

void check_gpu_sharing(HostComm& host, bool cuda, bool shared) {
  const char* stand_in = std::getenv("GPT2_TRAIN_GPU_ID");  // the testing hook (comm.hpp)
  const bool hook = stand_in && *stand_in;
  if (shared || host.world() == 1 || (!cuda && !hook)) return;
  RankGpu mine;
  if (hook) {
    mine.id = stand_in;
    mine.visible = 1;
  } else {
    mine.visible = cuda_device_count();
    const int device = gpu_of_local_rank(host.local_rank(), mine.visible, false);
    if (device >= 0) mine.id = cuda_pci_bus_id(device);
  }
  const std::vector<std::string> all = host.all_gather_text(std::to_string(mine.visible) + " " + mine.id);
  const std::vector<RankPlace> places = host.placement();
  std::vector<RankGpu> ranks(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const size_t space = all[r].find(' ');
    ranks[r].visible = std::atoi(all[r].substr(0, space).c_str());
    ranks[r].id = space == std::string::npos ? "" : all[r].substr(space + 1);
    ranks[r].node = r < places.size() ? places[r].node : "(unknown)";
  }
  const std::string problem = gpu_sharing_problem(ranks);
  // the same gathered records on every rank: every rank finds the same problem, so each raises it
  if (!problem.empty()) throw AgreedError(kExitBadInput, problem);
}

}  // namespace gpt
