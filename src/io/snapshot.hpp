// One rank's share of a checkpoint in host memory: a consistent copy of the training state at a step
// boundary, which a thread writes while training goes on. One block of host memory, allocated once
// (at the start of a run that checkpoints) and page-locked through the backend, so that the step that
// checkpoints only queues device-to-host copies on the backend's copy stream; the engine's next update
// waits for them on the device. The writer thread waits for them on the host (complete) before it
// touches the bytes. Parameters held in bf16 are copied as they are (half the bytes over the bus) into
// the upper half of their fp32 slot and widened in place there by complete().
#pragma once
#include <cstddef>
#include <vector>

#include "dist/zero.hpp"

namespace gpt {

class Snapshot {
 public:
  Snapshot() = default;
  ~Snapshot();  // unpins and frees the block (the backend outlives it)
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  // Allocates and page-locks the block for this engine's state on this rank, the first time (later
  // calls keep it). Returns false when the memory could not be page-locked (copies run, slower).
  bool reserve(ZeroEngine& e, const ParamLayout& layout, int rank, int world);
  // Main thread, at a step boundary: queues the copies of the engine's state into the block.
  void take(ZeroEngine& e, const ParamLayout& layout, int rank, int world);
  // Any thread, after take(): waits for the copies, then widens bf16 parameters on `threads` threads.
  void complete(int threads);

  // Index b*4+k: bucket b, state kStateNames[k] (io/checkpoint.hpp).
  bool has(size_t i) const { return has_[i] != 0; }         // master only with master weights
  const float* data(size_t i) const { return block_ + off_[i]; }
  size_t elems(int b) const { return end_[b] - begin_[b]; }
  size_t begin(int b) const { return begin_[b]; }           // the logical elements [begin, end) of
  size_t end(int b) const { return end_[b]; }               // bucket b this rank writes
  size_t bytes() const { return bytes_; }                   // host memory held

 private:
  void free_block();

  Backend* be_ = nullptr;
  float* block_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
  std::vector<size_t> off_, slot_;  // per dataset: its start in block_ and its slot length (elements)
  std::vector<char> has_, narrow_;  // narrow: copied in bf16, widened by complete()
  std::vector<size_t> begin_, end_;
};

// n bf16 values stored at byte 2*slot of a slot of `slot` >= n floats, widened to fp32 at its start.
void widen_bf16_in_place(float* slot_start, size_t n, size_t slot);

// Bytes of a snapshot per rank (the memory prediction: the largest rank's share), as reserve() takes.
size_t snapshot_bytes(const ParamLayout& layout, int world, const ZeroPolicy& policy, bool has_master);

}  // namespace gpt
