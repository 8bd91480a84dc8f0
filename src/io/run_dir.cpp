#include "io/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/common.hpp"
#include "io/checkpoint.hpp"
#include "io/runlog.hpp"

namespace fs = std::filesystem;

namespace gpt {

bool holds_run(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir + "/log.h5", ec) || fs::exists(dir + "/checkpoints", ec);
}

namespace {
// A run's folder: its log, its checkpoints or its lock (a run that has just started has only the lock).
bool is_run_folder(const fs::path& dir) {
  std::error_code ec;
  return holds_run(dir.string()) || fs::exists(dir / ".lock", ec);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// What a run writes in its folder besides checkpoints/: the lock, log.h5 and the logs it kept
// (log.N.h5), and the CSV files of log.csv (train.csv, eval.csv and any it kept).
const char* run_file_kind(const std::string& name) {
  if (name == ".lock") return "lock";
  if (name.rfind("log.", 0) == 0 && ends_with(name, ".h5")) return "log";
  if (ends_with(name, ".csv")) return "CSV file";
  return nullptr;
}
}  // namespace

void check_output_path(const std::string& path, const std::string& flag, const std::string& command, bool force,
                       const std::string& reading, bool folder) {
  std::error_code ec;
  // symbolic links resolved: a link to a run's log is that log
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  const fs::path from = reading.empty() ? fs::path() : fs::weakly_canonical(fs::absolute(reading, ec), ec);
  const auto never = [&](const std::string& why) {
    throw input_error(flag + " '" + path + "' " + why + ": " + command + " never writes there (not even with " +
                      "--force); give another path");
  };
  if (const char* kind = run_file_kind(p.filename().string()); kind && is_run_folder(p.parent_path()))
    never(std::string("is a run's ") + kind);
  if (fs::is_directory(p, ec) && is_run_folder(p)) never("is a run's folder");
  for (fs::path a = p; a.has_relative_path(); a = a.parent_path()) {
    if (!from.empty() && a == from) never("lies inside the checkpoint " + command + " reads (" + reading + ")");
    if (a.filename() == "checkpoints" && fs::is_directory(a, ec) &&
        (fs::exists(a / "latest", ec) || is_run_folder(a.parent_path()) ||
         !list_checkpoints(a.parent_path().string()).empty()))
      never("lies inside a run's checkpoints folder '" + a.string() + "'");
    if (a == a.parent_path()) break;
  }
  const bool exists = fs::exists(fs::symlink_status(path, ec));
  if (exists && !folder && fs::is_directory(path, ec))
    throw input_error(flag + " '" + path + "' is a folder: give a file name");
  if (exists && folder && !fs::is_directory(path, ec))
    throw input_error(flag + " '" + path + "' is a file: give a folder (it is made when missing)");
  if (exists && !force)
    throw input_error(flag + " '" + path + "' exists: give --force to replace " +
                      (folder ? "the files " + command + " writes in it" : std::string("it")) + ", or another path");
}

void check_run_dir(const std::string& dir, bool resume, bool overwrite) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  fs::path existing = p;
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    throw input_error("run directory '" + dir + "': '" + existing.string() + "' is a file, not a directory");
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    throw input_error("run directory '" + dir + "': '" + existing.string() + "' is not writable (" +
                      std::strerror(errno) + ")");
  if (!resume && !overwrite && holds_run(dir))
    throw input_error("run directory '" + dir + "' already holds a run (log.h5 or checkpoints/): continue it with "
                      "--resume, choose another run.name, or set run.overwrite: true to replace it");
  const fs::path ck = fs::path(dir) / "checkpoints";
  if (fs::exists(ck, ec) && !fs::is_directory(ck, ec))
    throw input_error("run directory '" + dir + "': '" + ck.string() + "' is not a directory (checkpoints go there): "
                      "move it away");
  // the run log's disk reserve and room for the log itself (io/runlog.hpp), or the run cannot promise a
  // readable log with its outcome
  const fs::space_info sp = fs::space(existing, ec);
  if (!ec && sp.available < 2 * kLogReserveBytes)
    throw input_error("run directory '" + dir + "': the filesystem of '" + existing.string() + "' has " +
                      std::to_string(sp.available) + " bytes free, less than the " +
                      std::to_string(2 * kLogReserveBytes >> 10) + " KiB a run needs to keep its log readable "
                      "(log.h5 and its 256 KiB reserve); free some space there");
}

std::string keep_earlier_log(const std::string& dir) {
  // log.h5 and log.csv's files, each renamed to NAME.N.EXT with the first N free for every one of them
  const std::pair<const char*, const char*> files[] = {{"log", ".h5"}, {"train", ".csv"}, {"eval", ".csv"}};
  std::error_code ec;
  const auto at = [&](const std::pair<const char*, const char*>& f, const std::string& n) {
    return dir + "/" + f.first + n + f.second;
  };
  int n = 1;
  for (bool taken = true; taken; n += taken) {
    taken = false;
    for (const auto& f : files) taken = taken || fs::exists(at(f, "." + std::to_string(n)), ec);
  }
  std::string kept;
  for (const auto& f : files) {
    const std::string from = at(f, ""), to = at(f, "." + std::to_string(n));
    if (!fs::exists(from, ec)) continue;
    fs::rename(from, to, ec);
    if (ec) throw input_error("cannot keep the earlier run's log: renaming '" + from + "' to '" + to + "' failed: " +
                              ec.message());
    kept += (kept.empty() ? "" : ", ") + to;
  }
  return kept;
}

RunDirLock::RunDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw input_error("cannot create run directory '" + dir + "': " + ec.message());
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw input_error("cannot open '" + path + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw input_error("run directory '" + dir + "' is in use by another run (it holds " + path +
                        "); wait for it to end or choose another run.name");
    throw input_error("cannot lock '" + path + "': " + std::strerror(err));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

std::string full_disk_note(const std::string& path) {
  std::error_code ec;
  fs::path p = path;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  const fs::space_info sp = fs::space(p, ec);
  if (ec || sp.available >= (uint64_t(64) << 20)) return "";
  return " (the filesystem of '" + p.string() + "' is full: " + std::to_string(sp.available) + " bytes free)";
}

void remove_earlier_run(const std::string& dir) {
  std::error_code ec;
  fs::remove(dir + "/log.h5", ec);
  if (ec) throw input_error("run.overwrite: cannot remove '" + dir + "/log.h5': " + ec.message());
  fs::remove_all(dir + "/checkpoints", ec);
  if (ec) throw input_error("run.overwrite: cannot remove '" + dir + "/checkpoints': " + ec.message());
  for (const char* csv : {"/train.csv", "/eval.csv"}) {  // log.csv's copies of the replaced log's rows
    fs::remove(dir + csv, ec);
    if (ec) throw input_error("run.overwrite: cannot remove '" + dir + csv + "': " + ec.message());
  }
}

}  // namespace gpt
