#include "io/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/common.hpp"
#include "io/runlog.hpp"

namespace fs = std::filesystem;

namespace gpt {

bool holds_run(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir + "/log.h5", ec) || fs::exists(dir + "/checkpoints", ec);
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
