// What a rank holds of the training state, as checkpoints see it (io/ writes and reads them through this
// interface alone): for every bucket the logical range [piece_begin, piece_end) this rank keeps, and the
// kinds of state it keeps there (parameters, master weights, the optimizer's slots). The ZeroEngine is one.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "optim/state.hpp"

namespace gpt {

class ShardedState {
 public:
  virtual ~ShardedState() = default;
  // The kinds of state, by index: kParam, kMaster, then the optimizer's slots ("m", ...). Without master
  // weights the master kind is not held (holds() false): the parameters are the master.
  static constexpr int kParam = 0, kMaster = 1;
  virtual const std::vector<std::string>& state_names() const = 0;
  virtual bool holds(int s) const = 0;
  // As held: parameters in the compute dtype, master weights fp32, the optimizer's slots fp32 or bf16
  // (training.optimizer_state); int8 slots say F32 (the values they stand for) and have a state_code:
  // checkpoints keep their codes and scales (copy_piece_async, set_piece_codes).
  virtual DType state_dtype(int s) const = 0;
  // An int8 slot's code (optim/state.hpp), null for every other kind: its copies are codes and scales.
  virtual const optim::Code* state_code(int s) const = 0;
  // Elements every piece's start is a multiple of, counted from the bucket's start (int8 state: a
  // quantization block); a checkpoint's slices at stage 0 keep to it.
  virtual size_t piece_align() const = 0;
  virtual bool has_master() const = 0;
  // Compensated master weights: the master kind is held as bf16 residuals (state_dtype BF16); its fp32
  // value is the parameter plus the residual, exact in fp32 (optim/state.hpp, compensated_split).
  virtual bool master_is_residual() const { return false; }
  virtual int zero_stage() const = 0;
  // Whether a rank's pieces are its own shards (ZeRO >= 1), or every rank holds everything (then a
  // checkpoint writes an equal slice per rank).
  virtual bool shards() const = 0;
  virtual size_t piece_begin(int b) const = 0;
  virtual size_t piece_end(int b) const = 0;
  virtual Backend& backend() const = 0;
  // This rank's piece of bucket b's state kind s, from fp32 host values (piece_end - piece_begin of them).
  virtual void set_piece(int b, int s, const float* in) = 0;
  // An int8 slot's piece as held, from the bytes copy_piece_async copies (the piece's code bytes, then its
  // blocks' fp32 scales): a checkpoint's codes and scales go back unchanged.
  virtual void set_piece_codes(int b, int s, const void* in) = 0;
  // Queues a copy of logical elements [lo, hi) of bucket b's state s (within this rank's piece) into host
  // memory `out`, as held (state_dtype; an int8 slot: hi - lo code bytes, then the fp32 scales of their
  // quant_blocks(hi - lo) blocks; lo a multiple of piece_align()). It lands at backend().wait_copies(); the state's next update waits
  // for it on the device, so training goes on meanwhile and the copy stays the state of this step. Only
  // io/snapshot calls it, and hands the bytes out only once they have landed (Snapshot::Copies).
  virtual void copy_piece_async(int b, int s, size_t lo, size_t hi, void* out) = 0;
};

}  // namespace gpt
