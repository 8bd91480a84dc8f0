// The staged communicator (parallel.shared_gpu: host) on the CUDA backend, one rank: a collective copies
// its input out only after every op queued on the compute stream before it (as NCCL's stream waits for
// them), bf16 and byte buffers come back bit for bit through the page-locked buffer as it grows, and a
// GPU's PCI bus id is what the ranks compare at start-up. Without a CUDA device every test is skipped.
// Several ranks on one GPU: tests/integration/test_gpu_shared.py.
#include <memory>
#include <string>
#include <vector>

#include "host_world.hpp"
#include "test_util.hpp"
#include "parallel/comm_staged.hpp"

using namespace gpt;

namespace {

HostComm& world() { return tests::host_world(); }

std::unique_ptr<Backend> cuda_backend() {
  BackendOptions o;
  o.act = DType::BF16;
  return make_cuda_backend(o);
}

}  // namespace

TEST(GpuStagedComm, a_collective_reads_its_input_after_the_compute_queued_before_it) {
  auto be = cuda_backend();
  auto comm = make_staged_communicator(world(), *be);
  const size_t n = 1 << 20, big = size_t(1) << 30;
  std::vector<float> want(n), got(n, -1.0f);
  for (size_t i = 0; i < n; ++i) want[i] = float(i % 1000) + 0.5f;
  void* values = be->alloc(4 * n);
  void* buf = be->alloc(4 * n);
  void* recv = be->alloc(4 * n);
  void* a = be->alloc(big);
  void* b = be->alloc(big);
  be->copy_h2d(values, want.data(), 4 * n);
  be->zero(buf, 4 * n);
  be->zero(a, big);
  be->synchronize();
  // tens of milliseconds of copies on the compute stream, then the input written last: a copy out that
  // did not wait for the compute stream would read the zeros
  for (int i = 0; i < 40; ++i) be->copy_d2d(i % 2 ? a : b, i % 2 ? b : a, big);
  be->copy_d2d(buf, values, 4 * n);
  comm->reduce_scatter_sum(buf, recv, n, DType::F32);
  comm->join();
  be->copy_d2h(got.data(), recv, 4 * n);
  EXPECT_EQ(got, want);
  for (void* p : {values, buf, recv, a, b}) be->free(p);
}

TEST(GpuStagedComm, bf16_and_bytes_come_back_bit_for_bit_as_the_host_buffer_grows) {
  auto be = cuda_backend();
  auto comm = make_staged_communicator(world(), *be);
  for (size_t n : {size_t(100), size_t(1) << 22, size_t(3)}) {
    std::vector<uint16_t> x(n), got(n);
    for (size_t i = 0; i < n; ++i) x[i] = f32_to_bf16(0.01f * float(i % 7919) - 3.0f);
    void* d = be->alloc(2 * n);
    be->copy_h2d(d, x.data(), 2 * n);
    comm->all_reduce_sum(d, n, DType::BF16);
    comm->all_gather(d, d, n, DType::BF16);  // in place, one rank
    comm->all_gather_bytes(d, d, 2 * n);
    comm->record(0);
    comm->wait(0);
    be->copy_d2h(got.data(), d, 2 * n);
    EXPECT_EQ(got, x) << n << " elements";
    be->free(d);
  }
  EXPECT_EQ(comm->gathered_bytes(), 0u);
}

TEST(GpuStagedComm, gpus_are_told_apart_by_pci_bus_id) {
  const int n = cuda_device_count();
  ASSERT_GT(n, 0);
  const std::string id = cuda_pci_bus_id(0);
  EXPECT_EQ(id.size(), 12u) << id;  // "0000:19:00.0"
  EXPECT_EQ(id[4], ':') << id;
  EXPECT_EQ(cuda_pci_bus_id(n), "");
  if (n > 1) {
    EXPECT_NE(cuda_pci_bus_id(1), id);
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new gpt::tests::NeedsGpu);
  return RUN_ALL_TESTS();
}
