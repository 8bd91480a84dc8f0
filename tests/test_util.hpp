// What the C++ tests share beside GoogleTest: the shared data folder and an exception-message check.
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
