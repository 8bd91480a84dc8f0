// The run directory and its rules: one run per directory at a time (an exclusive lock held for the run's
// life), a new run never clobbers an earlier one, and a run's output path is checked before any work.
#pragma once
#include <string>

namespace gpt {

// Whether dir holds an earlier run: its log.h5 or a checkpoints/ folder.
bool holds_run(const std::string& dir);

// The one rule for what the commands that write beside runs (`export --out`, `sample --logits`) may
// write: never a run's own files, whatever --force says: its .lock, its logs (log.h5, log.N.h5), its CSV
// files, anything inside its checkpoints/ folder or inside `reading` (the checkpoint the command reads),
// nor a folder that holds a run; and nothing that exists without --force. `folder`: the output is a folder
// (an existing file there is refused), else a file (an existing folder is refused). Throws input_error
// naming `flag` and `command` ("--logits 'PATH' is a run's log: sample never writes there ...").
void check_output_path(const std::string& path, const std::string& flag, const std::string& command, bool force,
                       const std::string& reading, bool folder);

// Checks, touching nothing, that a run may be written to dir: the path (or its nearest existing parent)
// is a writable directory with room for the run log and its reserve, dir/checkpoints (when there) is a
// directory, and without resume or overwrite, dir holds no earlier run. Throws input_error naming the
// directory and what to do.
void check_run_dir(const std::string& dir, bool resume, bool overwrite);

// Creates dir (and parents) and holds an exclusive flock on dir/.lock until destroyed (the kernel drops
// it however the process ends). Throws input_error when another process holds it.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// " (the filesystem of PATH is full: N bytes free)" when it has less than 64 MiB free, else "": for the
// messages of failed writes, whose library errors rarely say why.
std::string full_disk_note(const std::string& path);

// A resumed run that starts over (no checkpoint): the earlier run's dir/log.h5, and log.csv's train.csv
// and eval.csv, are renamed to log.N.h5, train.N.csv and eval.N.csv with the first N (1, 2, ...) free
// for all three, never overwritten; returns the new paths ("" when there was none of them).
std::string keep_earlier_log(const std::string& dir);

// run.overwrite: removes an earlier run's log.h5, checkpoints/ and log.csv's train.csv and eval.csv
// (under the lock).
void remove_earlier_run(const std::string& dir);

}  // namespace gpt
