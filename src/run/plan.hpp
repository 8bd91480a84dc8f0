// The plan of a run: everything derived from the config and the world size before any memory is
// touched (validated once), and the memory it will need per rank.
#pragma once
#include <string>

#include "backend/backend.hpp"
#include "base/memory.hpp"
#include "config/config.hpp"
#include "parallel/comm.hpp"
#include "parallel/zero_policy.hpp"
#include "model/fp8_scaling.hpp"
#include "model/gpt.hpp"
#include "model/params.hpp"

namespace gpt {

struct Plan {
  ModelSpec model;               // the model's structure and its products' precision (model/spec.hpp)
  std::string device;            // resolved: cpu | cuda
  std::string device_note;       // dry run: what was assumed about the device (empty otherwise)
  std::string memory_fit;        // training.memory_fit: auto: the choice and the runner-up (run/memory_fit.hpp)
  DeviceCaps caps;               // what the device can do (unknown fields empty: a dry run without the GPU)
  DType act = DType::F32;        // activation dtype
  Fp8Recipe fp8_recipe;          // their scaling
  std::string optimizer;         // training.optimizer (optim/optimizer.hpp)
  HyperValues hypers;            // its hyperparameters (training.beta1, ...)
  int optimizer_slots = 0;       // its fp32 state per parameter
  bool stochastic_rounding = true;
  int micro_batch = 0;           // sequences per rank per micro-step; 0 while `max` is not yet searched
  bool micro_batch_max = false;  // training.micro_batch was `max`
  int seq_len = 0, grad_accum = 1, world = 1;
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;
  size_t n_params = 0;
  ZeroPolicy zero;
  optim::MasterKind master_weights = optim::MasterKind::F32;  // training.master_weights
  int recompute = 0;
  int logits_chunk = 0;          // training.logits_chunk, resolved (kDefaultLogitsChunk for 0)
  bool checkpoints = true;       // checkpoint.every > 0: the run takes its checkpoint snapshot (else only a stop signal's checkpoint does)
  BackendOptions backend;        // what the backend is built with (local_rank filled in per rank)
  bool shared_gpu = false;       // parallel.shared_gpu: host (the staged communicator, GPUs shared by ranks)
};

// Validates the config (every key, every combination) and derives the plan; throws input_error. A
// dry run plans for the configured device even where there is none (device: cuda on a CPU node).
Plan make_plan(const Config& cfg, int world, bool dry_run = false);
// Which products compute in FP8 (training.precision and its fp8_* keys) for a model of n_layer layers
// (fp8_weights_kept left at its default: the plan decides it); throws an input error naming a bad key.
PrecisionPolicy precision_policy(const TrainingConfig& t, int n_layer);
// The config against what the plan's device can do (plan.caps): an input error naming the key, or (the
// device unknown: a dry run on a node without it) a note in plan.device_note. make_plan calls it.
void check_capabilities(const Config& cfg, Plan& plan);
// The same plan at a known micro-batch (micro_batch: max, once searched).
Plan with_micro_batch(Plan plan, int micro_batch);
// Predicted bytes per rank by component: the engine's buffers plus the model's activations.
MemoryBreakdown predict_memory(const Plan& plan);
// Host bytes per rank of the offloaded optimizer (training.offload; 0 without): the `offload` component
// on CPU, page-locked host memory beside the device on a GPU.
size_t host_offload_bytes(const Plan& plan);
// Host bytes per rank of a checkpoint's snapshot (io/snapshot.hpp); the `snapshot` component on CPU.
size_t host_snapshot_bytes(const Plan& plan);
// The --dry-run output: the config table, the derived quantities and the memory prediction.
void print_plan(const Config& cfg, const Plan& plan);

// The predicted host memory of this node's ranks against the memory the system has available (CPU: all
// of it; GPU: the checkpoint snapshots, when the run `checkpoints` and so takes them at the start);
// Error(kExitOutOfMemory) naming both before anything is allocated (agreed across ranks).
void check_host_memory(const Plan& plan, HostComm& host, bool checkpoints);

std::string format_bytes(double b);  // "1.50 GiB"
// "model 48x1600, micro_batch 16 x seq 1024, ZeRO stage 0, recompute 0, 2 rank(s)", for messages
std::string describe(const Plan& plan);

}  // namespace gpt
