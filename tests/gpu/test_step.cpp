// One whole training step of a small GPT-2 on the CUDA backend against the CPU backend from identical
// initial weights: the loss and every parameter tensor's gradient, in bf16 and fp32 precision.
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

using tests::round_bf16;

// Whole-bucket parameters and gradients in one backend's memory.
struct Store : ParamStore {
  Backend& be;
  const ParamLayout& L;
  std::vector<void*> p, g;
  Store(Backend& b, const ParamLayout& layout, const std::vector<std::vector<float>>& init) : be(b), L(layout) {
    for (int k = 0; k < L.n_buckets(); ++k) {
      const size_t n = L.bucket(k).size, e = dtype_size(be.act_dtype());
      p.push_back(be.alloc(e * n));
      g.push_back(be.alloc(e * n));
      be.zero(g.back(), e * n);
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
  std::vector<float> grad(int b) {
    const size_t n = L.bucket(b).size;
    float* tmp = static_cast<float*>(be.alloc(4 * n));
    be.act_to_f32(tmp, g[b], n);
    std::vector<float> out(n);
    be.copy_d2h(out.data(), tmp, 4 * n);
    be.free(tmp);
    return out;
  }
};

// Relative L2 error of each tensor's gradient. bf16: activations and gradients are rounded to 8
// significant bits at every op, through 2 layers and a 50k-way softmax: a few 1e-2 at most. fp32:
// TF32 matmuls (10-bit operands) and bf16 attention inputs (cuDNN has no fp32 flash attention): 1e-2.
constexpr double kTolBf16Grad = 4e-2, kTolF32Grad = 1.5e-2;
constexpr double kTolBf16Loss = 5e-3, kTolF32Loss = 1e-3;  // relative, on a loss near ln(50257)

void one_step(const std::string& precision) {
  BackendOptions opt;
  opt.act = precision == "bf16" ? DType::BF16 : DType::F32;
  auto cpu = make_cpu_backend(BackendOptions{});
  auto gpu = make_cuda_backend(opt);
  const bool bf16 = gpu->act_dtype() == DType::BF16;
  ModelConfig mc;
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 256;
  mc.max_seq_len = 128;
  const ModelDims d = resolve_dims(mc);  // GPT-2 vocabulary: the real classifier size
  ParamLayout L(d);
  const int B = 4, T = 96;
  std::mt19937_64 rng(7);
  // both sides start from identical values
  const auto init = tests::initial_params(L, rng, bf16 ? round_bf16 : nullptr);
  const auto tok = tests::random_tokens(size_t(B) * T, d.vocab_size, rng);
  const auto tgt = tests::random_tokens(size_t(B) * T, d.vocab_size, rng);
  Store cs(*cpu, L, init), gs(*gpu, L, init);
  GPT cm(d, L, *cpu, B, T, 0), gm(d, L, *gpu, B, T, 2);  // the GPU side recomputes: same maths
  const float dloss = 1.0f / (B * T);
  const double cl = cm.forward(cs, tok.data(), tgt.data(), true, dloss);
  cm.backward(cs);
  const double gl = gm.forward(gs, tok.data(), tgt.data(), true, dloss);
  gm.backward(gs);
  gpu->synchronize();
  const double ltol = bf16 ? kTolBf16Loss : kTolF32Loss;
  std::printf("  [%s] loss cpu %.6f cuda %.6f\n", precision.c_str(), cl, gl);
  EXPECT_TRUE(std::fabs(cl - gl) <= ltol * std::fabs(cl)) << precision + ": loss differs: cpu " + std::to_string(cl) +
                                                            " cuda " + std::to_string(gl);
  const double gtol = bf16 ? kTolBf16Grad : kTolF32Grad;
  for (int k = 0; k < L.n_buckets(); ++k) {
    auto a = cs.grad(k), b = gs.grad(k);
    for (auto& t : L.bucket(k).tensors) {
      double e2 = 0, r2 = 0;
      for (size_t i = 0; i < t.numel; ++i) {
        const double x = a[t.offset + i], y = b[t.offset + i];
        if (!std::isfinite(y)) e2 = INFINITY;
        e2 += (x - y) * (x - y);
        r2 += x * x;
      }
      const double rel = std::sqrt(e2 / std::max(r2, 1e-30));
      std::printf("  [%s] bucket %2d %-9s rel_l2 %.2e\n", precision.c_str(), k, t.name, rel);
      EXPECT_TRUE(rel <= gtol) << precision + " bucket " + std::to_string(k) + " " + t.name + " gradient rel_l2 " +
                                 std::to_string(rel) + " > " + std::to_string(gtol);
    }
  }
}

}  // namespace

TEST(GpuStep, whole_step_bf16_matches_cpu) { one_step("bf16"); }
TEST(GpuStep, whole_step_fp32_matches_cpu) { one_step("fp32"); }

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new gpt::tests::NeedsGpu);
  return RUN_ALL_TESTS();
}
