#include "run/sweep.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <iostream>
#include <sstream>
#include <unistd.h>

#include "base/format.hpp"
#include "config/yaml_map.hpp"
#include "io/h5util.hpp"
#include "parallel/agree.hpp"
#include "io/run_dir.hpp"
#include "run/eval.hpp"
#include "run/memory_fit.hpp"
#include "run/plan.hpp"
#include "run/trainer.hpp"

namespace fs = std::filesystem;

namespace gpt {

std::string SweepPoint::values_text() const {
  std::string s;
  for (auto& v : values) s += v.key + "=" + v.value + "\n";
  return s;
}

namespace {
// A value as the YAML text apply_override reads back: a scalar as written, unless reading it back would
// not give the same scalar (a quoted 'a: b' or '[x]'), then emitted (quoted) as YAML.
std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) {
    try {
      const YAML::Node back = YAML::Load(n.Scalar());
      if (back.IsScalar() && back.Scalar() == n.Scalar()) return n.Scalar();
    } catch (const YAML::Exception&) {
    }
  }
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

std::vector<std::pair<std::string, std::vector<std::string>>> read_lists(const YAML::Node& m, const std::string& what) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  if (!m.IsMap()) throw input_error("sweep." + what + " must be a mapping of dotted keys to lists");
  for (const YamlEntry& kv : yaml_entries(m, "sweep." + what)) {
    const std::string& key = kv.key;
    const int line = kv.line + 1;
    if (!is_config_key(key))
      throw input_error("sweep." + what + ": unknown key '" + key + "' (line " + std::to_string(line) + ")" +
                        did_you_mean(key, config_keys()));
    // Every point's run is <out_dir>/<name>/pNNN and the summary is in <out_dir>/<name>: the sweep's own
    // folder cannot vary with the point.
    if (key == "run.name" || key == "run.out_dir")
      throw input_error("sweep." + what + "." + key + " (line " + std::to_string(line) +
                        "): a sweep cannot vary " + key + ": its points run in <run.out_dir>/<run.name>/p000, p001, "
                        "... (set " + key + " once, outside the sweep: section)");
    if (!kv.value.IsSequence() || kv.value.size() == 0)
      throw input_error("sweep." + what + "." + key + " (line " + std::to_string(line) + "): expected a non-empty list");
    std::vector<std::string> vals;
    for (const auto& v : kv.value) vals.push_back(scalar_text(v));
    out.push_back({key, vals});
  }
  return out;
}
}  // namespace

Sweep parse_sweep(const std::string& text, const std::string& source) {
  Sweep sw;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw input_error("malformed YAML in " + source + " at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap() || !root["sweep"]) {
    sw.points.push_back({0, "", {}});
    return sw;
  }
  sw.is_sweep = true;
  const YAML::Node s = root["sweep"];
  if (!s.IsMap()) throw input_error("sweep: must be a mapping with grid: and/or zip:");
  std::vector<std::pair<std::string, std::vector<std::string>>> grid, zip;
  for (const YamlEntry& kv : yaml_entries(s, "sweep")) {
    if (kv.key == "grid") grid = read_lists(kv.value, "grid");
    else if (kv.key == "zip") zip = read_lists(kv.value, "zip");
    else {
      const std::string near = closest_name(kv.key, {"grid", "zip"});
      throw input_error("sweep: unknown key '" + kv.key + "' (line " + std::to_string(kv.line + 1) + "); " +
                        (near.empty() ? "expected grid or zip" : "did you mean '" + near + "'?"));
    }
  }
  size_t zip_len = 0;
  for (auto& [k, v] : zip) {
    if (zip_len && v.size() != zip_len)
      throw input_error("sweep.zip: lists must have equal lengths; '" + k + "' has " + std::to_string(v.size()) +
                        " values, '" + zip.front().first + "' has " + std::to_string(zip_len));
    zip_len = v.size();
  }
  for (auto& [k, v] : grid) sw.keys.push_back(k);
  for (auto& [k, v] : zip) {
    if (std::find(sw.keys.begin(), sw.keys.end(), k) != sw.keys.end())
      throw input_error("sweep: key '" + k + "' is in both grid and zip");
    sw.keys.push_back(k);
  }
  // cartesian product: grid keys in order (last varies fastest), then the zip index
  size_t n = zip.empty() ? 1 : zip_len;
  for (auto& [k, v] : grid) n *= v.size();
  if (n == 0 || (grid.empty() && zip.empty())) throw input_error("sweep: no points (give grid: or zip: lists)");
  for (size_t i = 0; i < n; ++i) {
    SweepPoint p;
    p.index = int(i);
    char buf[32];
    std::snprintf(buf, sizeof buf, "p%03zu", i);
    p.dir_name = buf;
    size_t rest = i;
    const size_t zi = zip.empty() ? 0 : rest % zip_len;
    if (!zip.empty()) rest /= zip_len;
    std::vector<Override> g;
    for (int gk = int(grid.size()) - 1; gk >= 0; --gk) {
      const auto& vals = grid[gk].second;
      g.push_back({grid[gk].first, vals[rest % vals.size()]});
      rest /= vals.size();
    }
    std::reverse(g.begin(), g.end());
    p.values = g;
    for (auto& [k, v] : zip) p.values.push_back({k, v[zi]});
    sw.points.push_back(p);
  }
  return sw;
}

Config point_config(const Config& base, const Sweep& sw, const SweepPoint& p) {
  Config c = base;
  apply_overrides(c, p.values, "sweep point " + std::to_string(p.index));
  if (sw.is_sweep) c.run.name = base.run.name + "/" + p.dir_name;
  return c;
}

namespace {

// A log for a point that failed before its run could write one, so the summary can name the reason.
void write_failure_log(const std::string& dir, const SweepPoint& p, const std::string& status, const std::string& msg) {
  fs::create_directories(dir);
  const std::string path = dir + "/log.h5";
  if (fs::exists(path)) return;
  h5::silence_errors();
  h5::Id f(H5Fcreate((path + ".tmp").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) return;
  h5::set_attr(f, "status", status);
  h5::set_attr(f, "message", msg);
  h5::set_attr(f, "point_index", int64_t(p.index));
  h5::set_attr(f, "point_values", p.values_text());
  f.reset();
  fs::rename(path + ".tmp", path);
}

// "p001 training.lr=3e-3: ok, 600 steps in 1m30s, 52000 tokens/s, best val loss 1.4312"
std::string point_line(const SweepPoint& p, const RunResult& r, bool shared_gpu) {
  std::string s = "  " + p.dir_name;
  for (auto& v : p.values) s += " " + v.key + "=" + v.value;
  s += ": " + r.status;
  if (r.totals.steps > 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, ", %lld steps in %s, %.0f tokens/s", (long long)r.totals.steps,
                  format_duration(r.totals.seconds).c_str(), r.totals.tokens_per_s);
    s += buf;
    if (!std::isnan(r.totals.mfu)) s += ", MFU " + shortest(std::round(1000 * r.totals.mfu) / 10) + "%";
    if (!std::isnan(r.totals.best_val_loss)) {
      std::snprintf(buf, sizeof buf, ", best val loss %.4f", r.totals.best_val_loss);
      s += buf;
    }
    if (shared_gpu) s += std::string(" (") + kSharedGpuNote + ")";
  } else if (r.status == "ok" && !r.message.empty()) {
    s += " (" + r.message + ")";  // already complete at step N
  }
  return s + "\n";
}

}  // namespace

std::vector<PlannedPoint> plan_points(const Config& base, const Sweep& sw, const std::vector<int>& indices,
                                      HostComm& host, bool resume) {
  std::vector<PlannedPoint> out;
  for (int i : indices) {
    PlannedPoint pp{i, point_config(base, sw, sw.points[i]), {}};
    try {
      pp.plan = plan_with_fit(pp.cfg, host.world());
    } catch (const Error& e) {
      if (!sw.is_sweep) throw;
      throw Error(e.code(), "sweep point " + std::to_string(i) + " (" + pp.cfg.run.name + "): " + e.what());
    }
    out.push_back(std::move(pp));
  }
  // before any work: ranks that would share a GPU are refused unless the point asks for shared GPUs
  for (const auto& pp : out) check_gpu_sharing(host, pp.plan.device == "cuda", pp.plan.shared_gpu);
  agreed(host, "checking the run directories", [&] {
    if (host.rank() != 0) return;
    for (auto& pp : out)
      check_run_dir(run_dir(pp.cfg), resume || pp.cfg.checkpoint.resume == ResumeMode::automatic, pp.cfg.run.overwrite);
  });
  return out;
}

int run_sweep(const Config& base, const Sweep& sw, const std::vector<PlannedPoint>& points, HostComm& host,
              bool resume, const std::string& yaml_text) {
  int failed = 0, last_code = 0;
  std::string lines;  // one per point, printed together at the end
  for (const PlannedPoint& pp : points) {
    const SweepPoint& p = sw.points[pp.index];
    RunResult r;
    try {
      if (host.rank() == 0 && sw.is_sweep) {
        std::cout << "\n=== sweep point " << p.index << "/" << sw.points.size() << " (" << pp.cfg.run.name << ")";
        for (auto& v : p.values) std::cout << " " << v.key << "=" << v.value;
        std::cout << "\n" << std::flush;
      }
      if (host.rank() == 0) print_plan(pp.cfg, pp.plan);
      check_host_memory(pp.plan, host, pp.cfg.checkpoint.every > 0);
      r = train(pp.cfg, pp.plan, host, PointInfo{sw.is_sweep ? p.index : -1, p.values_text()}, resume);
    } catch (const Error& e) {
      if (e.code() != kExitBadInput && e.code() != kExitOutOfMemory) throw;
      r = {e.code() == kExitOutOfMemory ? "oom" : "failed", e.what(), e.code(), {}};
      if (host.rank() == 0) {
        std::cerr << "error: " << e.what() << "\n";
        if (sw.is_sweep) write_failure_log(base.run.out_dir + "/" + base.run.name + "/" + p.dir_name, p, r.status, r.message);
      }
    }
    lines += point_line(p, r, pp.plan.shared_gpu);
    if (r.exit_code == kExitCheckpointed) return kExitCheckpointed;
    if (r.status != "ok") {
      ++failed;
      last_code = r.exit_code;
    }
  }
  // One point of an array job leaves the summary to the job that runs after all points (--summarize):
  // points finishing together would otherwise race on it.
  if (sw.is_sweep && host.rank() == 0 && points.size() == sw.points.size()) {
    std::cout << "\n";
    write_summary(base, sw, yaml_text);
    std::cout << "sweep: " << points.size() - failed << " of " << points.size() << " point(s) ok\n" << lines
              << std::flush;
  }
  if (!failed) return kExitOk;
  return points.size() == 1 ? last_code : kExitFailure;
}

}  // namespace gpt
