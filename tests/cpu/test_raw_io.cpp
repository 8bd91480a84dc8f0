// Checkpoint raw I/O: regions written by several threads land at their offsets, the extents hashed
// while writing tile the file and hash to its bytes, reads check every extent as it arrives, a failure
// on one worker is the caller's error; bf16 snapshot values widen in place.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "io/raw_io.hpp"
#include "io/snapshot.hpp"

using namespace gpt;

namespace {
std::string temp_path(const char* name) { return "/tmp/gpt2_test_raw_io_" + std::to_string(::getpid()) + name; }
}  // namespace

TEST(RawIo, write_regions_places_bytes_and_hashes_every_extent_of_the_file) {
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
  EXPECT_TRUE(::truncate(p.c_str(), off_t(off_c + c.size() + 20)) == 0);  // a tail after the data, as HDF5's
  uint64_t size = 0;
  const std::vector<Extent> ex =
      write_regions(p, {{off_c, c.data(), c.size()}, {off_a, a.data(), a.size()}, {off_b, b.data(), b.size()}}, 3, size);
  EXPECT_TRUE(size == off_c + c.size() + 20);
  std::ifstream in(p, std::ios::binary);
  std::vector<char> all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(all.size() == size);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), all.begin() + off_a));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + off_b));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), all.begin() + off_c));
  // the extents tile the file in order, each hashed right; data ones cover the regions, in <= 64 MiB pieces
  uint64_t at = 0, data_bytes = 0;
  for (const Extent& e : ex) {
    EXPECT_TRUE(e.offset == at && e.bytes > 0 && e.bytes <= (uint64_t(64) << 20));
    EXPECT_TRUE(e.xxh3 == xxh3(all.data() + e.offset, e.bytes));
    if (e.data) data_bytes += e.bytes;
    at += e.bytes;
  }
  EXPECT_TRUE(at == size && data_bytes == big + b.size() + c.size());
  EXPECT_TRUE(ex.front().offset == 0 && !ex.front().data && ex.front().bytes == off_a);
  EXPECT_TRUE(!ex.back().data && ex.back().bytes == 20);
  uint64_t size2 = 0, hash2 = 0;
  for (int threads : {1, 4}) {
    hash_file(p, threads, size2, hash2);
    EXPECT_TRUE(size2 == size && hash2 == xxh3(all.data(), all.size()));
  }
  std::remove(p.c_str());
}

TEST(RawIo, write_regions_refuses_overlaps_and_missing_files) {
  const std::string p = temp_path("b");
  { std::ofstream out(p, std::ios::binary | std::ios::trunc); }
  EXPECT_TRUE(::truncate(p.c_str(), 100) == 0);
  std::vector<char> x(60, 'x');
  uint64_t size = 0;
  EXPECT_THROW_WITH((write_regions(p, {{0, x.data(), 60}, {50, x.data(), 50}}, 2, size)), "overlap");
  EXPECT_THROW_WITH((write_regions(p + "missing", {{0, x.data(), 60}}, 2, size)), "cannot open");
  std::remove(p.c_str());
}

TEST(RawIo, read_checked_reads_once_checks_each_extent_and_finds_a_flipped_byte) {
  const std::string p = temp_path("r");
  std::vector<char> bytes(3 * 1000 + 17);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + 3);
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  // three extents: one read whole into place, one of which only a middle part is wanted, one checked only
  std::vector<char> whole(1000), part(300);
  std::vector<ReadJob> jobs = {
      {&p, 0, 1000, xxh3(bytes.data(), 1000), whole.data(), 0, 1000, "first"},
      {&p, 1000, 1000, xxh3(bytes.data() + 1000, 1000), part.data(), 200, 300, "second"},
      {&p, 2000, 1017, xxh3(bytes.data() + 2000, 1017), nullptr, 0, 0, "third"},
  };
  read_checked(jobs, 3);
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), bytes.begin()));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), bytes.begin() + 1200));
  // one byte changed on disk, outside the part that is wanted: still found, and named
  {
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(1010);
    f.put(char(bytes[1010] ^ 0x10));
  }
  EXPECT_THROW_WITH(read_checked(jobs, 2), "second: checksum mismatch");
  jobs[1].offset = 2500;  // beyond the end of the file
  jobs[1].want = 0;
  EXPECT_THROW_WITH(read_checked({jobs[1]}, 1), "ends before byte");
  std::remove(p.c_str());
}

TEST(RawIo, bf16_values_widen_in_place_in_their_fp32_slot) {
  for (size_t n : {size_t(1), size_t(7), size_t(4096), size_t(10000)}) {
    const size_t slot = (n + 15) / 16 * 16;
    std::vector<float> buf(slot, -1.0f), want(n);
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) {
      h[i] = f32_to_bf16(float(i) * 0.37f - 5.0f);
      want[i] = bf16_to_f32(h[i]);
    }
    std::memcpy(reinterpret_cast<char*>(buf.data()) + 2 * slot, h.data(), 2 * n);  // the upper half
    widen_bf16_in_place(buf.data(), n, slot);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), buf.begin())) << "n = " + std::to_string(n);
  }
}

TEST(RawIo, parallel_for_runs_every_index_and_passes_on_a_failure) {
  std::vector<int> hit(1000, 0);
  parallel_for(hit.size(), 4, [&](size_t i) { hit[i] += 1; });
  EXPECT_TRUE(std::count(hit.begin(), hit.end(), 1) == 1000);
  EXPECT_THROW_WITH(parallel_for(100, 3, [](size_t i) {
                      if (i == 42) throw std::runtime_error("item 42 failed");
                    }), "item 42");
}

