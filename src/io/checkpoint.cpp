#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include <xxhash.h>

#include "io/h5util.hpp"
#include "io/manifest.hpp"
#include "io/raw_io.hpp"
#include "io/run_dir.hpp"

namespace fs = std::filesystem;

namespace gpt {
namespace {

constexpr const char* kFormat = kCheckpointFormat;
constexpr int64_t kFormatVersion = kCheckpointVersion;
const char* const* kKinds = kStateNames;
const ZeroEngine::State kStates[] = {ZeroEngine::State::param, ZeroEngine::State::master, ZeroEngine::State::m,
                                     ZeroEngine::State::v};

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
// The step of a complete checkpoint folder's name (step_ and digits only), or -1.
int64_t step_of(const std::string& n) {
  if (n.size() <= 5 || n.compare(0, 5, "step_") != 0 || n.size() > 5 + 18) return -1;
  for (size_t i = 5; i < n.size(); ++i)
    if (n[i] < '0' || n[i] > '9') return -1;
  return std::stoll(n.substr(5));
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Deletes a checkpoint folder so that a kill part-way never leaves a partial folder under a complete
// one's name: renamed out of the way first, then removed.
void discard(const std::string& dir) {
  const std::string gone = dir + ".deleting";
  fs::remove_all(gone);
  fs::rename(dir, gone);
  fs::remove_all(gone);
}

}  // namespace

std::string rank_file(const std::string& dir, int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/rank_%05d.h5", r);
  return dir + buf;
}

namespace {

// One old rank file, opened and checked.
struct OldFile {
  std::string path;
  h5::Id f;
  int64_t world = 0;
  int64_t version = 0;  // format_version
};

// Checks the rank files this process is given (every `stride`-th from `first`) against the MANIFEST, before
// anything parses them.
void verify_checkpoint(const std::string& dir, int first, int stride) {
  if (!fs::is_directory(dir)) throw input_error("checkpoint '" + dir + "' does not exist");
  const std::vector<FileDigest> files = read_manifest(dir);
  for (size_t i = size_t(first); i < files.size(); i += size_t(stride)) verify_file(dir, files[i]);
}

std::vector<OldFile> open_checkpoint(const std::string& dir, const ParamLayout& L, TrainState& st) {
  std::vector<OldFile> files;
  h5::silence_errors();  // a damaged file gets one named error from here, not HDF5's stack on stderr
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
      o.version = h5::get_attr_i64(o.f, "format_version");
      if (o.version != kFormatVersion)  // 1 had FNV-1a checksums and is not read
        throw input_error("format version " + std::to_string(o.version) + ", expected " +
                          std::to_string(kFormatVersion) + " (version 1 checkpoints are not read)");
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
  // absent from checkpoints written before data.shuffle existed, which read in file order
  st.data.shuffled = H5Aexists(f0, "data_shuffle") > 0 && h5::get_attr_i64(f0, "data_shuffle") != 0;
  st.seed = uint64_t(h5::get_attr_i64(f0, "seed"));
  st.config_yaml = h5::get_attr_str(f0, "config_yaml");
  st.fp8.clear();
  if (h5::exists(f0, "fp8_state")) {  // precision fp8 only
    st.fp8.resize(h5::array_length(f0, "fp8_state"));
    h5::read_array(f0, "fp8_state", H5T_NATIVE_FLOAT, st.fp8.data(), st.fp8.size());
    h5::Id ds(H5_CHECK(H5Dopen2(f0, "fp8_state", H5P_DEFAULT)));
    if (uint64_t(h5::get_attr_i64(ds, "checksum")) != xxh3(st.fp8.data(), st.fp8.size() * sizeof(float)))
      throw input_error("checkpoint '" + dir + "': its FP8 state fails its checksum (the file is corrupt)");
  }
  st.world = files[0].world;
  for (auto& o : files)
    if (h5::get_attr_i64(o.f, "step") != st.step)
      throw input_error("checkpoint '" + dir + "' mixes steps: '" + o.path + "' is from another step");
  return files;
}

// Fills out[0, hi-lo) with logical elements [lo, hi) of bucket b's state `kind`, from every old piece
// that overlaps; verifies each piece read against its checksum.
void read_range(std::vector<OldFile>& files, int b, size_t bucket_size, const char* kind, size_t lo, size_t hi,
                float* out) {
  char g[16];
  std::snprintf(g, sizeof g, "b%04d", b);
  std::vector<float> piece;
  std::vector<char> seen(hi - lo, 0);  // pieces may overlap (they hold equal values); every element once at least
  for (auto& o : files) {
    if (!h5::exists(o.f, g)) throw input_error("checkpoint file '" + o.path + "' lacks bucket " + g);
    h5::Id grp = h5::open_group(o.f, g);
    const int64_t plo_i = h5::get_attr_i64(grp, "begin"), phi_i = h5::get_attr_i64(grp, "end");
    const int64_t size_i = h5::get_attr_i64(grp, "bucket_size");
    if (size_i != int64_t(bucket_size) || plo_i < 0 || phi_i < plo_i || phi_i > size_i)
      throw input_error("checkpoint file '" + o.path + "' " + g + ": piece [" + std::to_string(plo_i) + ", " +
                        std::to_string(phi_i) + ") of a bucket of " + std::to_string(size_i) + " elements (expected " +
                        std::to_string(bucket_size) + ")");
    const size_t plo = size_t(plo_i), phi = size_t(phi_i);
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
    const int64_t sum = int64_t(xxh3(piece.data(), piece.size() * sizeof(float)));
    if (h5::get_attr_i64(ds, "checksum") != sum)
      throw input_error("checkpoint file '" + o.path + "' " + g + "/" + name + ": checksum mismatch (corrupt data)");
    std::copy(piece.begin() + (a - plo), piece.begin() + (z - plo), out + (a - lo));
    std::fill(seen.begin() + (a - lo), seen.begin() + (z - lo), 1);
  }
  if (std::find(seen.begin(), seen.end(), 0) != seen.end())
    throw input_error("checkpoint pieces of bucket " + std::string(g) + " do not cover elements [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

}  // namespace

std::string checkpoint_dir(const std::string& run_dir, int64_t step) {
  return run_dir + "/checkpoints/" + step_name(step);
}

// Every rank's file digest, gathered on rank 0 (rank r broadcasts its own).
std::vector<FileDigest> gather_digests(const FileDigest& mine, HostComm& host) {
  std::vector<FileDigest> all(host.world());
  for (int r = 0; r < host.world(); ++r) {
    uint64_t v[2] = {mine.size, mine.xxh3};
    host.broadcast(v, sizeof v, r);
    all[r] = {fs::path(rank_file("", r)).filename().string(), v[0], v[1]};
  }
  return all;
}

namespace {
// The folder of a finished step goes public: renamed from .tmp, `latest` pointed at it, then the
// checkpoints beyond keep_last and any leftovers removed (only now that the new one is durable).
void publish(const std::string& run_dir, const std::string& tmp, int64_t step, int keep_last) {
  const std::string root = run_dir + "/checkpoints", final_dir = checkpoint_dir(run_dir, step);
  fsync_path(tmp);
  if (fs::exists(final_dir)) discard(final_dir);
  fs::rename(tmp, final_dir);
  fsync_path(root);
  {
    std::ofstream out(root + "/latest.tmp", std::ios::trunc);
    out << step_name(step) << "\n";
    if (!out.flush()) throw Error(kExitFailure, "cannot write '" + root + "/latest.tmp'");
  }
  fsync_path(root + "/latest.tmp");
  fs::rename(root + "/latest.tmp", root + "/latest");
  fsync_path(root);
  // Keep the newest keep_last up to this step. Newer ones are left from a timeline this run abandoned
  // (it resumed past them because they were damaged): drop them too, so they neither displace good
  // checkpoints from the count nor get tried first by the next resume.
  size_t kept = 0;
  for (const std::string& p : list_checkpoints(run_dir))
    if (step_of(fs::path(p).filename().string()) > step || ++kept > size_t(keep_last)) discard(p);
  // leftovers of writes or deletions that a killed process did not finish
  for (auto& ent : fs::directory_iterator(root)) {
    const std::string n = ent.path().filename().string();
    if (n.rfind("step_", 0) == 0 && step_of(n) < 0 && (ends_with(n, ".tmp") || ends_with(n, ".deleting")))
      fs::remove_all(ent.path());
  }
}
}  // namespace

std::string prepare_checkpoint_dir(const std::string& run_dir, int64_t step, HostComm& host) {
  const std::string root = run_dir + "/checkpoints", tmp = checkpoint_dir(run_dir, step) + ".tmp";
  agreed(host, "checkpoint: preparing " + tmp, [&] {
    if (host.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(root, ec);
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec)) throw Error(kExitFailure, "cannot create '" + tmp + "': " + ec.message());
  });
  return tmp;
}

void abandon_checkpoint(const std::string& tmp, HostComm& host) {
  std::error_code ec;
  if (host.rank() == 0) fs::remove_all(tmp, ec);  // a full disk gets its space back; the previous ones stay
}

void publish_checkpoint(const std::string& run_dir, int64_t step, const FileDigest& mine, HostComm& host,
                        int keep_last) {
  const std::string final_dir = checkpoint_dir(run_dir, step), tmp = final_dir + ".tmp";
  const std::vector<FileDigest> digests = gather_digests(mine, host);
  // also the barrier: nobody continues before the checkpoint is published
  agreed(host, "checkpoint: publishing " + final_dir, [&] {
    if (host.rank() != 0) return;
    try {
      write_manifest(tmp, digests);  // last into the folder: one without it is never taken for a checkpoint
      publish(run_dir, tmp, step, keep_last);
    } catch (const std::exception& ex) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw Error(kExitFailure, std::string("publishing checkpoint '") + final_dir + "': " + ex.what() +
                                    full_disk_note(run_dir + "/checkpoints"));
    }
  });
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const std::string root = run_dir + "/checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (auto& ent : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(ent.path().filename().string());
    if (step >= 0 && ent.is_directory(ec)) found.emplace_back(step, ent.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

TrainState load_checkpoint(const std::string& dir, ZeroEngine& e, const ParamLayout& L, HostComm& host,
                           const AcceptCheckpoint& accept) {
  TrainState st;
  std::vector<OldFile> files;
  // whatever a damaged file provokes is an input error, and every rank learns of it
  auto as_input = [](auto fn) {
    return [fn] {
      try {
        fn();
      } catch (const std::exception& ex) {
        throw input_error(ex.what());
      }
    };
  };
  // the ranks share the hashing of the files, and none opens one before all are verified
  agreed(host, "checkpoint '" + dir + "'", as_input([&] { verify_checkpoint(dir, host.rank(), host.world()); }));
  agreed(host, "checkpoint '" + dir + "'", as_input([&] { files = open_checkpoint(dir, L, st); }));
  std::string err;
  if (accept) accept(st);  // the same config and files on every rank: the same verdict
  std::vector<float> buf;
  for (int b = 0; b < L.n_buckets(); ++b) {
    const size_t lo = e.piece_begin(b), hi = e.piece_end(b);
    buf.resize(hi - lo);
    for (int k = 0; k < 4; ++k) {
      if (kStates[k] == ZeroEngine::State::master && !e.has_master()) continue;
      // Without master weights of its own, the engine takes its parameters from the checkpoint's master
      // weights when it has them (fp32, where "param" may be rounded to bf16); read_range falls back to param.
      const char* kind = kStates[k] == ZeroEngine::State::param && !e.has_master() ? "master" : kKinds[k];
      try {
        if (hi > lo) read_range(files, b, L.bucket(b).size, kind, lo, hi, buf.data());
      } catch (const std::exception& ex) {
        err = ex.what();
      }
      if (host.max(err.empty() ? 0 : 1))
        throw AgreedError(kExitBadInput, err.empty() ? "checkpoint '" + dir + "' failed to load on another rank" : err);
      e.set_piece(b, kStates[k], buf.data());
    }
  }
  return st;
}

bool load_latest_checkpoint(const std::string& run_dir, ZeroEngine& e, const ParamLayout& L, HostComm& host,
                            TrainState& out, const AcceptCheckpoint& accept) {
  // Newest first. Every step_NNNNNNNN folder is complete (it is renamed from .tmp only after all ranks
  // wrote and synced their files), so one newer than `latest` (a kill between the rename and the update
  // of `latest`) is as good and loses less work.
  auto all = list_checkpoints(run_dir);
  if (all.empty()) {
    if (host.rank() == 0) std::cout << "no checkpoint in " << run_dir << "/checkpoints: starting from scratch\n";
    return false;
  }
  std::string reasons;
  for (auto& dir : all) {
    try {
      out = load_checkpoint(dir, e, L, host, accept);
      return true;
    } catch (const ResumeMismatch&) {
      throw;
    } catch (const Error& ex) {
      if (ex.code() != kExitBadInput) throw;
      if (host.rank() == 0)
        std::cerr << "warning: checkpoint '" << dir << "' is unusable (" << ex.what()
                  << "); falling back to the previous one\n";
      reasons += "\n  " + dir + ": " + ex.what();
    }
  }
  throw AgreedError(kExitBadInput, "no usable checkpoint in " + run_dir + "/checkpoints:" + reasons);
}

std::vector<float> read_checkpoint_params(const std::string& dir, const ParamLayout& L) {
  verify_checkpoint(dir, 0, 1);
  TrainState st;
  auto files = open_checkpoint(dir, L, st);
  std::vector<float> out(L.total(), 0.0f);
  for (int b = 0; b < L.n_buckets(); ++b)
    read_range(files, b, L.bucket(b).size, "master", 0, L.bucket(b).size, out.data() + L.logical_offset(b));
  return out;
}

std::string read_checkpoint_config(const std::string& dir) {
  const std::string p = rank_file(dir, 0);
  h5::silence_errors();
  if (!fs::exists(p)) throw input_error("checkpoint '" + dir + "' is incomplete or not a checkpoint: '" + p + "' is missing");
  verify_checkpoint(dir, 0, std::numeric_limits<int>::max());  // rank 0's file only
  h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) throw input_error("checkpoint file '" + p + "' is unreadable (truncated or not HDF5)");
  try {
    return h5::get_attr_str(f, "config_yaml");
  } catch (const Error& e) {
    throw input_error("checkpoint file '" + p + "': " + e.what());
  }
}

}  // namespace gpt
