#include "model/init.hpp"

#include <algorithm>
#include <cmath>

#include "base/common.hpp"

namespace gpt {

void init_bucket(const ParamLayout& layout, int b, uint64_t seed, float std, std::vector<float>& out) {
  const Bucket& bk = layout.bucket(b);
  const ModelDims& d = layout.dims();
  out.assign(bk.size, 0.0f);
  const size_t base = layout.logical_offset(b);
  for (const TensorInfo& t : bk.tensors) {
    float* p = out.data() + t.offset;
    if (t.id == P::ln1w || t.id == P::ln2w || t.id == P::lnfw) {
      std::fill(p, p + t.numel, 1.0f);
      continue;
    }
    if (t.shape.size() != 2) continue;  // biases stay zero
    float s = std;
    if (t.id == P::attprojw || t.id == P::fcprojw) s = std / std::sqrt(2.0f * d.n_layer);
    size_t n = t.numel;
    if (t.id == P::wte) n = size_t(d.vocab_size) * d.n_embd;  // padded rows stay zero
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h1 = splitmix64(seed ^ splitmix64(base + t.offset + i)), h2 = splitmix64(h1);
      const double u1 = (double(h1 >> 11) + 1.0) * 0x1.0p-53, u2 = double(h2 >> 11) * 0x1.0p-53;
      p[i] = float(s * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  }
}

}  // namespace gpt
