// The staged communicator (parallel.shared_gpu: host) over a staging that records what it is asked to
// copy: each collective copies out exactly the bytes of its input and copies back exactly its output; bf16
// sums are the fp32 sum rounded once, gathers put each rank's piece in its place. Run alone (one rank) by
// tests/test_cpp.py and on 2 ranks by tests/integration/test_shared_gpu.py; whole runs through it there
// (CPU) and in tests/integration/test_gpu_shared.py (GPU).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "host_world.hpp"
#include "test_util.hpp"
#include "parallel/comm_staged.hpp"

using namespace gpt;

namespace {

HostComm& world() { return tests::host_world(); }

struct Log {
  std::vector<std::string> calls;  // "out N", "back N", "record S", ...
};

// Host memory standing in for the device; every copy recorded with its size.
class RecordingStaging final : public DeviceStaging {
 public:
  explicit RecordingStaging(Log& log) : log_(log) {}
  void* host_buffer(size_t bytes) override {
    if (buf_.size() < bytes) buf_.resize(bytes);
    return buf_.data();
  }
  void to_host(void* host, const void* dev, size_t bytes) override {
    log_.calls.push_back("out " + std::to_string(bytes));
    std::memcpy(host, dev, bytes);
  }
  void to_device(void* dev, const void* host, size_t bytes) override {
    log_.calls.push_back("back " + std::to_string(bytes));
    std::memcpy(dev, host, bytes);
  }
  void record(int slot) override { log_.calls.push_back("record " + std::to_string(slot)); }
  void wait(int slot) override { log_.calls.push_back("wait " + std::to_string(slot)); }
  void join() override { log_.calls.push_back("join"); }

 private:
  Log& log_;
  std::vector<char> buf_;
};

// Rank r's bf16 values: distinct per rank, so that a sum or a gather that mixes up pieces shows.
std::vector<uint16_t> bf16_values(size_t n, int r) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16((0.37f * float(i) - 5.1f) * float(r + 1));
  return v;
}

// What every rank's values sum to, in fp32 rounded to bf16 once (exact for 2 ranks, whose fp32 sum
// does not depend on the order).
std::vector<uint16_t> bf16_sum(size_t n, int world) {
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    float s = 0;
    for (int r = 0; r < world; ++r) s += bf16_to_f32(bf16_values(n, r)[i]);
    out[i] = f32_to_bf16(s);
  }
  return out;
}

}  // namespace

TEST(StagedComm, bf16_reductions_copy_their_bytes_out_and_back_and_round_once) {
  Log log;
  auto comm = make_staged_communicator(world(), std::make_unique<RecordingStaging>(log));
  const int W = comm->world(), r = comm->rank();
  ASSERT_LE(W, 2) << "the expected sums are exact for 1 or 2 ranks";
  const size_t n = 1000;
  std::vector<uint16_t> x = bf16_values(n, r);
  comm->all_reduce_sum(x.data(), n, DType::BF16);
  EXPECT_EQ(x, bf16_sum(n, W));
  // reduce-scatter: every rank sends W pieces of its values; rank r receives the sum of piece r
  const std::vector<uint16_t> mine = bf16_values(n, r);
  std::vector<uint16_t> send, piece(n, 0);
  for (int k = 0; k < W; ++k) send.insert(send.end(), mine.begin(), mine.end());
  comm->reduce_scatter_sum(send.data(), piece.data(), n, DType::BF16);
  EXPECT_EQ(piece, bf16_sum(n, W));
  const std::string all = std::to_string(2 * n), sent = std::to_string(2 * n * W);
  EXPECT_EQ(log.calls, (std::vector<std::string>{"out " + all, "back " + all, "out " + sent, "back " + all}));
}

TEST(StagedComm, fp32_reductions_and_the_max) {
  Log log;
  auto comm = make_staged_communicator(world(), std::make_unique<RecordingStaging>(log));
  const int W = comm->world(), r = comm->rank();
  std::vector<float> x(333), recv(333, 0.0f), send;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / float(i + 1) * float(r + 1);
  std::vector<float> mx = x;
  for (int k = 0; k < W; ++k) send.insert(send.end(), x.begin(), x.end());
  comm->all_reduce_sum(x.data(), x.size(), DType::F32);
  comm->all_reduce_max(mx.data(), mx.size());
  comm->reduce_scatter_sum(send.data(), recv.data(), recv.size(), DType::F32);
  for (size_t i = 0; i < x.size(); ++i) {
    float sum = 0;
    for (int k = 0; k < W; ++k) sum += 1.0f / float(i + 1) * float(k + 1);
    ASSERT_EQ(x[i], sum) << i;
    ASSERT_EQ(recv[i], sum) << i;
    ASSERT_EQ(mx[i], 1.0f / float(i + 1) * float(W)) << i;
  }
  EXPECT_EQ(log.calls.size(), 6u);
  EXPECT_EQ(log.calls.front(), "out 1332");
}

TEST(StagedComm, gathers_put_each_rank_piece_in_its_place_in_place_or_not) {
  Log log;
  auto comm = make_staged_communicator(world(), std::make_unique<RecordingStaging>(log));
  const int W = comm->world(), r = comm->rank();
  const size_t n = 64;
  std::vector<uint16_t> mine = bf16_values(n, r), all(n * W, 0), want;
  for (int k = 0; k < W; ++k) {
    const std::vector<uint16_t> v = bf16_values(n, k);
    want.insert(want.end(), v.begin(), v.end());
  }
  comm->all_gather(mine.data(), all.data(), n, DType::BF16);
  EXPECT_EQ(all, want);
  const size_t b = 37;  // in place: this rank's piece already in its place in the buffer
  std::vector<uint8_t> bytes(b * W, 0), want_bytes(b * W);
  for (size_t i = 0; i < want_bytes.size(); ++i) want_bytes[i] = uint8_t(7 * i + 1);
  std::copy(want_bytes.begin() + r * b, want_bytes.begin() + (r + 1) * b, bytes.begin() + r * b);
  comm->all_gather_bytes(bytes.data() + r * b, bytes.data(), b);
  EXPECT_EQ(bytes, want_bytes);
  EXPECT_EQ(comm->gathered_bytes(), uint64_t(W - 1) * (2 * n + b));  // the pieces received
  comm->record(3);
  comm->wait(3);
  comm->join();
  EXPECT_EQ(log.calls, (std::vector<std::string>{"out " + std::to_string(2 * n), "back " + std::to_string(2 * n * W),
                                                 "out " + std::to_string(b), "back " + std::to_string(b * W),
                                                 "record 3", "wait 3", "join"}));
}
