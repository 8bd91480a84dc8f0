// A minimal test harness: CHECK records a failure with file:line and a message and carries on;
// main() ends with "N passed, M failed" and a non-zero exit on any failure.
#pragma once
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace check {

struct Registry {
  std::vector<std::pair<std::string, std::function<void()>>> tests;
  int failures_in_test = 0;
  static Registry& get() {
    static Registry r;
    return r;
  }
};

inline void fail(const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "  FAIL %s:%d: %s\n", file, line, msg.c_str());
  ++Registry::get().failures_in_test;
}

struct Add {
  Add(const char* name, std::function<void()> fn) { Registry::get().tests.push_back({name, std::move(fn)}); }
};

inline int run_all(const char* filter = nullptr) {
  int passed = 0, failed = 0;
  for (auto& [name, fn] : Registry::get().tests) {
    if (filter && name.find(filter) == std::string::npos) continue;
    Registry::get().failures_in_test = 0;
    std::printf("[ RUN  ] %s\n", name.c_str());
    std::fflush(stdout);
    try {
      fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("exception: ") + e.what());
    }
    const bool ok = Registry::get().failures_in_test == 0;
    std::printf("[ %s ] %s\n", ok ? " OK " : "FAIL", name.c_str());
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

}  // namespace check

#define TEST(name) \
  static void name(); \
  static check::Add add_##name(#name, name); \
  static void name()

#define CHECK(cond) \
  do { if (!(cond)) check::fail(__FILE__, __LINE__, "CHECK(" #cond ")"); } while (0)
#define CHECK_MSG(cond, msg) \
  do { if (!(cond)) check::fail(__FILE__, __LINE__, std::string(msg)); } while (0)
#define CHECK_NEAR(a, b, tol)                                                                         \
  do {                                                                                                \
    const double a_ = (a), b_ = (b);                                                                  \
    if (!(std::fabs(a_ - b_) <= (tol)))                                                               \
      check::fail(__FILE__, __LINE__, std::string(#a " = ") + std::to_string(a_) + ", " #b " = " +     \
                                          std::to_string(b_) + ", tolerance " + std::to_string(tol)); \
  } while (0)
#define CHECK_THROWS_WITH(stmt, needle)                                                              \
  do {                                                                                               \
    bool threw_ = false;                                                                             \
    try { stmt; } catch (const std::exception& e_) {                                                 \
      threw_ = true;                                                                                 \
      if (std::string(e_.what()).find(needle) == std::string::npos)                                  \
        check::fail(__FILE__, __LINE__, std::string("message '") + e_.what() + "' lacks '" + needle + "'"); \
    }                                                                                                \
    if (!threw_) check::fail(__FILE__, __LINE__, "expected an error mentioning '" + std::string(needle) + "'"); \
  } while (0)
