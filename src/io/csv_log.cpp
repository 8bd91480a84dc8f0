#include "io/csv_log.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "base/common.hpp"
#include "base/format.hpp"

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

// The fields of one CSV record starting at `at` (records may span lines inside quotes); false at the end.
bool read_record(const std::string& text, size_t& at, std::vector<std::string>& out) {
  out.clear();
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
      break;
    } else if (c != '\r') {
      f += c;
    }
  }
  out.push_back(f);
  return true;
}

// Opens path for appending under `columns`, keeping the rows of an existing file whose step (the column
// named "step") is at most keep_through (all: -1 keeps none), rewritten aside and renamed.
std::ofstream open_csv(const std::string& path, const std::vector<std::string>& columns, int64_t keep_through) {
  std::string kept;
  std::ifstream in(path, std::ios::binary);
  if (in && keep_through >= 0) {
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    size_t at = 0;
    std::vector<std::string> header, rec;
    if (read_record(text, at, header)) {
      std::vector<int> from(columns.size(), -1);
      int step_col = -1;
      for (size_t i = 0; i < header.size(); ++i) {
        if (header[i] == "step") step_col = int(i);
        for (size_t j = 0; j < columns.size(); ++j)
          if (header[i] == columns[j]) from[j] = int(i);
      }
      while (read_record(text, at, rec)) {
        if (step_col < 0 || size_t(step_col) >= rec.size() || rec[step_col].empty()) continue;
        if (std::stoll(rec[step_col]) > keep_through) continue;
        for (size_t j = 0; j < columns.size(); ++j)
          kept += (j ? "," : "") + (from[j] >= 0 && size_t(from[j]) < rec.size() ? csv_text(rec[from[j]]) : std::string());
        kept += "\n";
      }
    }
  }
  in.close();
  std::string head;
  for (size_t j = 0; j < columns.size(); ++j) head += (j ? "," : "") + columns[j];
  write_file_whole(path, head + "\n" + kept);  // aside, then renamed: the old file is whole until then
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

CsvLog::CsvLog(const std::string& dir, int64_t resume_step) : dir_(dir) {
  std::vector<std::string> tc, ec;
  for (const MetricInfo& m : kTrainMetrics) tc.push_back(m.name);
  for (const MetricInfo& m : kEvalMetrics) ec.push_back(m.name);
  ec.push_back("sample");
  train_ = open_csv(dir + "/train.csv", tc, resume_step);
  eval_ = open_csv(dir + "/eval.csv", ec, resume_step);
}

void CsvLog::train_row(const TrainRow& r) {
  std::string line;
  for (int i = 0; i < kTrainMetricCount; ++i) line += (i ? "," : "") + csv_number(r.v[i], kTrainMetrics[i].integer);
  write_line(train_, line, dir_ + "/train.csv");
}

void CsvLog::eval_row(const EvalRow& r) {
  std::string line;
  for (int i = 0; i < kEvalMetricCount; ++i) line += csv_number(r.v[i], kEvalMetrics[i].integer) + ",";
  write_line(eval_, line + csv_text(r.sample), dir_ + "/eval.csv");
}

}  // namespace gpt
