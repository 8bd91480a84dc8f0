// Checkpoint raw I/O: regions written by several threads land at their offsets, the hash computed
// while writing is the file's own, a failure on one worker is the caller's error.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "io/raw_io.hpp"

using namespace gpt;

namespace {
std::string temp_path(const char* name) { return "/tmp/gpt2_test_raw_io_" + std::to_string(::getpid()) + name; }
}  // namespace

TEST(write_regions_places_bytes_and_hashes_the_whole_file) {
  const std::string p = temp_path("a");
  // a "metadata" prefix and a gap written first, as HDF5 leaves them; then three regions of which one
  // spans several 64 MiB pieces
  const size_t big = (size_t(64) << 20) * 2 + 12345;
  std::vector<char> head(4096, 'h'), a(big), b(777, 'b'), c(100, 'c');
  for (size_t i = 0; i < a.size(); ++i) a[i] = char(i * 131 + 7);
  const uint64_t off_a = 4096 + 10, off_b = off_a + big + 50, off_c = off_b + b.size();
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(head.data(), std::streamsize(head.size()));
  }
  CHECK(::truncate(p.c_str(), off_t(off_c + c.size() + 20)) == 0);  // a tail after the data, as HDF5's
  uint64_t size = 0, hash = 0;
  write_regions(p, {{off_c, c.data(), c.size()}, {off_a, a.data(), a.size()}, {off_b, b.data(), b.size()}}, 3,
                size, hash);
  CHECK(size == off_c + c.size() + 20);
  std::ifstream in(p, std::ios::binary);
  std::vector<char> all((std::istreambuf_iterator<char>(in)), {});
  CHECK(all.size() == size);
  CHECK(std::equal(a.begin(), a.end(), all.begin() + off_a));
  CHECK(std::equal(b.begin(), b.end(), all.begin() + off_b));
  CHECK(std::equal(c.begin(), c.end(), all.begin() + off_c));
  CHECK(hash == xxh3(all.data(), all.size()));
  uint64_t size2 = 0, hash2 = 0;
  for (int threads : {1, 4}) {
    hash_file(p, threads, size2, hash2);
    CHECK(size2 == size && hash2 == hash);
  }
  std::remove(p.c_str());
}

TEST(write_regions_refuses_overlaps_and_missing_files) {
  const std::string p = temp_path("b");
  { std::ofstream out(p, std::ios::binary | std::ios::trunc); }
  CHECK(::truncate(p.c_str(), 100) == 0);
  std::vector<char> x(60, 'x');
  uint64_t size = 0, hash = 0;
  CHECK_THROWS_WITH((write_regions(p, {{0, x.data(), 60}, {50, x.data(), 50}}, 2, size, hash)), "overlap");
  CHECK_THROWS_WITH((write_regions(p + "missing", {{0, x.data(), 60}}, 2, size, hash)), "cannot open");
  std::remove(p.c_str());
}

TEST(parallel_for_runs_every_index_and_passes_on_a_failure) {
  std::vector<int> hit(1000, 0);
  parallel_for(hit.size(), 4, [&](size_t i) { hit[i] += 1; });
  CHECK(std::count(hit.begin(), hit.end(), 1) == 1000);
  CHECK_THROWS_WITH(parallel_for(100, 3, [](size_t i) {
                      if (i == 42) throw std::runtime_error("item 42 failed");
                    }),
                    "item 42");
}

int main(int argc, char** argv) { return check::run_all(argc > 1 ? argv[1] : nullptr); }
