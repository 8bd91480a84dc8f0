// What the attention benchmarks (attention_plans, attention_fp8) share: their command line, the shapes it
// names, the check that skips them on a machine without a GPU, and the writing of their JSON.
//
//   build/bench/<program> [--json FILE] [<the program's own switches>] [--deterministic] [--shapes B:T:NH:HS,...]
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/common.hpp"
#include "kernels/attention.cuh"

namespace gpt::bench {

// The options every attention benchmark takes.
struct AttentionOptions {
  std::string json_path;       // --json FILE: written whole or not at all; "" writes none
  std::string shapes;          // --shapes B:T:NH:HS,...: the program's default until given
  bool deterministic = false;  // --deterministic: backward graphs without atomics (training.deterministic)
};

// A program's own on/off flag: name ("--knobs") sets *value.
struct Switch {
  const char* name;
  bool* value;
};

// argv -> o and the switches; false, with the argument and the usage line on stderr (the caller exits 1),
// at an unknown argument or one missing its value.
inline bool parse_args(int argc, char** argv, AttentionOptions& o, std::initializer_list<Switch> own = {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--json" && has_value) {
      o.json_path = argv[++i];
    } else if (a == "--shapes" && has_value) {
      o.shapes = argv[++i];
    } else if (a == "--deterministic") {
      o.deterministic = true;
    } else {
      const Switch* hit = nullptr;
      for (const Switch& s : own)
        if (a == s.name) hit = &s;
      if (hit) {
        *hit->value = true;
        continue;
      }
      std::string flags;
      for (const Switch& s : own) flags += std::string(" [") + s.name + "]";
      std::fprintf(stderr,
                   "unknown or incomplete argument '%s'\nusage: %s [--json FILE]%s [--deterministic] "
                   "[--shapes B:T:NH:HS,...]\n",
                   a.c_str(), argv[0], flags.c_str());
      return false;
    }
  }
  return true;
}

// "64:1024:12:64,16:1024:25:64" -> the shapes, in order; input_error (naming the item) at one that is not
// four positive integers joined by ':', or at an empty list.
inline std::vector<gpt::kern::AttentionShape> parse_shapes(const std::string& text) {
  std::vector<gpt::kern::AttentionShape> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    gpt::kern::AttentionShape s;
    char c1 = 0, c2 = 0, c3 = 0;
    std::stringstream is(item);
    if (!(is >> s.B >> c1 >> s.T >> c2 >> s.NH >> c3 >> s.HS) || c1 != ':' || c2 != ':' || c3 != ':' || s.B <= 0 ||
        s.T <= 0 || s.NH <= 0 || s.HS <= 0 || !is.eof())
      throw gpt::input_error("--shapes: '" + item + "' is not B:T:NH:HS with positive integers");
    out.push_back(s);
  }
  if (out.empty()) throw gpt::input_error("--shapes: no shape given");
  return out;
}

// True, after printing "SKIP: no CUDA device", where there is no GPU: the program then exits 0 and writes
// no JSON (tests/test_cpp.py runs it so on CPU machines).
inline bool skip_without_device() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) return false;
  std::printf("SKIP: no CUDA device\n");
  return true;
}

// The results as one line of JSON at path (through path.tmp: whole or absent); nothing when path is "".
// ordered_json keeps the keys in the order the program sets them; NaN (not measured) comes out as null,
// and bytes that are not UTF-8 in a library's message as U+FFFD rather than an exception.
inline void write_json(const std::string& path, const nlohmann::ordered_json& js) {
  if (path.empty()) return;
  gpt::write_file_whole(path, js.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

}  // namespace gpt::bench
