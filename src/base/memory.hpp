// Bytes per rank by component: what the memory model predicts (run/plan.hpp) and what the engine and the
// model allocate (measured). kMemoryComponents is the one list of the components, in order: the dry-run,
// the run log (/memory/predicted and /memory/measured, with the list as their `components` attribute),
// the sweep summary and the Python reader all walk it.
#pragma once
#include <cstddef>

namespace gpt {

struct MemoryBreakdown {
  size_t params = 0, grads = 0, master = 0, optim = 0, activations = 0, workspace = 0, comm = 0;
  size_t snapshot = 0;
  size_t offload = 0;
  size_t total() const { return params + grads + master + optim + activations + workspace + comm + snapshot + offload; }
};

struct MemoryComponent {
  const char* name;
  size_t MemoryBreakdown::*bytes;
  const char* doc;
};

inline constexpr MemoryComponent kMemoryComponents[] = {
    {"params", &MemoryBreakdown::params, "parameters in the compute dtype (this rank's shard at ZeRO-3)"},
    {"grads", &MemoryBreakdown::grads, "gradients in the compute dtype (a shard from ZeRO-2 on)"},
    {"master", &MemoryBreakdown::master,
     "master weights of bf16 parameters: an fp32 copy, or compensated bf16 residuals (sharded from ZeRO-1 on)"},
    {"optim", &MemoryBreakdown::optim,
     "the optimizer's state, fp32 per parameter and slot (AdamW: m and v; Lion: m), sharded from ZeRO-1 on"},
    {"activations", &MemoryBreakdown::activations, "activations kept from forward for backward"},
    {"workspace", &MemoryBreakdown::workspace, "logits chunk, gradient scratch, library workspaces"},
    {"comm", &MemoryBreakdown::comm, "ZeRO-2/3 gather and reduce-scatter buffers"},
    {"snapshot", &MemoryBreakdown::snapshot,
     "CPU: the host copy of this rank's state a checkpoint is written from (on the GPU it is host memory, "
     "page-locked at the start of a run that checkpoints, shown apart in the dry-run)"},
    {"offload", &MemoryBreakdown::offload,
     "CPU, training.offload: the master weights, the optimizer's state and the transfer buffers kept apart "
     "from the parameters (on the GPU they are page-locked host memory, not the device's: 0 here, master and "
     "optim 0 too, the host bytes shown apart in the dry-run)"},
};

}  // namespace gpt
