#include "io/raw_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "base/common.hpp"

namespace gpt {

namespace {
// Large enough that each call streams at the disk's speed, small enough that a few threads share a
// dataset of a few hundred MB evenly.
constexpr size_t kPiece = size_t(64) << 20;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string sys_error(const std::string& what, const std::string& path) {
  return "cannot " + what + " '" + path + "': " + std::strerror(errno);
}

// Reads exactly `bytes` at `offset`; a file that ends sooner is an error.
void read_at(int fd, char* dst, size_t bytes, uint64_t offset, const std::string& path) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd, dst + done, bytes - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(kExitFailure, sys_error("read", path));
    if (n == 0) throw Error(kExitFailure, "'" + path + "' ends before byte " + std::to_string(offset + bytes));
    done += size_t(n);
  }
}

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
}  // namespace

void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const size_t t = std::max<size_t>(1, std::min<size_t>(size_t(std::max(threads, 1)), n));
  std::atomic<size_t> next{0};
  std::exception_ptr first;
  std::mutex mu;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
        next = n;  // the others stop at their next item
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < t; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

uint64_t xxh3(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::vector<Extent> write_regions(const std::string& path, const std::vector<Region>& regions, int threads,
                                  uint64_t& size, std::atomic<uint64_t>* written) {
  std::vector<Region> sorted = regions;
  std::sort(sorted.begin(), sorted.end(), [](const Region& a, const Region& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].offset < sorted[i - 1].offset + sorted[i - 1].bytes)
      throw Error(kExitFailure, "'" + path + "': dataset bytes overlap");
  Fd f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f.fd < 0) throw Error(kExitFailure, sys_error("open", path));
  // the regions' pieces in file order; each is written and hashed by one thread
  std::vector<Extent> pieces;
  std::vector<const char*> from;
  for (const Region& r : sorted)
    for (size_t at = 0; at < r.bytes; at += kPiece) {
      pieces.push_back({r.offset + at, std::min<uint64_t>(kPiece, r.bytes - at), 0, true});
      from.push_back(static_cast<const char*>(r.data) + at);
    }
  parallel_for(pieces.size(), threads, [&](size_t i) {
    Extent& p = pieces[i];
    for (size_t done = 0; done < p.bytes;) {
      const ssize_t n = ::pwrite(f.fd, from[i] + done, p.bytes - done, off_t(p.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error(kExitFailure, sys_error("write", path));
      done += size_t(n);
      if (written) written->fetch_add(uint64_t(n), std::memory_order_relaxed);
    }
    p.xxh3 = XXH3_64bits(from[i], p.bytes);
  });
  if (::fsync(f.fd) != 0) throw Error(kExitFailure, sys_error("sync", path));
  struct stat st{};
  if (::fstat(f.fd, &st) != 0) throw Error(kExitFailure, sys_error("stat", path));
  size = uint64_t(st.st_size);
  // the bytes between the pieces, read back: with them the extents cover the whole file
  std::vector<Extent> out;
  std::vector<char> gap;
  uint64_t at = 0;
  auto add_gap = [&](uint64_t end) {
    for (; at < end;) {
      gap.resize(size_t(std::min<uint64_t>(end - at, kPiece)));
      read_at(f.fd, gap.data(), gap.size(), at, path);
      out.push_back({at, gap.size(), XXH3_64bits(gap.data(), gap.size()), false});
      at += gap.size();
    }
  };
  for (const Extent& p : pieces) {
    if (p.offset + p.bytes > size) throw Error(kExitFailure, "'" + path + "': dataset bytes lie beyond the file's end");
    add_gap(p.offset);
    out.push_back(p);
    at = p.offset + p.bytes;
  }
  add_gap(size);
  return out;
}

void read_checked(const std::vector<ReadJob>& jobs, int threads) {
  struct Files {
    std::vector<std::pair<std::string, int>> fds;
    ~Files() {
      for (auto& [p, fd] : fds) ::close(fd);
    }
    int of(const std::string& path) const {
      for (auto& [p, fd] : fds)
        if (p == path) return fd;
      return -1;
    }
  } files;
  for (const ReadJob& j : jobs)
    if (files.of(*j.path) < 0) {
      const int fd = ::open(j.path->c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw Error(kExitFailure, sys_error("open", *j.path));
      files.fds.emplace_back(*j.path, fd);
    }
  // largest first, so that the last extents to finish are small ones
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return jobs[a].bytes > jobs[b].bytes; });
  parallel_for(order.size(), threads, [&](size_t i) {
    const ReadJob& j = jobs[order[i]];
    const bool direct = j.out && j.skip == 0 && j.take == j.bytes;
    std::vector<char> buf;
    char* dst = static_cast<char*>(j.out);
    if (!direct) {
      buf.resize(size_t(j.bytes));
      dst = buf.data();
    }
    read_at(files.of(*j.path), dst, size_t(j.bytes), j.offset, *j.path);
    if (XXH3_64bits(dst, size_t(j.bytes)) != j.want)
      throw input_error(j.what + ": checksum mismatch (corrupt data in bytes " + std::to_string(j.offset) + " to " +
                        std::to_string(j.offset + j.bytes) + ")");
    if (!direct && j.out) std::memcpy(j.out, dst + j.skip, j.take);
  });
}

void hash_file(const std::string& path, int threads, uint64_t& size, uint64_t& hash) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw Error(kExitFailure, sys_error("open", path));
  struct stat st{};
  if (::fstat(f.fd, &st) != 0) throw Error(kExitFailure, sys_error("stat", path));
  size = uint64_t(st.st_size);
  std::unique_ptr<XXH3_state_t, StateDeleter> h(XXH3_createState());
  if (!h || XXH3_64bits_reset(h.get()) == XXH_ERROR) throw Error(kExitFailure, "XXH3: cannot allocate its state");
  const size_t t = size_t(std::max(threads, 1));
  std::vector<std::vector<char>> bufs(t);
  std::vector<size_t> got(t);
  for (uint64_t base = 0; base < size; base += uint64_t(t) * kPiece) {
    parallel_for(t, int(t), [&](size_t i) {
      const uint64_t lo = base + i * kPiece, hi = std::min<uint64_t>(size, lo + kPiece);
      got[i] = lo < hi ? size_t(hi - lo) : 0;
      bufs[i].resize(got[i]);
      read_at(f.fd, bufs[i].data(), got[i], lo, path);
    });
    for (size_t i = 0; i < t; ++i) XXH3_64bits_update(h.get(), bufs[i].data(), got[i]);
  }
  hash = XXH3_64bits_digest(h.get());
}

}  // namespace gpt
