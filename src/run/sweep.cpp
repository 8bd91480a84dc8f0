#include "run/sweep.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <sstream>
#include <unistd.h>

#include "io/h5util.hpp"
#include "run/trainer.hpp"

namespace fs = std::filesystem;

namespace gpt {

std::string SweepPoint::values_text() const {
  std::string s;
  for (auto& v : values) s += v.key + "=" + v.value + "\n";
  return s;
}

namespace {
std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

std::vector<std::pair<std::string, std::vector<std::string>>> read_lists(const YAML::Node& m, const std::string& what) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  if (!m.IsMap()) throw input_error("sweep." + what + " must be a mapping of dotted keys to lists");
  for (const auto& kv : m) {
    const std::string key = kv.first.as<std::string>();
    const int line = kv.first.Mark().line + 1;
    if (!is_config_key(key))
      throw input_error("sweep." + what + ": unknown key '" + key + "' (line " + std::to_string(line) + ")");
    if (!kv.second.IsSequence() || kv.second.size() == 0)
      throw input_error("sweep." + what + "." + key + " (line " + std::to_string(line) + "): expected a non-empty list");
    std::vector<std::string> vals;
    for (const auto& v : kv.second) vals.push_back(scalar_text(v));
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
  for (const auto& kv : s) {
    const std::string k = kv.first.as<std::string>();
    if (k == "grid") grid = read_lists(kv.second, "grid");
    else if (k == "zip") zip = read_lists(kv.second, "zip");
    else
      throw input_error("sweep: unknown key '" + k + "' (line " + std::to_string(kv.first.Mark().line + 1) +
                        "); expected grid or zip");
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
  for (auto& v : p.values) apply_override(c, v);
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

}  // namespace

int run_sweep(const Config& base, const Sweep& sw, const std::vector<int>& indices, HostComm& host, bool resume,
              const std::string& yaml_text) {
  int failed = 0, last_code = 0;
  for (int i : indices) {
    const SweepPoint& p = sw.points[i];
    RunResult r;
    Config c;
    try {
      c = point_config(base, sw, p);
      if (host.rank() == 0 && sw.is_sweep) {
        std::cout << "\n=== sweep point " << p.index << "/" << sw.points.size() << " (" << c.run.name << ")";
        for (auto& v : p.values) std::cout << " " << v.key << "=" << v.value;
        std::cout << "\n" << std::flush;
      }
      if (host.rank() == 0) print_plan(c, make_plan(c, host.world()), predict_memory(c, make_plan(c, host.world())));
      r = train(c, host, PointInfo{sw.is_sweep ? p.index : -1, p.values_text()}, resume);
    } catch (const Error& e) {
      if (e.code() != kExitBadInput && e.code() != kExitOutOfMemory) throw;
      r = {e.code() == kExitOutOfMemory ? "oom" : "failed", e.what(), e.code()};
      if (host.rank() == 0) {
        std::cerr << "error: " << e.what() << "\n";
        if (sw.is_sweep) write_failure_log(base.run.out_dir + "/" + base.run.name + "/" + p.dir_name, p, r.status, r.message);
      }
    }
    if (r.exit_code == kExitCheckpointed) return kExitCheckpointed;
    if (r.status != "ok") {
      ++failed;
      last_code = r.exit_code;
    }
  }
  // One point of an array job leaves the summary to the job that runs after all points (--summarize):
  // points finishing together would otherwise race on it.
  if (sw.is_sweep && host.rank() == 0 && indices.size() == sw.points.size()) {
    write_summary(base, sw, yaml_text);
    std::cout << "\nsweep: " << indices.size() - failed << " of " << indices.size() << " point(s) ok; summary in "
              << base.run.out_dir << "/" << base.run.name << "/summary.csv\n";
  }
  if (!failed) return kExitOk;
  return indices.size() == 1 ? last_code : kExitFailure;
}

// ---------------------------------------------------------------------------------------------------
namespace {

struct Row {
  std::map<std::string, std::string> text;
  std::map<std::string, double> num;
};

const char* kComponents[] = {"params", "grads", "master", "adam_m", "adam_v", "activations", "workspace", "comm", "total"};

Row summarize_point(const std::string& dir, const SweepPoint& p) {
  Row r;
  r.text["index"] = std::to_string(p.index);
  r.text["dir"] = p.dir_name;
  for (auto& v : p.values) r.text[v.key] = v.value;
  const std::string path = dir + "/log.h5";
  auto nan = std::nan("");
  for (const char* k : {"world_size", "n_params", "flops_per_token", "median_step_ms", "tokens_per_s",
                        "tokens_per_s_per_gpu", "mfu", "final_train_loss", "final_val_loss", "micro_batch", "meas_peak"})
    r.num[k] = nan;
  for (const char* c : kComponents) {
    r.num[std::string("pred_") + c] = nan;
    r.num[std::string("meas_") + c] = nan;
  }
  if (!fs::exists(path)) {
    r.text["status"] = "missing";
    r.text["message"] = "no log.h5 (point not run yet)";
    return r;
  }
  h5::silence_errors();
  h5::Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl));
  if (!f.valid()) f = h5::Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) {
    r.text["status"] = "failed";
    r.text["message"] = "unreadable log.h5";
    return r;
  }
  auto attr_or = [&](const char* k, const std::string& dflt) {
    try { return h5::get_attr_str(f, k); } catch (const Error&) { return dflt; }
  };
  r.text["status"] = attr_or("status", "unknown");
  r.text["message"] = attr_or("message", "");
  if (!h5::exists(f, "/train/step")) return r;
  const double world = double(h5::get_attr_i64(f, "world_size"));
  r.num["world_size"] = world;
  r.num["n_params"] = double(h5::get_attr_i64(f, "n_params"));
  r.num["flops_per_token"] = h5::get_attr_f64(f, "flops_per_token");
  const double tps_step = double(h5::get_attr_i64(f, "tokens_per_step"));
  const double peak = h5::get_attr_f64(f, "peak_flops");
  {
    YAML::Node cy = YAML::Load(h5::get_attr_str(f, "config_yaml"));
    r.num["micro_batch"] = cy["training"]["micro_batch"].as<double>(nan);
  }
  h5::Id ms(H5Dopen2(f, "/train/step_ms", H5P_DEFAULT));
  auto v = h5::read_all<double>(ms, H5T_NATIVE_DOUBLE);
  if (v.size() > 1) v.erase(v.begin());  // the first step includes warm-up
  if (!v.empty()) {
    std::sort(v.begin(), v.end());
    const double med = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    r.num["median_step_ms"] = med;
    r.num["tokens_per_s"] = tps_step / (med / 1000.0);
    r.num["tokens_per_s_per_gpu"] = r.num["tokens_per_s"] / world;
    if (peak > 0) r.num["mfu"] = r.num["flops_per_token"] * r.num["tokens_per_s"] / (peak * world);
  }
  h5::Id loss(H5Dopen2(f, "/train/loss", H5P_DEFAULT));
  auto l = h5::read_all<double>(loss, H5T_NATIVE_DOUBLE);
  if (!l.empty()) r.num["final_train_loss"] = l.back();
  h5::Id vl(H5Dopen2(f, "/eval/val_loss", H5P_DEFAULT));
  auto e = h5::read_all<double>(vl, H5T_NATIVE_DOUBLE);
  if (!e.empty()) r.num["final_val_loss"] = e.back();
  for (const char* which : {"predicted", "measured"}) {
    h5::Id g(H5Gopen2(f, (std::string("/memory/") + which).c_str(), H5P_DEFAULT));
    if (!g.valid()) continue;
    for (const char* c : kComponents) {
      if (H5Aexists(g, c) > 0)
        r.num[std::string(which[0] == 'p' ? "pred_" : "meas_") + c] = double(h5::get_attr_i64(g, c));
    }
    if (which[0] == 'm' && H5Aexists(g, "peak") > 0) r.num["meas_peak"] = double(h5::get_attr_i64(g, "peak"));
  }
  return r;
}

}  // namespace

void write_summary(const Config& base, const Sweep& sw, const std::string& yaml_text) {
  const std::string root = base.run.out_dir + "/" + base.run.name;
  fs::create_directories(root);
  std::vector<Row> rows;
  for (auto& p : sw.points) rows.push_back(summarize_point(root + "/" + p.dir_name, p));
  std::vector<std::string> text_cols = {"index", "dir"};
  for (auto& k : sw.keys) text_cols.push_back(k);
  text_cols.push_back("status");
  text_cols.push_back("message");
  std::vector<std::string> num_cols = {"world_size", "n_params", "flops_per_token", "median_step_ms", "tokens_per_s",
                                       "tokens_per_s_per_gpu", "mfu", "final_train_loss", "final_val_loss", "micro_batch"};
  for (const char* c : kComponents) num_cols.push_back(std::string("pred_") + c);
  for (const char* c : kComponents) num_cols.push_back(std::string("meas_") + c);
  num_cols.push_back("meas_peak");

  // temp names unique to this process, then rename: readers see the old or the new summary, whole
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  const std::string csv_tmp = root + "/summary.csv" + suffix, h5_tmp = root + "/summary.h5" + suffix;
  // CSV (temp + rename)
  {
    std::ofstream out(csv_tmp, std::ios::trunc);
    auto quote = [](const std::string& s) {
      if (s.find_first_of(",\"\n") == std::string::npos) return s;
      std::string q = "\"";
      for (char ch : s) {
        if (ch == '"') q += '"';
        q += ch == '\n' ? ' ' : ch;
      }
      return q + "\"";
    };
    bool first = true;
    for (auto& c : text_cols) out << (first ? "" : ",") << quote(c), first = false;
    for (auto& c : num_cols) out << "," << c;
    out << "\n";
    for (auto& r : rows) {
      first = true;
      for (auto& c : text_cols) out << (first ? "" : ",") << quote(r.text[c]), first = false;
      for (auto& c : num_cols) {
        out << ",";
        const double v = r.num[c];
        if (!std::isnan(v)) {
          char buf[48];
          std::snprintf(buf, sizeof buf, "%.10g", v);
          out << buf;
        }
      }
      out << "\n";
    }
    if (!out.flush()) throw Error(kExitFailure, "cannot write " + root + "/summary.csv");
  }
  fs::rename(csv_tmp, root + "/summary.csv");
  // HDF5: one dataset per column under /points
  {
    h5::silence_errors();
    const std::string& tmp = h5_tmp;
    h5::Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    if (!f.valid()) throw Error(kExitFailure, "cannot create " + tmp);
    h5::set_attr(f, "config_yaml", yaml_text);
    std::string keys;
    for (auto& k : sw.keys) keys += k + "\n";
    h5::set_attr(f, "varied_keys", keys);
    h5::Id g = h5::create_group(f, "points");
    for (auto& c : text_cols) {
      std::vector<std::string> col;
      for (auto& r : rows) col.push_back(r.text[c]);
      h5::write_strings(g, c, col);
    }
    for (auto& c : num_cols) {
      std::vector<double> col;
      for (auto& r : rows) col.push_back(r.num[c]);
      h5::write_array(g, c, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, col.data(), col.size());
    }
  }
  fs::rename(h5_tmp, root + "/summary.h5");
}

}  // namespace gpt
