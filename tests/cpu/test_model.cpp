// CPU reference tests: whole-model gradients against finite differences, gradient accumulation,
// clipping, the LR schedule, the config parser and llm.c model files (optimizers: test_optim.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <unistd.h>

#include "backend/backend.hpp"
#include "test_util.hpp"
#include "config/config.hpp"
#include "config/config_io.hpp"
#include "model/gpt.hpp"
#include "io/modelfile.hpp"
#include "run/plan.hpp"
#include "run/schedule.hpp"

using namespace gpt;

namespace {

// Full parameters and gradients in host memory (the CPU backend's memory), no sharding.
struct FullStore : ParamStore {
  const ParamLayout& L;
  std::vector<std::vector<float>> p, g;
  explicit FullStore(const ParamLayout& layout) : L(layout) {
    for (int b = 0; b < L.n_buckets(); ++b) {
      p.emplace_back(L.bucket(b).size, 0.0f);
      g.emplace_back(L.bucket(b).size, 0.0f);
    }
  }
  const void* params(int b) override { return p[b].data(); }
  void* grads(int b) override { return g[b].data(); }
  void zero_grads() {
    for (auto& x : g) std::fill(x.begin(), x.end(), 0.0f);
  }
  void randomize(uint64_t seed, float std) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, std);
    for (int b = 0; b < L.n_buckets(); ++b)
      for (auto& t : L.bucket(b).tensors)
        for (size_t i = 0; i < t.numel; ++i) {
          float v = n(rng);
          if (t.spec->init == Init::ones) v += 1.0f;
          p[b][t.offset + i] = v;
        }
    // padded vocabulary rows are zero, as in training
    const ModelDims& d = L.dims();
    auto& wte = L.bucket(0).tensor("wte");
    std::fill(p[0].begin() + wte.offset + size_t(d.vocab_size) * d.n_embd, p[0].begin() + wte.offset + wte.numel, 0.0f);
  }
};

ModelDims small_dims(NormKind norm = NormKind::layernorm, bool bias = true, bool tied_head = true,
                     Activation act = Activation::gelu, PosEmbedding pos = PosEmbedding::learned) {
  ModelConfig m;
  m.norm = norm;
  m.activation = act;
  m.pos_embedding = pos;
  m.bias = bias;
  m.tied_head = tied_head;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 16;
  m.vocab_size = 37;  // awkward on purpose: padded to 128
  m.max_seq_len = 8;
  return resolve_dims(m);
}

std::vector<int> random_tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = int(rng() % uint64_t(V));
  return t;
}

}  // namespace

// every model.norm (and model.activation): the whole model's analytic gradients against central differences
static void check_gradients_against_finite_differences(NormKind norm, bool bias = true, bool tied_head = true,
                                                       Activation act = Activation::gelu,
                                                       PosEmbedding pos = PosEmbedding::learned) {
  auto be = make_cpu_backend(BackendOptions{});
  const ModelDims d = small_dims(norm, bias, tied_head, act, pos);
  ParamLayout L(d);
  const int B = 2, T = 5;
  GPT model(d, L, *be, B, T, 0);
  FullStore ps(L);
  ps.randomize(1, 0.3f);
  auto tok = random_tokens(B * T, d.vocab_size, 2), tgt = random_tokens(B * T, d.vocab_size, 3);
  ps.zero_grads();
  model.forward(ps, tok.data(), tgt.data(), true, 1.0f / (B * T));
  model.backward(ps);
  auto loss_at = [&]() { return double(model.forward(ps, tok.data(), tgt.data(), false, 0.0f)); };
  // Central differences in fp32 with h = 1e-2: truncation error O(h^2) and rounding error about
  // 1e-7 / h on a loss near 4; so compare with 2e-4 absolute plus 2% relative.
  const float h = 1e-2f;
  double err2 = 0, ref2 = 0;
  int checked = 0;
  for (int b = 0; b < L.n_buckets(); ++b)
    for (auto& t : L.bucket(b).tensors) {
      // the three largest gradients of each tensor, and two random elements
      std::vector<size_t> idx(t.numel);
      for (size_t i = 0; i < t.numel; ++i) idx[i] = i;
      std::partial_sort(idx.begin(), idx.begin() + std::min<size_t>(3, t.numel), idx.end(), [&](size_t x, size_t y) {
        return std::fabs(ps.g[b][t.offset + x]) > std::fabs(ps.g[b][t.offset + y]);
      });
      idx.resize(std::min<size_t>(3, t.numel));
      idx.push_back((t.numel * 7) / 11);
      idx.push_back((t.numel * 3) / 13);
      for (size_t i : idx) {
        float& w = ps.p[b][t.offset + i];
        if (i >= t.real_numel) continue;
        const float w0 = w;
        w = w0 + h;
        const double lp = loss_at();
        w = w0 - h;
        const double lm = loss_at();
        w = w0;
        const double fd = (lp - lm) / (2 * h), g = ps.g[b][t.offset + i];
        err2 += (fd - g) * (fd - g);
        ref2 += g * g;
        ++checked;
        EXPECT_TRUE(std::fabs(fd - g) <= 2e-4 + 0.02 * std::fabs(g)) << std::string(t.name) + "[" + std::to_string(i) + "] (bucket " + std::to_string(b) +
                      "): analytic " + std::to_string(g) + ", finite difference " + std::to_string(fd);
      }
    }
  EXPECT_TRUE(checked > 40);
  EXPECT_TRUE(std::sqrt(err2 / ref2) < 1e-2) << "relative gradient error " + std::to_string(std::sqrt(err2 / ref2));
}

TEST(Model, gradients_match_finite_differences) { check_gradients_against_finite_differences(NormKind::layernorm); }

// relu2 is once differentiable: its second derivative jumps at 0, which central differences straddle only
// where a pre-activation lies within h of 0 (their error is then O(h) there, inside the tolerance)
TEST(Model, relu2_gradients_match_finite_differences) {
  check_gradients_against_finite_differences(NormKind::layernorm, true, true, Activation::relu2);
  check_gradients_against_finite_differences(NormKind::rmsnorm, false, true, Activation::relu2);
}

TEST(Model, rmsnorm_gradients_match_finite_differences) {
  check_gradients_against_finite_differences(NormKind::rmsnorm);
}

TEST(Model, rmsnorm_layout_has_no_norm_biases) {
  const ParamLayout ln(small_dims()), rms(small_dims(NormKind::rmsnorm));
  const ModelDims& d = ln.dims();
  // ln1b and ln2b of every layer and lnfb: C values each
  EXPECT_TRUE(ln.n_params() - rms.n_params() == size_t(2 * d.n_layer + 1) * d.n_embd);
  for (int b = 0; b < rms.n_buckets(); ++b)
    for (auto& t : rms.bucket(b).tensors)
      for (const char* bias : {"ln1b", "ln2b", "lnfb"}) EXPECT_STRNE(t.name, bias);
}

TEST(Model, gradients_match_finite_differences_without_biases) {
  check_gradients_against_finite_differences(NormKind::layernorm, false);
  check_gradients_against_finite_differences(NormKind::rmsnorm, false);
}

TEST(Model, an_untied_head_has_its_own_matrix_and_gradient) {
  check_gradients_against_finite_differences(NormKind::layernorm, true, false);
  const ParamLayout tied(small_dims()), untied(small_dims(NormKind::layernorm, true, false));
  const ModelDims& d = tied.dims();
  EXPECT_EQ(untied.n_params() - tied.n_params(), size_t(d.vocab_size) * d.n_embd);
  EXPECT_EQ(untied.bucket(0).tensor("lmhead").shape, untied.bucket(0).tensor("wte").shape);
  // the same FLOPs a token: the embedding is a lookup either way
  EXPECT_EQ(flops_per_token(tied, 8), flops_per_token(untied, 8));
}

TEST(Model, models_without_a_learned_position_embedding_have_no_wpe) {
  for (PosEmbedding pos : {PosEmbedding::none, PosEmbedding::rope}) {
    check_gradients_against_finite_differences(NormKind::layernorm, true, true, Activation::gelu, pos);
    const ParamLayout with(small_dims()), without(small_dims(NormKind::layernorm, true, true, Activation::gelu, pos));
    const ModelDims& d = with.dims();
    EXPECT_EQ(with.n_params() - without.n_params(), size_t(d.max_seq_len) * d.n_embd);
    for (auto& t : without.bucket(0).tensors) EXPECT_STRNE(t.name, "wpe");
    // the FLOP convention counts the parameters there are
    EXPECT_LT(flops_per_token(without, 8), flops_per_token(with, 8));
  }
}

// RoPE's rotation is orthogonal: the inverse undoes the forward (to float rounding), v is untouched, and
// position 0 is not rotated at all; a query and a key rotated by positions t and t + k have the same dot
// product as at 0 and k (the relative position is what attention sees)
TEST(Model, rope_rotates_q_and_k_by_position_and_its_inverse_undoes_it) {
  auto be = make_cpu_backend(BackendOptions{});
  const int B = 2, T = 7, NH = 3, HS = 8;
  std::vector<float> qkv(size_t(B) * T * 3 * NH * HS);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : qkv) x = u(rng);
  std::vector<float> r = qkv;
  be->rope(Rope{r.data(), B, T, NH, HS, false});
  auto at = [&](const std::vector<float>& v, int b, int t, int part, int h, int i) {
    return v[(((size_t(b) * T + t) * 3 + part) * NH + h) * HS + i];
  };
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < HS; ++i) {
          EXPECT_EQ(at(r, b, t, 2, h, i), at(qkv, b, t, 2, h, i));  // v
          if (t == 0) {
            EXPECT_EQ(at(r, b, t, 0, h, i), at(qkv, b, t, 0, h, i));
          } else if (i == 0) {
            EXPECT_NE(at(r, b, t, 0, h, i), at(qkv, b, t, 0, h, i));
          }
        }
  // the same q at positions 1 and 4, the same k at 3 and 6: equal dot products (offset 2 both times)
  std::vector<float> s(qkv.size(), 0.0f);
  for (int i = 0; i < HS; ++i)
    for (int t : {1, 4}) s[((size_t(t) * 3 + 0) * NH) * HS + i] = at(qkv, 0, 0, 0, 0, i);
  for (int i = 0; i < HS; ++i)
    for (int t : {3, 6}) s[((size_t(t) * 3 + 1) * NH) * HS + i] = at(qkv, 0, 0, 1, 0, i);
  be->rope(Rope{s.data(), B, T, NH, HS, false});
  double d1 = 0, d2 = 0;
  for (int i = 0; i < HS; ++i) {
    d1 += double(at(s, 0, 1, 0, 0, i)) * at(s, 0, 3, 1, 0, i);
    d2 += double(at(s, 0, 4, 0, 0, i)) * at(s, 0, 6, 1, 0, i);
  }
  EXPECT_NEAR(d1, d2, 1e-5);
  be->rope(Rope{r.data(), B, T, NH, HS, true});
  for (size_t k = 0; k < r.size(); ++k) EXPECT_NEAR(r[k], qkv[k], 1e-6f) << k;
}

TEST(Model, a_layout_without_biases_has_no_bias_tensors) {
  for (NormKind k : {NormKind::layernorm, NormKind::rmsnorm}) {
    const ParamLayout with(small_dims(k)), without(small_dims(k, false));
    const ModelDims& d = with.dims();
    // each layer's qkv (3C), attproj (C), fc (4C), fcproj (C) biases; LayerNorm's 2 a layer and the final's
    const size_t norms = k == NormKind::layernorm ? size_t(2 * d.n_layer + 1) * d.n_embd : 0;
    EXPECT_EQ(with.n_params() - without.n_params(), size_t(9 * d.n_embd) * d.n_layer + norms);
    for (int b = 0; b < without.n_buckets(); ++b)
      for (auto& t : without.bucket(b).tensors) EXPECT_NE(std::string(t.name).back(), 'b') << t.name;  // *b: a bias
  }
}

TEST(Model, accumulated_micro_batches_equal_one_large_batch) {
  auto be = make_cpu_backend(BackendOptions{});
  const ModelDims d = small_dims();
  ParamLayout L(d);
  const int T = 6, k = 3, b = 2;
  auto tok = random_tokens(size_t(k) * b * T, d.vocab_size, 5), tgt = random_tokens(size_t(k) * b * T, d.vocab_size, 6);
  FullStore big(L), acc(L);
  big.randomize(9, 0.1f);
  acc.p = big.p;
  {
    GPT m(d, L, *be, k * b, T, 0);
    m.forward(big, tok.data(), tgt.data(), true, 1.0f / (k * b * T));
    m.backward(big);
  }
  {
    GPT m(d, L, *be, b, T, 1);  // with recompute, which must not change gradients
    double loss = 0;
    for (int i = 0; i < k; ++i) {
      loss += m.forward(acc, tok.data() + i * b * T, tgt.data() + i * b * T, true, 1.0f / (k * b * T));
      m.backward(acc);
    }
    (void)loss;
  }
  double max_rel = 0;
  for (int bk = 0; bk < L.n_buckets(); ++bk)
    for (size_t i = 0; i < big.g[bk].size(); ++i) {
      const double a = big.g[bk][i], c = acc.g[bk][i];
      max_rel = std::max(max_rel, std::fabs(a - c) / (1e-6 + std::fabs(a)));
      if (std::fabs(a - c) > 1e-6 + 1e-4 * std::fabs(a)) {
        EXPECT_TRUE(false) << "bucket " + std::to_string(bk) + " element " + std::to_string(i) + ": " + std::to_string(a) +
                             " vs " + std::to_string(c);
        return;
      }
    }
  std::printf("  max relative difference %.3g\n", max_rel);
}

TEST(Model, recompute_levels_give_identical_gradients) {
  auto be = make_cpu_backend(BackendOptions{});
  const ModelDims d = small_dims();
  ParamLayout L(d);
  const int B = 2, T = 7;
  auto tok = random_tokens(B * T, d.vocab_size, 11), tgt = random_tokens(B * T, d.vocab_size, 12);
  std::vector<std::vector<std::vector<float>>> grads;
  std::vector<size_t> stored;
  for (int r = 0; r <= 3; ++r) {
    FullStore s(L);
    s.randomize(4, 0.1f);
    GPT m(d, L, *be, B, T, r);
    m.forward(s, tok.data(), tgt.data(), true, 1.0f / (B * T));
    m.backward(s);
    grads.push_back(s.g);
    stored.push_back(m.stored_bytes());
  }
  EXPECT_TRUE(grads[0] == grads[1]);
  EXPECT_TRUE(grads[0] == grads[2]);
  EXPECT_TRUE(grads[0] == grads[3]);
  // each level keeps less (level 3 shares one block's activations between the layers)
  EXPECT_TRUE(stored[0] > stored[1] && stored[1] > stored[2] && stored[2] > stored[3]);
}

// Every recompute level in FP8 (the block products and the classifier, CPU emulation with real FP8 bytes)
// over passes with the scales updated between them (delayed scaling, as the trainer's steps): the losses,
// the gradients and the scaling state (scales and amax histories) bit-identical to recompute 0, so the
// recomputed FP8 bytes are the forward's and the recomputation leaves the amaxes alone. An evaluation pass
// between the training passes (the shared buffers overwritten) changes nothing either.
TEST(Model, recompute_levels_are_bit_identical_in_fp8) {
  auto be = make_cpu_backend(BackendOptions{});
  ModelConfig mc;
  mc.n_layer = 3, mc.n_head = 2, mc.n_embd = 32, mc.vocab_size = 61, mc.max_seq_len = 16;
  const ModelDims d = resolve_dims(mc);
  ParamLayout L(d);
  const int B = 3, T = 16, passes = 4;
  auto tok = random_tokens(size_t(passes) * B * T, d.vocab_size, 21);
  auto tgt = random_tokens(size_t(passes) * B * T, d.vocab_size, 22);
  struct Result {
    size_t stored;
    std::vector<float> losses;
    std::vector<std::vector<float>> grads;
    Fp8Scaling::State state;
  };
  std::vector<Result> res;
  for (int r = 0; r <= 3; ++r) {
    Fp8Scaling recipe(*be, Fp8Recipe{});
    PrecisionPolicy policy;
    policy.fp8_linear = policy.fp8_classifier = true;
    FullStore s(L);
    s.randomize(4, 0.1f);
    GPT m({d, policy}, L, *be, B, T, r, &recipe);
    Result out;
    out.stored = m.stored_bytes();
    for (int i = 0; i < passes; ++i) {
      const int* x = tok.data() + size_t(i) * B * T;
      out.losses.push_back(m.forward(s, x, tgt.data() + size_t(i) * B * T, true, 1.0f / (B * T)));
      m.backward(s);
      recipe.end_step({});
      if (i == 1) {
        out.losses.push_back(m.forward(s, tok.data(), tgt.data(), false, 0.0f));
        recipe.reset_amax();
      }
    }
    out.grads = s.g;
    out.state = recipe.state();
    EXPECT_TRUE(out.state.steps == passes);
    res.push_back(std::move(out));
  }
  EXPECT_TRUE(res[3].stored < res[2].stored) << "recompute 3 keeps the block inputs and one block's activations";
  for (int r = 1; r <= 3; ++r) {
    EXPECT_TRUE(res[r].losses == res[0].losses) << "recompute " << r << ": losses differ";
    EXPECT_TRUE(res[r].grads == res[0].grads) << "recompute " << r << ": gradients differ";
    EXPECT_TRUE(res[r].state.scale == res[0].state.scale) << "recompute " << r << ": FP8 scales differ";
    EXPECT_TRUE(res[r].state.amax_history == res[0].state.amax_history) << "recompute " << r << ": amax histories";
  }
  // the scales moved off their initial 1 (the passes exercised the delayed scaling)
  EXPECT_TRUE(std::count(res[0].state.scale.begin(), res[0].state.scale.end(), 1.0f) < long(res[0].state.scale.size()));
}

// What GPT allocates is what activation_bytes (the plan's memory prediction) says, for every level and
// precision; recompute 3 keeps the block inputs of all layers and one block's working set.
TEST(Model, activation_bytes_are_what_the_model_allocates) {
  auto be = make_cpu_backend(BackendOptions{});
  ModelConfig mc;
  mc.n_layer = 3, mc.n_head = 2, mc.n_embd = 32, mc.vocab_size = 61, mc.max_seq_len = 16;
  const ModelDims d = resolve_dims(mc);
  ParamLayout L(d);
  const int B = 2, T = 16;
  const size_t BT = size_t(B) * T, C = 32, NH = 2, nL = 3;
  for (bool fp8 : {false, true}) {
    std::vector<size_t> stored;
    for (int r = 0; r <= 3; ++r) {
      Fp8Scaling recipe(*be, Fp8Recipe{});
      PrecisionPolicy policy;
      policy.fp8_linear = policy.fp8_classifier = fp8;
      GPT m({d, policy}, L, *be, B, T, r, fp8 ? &recipe : nullptr);
      const ActivationBytes a = activation_bytes({d, policy}, B, T, r, DType::F32);
      EXPECT_TRUE(m.stored_bytes() == a.stored) << "recompute " << r << " fp8 " << fp8 << ": allocated "
                                                << m.stored_bytes() << ", predicted " << a.stored;
      EXPECT_TRUE(m.scratch_bytes() == a.scratch) << "recompute " << r << " fp8 " << fp8;
      stored.push_back(a.stored);
    }
    // level 2 -> 3: the other layers' qkv, atty, res2, fch (fp32), LayerNorm statistics and lse (and
    // atty_t's FP8 bytes) are no longer kept; FP8: nor any layer's weight transposes (12 C^2 bytes a layer),
    // made in one scratch of the largest weight (4 C^2) when the backward needs them
    const size_t per_layer = 4 * BT * (3 * C + C + C + 4 * C) + 4 * (4 * BT + NH * BT) + (fp8 ? BT * C : 0);
    const size_t transposes = fp8 ? nL * 12 * C * C - 4 * C * C : 0;
    EXPECT_TRUE(stored[2] - stored[3] == (nL - 1) * per_layer + transposes) << "fp8 " << fp8;
  }
}

TEST(Model, clip_scale_bounds_the_global_norm) {
  EXPECT_NEAR(clip_scale(4.0, 1.0f), 0.25, 1e-7);
  EXPECT_NEAR(clip_scale(0.5, 1.0f), 1.0, 0);
  EXPECT_NEAR(clip_scale(100.0, 0.0f), 1.0, 0);  // 0 = off
  // the clipped gradient's norm is the clip value
  std::vector<float> g = {3.0f, 4.0f};
  const float s = clip_scale(5.0, 2.0f);
  EXPECT_NEAR(std::hypot(g[0] * s, g[1] * s), 2.0, 1e-6);
}

TEST(Model, lr_schedule_values) {
  TrainingConfig t;
  t.lr = 1.0f;
  t.warmup_steps = 10;
  t.steps = 110;
  t.min_lr_frac = 0.1f;
  t.schedule = Schedule::cosine;
  EXPECT_NEAR(lr_at(t, 0), 0.1, 1e-9);           // warmup is linear from lr/warmup
  EXPECT_NEAR(lr_at(t, 4), 0.5, 1e-9);
  EXPECT_NEAR(lr_at(t, 9), 1.0, 1e-9);
  EXPECT_NEAR(lr_at(t, 10), 1.0, 1e-9);          // decay starts at the peak
  EXPECT_NEAR(lr_at(t, 109), 0.1, 1e-6);         // and ends at min_lr on the last step
  EXPECT_NEAR(lr_at(t, 10 + 99 / 2.0), 0.55, 1e-2);
  t.schedule = Schedule::linear;
  EXPECT_NEAR(lr_at(t, 109), 0.1, 1e-6);
  EXPECT_NEAR(lr_at(t, 10 + 33), 1.0 - 0.9 * 33.0 / 99.0, 1e-6);
  t.schedule = Schedule::constant;
  EXPECT_NEAR(lr_at(t, 80), 1.0, 0);
}

TEST(Model, config_errors_name_the_key_and_line) {
  EXPECT_THROW_WITH(config_from_yaml("training:\n  lr: 1e-3\n  bogus: 2\n", "x.yaml"), "training.bogus");
  EXPECT_THROW_WITH(config_from_yaml("training:\n  lr: 1e-3\n  bogus: 2\n", "x.yaml"), "line 3");
  EXPECT_THROW_WITH(config_from_yaml("nonsense:\n  a: 1\n", "x.yaml"), "unknown section 'nonsense'");
  EXPECT_THROW_WITH(config_from_yaml("training:\n  steps: many\n", "x.yaml"), "training.steps");
  EXPECT_THROW_WITH(config_from_yaml("training: [1, 2\n", "x.yaml"), "malformed YAML");
  Config c = config_from_yaml("model:\n  preset: d12\ntraining:\n  seq_len: 2048\ndata:\n  synthetic: true\n", "x");
  EXPECT_THROW_WITH(validate(c, 1), "max_seq_len");
  c = config_from_yaml("model:\n  preset: d12\n  n_layer: 3\ndata:\n  synthetic: true\n", "x");
  EXPECT_THROW_WITH(validate(c, 1), "model.preset");
  c = config_from_yaml("model:\n  preset: tiny\ntraining:\n  micro_batch: 4\n  seq_len: 64\n  total_batch_tokens: 1000\ndata:\n  synthetic: true\n", "x");
  EXPECT_THROW_WITH(validate(c, 2), "total_batch_tokens");
  // overrides use the same parser, and the printed config reads back to the same config
  c = config_from_yaml("model:\n  preset: tiny\ndata:\n  synthetic: true\n", "x");
  apply_override(c, parse_override("training.lr=0.25"));
  apply_override(c, parse_override("training.micro_batch=max"));
  EXPECT_NEAR(c.training.lr, 0.25, 0);
  EXPECT_TRUE(c.training.micro_batch.max);
  Config back = config_from_yaml(config_to_yaml(c), "printed");
  EXPECT_TRUE(config_to_yaml(back) == config_to_yaml(c));
  EXPECT_THROW_WITH(apply_override(c, parse_override("training.nope=1")), "training.nope");
}

TEST(Model, model_file_round_trip_and_checks) {
  const ModelDims d = small_dims();
  ParamLayout L(d);
  std::vector<float> w(L.total(), 0.0f);
  FullStore s(L);
  s.randomize(3, 0.5f);
  for (int b = 0; b < L.n_buckets(); ++b) std::copy(s.p[b].begin(), s.p[b].end(), w.begin() + L.logical_offset(b));
  char path[] = "/tmp/gpt_model_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  write_model_file(path, L, w, false);
  EXPECT_TRUE(read_model_file(path, L) == w);
  write_model_file(path, L, w, true);
  auto r = read_model_file(path, L);
  double max_rel = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] != 0) max_rel = std::max(max_rel, std::fabs(double(r[i] - w[i]) / w[i]));
  EXPECT_TRUE(max_rel <= 1.0 / 256) << "bf16 round trip relative error " + std::to_string(max_rel);  // 8 mantissa bits
  ModelConfig other;
  other.n_layer = 2;
  other.n_head = 2;
  other.n_embd = 32;
  other.vocab_size = 37;
  other.max_seq_len = 8;
  ParamLayout L2(resolve_dims(other));
  EXPECT_THROW_WITH(read_model_file(path, L2), "n_embd");
  std::remove(path);
  EXPECT_THROW_WITH(read_model_file("/nonexistent/model.bin", L), "cannot open");
}

TEST(Model, layout_counts_gpt2_parameters) {
  ModelConfig m;
  m.preset = "d12";
  ParamLayout L(resolve_dims(m));
  EXPECT_TRUE(L.n_params() == 124439808);  // GPT-2 124M without vocabulary padding
  size_t with_pad = 0;
  for (int b = 0; b < L.n_buckets(); ++b)
    for (auto& t : L.bucket(b).tensors) with_pad += t.numel;
  EXPECT_TRUE(with_pad == 124475904);      // the llm.c file layout's count (padded vocabulary)
  EXPECT_TRUE(L.n_buckets() == 14);
}

TEST(Model, parameter_table_is_the_layout) {
  ModelConfig m;
  m.preset = "d12";
  const ParamLayout L(resolve_dims(m));
  // every table row placed once per bucket of its scope, decayed matrices first, llm.c ranks a permutation
  std::vector<int> ranks;
  for (const ParamSpec& s : param_table()) ranks.push_back(s.llmc_rank);
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) EXPECT_TRUE(ranks[i] == int(i));
  const Bucket& layer = L.bucket(L.layer_bucket(3));
  EXPECT_TRUE(layer.tensors.front().name == std::string("qkvw") && layer.decayed == layer.tensor("ln1w").offset);
  EXPECT_TRUE(L.placed().size() == 2 + 12 * 12 + 2);
  EXPECT_TRUE(hf_name(*layer.tensor("fcw").spec, 3) == "transformer.h.3.mlp.c_fc.weight");
  EXPECT_TRUE(L.bucket(0).tensor("wte").real_numel == size_t(50257) * 768);
  EXPECT_NEAR(flops_per_token(L, 1024), 6.0 * 124439808 + 6.0 * 12 * 768 * 1024, 0);
}

TEST(Model, enum_keys_take_their_names_only) {
  Config c = config_from_yaml("training:\n  precision: fp8\n  schedule: linear\ncheckpoint:\n  resume: auto\n", "x");
  EXPECT_TRUE(c.training.precision == Precision::fp8 && c.training.schedule == Schedule::linear);
  EXPECT_TRUE(c.checkpoint.resume == ResumeMode::automatic);
  EXPECT_THROW_WITH(config_from_yaml("training:\n  precision: fp16\n", "x"),
                    "training.precision (line 2): 'fp16' is not one of bf16, fp32, fp8");
  EXPECT_THROW_WITH(config_from_yaml("checkpoint:\n  on_error: [stop]\n", "x"), "expected one of stop, continue");
  apply_override(c, {"checkpoint.on_error", "continue"});
  EXPECT_TRUE(c.checkpoint.on_error == OnError::go_on);
  // printed back as the names they were read from
  const std::string y = config_to_yaml(c);
  EXPECT_NE(y.find("precision: \"fp8\""), std::string::npos);
  EXPECT_NE(y.find("on_error: \"continue\""), std::string::npos);
  EXPECT_NE(y.find("fp8_grad_format: \"e5m2\""), std::string::npos);
}

TEST(Model, plan_refuses_fp8_on_a_gpu_without_fp8_cores) {
  Config c;
  c.model.preset = "tiny";
  c.data.synthetic = true;
  c.training.precision = Precision::fp8;
  c.training.seq_len = 64;
  Plan p;
  p.caps = DeviceCaps{"NVIDIA A100-SXM4-80GB", size_t(80) << 30, 80, false, false};
  EXPECT_THROW_WITH(check_capabilities(c, p), "training.precision: fp8 needs FP8 tensor cores");
  EXPECT_THROW_WITH(check_capabilities(c, p), "NVIDIA A100-SXM4-80GB is 8.0");
  p.caps = DeviceCaps{"NVIDIA H200", size_t(141) << 30, 90, true, false};
  check_capabilities(c, p);  // accepted
  p.caps = DeviceCaps{};     // planned for a GPU that is not here: a note, not an error
  check_capabilities(c, p);
  EXPECT_TRUE(p.device_note.find("not checked") != std::string::npos);
  c.training.precision = Precision::bf16;
  p.caps = DeviceCaps{"NVIDIA A100-SXM4-80GB", size_t(80) << 30, 80, false, false};
  p.device_note.clear();
  check_capabilities(c, p);
  EXPECT_TRUE(p.device_note.empty());
}


// A layer or product set's canonical text reads back as the same set, and two spellings of one set have
// one text (what a checkpoint records and a resume compares).
TEST(Model, layer_and_product_sets_have_one_canonical_text) {
  std::mt19937 rng(7);
  for (int n = 1; n <= 9; ++n)
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<bool> set(static_cast<size_t>(n));
      for (size_t l = 0; l < set.size(); ++l) set[l] = rng() & 1u;
      const std::string text = layer_set_text(set);
      EXPECT_EQ(parse_layer_set(text, n, "k"), set) << text;
    }
  EXPECT_EQ(layer_set_text(parse_layer_set("3,1-2,5", 6, "k")), "1-3,5");
  EXPECT_EQ(layer_set_text(parse_layer_set("0-5", 6, "k")), "all");
  EXPECT_EQ(layer_set_text(parse_layer_set("none", 6, "k")), "none");
  for (unsigned s = 1; s <= kAllBlockProducts; ++s) EXPECT_EQ(parse_product_set(product_set_text(s), "k"), s);
  EXPECT_EQ(product_set_text(parse_product_set("fcproj,qkv,fc", "k")), "qkv,fc,fcproj");
  EXPECT_EQ(product_set_text(parse_product_set("fc,attproj,fcproj,qkv", "k")), "all");
}
