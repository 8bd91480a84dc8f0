// training.memory_fit: auto. Every combination of the settings that trade memory for time is planned, its
// memory per rank predicted (predict_memory: the dry run's table, nothing measured on a device) and its
// step time predicted by the model below; the fastest that fits the budget is written into the config
// before the run's plan is made from it.
//
// The combinations: training.optimizer_state (fp32, bf16, int8), training.recompute (0-3), the master
// weights (kMasterOptions; a config's `master_weights: none` is kept, never switched) and the micro-batch
// (each divisor of the sequences per rank of a step, micro_batch x grad_accum or total_batch_tokens /
// seq_len / ranks, grad_accum making up the rest, so the global batch stays). A key the config was given
// (Config::set_keys: the YAML, --set, a sweep point) keeps its value, whatever it is; micro_batch, or
// grad_accum without total_batch_tokens, fixes the split.
//
// The choice: the fastest combination that fits; among those predicted within kPrecisionBand of the
// fastest, the most precise optimizer state wins, then the most precise master option, then the fastest
// (a less precise state for a gain the model cannot vouch for is a loss), then, at equal predicted time,
// the smaller (more of the budget left for the CUDA runtime, whose share varies). The runner-up is the next
// in that order.
//
// training.gradient_release (each bucket updated and its gradient freed in the backward) is an axis where
// the config allows it (grad_clip 0, one rank) and does not give it: the combinations of one micro-batch a
// step without offload, then. It costs no time in the model (the same update, run earlier), so it is
// chosen only where it lets a faster or more precise combination fit: at equal predicted time the
// combination without it ranks first.
//
// training.offload (optimizer: master weights and state in host memory, updated by the host's threads) is
// an axis on a GPU at ZeRO 0-2, unless the config gives it; the update then costs the host's pass over the
// offloaded bytes and the gradients down and parameters up over PCIe (below), so it is chosen where
// nothing on the device fits or is faster.
//
// The step-time model: seconds of one optimizer step on one rank of an H100, to rank combinations (on the
// CPU too: the ranking, not the CPU's time). Communication is left out: it is the same for every
// combination but ZeRO-3's gathers, which repeat per micro-step.
//   step   = grad_accum * (B * T * token * (1 + kRecomputeExtra[recompute]) + micro) + update
//   token  = flops_per_token / rate + kActBytes * n_layer * n_embd / kHbm
//            the products at an effective rate (bf16; fp8 products, precision fp8), and the element-wise ops'
//            activation traffic (LayerNorm, GELU, residuals, attention), per layer a multiple of its width
//   micro  = kMicroBytes * n_params / kHbm
//            what every micro-step costs whatever its size: the weights read by the forward and the
//            backward, the gradients accumulated (the loss of tensor-core efficiency of small micro-batches
//            shows as this fixed cost over fewer tokens)
//   update = (2 * (master + code * optim bytes) + passes * compute-dtype bytes * n) / kHbm, n the
//            parameters this rank updates (a shard from ZeRO-1 on); master and optim bytes are the
//            prediction's, each read and written, so a new master kind needs no change here; passes: the
//            gradient read and the parameter written, and the parameter read unless an fp32 master
//            replaces it (compensated: param + residual); code = kInt8CodeCost for int8 state, else 1
// The constants, fitted to H100 measurements of this trainer at T = 1024 (bench/RESULTS.md; kHbm given):
//   kHbm 3e12 B/s: H100 HBM3 as the optimizer's step reaches it (AdamW at 1558M moved 43 GB in 10.8 ms
//     on an H200's 4.8 TB/s, 83%, bench/RESULTS.md "Later kernels"; 3.35 TB/s x 0.9 on an H100);
//     the update term then gives 14.5 ms at 1558M with fp32 master and state (28 B/parameter).
//   kRate 7.16e14 FLOP/s, kActBytes 157, kMicroBytes 18.4: the three solve exactly GPT-2 1558M bf16
//     micro-batch 16 without recompute, 314.5 ms; 1558M micro-batch 1 x accumulation 16 with recompute 2,
//     468 ms; GPT-2 124M micro-batch 64, 107 ms (16 x 1024 tokens a step at 1558M, 64 x 1024 at 124M).
//     Out of sample: 1558M micro-batch 6 predicts 133 ms against 127 measured (48,260 tokens/s, "The
//     largest micro-batch of 1558M under 40 GiB per GPU").
//   kRateFp8 1.19e15 FLOP/s: 1558M fp8 with the FP8 classifier, micro-batch 16, 224.7 ms, the other terms
//     as in bf16; with some layers or products in bf16 (training.fp8_layers, fp8_products) the FLOPs at each
//     rate in proportion to the block products' weights in each precision (layers measured: 1-46 of 48,
//     226.8 against 223.3 ms; products not measured). fp32 compute (a GPU at precision fp32, the CPU) takes bf16's rate (not measured; it
//     weighs only the products against the other terms).
//   kRecomputeExtra {0, 0.018, 0.035, 1/3}: level 1 measured (+1.8% at 1558M, 306.7 -> 312.2 ms; +1.7% at
//     124M); level 2 adds both LayerNorms' forwards (their whole forward and backward took 15.5 ms of a
//     300 ms 1558M step, "Where the time goes": about another 1.7%); level 3 runs every block's forward
//     again, a third of a step's products.
//   kInt8CodeCost 2: int8 state's code conversions (a search among 256 code values per value) taken to
//     cost as much as its bytes (not measured).
//   offload: update = t * n + 2 * compute-dtype bytes * n / kPcie (the host's pass over the parameters this
//            rank updates; gradients down, parameters up; not counted as overlapped), t the seconds a
//            parameter of the host's update takes on the machine that runs it: a run (not a dry run) on a
//            GPU measures it for each offloaded combination that fits the budget (host_update_s_per_param
//            over kHostProbeParams synthetic parameters, once per state type and master kind, about
//            0.1-0.3 s each on 16 cores), a dry run takes kHostSecondsPerParam by state type.
//   kHostSecondsPerParam {0.94, 1.26, 4.03} ns (fp32, bf16, int8 state): measured so on an H100 machine's
//     16 cores with fp32 master weights (compensated: 0.95, 1.27, 4.09; bench/RESULTS.md, 2026-12-07, noon);
//     there the 12 GiB choice (fp32 state offloaded, micro-batch 8 x 2) was predicted at 1858 ms a step and
//     took 1934. The loop is compute-bound: a byte model (fitted before, 1.70e10 B/s) had the states' order
//     wrong, bf16 state's conversions costing more than the bytes they save. Hosts differ: the same choice
//     took 1.3x as long on another lent H100 machine, which is why a run measures its own.
//     kPcie 5.5e10 B/s: page-locked copies one way on that machine.
// The budget: memory_limit_gb (or the GPU's memory) bounds the whole process, so on a GPU the
// combinations' predicted allocations must fit it less kCudaRuntimeBytes.
//   kCudaRuntimeBytes 1.5 GiB: a GPU process's device memory outside the trainer's allocations (the CUDA
//     context, cuBLASLt's and cuDNN's own memory): nvidia-smi's peak less the trainer's allocated peak was
//     1.51 GiB (16 GiB run) and 1.47 GiB (12 GiB run) for GPT-2 1558M on an H100 (CUDA 13, the cuDNN and
//     cuBLAS of torch 2.11's wheels; bench/RESULTS.md, 2026-12-06). Before it was counted, the choice in
//     16 GiB allocated 14.77 GiB and the process took 16.28.
//   kPrecisionBand 0.10: about twice the spread of the measurements behind the model (step times moved
//     2.5% between GPUs and calls of one day; the out-of-sample point is 4.5% off).
#pragma once
#include <string>
#include <vector>

#include "base/memory.hpp"
#include "config/config.hpp"
#include "run/plan.hpp"

namespace gpt {

// The master-weight kinds auto chooses among (training.master_weights), most precise first; their bytes
// come from the prediction (EngineSizes::bytes). A kind the config gives (`none` among them) is kept, and
// fp32 compute (the CPU, precision fp32) has no copy to choose.
inline constexpr MasterWeights kMasterOptions[] = {MasterWeights::fp32, MasterWeights::compensated};

inline constexpr double kHbm = 3e12, kRate = 7.16e14, kRateFp8 = 1.19e15, kActBytes = 157, kMicroBytes = 18.4;
inline constexpr double kRecomputeExtra[] = {0.0, 0.018, 0.035, 1.0 / 3.0};
inline constexpr double kInt8CodeCost = 2, kPrecisionBand = 0.10;
inline constexpr double kHostSecondsPerParam[] = {0.94e-9, 1.26e-9, 4.03e-9};  // by optim::StateType
inline constexpr double kPcie = 5.5e10;
inline constexpr size_t kHostProbeParams = size_t(1) << 24;  // 16M: 224-448 MiB of host memory touched
inline constexpr double kCudaRuntimeBytes = 1.5 * double(1ull << 30);
// The smaller logits chunk memory_fit also tries (training.logits_chunk), where the config leaves the key
// and a micro-batch holds more rows; not in the step model (at GPT-2 1558M one more classifier product
// of 1024 x 50304 x 1600 per 1024 rows: the same FLOPs in smaller pieces).
inline constexpr int kFitLogitsChunk = 1024;

// What a rank's predicted allocations may take of a per-rank budget (bytes; 0: unknown, kept) on `device`
// ("cuda": the budget less kCudaRuntimeBytes, at least 1 byte, so that a budget the runtime alone exceeds
// fits nothing; the CPU: all of it).
double allocation_budget(double budget, const std::string& device);

// Predicted seconds of one optimizer step of the plan on one rank (the model above); host_s_per_param > 0:
// training.offload's host update measured on this machine (seconds a parameter), else kHostSecondsPerParam.
double predicted_step_s(const Plan& plan, double host_s_per_param = 0);

struct FitCandidate {
  std::string optimizer_state;
  int recompute = 0;
  MasterWeights master = MasterWeights::fp32;
  Offload offload = Offload::none;
  bool gradient_release = false;
  int micro_batch = 0, grad_accum = 1;
  int logits_chunk = 0;    // training.logits_chunk (0: the default)
  MemoryBreakdown memory;  // predicted per rank
  double step_s = 0;       // predicted
  // "optimizer_state int8, recompute 3, master fp32, micro_batch 1 x grad_accum 8"
  std::string describe() const;
};

struct FitResult {
  std::vector<FitCandidate> fitting;  // best first
  FitCandidate smallest;              // of all, the smallest predicted total
  size_t considered = 0;
  double budget = 0;                  // bytes per rank
  std::string budget_text;            // "training.memory_limit_gb 2 (2.00 GiB per rank)"
  std::vector<std::string> kept;      // the keys kept as the config gave them
  // training.offload's host update as weighed: measured on this machine (per state type and master kind,
  // ns a parameter), or the model's constant (a dry run); empty where no offloaded combination fits
  std::string host_text;
};

// Every combination of cfg's (validated as given) planned and ranked against the budget:
// training.memory_limit_gb, else the GPU's memory; input_error naming memory_limit_gb where neither is
// known (the CPU, or a dry run for a GPU that is not here).
FitResult rank_fits(const Config& cfg, int world, bool dry_run = false);

// The run's plan. training.memory_fit: auto writes the chosen combination into cfg and puts the choice
// and the runner-up in plan.memory_fit (--resume of a run with a checkpoint: the keys the config does not
// give take the newest checkpoint's values instead of being chosen again, so the run goes on as it was);
// nothing fits: Error(kExitOutOfMemory) naming memory_limit_gb and the smallest prediction.
// off: make_plan(cfg, world, dry_run).
Plan plan_with_fit(Config& cfg, int world, bool dry_run = false);

}  // namespace gpt
