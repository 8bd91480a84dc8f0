// What the C++ tests share beside GoogleTest: the shared data folder, an exception-message check, the
// model's variants the GPU op tests go through (norms, activations), and FP8 casts in a row.
#pragma once
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "backend/backend.hpp"

namespace gpt::tests {

// The shared test data (tinyshakespeare shards, GPT-2's vocabulary): $TEST_DATA_DIR, default
// ../shared/data relative to the checkout (the tests run from its root). Tests that need it skip
// (GTEST_SKIP) with the path when it is not there.
inline std::string data_dir() {
  const char* d = std::getenv("TEST_DATA_DIR");
  return d && *d ? d : "../shared/data";
}
inline bool have_file(const std::string& path) { return std::ifstream(path).good(); }

// Every normalisation the model can use (model.norm, and model.bias where the kind has a bias): the GPU op
// tests check each at every shape (tests/gpu/test_ops.cpp) and its FP8 output (tests/gpu/test_fp8.cpp), so
// a new kind gets both checks by its line here
struct NormVariant {
  NormKind kind;
  bool bias;
  const char* name;
};
inline constexpr NormVariant kNormVariants[] = {
    {NormKind::layernorm, true, "layernorm"}, {NormKind::layernorm, false, "layernorm_nobias"}, {NormKind::rmsnorm, false, "rmsnorm"}};

// Every activation the model can use (model.activation): the GPU op tests check each, alone, after a
// product, and in the FP8 casts
inline constexpr Activation kActivations[] = {Activation::gelu, Activation::relu2};

// An FP8 cast on b, Fp8Cast's fields in a row: v = x, or x * act'(act_in) with act_in non-null
inline void fp8_cast(Backend& b, const Fp8Tensor& q, void* q_t, const void* x, const void* act_in, float* colsum,
                     int N, int C, Activation act = Activation::gelu) {
  Fp8Cast op;
  op.q = q, op.q_t = q_t, op.x = x, op.act_in = act_in, op.colsum = colsum, op.N = N, op.C = C, op.act = act;
  if (act_in) op.apply = Fp8Cast::Apply::act_grad;
  b.fp8_cast(op);
}
// v = act(pre)
inline void fp8_cast_act(Backend& b, const Fp8Tensor& q, void* q_t, const void* pre, int N, int C,
                         Activation act = Activation::gelu) {
  Fp8Cast op;
  op.q = q, op.q_t = q_t, op.x = pre, op.apply = Fp8Cast::Apply::act, op.act = act, op.N = N, op.C = C;
  b.fp8_cast(op);
}

// GPU test programs: every test skipped, with the reason, on a machine without a CUDA device.
class NeedsGpu : public ::testing::Environment {
 public:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine; GPU tests run on a GPU machine";
  }
};

}  // namespace gpt::tests

// The statement throws an exception whose what() contains `needle`.
#define EXPECT_THROW_WITH(stmt, needle) \
  EXPECT_THAT([&] { stmt; }, ::testing::ThrowsMessage<std::exception>(::testing::HasSubstr(needle)))
