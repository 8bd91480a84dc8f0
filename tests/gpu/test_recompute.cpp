// training.recompute on the CUDA backend with training.deterministic: full-block recompute (3) gives
// bit-identical losses, gradients and FP8 scaling state to recompute 0, in bf16 and in FP8 (block products
// and classifier), over training passes with the FP8 scales updated between them and an evaluation pass in
// between, and so do levels 1 and 2 in FP8 (GELU applied in fcproj's input cast at every level). In bf16,
// levels 1 and 2 apply GELU to fc's stored bf16 output where the forward's cuBLASLt epilogue applied it to
// the fp32 sums: their gradients differ from level 0's by that rounding (same losses, close gradients),
// while level 3 reruns fc with its epilogue. Each level allocates what activation_bytes predicts.
// Without a CUDA device every test is skipped (GoogleTest reports them SKIPPED).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "test_util.hpp"
#include "gpt_init.hpp"
#include "config/config.hpp"
#include "model/gpt.hpp"

using namespace gpt;

namespace {

// Whole-bucket bf16 parameters and gradients in the GPU's memory.
struct Store : ParamStore {
  Backend& be;
  const ParamLayout& L;
  std::vector<void*> p, g;
  Store(Backend& b, const ParamLayout& layout, const std::vector<std::vector<float>>& init) : be(b), L(layout) {
    for (int k = 0; k < L.n_buckets(); ++k) {
      const size_t n = L.bucket(k).size;
      p.push_back(be.alloc(2 * n));
      g.push_back(be.alloc(2 * n));
      be.zero(g.back(), 2 * n);
      float* tmp = static_cast<float*>(be.alloc(4 * n));
      be.copy_h2d(tmp, init[k].data(), 4 * n);
      be.f32_to_act(p.back(), tmp, n);
      be.synchronize();
      be.free(tmp);
    }
  }
  ~Store() override {
    for (void* x : p) be.free(x);
    for (void* x : g) be.free(x);
  }
  const void* params(int b) override { return p[b]; }
  void* grads(int b) override { return g[b]; }
  // every bucket's gradient bytes, as they are
  std::vector<std::vector<uint8_t>> grad_bytes() {
    std::vector<std::vector<uint8_t>> out;
    for (int k = 0; k < L.n_buckets(); ++k) {
      out.emplace_back(2 * L.bucket(k).size);
      be.copy_d2h(out.back().data(), g[k], out.back().size());
    }
    return out;
  }
};

struct Result {
  std::vector<float> losses;
  std::vector<std::vector<uint8_t>> grads;
  Fp8Scaling::State state;
};

void levels_are_bit_identical(bool fp8) {
  BackendOptions opt;
  opt.act = DType::BF16;
  opt.deterministic = true;
  auto gpu = make_cuda_backend(opt);
  ModelConfig mc;
  mc.n_layer = 3, mc.n_head = 4, mc.n_embd = 256, mc.max_seq_len = 128;
  const ModelDims d = resolve_dims(mc);  // GPT-2 vocabulary: the real classifier size
  ParamLayout L(d);
  const int B = 4, T = 96, passes = 4;
  std::mt19937_64 rng(17);
  const auto init = tests::initial_params(L, rng, tests::round_bf16);
  const auto tok = tests::random_tokens(size_t(passes) * B * T, d.vocab_size, rng);
  const auto tgt = tests::random_tokens(size_t(passes) * B * T, d.vocab_size, rng);
  PrecisionPolicy policy;
  policy.fp8_linear = policy.fp8_classifier = fp8;
  std::vector<Result> res;
  for (int r = 0; r <= 3; ++r) {
    Fp8Scaling recipe(*gpu, Fp8Recipe{});
    Store s(*gpu, L, init);
    GPT m({d, policy}, L, *gpu, B, T, r, fp8 ? &recipe : nullptr);
    const ActivationBytes a = activation_bytes({d, policy}, B, T, r, DType::BF16);
    EXPECT_TRUE(m.stored_bytes() == a.stored && m.scratch_bytes() == a.scratch)
        << "recompute " << r << ": allocated " << m.stored_bytes() << " + " << m.scratch_bytes() << ", predicted "
        << a.stored << " + " << a.scratch;
    Result out;
    for (int i = 0; i < passes; ++i) {
      const size_t at = size_t(i) * B * T;
      out.losses.push_back(m.forward(s, tok.data() + at, tgt.data() + at, true, 1.0f / (B * T)));
      m.backward(s);
      if (fp8) recipe.end_step({});
      if (i == 1) {
        out.losses.push_back(m.forward(s, tok.data(), tgt.data(), false, 0.0f));
        if (fp8) recipe.reset_amax();
      }
    }
    gpu->synchronize();
    out.grads = s.grad_bytes();
    if (fp8) out.state = recipe.state();
    std::printf("  [%s] recompute %d: last loss %.6f, activations %zu B\n", fp8 ? "fp8" : "bf16", r,
                out.losses.back(), m.stored_bytes());
    res.push_back(std::move(out));
  }
  for (int r = 1; r <= 3; ++r) {
    const std::string what = std::string(fp8 ? "fp8" : "bf16") + ", recompute " + std::to_string(r) + " vs 0: ";
    EXPECT_TRUE(res[r].losses == res[0].losses) << what << "losses differ";
    const bool exact = fp8 || r == 3;
    for (size_t k = 0; k < res[0].grads.size(); ++k) {
      if (exact) {
        EXPECT_TRUE(res[r].grads[k] == res[0].grads[k]) << what << "bucket " << k << "'s gradients differ";
        continue;
      }
      // bf16 values (the upper half of an fp32): the relative L2 difference of the bucket's gradient
      double d2 = 0, r2 = 0;
      for (size_t i = 0; i + 1 < res[0].grads[k].size(); i += 2) {
        auto value = [&](const std::vector<uint8_t>& b) {
          const uint32_t bits = uint32_t(b[i] | (b[i + 1] << 8)) << 16;
          float f;
          std::memcpy(&f, &bits, 4);
          return double(f);
        };
        const double a = value(res[r].grads[k]), z = value(res[0].grads[k]);
        d2 += (a - z) * (a - z), r2 += z * z;
      }
      const double rel = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
      std::printf("  [bf16] recompute %d vs 0: bucket %zu's gradient rel_l2 %.2e\n", r, k, rel);
      EXPECT_LT(rel, 2e-2) << what << "bucket " << k << "'s gradients differ by more than bf16 rounding";
    }
    EXPECT_TRUE(res[r].state.scale == res[0].state.scale) << what << "FP8 scales differ";
    EXPECT_TRUE(res[r].state.amax_history == res[0].state.amax_history) << what << "amax histories differ";
  }
}

}  // namespace

TEST(GpuRecompute, full_block_recompute_is_bit_identical_in_bf16) { levels_are_bit_identical(false); }
TEST(GpuRecompute, levels_are_bit_identical_in_fp8) { levels_are_bit_identical(true); }

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new gpt::tests::NeedsGpu);
  return RUN_ALL_TESTS();
}
