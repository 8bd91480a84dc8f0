// How long page-locking the checkpoint snapshot's host memory takes, by how it is allocated: the set-up
// cost `checkpoint.every` > 0 pays once per run (23 GiB per rank for GPT-2 1558M on one GPU), and how much
// of it holds up the run's own CUDA calls when it is done on a thread beside them, as the snapshot does.
//
//   build/bench/host_pinning [--gib N] [--json FILE]
//
// Each way allocates N GiB (default 8), page-locks it for the GPU and times allocation plus locking,
// then one device-to-host copy of 1 GiB into it (a check that the memory is really locked: pageable
// memory copies at a fraction of the rate):
//   register_4k    aligned_alloc on 4 KiB pages, cudaHostRegister (what the snapshot did first)
//   register_thp   aligned_alloc on 2 MiB, madvise(MADV_HUGEPAGE), cudaHostRegister
//   prefault_thp   the same, each page written once first (the kernel allocates and zeroes it outside
//                  the registration), then cudaHostRegister; `fault s` is the writing's share
//   host_alloc     cudaHostAlloc (the driver allocates and locks)
// Then "beside": register_thp and prefault_thp again, in the snapshot's 512 MiB pieces on a thread of
// their own, while the main thread runs what a training step's host thread does in miniature (a 1 MiB
// memset on a stream and a wait for it, over and over): `held s` is the main thread's time beyond that
// loop's idle pace (its median call times the calls made), `worst ms` its longest call.
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kernels/check.cuh"

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  std::string way;
  double lock_s, fault_s, copy_gbps, held_s = 0, worst_ms = 0;
};

// One 1 GiB copy from the device into the first GiB of p, GB/s.
double copy_rate(void* p, void* dev, size_t bytes) {
  CUDA_CHECK(cudaMemcpy(p, dev, bytes, cudaMemcpyDeviceToHost));  // warm
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a));
  CUDA_CHECK(cudaMemcpyAsync(p, dev, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return bytes / 1e9 / (ms / 1e3);
}

// Writes one byte of every 4 KiB page of [p, p+n): the kernel allocates (and zeroes) them now.
void prefault(void* p, size_t n) {
  volatile char* b = static_cast<char*>(p);
  for (size_t i = 0; i < n; i += 4096) b[i] = 0;
}

// Allocates n bytes as `way` says and page-locks them in pieces of `piece` bytes (0: at once).
void* lock(const std::string& way, size_t n, size_t piece, double& fault_s) {
  void* p = nullptr;
  fault_s = 0;
  if (way == "host_alloc") {
    CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
    return p;
  }
  const bool thp = way != "register_4k", pre = way == "prefault_thp";
  p = std::aligned_alloc(thp ? size_t(2) << 20 : 4096, n);
  if (!p) std::exit((std::fprintf(stderr, "error: out of host memory\n"), 1));
  if (thp) madvise(p, n, MADV_HUGEPAGE);
  if (piece == 0) piece = n;
  for (size_t at = 0; at < n; at += piece) {
    char* q = static_cast<char*>(p) + at;
    const size_t k = std::min(piece, n - at);
    if (pre) {
      const auto t = std::chrono::steady_clock::now();
      prefault(q, k);
      fault_s += since(t);
    }
    CUDA_CHECK(cudaHostRegister(q, k, cudaHostRegisterDefault));
  }
  return p;
}

void unlock(const std::string& way, void* p, size_t n, size_t piece) {
  if (way == "host_alloc") {
    CUDA_CHECK(cudaFreeHost(p));
    return;
  }
  if (piece == 0) piece = n;
  for (size_t at = 0; at < n; at += piece) CUDA_CHECK(cudaHostUnregister(static_cast<char*>(p) + at));
  std::free(p);
}

Result run(const std::string& way, size_t n, void* dev, size_t copy) {
  const auto t0 = std::chrono::steady_clock::now();
  double fault_s = 0;
  void* p = lock(way, n, 0, fault_s);
  Result r{way, since(t0), fault_s, 0};
  r.copy_gbps = copy_rate(p, dev, copy);
  unlock(way, p, n, 0);
  return r;
}

// The way's locking in 512 MiB pieces on a thread, the main thread's small calls timed beside it.
Result beside(const std::string& way, size_t n, void* dev) {
  constexpr size_t kPiece = size_t(512) << 20;
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  auto call = [&] {
    const auto t = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaMemsetAsync(dev, 0, size_t(1) << 20, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return since(t);
  };
  std::vector<double> idle;
  for (int i = 0; i < 2000; ++i) idle.push_back(call());
  std::nth_element(idle.begin(), idle.begin() + idle.size() / 2, idle.end());
  const double pace = idle[idle.size() / 2];
  std::atomic<bool> done{false};
  Result r{way + "_beside", 0, 0, 0};
  void* p = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread th([&] {
    CUDA_CHECK(cudaSetDevice(0));
    p = lock(way, n, kPiece, r.fault_s);
    r.lock_s = since(t0);
    done = true;
  });
  double busy = 0;
  size_t calls = 0;
  while (!done) {
    const double d = call();
    busy += d;
    ++calls;
    r.worst_ms = std::max(r.worst_ms, 1e3 * d);
  }
  th.join();
  r.held_s = std::max(0.0, busy - pace * double(calls));
  r.copy_gbps = copy_rate(p, dev, kPiece);  // within one piece: a copy may not span two registrations
  unlock(way, p, n, kPiece);
  CUDA_CHECK(cudaStreamDestroy(s));
  return r;
}

}  // namespace

int run_all(int argc, char** argv) {
  double gib = 8;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gib" && i + 1 < argc) gib = std::atof(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else return std::fprintf(stderr, "usage: host_pinning [--gib N] [--json FILE]\n"), 2;
  }
  if (!(gib >= 1)) return std::fprintf(stderr, "error: --gib must be at least 1\n"), 2;
  const size_t n = size_t(gib * double(size_t(1) << 30)) & ~size_t(4095), copy = size_t(1) << 30;
  void* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, copy));
  CUDA_CHECK(cudaMemset(dev, 1, copy));
  std::string out = "[";
  std::printf("%-22s %8s %8s %8s %10s %8s %9s\n", "way", "lock s", "fault s", "GB/s", "d2h GB/s", "held s", "worst ms");
  std::vector<Result> rs;
  for (const char* way : {"register_4k", "register_thp", "prefault_thp", "host_alloc"}) rs.push_back(run(way, n, dev, copy));
  for (const char* way : {"register_thp", "prefault_thp"}) rs.push_back(beside(way, n, dev));
  for (const Result& r : rs) {
    std::printf("%-22s %8.2f %8.2f %8.2f %10.1f %8.2f %9.1f\n", r.way.c_str(), r.lock_s, r.fault_s, n / 1e9 / r.lock_s,
                r.copy_gbps, r.held_s, r.worst_ms);
    char buf[300];
    std::snprintf(buf, sizeof buf,
                  "%s{\"way\": \"%s\", \"bytes\": %zu, \"lock_s\": %.4f, \"fault_s\": %.4f, \"d2h_gbps\": %.2f, "
                  "\"held_s\": %.4f, \"worst_ms\": %.2f}",
                  out.size() > 1 ? ", " : "", r.way.c_str(), n, r.lock_s, r.fault_s, r.copy_gbps, r.held_s, r.worst_ms);
    out += buf;
  }
  out += "]\n";
  if (!json.empty()) {
    const std::string tmp = json + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f || std::fputs(out.c_str(), f) < 0 || std::fclose(f) != 0 || std::rename(tmp.c_str(), json.c_str()) != 0)
      return std::fprintf(stderr, "error: cannot write %s\n", json.c_str()), 1;
  }
  CUDA_CHECK(cudaFree(dev));
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run_all(argc, argv);
  } catch (const gpt::kern::KernelError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
