#include "parallel/zero_policy.hpp"

#include <algorithm>

namespace gpt {

namespace {
constexpr size_t kShardAlign = 64;  // elements; keeps every piece 128-byte aligned
size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
}  // namespace

size_t ZeroPolicy::piece_align() const {
  return state == optim::StateType::Int8 ? std::max<size_t>(kShardAlign, optim::kQuantBlock) : kShardAlign;
}

std::vector<BucketShape> bucket_shapes(const ParamLayout& layout, int world, const ZeroPolicy& policy) {
  std::vector<BucketShape> s(layout.n_buckets());
  for (int b = 0; b < layout.n_buckets(); ++b) {
    s[b].size = layout.bucket(b).size;
    if (!policy.shard_optimizer || world == 1) {
      s[b].shard = s[b].size;
      s[b].cap = s[b].size;
    } else {
      s[b].shard = round_up((s[b].size + world - 1) / world, policy.piece_align());
      s[b].cap = s[b].shard * world;
    }
  }
  return s;
}

}  // namespace gpt
