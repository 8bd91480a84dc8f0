#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "h5util.hpp"

namespace fs = std::filesystem;

namespace gpt {
namespace {

constexpr const char* kFormat = "gpt2-train checkpoint";
constexpr int64_t kFormatVersion = 1;
const char* kKinds[] = {"param", "master", "m", "v"};
const ZeroEngine::State kStates[] = {ZeroEngine::State::param, ZeroEngine::State::master, ZeroEngine::State::m,
                                     ZeroEngine::State::v};

int64_t checksum(const float* p, size_t n) {  // FNV-1a 64 over the bytes
  uint64_t h = 1469598103934665603ull;
  const auto* c = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n * 4; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return int64_t(h);
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(kExitFailure, "cannot open '" + path + "' to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(kExitFailure, "fsync of '" + path + "' failed");
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}
std::string rank_file(const std::string& dir, int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/rank_%05d.h5", r);
  return dir + buf;
}

void write_rank_file(const std::string& path, const TrainState& st, ZeroEngine& e, const ParamLayout& L, int rank,
                     int world) {
  h5::Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) throw Error(kExitFailure, "cannot create checkpoint file '" + path + "'");
  const ModelDims& d = L.dims();
  h5::set_attr(f, "format", std::string(kFormat));
  h5::set_attr(f, "format_version", kFormatVersion);
  h5::set_attr(f, "step", st.step);
  h5::set_attr(f, "world_size", int64_t(world));
  h5::set_attr(f, "rank", int64_t(rank));
  h5::set_attr(f, "zero_stage", int64_t(e.stage()));
  h5::set_attr(f, "n_layer", int64_t(d.n_layer));
  h5::set_attr(f, "n_head", int64_t(d.n_head));
  h5::set_attr(f, "n_embd", int64_t(d.n_embd));
  h5::set_attr(f, "vocab_size", int64_t(d.vocab_size));
  h5::set_attr(f, "padded_vocab", int64_t(d.padded_vocab));
  h5::set_attr(f, "max_seq_len", int64_t(d.max_seq_len));
  h5::set_attr(f, "data_shard", st.data.shard);
  h5::set_attr(f, "data_offset", st.data.offset);
  h5::set_attr(f, "data_epoch", st.data.epoch);
  h5::set_attr(f, "seed", int64_t(st.seed));
  h5::set_attr(f, "config_yaml", st.config_yaml);
  h5::set_attr(f, "n_buckets", int64_t(L.n_buckets()));
  std::vector<float> buf;
  for (int b = 0; b < L.n_buckets(); ++b) {
    char g[16];
    std::snprintf(g, sizeof g, "b%04d", b);
    h5::Id grp = h5::create_group(f, g);
    const size_t lo = e.piece_begin(b), hi = e.piece_end(b);
    h5::set_attr(grp, "begin", int64_t(lo));
    h5::set_attr(grp, "end", int64_t(hi));
    h5::set_attr(grp, "bucket_size", int64_t(L.bucket(b).size));
    buf.resize(hi - lo);
    for (int k = 0; k < 4; ++k) {
      if (kStates[k] == ZeroEngine::State::master && !e.has_master()) continue;
      e.get_piece(b, kStates[k], buf.data());
      h5::write_array(grp, kKinds[k], H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, buf.data(), buf.size());
      h5::Id ds(H5_CHECK(H5Dopen2(grp, kKinds[k], H5P_DEFAULT)));
      h5::set_attr(ds, "checksum", checksum(buf.data(), buf.size()));
    }
  }
  H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
  f.reset();
  fsync_path(path);
}

// One old rank file, opened and checked.
struct OldFile {
  std::string path;
  h5::Id f;
  int64_t world = 0;
};

std::vector<OldFile> open_checkpoint(const std::string& dir, const ParamLayout& L, TrainState& st) {
  std::vector<OldFile> files;
  if (!fs::is_directory(dir)) throw input_error("checkpoint '" + dir + "' does not exist");
  const std::string first = rank_file(dir, 0);
  auto open_one = [&](const std::string& p) {
    if (!fs::exists(p)) throw input_error("checkpoint '" + dir + "' is incomplete: '" + p + "' is missing");
    OldFile o;
    o.path = p;
    o.f = h5::Id(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!o.f.valid()) throw input_error("checkpoint file '" + p + "' is unreadable (truncated or not HDF5)");
    try {
      if (h5::get_attr_str(o.f, "format") != kFormat) throw input_error("not a checkpoint of this program");
      if (h5::get_attr_i64(o.f, "format_version") != kFormatVersion)
        throw input_error("format version " + std::to_string(h5::get_attr_i64(o.f, "format_version")) + ", expected " +
                          std::to_string(kFormatVersion));
      o.world = h5::get_attr_i64(o.f, "world_size");
    } catch (const Error& e) {
      throw input_error("checkpoint file '" + p + "': " + e.what());
    }
    return o;
  };
  files.push_back(open_one(first));
  const hid_t f0 = files[0].f;
  const ModelDims& d = L.dims();
  const std::pair<const char*, int64_t> dims[] = {{"n_layer", d.n_layer},           {"n_head", d.n_head},
                                                  {"n_embd", d.n_embd},             {"vocab_size", d.vocab_size},
                                                  {"padded_vocab", d.padded_vocab}, {"max_seq_len", d.max_seq_len}};
  for (auto& [k, v] : dims) {
    const int64_t got = h5::get_attr_i64(f0, k);
    if (got != v)
      throw input_error("checkpoint '" + dir + "' holds a different model: " + k + " is " + std::to_string(got) +
                        " there and " + std::to_string(v) + " in this config");
  }
  for (int r = 1; r < files[0].world; ++r) files.push_back(open_one(rank_file(dir, r)));
  st.step = h5::get_attr_i64(f0, "step");
  st.data.shard = h5::get_attr_i64(f0, "data_shard");
  st.data.offset = h5::get_attr_i64(f0, "data_offset");
  st.data.epoch = h5::get_attr_i64(f0, "data_epoch");
  st.seed = uint64_t(h5::get_attr_i64(f0, "seed"));
  st.config_yaml = h5::get_attr_str(f0, "config_yaml");
  for (auto& o : files)
    if (h5::get_attr_i64(o.f, "step") != st.step)
      throw input_error("checkpoint '" + dir + "' mixes steps: '" + o.path + "' is from another step");
  return files;
}

// Fills out[0, hi-lo) with logical elements [lo, hi) of bucket b's state `kind`, from every old piece
// that overlaps; verifies each piece read against its checksum.
void read_range(std::vector<OldFile>& files, int b, const char* kind, size_t lo, size_t hi, float* out) {
  char g[16];
  std::snprintf(g, sizeof g, "b%04d", b);
  std::vector<float> piece;
  size_t covered = 0;
  for (auto& o : files) {
    if (!h5::exists(o.f, g)) throw input_error("checkpoint file '" + o.path + "' lacks bucket " + g);
    h5::Id grp = h5::open_group(o.f, g);
    const size_t plo = size_t(h5::get_attr_i64(grp, "begin")), phi = size_t(h5::get_attr_i64(grp, "end"));
    const size_t a = std::max(lo, plo), z = std::min(hi, phi);
    if (z <= a) continue;
    std::string name = kind;
    if (!h5::exists(grp, name)) {
      if (name == "master") name = "param";  // written without master weights
      else throw input_error("checkpoint file '" + o.path + "' lacks " + g + "/" + kind);
    }
    piece.resize(phi - plo);
    try {
      h5::read_array(grp, name, H5T_NATIVE_FLOAT, piece.data(), piece.size());
    } catch (const Error& e) {
      throw input_error("checkpoint file '" + o.path + "' " + g + "/" + name + ": " + e.what());
    }
    h5::Id ds(H5_CHECK(H5Dopen2(grp, name.c_str(), H5P_DEFAULT)));
    if (h5::get_attr_i64(ds, "checksum") != checksum(piece.data(), piece.size()))
      throw input_error("checkpoint file '" + o.path + "' " + g + "/" + name + ": checksum mismatch (corrupt data)");
    std::copy(piece.begin() + (a - plo), piece.begin() + (z - plo), out + (a - lo));
    covered += z - a;
  }
  if (covered != hi - lo)
    throw input_error("checkpoint pieces of bucket " + std::string(g) + " do not cover elements [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

}  // namespace

void save_checkpoint(const std::string& run_dir, const TrainState& st, ZeroEngine& e, const ParamLayout& L,
                     HostComm& host, int keep_last) {
  const std::string root = run_dir + "/checkpoints";
  const std::string name = step_name(st.step), tmp = root + "/" + name + ".tmp", final_dir = root + "/" + name;
  std::string err;
  if (host.rank() == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec)) err = "cannot create '" + tmp + "': " + ec.message();
  }
  if (host.max(err.empty() ? 0 : 1)) throw Error(kExitFailure, "checkpoint: " + (err.empty() ? "rank 0 failed to prepare " + tmp : err));
  try {
    write_rank_file(rank_file(tmp, host.rank()), st, e, L, host.rank(), host.world());
  } catch (const Error& ex) {
    err = ex.what();
  }
  if (host.max(err.empty() ? 0 : 1))
    throw Error(kExitFailure, "checkpoint write failed" + (err.empty() ? std::string(" on another rank") : ": " + err));
  if (host.rank() == 0) {
    fsync_path(tmp);
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(tmp, final_dir);
    fsync_path(root);
    {
      std::ofstream out(root + "/latest.tmp", std::ios::trunc);
      out << name << "\n";
      if (!out.flush()) throw Error(kExitFailure, "cannot write '" + root + "/latest.tmp'");
    }
    fsync_path(root + "/latest.tmp");
    fs::rename(root + "/latest.tmp", root + "/latest");
    fsync_path(root);
    auto all = list_checkpoints(run_dir);
    for (size_t i = size_t(keep_last); i < all.size(); ++i) fs::remove_all(all[i], ec);
  }
  host.barrier();
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> out;
  const std::string root = run_dir + "/checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (auto& ent : fs::directory_iterator(root, ec)) {
    const std::string n = ent.path().filename().string();
    if (ent.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos)
      out.push_back(ent.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

TrainState load_checkpoint(const std::string& dir, ZeroEngine& e, const ParamLayout& L, HostComm& host) {
  TrainState st;
  std::vector<OldFile> files;
  std::string err;
  try {
    files = open_checkpoint(dir, L, st);
  } catch (const Error& ex) {
    err = ex.what();
  }
  if (host.max(err.empty() ? 0 : 1)) throw input_error(err.empty() ? "checkpoint '" + dir + "' failed on another rank" : err);
  std::vector<float> buf;
  for (int b = 0; b < L.n_buckets(); ++b) {
    const size_t lo = e.piece_begin(b), hi = e.piece_end(b);
    buf.resize(hi - lo);
    for (int k = 0; k < 4; ++k) {
      if (kStates[k] == ZeroEngine::State::master && !e.has_master()) continue;
      try {
        if (hi > lo) read_range(files, b, kKinds[k], lo, hi, buf.data());
      } catch (const Error& ex) {
        err = ex.what();
      }
      if (host.max(err.empty() ? 0 : 1))
        throw input_error(err.empty() ? "checkpoint '" + dir + "' failed to load on another rank" : err);
      e.set_piece(b, kStates[k], buf.data());
    }
  }
  return st;
}

bool load_latest_checkpoint(const std::string& run_dir, ZeroEngine& e, const ParamLayout& L, HostComm& host,
                            TrainState& out) {
  auto all = list_checkpoints(run_dir);
  // the `latest` pointer first, then every other complete checkpoint, newest first
  std::ifstream in(run_dir + "/checkpoints/latest");
  std::string latest;
  if (in >> latest) {
    const std::string p = run_dir + "/checkpoints/" + latest;
    auto it = std::find(all.begin(), all.end(), p);
    if (it != all.end()) std::rotate(all.begin(), it, it + 1);
  }
  if (all.empty()) {
    if (host.rank() == 0) std::cout << "no checkpoint in " << run_dir << "/checkpoints: starting from scratch\n";
    return false;
  }
  std::string reasons;
  for (auto& dir : all) {
    try {
      out = load_checkpoint(dir, e, L, host);
      return true;
    } catch (const Error& ex) {
      if (ex.code() != kExitBadInput) throw;
      if (host.rank() == 0)
        std::cerr << "warning: checkpoint '" << dir << "' is unusable (" << ex.what()
                  << "); falling back to the previous one\n";
      reasons += "\n  " + dir + ": " + ex.what();
    }
  }
  throw input_error("no usable checkpoint in " + run_dir + "/checkpoints:" + reasons);
}

std::vector<float> read_checkpoint_params(const std::string& dir, const ParamLayout& L) {
  TrainState st;
  auto files = open_checkpoint(dir, L, st);
  std::vector<float> out(L.total(), 0.0f);
  for (int b = 0; b < L.n_buckets(); ++b)
    read_range(files, b, "param", 0, L.bucket(b).size, out.data() + L.logical_offset(b));
  return out;
}

std::string read_checkpoint_config(const std::string& dir) {
  const std::string p = rank_file(dir, 0);
  h5::silence_errors();
  h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) throw input_error("checkpoint file '" + p + "' is missing or unreadable");
  return h5::get_attr_str(f, "config_yaml");
}

}  // namespace gpt
