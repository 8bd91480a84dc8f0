#include "dist/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gpt {
namespace {
constexpr size_t kShardAlign = 64;  // elements; keeps every piece 128-byte aligned
size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
}  // namespace

std::vector<BucketShape> bucket_shapes(const ParamLayout& layout, int world, int stage) {
  std::vector<BucketShape> s(layout.n_buckets());
  for (int b = 0; b < layout.n_buckets(); ++b) {
    s[b].size = layout.bucket(b).size;
    if (stage == 0 || world == 1) {
      s[b].shard = s[b].size;
      s[b].cap = s[b].size;
    } else {
      s[b].shard = round_up((s[b].size + world - 1) / world, kShardAlign);
      s[b].cap = s[b].shard * world;
    }
  }
  return s;
}

// The four roles a gather or gradient buffer can play: embedding, final, even layer, odd layer.
static int role_of(const ParamLayout& layout, int b) {
  if (b == 0) return 0;
  if (b == layout.final_bucket()) return 1;
  return 2 + (b - 1) % 2;
}
static size_t role_cap(const std::vector<BucketShape>& s, int role) {
  if (role == 0) return s.front().cap;
  if (role == 1) return s.back().cap;
  size_t m = 0;
  for (size_t b = 1; b + 1 < s.size(); ++b) m = std::max(m, s[b].cap);
  return m;
}

MemoryBreakdown predict_state_bytes(const ParamLayout& layout, int world, int stage, DType act, bool master) {
  auto s = bucket_shapes(layout, world, stage);
  size_t cap = 0, shard = 0;
  for (auto& x : s) {
    cap += x.cap;
    shard += x.shard;
  }
  const size_t e = dtype_size(act);
  size_t temps = 0;
  for (int r = 0; r < 4; ++r) temps += role_cap(s, r);
  MemoryBreakdown m;
  m.params = e * (stage == 3 ? shard : cap);
  m.grads = e * (stage >= 2 ? shard : cap);
  m.master = (master && act != DType::F32) ? 4 * shard : 0;
  m.adam_m = 4 * shard;
  m.adam_v = 4 * shard;
  m.comm = (stage >= 2 ? e * temps : 0) + (stage == 3 ? e * temps : 0);
  return m;
}

ZeroEngine::ZeroEngine(const ParamLayout& layout, Backend& be, Communicator& comm, HostComm& host, int stage,
                       bool master_weights)
    : layout_(layout), be_(be), comm_(comm), host_(host), stage_(stage), world_(comm.world()),
      rank_(comm.rank()), esz_(dtype_size(be.act_dtype())) {
  shape_ = bucket_shapes(layout, world_, stage_);
  const int nb = layout.n_buckets();
  full_off_.resize(nb);
  shard_off_.resize(nb);
  for (int b = 0; b < nb; ++b) {
    full_off_[b] = full_total_;
    shard_off_[b] = shard_total_;
    full_total_ += shape_[b].cap;
    shard_total_ += shape_[b].shard;
  }
  auto take = [&](size_t bytes, size_t& tally) {
    void* p = be_.alloc(bytes);
    be_.zero(p, bytes);
    tally += bytes;
    return p;
  };
  if (stage_ < 3) params_full_ = take(esz_ * full_total_, alloc_.params);
  else params_shard_ = take(esz_ * shard_total_, alloc_.params);
  if (stage_ < 2) grads_full_ = take(esz_ * full_total_, alloc_.grads);
  else grads_shard_ = take(esz_ * shard_total_, alloc_.grads);
  if (master_weights && be.act_dtype() != DType::F32)
    master_ = static_cast<float*>(take(4 * shard_total_, alloc_.master));
  m_ = static_cast<float*>(take(4 * shard_total_, alloc_.adam_m));
  v_ = static_cast<float*>(take(4 * shard_total_, alloc_.adam_v));
  if (stage_ >= 2)
    for (int r = 0; r < 4; ++r) grad_temps_.push_back(take(esz_ * role_cap(shape_, r), alloc_.comm));
  if (stage_ == 3)
    for (int r = 0; r < 4; ++r) gather_bufs_.push_back(take(esz_ * role_cap(shape_, r), alloc_.comm));
  gathered_.assign(nb, 0);
  pending_.assign(nb, 0);
  touched_.assign(nb, 0);
  temp_owner_.assign(4, -1);
}

ZeroEngine::~ZeroEngine() {
  for (void* p : {params_full_, params_shard_, grads_full_, grads_shard_, static_cast<void*>(master_),
                  static_cast<void*>(m_), static_cast<void*>(v_)})
    if (p) be_.free(p);
  for (void* p : grad_temps_) be_.free(p);
  for (void* p : gather_bufs_) be_.free(p);
}

char* ZeroEngine::act_ptr(void* base, size_t elems) const { return static_cast<char*>(base) + esz_ * elems; }

size_t ZeroEngine::piece_begin(int b) const {
  return stage_ == 0 ? 0 : std::min(shape_[b].size, size_t(rank_) * shape_[b].shard);
}
size_t ZeroEngine::piece_end(int b) const {
  return stage_ == 0 ? shape_[b].size : std::min(shape_[b].size, size_t(rank_ + 1) * shape_[b].shard);
}

void* ZeroEngine::param_piece(int b) {
  if (stage_ == 3) return act_ptr(params_shard_, shard_off_[b]);
  return act_ptr(params_full_, full_off_[b] + (stage_ == 0 ? 0 : size_t(rank_) * shape_[b].shard));
}
void* ZeroEngine::grad_piece(int b) {
  if (stage_ >= 2) return act_ptr(grads_shard_, shard_off_[b]);
  return act_ptr(grads_full_, full_off_[b] + (stage_ == 0 ? 0 : size_t(rank_) * shape_[b].shard));
}

// ---- parameters
void* ZeroEngine::gather_buffer(int b) { return gather_bufs_[role_of(layout_, b)]; }

void ZeroEngine::prefetch(int b) {
  if (stage_ != 3 || gathered_[b]) return;
  // the buffer's previous occupant is done: compute using it was queued before this call
  for (int o = 0; o < layout_.n_buckets(); ++o)
    if (o != b && gathered_[o] && role_of(layout_, o) == role_of(layout_, b)) gathered_[o] = 0;
  comm_.all_gather(act_ptr(params_shard_, shard_off_[b]), gather_buffer(b), shape_[b].shard, be_.act_dtype());
  comm_.record(b);
  gathered_[b] = 1;
}

const void* ZeroEngine::params(int b) {
  if (stage_ < 3) return act_ptr(params_full_, full_off_[b]);
  prefetch(b);
  comm_.wait(b);
  return gather_buffer(b);
}

// ---- gradients
void* ZeroEngine::grad_temp(int b) { return grad_temps_[role_of(layout_, b)]; }

void ZeroEngine::finish_pending_grad(int b) {
  if (!pending_[b]) return;
  comm_.wait(layout_.n_buckets() + b);
  be_.add_inplace(grad_piece(b), act_ptr(grad_temp(b), size_t(rank_) * shape_[b].shard), shape_[b].shard);
  pending_[b] = 0;
}

void* ZeroEngine::grads(int b) {
  if (stage_ < 2) return act_ptr(grads_full_, full_off_[b]);
  if (!touched_[b]) {
    const int role = role_of(layout_, b);
    if (temp_owner_[role] >= 0) finish_pending_grad(temp_owner_[role]);
    temp_owner_[role] = b;
    be_.zero(grad_temp(b), esz_ * shape_[b].cap);
    touched_[b] = 1;
  }
  return grad_temp(b);
}

void ZeroEngine::grads_done(int b) {
  const DType t = be_.act_dtype();
  if (stage_ < 2) {
    if (!last_micro_ || world_ == 1) return;
    void* g = act_ptr(grads_full_, full_off_[b]);
    if (stage_ == 0) comm_.all_reduce_sum(g, shape_[b].cap, t);
    else comm_.reduce_scatter_sum(g, act_ptr(g, size_t(rank_) * shape_[b].shard), shape_[b].shard, t);
    return;
  }
  void* g = grad_temp(b);
  if (world_ > 1) comm_.reduce_scatter_sum(g, act_ptr(g, size_t(rank_) * shape_[b].shard), shape_[b].shard, t);
  comm_.record(layout_.n_buckets() + b);
  pending_[b] = 1;
}

void ZeroEngine::begin_step() {
  if (stage_ < 2) be_.zero(grads_full_, esz_ * full_total_);
  else be_.zero(grads_shard_, esz_ * shard_total_);
}

void ZeroEngine::begin_micro_step(bool last) {
  last_micro_ = last;
  std::fill(touched_.begin(), touched_.end(), 0);
}

void ZeroEngine::end_backward() {
  if (stage_ >= 2)
    for (int b = 0; b < layout_.n_buckets(); ++b) finish_pending_grad(b);
  comm_.join();
  std::fill(temp_owner_.begin(), temp_owner_.end(), -1);
}

double ZeroEngine::grad_norm() {
  double s = 0;
  if (stage_ == 0) {
    s = be_.sum_squares(grads_full_, full_total_);
  } else if (stage_ >= 2) {
    s = host_.sum(be_.sum_squares(grads_shard_, shard_total_));
  } else {
    double local = 0;
    for (int b = 0; b < layout_.n_buckets(); ++b) local += be_.sum_squares(grad_piece(b), shape_[b].shard);
    s = host_.sum(local);
  }
  return std::sqrt(s);
}

void ZeroEngine::update(const OptimizerHyper& h) {
  for (int b = 0; b < layout_.n_buckets(); ++b) {
    // decayed tensors come first in every bucket: [0, split) decays, [split, size) does not
    const Bucket& bk = layout_.bucket(b);
    size_t split = bk.size;
    for (auto& t : bk.tensors)
      if (!t.decay) {
        split = t.offset;
        break;
      }
    const size_t lo = piece_begin(b), hi = piece_end(b);
    const size_t base = stage_ == 0 ? 0 : size_t(rank_) * shape_[b].shard;  // logical start of the piece
    for (int part = 0; part < 2; ++part) {
      const size_t s0 = std::max(lo, part == 0 ? size_t(0) : split);
      const size_t s1 = std::min(hi, part == 0 ? split : bk.size);
      if (s1 <= s0) continue;
      const size_t off = s0 - base;  // within the piece
      AdamWArgs a;
      a.param = act_ptr(param_piece(b), off);
      a.master = master_ ? master_ + shard_off_[b] + off : nullptr;
      a.grad = act_ptr(grad_piece(b), off);
      a.m = m_ + shard_off_[b] + off;
      a.v = v_ + shard_off_[b] + off;
      a.n = s1 - s0;
      a.lr = h.lr;
      a.beta1 = h.beta1;
      a.beta2 = h.beta2;
      a.eps = h.eps;
      a.weight_decay = part == 0 ? h.weight_decay : 0.0f;
      a.grad_scale = h.grad_scale;
      a.step = h.step;
      a.seed = h.seed;
      a.index_offset = layout_.logical_offset(b) + s0;
      be_.adamw(a);
    }
  }
  if (stage_ == 1 || stage_ == 2) {
    if (world_ > 1)
      for (int b = 0; b < layout_.n_buckets(); ++b) {
        void* p = act_ptr(params_full_, full_off_[b]);
        comm_.all_gather(act_ptr(p, size_t(rank_) * shape_[b].shard), p, shape_[b].shard, be_.act_dtype());
      }
    comm_.join();
  }
  std::fill(gathered_.begin(), gathered_.end(), 0);
}

// ---- state exchange (initialisation, checkpoints)
void ZeroEngine::set_bucket_params(int b, const float* full) {
  const size_t lo = piece_begin(b), hi = piece_end(b), n = shape_[b].size;
  float* stage_buf = static_cast<float*>(be_.alloc(4 * n));
  be_.copy_h2d(stage_buf, full, 4 * n);
  if (stage_ < 3) be_.f32_to_act(act_ptr(params_full_, full_off_[b]), stage_buf, n);
  else if (hi > lo) be_.f32_to_act(params_shard_ ? act_ptr(params_shard_, shard_off_[b]) : nullptr, stage_buf + lo, hi - lo);
  if (master_ && hi > lo) be_.copy_d2d(master_ + shard_off_[b], stage_buf + lo, 4 * (hi - lo));
  be_.synchronize();
  be_.free(stage_buf);
}

void ZeroEngine::get_piece(int b, State s, float* out) {
  const size_t n = piece_end(b) - piece_begin(b);
  if (n == 0) return;
  if (s == State::master && master_) {
    be_.copy_d2h(out, master_ + shard_off_[b], 4 * n);
  } else if (s == State::param || s == State::master) {
    float* tmp = static_cast<float*>(be_.alloc(4 * n));
    be_.act_to_f32(tmp, param_piece(b), n);
    be_.copy_d2h(out, tmp, 4 * n);
    be_.free(tmp);
  } else {
    be_.copy_d2h(out, (s == State::m ? m_ : v_) + shard_off_[b], 4 * n);
  }
}

void ZeroEngine::set_piece(int b, State s, const float* in) {
  const size_t n = piece_end(b) - piece_begin(b);
  if (s == State::master && master_) {
    if (n) be_.copy_h2d(master_ + shard_off_[b], in, 4 * n);
  } else if (s == State::param || s == State::master) {
    if (n) {
      float* tmp = static_cast<float*>(be_.alloc(4 * n));
      be_.copy_h2d(tmp, in, 4 * n);
      be_.f32_to_act(param_piece(b), tmp, n);
      be_.synchronize();
      be_.free(tmp);
    }
    if ((stage_ == 1 || stage_ == 2) && world_ > 1) {  // every rank needs the whole bucket
      void* p = act_ptr(params_full_, full_off_[b]);
      comm_.all_gather(act_ptr(p, size_t(rank_) * shape_[b].shard), p, shape_[b].shard, be_.act_dtype());
      comm_.join();
      be_.synchronize();
    }
    gathered_[b] = 0;
  } else if (n) {
    be_.copy_h2d((s == State::m ? m_ : v_) + shard_off_[b], in, 4 * n);
  }
}

void ZeroEngine::get_bucket_params(int b, float* full) {
  const size_t n = shape_[b].size;
  float* tmp = static_cast<float*>(be_.alloc(4 * n));
  const void* src;
  if (stage_ < 3) {
    src = act_ptr(params_full_, full_off_[b]);
  } else {
    gathered_[b] = 0;
    src = params(b);
  }
  be_.act_to_f32(tmp, src, n);
  be_.copy_d2h(full, tmp, 4 * n);
  be_.free(tmp);
  if (stage_ == 3) gathered_[b] = 0;
}

}  // namespace gpt
