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

void write_regions(const std::string& path, const std::vector<Region>& regions, int threads, uint64_t& size,
                   uint64_t& hash) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f.fd < 0) throw Error(kExitFailure, sys_error("open", path));
  struct Piece {
    uint64_t off;
    const char* data;
    size_t bytes;
  };
  std::vector<Piece> pieces;
  for (const Region& r : regions)
    for (size_t at = 0; at < r.bytes; at += kPiece)
      pieces.push_back({r.offset + at, static_cast<const char*>(r.data) + at, std::min(kPiece, r.bytes - at)});
  parallel_for(pieces.size(), threads, [&](size_t i) {
    const Piece& p = pieces[i];
    for (size_t done = 0; done < p.bytes;) {
      const ssize_t n = ::pwrite(f.fd, p.data + done, p.bytes - done, off_t(p.off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error(kExitFailure, sys_error("write", path));
      done += size_t(n);
    }
  });
  if (::fsync(f.fd) != 0) throw Error(kExitFailure, sys_error("sync", path));
  struct stat st{};
  if (::fstat(f.fd, &st) != 0) throw Error(kExitFailure, sys_error("stat", path));
  size = uint64_t(st.st_size);
  // the whole file's hash, in file order: regions from memory, the gaps from the file
  std::vector<Region> sorted = regions;
  std::sort(sorted.begin(), sorted.end(), [](const Region& a, const Region& b) { return a.offset < b.offset; });
  std::unique_ptr<XXH3_state_t, StateDeleter> h(XXH3_createState());
  if (!h || XXH3_64bits_reset(h.get()) == XXH_ERROR) throw Error(kExitFailure, "XXH3: cannot allocate its state");
  std::vector<char> gap;
  uint64_t at = 0;
  auto hash_file_bytes = [&](uint64_t end) {
    while (at < end) {
      gap.resize(size_t(std::min<uint64_t>(end - at, kPiece)));
      const ssize_t n = ::pread(f.fd, gap.data(), gap.size(), off_t(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error(kExitFailure, sys_error("read back", path));
      XXH3_64bits_update(h.get(), gap.data(), size_t(n));
      at += uint64_t(n);
    }
  };
  for (const Region& r : sorted) {
    if (r.offset < at || r.offset + r.bytes > size)
      throw Error(kExitFailure, "'" + path + "': dataset bytes overlap or lie beyond the file's end");
    hash_file_bytes(r.offset);
    XXH3_64bits_update(h.get(), r.data, r.bytes);
    at += r.bytes;
  }
  hash_file_bytes(size);
  hash = XXH3_64bits_digest(h.get());
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
      for (size_t done = 0; done < got[i];) {
        const ssize_t n = ::pread(f.fd, bufs[i].data() + done, got[i] - done, off_t(lo + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw Error(kExitFailure, sys_error("read", path));
        if (n == 0) throw Error(kExitFailure, "'" + path + "' became shorter while it was read");
        done += size_t(n);
      }
    });
    for (size_t i = 0; i < t; ++i) XXH3_64bits_update(h.get(), bufs[i].data(), got[i]);
  }
  hash = XXH3_64bits_digest(h.get());
}

}  // namespace gpt
