#include "io/csv_log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "base/common.hpp"
#include "base/format.hpp"
#include "io/h5util.hpp"

namespace gpt {

std::string csv_number(double v, bool integer) {
  if (std::isnan(v)) return "";
  if (integer) return std::to_string(int64_t(v));
  return shortest(v);
}

std::string csv_text(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

namespace {

std::string train_line(const TrainRow& r) {
  std::string line;
  for (int i = 0; i < kTrainMetricCount; ++i) {
    const double v = r.v[i];
    // the learning rate is the float32 the optimizer is given: its float32 text ("0.0003", as to_csv.py
    // writes it), not the widened double's ("0.0003000000142492354") that log.h5 keeps
    const bool f32 = i == int(TrainMetric::lr) && !std::isnan(v);
    line += (i ? "," : "") + (f32 ? shortest(float(v)) : csv_number(v, kTrainMetrics[i].integer));
  }
  return line;
}

std::string eval_line(const EvalRow& r) {
  std::string line;
  for (int i = 0; i < kEvalMetricCount; ++i) line += csv_number(r.v[i], kEvalMetrics[i].integer) + ",";
  return line + csv_text(r.sample);
}

// The fields of one CSV record starting at `at` (records may span lines inside quotes); false at the end.
// `ended`: the record ended with its line break (not with the text: a write cut short).
bool read_record(const std::string& text, size_t& at, std::vector<std::string>& out, bool& ended) {
  out.clear();
  ended = false;
  if (at >= text.size()) return false;
  std::string f;
  bool quoted = false;
  for (; at < text.size(); ++at) {
    const char c = text[at];
    if (quoted) {
      if (c == '"' && at + 1 < text.size() && text[at + 1] == '"') f += '"', ++at;
      else if (c == '"') quoted = false;
      else f += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(f), f.clear();
    } else if (c == '\n') {
      ++at;
      ended = true;
      break;
    } else if (c != '\r') {
      f += c;
    }
  }
  out.push_back(f);
  return true;
}

// A file the run will replace: absent, or a file it may write over.
void check_replaceable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  if (!std::filesystem::is_regular_file(path, ec))
    throw input_error("log.csv: '" + path + "' is not a regular file; move it away");
  if (::access(path.c_str(), W_OK) != 0)
    throw input_error("log.csv: '" + path + "' is not writable (" + std::strerror(errno) +
                      "); make it writable, or move it away (a resume then rewrites it from log.h5)");
}

// The header under `columns` and the rows of the file at path whose step (the column named "step") is
// at most keep_through, under those columns. An unterminated last record is dropped.
std::string kept_rows(const std::string& path, const std::string& text, const std::vector<std::string>& columns,
                      int64_t keep_through) {
  std::string kept;
  size_t at = 0, line = 1;  // the header's
  std::vector<std::string> header, rec;
  bool ended = false;
  if (!read_record(text, at, header, ended) || !ended) return kept;  // no whole header: no rows either
  std::vector<int> from(columns.size(), -1);
  int step_col = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == "step") step_col = int(i);
    for (size_t j = 0; j < columns.size(); ++j)
      if (header[i] == columns[j]) from[j] = int(i);
  }
  if (step_col < 0) throw input_error("log.csv: '" + path + "' line 1: the header has no column 'step' (not a "
                                      "train.csv/eval.csv?); move the file away (a resume then rewrites it from log.h5)");
  for (size_t start = at; read_record(text, at, rec, ended); start = at) {
    const size_t here = ++line;  // the record's first line (a quoted sample may span several)
    line += size_t(std::count(text.begin() + std::ptrdiff_t(start), text.begin() + std::ptrdiff_t(at), '\n')) -
            (ended ? 1 : 0);
    if (!ended) break;  // cut short by a kill while it was written: the run writes the step again
    if (rec.size() == 1 && rec[0].empty()) continue;  // an empty line
    const std::string s = size_t(step_col) < rec.size() ? rec[step_col] : std::string();
    char* end = nullptr;
    errno = 0;
    const long long step = s.empty() ? 0 : std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0 || step < 0)
      throw input_error("log.csv: '" + path + "' line " + std::to_string(here) + ": the step '" + s +
                        "' is not a whole number (a damaged row); repair or delete the line, or move the file "
                        "away (a resume then rewrites it from log.h5)");
    if (step > keep_through) continue;
    for (size_t j = 0; j < columns.size(); ++j)
      kept += (j ? "," : "") + (from[j] >= 0 && size_t(from[j]) < rec.size() ? csv_text(rec[from[j]]) : std::string());
    kept += "\n";
  }
  return kept;
}

// The rows of steps up to keep_through of the run log at log_path, as the sinks write them: the /train
// lines into train, the /eval lines into eval; returns how many train rows.
size_t log_rows(const std::string& log_path, int64_t keep_through, std::string& train, std::string& eval) {
  h5::silence_errors();
  std::string why;
  h5::Id f = h5::open_read_only(log_path, &why);  // bounded on a damaged log, as every reader is
  if (!f.valid())
    throw input_error("log.csv: cannot read the run log '" + log_path + "' to fill train.csv from" +
                      (why.empty() ? "" : ": " + why));
  // a series, as doubles (empty when the log predates it)
  const auto series = [&](const std::string& path, bool integer) {
    std::vector<double> v;
    if (!h5::exists(f, path)) return v;
    h5::Id ds(H5_CHECK(H5Dopen2(f, path.c_str(), H5P_DEFAULT)));
    if (!integer) return h5::read_all<double>(ds, H5T_NATIVE_DOUBLE);
    for (int64_t x : h5::read_all<int64_t>(ds, H5T_NATIVE_INT64)) v.push_back(double(x));
    return v;
  };
  size_t n = 0;
  try {
    std::vector<std::vector<double>> tv;
    for (const MetricInfo& m : kTrainMetrics) tv.push_back(series(std::string("/train/") + m.name, m.integer));
    for (size_t r = 0; r < tv[0].size() && tv[0][r] <= double(keep_through); ++r, ++n) {
      TrainRow row;
      for (int i = 0; i < kTrainMetricCount; ++i) row.v[i] = r < tv[i].size() ? tv[i][r] : NAN;
      train += train_line(row) + "\n";
    }
    std::vector<std::vector<double>> ev;
    for (const MetricInfo& m : kEvalMetrics) ev.push_back(series(std::string("/eval/") + m.name, m.integer));
    const std::vector<double> ends = series("/eval/sample_end", true);
    std::vector<char> text;
    if (h5::exists(f, "/samples")) {
      h5::Id ds(H5_CHECK(H5Dopen2(f, "/samples", H5P_DEFAULT)));
      text = h5::read_all<char>(ds, H5T_NATIVE_CHAR);
    }
    for (size_t r = 0; r < ev[0].size() && ev[0][r] <= double(keep_through); ++r) {
      EvalRow row;
      for (int i = 0; i < kEvalMetricCount; ++i) row.v[i] = r < ev[i].size() ? ev[i][r] : NAN;
      const size_t a = r > 0 && r - 1 < ends.size() ? size_t(ends[r - 1]) : 0, b = r < ends.size() ? size_t(ends[r]) : a;
      if (a <= b && b <= text.size()) row.sample.assign(text.begin() + std::ptrdiff_t(a), text.begin() + std::ptrdiff_t(b));
      eval += eval_line(row) + "\n";
    }
  } catch (const Error& e) {
    throw input_error("log.csv: cannot read the rows of the run log '" + log_path + "': " + e.what());
  }
  return n;
}

std::string header_of(const std::vector<std::string>& columns) {
  std::string head;
  for (size_t j = 0; j < columns.size(); ++j) head += (j ? "," : "") + columns[j];
  return head + "\n";
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("log.csv: cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::ofstream append_to(const std::string& path, const std::string& text) {
  write_file_whole(path, text);  // aside, then renamed: the old file is whole until then
  std::ofstream out(path, std::ios::app | std::ios::binary);
  if (!out) throw input_error("cannot append to '" + path + "'");
  return out;
}

void write_line(std::ofstream& out, const std::string& line, const std::string& path) {
  out << line << "\n";
  out.flush();
  if (!out) throw Error(kExitFailure, "writing '" + path + "' failed");
}

}  // namespace

CsvLog::CsvLog(const std::string& dir, int64_t resume_step, const std::string& log_path) : dir_(dir) {
  std::vector<std::string> tc, ec;
  for (const MetricInfo& m : kTrainMetrics) tc.push_back(m.name);
  for (const MetricInfo& m : kEvalMetrics) ec.push_back(m.name);
  ec.push_back("sample");
  const std::string tp = dir + "/train.csv", ep = dir + "/eval.csv";
  check_replaceable(tp);
  check_replaceable(ep);
  train_text_ = header_of(tc);
  eval_text_ = header_of(ec);
  if (resume_step < 0) return;
  std::error_code err;
  const bool have_train = std::filesystem::exists(tp, err), have_eval = std::filesystem::exists(ep, err);
  if (have_train) train_text_ += kept_rows(tp, read_whole(tp), tc, resume_step);
  if (have_eval) eval_text_ += kept_rows(ep, read_whole(ep), ec, resume_step);
  if ((have_train && have_eval) || !std::filesystem::exists(log_path, err)) return;
  std::string train, eval;
  const size_t n = log_rows(log_path, resume_step, train, eval);
  if (!have_train) train_text_ += train;
  if (!have_eval) eval_text_ += eval;
  note_ = "log.csv: " + std::string(!have_train && !have_eval ? "train.csv and eval.csv" : have_train ? "eval.csv" : "train.csv") +
          " filled from log.h5 up to step " + std::to_string(resume_step) + " (" + std::to_string(n) + " train row(s))";
}

void CsvLog::open() {
  train_ = append_to(dir_ + "/train.csv", train_text_);
  eval_ = append_to(dir_ + "/eval.csv", eval_text_);
}

void CsvLog::train_row(const TrainRow& r) { write_line(train_, train_line(r), dir_ + "/train.csv"); }

void CsvLog::eval_row(const EvalRow& r) { write_line(eval_, eval_line(r), dir_ + "/eval.csv"); }

}  // namespace gpt
