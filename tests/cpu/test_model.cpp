// CPU reference tests: whole-model gradients against finite differences, gradient accumulation,
// clipping, the LR schedule, AdamW, the config parser and llm.c model files.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <unistd.h>

#include "backend/backend.hpp"
#include "check.hpp"
#include "config/config.hpp"
#include "config/config_io.hpp"
#include "model/gpt.hpp"
#include "io/modelfile.hpp"
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
          if (t.id == P::ln1w || t.id == P::ln2w || t.id == P::lnfw) v += 1.0f;
          p[b][t.offset + i] = v;
        }
    // padded vocabulary rows are zero, as in training
    const ModelDims& d = L.dims();
    auto& wte = L.bucket(0).tensor(P::wte);
    std::fill(p[0].begin() + wte.offset + size_t(d.vocab_size) * d.n_embd, p[0].begin() + wte.offset + wte.numel, 0.0f);
  }
};

ModelDims small_dims() {
  ModelConfig m;
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

TEST(gradients_match_finite_differences) {
  auto be = make_cpu_backend(BackendOptions{});
  const ModelDims d = small_dims();
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
        if (t.id == P::wte && i >= size_t(d.vocab_size) * d.n_embd) continue;
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
        CHECK_MSG(std::fabs(fd - g) <= 2e-4 + 0.02 * std::fabs(g),
                  std::string(t.name) + "[" + std::to_string(i) + "] (bucket " + std::to_string(b) +
                      "): analytic " + std::to_string(g) + ", finite difference " + std::to_string(fd));
      }
    }
  CHECK(checked > 40);
  CHECK_MSG(std::sqrt(err2 / ref2) < 1e-2, "relative gradient error " + std::to_string(std::sqrt(err2 / ref2)));
}

TEST(accumulated_micro_batches_equal_one_large_batch) {
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
        CHECK_MSG(false, "bucket " + std::to_string(bk) + " element " + std::to_string(i) + ": " + std::to_string(a) +
                             " vs " + std::to_string(c));
        return;
      }
    }
  std::printf("  max relative difference %.3g\n", max_rel);
}

TEST(recompute_levels_give_identical_gradients) {
  auto be = make_cpu_backend(BackendOptions{});
  const ModelDims d = small_dims();
  ParamLayout L(d);
  const int B = 2, T = 7;
  auto tok = random_tokens(B * T, d.vocab_size, 11), tgt = random_tokens(B * T, d.vocab_size, 12);
  std::vector<std::vector<std::vector<float>>> grads;
  for (int r = 0; r <= 2; ++r) {
    FullStore s(L);
    s.randomize(4, 0.1f);
    GPT m(d, L, *be, B, T, r);
    m.forward(s, tok.data(), tgt.data(), true, 1.0f / (B * T));
    m.backward(s);
    grads.push_back(s.g);
  }
  CHECK(grads[0] == grads[1]);
  CHECK(grads[0] == grads[2]);
}

TEST(clip_scale_bounds_the_global_norm) {
  CHECK_NEAR(clip_scale(4.0, 1.0f), 0.25, 1e-7);
  CHECK_NEAR(clip_scale(0.5, 1.0f), 1.0, 0);
  CHECK_NEAR(clip_scale(100.0, 0.0f), 1.0, 0);  // 0 = off
  // the clipped gradient's norm is the clip value
  std::vector<float> g = {3.0f, 4.0f};
  const float s = clip_scale(5.0, 2.0f);
  CHECK_NEAR(std::hypot(g[0] * s, g[1] * s), 2.0, 1e-6);
}

TEST(adamw_applies_grad_scale_bias_correction_and_decay) {
  auto be = make_cpu_backend(BackendOptions{});
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, -0.25f}, m = {0, 0}, v = {0, 0};
  AdamWArgs a;
  a.param = p.data();
  a.grad = g.data();
  a.m = m.data();
  a.v = v.data();
  a.n = 2;
  a.lr = 0.1f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.weight_decay = 0.5f;
  a.grad_scale = 0.5f;
  a.step = 1;
  be->adamw(a);
  // m = (1-b1) * s * g; v = (1-b2) * (s g)^2; bias-corrected step is sign(g); decay uses the old p
  CHECK_NEAR(m[0], 0.1 * 0.25, 1e-7);
  CHECK_NEAR(v[1], 0.05 * 0.125 * 0.125, 1e-9);
  CHECK_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-5);
  CHECK_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.5 * -2.0), 1e-5);
}

TEST(lr_schedule_values) {
  TrainingConfig t;
  t.lr = 1.0f;
  t.warmup_steps = 10;
  t.steps = 110;
  t.min_lr_frac = 0.1f;
  t.schedule = "cosine";
  CHECK_NEAR(lr_at(t, 0), 0.1, 1e-9);           // warmup is linear from lr/warmup
  CHECK_NEAR(lr_at(t, 4), 0.5, 1e-9);
  CHECK_NEAR(lr_at(t, 9), 1.0, 1e-9);
  CHECK_NEAR(lr_at(t, 10), 1.0, 1e-9);          // decay starts at the peak
  CHECK_NEAR(lr_at(t, 109), 0.1, 1e-6);         // and ends at min_lr on the last step
  CHECK_NEAR(lr_at(t, 10 + 99 / 2.0), 0.55, 1e-2);
  t.schedule = "linear";
  CHECK_NEAR(lr_at(t, 109), 0.1, 1e-6);
  CHECK_NEAR(lr_at(t, 10 + 33), 1.0 - 0.9 * 33.0 / 99.0, 1e-6);
  t.schedule = "constant";
  CHECK_NEAR(lr_at(t, 80), 1.0, 0);
}

TEST(config_errors_name_the_key_and_line) {
  CHECK_THROWS_WITH(config_from_yaml("training:\n  lr: 1e-3\n  bogus: 2\n", "x.yaml"), "training.bogus");
  CHECK_THROWS_WITH(config_from_yaml("training:\n  lr: 1e-3\n  bogus: 2\n", "x.yaml"), "line 3");
  CHECK_THROWS_WITH(config_from_yaml("nonsense:\n  a: 1\n", "x.yaml"), "unknown section 'nonsense'");
  CHECK_THROWS_WITH(config_from_yaml("training:\n  steps: many\n", "x.yaml"), "training.steps");
  CHECK_THROWS_WITH(config_from_yaml("training: [1, 2\n", "x.yaml"), "malformed YAML");
  Config c = config_from_yaml("model:\n  preset: d12\ntraining:\n  seq_len: 2048\ndata:\n  synthetic: true\n", "x");
  CHECK_THROWS_WITH(validate(c, 1), "max_seq_len");
  c = config_from_yaml("model:\n  preset: d12\n  n_layer: 3\ndata:\n  synthetic: true\n", "x");
  CHECK_THROWS_WITH(validate(c, 1), "model.preset");
  c = config_from_yaml("model:\n  preset: tiny\ntraining:\n  micro_batch: 4\n  seq_len: 64\n  total_batch_tokens: 1000\ndata:\n  synthetic: true\n", "x");
  CHECK_THROWS_WITH(validate(c, 2), "total_batch_tokens");
  // overrides use the same parser, and the printed config reads back to the same config
  c = config_from_yaml("model:\n  preset: tiny\ndata:\n  synthetic: true\n", "x");
  apply_override(c, parse_override("training.lr=0.25"));
  apply_override(c, parse_override("training.micro_batch=max"));
  CHECK_NEAR(c.training.lr, 0.25, 0);
  CHECK(c.training.micro_batch.max);
  Config back = config_from_yaml(config_to_yaml(c), "printed");
  CHECK(config_to_yaml(back) == config_to_yaml(c));
  CHECK_THROWS_WITH(apply_override(c, parse_override("training.nope=1")), "training.nope");
}

TEST(model_file_round_trip_and_checks) {
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
  CHECK(read_model_file(path, L) == w);
  write_model_file(path, L, w, true);
  auto r = read_model_file(path, L);
  double max_rel = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] != 0) max_rel = std::max(max_rel, std::fabs(double(r[i] - w[i]) / w[i]));
  CHECK_MSG(max_rel <= 1.0 / 256, "bf16 round trip relative error " + std::to_string(max_rel));  // 8 mantissa bits
  ModelConfig other;
  other.n_layer = 2;
  other.n_head = 2;
  other.n_embd = 32;
  other.vocab_size = 37;
  other.max_seq_len = 8;
  ParamLayout L2(resolve_dims(other));
  CHECK_THROWS_WITH(read_model_file(path, L2), "n_embd");
  std::remove(path);
  CHECK_THROWS_WITH(read_model_file("/nonexistent/model.bin", L), "cannot open");
}

TEST(layout_counts_gpt2_parameters) {
  ModelConfig m;
  m.preset = "d12";
  ParamLayout L(resolve_dims(m));
  CHECK(L.n_params() == 124439808);  // GPT-2 124M without vocabulary padding
  size_t with_pad = 0;
  for (int b = 0; b < L.n_buckets(); ++b)
    for (auto& t : L.bucket(b).tensors) with_pad += t.numel;
  CHECK(with_pad == 124475904);      // the llm.c file layout's count (padded vocabulary)
  CHECK(L.n_buckets() == 14);
}

int main(int argc, char** argv) { return check::run_all(argc > 1 ? argv[1] : nullptr); }
