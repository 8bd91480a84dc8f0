#include "io/checkpoint_writer.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "io/checkpoint_fp8.hpp"
#include "io/h5util.hpp"
#include "io/raw_io.hpp"
#include "io/run_dir.hpp"

namespace gpt {

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// The file's structure (attributes, groups, datasets allocated at known offsets, left unwritten) on the
// main thread with HDF5; the datasets' bytes follow from the background with write_regions, their
// hashes go into the MANIFEST. It needs only the snapshot's shape: its copies may still be under way.
std::vector<Region> lay_out_rank_file(const std::string& path, const TrainState& st, const Snapshot::Copies& c,
                                      const ParamLayout& L, int zero_stage, int rank, int world) {
  h5::Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) throw Error(kExitFailure, "cannot create checkpoint file '" + path + "'");
  const ModelDims& d = L.dims();
  const Snapshot& s = c.snapshot();  // its layout: the bytes are read only once the copies have landed
  h5::set_attr(f, "format", std::string(kCheckpointFormat));
  h5::set_attr(f, "format_version", kCheckpointVersion);
  h5::set_attr(f, "step", st.step);
  h5::set_attr(f, "world_size", int64_t(world));
  h5::set_attr(f, "rank", int64_t(rank));
  h5::set_attr(f, "zero_stage", int64_t(zero_stage));
  for (const SpecAttr& a : spec_attrs(d)) h5::set_attr(f, a.name, a.value);  // the model's structure
  h5::set_attr(f, "data_shard", st.data.shard);
  h5::set_attr(f, "data_offset", st.data.offset);
  h5::set_attr(f, "data_epoch", st.data.epoch);
  h5::set_attr(f, "data_shuffle", int64_t(st.data.shuffled));
  h5::set_attr(f, "seed", int64_t(st.seed));
  h5::set_attr(f, "config_yaml", st.config_yaml);
  h5::set_attr(f, "data_files", st.data_files);
  h5::set_attr(f, "n_buckets", int64_t(L.n_buckets()));
  for (const PrecisionAttr& a : st.precision) h5::set_attr(f, a.name, a.value);  // which products were FP8
  // precision fp8: the scales and amax histories by name (the same on every rank; small, through HDF5)
  if (!st.fp8.empty()) write_fp8_state(f, st.fp8);
  // contiguous, placed now, never filled: the bytes land at H5Dget_offset, written by pwrite
  h5::Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  std::vector<Region> regions;
  for (int b = 0; b < L.n_buckets(); ++b) {
    char g[16];
    std::snprintf(g, sizeof g, "b%04d", b);
    h5::Id grp = h5::create_group(f, g);
    h5::set_attr(grp, "begin", int64_t(s.begin(b)));
    h5::set_attr(grp, "end", int64_t(s.end(b)));
    h5::set_attr(grp, "bucket_size", int64_t(L.bucket(b).size));
    h5::set_attr(grp, "tensors", tensor_names(L.bucket(b)));  // what the bucket holds, by name
    for (int k = 0; k < s.n_kinds(); ++k) {
      const size_t i = size_t(b) * s.n_kinds() + size_t(k);
      if (!s.has(i)) continue;
      // a dataset of n values of `type`, placed now; its bytes come from `src` (size bytes each)
      auto place = [&](const std::string& name, hid_t type, hsize_t n, const void* src, size_t size) {
        h5::Id space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
        h5::Id ds(H5_CHECK(H5Dcreate2(grp, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
        h5::set_attr(ds, "units", std::string("1"));  // parameter values and optimizer state are pure numbers
        if (n > 0) {
          const haddr_t off = H5Dget_offset(ds);
          if (off == HADDR_UNDEF) throw Error(kExitFailure, "'" + path + "': HDF5 placed no storage for " + g);
          regions.push_back({uint64_t(off), src, size_t(n) * size});
        }
        return ds;
      };
      const size_t n = s.elems(b);
      if (const optim::Code* code = s.code(i)) {  // int8 state as held: its codes, and its blocks' scales
        h5::Id ds = place(s.kind_name(k), H5T_STD_U8LE, n, c.destination(i), 1);
        h5::set_attr(ds, "code", std::string(optim::code_name(*code)));
        h5::set_attr(ds, "block_size", int64_t(optim::kQuantBlock));
        place(s.kind_name(k) + kScalesSuffix, H5T_IEEE_F32LE, optim::quant_blocks(n),
              reinterpret_cast<const char*>(c.destination(i)) + n, sizeof(float));
      } else {
        place(s.kind_name(k), H5T_IEEE_F32LE, n, c.destination(i), sizeof(float));
      }
    }
  }
  H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
  return regions;
}

CheckpointWriter::CheckpointWriter(std::string run_dir, HostComm& host, int keep_last, int threads)
    : run_dir_(std::move(run_dir)), host_(host), keep_last_(keep_last), threads_(threads),
      snap_(std::make_unique<Snapshot>()) {}

bool CheckpointWriter::reserve(ShardedState& e, const ParamLayout& L) {
  return snap_ && snap_->reserve(e, L, host_.rank(), host_.world());
}

CheckpointWriter::~CheckpointWriter() {
  if (!flight_ || !flight_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> l(flight_->m);
    flight_->wanted = true;  // a late write would otherwise wait for a waiter forever
  }
  flight_->cv.notify_all();
  flight_->thread.join();
}

void CheckpointWriter::start(const TrainState& st, ShardedState& e, const ParamLayout& L,
                             std::function<void()> before_write, bool late) {
  if (flight_) throw Error(kExitFailure, "internal error: a checkpoint started while another is in flight");
  // a write given up (finish with stall_s) ends the run: its snapshot is the stuck thread's
  if (!snap_) throw Error(kExitFailure, "internal error: a checkpoint started after one was given up");
  auto f = std::make_unique<Flight>();
  f->t0 = std::chrono::steady_clock::now();
  f->step = st.step;
  f->before_write = std::move(before_write);
  f->late = late;
  f->tmp = prepare_checkpoint_dir(run_dir_, st.step, host_);
  try {
    agreed(host_, "checkpoint write", [&] {
      try {
        f->copies = snap_->take(e, L, host_.rank(), host_.world());  // queued: the writer thread lands them
        f->regions = lay_out_rank_file(rank_file(f->tmp, host_.rank()), st, f->copies, L, e.zero_stage(),
                                       host_.rank(), host_.world());
      } catch (const std::exception& ex) {
        throw Error(kExitFailure, std::string("checkpoint write failed: ") + ex.what() + full_disk_note(f->tmp));
      }
    });
  } catch (const AgreedError&) {
    abandon_checkpoint(f->tmp, host_);
    throw;
  }
  f->stall_s = since(f->t0);
  Flight* raw = f.get();
  f->thread = std::thread([this, raw] { write(*raw); });
  flight_ = std::move(f);
}

void CheckpointWriter::write(Flight& f) {
  try {
    if (f.late) {
      std::unique_lock<std::mutex> l(f.m);
      f.cv.wait(l, [&] { return f.wanted; });
    }
    std::move(f.copies).land(threads_);  // the regions' bytes are the step's state from here on
    if (f.before_write) f.before_write();
    const std::string path = rank_file(f.tmp, host_.rank());
    f.digest.name = std::filesystem::path(path).filename().string();
    f.digest.extents = write_regions(path, f.regions, threads_, f.digest.size, &f.written);
  } catch (const std::exception& ex) {
    f.error = std::string("checkpoint write failed: ") + ex.what() + full_disk_note(f.tmp);
  }
  f.written_s = since(f.t0);
  {
    std::lock_guard<std::mutex> l(f.m);
    f.done.store(true, std::memory_order_release);
  }
  f.cv.notify_all();
}

bool CheckpointWriter::wait(Flight& f, double stall_s) {
  std::unique_lock<std::mutex> l(f.m);
  f.wanted = true;
  f.cv.notify_all();
  const auto is_done = [&] { return f.done.load(std::memory_order_acquire); };
  if (stall_s <= 0) {
    f.cv.wait(l, is_done);
    return true;
  }
  // woken by the end of the write, or now and then to see whether its bytes still go out
  const auto look = std::chrono::duration<double>(std::min(1.0, stall_s / 4));
  uint64_t seen = f.written.load(std::memory_order_relaxed);
  auto moved = std::chrono::steady_clock::now();
  while (!f.cv.wait_for(l, look, is_done)) {
    const uint64_t now = f.written.load(std::memory_order_relaxed);
    if (now != seen) {
      seen = now;
      moved = std::chrono::steady_clock::now();
    } else if (since(moved) >= stall_s) {
      return false;
    }
  }
  return true;
}

void CheckpointWriter::wait_here() {
  if (flight_) wait(*flight_, 0);
}

CheckpointOutcome CheckpointWriter::finish(double stall_s) {
  if (!flight_) return {};
  std::unique_ptr<Flight> f = std::move(flight_);
  const int64_t step = f->step;
  const std::string tmp = f->tmp;
  std::string err;
  if (wait(*f, stall_s)) {
    f->thread.join();
    err = f->error;
  } else {
    char s[32];
    std::snprintf(s, sizeof s, "%g", stall_s);
    err = "the checkpoint write of step " + std::to_string(step) + " wrote nothing for " + s + " s (" +
          std::to_string(f->written.load()) + " bytes written): given up" + full_disk_note(tmp);
    // The thread may be inside a system call that never returns: it is left to the process's end, with
    // the flight and the snapshot it reads from (never freed under it).
    f->thread.detach();
    (void)f.release();
    (void)snap_.release();
  }
  try {
    agreed(host_, "checkpoint write", [&] {
      if (!err.empty()) throw Error(kExitFailure, err);
    });
  } catch (const AgreedError&) {
    abandon_checkpoint(tmp, host_);
    throw;
  }
  publish_checkpoint(run_dir_, step, f->digest, host_, keep_last_);
  return {step, double(f->digest.size), f->stall_s, f->written_s};
}

}  // namespace gpt
