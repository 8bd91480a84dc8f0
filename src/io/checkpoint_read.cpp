// Reading checkpoints: the MANIFEST, each rank file's structure checked and opened with HDF5 on the main
// thread, then the datasets' bytes read once with pread on several threads at the offsets HDF5 gives
// (contiguous datasets), every range checked against its hash as it arrives, a batch of buckets read
// ahead while the previous one goes into the engine.
#include <algorithm>
#include <array>
#include <filesystem>
#include <future>
#include <iostream>
#include <limits>
#include <memory>

#include "io/checkpoint.hpp"
#include "io/checkpoint_fp8.hpp"
#include "io/h5util.hpp"

namespace fs = std::filesystem;

namespace gpt {
namespace {

// The batches read ahead of the engine: a quarter of what is read, at most this much (two batches in
// memory at once), so that reading overlaps with filling the engine for any size of checkpoint.
constexpr size_t kMaxBatchBytes = size_t(1) << 30;

// One old rank file, checked against the MANIFEST and opened.
struct OldFile {
  std::string path;
  h5::Id f;
  int64_t world = 0;
  int64_t version = 0;                  // format_version: 4 or 3, or 2 (MANIFEST 1, checksum attributes)
  const FileDigest* digest = nullptr;   // its MANIFEST entry
};

struct OldCheckpoint {
  std::string dir;
  Manifest manifest;
  std::vector<OldFile> files;
  std::string other_model;  // "\n  model.KEY was A and is B now" for each dimension that differs
};

// MANIFEST 1: the whole files, shared by the processes (every `stride`-th from `first`), before any is opened.
Manifest read_and_share_checks(const std::string& dir, int first, int stride, int threads) {
  if (!fs::is_directory(dir)) throw input_error("checkpoint '" + dir + "' does not exist");
  Manifest m = read_manifest(dir);
  if (m.version == 1)
    for (size_t i = size_t(first); i < m.files.size(); i += size_t(stride)) verify_file(dir, m.files[i], 1, threads);
  return m;
}

// Opens one rank file: with MANIFEST 2 its structure is checked first (MANIFEST 1: checked whole already).
OldFile open_one(const OldCheckpoint& c, const std::string& p, int threads) {
  const std::string name = fs::path(p).filename().string();
  const FileDigest* d = c.manifest.find(name);
  if (!d) throw input_error("checkpoint '" + c.dir + "' is incomplete: its MANIFEST does not list '" + p + "'");
  if (c.manifest.version >= 2) verify_file(c.dir, *d, c.manifest.version, threads);
  else if (!fs::exists(p)) throw input_error("checkpoint '" + c.dir + "' is incomplete: '" + p + "' is missing");
  OldFile o;
  o.path = p;
  o.digest = d;
  o.f = h5::Id(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!o.f.valid()) throw input_error("checkpoint file '" + p + "' is unreadable (truncated or not HDF5)");
  try {
    if (h5::get_attr_str(o.f, "format") != kCheckpointFormat) throw input_error("not a checkpoint of this program");
    o.version = h5::get_attr_i64(o.f, "format_version");
    const bool known = c.manifest.version == 1 ? o.version == 2 : o.version == 3 || o.version == kCheckpointVersion;
    if (!known)
      throw input_error("format version " + std::to_string(o.version) + " with a MANIFEST of version " +
                        std::to_string(c.manifest.version) + ", expected " +
                        (c.manifest.version == 1 ? std::string("2") : "3 or " + std::to_string(kCheckpointVersion)) +
                        " (this program reads versions 2 to " + std::to_string(kCheckpointVersion) +
                        "; version 1 checkpoints are not read)");
    o.world = h5::get_attr_i64(o.f, "world_size");
  } catch (const Error& e) {
    throw input_error("checkpoint file '" + p + "': " + e.what());
  }
  return o;
}

void open_checkpoint(OldCheckpoint& c, const ParamLayout& L, TrainState& st, int threads) {
  h5::silence_errors();  // a damaged file gets one named error from here, not HDF5's stack on stderr
  c.files.push_back(open_one(c, rank_file(c.dir, 0), threads));
  const hid_t f0 = c.files[0].f;
  // Another model is told apart from damage (the MANIFEST has checked these bytes): the keys that differ
  // are named for the caller, which refuses to resume (ResumeMismatch) rather than fall back.
  const ModelDims& d = L.dims();
  c.other_model.clear();
  bool vocab_differs = false;
  for (const SpecAttr& a : spec_attrs(d)) {
    const int64_t got = a.absent >= 0 && H5Aexists(f0, a.name) <= 0 ? a.absent : h5::get_attr_i64(f0, a.name);
    if (got == a.value) continue;
    const std::string k = a.name;
    if (k == "vocab_size") vocab_differs = true;
    if (k == "padded_vocab" && vocab_differs) continue;
    const std::string key = k == "padded_vocab" ? "the padded vocabulary (model.vocab_size rounded up)" : "model." + k;
    c.other_model += "\n  " + key + " was " + a.text(got) + " and is " + a.text(a.value) + " now";
  }
  // each bucket's tensors by name (absent from checkpoints written before they were recorded): a parameter
  // table that changed under the same dimensions is another model too
  if (c.other_model.empty() && h5::get_attr_i64(f0, "n_buckets") == L.n_buckets())
    for (int b = 0; b < L.n_buckets(); ++b) {
      char g[16];
      std::snprintf(g, sizeof g, "b%04d", b);
      if (!h5::exists(f0, g)) break;  // damage: named where the bucket is read
      h5::Id grp = h5::open_group(f0, g);
      if (H5Aexists(grp, "tensors") <= 0) break;
      const std::string was = h5::get_attr_str(grp, "tensors"), now = tensor_names(L.bucket(b));
      if (was != now)
        c.other_model += std::string("\n  bucket ") + g + " held \"" + was + "\" and holds \"" + now + "\" now";
    }
  st.step = h5::get_attr_i64(f0, "step");
  if (!c.other_model.empty()) return;
  for (int r = 1; r < c.files[0].world; ++r) c.files.push_back(open_one(c, rank_file(c.dir, r), threads));
  st.data.shard = h5::get_attr_i64(f0, "data_shard");
  st.data.offset = h5::get_attr_i64(f0, "data_offset");
  st.data.epoch = h5::get_attr_i64(f0, "data_epoch");
  // absent from checkpoints written before data.shuffle existed, which read in file order
  st.data.shuffled = H5Aexists(f0, "data_shuffle") > 0 && h5::get_attr_i64(f0, "data_shuffle") != 0;
  st.seed = uint64_t(h5::get_attr_i64(f0, "seed"));
  st.config_yaml = h5::get_attr_str(f0, "config_yaml");
  // absent from checkpoints written before the data files were recorded
  st.data_files = H5Aexists(f0, "data_files") > 0 ? h5::get_attr_str(f0, "data_files") : std::string();
  st.fp8 = read_fp8_state(f0, int(h5::get_attr_i64(f0, "n_layer")), "checkpoint '" + c.dir + "'");  // fp8 only
  st.world = c.files[0].world;
  // absent from checkpoints written before the precision was recorded
  st.precision.clear();
  for (const char* name : kPrecisionAttrs)
    if (H5Aexists(f0, name) > 0) st.precision.push_back({name, h5::get_attr_str(f0, name)});
  for (auto& o : c.files)
    if (h5::get_attr_i64(o.f, "step") != st.step)
      throw input_error("checkpoint '" + c.dir + "' mixes steps: '" + o.path + "' is from another step");
}

// "cannot resume ...: it holds another model" with the keys that differ
std::string other_model_text(const OldCheckpoint& c, int64_t step) {
  return "cannot resume from the checkpoint of step " + std::to_string(step) + " ('" + c.dir +
         "'): it holds another model; settings that may not change on resume differ (docs/FORMATS.md)" + c.other_model;
}

// What a bucket dataset holds: values (fp32), an int8 slot's codes (uint8, one per element), or its
// blocks' scales (fp32, one per optim::kQuantBlock elements; dataset "<slot>.scales").
enum class Held { values, codes, scales };
size_t held_size(Held h) { return h == Held::codes ? 1 : sizeof(float); }
size_t held_per(Held h) { return h == Held::scales ? size_t(optim::kQuantBlock) : 1; }  // elements a unit covers

// Where a contiguous dataset of n units of `h` lies in its file; input_error naming it otherwise.
uint64_t dataset_offset(hid_t ds, size_t n, Held h, const std::string& what) {
  h5::Id dcpl(H5Dget_create_plist(ds)), type(H5Dget_type(ds)), space(H5Dget_space(ds));
  hsize_t dim = 0;
  const bool ok = dcpl.valid() && type.valid() && space.valid() && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
                  H5Tequal(type, h == Held::codes ? H5T_STD_U8LE : H5T_IEEE_F32LE) > 0 &&
                  H5Sget_simple_extent_ndims(space) == 1 && H5Sget_simple_extent_dims(space, &dim, nullptr) == 1 &&
                  dim == n && H5Dget_storage_size(ds) == hsize_t(n) * held_size(h);
  const haddr_t off = ok ? H5Dget_offset(ds) : HADDR_UNDEF;
  if (off == HADDR_UNDEF)
    throw input_error(what + ": not a contiguous " + (h == Held::codes ? "uint8" : "fp32") + " dataset of " +
                      std::to_string(n) + " elements (damaged?)");
  return uint64_t(off);
}

// Covered element ranges, sorted and disjoint. take() returns the parts of [x, y) not covered yet and
// covers them.
struct Cover {
  std::vector<std::pair<size_t, size_t>> have;
  std::vector<std::pair<size_t, size_t>> take(size_t x, size_t y) {
    std::vector<std::pair<size_t, size_t>> out;
    size_t at = x;
    for (const auto& [s, t] : have) {
      if (t <= at) continue;
      if (s >= y) break;
      if (s > at) out.emplace_back(at, std::min(s, y));
      at = std::max(at, t);
    }
    if (at < y) out.emplace_back(at, y);
    have.insert(have.end(), out.begin(), out.end());
    std::sort(have.begin(), have.end());
    std::vector<std::pair<size_t, size_t>> merged;
    for (const auto& r : have)
      if (!merged.empty() && merged.back().second >= r.first) merged.back().second = std::max(merged.back().second, r.second);
      else merged.push_back(r);
    have = std::move(merged);
    return out;
  }
};

// The reads that fill `out` with units [lo, hi) of bucket b's dataset `kind` holding `h` (units: elements,
// or for scales blocks), from every old piece that covers some of them (each unit from the first that does).
// An int8 slot's codes must be in the code `code` names ("signed" or "unsigned").
std::vector<ReadJob> plan_range(const OldCheckpoint& c, int b, size_t bucket_size, const std::string& kind, size_t lo,
                                size_t hi, void* out, Held h = Held::values, const char* code = nullptr) {
  const size_t es = held_size(h), per = held_per(h);
  char g[16];
  std::snprintf(g, sizeof g, "b%04d", b);
  std::vector<ReadJob> jobs;
  Cover cover;
  for (const OldFile& o : c.files) {
    if (!h5::exists(o.f, g)) throw input_error("checkpoint file '" + o.path + "' lacks bucket " + g);
    h5::Id grp = h5::open_group(o.f, g);
    const int64_t plo_i = h5::get_attr_i64(grp, "begin"), phi_i = h5::get_attr_i64(grp, "end");
    const int64_t size_i = h5::get_attr_i64(grp, "bucket_size");
    if (size_i != int64_t(bucket_size) || plo_i < 0 || phi_i < plo_i || phi_i > size_i)
      throw input_error("checkpoint file '" + o.path + "' " + g + ": piece [" + std::to_string(plo_i) + ", " +
                        std::to_string(phi_i) + ") of a bucket of " + std::to_string(size_i) + " elements (expected " +
                        std::to_string(bucket_size) + ")");
    if (phi_i == plo_i) continue;  // an empty piece (it may start anywhere)
    if (plo_i % int64_t(per))
      throw input_error("checkpoint file '" + o.path + "' " + g + ": a piece of int8 state from element " +
                        std::to_string(plo_i) + ", within a quantization block (damaged?)");
    const size_t plo = size_t(plo_i) / per, phi = (size_t(phi_i) + per - 1) / per;  // in units
    const size_t a = std::max(lo, plo), z = std::min(hi, phi);
    if (z <= a) continue;
    std::string name = kind;
    if (!h5::exists(grp, name)) {
      if (name == "master") name = "param";  // written without master weights
      else throw input_error("checkpoint file '" + o.path + "' lacks " + g + "/" + kind);
    }
    const std::string what = "checkpoint file '" + o.path + "' " + g + "/" + name;
    h5::Id ds(H5Dopen2(grp, name.c_str(), H5P_DEFAULT));
    if (!ds.valid()) throw input_error(what + ": unreadable");
    if (code) {
      const bool same = H5Aexists(ds, "code") > 0 && h5::get_attr_str(ds, "code") == code &&
                        H5Aexists(ds, "block_size") > 0 && h5::get_attr_i64(ds, "block_size") == optim::kQuantBlock;
      if (!same)
        throw input_error(what + ": int8 codes other than this program's (" + code + ", blocks of " +
                          std::to_string(optim::kQuantBlock) + ")");
    }
    const uint64_t at = dataset_offset(ds, phi - plo, h, what), bytes = uint64_t(phi - plo) * es;
    // the extents that hold the piece: [e0, e1) of its elements, each hashed whole; MANIFEST 1 files hash
    // the whole dataset (its checksum attribute)
    std::vector<std::array<uint64_t, 3>> parts;  // first element, end element, hash
    if (o.version == 2) {
      parts.push_back({plo, phi, uint64_t(h5::get_attr_i64(ds, "checksum"))});
    } else {
      const std::vector<Extent>& ex = o.digest->extents;
      auto it = std::lower_bound(ex.begin(), ex.end(), at, [](const Extent& e, uint64_t v) { return e.offset < v; });
      for (uint64_t done = 0; done < bytes; ++it) {
        if (it == ex.end() || !it->data || it->offset != at + done || it->bytes % es || done + it->bytes > bytes)
          throw input_error(what + ": its bytes do not match the extents its MANIFEST lists (damaged)");
        parts.push_back({plo + done / es, plo + (done + it->bytes) / es, it->xxh3});
        done += it->bytes;
      }
    }
    for (const auto& [e0, e1, hash] : parts) {
      const size_t x = std::max<size_t>(a, e0), y = std::min<size_t>(z, e1);
      if (x >= y) continue;
      for (const auto& [s, t] : cover.take(x, y))  // the elements of this extent still wanted
        jobs.push_back({&o.path, at + (e0 - plo) * es, (e1 - e0) * es, hash, static_cast<char*>(out) + (s - lo) * es,
                        (s - e0) * es, (t - s) * es, what});
    }
  }
  if (!(cover.have.size() == 1 && cover.have[0] == std::make_pair(lo, hi)) && hi > lo)
    throw input_error("checkpoint pieces of bucket " + std::string(g) + " do not cover elements [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + ")");
  return jobs;
}

// whatever a damaged file provokes is an input error, and every rank learns of it
template <class Fn>
auto as_input(Fn fn) {
  return [fn] {
    try {
      fn();
    } catch (const std::exception& ex) {
      throw input_error(ex.what());
    }
  };
}

}  // namespace

TrainState load_checkpoint(const std::string& dir, ShardedState& e, const ParamLayout& L, HostComm& host,
                           const AcceptCheckpoint& accept, int threads) {
  TrainState st;
  OldCheckpoint c;
  c.dir = dir;
  agreed(host, "checkpoint '" + dir + "'",
         as_input([&] { c.manifest = read_and_share_checks(dir, host.rank(), host.world(), threads); }));
  agreed(host, "checkpoint '" + dir + "'", as_input([&] { open_checkpoint(c, L, st, threads); }));
  // every rank read the same rank 0 file: the same verdict
  if (!c.other_model.empty()) throw ResumeMismatch(kExitBadInput, other_model_text(c, st.step));
  if (accept) accept(st);  // the same config and files on every rank: the same verdict
  // What goes into the engine, in its order: (bucket, state) slots, grouped into batches read one ahead.
  // An int8 slot of a version 4 checkpoint goes back as its codes and scales (an older one's values are
  // quantized again, as a step does).
  struct Slot {
    int b, k;
    size_t lo, hi, at;  // this rank's elements [lo, hi) of the bucket; at: where in its batch's buffer
    bool codes;         // int8 codes then scales (byte hi - lo on), as set_piece_codes takes them
    size_t floats() const { return codes ? (optim::state_bytes(optim::StateType::Int8, hi - lo) + 3) / 4 : hi - lo; }
  };
  std::vector<Slot> slots;
  size_t total = 0;
  for (int b = 0; b < L.n_buckets(); ++b)
    for (int k = 0; k < int(e.state_names().size()); ++k) {
      if (!e.holds(k)) continue;
      slots.push_back({b, k, e.piece_begin(b), e.piece_end(b), 0, e.state_code(k) && c.files[0].version >= 4});
      total += slots.back().floats();
    }
  const size_t budget = std::clamp<size_t>(total / 4, 1, kMaxBatchBytes / sizeof(float));
  std::vector<size_t> batch_start{0};
  size_t fill = 0, cap = 1;  // floats: this batch's so far, the largest batch's
  for (size_t i = 0; i < slots.size(); ++i) {
    const size_t n = slots[i].floats();
    if (fill > 0 && fill + n > budget) {
      batch_start.push_back(i);
      fill = 0;
    }
    slots[i].at = fill;
    fill += n;
    cap = std::max(cap, fill);
  }
  batch_start.push_back(slots.size());
  const size_t n_batches = batch_start.size() - 1;
  struct Batch {
    std::unique_ptr<float[]> buf;
    std::vector<ReadJob> jobs;
    std::string err;  // this rank's failure planning or reading it
    std::future<void> read;
  };
  std::array<Batch, 2> bt;
  for (size_t j = 0; j < std::min<size_t>(2, n_batches); ++j) bt[j].buf.reset(new float[cap]);
  // planned on this thread (HDF5), read on another while the previous batch goes into the engine
  auto start = [&](size_t j) {
    Batch& x = bt[j % 2];
    x.jobs.clear();
    x.err.clear();
    try {
      for (size_t i = batch_start[j]; i < batch_start[j + 1]; ++i) {
        const Slot& s = slots[i];
        // Without master weights of its own, the engine takes its parameters from the checkpoint's master
        // weights when it has them (fp32, where "param" may be rounded to bf16); plan_range falls back to param.
        const std::string& kind = s.k == ShardedState::kParam && !e.has_master() ? e.state_names()[ShardedState::kMaster]
                                                                               : e.state_names()[size_t(s.k)];
        if (s.hi == s.lo) continue;
        const size_t size = L.bucket(s.b).size;
        float* at = x.buf.get() + s.at;
        std::vector<ReadJob> j2;
        if (s.codes) {
          j2 = plan_range(c, s.b, size, kind, s.lo, s.hi, at, Held::codes, optim::code_name(*e.state_code(s.k)));
          std::vector<ReadJob> j3 = plan_range(c, s.b, size, kind + kScalesSuffix, s.lo / optim::kQuantBlock,
                                               s.lo / optim::kQuantBlock + optim::quant_blocks(s.hi - s.lo),
                                               reinterpret_cast<char*>(at) + (s.hi - s.lo), Held::scales);
          j2.insert(j2.end(), std::make_move_iterator(j3.begin()), std::make_move_iterator(j3.end()));
        } else {
          j2 = plan_range(c, s.b, size, kind, s.lo, s.hi, at);
        }
        x.jobs.insert(x.jobs.end(), std::make_move_iterator(j2.begin()), std::make_move_iterator(j2.end()));
      }
      x.read = std::async(std::launch::async, [&x, threads] { read_checked(x.jobs, threads); });
    } catch (const std::exception& ex) {
      x.err = ex.what();
    }
  };
  start(0);
  for (size_t j = 0; j < n_batches; ++j) {
    Batch& x = bt[j % 2];
    if (x.read.valid()) {
      try {
        x.read.get();
      } catch (const std::exception& ex) {
        x.err = ex.what();
      }
    }
    if (j + 1 < n_batches) start(j + 1);
    for (size_t i = batch_start[j]; i < batch_start[j + 1]; ++i) {
      // every rank learns what the one that failed found (each reads its own files)
      const std::string err = shared_message(host, i == batch_start[j] ? x.err : std::string());
      if (!err.empty()) throw AgreedError(kExitBadInput, err);
      const Slot& s = slots[i];
      if (s.codes) e.set_piece_codes(s.b, s.k, x.buf.get() + s.at);
      else e.set_piece(s.b, s.k, x.buf.get() + s.at);
    }
  }
  return st;
}

bool load_latest_checkpoint(const std::string& run_dir, ShardedState& e, const ParamLayout& L, HostComm& host,
                            TrainState& out, const AcceptCheckpoint& accept, int threads) {
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
      out = load_checkpoint(dir, e, L, host, accept, threads);
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

std::vector<float> read_checkpoint_params(const std::string& dir, const ParamLayout& L, int threads) {
  OldCheckpoint c;
  c.dir = dir;
  c.manifest = read_and_share_checks(dir, 0, 1, threads);
  TrainState st;
  open_checkpoint(c, L, st, threads);
  if (!c.other_model.empty()) throw input_error(other_model_text(c, st.step));
  std::vector<float> out(L.total(), 0.0f);
  std::vector<ReadJob> jobs;
  for (int b = 0; b < L.n_buckets(); ++b) {
    std::vector<ReadJob> j = plan_range(c, b, L.bucket(b).size, "master", 0, L.bucket(b).size,
                                        out.data() + L.logical_offset(b));
    jobs.insert(jobs.end(), std::make_move_iterator(j.begin()), std::make_move_iterator(j.end()));
  }
  try {
    read_checked(jobs, threads);
  } catch (const Error& e) {
    if (e.code() == kExitBadInput) throw;
    throw input_error(e.what());
  }
  return out;
}

TrainState read_checkpoint_state(const std::string& dir, const ParamLayout& L, int threads) {
  OldCheckpoint c;
  c.dir = dir;
  TrainState st;
  as_input([&] {
    c.manifest = read_and_share_checks(dir, 0, 1, threads);
    open_checkpoint(c, L, st, threads);
  })();
  if (!c.other_model.empty()) throw ResumeMismatch(kExitBadInput, other_model_text(c, st.step));
  return st;
}

std::string read_checkpoint_config(const std::string& dir) {
  const std::string p = rank_file(dir, 0);
  h5::silence_errors();
  if (!fs::exists(p)) throw input_error("checkpoint '" + dir + "' is incomplete or not a checkpoint: '" + p + "' is missing");
  const Manifest m = read_manifest(dir);
  const FileDigest* d = m.find(fs::path(p).filename().string());
  if (!d) throw input_error("checkpoint '" + dir + "' is incomplete: its MANIFEST does not list '" + p + "'");
  verify_file(dir, *d, m.version, 4);  // rank 0's file only (MANIFEST 2: its structure)
  h5::Id f(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) throw input_error("checkpoint file '" + p + "' is unreadable (truncated or not HDF5)");
  try {
    return h5::get_attr_str(f, "config_yaml");
  } catch (const Error& e) {
    throw input_error("checkpoint file '" + p + "': " + e.what());
  }
}

}  // namespace gpt
