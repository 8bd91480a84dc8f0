#include "model/init.hpp"

#include <cmath>
#include <vector>

namespace gpt {

void init_bucket(const ParamLayout& layout, int b, uint64_t seed, float std, Backend& be, float* dst) {
  const Bucket& bk = layout.bucket(b);
  be.zero(dst, 4 * bk.size);
  const size_t base = layout.logical_offset(b);
  for (const TensorInfo& t : bk.tensors) {
    float* p = dst + t.offset;
    const Init init = t.spec->init;
    if (init == Init::ones) {
      const std::vector<float> ones(t.numel, 1.0f);
      be.copy_h2d(p, ones.data(), 4 * t.numel);
    }
    if (init != Init::normal && init != Init::residual) continue;
    const float s = init == Init::residual ? std / std::sqrt(2.0f * layout.dims().n_layer) : std;
    // padded vocabulary rows stay zero
    be.normal_init(NormalInit{p, t.real_numel, seed, base + t.offset, s});
  }
}

}  // namespace gpt
