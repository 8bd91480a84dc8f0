#include "io/runlog.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "io/h5util.hpp"

namespace gpt {

namespace {
// Opens the log for writing. A reader that is not a SWMR reader (h5py's plain read, to_tensorboard.py
// --follow between polls) holds the file's lock for as long as it reads, and HDF5 then refuses the open:
// tried again every 50 ms for up to 10 s before the caller is told it failed (an invalid id).
h5::Id open_for_writing(const std::string& path, hid_t fapl) {
  for (int i = 0;; ++i) {
    h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl));
    if (f.valid() || i == 200) return f;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// /train holds a series per train metric, /eval one per eval metric and sample_end (io/metrics.hpp);
// every dataset carries a `units` attribute (docs/FORMATS.md). The samples' text goes, one after
// another, into the byte series /samples (variable-length strings are not safe for SWMR readers);
// sample_end says where each row's text ends.
constexpr int kNumTrain = kTrainMetricCount;
constexpr int kEvalN = kEvalMetricCount + 1;  // and sample_end, last
const MetricInfo kSampleEnd{"sample_end", "bytes", true, "where the row's sample ends in /samples"};
const MetricInfo& eval_column(int i) { return i < kEvalMetricCount ? kEvalMetrics[i] : kSampleEnd; }
hid_t file_type(const MetricInfo& m) { return m.integer ? H5T_STD_I64LE : H5T_IEEE_F64LE; }

h5::Id series_with_units(hid_t loc, const MetricInfo& m) {
  h5::Id ds = h5::create_series(loc, m.name, file_type(m));
  h5::set_attr(ds, "units", std::string(m.units));
  return ds;
}
// A metric's value as its dataset holds it (integers: int64, a NaN as 0)
void append_value(hid_t ds, const MetricInfo& m, double v) {
  if (m.integer) {
    const int64_t i = std::isnan(v) ? 0 : int64_t(v);
    h5::append(ds, &i, H5T_NATIVE_INT64);
  } else {
    h5::append(ds, &v, H5T_NATIVE_DOUBLE);
  }
}

// Appends n elements to a 1-D series.
void append_n(hid_t ds, const void* values, hsize_t n, hid_t type) {
  hsize_t start = h5::length(ds), total = start + n;
  H5_CHECK(H5Dset_extent(ds, &total));
  if (n == 0) return;
  h5::Id fspace(H5_CHECK(H5Dget_space(ds)));
  H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &n, nullptr));
  h5::Id mspace(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
  H5_CHECK(H5Dwrite(ds, type, mspace, fspace, H5P_DEFAULT, values));
}
}  // namespace

// A full disk must not leave the log unreadable: closing an HDF5 file writes its metadata, so the log
// keeps a reserve of disk space beside it (kLogReserveBytes), a file it gives up the moment a write
// fails, so that the close and the outcome still fit.

struct RunLog::Impl {
  std::string path, reserve;
  h5::Id file;
  h5::Id train[kNumTrain];
  double elapsed_before = 0;
  int64_t last_eval_step = -1;
  h5::Id eval[kEvalN], samples;
  bool finished = false;

  void open_series() {
    for (int i = 0; i < kNumTrain; ++i) {
      const std::string path = std::string("/train/") + kTrainMetrics[i].name;
      if (h5::exists(file, path)) {
        train[i] = h5::Id(H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT)));
        continue;
      }
      // a log from before the series existed: its rows measured none of it (0 or NaN)
      h5::Id g = h5::open_group(file, "/train");
      train[i] = series_with_units(g, kTrainMetrics[i]);
      const size_t rows = h5::length(train[0]);
      const std::vector<int64_t> zeros(rows, 0);
      const std::vector<double> nan(rows, NAN);
      if (kTrainMetrics[i].integer) append_n(train[i], zeros.data(), rows, H5T_NATIVE_INT64);
      else append_n(train[i], nan.data(), rows, H5T_NATIVE_DOUBLE);
    }
    const hsize_t rows = h5::length(h5::Id(H5_CHECK(H5Dopen2(file, "/eval/step", H5P_DEFAULT))));
    for (int i = 0; i < kEvalN; ++i) {
      const std::string path = std::string("/eval/") + eval_column(i).name;
      if (h5::exists(file, path)) {
        eval[i] = h5::Id(H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT)));
        continue;
      }
      // a log from before the series existed: its rows measured none of it
      h5::Id g = h5::open_group(file, "/eval");
      eval[i] = series_with_units(g, eval_column(i));
      const std::vector<double> nan(rows, NAN);
      const std::vector<int64_t> zero(rows, 0);
      append_n(eval[i], i == kEvalN - 1 ? (const void*)zero.data() : nan.data(), rows,
               i == kEvalN - 1 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE);
    }
    samples = h5::exists(file, "/samples") ? h5::Id(H5_CHECK(H5Dopen2(file, "/samples", H5P_DEFAULT)))
                                           : h5::create_series(file, "samples", H5T_STD_U8LE);
  }
  void close_series() {
    for (auto& d : train) d.reset();
    for (auto& d : eval) d.reset();
    samples.reset();
  }
  // Without its reserve a full disk would leave the log flagged open and without its status: the run
  // does not start (before the log is created or touched).
  void take_reserve() {
    const std::string r = path + ".reserve";
    const int fd = ::open(r.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : ::posix_fallocate(fd, 0, off_t(kLogReserveBytes));
    if (fd >= 0) ::close(fd);
    if (err == 0) {
      reserve = r;
      return;
    }
    std::remove(r.c_str());
    std::error_code ec;
    const auto sp = std::filesystem::space(std::filesystem::path(path).parent_path(), ec);
    throw input_error("cannot keep the run log's " + std::to_string(kLogReserveBytes >> 10) + " KiB disk reserve '" +
                      r + "' (" + std::strerror(err) + (ec ? std::string() : ", " + std::to_string(sp.available) +
                      " bytes free") + "): the log could not be closed with its outcome on a full disk; free some "
                      "space there");
  }
  void release_reserve() {
    if (!reserve.empty()) std::remove(reserve.c_str());
    reserve.clear();
  }
  // Runs a write; when it fails the reserve goes first, so the file can still be closed whole.
  template <class Fn>
  void write(Fn fn) {
    try {
      fn();
    } catch (const Error&) {
      release_reserve();
      throw;
    }
  }
  static h5::Id fapl() {
    h5::Id p(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
    H5_CHECK(H5Pset_libver_bounds(p, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
    return p;
  }
};

namespace {
// One attribute per memory component (bytes), the total, and `components`: their names in order, one a
// line, so readers need no list of their own.
void write_memory_attrs(hid_t g, const MemoryBreakdown& m) {
  std::string names;
  for (const MemoryComponent& c : kMemoryComponents) {
    h5::set_attr(g, c.name, int64_t(m.*c.bytes));
    names += std::string(c.name) + "\n";
  }
  h5::set_attr(g, "total", int64_t(m.total()));
  h5::set_attr(g, "components", names);
}

// What this start of the run is: written when the log is made and again on every resume, which may run on
// another number of ranks (nodes) or with other settings. /ranks has one row per rank.
void write_run_attrs(hid_t f, const RunInfo& info) {
  h5::set_attr(f, "name", info.name);
  h5::set_attr(f, "config_yaml", info.config_yaml);
  h5::set_attr(f, "n_params", info.n_params);
  h5::set_attr(f, "flops_per_token", info.flops_per_token);
  h5::set_attr(f, "tokens_per_step", info.tokens_per_step);
  h5::set_attr(f, "world_size", info.world_size);
  h5::set_attr(f, "zero_stage", info.zero_stage);
  h5::set_attr(f, "device", info.device);
  h5::set_attr(f, "hardware", info.hardware);
  h5::set_attr(f, "peak_flops", info.peak_flops);
  h5::set_attr(f, "git_rev", info.git_rev);
  h5::set_attr(f, "point_index", info.point_index);
  h5::set_attr(f, "point_values", info.point_values);
  h5::set_attr(f, "precision", info.precision);
  h5::set_attr(f, "data_files", info.data_files);
  h5::set_attr(f, "shared_gpu", int64_t(info.shared_gpu));
  if (info.startup_s >= 0) h5::set_attr(f, "startup_s", info.startup_s);
  if (h5::exists(f, "ranks")) H5_CHECK(H5Ldelete(f, "ranks", H5P_DEFAULT));
  h5::Id g = h5::create_group(f, "ranks");
  std::vector<std::string> node, from;
  std::vector<int64_t> local;
  for (const RankPlace& r : info.ranks) {
    node.push_back(r.node);
    from.push_back(r.local_rank_from);
    local.push_back(r.local_rank);
  }
  h5::write_strings(g, "node", node);
  h5::write_array(g, "local_rank", H5T_NATIVE_INT64, H5T_STD_I64LE, local.data(), local.size());
  h5::write_strings(g, "local_rank_from", from);
  for (const char* n : {"node", "local_rank", "local_rank_from"}) {
    h5::Id ds(H5_CHECK(H5Dopen2(g, n, H5P_DEFAULT)));
    h5::set_attr(ds, "units", std::string(std::string(n) == "local_rank" ? "ranks" : "text"));
  }
}
}  // namespace

RunLog::RunLog(const std::string& path, const RunInfo& info, const MemoryBreakdown& predicted, int64_t resume_step)
    : p_(new Impl) {
  h5::silence_errors();
  p_->path = path;
  p_->take_reserve();
  try {
    open(info, predicted, resume_step);
  } catch (...) {
    p_->close_series();
    p_->file.reset();
    p_->release_reserve();
    throw;
  }
}

// Reopens the log of the run being resumed and drops its rows after resume_step.
void RunLog::reopen(const RunInfo& info, int64_t resume_step) {
  const std::string& path = p_->path;
  h5::Id fapl = Impl::fapl();
  p_->file = h5::Id(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl));
  if (!p_->file.valid()) {
    // A writer killed mid-run leaves the file marked open for SWMR writing: clear that mark and
    // the end-of-file it recorded (what `h5clear -s --increment` does), then reopen; a reader holding
    // the file's lock is waited for (open_for_writing)
    hbool_t clear = 1;
    H5_CHECK(H5Pset(fapl, "clear_status_flags", &clear));
    p_->file = open_for_writing(path, fapl);
    if (p_->file.valid()) H5_CHECK(H5Fincrement_filesize(p_->file, 0));
  }
  if (!p_->file.valid())
    throw input_error("run log '" + path + "' is damaged (HDF5 cannot open it, nor did another process release it "
                      "within 10 s): move it away to resume with a new log");
  p_->open_series();
  // drop rows after the checkpoint's step: the continued run writes them again
  auto steps = h5::read_all<int64_t>(p_->train[0], H5T_NATIVE_INT64);
  hsize_t keep = 0;
  while (keep < steps.size() && steps[keep] <= resume_step) ++keep;
  for (auto& d : p_->train) h5::truncate(d, keep);
  auto elapsed = h5::read_all<double>(p_->train[int(TrainMetric::elapsed_s)], H5T_NATIVE_DOUBLE);
  if (!elapsed.empty()) p_->elapsed_before = elapsed.back();
  auto esteps = h5::read_all<int64_t>(p_->eval[0], H5T_NATIVE_INT64);
  hsize_t ekeep = 0;
  while (ekeep < esteps.size() && esteps[ekeep] <= resume_step) ++ekeep;
  const auto ends = h5::read_all<int64_t>(p_->eval[kEvalN - 1], H5T_NATIVE_INT64);
  for (auto& d : p_->eval) h5::truncate(d, ekeep);
  if (ekeep) p_->last_eval_step = esteps[ekeep - 1];
  h5::truncate(p_->samples, ekeep ? hsize_t(ends[ekeep - 1]) : 0);
  h5::set_attr(p_->file, "status", std::string("running"));
  h5::set_attr(p_->file, "message", std::string(""));
  h5::set_attr(p_->file, "resumed_from_step", resume_step);
  write_run_attrs(p_->file, info);
}

void RunLog::open(const RunInfo& info, const MemoryBreakdown& predicted, int64_t resume_step) {
  const std::string& path = p_->path;
  h5::Id fapl = Impl::fapl();
  FILE* probe = resume_step >= 0 ? std::fopen(path.c_str(), "rb") : nullptr;
  if (probe) {
    std::fclose(probe);
    try {
      reopen(info, resume_step);
    } catch (const Error& e) {
      if (e.code() == kExitBadInput) throw;
      throw input_error("run log '" + path + "' is damaged (" + e.what() + "): move it away to resume with a new log");
    }
  } else {
    const std::string tmp = path + ".tmp";
    h5::Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    if (!f.valid()) throw input_error("cannot create run log '" + tmp + "'");
    write_run_attrs(f, info);
    h5::set_attr(f, "status", std::string("running"));
    h5::set_attr(f, "message", std::string(""));
    {
      h5::Id tg = h5::create_group(f, "train");
      for (const MetricInfo& m : kTrainMetrics) series_with_units(tg, m);
      h5::Id eg = h5::create_group(f, "eval");
      for (int i = 0; i < kEvalN; ++i) series_with_units(eg, eval_column(i));
      h5::Id samples = h5::create_series(f, "samples", H5T_STD_U8LE);
      h5::set_attr(samples, "units", std::string("UTF-8 bytes"));
      h5::Id mg = h5::create_group(f, "memory");
      h5::Id pg = h5::create_group(mg, "predicted");
      write_memory_attrs(pg, predicted);
      h5::Id meas = h5::create_group(mg, "measured");
      h5::set_attr(meas, "peak", int64_t(0));
    }
    f.reset();
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw input_error("cannot rename '" + tmp + "' to '" + path + "'");
    p_->file = open_for_writing(path, fapl);
    if (!p_->file.valid()) throw Error(kExitFailure, "cannot open the new run log '" + path + "' for writing");
    p_->open_series();
  }
  H5_CHECK(H5Fstart_swmr_write(p_->file));
}

RunLog::~RunLog() {
  if (!p_->finished) {
    // an exception unwound past the trainer: leave the file closed and readable
    p_->release_reserve();
    p_->close_series();
    p_->file.reset();
  }
}

void RunLog::train_row(const TrainRow& r) {
  p_->write([&] {
    for (int i = 0; i < kNumTrain; ++i) append_value(p_->train[i], kTrainMetrics[i], r.v[i]);
    for (auto& d : p_->train) H5_CHECK(H5Dflush(d));
  });
}

double RunLog::elapsed_before() const { return p_->elapsed_before; }

int64_t RunLog::last_eval_step() const { return p_->last_eval_step; }

void RunLog::eval_row(const EvalRow& r) {
  p_->write([&] {
    for (int i = 0; i < kEvalMetricCount; ++i) append_value(p_->eval[i], kEvalMetrics[i], r.v[i]);
    append_n(p_->samples, r.sample.data(), r.sample.size(), H5T_NATIVE_UCHAR);
    const int64_t end = int64_t(h5::length(p_->samples));
    h5::append(p_->eval[kEvalN - 1], &end, H5T_NATIVE_INT64);
    H5_CHECK(H5Dflush(p_->samples));
    for (auto& d : p_->eval) H5_CHECK(H5Dflush(d));
  });
}

void RunLog::finish(const std::string& status, const std::string& message, const MemoryBreakdown& measured,
                    size_t peak, size_t baseline) {
  p_->release_reserve();
  p_->close_series();
  p_->file.reset();
  h5::Id fapl = Impl::fapl();
  h5::Id f = open_for_writing(p_->path, fapl);
  if (!f.valid()) throw Error(kExitFailure, "cannot reopen run log '" + p_->path + "' to record its outcome");
  h5::set_attr(f, "status", status);
  h5::set_attr(f, "message", message);
  h5::Id mg = h5::open_group(f, "/memory/measured");
  write_memory_attrs(mg, measured);
  h5::set_attr(mg, "peak", int64_t(peak));
  h5::set_attr(mg, "baseline", int64_t(baseline));
  p_->finished = true;
}

}  // namespace gpt

namespace gpt {

LoggedRun read_logged_run(const std::string& path) {
  LoggedRun out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  out.exists = true;
  // read-only; SWMR reading also opens the log of a writer that was killed (still flagged as written)
  std::string why;
  h5::Id f = h5::open_read_only(path, &why);
  const std::string damaged = "run log '" + path + "' is damaged";
  const std::string what = ": move it away (or delete it) to resume; with a checkpoint the run then goes on "
                           "with a new log";
  if (!f.valid()) throw input_error(damaged + " (HDF5 cannot open it: " + why + ")" + what);
  try {
    out.status = h5::get_attr_str(f, "status");
    if (h5::exists(f, "/train/step")) {
      h5::Id ds(H5_CHECK(H5Dopen2(f, "/train/step", H5P_DEFAULT)));
      const auto steps = h5::read_all<int64_t>(ds, H5T_NATIVE_INT64);
      if (!steps.empty()) out.last_step = steps.back();
    }
  } catch (const Error& e) {
    throw input_error(damaged + " (" + e.what() + ")" + what);
  }
  return out;
}

}  // namespace gpt
