// The sweep summary: <out_dir>/<name>/summary.{h5,csv}, one row per point, derived from the points' logs.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <unistd.h>

#include "base/format.hpp"
#include "base/memory.hpp"
#include "io/h5util.hpp"
#include "run/signals.hpp"
#include "run/sweep.hpp"

namespace fs = std::filesystem;

namespace gpt {

namespace {

struct Row {
  std::map<std::string, std::string> text;
  std::map<std::string, double> num;
};

// the memory columns: every component, then the total
std::vector<std::string> memory_columns() {
  std::vector<std::string> c;
  for (const MemoryComponent& m : kMemoryComponents) c.push_back(m.name);
  c.push_back("total");
  return c;
}

void read_point_log(hid_t f, Row& r);

Row summarize_point(const std::string& dir, const SweepPoint& p) {
  Row r;
  r.text["index"] = std::to_string(p.index);
  r.text["dir"] = p.dir_name;
  for (auto& v : p.values) r.text[v.key] = v.value;
  const std::string path = dir + "/log.h5";
  auto nan = std::nan("");
  for (const char* k : {"world_size", "n_params", "flops_per_token", "median_step_ms", "tokens_per_s",
                        "tokens_per_s_per_gpu", "mfu", "final_train_loss", "final_val_loss", "micro_batch", "startup_s",
                        "meas_peak", "meas_baseline"})
    r.num[k] = nan;
  for (const std::string& c : memory_columns()) {
    r.num["pred_" + c] = nan;
    r.num["meas_" + c] = nan;
  }
  if (!fs::exists(path)) {
    r.text["status"] = "missing";
    r.text["message"] = "no log.h5 (point not run yet)";
    return r;
  }
  // A damaged log makes its point "damaged" (the message names the file and what HDF5 ran into); the
  // others are summarized as usual.
  const auto damaged = [&](const std::string& why) {
    Row d;
    d.text = {{"index", r.text["index"]}, {"dir", r.text["dir"]}};
    for (auto& v : p.values) d.text[v.key] = v.value;
    d.num = r.num;
    d.text["status"] = "damaged";
    d.text["message"] = "run log '" + path + "' is damaged (" + why + ")";
    std::cerr << "warning: sweep point " << p.index << ": " << d.text["message"] << "; the summary lists it as "
              << "damaged\n";
    return d;
  };
  std::string why;
  h5::Id f = h5::open_read_only(path, &why);
  if (!f.valid()) return damaged(why);
  try {
    read_point_log(f, r);
  } catch (const Error& e) {
    return damaged(e.what());
  } catch (const YAML::Exception& e) {
    return damaged(std::string("its config_yaml: ") + e.what());
  }
  return r;
}

// The point's row from its open log.
void read_point_log(hid_t f, Row& r) {
  auto nan = std::nan("");
  // an attribute absent from an older log (or a failure log) has its default; one HDF5 cannot read throws
  auto attr_or = [&](const char* k, const std::string& dflt) {
    return H5Aexists(f, k) == 0 ? dflt : h5::get_attr_str(f, k);
  };
  r.text["status"] = attr_or("status", "unknown");
  r.text["message"] = attr_or("message", "");
  r.text["device"] = attr_or("device", "");  // what the ranks ran on: cpu or cuda
  if (H5Aexists(f, "shared_gpu") > 0 && h5::get_attr_i64(f, "shared_gpu"))  // the staged communicator
    r.text["message"] += std::string(r.text["message"].empty() ? "" : "; ") + kSharedGpuNote;
  if (H5Aexists(f, "startup_s") > 0) r.num["startup_s"] = h5::get_attr_f64(f, "startup_s");
  if (!h5::exists(f, "/train/step")) return;
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
  h5::Id ms(H5_CHECK(H5Dopen2(f, "/train/step_ms", H5P_DEFAULT)));
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
  h5::Id loss(H5_CHECK(H5Dopen2(f, "/train/loss", H5P_DEFAULT)));
  auto l = h5::read_all<double>(loss, H5T_NATIVE_DOUBLE);
  if (!l.empty()) r.num["final_train_loss"] = l.back();
  h5::Id vl(H5_CHECK(H5Dopen2(f, "/eval/val_loss", H5P_DEFAULT)));
  auto e = h5::read_all<double>(vl, H5T_NATIVE_DOUBLE);
  if (!e.empty()) r.num["final_val_loss"] = e.back();
  for (const char* which : {"predicted", "measured"}) {
    h5::Id g(H5Gopen2(f, (std::string("/memory/") + which).c_str(), H5P_DEFAULT));
    if (!g.valid()) continue;
    for (const std::string& c : memory_columns()) {
      if (H5Aexists(g, c.c_str()) > 0)
        r.num[(which[0] == 'p' ? "pred_" : "meas_") + c] = double(h5::get_attr_i64(g, c.c_str()));
    }
    if (which[0] == 'm' && H5Aexists(g, "peak") > 0) r.num["meas_peak"] = double(h5::get_attr_i64(g, "peak"));
    if (which[0] == 'm' && H5Aexists(g, "baseline") > 0)
      r.num["meas_baseline"] = double(h5::get_attr_i64(g, "baseline"));
  }
}

// The `units` attribute of a summary column (docs/FORMATS.md): text columns are "text", counts and
// fractions "1".
const char* column_units(const std::string& c) {
  static const std::map<std::string, const char*> units = {
      {"index", "1"},           {"world_size", "ranks"},          {"n_params", "parameters"},
      {"flops_per_token", "FLOP/token"}, {"median_step_ms", "ms"},  {"tokens_per_s", "tokens/s"},
      {"tokens_per_s_per_gpu", "tokens/s"}, {"mfu", "fraction"},  {"final_train_loss", "nats/token"},
      {"final_val_loss", "nats/token"}, {"micro_batch", "sequences"}, {"startup_s", "s"}};
  if (c.rfind("pred_", 0) == 0 || c.rfind("meas_", 0) == 0) return "bytes";
  auto it = units.find(c);
  return it == units.end() ? "text" : it->second;
}

void set_units(hid_t g, const std::string& c) {
  h5::Id ds(H5_CHECK(H5Dopen2(g, c.c_str(), H5P_DEFAULT)));
  h5::set_attr(ds, "units", std::string(column_units(c)));
}

}  // namespace

void write_summary(const Config& base, const Sweep& sw, const std::string& yaml_text) {
  const std::string root = base.run.out_dir + "/" + base.run.name;
  fs::create_directories(root);
  std::vector<Row> rows;
  int damaged = 0;
  for (auto& p : sw.points) {
    // SIGTERM / SIGINT / SIGUSR1 (run/signals.hpp): no summary rather than one cut short
    if (stop_requested()) throw Error(kExitFailure, "stopped by a signal: the summary in '" + root + "' was not written");
    rows.push_back(summarize_point(root + "/" + p.dir_name, p));
    damaged += rows.back().text["status"] == "damaged";
  }
  std::vector<std::string> text_cols = {"index", "dir"};
  for (auto& k : sw.keys) text_cols.push_back(k);
  text_cols.push_back("status");
  text_cols.push_back("message");
  text_cols.push_back("device");
  std::vector<std::string> num_cols = {"world_size", "n_params", "flops_per_token", "median_step_ms", "tokens_per_s",
                                       "tokens_per_s_per_gpu", "mfu", "final_train_loss", "final_val_loss", "micro_batch",
                                       "startup_s"};
  for (const std::string& c : memory_columns()) num_cols.push_back("pred_" + c);
  for (const std::string& c : memory_columns()) num_cols.push_back("meas_" + c);
  num_cols.push_back("meas_peak");
  num_cols.push_back("meas_baseline");

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
        if (!std::isnan(v)) out << shortest(v);
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
    std::vector<int64_t> index;
    for (auto& r : rows) index.push_back(std::stoll(r.text["index"]));
    h5::write_array(g, "index", H5T_NATIVE_INT64, H5T_STD_I64LE, index.data(), index.size());
    set_units(g, "index");
    for (auto& c : text_cols) {
      if (c == "index") continue;
      std::vector<std::string> col;
      for (auto& r : rows) col.push_back(r.text[c]);
      h5::write_strings(g, c, col);
      set_units(g, c);
    }
    for (auto& c : num_cols) {
      std::vector<double> col;
      for (auto& r : rows) col.push_back(r.num[c]);
      h5::write_array(g, c, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, col.data(), col.size());
      set_units(g, c);
    }
  }
  fs::rename(h5_tmp, root + "/summary.h5");
  std::cout << "summary of " << rows.size() << " point(s)"
            << (damaged ? " (" + std::to_string(damaged) + " with a damaged log)" : std::string()) << ": " << root
            << "/summary.csv, " << root << "/summary.h5\n"
            << std::flush;
}

}  // namespace gpt
