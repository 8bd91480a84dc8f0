// The model's view of where parameters and gradients live: it asks per bucket (ZeRO decides, see
// parallel/zero.hpp).
#pragma once
#include <cstdint>

namespace gpt {

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
};

}  // namespace gpt
