// training.offload: the optimizer's update on the host (Optimizer::update_host, optim::step_host) against
// the CUDA kernel (Optimizer::update) on the same bytes, two steps: every parameter, master or residual,
// slot and int8 scale must be the kernel's, bit for bit, for every rule, state type, master kind and
// precision, on the kernel's vector path (aligned pointers) and its one-element path (unaligned ones, and
// the tail of an aligned range).
// Without a CUDA device every test is skipped (GoogleTest reports them SKIPPED).
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "optim/optimizer.hpp"
#include "optim/step.hpp"
#include "test_util.hpp"

using namespace gpt;

namespace {

enum class Master { None, F32, Compensated };
const char* master_name(Master m) { return m == Master::None ? "none" : m == Master::F32 ? "fp32" : "compensated"; }

// One buffer as bytes on the host and on the device (the device's at element `shift` of its allocation).
struct Twin {
  Backend& gpu;
  std::vector<char> host;
  char* base = nullptr;
  char* dev = nullptr;
  size_t bytes = 0;
  Twin(Backend& g, size_t nbytes, size_t shift_bytes) : gpu(g), host(nbytes), bytes(nbytes) {
    base = static_cast<char*>(gpu.alloc(nbytes + shift_bytes));
    dev = base + shift_bytes;
  }
  ~Twin() { gpu.free(base); }
  void up() { gpu.copy_h2d(dev, host.data(), bytes); }
  size_t differ() const {  // bytes of the device's that are not the host's
    std::vector<char> d(bytes);
    gpu.copy_d2h(d.data(), dev, bytes);
    size_t n = 0;
    for (size_t i = 0; i < bytes; ++i) n += d[i] != host[i];
    return n;
  }
};

uint16_t bf16_bits(float x) { return optim::bf16_bits_rn(optim::f32_bits(x)); }

// Two steps of `rule` with state t on n elements, on the device and on the host; the bytes that differ.
size_t compare(Backend& gpu, const char* rule, optim::StateType t, Master mk, size_t n, bool aligned, std::string& what) {
  const bool bf16 = gpu.act_dtype() == DType::BF16;
  auto opt = make_optimizer(rule, true, t);
  const size_t K = opt->slots().size(), e = dtype_size(gpu.act_dtype());
  const size_t shift = aligned ? 0 : 1;  // elements: the kernel's one-element path throughout
  std::mt19937_64 rng(20261206);
  std::uniform_real_distribution<float> d(-1, 1);
  Twin param(gpu, e * n, e * shift), grad(gpu, e * n, e * shift);
  Twin master(gpu, mk == Master::F32 ? 4 * n : 4, 4 * shift), residual(gpu, mk == Master::Compensated ? 2 * n : 2, 2 * shift);
  std::vector<std::unique_ptr<Twin>> slot, scale;
  const size_t nb = optim::quant_blocks(n);
  for (size_t k = 0; k < K; ++k) {
    slot.push_back(std::make_unique<Twin>(gpu, std::max<size_t>(optim::state_type_size(t) * n, 4), 4 * shift));
    scale.push_back(std::make_unique<Twin>(gpu, 4 * nb, 0));
  }
  for (size_t i = 0; i < n; ++i) {
    const float w = d(rng) * (i % 7 == 0 ? 1e-3f : 1.0f);
    if (mk == Master::F32) std::memcpy(master.host.data() + 4 * i, &w, 4);
    if (mk == Master::Compensated) {
      const optim::Compensated c = optim::compensated_split(w);
      std::memcpy(param.host.data() + 2 * i, &c.hi, 2);
      std::memcpy(residual.host.data() + 2 * i, &c.lo, 2);
    } else if (bf16) {
      const uint16_t h = bf16_bits(w);
      std::memcpy(param.host.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(param.host.data() + 4 * i, &w, 4);
    }
  }
  // the state starts at zero (all bytes zero is zero in every state type), as a run's does
  param.up(), master.up(), residual.up();
  for (size_t k = 0; k < K; ++k) slot[k]->up(), scale[k]->up();
  OptimizerHyper h;
  h.lr = 1e-2f, h.weight_decay = 0.1f, h.grad_scale = 0.7f, h.seed = 4321;
  unsigned bad = 0;
  for (int st = 1; st <= 2; ++st) {
    h.step = st, h.seed += uint64_t(st);
    for (size_t i = 0; i < n; ++i) {
      const float g = d(rng) * 0.1f * (i % 5 == 0 ? 1e-4f : 1.0f);
      if (bf16) {
        const uint16_t b = bf16_bits(g);
        std::memcpy(grad.host.data() + 2 * i, &b, 2);
      } else {
        std::memcpy(grad.host.data() + 4 * i, &g, 4);
      }
    }
    grad.up();
    ParamRange r;
    r.n = n, r.decay = true, r.n_decay = t == optim::StateType::F32 ? 0 : n / 3;
    r.index_offset = 12345 * 256;
    r.nonfinite = nullptr;
    // device
    r.param = param.dev, r.grad = grad.dev;
    r.master = mk == Master::F32 ? reinterpret_cast<float*>(master.dev) : nullptr;
    r.residual = mk == Master::Compensated ? reinterpret_cast<uint16_t*>(residual.dev) : nullptr;
    for (size_t k = 0; k < K; ++k) r.slot[k] = slot[k]->dev, r.scale[k] = reinterpret_cast<float*>(scale[k]->dev);
    r.device_aligned = optim::step_aligned({{r.param, e}, {r.grad, e}, {r.master, 4}, {r.residual, 2}, {r.slot[0], 4},
                                            {r.slot[1], 4}});
    if (r.device_aligned != aligned) {
      what = "the test's alignment is not the kernel's";
      return 1;
    }
    opt->update(gpu, r, h);
    // host
    ParamRange q = r;
    q.param = param.host.data(), q.grad = grad.host.data();
    q.master = r.master ? reinterpret_cast<float*>(master.host.data()) : nullptr;
    q.residual = r.residual ? reinterpret_cast<uint16_t*>(residual.host.data()) : nullptr;
    for (size_t k = 0; k < K; ++k) q.slot[k] = slot[k]->host.data(), q.scale[k] = reinterpret_cast<float*>(scale[k]->host.data());
    q.nonfinite = &bad;
    opt->update_host(gpu, q, h);
    gpu.synchronize();
  }
  size_t differ = param.differ();
  what = "param " + std::to_string(differ);
  if (mk == Master::F32) differ += master.differ(), what += " master " + std::to_string(master.differ());
  if (mk == Master::Compensated) differ += residual.differ(), what += " residual " + std::to_string(residual.differ());
  for (size_t k = 0; k < K; ++k) {
    const size_t ds = slot[k]->differ(), dc = t == optim::StateType::Int8 ? scale[k]->differ() : 0;
    differ += ds + dc;
    what += " " + opt->slots()[k] + " " + std::to_string(ds) + (t == optim::StateType::Int8 ? "+" + std::to_string(dc) : "");
  }
  if (bad) what += " (non-finite!)", ++differ;
  return differ;
}

void run_all(DType act) {
  BackendOptions o;
  o.act = act;
  auto gpu = make_cuda_backend(o);
  const bool bf16 = act == DType::BF16;
  for (const OptimizerInfo& info : optimizers())  // every rule there is (optim/rules.hpp)
    for (optim::StateType t : {optim::StateType::F32, optim::StateType::BF16, optim::StateType::Int8})
      for (Master mk : {Master::None, Master::F32, Master::Compensated}) {
        if (!bf16 && mk != Master::None) continue;  // fp32 parameters have no master
        for (bool aligned : {true, false}) {
          const char* rule = info.name.c_str();
          const size_t n = 100003;  // not a multiple of 8 nor of 256: the vector path's tail, a partial block
          std::string what;
          const size_t differ = compare(*gpu, rule, t, mk, n, aligned, what);
          std::printf("%-4s %s %s %s state, master %s, %s: bytes differing: %s\n", differ ? "FAIL" : "ok",
                      dtype_name(act), rule, optim::state_type_name(t), master_name(mk),
                      aligned ? "aligned" : "unaligned", what.c_str());
          EXPECT_EQ(differ, 0u) << rule << " " << optim::state_type_name(t) << " master " << master_name(mk)
                                << (aligned ? " aligned: " : " unaligned: ") << what;
        }
      }
}

TEST(Offload, host_update_is_the_kernels_bf16) { run_all(DType::BF16); }
TEST(Offload, host_update_is_the_kernels_fp32) { run_all(DType::F32); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new gpt::tests::NeedsGpu);
  return RUN_ALL_TESTS();
}
