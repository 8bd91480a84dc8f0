// One rank's share of a checkpoint in host memory: a consistent copy of the training state at a step
// boundary, which a thread writes while training goes on. One block of host memory, allocated once
// (at the start of a run that checkpoints) and page-locked through the backend (in pieces of whole
// slots, so that other CUDA calls are not held up for the whole of it), so that the step that
// checkpoints only queues device-to-host copies on the backend's copy stream; the engine's next update
// waits for them on the device. The copies are a value of their own (Snapshot::Copies): the bytes are
// reachable only through it once they have landed (land), so no code can write a file from a copy still
// in flight. Parameters (and optimizer slots) held in bf16 are copied as they are (half the bytes over the
// bus) into the upper half of their fp32 slot and widened in place there by land(); int8 optimizer slots
// are copied as they are held, their n code bytes and then their blocks' fp32 scales, and written so.
// Compensated master weights are copied as their bf16 residuals, widened, and the parameters added by
// land(): the master values, exact in fp32.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "parallel/sharded_state.hpp"
#include "parallel/zero_policy.hpp"

namespace gpt {

class Snapshot {
 public:
  Snapshot() = default;
  ~Snapshot();  // unpins and frees the block (the backend outlives it)
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  // Allocates and page-locks the block for this engine's state on this rank, the first time (later
  // calls keep it). Returns false when the memory could not be page-locked (copies run, slower).
  bool reserve(ShardedState& e, const ParamLayout& layout, int rank, int world);
  // The copies of one step's state into the block, queued and not yet landed. Move-only; one at a time.
  class Copies {
   public:
    Copies(Copies&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
    Copies& operator=(Copies&& o) noexcept {
      s_ = o.s_;
      o.s_ = nullptr;
      return *this;
    }
    Copies(const Copies&) = delete;
    Copies& operator=(const Copies&) = delete;
    Copies() = default;
    const Snapshot& snapshot() const { return *s_; }  // its layout (what goes where), not its bytes
    // Where dataset i's bytes will be once landed (for laying out a file: addresses, not contents).
    const float* destination(size_t i) const { return s_->block_ + s_->off_[i]; }
    // Any thread: waits for the copies, widens bf16 parameters on `threads` threads; the snapshot's
    // bytes, dataset i at data(i), are the step's state from now on.
    const Snapshot& land(int threads) &&;

   private:
    friend class Snapshot;
    explicit Copies(Snapshot* s) : s_(s) {}
    Snapshot* s_ = nullptr;
  };
  // Main thread, at a step boundary: queues the copies of the state into the block.
  [[nodiscard]] Copies take(ShardedState& e, const ParamLayout& layout, int rank, int world);

  // Index b*n_kinds()+k: bucket b, the state kind k (ShardedState::state_names).
  int n_kinds() const { return int(names_.size()); }
  const std::string& kind_name(int k) const { return names_[size_t(k)]; }
  bool has(size_t i) const { return has_[i] != 0; }         // master only with master weights
  // An int8 slot's code (null for the other kinds): dataset i is then elems(b) code bytes and, from byte
  // elems(b) on, the fp32 scales of their optim::quant_blocks(elems(b)) blocks.
  const optim::Code* code(size_t i) const { return code_[i]; }
  const float* data(size_t i) const { return block_ + off_[i]; }  // after land()
  size_t elems(int b) const { return end_[b] - begin_[b]; }
  size_t begin(int b) const { return begin_[b]; }           // the logical elements [begin, end) of
  size_t end(int b) const { return end_[b]; }               // bucket b this rank writes
  size_t bytes() const { return bytes_; }                   // host memory held

 private:
  void free_block();
  bool pin(const std::vector<size_t>& starts, size_t end);

  Backend* be_ = nullptr;
  float* block_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
  std::vector<size_t> pieces_;      // the page-locked pieces' first elements (snapshot.cpp: kPinPiece)
  std::vector<size_t> off_, slot_;  // per dataset: its start in block_ and its slot length (elements)
  std::vector<char> has_, narrow_;  // narrow: copied in bf16, widened by land()
  bool residual_ = false;           // the master kind holds residuals: land() adds the parameters
  std::vector<const optim::Code*> code_;  // int8 slots: copied and written as codes and scales
  std::vector<size_t> begin_, end_;
  std::vector<std::string> names_;
};

// n bf16 values stored at byte 2*slot of a slot of `slot` >= n floats, widened to fp32 at its start.
void widen_bf16_in_place(float* slot_start, size_t n, size_t slot);

// Bytes of a snapshot per rank (the memory prediction: the largest rank's share), as reserve() takes,
// for an optimizer with n_slots state slots (held as policy.state says).
size_t snapshot_bytes(const ParamLayout& layout, int world, const ZeroPolicy& policy, bool has_master, int n_slots);

}  // namespace gpt
