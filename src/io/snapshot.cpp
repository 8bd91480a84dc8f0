#include "io/snapshot.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "io/raw_io.hpp"

namespace gpt {

namespace {
constexpr size_t kSlotAlign = 16;  // elements: every slot starts 64-byte aligned
// Transparent huge pages where the kernel offers them on request: page-locking 2 MiB pages is faster than
// 4 KiB ones (bench/host_pinning: 5.3 against 7.0 s for 16 GiB on an H200's host)
constexpr size_t kPage = size_t(2) << 20;
size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
// The block is page-locked in pieces of about kPinPiece bytes, each of whole slots and starting on a kPage
// boundary: a registration holds the driver, every other CUDA call of the process waiting for it, so the
// run's own calls wait for one piece at most while the block (seconds of work at 1558M) is page-locked
// beside them. A copy never spans two pieces; the padding costs under 0.4% of the block.
constexpr size_t kPinPiece = size_t(512) << 20;
// Lays the slots out one after another, a new piece where the current one has reached kPinPiece.
struct Packer {
  std::vector<size_t> starts{0};  // the pieces' first elements
  size_t at = 0;                  // elements so far
  size_t put(size_t elems) {
    if ((at - starts.back()) * sizeof(float) >= kPinPiece) {
      at = round_up(at, kPage / sizeof(float));
      starts.push_back(at);
    }
    const size_t o = at;
    at += elems;
    return o;
  }
};
// floats a slot of len values takes: len fp32 values (bf16 ones: in its upper half), or len int8 codes and
// their blocks' fp32 scales, in bytes
size_t slot_elems(size_t len, bool codes) {
  return round_up(codes ? (optim::state_bytes(optim::StateType::Int8, len) + 3) / 4 : len, kSlotAlign);
}

// The logical elements [lo, hi) of bucket b that this rank writes: its piece, or without sharding (every
// rank holds the whole state) an equal slice of it, so that the files tile every bucket exactly once.
std::pair<size_t, size_t> share(const ShardedState& e, int b, int rank, int world) {
  const size_t plo = e.piece_begin(b), phi = e.piece_end(b);
  if (e.shards()) return {plo, phi};
  const size_t len = phi - plo, per = round_up((len + world - 1) / world, e.piece_align());
  return {plo + std::min(len, size_t(rank) * per), plo + std::min(len, size_t(rank + 1) * per)};
}

}  // namespace

Snapshot::~Snapshot() { free_block(); }

void Snapshot::free_block() {
  if (!block_) return;
  try {
    be_->wait_copies();  // none may still land in it
    if (pinned_)
      for (size_t j = 0; j < pieces_.size(); ++j) be_->unpin_host(block_ + pieces_[j]);
  } catch (const Error&) {
    return;  // the device failed: the memory is left to the process's end rather than freed under a copy
  }
  std::free(block_);
  block_ = nullptr;
  pinned_ = false;
}

bool Snapshot::reserve(ShardedState& e, const ParamLayout& L, int rank, int world) {
  if (block_) return pinned_;
  names_ = e.state_names();
  residual_ = e.master_is_residual();
  const size_t K = names_.size(), n = size_t(L.n_buckets()) * K;
  off_.assign(n, 0);
  slot_.assign(n, 0);
  has_.assign(n, 0);
  narrow_.assign(n, 0);
  code_.assign(n, nullptr);
  begin_.resize(L.n_buckets());
  end_.resize(L.n_buckets());
  Packer pack;
  for (int b = 0; b < L.n_buckets(); ++b) {
    std::tie(begin_[b], end_[b]) = share(e, b, rank, world);
    for (size_t k = 0; k < K; ++k) {
      if (!e.holds(int(k))) continue;
      const size_t i = size_t(b) * K + k;
      has_[i] = 1;
      narrow_[i] = e.state_dtype(int(k)) == DType::BF16;
      code_[i] = e.state_code(int(k));
      const size_t len = end_[b] - begin_[b];
      slot_[i] = slot_elems(len, code_[i] != nullptr);
      off_[i] = pack.put(slot_[i]);
    }
  }
  bytes_ = pack.at * sizeof(float);
  be_ = &e.backend();
  const size_t whole = round_up(std::max<size_t>(bytes_, 1), kPage);
  block_ = static_cast<float*>(std::aligned_alloc(kPage, whole));
  if (!block_)
    throw Error(kExitOutOfMemory, "out of host memory: the checkpoint snapshot needs " + std::to_string(bytes_) + " bytes");
  madvise(block_, whole, MADV_HUGEPAGE);  // a hint: without huge pages the block is simply 4 KiB pages
  pinned_ = pin(pack.starts, pack.at);
  return pinned_;
}

// Every non-empty piece [starts[j], starts[j+1] or end) page-locked, or none (false). Each piece is
// written first (one byte a 4 KiB page), so that the kernel allocates and zeroes its pages here, on this
// thread alone, and the registration that holds the driver only locks pages already there
// (bench/host_pinning: `prefault_thp` against `register_thp`, and the calls held up beside each).
bool Snapshot::pin(const std::vector<size_t>& starts, size_t end) {
  pieces_.clear();
  for (size_t j = 0; j < starts.size(); ++j) {
    const size_t hi = j + 1 < starts.size() ? starts[j + 1] : end;
    if (hi == starts[j]) continue;
    volatile char* bytes = reinterpret_cast<char*>(block_ + starts[j]);
    for (size_t at = 0, n = (hi - starts[j]) * sizeof(float); at < n; at += 4096) bytes[at] = 0;
    if (!be_->pin_host(block_ + starts[j], (hi - starts[j]) * sizeof(float))) {
      for (size_t p : pieces_) be_->unpin_host(block_ + p);
      pieces_.clear();
      return false;
    }
    pieces_.push_back(starts[j]);
  }
  return true;
}

Snapshot::Copies Snapshot::take(ShardedState& e, const ParamLayout& L, int rank, int world) {
  reserve(e, L, rank, world);
  const int K = n_kinds();
  for (int b = 0; b < L.n_buckets(); ++b)
    for (int k = 0; k < K; ++k) {
      const size_t i = size_t(b) * K + size_t(k);
      if (!has_[i]) continue;
      char* dst = reinterpret_cast<char*>(block_ + off_[i]) +
                  (narrow_[i] ? 2 * slot_[i] : 0);
      e.copy_piece_async(b, k, begin_[b], end_[b], dst);
    }
  return Copies(this);
}

const Snapshot& Snapshot::Copies::land(int threads) && {
  Snapshot& s = *s_;
  s_ = nullptr;
  s.be_->wait_copies();
  parallel_for(s.off_.size(), threads, [&](size_t i) {
    const size_t n = s.elems(int(i / s.names_.size()));
    if (s.has_[i] && s.narrow_[i]) widen_bf16_in_place(s.block_ + s.off_[i], n, s.slot_[i]);
  });
  if (s.residual_) {  // master = param + residual (both widened above), bucket by bucket
    const size_t K = s.names_.size();
    parallel_for(s.begin_.size(), threads, [&](size_t b) {
      const size_t ip = b * K + ShardedState::kParam, im = b * K + ShardedState::kMaster;
      if (!s.has_[ip] || !s.has_[im]) return;
      const float* p = s.block_ + s.off_[ip];
      float* m = s.block_ + s.off_[im];
      for (size_t j = 0, n = s.elems(int(b)); j < n; ++j) m[j] += p[j];
    });
  }
  return s;
}

// Front to back a block at a time: block [i, i+K) ends at byte 4(i+K) <= 2*slot + 2(i+K), where the
// values not read yet begin, so none is overwritten before it is read.
void widen_bf16_in_place(float* slot_start, size_t n, size_t slot) {
  char* base = reinterpret_cast<char*>(slot_start);
  const char* src = base + 2 * slot;
  constexpr size_t K = 4096;
  uint16_t h[K];
  float f[K];
  for (size_t i = 0; i < n; i += K) {
    const size_t k = std::min(K, n - i);
    std::memcpy(h, src + 2 * i, 2 * k);
    for (size_t j = 0; j < k; ++j) f[j] = bf16_to_f32(h[j]);
    std::memcpy(base + 4 * i, f, 4 * k);
  }
}

size_t snapshot_bytes(const ParamLayout& L, int world, const ZeroPolicy& policy, bool has_master, int n_slots) {
  Packer pack;  // the slots in reserve()'s order: parameters, master weights, the optimizer's slots
  const bool q8 = policy.state == optim::StateType::Int8;
  for (const BucketShape& sh : bucket_shapes(L, world, policy)) {
    const size_t align = q8 ? size_t(optim::kQuantBlock) : 1;
    const size_t len = policy.shard_optimizer ? std::min(sh.shard, sh.size)
                                              : std::min(sh.size, round_up((sh.size + world - 1) / world, align));
    for (int k = 0; k < (has_master ? 2 : 1); ++k) pack.put(slot_elems(len, false));
    for (int k = 0; k < n_slots; ++k) pack.put(slot_elems(len, q8));
  }
  return pack.at * sizeof(float);
}

}  // namespace gpt
