#include "io/checkpoint_writer.hpp"

#include <cstdio>
#include <filesystem>

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
std::vector<Region> lay_out_rank_file(const std::string& path, const TrainState& st, const Snapshot& s,
                                      const ParamLayout& L, int zero_stage, int rank, int world) {
  h5::Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.valid()) throw Error(kExitFailure, "cannot create checkpoint file '" + path + "'");
  const ModelDims& d = L.dims();
  h5::set_attr(f, "format", std::string(kCheckpointFormat));
  h5::set_attr(f, "format_version", kCheckpointVersion);
  h5::set_attr(f, "step", st.step);
  h5::set_attr(f, "world_size", int64_t(world));
  h5::set_attr(f, "rank", int64_t(rank));
  h5::set_attr(f, "zero_stage", int64_t(zero_stage));
  h5::set_attr(f, "n_layer", int64_t(d.n_layer));
  h5::set_attr(f, "n_head", int64_t(d.n_head));
  h5::set_attr(f, "n_embd", int64_t(d.n_embd));
  h5::set_attr(f, "vocab_size", int64_t(d.vocab_size));
  h5::set_attr(f, "padded_vocab", int64_t(d.padded_vocab));
  h5::set_attr(f, "max_seq_len", int64_t(d.max_seq_len));
  h5::set_attr(f, "data_shard", st.data.shard);
  h5::set_attr(f, "data_offset", st.data.offset);
  h5::set_attr(f, "data_epoch", st.data.epoch);
  h5::set_attr(f, "data_shuffle", int64_t(st.data.shuffled));
  h5::set_attr(f, "seed", int64_t(st.seed));
  h5::set_attr(f, "config_yaml", st.config_yaml);
  h5::set_attr(f, "n_buckets", int64_t(L.n_buckets()));
  // precision fp8: the scales and amax histories (the same on every rank; small, written through HDF5)
  if (!st.fp8.empty()) {
    h5::write_array(f, "fp8_state", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, st.fp8.data(), st.fp8.size());
    h5::Id ds(H5_CHECK(H5Dopen2(f, "fp8_state", H5P_DEFAULT)));
    h5::set_attr(ds, "checksum", int64_t(xxh3(st.fp8.data(), st.fp8.size() * sizeof(float))));
  }
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
    for (int k = 0; k < 4; ++k) {
      const size_t i = size_t(b) * 4 + size_t(k);
      if (!s.has(i)) continue;
      hsize_t n = s.elems(b);
      h5::Id space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
      h5::Id ds(H5_CHECK(H5Dcreate2(grp, kStateNames[k], H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
      h5::set_attr(ds, "units", std::string("1"));  // parameter values and AdamW moments are pure numbers
      if (n == 0) continue;
      const haddr_t off = H5Dget_offset(ds);
      if (off == HADDR_UNDEF) throw Error(kExitFailure, "'" + path + "': HDF5 placed no storage for " + g);
      regions.push_back({uint64_t(off), s.data(i), size_t(n) * sizeof(float)});
    }
  }
  H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
  return regions;
}

CheckpointWriter::CheckpointWriter(std::string run_dir, HostComm& host, int keep_last, int threads)
    : run_dir_(std::move(run_dir)), host_(host), keep_last_(keep_last), threads_(threads) {}

bool CheckpointWriter::reserve(ZeroEngine& e, const ParamLayout& L) {
  return snap_.reserve(e, L, host_.rank(), host_.world());
}

CheckpointWriter::~CheckpointWriter() {
  if (flight_ && flight_->thread.joinable()) flight_->thread.join();
}

void CheckpointWriter::start(const TrainState& st, ZeroEngine& e, const ParamLayout& L,
                             std::function<void()> before_write) {
  if (flight_) throw Error(kExitFailure, "internal error: a checkpoint started while another is in flight");
  auto f = std::make_unique<Flight>();
  f->t0 = std::chrono::steady_clock::now();
  f->step = st.step;
  f->before_write = std::move(before_write);
  f->tmp = prepare_checkpoint_dir(run_dir_, st.step, host_);
  try {
    agreed(host_, "checkpoint write", [&] {
      try {
        snap_.take(e, L, host_.rank(), host_.world());  // queued: the writer thread waits for it
        f->regions = lay_out_rank_file(rank_file(f->tmp, host_.rank()), st, snap_, L, e.policy().stage,
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
    snap_.complete(threads_);
    if (f.before_write) f.before_write();
    const std::string path = rank_file(f.tmp, host_.rank());
    f.digest.name = std::filesystem::path(path).filename().string();
    f.digest.extents = write_regions(path, f.regions, threads_, f.digest.size);
  } catch (const std::exception& ex) {
    f.error = std::string("checkpoint write failed: ") + ex.what() + full_disk_note(f.tmp);
  }
  f.written_s = since(f.t0);
  f.done.store(true, std::memory_order_release);
}

CheckpointOutcome CheckpointWriter::finish() {
  if (!flight_) return {};
  std::unique_ptr<Flight> f = std::move(flight_);
  f->thread.join();
  try {
    agreed(host_, "checkpoint write", [&] {
      if (!f->error.empty()) throw Error(kExitFailure, f->error);
    });
  } catch (const AgreedError&) {
    abandon_checkpoint(f->tmp, host_);
    throw;
  }
  publish_checkpoint(run_dir_, f->step, f->digest, host_, keep_last_);
  return {f->step, double(f->digest.size), f->stall_s, f->written_s};
}

}  // namespace gpt
