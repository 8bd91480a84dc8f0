// Saving checkpoints: their folders, MANIFEST and publication (the files themselves: checkpoint_writer.cpp;
// reading them: checkpoint_read.cpp).
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/manifest.hpp"
#include "io/run_dir.hpp"

namespace fs = std::filesystem;

namespace gpt {
namespace {

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(kExitFailure, "cannot open '" + path + "' to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(kExitFailure, "fsync of '" + path + "' failed");
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}
// The step of a complete checkpoint folder's name (step_ and digits only), or -1.
int64_t step_of(const std::string& n) {
  if (n.size() <= 5 || n.compare(0, 5, "step_") != 0 || n.size() > 5 + 18) return -1;
  for (size_t i = 5; i < n.size(); ++i)
    if (n[i] < '0' || n[i] > '9') return -1;
  return std::stoll(n.substr(5));
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Deletes a checkpoint folder so that a kill part-way never leaves a partial folder under a complete
// one's name: renamed out of the way first, then removed.
void discard(const std::string& dir) {
  const std::string gone = dir + ".deleting";
  fs::remove_all(gone);
  fs::rename(dir, gone);
  fs::remove_all(gone);
}

}  // namespace

std::string rank_file(const std::string& dir, int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/rank_%05d.h5", r);
  return dir + buf;
}

std::string checkpoint_dir(const std::string& run_dir, int64_t step) {
  return run_dir + "/checkpoints/" + step_name(step);
}

std::string checkpoint_size_text(const std::string& run_dir, int64_t step, double sec) {
  double bytes = 0;
  std::error_code ec;
  for (auto& f : fs::directory_iterator(checkpoint_dir(run_dir, step), ec)) bytes += double(f.file_size(ec));
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.3f GB in %.2f s (%.2f GB/s)", bytes / 1e9, sec, sec > 0 ? bytes / 1e9 / sec : 0.0);
  return buf;
}

namespace {
// Every rank's file digest, gathered on every rank (rank r broadcasts its own: size, extent count, extents).
std::vector<FileDigest> gather_digests(const FileDigest& mine, HostComm& host) {
  std::vector<FileDigest> all(host.world());
  for (int r = 0; r < host.world(); ++r) {
    FileDigest& d = all[r];
    d.name = fs::path(rank_file("", r)).filename().string();
    uint64_t head[2] = {mine.size, mine.extents.size()};
    host.broadcast(head, sizeof head, r);
    d.size = head[0];
    std::vector<uint64_t> flat(4 * head[1]);
    if (r == host.rank())
      for (size_t i = 0; i < mine.extents.size(); ++i) {
        const Extent& e = mine.extents[i];
        flat[4 * i] = e.offset, flat[4 * i + 1] = e.bytes, flat[4 * i + 2] = e.xxh3, flat[4 * i + 3] = e.data;
      }
    if (!flat.empty()) host.broadcast(flat.data(), flat.size() * sizeof(uint64_t), r);
    for (size_t i = 0; i < head[1]; ++i)
      d.extents.push_back({flat[4 * i], flat[4 * i + 1], flat[4 * i + 2], flat[4 * i + 3] != 0});
  }
  return all;
}
}  // namespace

namespace {
// The folder of a finished step goes public: renamed from .tmp, `latest` pointed at it, then the
// checkpoints beyond keep_last and any leftovers removed (only now that the new one is durable).
void publish(const std::string& run_dir, const std::string& tmp, int64_t step, int keep_last) {
  const std::string root = run_dir + "/checkpoints", final_dir = checkpoint_dir(run_dir, step);
  fsync_path(tmp);
  if (fs::exists(final_dir)) discard(final_dir);
  fs::rename(tmp, final_dir);
  fsync_path(root);
  {
    std::ofstream out(root + "/latest.tmp", std::ios::trunc);
    out << step_name(step) << "\n";
    if (!out.flush()) throw Error(kExitFailure, "cannot write '" + root + "/latest.tmp'");
  }
  fsync_path(root + "/latest.tmp");
  fs::rename(root + "/latest.tmp", root + "/latest");
  fsync_path(root);
  // Keep the newest keep_last up to this step. Newer ones are left from a timeline this run abandoned
  // (it resumed past them because they were damaged): drop them too, so they neither displace good
  // checkpoints from the count nor get tried first by the next resume.
  size_t kept = 0;
  for (const std::string& p : list_checkpoints(run_dir))
    if (step_of(fs::path(p).filename().string()) > step || ++kept > size_t(keep_last)) discard(p);
  // leftovers of writes or deletions that a killed process did not finish
  for (auto& ent : fs::directory_iterator(root)) {
    const std::string n = ent.path().filename().string();
    if (n.rfind("step_", 0) == 0 && step_of(n) < 0 && (ends_with(n, ".tmp") || ends_with(n, ".deleting")))
      fs::remove_all(ent.path());
  }
}
}  // namespace

std::string prepare_checkpoint_dir(const std::string& run_dir, int64_t step, HostComm& host) {
  const std::string root = run_dir + "/checkpoints", tmp = checkpoint_dir(run_dir, step) + ".tmp";
  agreed(host, "checkpoint: preparing " + tmp, [&] {
    if (host.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(root, ec);
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec)) throw Error(kExitFailure, "cannot create '" + tmp + "': " + ec.message());
  });
  return tmp;
}

void abandon_checkpoint(const std::string& tmp, HostComm& host) {
  std::error_code ec;
  if (host.rank() == 0) fs::remove_all(tmp, ec);  // a full disk gets its space back; the previous ones stay
}

void publish_checkpoint(const std::string& run_dir, int64_t step, const FileDigest& mine, HostComm& host,
                        int keep_last) {
  const std::string final_dir = checkpoint_dir(run_dir, step), tmp = final_dir + ".tmp";
  const std::vector<FileDigest> digests = gather_digests(mine, host);
  // also the barrier: nobody continues before the checkpoint is published
  agreed(host, "checkpoint: publishing " + final_dir, [&] {
    if (host.rank() != 0) return;
    try {
      write_manifest(tmp, digests);  // last into the folder: one without it is never taken for a checkpoint
      publish(run_dir, tmp, step, keep_last);
    } catch (const std::exception& ex) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw Error(kExitFailure, std::string("publishing checkpoint '") + final_dir + "': " + ex.what() +
                                    full_disk_note(run_dir + "/checkpoints"));
    }
  });
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const std::string root = run_dir + "/checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (auto& ent : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(ent.path().filename().string());
    if (step >= 0 && ent.is_directory(ec)) found.emplace_back(step, ent.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace gpt
