// Raw file I/O at the disk's speed, for checkpoints: byte ranges written or read by several threads with
// pwrite/pread, each range's XXH3 computed by the thread that moves it, so every byte crosses memory once. No HDF5 here (the library is not thread-safe): the
// caller lays a file out with HDF5 on the main thread, and only the bytes of its datasets travel this way.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpt {

// Runs fn(i) for i in [0, n) on up to `threads` threads; rethrows the first exception once all stopped.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn);

// XXH3-64 of a buffer.
uint64_t xxh3(const void* data, size_t bytes);

// One dataset's bytes and where they go in the file.
struct Region {
  uint64_t offset = 0;
  const void* data = nullptr;
  size_t bytes = 0;
};

// A byte range of a file and the XXH3-64 of its bytes. `data`: a dataset's bytes (checked as they are
// read); otherwise the file's structure around them (HDF5's metadata, checked before the file is opened).
struct Extent {
  uint64_t offset = 0, bytes = 0, xxh3 = 0;
  bool data = false;
};

// Writes the regions into the existing file `path` (its other bytes already written and closed), in
// pieces of at most 64 MiB shared by `threads` threads, then fsyncs it. Returns its size and its extents,
// which tile the whole file in order: each piece hashed from memory as it is written, the bytes between
// them (HDF5's few metadata blocks) read back. Throws Error(kExitFailure) naming the file and the
// system's reason. `written` (when given) counts the bytes as they go out, for a caller that waits on
// another thread and wants to see the write make progress.
std::vector<Extent> write_regions(const std::string& path, const std::vector<Region>& regions, int threads,
                                  uint64_t& size, std::atomic<uint64_t>* written = nullptr);

// One extent of a file to read and check: its bytes must hash to `want`. Bytes [skip, skip + take) of it
// land at `out` (nullptr: checked only); an extent wanted whole is read straight into `out`.
struct ReadJob {
  const std::string* path = nullptr;
  uint64_t offset = 0, bytes = 0, want = 0;
  void* out = nullptr;
  size_t skip = 0, take = 0;
  std::string what;  // names the bytes in the error ("checkpoint file 'x' b0001/param")
};
// Reads the jobs with pread on `threads` threads (largest first), each file opened once, and checks
// every one's hash as its bytes arrive: one pass over the disk. A hash that differs is
// input_error("<what>: checksum mismatch ..."); a file that cannot be read, Error(kExitFailure).
void read_checked(const std::vector<ReadJob>& jobs, int threads);

// Size and XXH3-64 of a whole file, read by `threads` threads with pread, a window of `threads` pieces at
// a time (memory: threads x 64 MiB), each window hashed in order once read (MANIFEST 1 checkpoints).
void hash_file(const std::string& path, int threads, uint64_t& size, uint64_t& hash);

}  // namespace gpt
