// Finding a checkpoint folder from what a user points at (a run, its checkpoints/, `latest`, a step).
#include <filesystem>
#include <fstream>
#include <iostream>

#include "io/checkpoint.hpp"

namespace fs = std::filesystem;

namespace gpt {

namespace {
bool is_step_folder(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / "rank_00000.h5", ec);
}

// The newest complete checkpoint under <run>/checkpoints: the one `latest` names when it is there (it
// is written last), else the newest step folder (a kill between the rename and `latest`).
std::string newest_in(const fs::path& run) {
  std::ifstream in(run / "checkpoints" / "latest");
  std::string name;
  if (in && std::getline(in, name) && !name.empty() && is_step_folder(run / "checkpoints" / name)) {
    const auto all = list_checkpoints(run.string());
    // a newer complete folder than `latest` names is as good and loses less work
    if (!all.empty() && fs::path(all.front()).filename() != name) return all.front();
    return (run / "checkpoints" / name).string();
  }
  const auto all = list_checkpoints(run.string());
  return all.empty() ? std::string() : all.front();
}
}  // namespace

std::string latest_checkpoint(const std::string& run_dir) { return newest_in(fs::path(run_dir)); }

std::string resolve_checkpoint(const std::string& path) {
  std::string s = path;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const fs::path p(s);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw input_error("checkpoint '" + path + "' does not exist");
  if (is_step_folder(p)) return s;
  fs::path run = p;  // a run directory
  if (p.filename() == "latest") run = p.parent_path().parent_path();
  else if (p.filename() == "checkpoints") run = p.parent_path();
  const std::string found = newest_in(run.empty() ? fs::path(".") : run);
  if (found.empty())
    throw input_error("'" + path + "' holds no complete checkpoint: give a run directory, its checkpoints/ folder, "
                      "its checkpoints/latest or a checkpoints/step_NNNNNNNN folder");
  return found;
}

void read_resolved_checkpoint(const std::string& path, const std::function<void(const std::string& dir)>& read) {
  std::string dir = resolve_checkpoint(path);
  const bool one_folder = dir == path || is_step_folder(path);
  // a run keeps at least one checkpoint, and every retry is for a folder deleted meanwhile: the bound is
  // only a guard against a run that deletes faster than this reads
  for (int attempt = 0;; ++attempt) {
    try {
      read(dir);
      return;
    } catch (const std::exception&) {
      // whatever failed, a folder that is gone explains it
      std::error_code ec;
      if (one_folder || fs::exists(dir, ec) || attempt == 8) throw;
      const std::string next = resolve_checkpoint(path);
      if (next == dir) throw;
      std::cerr << "note: checkpoint '" << dir << "' was removed while it was read (the run keeps only its newest "
                << "checkpoints); reading '" << next << "' instead\n";
      dir = next;
    }
  }
}

}  // namespace gpt
