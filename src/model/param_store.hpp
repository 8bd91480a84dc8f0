// The model's view of where parameters and gradients live: it asks per bucket (ZeRO decides, see
// parallel/zero.hpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/fp8_ops.hpp"

namespace gpt {

// An FP8 product's weight in its bucket: elements [offset, offset + n), quantized with q's scale (its
// amax recorded in q.amax); q.data unused
struct Fp8WeightRange {
  size_t offset = 0, n = 0;
  Fp8Tensor q;
};

// Who owns the parameters and gradients (ZeRO stages): the model asks per bucket.
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // The bucket's full parameters (act dtype), valid until the next prefetch of a bucket in the same
  // gather buffer (ZeroEngine: two layers apart). May gather (stage 3).
  virtual const void* params(int b) = 0;
  // Announces that params(b) comes next, so a gather can start early.
  virtual void prefetch(int b) { (void)b; }
  // The buffer the backward pass accumulates bucket b's gradients into (act dtype, zeroed per step
  // or per micro-step as the store decides).
  virtual void* grads(int b) = 0;
  // The backward pass will not touch bucket b again in this micro-step.
  virtual void grads_done(int b) { (void)b; }
  // Changes whenever any parameter may have changed (an optimizer step, a load): what the model keeps
  // derived from the parameters (FP8 weight copies) is valid while it stays the same. A store whose
  // parameters change must override it.
  virtual uint64_t params_version() const { return 0; }
  // FP8 weights gathered as FP8 (ZeRO-3, parallel/zero.hpp). Where gathers_fp8(b), params(b) does not
  // hold the act-dtype values of the bucket's FP8 weights; fp8_params(b, key) gathers them instead as
  // FP8 bytes, one an element at each weight's offset (each rank casts its own piece with the weight's
  // scale), valid until the next FP8 gather two layers on; each call gathers again. key: the version of
  // the scales they are cast with (a prefetch made with another key is not used).
  virtual bool gathers_fp8(int b) const { (void)b; return false; }
  virtual void prefetch_fp8(int b, uint64_t key) { (void)b, (void)key; }
  virtual const void* fp8_params(int b, uint64_t key) { (void)b, (void)key; return nullptr; }
};

}  // namespace gpt
