#include "io/runlog.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "io/h5util.hpp"

namespace gpt {

namespace {
// /train's columns and their units (every dataset carries a `units` attribute; docs/FORMATS.md)
struct Column {
  const char* name;
  const char* units;
  bool integer;
};
constexpr Column kTrainCols[] = {{"step", "steps", true},          {"loss", "nats/token", false},
                                 {"lr", "1", false},               {"grad_norm", "1", false},
                                 {"step_ms", "ms", false},         {"tokens_per_s", "tokens/s", false},
                                 {"mfu", "fraction", false},       {"elapsed_s", "s", false},
                                 {"tokens", "tokens", true},       {"fp8_saturated", "tensors", true}};
constexpr int kNumTrain = sizeof(kTrainCols) / sizeof(kTrainCols[0]);

h5::Id series_with_units(hid_t loc, const char* name, hid_t type, const char* units) {
  h5::Id ds = h5::create_series(loc, name, type);
  h5::set_attr(ds, "units", std::string(units));
  return ds;
}
// /eval: one row per evaluation in every series. The samples' text goes, one after another, into the
// byte series /samples (variable-length strings are not safe for SWMR readers); sample_end says where
// each row's text ends.
constexpr Column kEvalCols[] = {{"step", "steps", true},
                                {"val_loss", "nats/token", false},
                                {"hellaswag_acc", "fraction", false},
                                {"hellaswag_acc_norm", "fraction", false},
                                {"sample_end", "bytes", true}};
constexpr int kEvalN = sizeof(kEvalCols) / sizeof(kEvalCols[0]);
hid_t eval_file_type(int i) { return kEvalCols[i].integer ? H5T_STD_I64LE : H5T_IEEE_F64LE; }

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
// keeps a reserve of disk space beside it, a file it gives up the moment a write fails, so that the
// close and the outcome still fit.
constexpr off_t kReserveBytes = off_t(256) << 10;

struct RunLog::Impl {
  std::string path, reserve;
  h5::Id file;
  h5::Id train[kNumTrain];
  double elapsed_before = 0;
  h5::Id eval[kEvalN], samples;
  bool finished = false;

  void open_series() {
    for (int i = 0; i < kNumTrain; ++i) {
      const std::string path = std::string("/train/") + kTrainCols[i].name;
      if (h5::exists(file, path)) {
        train[i] = h5::Id(H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT)));
        continue;
      }
      // a log from before the series existed: zeros for its rows (nothing of it was measured)
      h5::Id g = h5::open_group(file, "/train");
      train[i] = series_with_units(g, kTrainCols[i].name, H5T_STD_I64LE, kTrainCols[i].units);
      const std::vector<int64_t> zeros(h5::length(train[0]), 0);
      append_n(train[i], zeros.data(), zeros.size(), H5T_NATIVE_INT64);
    }
    const hsize_t rows = h5::length(h5::Id(H5_CHECK(H5Dopen2(file, "/eval/step", H5P_DEFAULT))));
    for (int i = 0; i < kEvalN; ++i) {
      const std::string path = std::string("/eval/") + kEvalCols[i].name;
      if (h5::exists(file, path)) {
        eval[i] = h5::Id(H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT)));
        continue;
      }
      // a log from before the series existed: its rows measured none of it
      h5::Id g = h5::open_group(file, "/eval");
      eval[i] = series_with_units(g, kEvalCols[i].name, eval_file_type(i), kEvalCols[i].units);
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
  void take_reserve() {
    reserve = path + ".reserve";
    const int fd = ::open(reserve.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;  // best effort: without it a full disk may still leave the log flagged open
    if (::posix_fallocate(fd, 0, kReserveBytes) != 0) std::remove(reserve.c_str());
    ::close(fd);
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
  h5::Id fapl = Impl::fapl();
  FILE* probe = resume_step >= 0 ? std::fopen(path.c_str(), "rb") : nullptr;
  if (probe) {
    std::fclose(probe);
    p_->file = h5::Id(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl));
    if (!p_->file.valid()) {
      // A writer killed mid-run leaves the file marked open for SWMR writing: clear that mark and
      // the end-of-file it recorded (what `h5clear -s --increment` does), then reopen.
      hbool_t clear = 1;
      H5_CHECK(H5Pset(fapl, "clear_status_flags", &clear));
      p_->file = h5::Id(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl));
      if (p_->file.valid()) H5_CHECK(H5Fincrement_filesize(p_->file, 0));
    }
    if (!p_->file.valid()) throw input_error("cannot reopen run log '" + path + "' to continue it (corrupt?)");
    p_->open_series();
    // drop rows after the checkpoint's step: the continued run writes them again
    auto steps = h5::read_all<int64_t>(p_->train[0], H5T_NATIVE_INT64);
    hsize_t keep = 0;
    while (keep < steps.size() && steps[keep] <= resume_step) ++keep;
    for (auto& d : p_->train) h5::truncate(d, keep);
    auto elapsed = h5::read_all<double>(p_->train[7], H5T_NATIVE_DOUBLE);
    if (!elapsed.empty()) p_->elapsed_before = elapsed.back();
    auto esteps = h5::read_all<int64_t>(p_->eval[0], H5T_NATIVE_INT64);
    hsize_t ekeep = 0;
    while (ekeep < esteps.size() && esteps[ekeep] <= resume_step) ++ekeep;
    const auto ends = h5::read_all<int64_t>(p_->eval[kEvalN - 1], H5T_NATIVE_INT64);
    for (auto& d : p_->eval) h5::truncate(d, ekeep);
    h5::truncate(p_->samples, ekeep ? hsize_t(ends[ekeep - 1]) : 0);
    h5::set_attr(p_->file, "status", std::string("running"));
    h5::set_attr(p_->file, "message", std::string(""));
    h5::set_attr(p_->file, "resumed_from_step", resume_step);
    write_run_attrs(p_->file, info);
  } else {
    const std::string tmp = path + ".tmp";
    h5::Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    if (!f.valid()) throw input_error("cannot create run log '" + tmp + "'");
    write_run_attrs(f, info);
    h5::set_attr(f, "status", std::string("running"));
    h5::set_attr(f, "message", std::string(""));
    {
      h5::Id tg = h5::create_group(f, "train");
      for (const Column& c : kTrainCols)
        series_with_units(tg, c.name, c.integer ? H5T_STD_I64LE : H5T_IEEE_F64LE, c.units);
      h5::Id eg = h5::create_group(f, "eval");
      for (int i = 0; i < kEvalN; ++i) series_with_units(eg, kEvalCols[i].name, eval_file_type(i), kEvalCols[i].units);
      series_with_units(f, "samples", H5T_STD_U8LE, "UTF-8 bytes");
      h5::Id mg = h5::create_group(f, "memory");
      h5::Id pg = h5::create_group(mg, "predicted");
      write_memory_attrs(pg, predicted);
      h5::Id meas = h5::create_group(mg, "measured");
      h5::set_attr(meas, "peak", int64_t(0));
    }
    f.reset();
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw input_error("cannot rename '" + tmp + "' to '" + path + "'");
    p_->file = h5::Id(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl)));
    p_->open_series();
  }
  H5_CHECK(H5Fstart_swmr_write(p_->file));
  p_->take_reserve();
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
    h5::append(p_->train[0], &r.step, H5T_NATIVE_INT64);
    const double v[7] = {r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s, r.mfu, r.elapsed_s};
    for (int i = 0; i < 7; ++i) h5::append(p_->train[i + 1], &v[i], H5T_NATIVE_DOUBLE);
    h5::append(p_->train[8], &r.tokens, H5T_NATIVE_INT64);
    h5::append(p_->train[9], &r.fp8_saturated, H5T_NATIVE_INT64);
    for (auto& d : p_->train) H5_CHECK(H5Dflush(d));
  });
}

double RunLog::elapsed_before() const { return p_->elapsed_before; }

void RunLog::eval_row(const EvalRow& r) {
  p_->write([&] {
    h5::append(p_->eval[0], &r.step, H5T_NATIVE_INT64);
    const double v[3] = {r.val_loss, r.hellaswag_acc, r.hellaswag_acc_norm};
    for (int i = 0; i < 3; ++i) h5::append(p_->eval[i + 1], &v[i], H5T_NATIVE_DOUBLE);
    append_n(p_->samples, r.sample.data(), r.sample.size(), H5T_NATIVE_UCHAR);
    const int64_t end = int64_t(h5::length(p_->samples));
    h5::append(p_->eval[kEvalN - 1], &end, H5T_NATIVE_INT64);
    H5_CHECK(H5Dflush(p_->samples));
    for (auto& d : p_->eval) H5_CHECK(H5Dflush(d));
  });
}

void RunLog::finish(const std::string& status, const std::string& message, const MemoryBreakdown& measured,
                    size_t peak) {
  p_->release_reserve();
  p_->close_series();
  p_->file.reset();
  h5::Id fapl = Impl::fapl();
  h5::Id f(H5Fopen(p_->path.c_str(), H5F_ACC_RDWR, fapl));
  if (!f.valid()) throw Error(kExitFailure, "cannot reopen run log '" + p_->path + "' to record its outcome");
  h5::set_attr(f, "status", status);
  h5::set_attr(f, "message", message);
  h5::Id mg = h5::open_group(f, "/memory/measured");
  write_memory_attrs(mg, measured);
  h5::set_attr(mg, "peak", int64_t(peak));
  p_->finished = true;
}

}  // namespace gpt
