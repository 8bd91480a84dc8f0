// ZeRO as a policy: what is sharded across ranks. Everything that depends on the stage asks these
// questions instead of comparing stage numbers.
#pragma once
#include <cstddef>
#include <vector>

#include "model/params.hpp"
#include "optim/state.hpp"

namespace gpt {

struct ZeroPolicy {
  int stage = 0;                 // 0..3, as configured (training.zero_stage)
  bool shard_optimizer = false;  // fp32 master weights and the optimizer's state: rank r keeps piece r (stage >= 1)
  bool shard_grads = false;      // gradients are reduce-scattered into a shard as backward goes (stage >= 2)
  bool shard_params = false;     // parameters kept as a shard, gathered bucket by bucket before use (stage 3)
  // stage 3 with FP8 products (training.fp8_weight_gather): their weights are gathered as FP8 bytes, each
  // rank casting its own piece, once per change of the parameters or scales; the rest of a layer's
  // bucket is gathered as before
  bool gather_fp8 = false;
  // how the optimizer's slots are held (training.optimizer_state); with int8, every piece is a whole
  // number of quantization blocks (optim::kQuantBlock elements), so a block's scale has one owner
  optim::StateType state = optim::StateType::F32;
  // training.offload: optimizer: the master weights and the slots in host memory, updated by the host
  bool offload = false;
  // training.gradient_release (one rank): each bucket updated as soon as its gradient is complete, the
  // gradient in a buffer its role shares (as stage 2's), no whole-model gradients
  bool release_grads = false;

  static ZeroPolicy of_stage(int stage) { return {stage, stage >= 1, stage >= 2, stage >= 3, false, optim::StateType::F32}; }
  // gradients in the four role buffers, bucket by bucket (stage 2 and 3, or released)
  bool grads_in_temps() const { return shard_grads || release_grads; }
  // elements a piece is a multiple of (the last piece of a bucket aside)
  size_t piece_align() const;
  // Parameters are whole on every rank but updated piece by piece (stages 1 and 2): after the optimizer
  // step, each rank's piece must be gathered back into everyone's full buffer.
  bool gathers_after_update() const { return shard_optimizer && !shard_params; }
};

// A shard is a range of each bucket: every bucket split into world-size pieces of equal length (the tail
// padded), rank r owning piece r; the length a multiple of piece_align(). Sizes of one bucket under a stage and world size.
struct BucketShape {
  size_t size = 0;       // logical elements
  size_t shard = 0;      // elements per rank (stage 0: size)
  size_t cap = 0;        // elements of a full-bucket buffer (world * shard, or size)
};
std::vector<BucketShape> bucket_shapes(const ParamLayout& layout, int world, const ZeroPolicy& policy);

}  // namespace gpt
