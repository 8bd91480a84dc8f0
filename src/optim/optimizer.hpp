// The optimizer: how parameters are updated from their gradients, and the per-parameter state it keeps.
// An optimizer declares its state slots (one value per parameter each: AdamW's m and v, Lion's m), held
// as training.optimizer_state says for every slot of every optimizer (fp32, bf16 or int8 blocks: a
// StateType, optim/state.hpp); ZeRO allocates and shards whatever is declared (parallel/zero.hpp), and
// the memory prediction, the dry run and the checkpoints derive from the slots and their type. Elementwise optimizers are a rule each (optim/rules.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "optim/hypers.hpp"
#include "optim/rules.hpp"
#include "optim/state.hpp"

namespace gpt {

// One optimizer step's settings, shared by every range of the step (the rule's own hyperparameters,
// fixed for a run, are bound by make_optimizer).
struct OptimizerHyper {
  float lr = 0, weight_decay = 0;
  float grad_scale = 1.0f;   // multiplies every gradient first (clipping)
  int step = 1;              // 1-based
  uint64_t seed = 0;         // stochastic rounding of bf16 parameters
};

// A contiguous range of parameters and their state, in the backend's memory.
struct ParamRange {
  void* param = nullptr;                   // (n) act dtype: the compute copy
  float* master = nullptr;                 // (n) fp32 master weights, or null (the param is updated)
  uint16_t* residual = nullptr;            // (n) compensated master weights' bf16 residuals, or null
  const void* grad = nullptr;              // (n) act dtype
  void* slot[optim::kMaxSlots] = {};       // (n) each of the optimizer's slots, as its StateType holds them
  float* scale[optim::kMaxSlots] = {};     // int8: (quant_blocks(n)) each slot's block scales
  size_t n = 0;
  bool decay = false;                      // fp32 state: weight decay applies to this range
  // bf16 and int8 state: the range is a bucket's whole piece (element 0 at a quantization block's start)
  // and its first n_decay elements decay
  size_t n_decay = 0;
  uint64_t index_offset = 0;               // logical index of element 0 (rounding independent of sharding)
  unsigned* nonfinite = nullptr;           // (1) set when an updated value is not finite
  // update_host: whether the device's kernel would find the range's pointers aligned for its vector path
  // (optim::step_aligned; fp32 state on CUDA, where AdamW's arithmetic differs between the two paths)
  bool device_aligned = false;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;
  virtual const std::vector<std::string>& slots() const = 0;  // the state per parameter, by name
  virtual optim::StateType state() const = 0;                  // how every slot is held
  virtual bool slot_signed(int k) const = 0;                   // slot k's values take both signs (its int8 code)
  // Queues the update of one range on the backend (asynchronous like every op).
  virtual void update(Backend& be, const ParamRange& r, const OptimizerHyper& h) const = 0;
  // training.offload: the same update on the host's threads, now, on host memory (param and grad in
  // be's activation dtype): bit for bit what update() writes on be's device (CPU: its own loop; CUDA: the
  // kernel's arithmetic, optim::step_host).
  void update_host(const Backend& be, const ParamRange& r, const OptimizerHyper& h) const {
    update_on_host(r, h, HostForm{be.name() == "cuda", be.act_dtype() == DType::BF16});
  }
  // The update above for a backend described rather than given: whether its device runs the CUDA kernel
  // (whose arithmetic the host then reproduces) and whether param and grad are bf16 (else fp32).
  struct HostForm {
    bool cuda_kernel;
    bool bf16;
  };
  virtual void update_on_host(const ParamRange& r, const OptimizerHyper& h, HostForm form) const = 0;
};

// training.offload on a GPU: seconds a parameter of opt's host update takes on this host's threads (bf16
// parameters and gradients, the CUDA kernel's arithmetic, master weights of kind `master`), the least of
// two timed steps over n synthetic parameters after one untimed: what memory_fit weighs offload by on
// the machine that runs it (run/memory_fit.hpp). n should exceed the host's caches many times over.
double host_update_s_per_param(const Optimizer& opt, optim::MasterKind master, size_t n);

// The optimizers there are: name, state slots, documentation (training.optimizer's values), the names of
// its hyperparameters (optim/hypers.hpp).
struct OptimizerInfo {
  std::string name;
  std::vector<std::string> slots;
  std::string doc;
  std::vector<std::string> hypers;
};
const std::vector<OptimizerInfo>& optimizers();
const OptimizerInfo* find_optimizer(const std::string& name);  // null when there is none of that name

// stochastic_rounding: bf16 parameter writes rounded stochastically (training.stochastic_rounding);
// state: how the slots are held (training.optimizer_state); hypers: the rule's hyperparameters by name
// (training.beta1 and the like), a name not given taking the rule's default.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, bool stochastic_rounding,
                                          optim::StateType state = optim::StateType::F32,
                                          const HyperValues& hypers = {});

}  // namespace gpt
