// The optimizer's low-precision state (training.optimizer_state, optim/state.hpp) on the CPU backend: the
// codes, one step through the optimizer interface, and a dump that tests/python/test_optimizer_state_codes.py
// checks against a NumPy implementation of the quantization and the stochastic rounding.
//   test_optim_state [filter]          the unit tests
//   test_optim_state --dump DIR        writes DIR/<optimizer>_<state>.bin: the gradient, then each slot as held
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "test_util.hpp"
#include "optim/optimizer.hpp"
#include "optim/step.hpp"

using namespace gpt;
using optim::StateType;

namespace {

// Parameters, gradients and the optimizer's slots as held (bytes), with the int8 scales.
struct Held {
  std::vector<float> p, g;
  std::vector<std::vector<char>> slot;
  std::vector<std::vector<float>> scale;
  unsigned nonfinite = 0;
};

Held make_held(const Optimizer& opt, std::vector<float> p, std::vector<float> g) {
  Held h{std::move(p), std::move(g), {}, {}};
  for (size_t k = 0; k < opt.slots().size(); ++k) {
    h.slot.emplace_back(optim::state_type_size(opt.state()) * h.p.size(), 0);
    h.scale.emplace_back(optim::quant_blocks(h.p.size()), 0.0f);
  }
  return h;
}

// One update of every element (the first n_decay decay), as the engine calls it for a piece.
void step(const Optimizer& opt, Held& c, const OptimizerHyper& h, size_t n_decay) {
  auto be = make_cpu_backend(BackendOptions{});
  ParamRange r;
  r.param = c.p.data();
  r.grad = c.g.data();
  r.n = c.p.size();
  r.n_decay = n_decay;
  r.nonfinite = &c.nonfinite;
  for (size_t k = 0; k < c.slot.size(); ++k) {
    r.slot[k] = c.slot[k].data();
    r.scale[k] = c.scale[k].data();
  }
  opt.update(*be, r, h);
}

// Slot k's values in fp32.
std::vector<float> values(const Optimizer& opt, const Held& c, int k) {
  std::vector<float> out(c.p.size());
  const optim::Code& code = optim::code_of(opt.slot_signed(k));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = opt.state() == StateType::Int8
                 ? optim::decode(uint8_t(c.slot[k][i]), code.value, c.scale[k][i / optim::kQuantBlock])
                 : optim::bf16_value(reinterpret_cast<const uint16_t*>(c.slot[k].data())[i]);
  return out;
}

// A gradient with per-element scales spread over four decades, some zeros, a block of zeros, and values
// below the codes' smallest step.
std::vector<float> gradient(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g) x = nd(rng) * std::exp(2.0f * nd(rng)) * 1e-2f;
  g[3] = 0.0f;
  g[300] = 1e-12f;  // far below 1e-10 of its block's maximum (the unsigned code's floor: v = g^2)
  g[301] = -1e-9f;
  for (size_t i = 512; i < 768 && i < n; ++i) g[i] = 0.0f;  // an all-zero block: scale 0
  return g;
}

int dump(const std::string& dir) {
  const size_t n = 1000;  // three whole blocks and a partial one
  for (const OptimizerInfo& info : optimizers())
    for (StateType t : {StateType::BF16, StateType::Int8}) {
      auto opt = make_optimizer(info.name, false, t, {{"beta1", 0.0f}, {"beta2", 0.0f}});
      Held c = make_held(*opt, std::vector<float>(n, 1.0f), gradient(n, 11));
      // betas 0: the new moments are the gradient and its square, exactly (fma(0, x, 1 * g) = g, fma(g, 1 * g,
      // 0) = g*g rounded once), so the state written is the quantization of known values
      OptimizerHyper h;
      h.lr = 1e-2f, h.weight_decay = 0.1f, h.grad_scale = 1.0f;
      h.step = 1, h.seed = 0x0123456789abcdefull;
      step(*opt, c, h, n / 2);
      std::string bytes(reinterpret_cast<const char*>(c.g.data()), 4 * n);
      for (size_t k = 0; k < c.slot.size(); ++k) {
        bytes.append(c.slot[k].data(), c.slot[k].size());
        if (t == StateType::Int8) bytes.append(reinterpret_cast<const char*>(c.scale[k].data()), 4 * c.scale[k].size());
      }
      const std::string path = dir + "/" + info.name + "_" + optim::state_type_name(t) + ".bin";
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        return 1;
      }
      std::printf("%s: %zu elements, %zu slot(s)\n", path.c_str(), n, c.slot.size());
    }
  return 0;
}

}  // namespace

// Compensated master weights: hi is the nearest bf16, hi + lo is within 2^-16 of the value relative to
// it, and splitting hi + lo again gives hi and lo back (what a checkpoint of the fp32 sum relies on), also
// on the values where rounding the residual to nearest would have made a tie.
TEST(OptimState, compensated_split_keeps_sixteen_bits_and_round_trips) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  std::uniform_int_distribution<int> ex(-40, 20);
  size_t worse = 0, back = 0, exact = 0;
  std::vector<float> w;
  for (int i = 0; i < 200000; ++i) w.push_back(std::ldexp(d(rng), ex(rng)));
  for (uint32_t m : {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f80ff80u, 0x3f817fffu, 0xbf808001u})
    w.push_back(optim::f32_of_bits(m));  // 1, ties of hi (odd and even), a residual near half a step
  for (float x : w) {
    const optim::Compensated s = optim::compensated_split(x);
    const float hi = optim::bf16_value(s.hi), v = optim::compensated_value(s.hi, s.lo);
    EXPECT_EQ(s.hi, optim::bf16_bits_rn(optim::f32_bits(x)));
    EXPECT_LE(std::fabs(x - hi), std::ldexp(std::fabs(hi), -8));
    if (std::fabs(x - v) > std::ldexp(std::fabs(x), -15)) ++worse;
    const optim::Compensated t = optim::compensated_split(v);
    back += t.hi == s.hi && t.lo == s.lo;
    exact += v == hi + optim::bf16_value(s.lo);
  }
  EXPECT_EQ(worse, 0u);
  EXPECT_EQ(back, w.size());
  EXPECT_EQ(exact, w.size());
  // a value bf16 holds has no residual; the sign of zero is kept
  EXPECT_EQ(optim::compensated_split(1.5f).lo, 0);
  EXPECT_EQ(optim::compensated_split(-0.0f).hi, 0x8000);
}

TEST(OptimState, codes_are_ascending_and_span_the_unit_range) {
  for (bool sig : {true, false}) {
    const optim::Code& c = optim::code_of(sig);
    for (int i = 0; i + 1 < 256; ++i) {
      EXPECT_TRUE(c.value[i] <= c.value[i + 1]) << i;
      EXPECT_TRUE(c.value[i] <= c.mid[i] && c.mid[i] <= c.value[i + 1]) << i;
    }
    EXPECT_EQ(c.value[255], 1.0f);
    EXPECT_EQ(c.value[0], sig ? -1.0f : 0.0f);
    EXPECT_EQ(optim::encode(1.0f, c.mid, sig), sig ? 254 : 255);
    EXPECT_EQ(optim::encode(0.0f, c.mid, sig), sig ? 127 : 0);
  }
  // the smallest steps: 1e-5 (signed) and 1e-10 (unsigned) of the block's maximum
  EXPECT_NEAR(optim::code_of(true).value[128], 1e-5, 1e-9);
  EXPECT_NEAR(optim::code_of(false).value[1], 1e-10, 1e-14);
  // a positive value far below the unsigned code's smallest step keeps that step, never 0
  EXPECT_EQ(optim::encode(1e-20f, optim::code_of(false).mid, false), 1);
  EXPECT_EQ(optim::encode(1e-20f, optim::code_of(true).mid, true), 127);
}

TEST(OptimState, low_precision_state_tracks_fp32_state) {
  const size_t n = 2048;
  for (const OptimizerInfo& info : optimizers())
    for (StateType t : {StateType::BF16, StateType::Int8}) {
      const HyperValues hypers = info.name == "lion" ? HyperValues{{"beta2", 0.99f}} : HyperValues{};
      auto ref = make_optimizer(info.name, false, StateType::F32, hypers);
      auto opt = make_optimizer(info.name, false, t, hypers);
      Held c = make_held(*opt, std::vector<float>(n, 0.5f), std::vector<float>(n));
      std::vector<float> p(n, 0.5f);
      std::vector<std::vector<float>> s(ref->slots().size(), std::vector<float>(n, 0.0f));
      OptimizerHyper h;
      h.lr = 1e-3f;
      h.weight_decay = 0.1f;
      auto be = make_cpu_backend(BackendOptions{});
      for (int st = 1; st <= 10; ++st) {
        h.step = st, h.seed = uint64_t(st);
        c.g = gradient(n, 100 + unsigned(st));
        step(*opt, c, h, n);
        ParamRange r;
        r.param = p.data(), r.grad = c.g.data(), r.n = n, r.decay = true;
        for (size_t k = 0; k < s.size(); ++k) r.slot[k] = s[k].data();
        ref->update(*be, r, h);
      }
      EXPECT_EQ(c.nonfinite, 0u);
      for (size_t k = 0; k < s.size(); ++k) {
        const std::vector<float> got = values(*opt, c, int(k));
        double err = 0, norm = 0;
        for (size_t i = 0; i < n; ++i) {
          err += (got[i] - s[k][i]) * double(got[i] - s[k][i]);
          norm += double(s[k][i]) * s[k][i];
        }
        // relative L2 error of the state after 10 steps: bf16 about 0.3%, int8's codes about 2%
        EXPECT_LT(std::sqrt(err / norm), t == StateType::BF16 ? 0.01 : 0.05) << info.name << " " << optim::state_type_name(t) << " slot " << k;
      }
      double dp = 0;
      for (size_t i = 0; i < n; ++i) dp = std::max(dp, double(std::fabs(p[i] - c.p[i])));
      EXPECT_LT(dp, 10 * 1e-3) << info.name;  // within the 10 steps' total movement
    }
}

TEST(OptimState, weight_decay_applies_to_the_first_n_decay_elements) {
  for (StateType t : {StateType::BF16, StateType::Int8}) {
    auto opt = make_optimizer("lion", false, t, {{"beta2", 0.99f}});
    Held c = make_held(*opt, {1.0f, 1.0f, 1.0f}, {0.0f, 0.0f, 0.0f});
    OptimizerHyper h;
    h.lr = 0.1f, h.weight_decay = 0.5f, h.step = 1;
    step(*opt, c, h, 2);
    EXPECT_NEAR(c.p[0], 1.0 - 0.1 * 0.5, 1e-7);  // sign(0) = 0: decay alone
    EXPECT_NEAR(c.p[1], 1.0 - 0.1 * 0.5, 1e-7);
    EXPECT_EQ(c.p[2], 1.0f);
  }
}

TEST(OptimState, a_non_finite_moment_is_reported) {
  for (StateType t : {StateType::BF16, StateType::Int8}) {
    auto opt = make_optimizer("adamw", false, t);
    Held c = make_held(*opt, {1.0f, 2.0f}, {NAN, 1.0f});
    OptimizerHyper h;
    h.lr = 0.1f, h.step = 1;
    step(*opt, c, h, 2);
    EXPECT_EQ(c.nonfinite, 1u);
  }
}

// training.offload's host twin of the CUDA kernel (optim::step_host) against the CPU loop for bf16 and
// int8 state, where both run the rules' Fused arithmetic: with fp32 parameters every byte (parameters,
// slots, scales) is the CPU loop's; with bf16 parameters and an fp32 master, the master is the CPU loop's
// fp32 parameter and each bf16 parameter one of its master value's two bf16 neighbours (stochastic
// rounding: not always the nearest). Two steps from zero state. (tests/gpu/test_offload.cpp compares the
// twin with the kernel itself.)
template <class Rule>
void twin_matches_cpu_loop(StateType t) {
  constexpr int K = Rule::kSlots;
  const size_t n = 1000, nb = optim::quant_blocks(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> w(n);
  for (float& x : w) x = optim::bf16_value(optim::bf16_bits_rn(optim::f32_bits(d(rng))));
  // [0] the CPU loop (fp32 parameters), [1] the twin on fp32 parameters, [2] the twin on bf16 ones + master
  std::vector<float> p[3] = {w, w, w};
  std::vector<uint16_t> pb(n);
  for (size_t i = 0; i < n; ++i) pb[i] = optim::bf16_bits_rn(optim::f32_bits(w[i]));
  std::vector<std::vector<char>> slot[3];
  std::vector<std::vector<float>> scale[3];
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < K; ++k) slot[c].emplace_back(optim::state_type_size(t) * n, 0), scale[c].emplace_back(nb, 0.0f);
  for (int st = 1; st <= 2; ++st) {
    std::vector<float> g = gradient(n, 20 + st);
    std::vector<uint16_t> gb(n);
    for (size_t i = 0; i < n; ++i) {
      gb[i] = optim::bf16_bits_rn(optim::f32_bits(g[i]));
      g[i] = optim::bf16_value(gb[i]);
    }
    for (int c = 0; c < 3; ++c) {
      optim::StepArgs a;
      a.state = t, a.n = n, a.n_decay = n / 2, a.grad_scale = 0.7f, a.seed = 77 + st, a.index_offset = 256;
      a.stochastic = true;
      optim::Hyper x;
      x.lr = 1e-2f, x.step = st;
      for (size_t i = 0; i < std::size(Rule::kHypers); ++i) x.p[i] = Rule::kHypers[i].value;  // the defaults
      a.h_rest = Rule::prepare(x);
      x.weight_decay = 0.1f;
      a.h = Rule::prepare(x);
      for (int k = 0; k < K; ++k) a.slot[k] = slot[c][k].data(), a.scale[k] = scale[c][k].data(), a.slot_signed[k] = Rule::kSlotSigned[k];
      if (c == 2) {
        a.bf16 = true, a.param = pb.data(), a.grad = gb.data(), a.master = p[2].data();
      } else {
        a.param = p[c].data(), a.grad = g.data();
      }
      if (c == 0) optim::step_cpu<Rule>(a);
      else optim::step_host<Rule>(a, false);
    }
  }
  const std::string what = std::string(Rule::kName) + " " + optim::state_type_name(t);
  for (int c = 1; c < 3; ++c) {
    EXPECT_EQ(std::memcmp(p[c].data(), p[0].data(), 4 * n), 0) << what << (c == 1 ? ": parameters" : ": master");
    for (int k = 0; k < K; ++k) {
      EXPECT_EQ(slot[c][k], slot[0][k]) << what << " slot " << k << (c == 1 ? " (fp32 parameters)" : " (bf16)");
      if (t == StateType::Int8) {
        EXPECT_EQ(scale[c][k], scale[0][k]) << what << " scales " << k;
      }
    }
  }
  size_t not_nearest = 0, outside = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t lo = uint16_t(optim::f32_bits(p[0][i]) >> 16), nearest = optim::bf16_bits_rn(optim::f32_bits(p[0][i]));
    outside += pb[i] != lo && pb[i] != uint16_t(lo + 1);
    not_nearest += pb[i] != nearest;
  }
  EXPECT_EQ(outside, 0u) << what;
  EXPECT_GT(not_nearest, n / 10) << what;
}

TEST(OptimState, host_twin_of_the_kernel_matches_the_cpu_loop) {
  for (StateType t : {StateType::BF16, StateType::Int8}) {
    twin_matches_cpu_loop<optim::AdamW>(t);
    twin_matches_cpu_loop<optim::Lion>(t);
  }
}

// The host loops' two builds (optim::HostIsa: x86-64-v2 and x86-64-v3 with FMA) on the same inputs: every
// byte they write is the same, for every rule and state type, the CPU loop (fp32 parameters, with and
// without a master) and the kernel's host twin (fp32 parameters; bf16 with an fp32 master, a compensated
// residual or neither, stochastic and nearest rounding; the kernel's vector and one-element forms), three
// steps with weight decay on part of the range and gradients of every scale, zeros and subnormals included.
struct IsaRun {
  std::vector<float> p, master;
  std::vector<uint16_t> pb, residual;
  std::vector<std::vector<char>> slot;
  std::vector<std::vector<float>> scale;
  unsigned nonfinite = 0;
  bool operator==(const IsaRun& o) const {
    return std::memcmp(p.data(), o.p.data(), 4 * p.size()) == 0 &&
           std::memcmp(master.data(), o.master.data(), 4 * master.size()) == 0 && pb == o.pb &&
           residual == o.residual && slot == o.slot && scale == o.scale && nonfinite == o.nonfinite;
  }
};

enum class IsaCase { cpu, cpu_master, host_f32, host_bf16_master, host_bf16_compensated, host_bf16_sr, host_bf16_rn };

template <class Rule>
IsaRun run_isa(StateType t, IsaCase c, bool aligned, optim::HostIsa isa) {
  constexpr int K = Rule::kSlots;
  const size_t n = 4099, nb = optim::quant_blocks(n);  // a partial block and a vector tail
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> d(-1, 1);
  const bool bf16 = c >= IsaCase::host_bf16_master;
  IsaRun r;
  r.p.resize(n);
  for (float& x : r.p) x = d(rng);
  if (c == IsaCase::cpu_master || c == IsaCase::host_bf16_master) r.master = r.p;
  if (bf16) {
    r.pb.resize(n);
    if (c == IsaCase::host_bf16_compensated) r.residual.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const optim::Compensated s = optim::compensated_split(r.p[i]);
      r.pb[i] = s.hi;
      if (!r.residual.empty()) r.residual[i] = s.lo;
    }
  }
  for (int k = 0; k < K; ++k) r.slot.emplace_back(optim::state_type_size(t) * n, 0), r.scale.emplace_back(nb, 0.0f);
  for (int st = 1; st <= 3; ++st) {
    std::vector<float> g = gradient(n, 40 + st);
    g[3] = 0.0f, g[5] = 1e-41f, g[8] = -3e4f;
    std::vector<uint16_t> gb(n);
    for (size_t i = 0; i < n; ++i) gb[i] = optim::bf16_bits_rn(optim::f32_bits(g[i]));
    optim::StepArgs a;
    a.state = t, a.n = n, a.n_decay = n / 2, a.grad_scale = 0.7f, a.seed = 5 + st, a.index_offset = 512;
    a.stochastic = c != IsaCase::host_bf16_rn;
    optim::Hyper x;
    x.lr = 1e-2f, x.step = st;
    for (size_t i = 0; i < std::size(Rule::kHypers); ++i) x.p[i] = Rule::kHypers[i].value;
    a.h_rest = Rule::prepare(x);
    x.weight_decay = 0.1f;
    a.h = Rule::prepare(x);
    for (int k = 0; k < K; ++k) a.slot[k] = r.slot[k].data(), a.scale[k] = r.scale[k].data(), a.slot_signed[k] = Rule::kSlotSigned[k];
    a.master = r.master.empty() ? nullptr : r.master.data();
    a.nonfinite = &r.nonfinite;
    if (bf16) {
      a.bf16 = true, a.param = r.pb.data(), a.grad = gb.data();
      a.residual = r.residual.empty() ? nullptr : r.residual.data();
    } else {
      a.param = r.p.data(), a.grad = g.data();
    }
    if (c == IsaCase::cpu || c == IsaCase::cpu_master) optim::step_cpu<Rule>(a, isa);
    else optim::step_host<Rule>(a, aligned, isa);
  }
  return r;
}

template <class Rule>
void isas_agree() {
  for (StateType t : {StateType::F32, StateType::BF16, StateType::Int8})
    for (IsaCase c : {IsaCase::cpu, IsaCase::cpu_master, IsaCase::host_f32, IsaCase::host_bf16_master,
                      IsaCase::host_bf16_compensated, IsaCase::host_bf16_sr, IsaCase::host_bf16_rn})
      for (bool aligned : {true, false}) {
        const IsaRun base = run_isa<Rule>(t, c, aligned, optim::HostIsa::base);
        const IsaRun fma = run_isa<Rule>(t, c, aligned, optim::HostIsa::fma);
        EXPECT_TRUE(base == fma) << Rule::kName << " " << optim::state_type_name(t) << " case " << int(c)
                                 << (aligned ? " aligned" : " unaligned");
      }
}

TEST(OptimState, host_loops_for_either_instruction_set_write_the_same_bytes) {
  if (optim::host_isa() != optim::HostIsa::fma) GTEST_SKIP() << "this CPU has no AVX2 and FMA";
#define GPT_ISAS_AGREE(R) isas_agree<optim::R>();
  GPT_OPTIMIZER_RULES(GPT_ISAS_AGREE)
#undef GPT_ISAS_AGREE
}

// --bench N: the host loops' time per element for either instruction set, the offload's update of N
// parameters (bf16 parameters and gradients, fp32 master, each state type), on this machine's threads:
// one line of JSON per rule, state type and instruction set (bench/host_update.py runs it).
template <class Rule>
void bench_rule(size_t n) {
  constexpr int K = Rule::kSlots;
  for (StateType t : {StateType::F32, StateType::BF16, StateType::Int8}) {
    std::vector<float> master(n, 0.5f);
    std::vector<uint16_t> pb(n, 0x3f00), gb(n);
    for (size_t i = 0; i < n; ++i) gb[i] = optim::bf16_bits_rn(optim::f32_bits(1e-3f * float(int(i % 2001) - 1000)));
    std::vector<std::vector<char>> slot;
    std::vector<std::vector<float>> scale;
    for (int k = 0; k < K; ++k)
      slot.emplace_back(optim::state_type_size(t) * n, 0), scale.emplace_back(optim::quant_blocks(n), 0.0f);
    for (optim::HostIsa isa : {optim::HostIsa::base, optim::HostIsa::fma}) {
      if (isa == optim::HostIsa::fma && optim::host_isa() != optim::HostIsa::fma) continue;
      double best = 1e30;
      for (int rep = 1; rep <= 4; ++rep) {
        optim::StepArgs a;
        a.state = t, a.n = n, a.n_decay = n, a.grad_scale = 1.0f, a.seed = uint64_t(rep), a.bf16 = true;
        optim::Hyper x;
        x.lr = 1e-4f, x.step = rep, x.weight_decay = 0.1f;
        for (size_t i = 0; i < std::size(Rule::kHypers); ++i) x.p[i] = Rule::kHypers[i].value;
        a.h = a.h_rest = Rule::prepare(x);
        a.param = pb.data(), a.grad = gb.data(), a.master = master.data();
        for (int k = 0; k < K; ++k) a.slot[k] = slot[k].data(), a.scale[k] = scale[k].data(), a.slot_signed[k] = Rule::kSlotSigned[k];
        const auto t0 = std::chrono::steady_clock::now();
        optim::step_host<Rule>(a, true, isa);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("{\"rule\": \"%s\", \"state\": \"%s\", \"isa\": \"%s\", \"n\": %zu, \"s\": %.6f, "
                  "\"ns_per_param\": %.3f}\n", Rule::kName, optim::state_type_name(t),
                  isa == optim::HostIsa::fma ? "x86-64-v3" : "x86-64-v2", n, best, 1e9 * best / double(n));
      std::fflush(stdout);
    }
  }
}

int bench(size_t n) {
#define GPT_BENCH(R) bench_rule<optim::R>(n);
  GPT_OPTIMIZER_RULES(GPT_BENCH)
#undef GPT_BENCH
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--dump") return dump(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "--bench") return bench(std::stoull(argv[2]));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
