// Elementwise update rules, for host and device alike: the CPU loop (step_cpu.cpp) and the CUDA kernel
// (step_cuda.cu) apply the same function to every element, so both backends compute the same update.
// A rule sees one parameter's fp32 value w, its gradient g (already scaled by clipping) and its state
// slots s[0..kSlots) (fp32, updated in place), and returns the new value. Its step constants (bias
// corrections and the like) are computed once per step on the host (prepare).
//
// Adding an optimizer: a struct here with the same members (kSlotSigned: whether each slot's values take
// both signs, which picks its int8 code; kHypers: its own hyperparameters; apply's last template parameter
// the arithmetic, and apply_as<A>; its Compiled form names every operation with A::mul and A::mul_add, so
// that training.offload's host update computes the kernel's bits), a line in GPT_OPTIMIZER_RULES, and a test (tests/cpu/test_optim.cpp
// against a NumPy-written reference). Everything else (the config's `training.optimizer` values and docs,
// a `training.<name>` key per hyperparameter with its default, range and docs, ZeRO's sharding of the
// slots, the memory prediction, checkpoints) derives from the struct.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define GPT_RULE_HD __host__ __device__ __forceinline__
#else
#define GPT_RULE_HD inline
#endif

namespace gpt::optim {

// a * b and a * b + c with their roundings fixed: on the GPU one rounding for the product and one fused
// multiply-add, on the host (x86-64-v2, no FMA) two roundings each, as plain expressions.
GPT_RULE_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GPT_RULE_HD float mul_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return a * b + c;
#endif
}

// A rule's arithmetic, its apply's template parameter A. Compiled: mul and mul_add above (the GPU fuses, the
// host rounds twice) and the rule's other expressions left to each compiler, as the fp32 state has always
// been updated. Fused: every multiply-add one fused rounding on host and device alike (std::fma; __fmaf_rn),
// every product an explicit rounding (__fmul_rn on the GPU, where nvcc would otherwise contract it into a
// neighbouring add), division and square root IEEE on both (no fast-math anywhere), so the host and the
// device compute the same bits. The low-precision optimizer state (optim/state.hpp) uses Fused: its codes
// and scales must be the same bytes on both backends.
struct Compiled {
  static constexpr bool kFused = false;
  GPT_RULE_HD static float mul(float a, float b) { return optim::mul(a, b); }
  GPT_RULE_HD static float mul_add(float a, float b, float c) { return optim::mul_add(a, b, c); }
};
struct Fused {
  static constexpr bool kFused = true;
  GPT_RULE_HD static float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;  // x86-64-v2 has no FMA instruction: the host never contracts a product into an add
#endif
  }
  GPT_RULE_HD static float mul_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
};

// The device's Compiled arithmetic computed on the host (training.offload's update, optim::step_host): each
// product rounded on its own, each multiply-add fused, as Compiled is on the GPU. A rule whose Compiled form
// names every operation (Lion; AdamW has its own forms) gets the kernel's bits from it on the host.
struct CompiledOnDevice : Fused {
  static constexpr bool kFused = false;
};

// A hyperparameter a rule reads besides lr and weight_decay (which every rule reads: the schedule's rate
// and the decay of the tensors that decay): the config key training.<name>, its default, the values it
// accepts (lo <= x < hi, or lo < x with lo_open) and what it does. Rules that share a name share its key
// and must declare the same default (checked where the table is built, optim/optimizer.cpp).
struct HyperDecl {
  const char* name;
  float value;
  float lo, hi;
  bool lo_open;
  const char* doc;
};
constexpr int kMaxHypers = 4;  // the most hyperparameters of any rule below
constexpr float kUnbounded = 3.0e38f;

// The step's hyperparameters: lr and weight_decay as the step has them (the decay is 0 for tensors without
// weight decay), the rule's own (p[i] the value of its kHypers[i]), and what prepare() derives from them.
struct Hyper {
  float lr = 0, weight_decay = 0;
  float p[kMaxHypers] = {};
  int step = 1;            // 1-based
  float c0 = 0, c1 = 0;    // per-rule step constants
};

// AdamW (decoupled weight decay, bias-corrected moments).
struct AdamW {
  static constexpr const char* kName = "adamw";
  static constexpr int kSlots = 2;
  static constexpr const char* kSlotNames[kSlots] = {"m", "v"};
  static constexpr bool kSlotSigned[kSlots] = {true, false};  // the int8 code of each (optim/state.hpp)
  static constexpr const char* kDoc =
      "AdamW: `beta1`, `beta2` the moments' decay, `eps`, decoupled `weight_decay`; two fp32 moments per "
      "parameter";
  enum { kBeta1, kBeta2, kEps };
  static constexpr HyperDecl kHypers[] = {
      {"beta1", 0.9f, 0.0f, 1.0f, false, "the first moment's decay"},
      {"beta2", 0.95f, 0.0f, 1.0f, false, "the second moment's decay"},
      {"eps", 1e-8f, 0.0f, kUnbounded, true, "added to the root of the second moment"}};
  static Hyper prepare(Hyper h) {
    h.c0 = 1.0f - std::pow(h.p[kBeta1], float(h.step));  // bias corrections
    h.c1 = 1.0f - std::pow(h.p[kBeta2], float(h.step));
    return h;
  }
  // The moments' fused multiply-adds, each in one of two forms (any is as accurate as the other). Left
  // to the compiler, a*b + c*d contracts into whichever fma its context suggests, which differed between
  // the CUDA kernel's instantiations; the kernel names the form of each (step_cuda.cu) so that its bits
  // are those of earlier builds. On the host (no FMA) both forms round alike.
  //   MOnGradient: m = fma(1 - b1, g, b1 m), else fma(b1, m, g (1 - b1))
  //   VOnMoment:   v = fma(b2, v, g (g (1 - b2))), else fma(g, (1 - b2) g, b2 v)
  template <bool MOnGradient = true, bool VOnMoment = false, class A = Compiled>
  GPT_RULE_HD static float apply(float w, float g, float* s, const Hyper& h) {
    const float beta1 = h.p[kBeta1], beta2 = h.p[kBeta2], eps = h.p[kEps];
    s[0] = MOnGradient ? A::mul_add(1.0f - beta1, g, A::mul(beta1, s[0]))
                       : A::mul_add(beta1, s[0], A::mul(g, 1.0f - beta1));
    s[1] = VOnMoment ? A::mul_add(beta2, s[1], A::mul(g, A::mul(g, 1.0f - beta2)))
                     : A::mul_add(g, A::mul(1.0f - beta2, g), A::mul(beta2, s[1]));
    const float mhat = s[0] / h.c0, vhat = s[1] / h.c1;
    if constexpr (A::kFused) {
      return A::mul_add(-h.lr, A::mul_add(h.weight_decay, w, mhat / (sqrtf(vhat) + eps)), w);
    } else {
      return w - h.lr * (mhat / (sqrtf(vhat) + eps) + h.weight_decay * w);
    }
  }
  template <class A>
  GPT_RULE_HD static float apply_as(float w, float g, float* s, const Hyper& h) {
    return apply<true, false, A>(w, g, s, h);
  }
};

// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an interpolation
// of the momentum and the gradient, one fp32 moment per parameter (half of AdamW's state).
struct Lion {
  static constexpr const char* kName = "lion";
  static constexpr int kSlots = 1;
  static constexpr const char* kSlotNames[kSlots] = {"m"};
  static constexpr bool kSlotSigned[kSlots] = {true};
  static constexpr const char* kDoc =
      "Lion: the update is sign(beta1 m + (1 - beta1) g), the moment decays with `beta2` (0.99 is the "
      "paper's choice), decoupled `weight_decay`; one fp32 moment per parameter. Every element moves by lr "
      "per step, so lr is typically 3-10x smaller than AdamW's and weight_decay 3-10x larger";
  enum { kBeta1, kBeta2 };
  static constexpr HyperDecl kHypers[] = {
      {"beta1", 0.9f, 0.0f, 1.0f, false, "the update's interpolation between the moment and the gradient"},
      {"beta2", 0.95f, 0.0f, 1.0f, false, "the moment's decay"}};
  static Hyper prepare(Hyper h) { return h; }
  template <class A = Compiled>
  GPT_RULE_HD static float apply(float w, float g, float* s, const Hyper& h) {
    const float beta1 = h.p[kBeta1], beta2 = h.p[kBeta2];
    // The direction: Fused rounds it once as a multiply-add. Compiled rounds each product on its own on
    // every side (a contraction on the GPU only would move the sign, a whole step, off the CPU's c, an
    // exact zero included). Every operation is named, so the host can compute the kernel's bits
    // (CompiledOnDevice).
    const float c = A::kFused ? A::mul_add(beta1, s[0], A::mul(1.0f - beta1, g))
                              : A::mul(beta1, s[0]) + A::mul(1.0f - beta1, g);
    s[0] = A::mul_add(beta2, s[0], A::mul(1.0f - beta2, g));
    const float u = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    return A::mul_add(-h.lr, A::mul_add(h.weight_decay, w, u), w);
  }
  template <class A>
  GPT_RULE_HD static float apply_as(float w, float g, float* s, const Hyper& h) {
    return apply<A>(w, g, s, h);
  }
};

// Every rule: X(Rule) once each. The backends' step loops and the optimizer table expand it.
#define GPT_OPTIMIZER_RULES(X) \
  X(AdamW)                     \
  X(Lion)

constexpr int kMaxSlots = 2;  // the most slots of any rule above

}  // namespace gpt::optim
