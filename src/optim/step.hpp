// One update of a contiguous range of parameters by a rule (optim/rules.hpp), on the CPU or on the GPU.
// With a master copy the fp32 master is updated and the parameter (compute copy) written from it; with
// a residual (compensated master) the master value is param + residual, written back split in two;
// without one, the parameter is read, updated and written back. bf16 writes round stochastically with
// a random number from (seed ^ element index) unless nearest rounding was asked for. A non-finite
// updated value (parameter, master or a slot) sets *nonfinite: the divergence check rides on the
// optimizer's own pass, with no extra read of the state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "optim/rules.hpp"
#include "optim/state.hpp"

namespace gpt::optim {

struct StepArgs {
  void* param = nullptr;           // (n) activation dtype (bf16 or fp32)
  float* master = nullptr;         // (n) or null
  uint16_t* residual = nullptr;    // (n) or null: compensated master weights, bf16 param + this bf16 residual
                                   // (optim/state.hpp, compensated_split); param is then bf16 and master null
  const void* grad = nullptr;      // (n) activation dtype
  void* slot[kMaxSlots] = {};      // (n) each, the rule's kSlots of them, held as `state` says
  float* scale[kMaxSlots] = {};    // int8: (quant_blocks(n)) each, the blocks' scales
  StateType state = StateType::F32;
  bool slot_signed[kMaxSlots] = {};  // the rule's kSlotSigned (int8: which code)
  size_t n = 0;
  Hyper h;                         // after the rule's prepare()
  // bf16 and int8 state: one range per piece, element 0 at a block's start; elements [0, n_decay) are
  // updated with h, the rest with h_rest (no weight decay). fp32: h for all (a range per decay setting).
  size_t n_decay = 0;
  Hyper h_rest;
  float grad_scale = 1.0f;         // multiplies the gradient first (clipping)
  uint64_t seed = 0;               // stochastic rounding of bf16 params: seed ^ (index_offset + i)
  uint64_t index_offset = 0;       // logical index of element 0, so rounding does not depend on sharding
  bool stochastic = true;
  bool bf16 = false;               // param and grad are bf16 (else fp32)
  unsigned* nonfinite = nullptr;   // (1) nullable; set to 1, never cleared here
};

// bf16 and int8 state (a.state): the slots are read and written as optim/state.hpp says, the rule run
// with its Fused arithmetic, so that the CPU and the GPU write the same state bytes.
// Rule is one of GPT_OPTIMIZER_RULES. The CPU loop needs host memory; the CUDA one device memory and a
// cudaStream_t (it queues the kernel; failures are thrown as the kernels' errors).
// The host loops (step_cpu, step_host) are built for two instruction sets: x86-64-v2 (`base`) and
// x86-64-v3 (`fma`: AVX2 and the FMA instruction, where the Fused arithmetic's fused multiply-adds are
// otherwise library calls; 1.1-2.1x faster, bench/host_update.py). Both compute the same IEEE operations,
// so the same bits; host_isa() is the CPU's best, and the default.
enum class HostIsa { base, fma };
HostIsa host_isa();
template <class Rule>
void step_cpu(const StepArgs& a, HostIsa isa = host_isa());
template <class Rule>
void step_cuda(const StepArgs& a, void* stream);

// The CUDA kernel of fp32 state (step_cuda.cu) takes kStepVec elements at a time where every pointer of
// the range is aligned to kStepVec of its elements (step_aligned: each pointer, null or not, with its
// element size), and then all but the last n % kStepVec; the others one at a time.
constexpr int kStepVec = 8;
inline bool step_aligned(std::initializer_list<std::pair<const void*, size_t>> ptrs) {
  for (const auto& [p, esz] : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % (esz * kStepVec) != 0) return false;
  return true;
}
// training.offload: step_cuda's update on the host (OpenMP), bit for bit, on host copies of the device's
// memory (param and grad bf16 as their bits when a.bf16). The device's products, fused multiply-adds,
// divisions and square roots are single IEEE roundings, which the host computes with std::fma and its
// own IEEE operations in the forms the kernel takes (rules.hpp: AdamW's differ between the kernel's
// vector path, taken where `aligned`, and its one-element path), and the same rounding of the parameters.
template <class Rule>
void step_host(const StepArgs& a, bool aligned, HostIsa isa = host_isa());

// Compensated master weights from fp32 values w on the device: residual[i] = compensated_split(w[i]).lo
// (optim/state.hpp), queued on the cudaStream_t `stream` (the initialisation on the device; the
// parameters are w rounded to nearest, f32_to_act).
void compensated_residuals_cuda(uint16_t* residual, const float* w, size_t n, void* stream);

}  // namespace gpt::optim
