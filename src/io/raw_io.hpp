// Raw file I/O at the disk's speed, for checkpoints: byte ranges written or read by several threads with
// pwrite/pread, hashes with XXH3 computed in parallel. No HDF5 here (the library is not thread-safe): the
// caller lays a file out with HDF5 on the main thread, and only the bytes of its datasets travel this way.
#pragma once
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

// Writes the regions into the existing file `path` (its other bytes already written and closed), in
// pieces shared by `threads` threads, then fsyncs it. Returns the XXH3-64 and size of the whole file:
// the regions hashed from memory, the bytes between them read back (they are HDF5's few metadata blocks).
// Throws Error(kExitFailure) naming the file and the system's reason.
void write_regions(const std::string& path, const std::vector<Region>& regions, int threads, uint64_t& size,
                   uint64_t& hash);

// Size and XXH3-64 of a whole file, read by `threads` threads with pread, a window of `threads` pieces at
// a time (memory: threads x 64 MiB), each window hashed in order once read.
void hash_file(const std::string& path, int threads, uint64_t& size, uint64_t& hash);

}  // namespace gpt
