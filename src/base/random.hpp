// Counter-based random numbers for host and device code alike: SplitMix64, and GPT-2's normal
// initialisation as a pure function of (seed, logical index), so that neither depends on threads, ranks or
// the backend that draws them.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GPT_RANDOM_HD __host__ __device__ __forceinline__
#else
#define GPT_RANDOM_HD inline
#endif

namespace gpt {

// SplitMix64: a counter-based mixer. Initialisation, the synthetic corpus and stochastic rounding seeds
// are pure functions of (seed, index) through it.
GPT_RANDOM_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The initial value of logical element i, before its rounding to float: sd times a standard normal draw,
// Box-Muller over two SplitMix64 draws, in double. The host's value (its C library's log and cos) is the
// reference. CUDA's log and cos are within 1 and 2 units in the last place of the double and the C
// library's within 1, so the two doubles differ by less than 2^-49 of their value: they round to the same
// float unless one lies within that of a midpoint between two floats (kNormalInitGuard).
GPT_RANDOM_HD double normal_init_value(uint64_t seed, uint64_t i, float sd) {
  const uint64_t h1 = splitmix64(seed ^ splitmix64(i)), h2 = splitmix64(h1);
  const double u1 = (double(h1 >> 11) + 1.0) * 0x1.0p-53, u2 = double(h2 >> 11) * 0x1.0p-53;
  return sd * ::sqrt(-2.0 * ::log(u1)) * ::cos(2.0 * M_PI * u2);
}

// A device's value v is taken only where v (1 - g) and v (1 + g) round to the same float; elsewhere (about
// one value in 2^16) the host computes it. 2^9 times the bound above.
constexpr double kNormalInitGuard = 0x1.0p-40;

}  // namespace gpt
