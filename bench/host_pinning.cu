// How long page-locking the checkpoint snapshot's host memory takes, by how it is allocated: the set-up
// cost `checkpoint.every` > 0 pays once per run (23 GiB per rank for GPT-2 1558M on one GPU).
//
//   build/bench/host_pinning [--gib N] [--json FILE]
//
// Each way allocates N GiB (default 8), page-locks it for the GPU and times allocation plus locking,
// then one device-to-host copy of 1 GiB into it (a check that the memory is really locked: pageable
// memory copies at a fraction of the rate):
//   register_4k    aligned_alloc on 4 KiB pages, cudaHostRegister (what the snapshot did first)
//   register_thp   aligned_alloc on 2 MiB, madvise(MADV_HUGEPAGE), cudaHostRegister
//   host_alloc     cudaHostAlloc (the driver allocates and locks)
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/check.cuh"

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  const char* way;
  double lock_s, copy_gbps;
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

Result run(const char* way, size_t n, void* dev, size_t copy) {
  const auto t0 = std::chrono::steady_clock::now();
  void* p = nullptr;
  const bool alloc = std::strcmp(way, "host_alloc") == 0, thp = std::strcmp(way, "register_thp") == 0;
  if (alloc) {
    CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
  } else {
    p = std::aligned_alloc(thp ? size_t(2) << 20 : 4096, n);
    if (!p) std::exit((std::fprintf(stderr, "error: out of host memory\n"), 1));
    if (thp) madvise(p, n, MADV_HUGEPAGE);
    CUDA_CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
  }
  const double lock_s = since(t0);
  const double gbps = copy_rate(p, dev, copy);
  if (alloc) {
    CUDA_CHECK(cudaFreeHost(p));
  } else {
    CUDA_CHECK(cudaHostUnregister(p));
    std::free(p);
  }
  return {way, lock_s, gbps};
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
  std::printf("%-14s %10s %10s %14s\n", "way", "lock s", "GB/s", "d2h GB/s");
  for (const char* way : {"register_4k", "register_thp", "host_alloc"}) {
    const Result r = run(way, n, dev, copy);
    std::printf("%-14s %10.2f %10.2f %14.1f\n", r.way, r.lock_s, n / 1e9 / r.lock_s, r.copy_gbps);
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s{\"way\": \"%s\", \"bytes\": %zu, \"lock_s\": %.4f, \"d2h_gbps\": %.2f}",
                  out.size() > 1 ? ", " : "", r.way, n, r.lock_s, r.copy_gbps);
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
