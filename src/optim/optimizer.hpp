// The optimizer: how parameters are updated from their gradients, and the per-parameter state it keeps.
// An optimizer declares its state slots (fp32, one value per parameter each: AdamW's m and v, Lion's m);
// ZeRO shards whatever is declared (parallel/zero.hpp), and the memory prediction, the dry run and the
// checkpoints derive from the slots. Elementwise optimizers are a rule each (optim/rules.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "optim/rules.hpp"

namespace gpt {

// One optimizer step's hyperparameters (training.*), shared by every range of the step.
struct OptimizerHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1.0f;   // multiplies every gradient first (clipping)
  int step = 1;              // 1-based
  uint64_t seed = 0;         // stochastic rounding of bf16 parameters
};

// A contiguous range of parameters and their state, in the backend's memory.
struct ParamRange {
  void* param = nullptr;                   // (n) act dtype: the compute copy
  float* master = nullptr;                 // (n) fp32 master weights, or null (the param is updated)
  const void* grad = nullptr;              // (n) act dtype
  float* slot[optim::kMaxSlots] = {};      // (n) each of the optimizer's slots
  size_t n = 0;
  bool decay = false;                      // weight decay applies to this range
  uint64_t index_offset = 0;               // logical index of element 0 (rounding independent of sharding)
  unsigned* nonfinite = nullptr;           // (1) set when an updated value is not finite
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;
  virtual const std::vector<std::string>& slots() const = 0;  // the fp32 state per parameter, by name
  // Queues the update of one range on the backend (asynchronous like every op).
  virtual void update(Backend& be, const ParamRange& r, const OptimizerHyper& h) const = 0;
};

// The optimizers there are: name, state slots, documentation (training.optimizer's values).
struct OptimizerInfo {
  std::string name;
  std::vector<std::string> slots;
  std::string doc;
};
const std::vector<OptimizerInfo>& optimizers();
const OptimizerInfo* find_optimizer(const std::string& name);  // null when there is none of that name

// stochastic_rounding: bf16 parameter writes rounded stochastically (training.stochastic_rounding).
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, bool stochastic_rounding);

}  // namespace gpt
