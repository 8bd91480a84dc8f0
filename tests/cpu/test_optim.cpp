// The optimizers (optim/optimizer.hpp) on the CPU backend: each rule's update by hand for one step, the
// state slots they declare, and a dump of several steps that tests/python/test_optimizers.py checks
// against NumPy implementations written from the papers.
//   test_optim [filter]          the unit tests
//   test_optim --dump DIR        writes DIR/<optimizer>.f32: the inputs and every step's outputs
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "test_util.hpp"
#include "optim/optimizer.hpp"

using namespace gpt;

namespace {

struct Case {
  std::vector<float> p, g;
  std::vector<std::vector<float>> slots;
  unsigned nonfinite = 0;
};

// One update of every element of c by optimizer `name` (CPU backend: host memory).
void step(const Optimizer& opt, Case& c, const OptimizerHyper& h, bool decay) {
  auto be = make_cpu_backend(BackendOptions{});
  ParamRange r;
  r.param = c.p.data();
  r.grad = c.g.data();
  r.n = c.p.size();
  r.decay = decay;
  r.nonfinite = &c.nonfinite;
  for (size_t k = 0; k < c.slots.size(); ++k) r.slot[k] = c.slots[k].data();
  opt.update(*be, r, h);
}

Case make_case(const Optimizer& opt, std::vector<float> p, std::vector<float> g) {
  Case c{std::move(p), std::move(g), {}};
  for (size_t k = 0; k < opt.slots().size(); ++k) c.slots.emplace_back(c.p.size(), 0.0f);
  return c;
}

int dump(const std::string& dir) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t n = 1000;
  for (const OptimizerInfo& info : optimizers()) {
    // every rule's declared defaults, but Lion's beta2 at the paper's 0.99; written beside the dump
    const HyperValues hypers = info.name == "lion" ? HyperValues{{"beta2", 0.99f}} : HyperValues{};
    auto opt = make_optimizer(info.name, false, optim::StateType::F32, hypers);
    std::vector<float> p0(n);
    for (float& x : p0) x = nd(rng);
    Case c = make_case(*opt, p0, std::vector<float>(n));
    std::vector<float> out(p0);  // p0, then per step: g, p, slots...
    OptimizerHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f, h.grad_scale = 0.5f;
    for (int s = 1; s <= 5; ++s) {
      for (float& x : c.g) x = nd(rng);
      c.g[7] = 0.0f;  // a zero gradient (Lion's sign of 0)
      h.step = s;
      out.insert(out.end(), c.g.begin(), c.g.end());
      step(*opt, c, h, s % 2 == 1);  // decay on odd steps only
      out.insert(out.end(), c.p.begin(), c.p.end());
      for (auto& sl : c.slots) out.insert(out.end(), sl.begin(), sl.end());
    }
    const std::string path = dir + "/" + info.name + ".f32";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(out.data(), 4, out.size(), f) != out.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    // the rule's hyperparameters as bound: one "name value" line each
    FILE* hf = std::fopen((dir + "/" + info.name + ".hypers").c_str(), "w");
    for (const std::string& name : info.hypers) {
      auto it = hypers.find(name);
      std::fprintf(hf, "%s %.9g\n", name.c_str(), it != hypers.end() ? it->second : default_hypers().at(name));
    }
    std::fclose(hf);
    std::printf("%s: %zu elements, 5 steps, %zu slot(s)\n", path.c_str(), n, info.slots.size());
  }
  return 0;
}

}  // namespace

TEST(Optim, optimizers_declare_their_state_slots) {
  EXPECT_TRUE(find_optimizer("adamw") && find_optimizer("adamw")->slots == std::vector<std::string>({"m", "v"}));
  EXPECT_TRUE(find_optimizer("lion") && find_optimizer("lion")->slots == std::vector<std::string>({"m"}));
  EXPECT_TRUE(find_optimizer("sgd") == nullptr);
  EXPECT_THROW_WITH(make_optimizer("sgd", true), "is not one of adamw, lion");
}

TEST(Optim, adamw_applies_grad_scale_bias_correction_and_decay) {
  auto opt = make_optimizer("adamw", true);
  Case c = make_case(*opt, {1.0f, -2.0f}, {0.5f, -0.25f});
  OptimizerHyper h;
  h.lr = 0.1f, h.weight_decay = 0.5f, h.grad_scale = 0.5f, h.step = 1;  // beta1 0.9, beta2 0.95: the defaults
  step(*opt, c, h, true);
  // m = (1-b1) * s * g; v = (1-b2) * (s g)^2; bias-corrected step is sign(g); decay uses the old p
  EXPECT_NEAR(c.slots[0][0], 0.1 * 0.25, 1e-7);
  EXPECT_NEAR(c.slots[1][1], 0.05 * 0.125 * 0.125, 1e-9);
  EXPECT_NEAR(c.p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-5);
  EXPECT_NEAR(c.p[1], -2.0 - 0.1 * (-1.0 + 0.5 * -2.0), 1e-5);
  // without decay the parameter moves by the step alone
  Case d = make_case(*opt, {1.0f}, {0.5f});
  step(*opt, d, h, false);
  EXPECT_NEAR(d.p[0], 1.0 - 0.1, 1e-5);
}

TEST(Optim, lion_moves_every_element_by_lr_times_the_sign) {
  auto opt = make_optimizer("lion", true, optim::StateType::F32, {{"beta2", 0.99f}});  // beta1: its default 0.9
  Case c = make_case(*opt, {1.0f, -2.0f, 3.0f}, {0.5f, -0.25f, 0.0f});
  c.slots[0] = {0.0f, 0.0f, -1.0f};
  OptimizerHyper h;
  h.lr = 0.1f, h.weight_decay = 0.5f, h.grad_scale = 2.0f, h.step = 3;
  step(*opt, c, h, true);
  // c = b1 m + (1 - b1) s g: +, -, and for the third 0.9 * -1 (negative): the update's sign
  EXPECT_NEAR(c.p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-6);
  EXPECT_NEAR(c.p[1], -2.0 - 0.1 * (-1.0 + 0.5 * -2.0), 1e-6);
  EXPECT_NEAR(c.p[2], 3.0 - 0.1 * (-1.0 + 0.5 * 3.0), 1e-6);
  // m = b2 m + (1 - b2) s g
  EXPECT_NEAR(c.slots[0][0], 0.01 * 1.0, 1e-7);
  EXPECT_NEAR(c.slots[0][2], 0.99 * -1.0, 1e-7);
  EXPECT_TRUE(c.nonfinite == 0);
  // a non-finite gradient leaves a non-finite moment, which the optimizer reports
  Case bad = make_case(*opt, {1.0f}, {NAN});
  step(*opt, bad, h, false);
  EXPECT_TRUE(bad.nonfinite == 1);
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--dump") return dump(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
