#include "model/init.hpp"

#include <algorithm>
#include <cmath>

#include "base/common.hpp"

namespace gpt {

void init_bucket(const ParamLayout& layout, int b, uint64_t seed, float std, std::vector<float>& out) {
  const Bucket& bk = layout.bucket(b);
  out.assign(bk.size, 0.0f);
  const size_t base = layout.logical_offset(b);
  for (const TensorInfo& t : bk.tensors) {
    float* p = out.data() + t.offset;
    const Init init = t.spec->init;
    if (init == Init::ones) std::fill(p, p + t.numel, 1.0f);
    if (init != Init::normal && init != Init::residual) continue;
    const float s = init == Init::residual ? std / std::sqrt(2.0f * layout.dims().n_layer) : std;
    const size_t n = t.real_numel;  // padded vocabulary rows stay zero
    // each value a pure function of (seed, logical index): Box-Muller over two SplitMix64 draws
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h1 = splitmix64(seed ^ splitmix64(base + t.offset + i)), h2 = splitmix64(h1);
      const double u1 = (double(h1 >> 11) + 1.0) * 0x1.0p-53, u2 = double(h2 >> 11) * 0x1.0p-53;
      p[i] = float(s * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  }
}

}  // namespace gpt
