#include "parallel/zero.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "optim/step.hpp"

namespace gpt {
// The four roles a gather or gradient buffer can play: embedding, final, even layer, odd layer.
static int role_of(const ParamLayout& layout, int b) {
  if (b == 0) return 0;
  if (b == layout.final_bucket()) return 1;
  return 2 + (b - 1) % 2;
}
EngineSizes engine_sizes(const ParamLayout& layout, int world, const ZeroPolicy& policy) {
  EngineSizes z;
  z.shape = bucket_shapes(layout, world, policy);
  z.state = policy.state;
  for (auto& x : z.shape) {
    z.full_total += x.cap;
    z.shard_total += x.shard;
    z.state_total += policy.state == optim::StateType::Int8 ? optim::quant_blocks(x.shard) * optim::kQuantBlock : x.shard;
    z.max_shard = std::max(z.max_shard, x.shard);
  }
  z.offload = policy.offload;
  z.params = policy.shard_params ? z.shard_total : z.full_total;
  z.grads = policy.release_grads ? 0 : policy.shard_grads ? z.shard_total : z.full_total;
  z.role_cap[0] = z.shape.front().cap;
  z.role_cap[1] = z.shape.back().cap;
  for (size_t b = 1; b + 1 < z.shape.size(); ++b) z.role_cap[2] = std::max(z.role_cap[2], z.shape[b].cap);
  z.role_cap[3] = z.role_cap[2];
  z.grad_temps = policy.grads_in_temps();
  z.gather_bufs = policy.shard_params;
  if (policy.gather_fp8)
    for (int l = 0; l < layout.dims().n_layer; ++l) {
      const int b = layout.layer_bucket(l);
      z.fp8_gather_bytes = std::max(z.fp8_gather_bytes, 2 * z.shape[b].cap);
      z.rest_gather = std::max(z.rest_gather, 2 * size_t(world) * (layout.bucket(b).size - layout.bucket(b).decayed));
    }
  return z;
}

MemoryBreakdown EngineSizes::bytes(DType act, optim::MasterKind master, int n_slots) const {
  const size_t e = dtype_size(act);
  size_t roles = 0;
  for (size_t c : role_cap) roles += c;
  MemoryBreakdown m;
  m.params = e * params;
  m.grads = e * grads;
  m.master = optim::master_bytes_per_value(master_kind(act, master)) * shard_total;
  m.optim = optim::state_bytes(state, state_total) * size_t(n_slots);
  m.comm = (grad_temps ? e * roles : 0) + (gather_bufs ? e * roles : 0) + fp8_gather_bytes + e * rest_gather;
  if (offload) m.master = m.optim = 0;
  return m;
}

size_t EngineSizes::host_bytes(DType act, optim::MasterKind master, int n_slots) const {
  if (!offload) return 0;
  EngineSizes z = *this;
  z.offload = false;
  const MemoryBreakdown m = z.bytes(act, master, n_slots);
  return m.master + m.optim + 2 * size_t(kOffloadRing) * max_shard * dtype_size(act);
}

ZeroEngine::ZeroEngine(const ParamLayout& layout, Backend& be, Communicator& comm, HostComm& host,
                       const ZeroPolicy& policy, optim::MasterKind master, const Optimizer& optimizer)
    : layout_(layout), be_(be), opt_(optimizer), comm_(comm), host_(host), policy_(policy), world_(comm.world()),
      rank_(comm.rank()), esz_(dtype_size(be.act_dtype())) {
  state_names_ = {"param", "master"};
  for (const std::string& s : optimizer.slots()) state_names_.push_back(s);
  if (optimizer.slots().size() > size_t(optim::kMaxSlots))
    throw Error(kExitFailure, "internal error: an optimizer with more state slots than optim::kMaxSlots");
  if (optimizer.state() != policy.state)
    throw Error(kExitFailure, "internal error: the optimizer's state type is not the engine's");
  const EngineSizes z = engine_sizes(layout, world_, policy_);
  shape_ = z.shape;
  const int nb = layout.n_buckets();
  full_off_.resize(nb);
  shard_off_.resize(nb);
  state_off_.resize(nb);
  const bool q8 = policy_.state == optim::StateType::Int8;
  size_t at = 0;
  for (int b = 0; b < nb; ++b) {
    full_off_[b] = full_total_;
    shard_off_[b] = shard_total_;
    state_off_[b] = at;
    full_total_ += shape_[b].cap;
    shard_total_ += shape_[b].shard;
    at += q8 ? optim::quant_blocks(shape_[b].shard) * optim::kQuantBlock : shape_[b].shard;
  }
  auto take = [&](size_t bytes, size_t& tally) {
    void* p = be_.alloc(bytes);
    be_.zero(p, bytes);
    tally += bytes;
    return p;
  };
  // training.offload: the optimizer's memory on the host (the CPU backend's host memory is its device's:
  // counted as the offload component there; on a GPU host_bytes_, apart from the device's components)
  offload_ = policy_.offload;
  size_t& host_tally = be_.name() == "cpu" ? alloc_.offload : host_bytes_;
  auto take_state = [&](size_t bytes, size_t& tally) {
    return offload_ ? host_take(bytes, host_tally) : take(bytes, tally);
  };
  (policy_.shard_params ? params_shard_ : params_full_) = take(esz_ * z.params, alloc_.params);
  if (!policy_.release_grads) (policy_.shard_grads ? grads_shard_ : grads_full_) = take(esz_ * z.grads, alloc_.grads);
  switch (EngineSizes::master_kind(be.act_dtype(), master)) {
    case optim::MasterKind::F32: master_ = static_cast<float*>(take_state(4 * shard_total_, alloc_.master)); break;
    case optim::MasterKind::Compensated: residual_ = static_cast<uint16_t*>(take_state(2 * shard_total_, alloc_.master)); break;
    case optim::MasterKind::None: break;
  }
  for (size_t k = 0; k < optimizer.slots().size(); ++k) {
    slots_.push_back(take_state(optim::state_type_size(policy_.state) * z.state_total, alloc_.optim));
    if (q8) scales_.push_back(static_cast<float*>(take_state(4 * (z.state_total / optim::kQuantBlock), alloc_.optim)));
  }
  size_t flag_bytes = 0;  // not a memory component: 4 bytes
  if (offload_) {
    nonfinite_ = &host_nonfinite_;
    ring_elems_ = z.max_shard;
    ring_grad_ = host_take(esz_ * EngineSizes::kOffloadRing * ring_elems_, host_tally);
    ring_param_ = host_take(esz_ * EngineSizes::kOffloadRing * ring_elems_, host_tally);
  } else {
    nonfinite_ = static_cast<unsigned*>(take(sizeof(unsigned), flag_bytes));
  }
  if (policy_.release_grads) released_sq_ = static_cast<double*>(take(sizeof(double) * nb, flag_bytes));
  if (z.grad_temps)
    for (size_t c : z.role_cap) grad_temps_.push_back(take(esz_ * c, alloc_.comm));
  if (z.gather_bufs)
    for (size_t c : z.role_cap) gather_bufs_.push_back(take(esz_ * c, alloc_.comm));
  for (int k = 0; k < 2 && z.fp8_gather_bytes; ++k) {
    fp8_bufs_[k] = take(z.fp8_gather_bytes / 2, alloc_.comm);
    rest_bufs_[k] = take(esz_ * (z.rest_gather / 2), alloc_.comm);
  }
  fp8_w_.resize(nb);
  rest_.assign(nb, 0);
  fp8_queued_.assign(nb, 0);
  fp8_key_.assign(nb, 0);
  gathered_.assign(nb, 0);
  pending_.assign(nb, 0);
  touched_.assign(nb, 0);
  temp_owner_.assign(4, -1);
}

ZeroEngine::~ZeroEngine() {
  for (void* p : {params_full_, params_shard_, grads_full_, grads_shard_})
    if (p) be_.free(p);
  if (!offload_) {
    for (void* p : {static_cast<void*>(master_), static_cast<void*>(residual_), static_cast<void*>(nonfinite_)})
      if (p) be_.free(p);
    for (void* p : slots_) be_.free(p);
    for (float* p : scales_) be_.free(p);
  } else {
    try {
      be_.synchronize();  // no upload still reads a ring
      for (void* p : pinned_) be_.unpin_host(p);
      for (void* p : host_blocks_) std::free(p);
    } catch (const Error&) {
      // the device failed: the memory is left to the process's end rather than freed under a copy
    }
  }
  for (void* p : grad_temps_) be_.free(p);
  for (void* p : gather_bufs_) be_.free(p);
  if (released_sq_) be_.free(released_sq_);
  for (void* p : {fp8_bufs_[0], fp8_bufs_[1], rest_bufs_[0], rest_bufs_[1]})
    if (p) be_.free(p);
}

char* ZeroEngine::act_ptr(void* base, size_t elems) const { return static_cast<char*>(base) + esz_ * elems; }

void* ZeroEngine::host_take(size_t bytes, size_t& tally) {
  const size_t page = 4096, whole = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  void* p = std::aligned_alloc(page, whole);  // aligned as the device's allocations (the step's vector paths)
  if (!p)
    throw Error(kExitOutOfMemory, "out of host memory: training.offload needs " + std::to_string(bytes) +
                                      " more bytes of host memory for the optimizer's state");
  host_blocks_.push_back(p);
  std::memset(p, 0, whole);
  if (be_.pin_host(p, whole)) pinned_.push_back(p);  // else pageable: the copies still work, slower
  tally += bytes;
  return p;
}

void ZeroEngine::state_to_host(void* dst, const void* src, size_t bytes) {
  if (offload_) std::memcpy(dst, src, bytes);
  else be_.copy_d2h(dst, src, bytes);
}
void ZeroEngine::state_from_host(void* dst, const void* src, size_t bytes) {
  if (offload_) std::memcpy(dst, src, bytes);
  else be_.copy_h2d(dst, src, bytes);
}

void* ZeroEngine::slot_ptr(int s, int b, size_t off) const {
  return static_cast<char*>(slots_[size_t(s - 2)]) + optim::state_type_size(policy_.state) * (state_off_[b] + off);
}
float* ZeroEngine::scale_ptr(int s, int b, size_t off) const {
  return scales_[size_t(s - 2)] + (state_off_[b] + off) / optim::kQuantBlock;
}

size_t ZeroEngine::piece_start(int b) const {
  return policy_.shard_optimizer ? size_t(rank_) * shape_[b].shard : 0;
}
size_t ZeroEngine::piece_begin(int b) const { return std::min(shape_[b].size, piece_start(b)); }
size_t ZeroEngine::piece_end(int b) const {
  return policy_.shard_optimizer ? std::min(shape_[b].size, size_t(rank_ + 1) * shape_[b].shard) : shape_[b].size;
}

void* ZeroEngine::param_piece(int b) {
  if (policy_.shard_params) return act_ptr(params_shard_, shard_off_[b]);
  return act_ptr(params_full_, full_off_[b] + piece_start(b));
}
void* ZeroEngine::grad_piece(int b) {
  if (policy_.shard_grads) return act_ptr(grads_shard_, shard_off_[b]);
  return act_ptr(grads_full_, full_off_[b] + piece_start(b));
}

// ---- parameters
void* ZeroEngine::gather_buffer(int b) { return gather_bufs_[role_of(layout_, b)]; }

void ZeroEngine::gather_whole(int b) {
  comm_.all_gather(act_ptr(params_shard_, shard_off_[b]), gather_buffer(b), shape_[b].shard, be_.act_dtype());
}

// gathered_: 0 not gathered, 1 queued, 2 waited for (and a rest unpacked)
void ZeroEngine::settle_gather(int b) {
  if (gathered_[b] == 1) comm_.wait(b);
  gathered_[b] = 0;
}

// Rank r's part of bucket b's rest (past its FP8 weights): [first, second) of the bucket
std::pair<size_t, size_t> ZeroEngine::rest_part(int b, int r) const {
  const size_t lo = size_t(r) * shape_[b].shard;
  return {std::max(lo, layout_.bucket(b).decayed), std::min(lo + shape_[b].shard, shape_[b].size)};
}

void ZeroEngine::prefetch(int b) {
  if (!policy_.shard_params || gathered_[b]) return;
  // the buffer's previous occupant is done: compute using it was queued before this call
  for (int o = 0; o < layout_.n_buckets(); ++o)
    if (o != b && gathered_[o] && role_of(layout_, o) == role_of(layout_, b)) settle_gather(o);
  if (fp8_w_[b].empty()) {
    gather_whole(b);
  } else {
    // the rest of the bucket (past its FP8 weights): each rank's part of it, padded to the same length
    const auto [s0, s1] = rest_part(b, rank_);
    void* mine = act_ptr(rest_buffer(b), size_t(rank_) * rest_[b]);
    if (s1 > s0) be_.copy_d2d(mine, act_ptr(param_piece(b), s0 - piece_start(b)), esz_ * (s1 - s0));
    comm_.all_gather(mine, rest_buffer(b), rest_[b], be_.act_dtype());
  }
  comm_.record(b);
  gathered_[b] = 1;
}

void ZeroEngine::unpack_rest(int b) {
  for (int r = 0; r < world_; ++r) {
    const auto [s0, s1] = rest_part(b, r);
    if (s1 > s0)
      be_.copy_d2d(act_ptr(gather_buffer(b), s0), act_ptr(rest_buffer(b), size_t(r) * rest_[b]), esz_ * (s1 - s0));
  }
}

const void* ZeroEngine::params(int b) {
  if (!policy_.shard_params) return act_ptr(params_full_, full_off_[b]);
  prefetch(b);
  if (gathered_[b] == 1) {
    comm_.wait(b);
    if (!fp8_w_[b].empty()) unpack_rest(b);
    gathered_[b] = 2;
  }
  return gather_buffer(b);
}

// ---- FP8 weights gathered as FP8
void ZeroEngine::gather_fp8(int b, std::vector<Fp8WeightRange> weights) {
  const Bucket& bk = layout_.bucket(b);
  if (!policy_.gather_fp8 || bk.scope != Scope::layer || !be_.supports_fp8().empty())
    throw Error(kExitFailure, "internal error: FP8 weight gathers need ZeRO-3 with gather_fp8 and a layer bucket");
  size_t covered = 0, decayed = 0;
  for (const TensorInfo& t : bk.tensors)
    if (t.decay) {
      ++decayed;
      for (const Fp8WeightRange& w : weights) covered += w.offset == t.offset && w.n == t.numel;
    }
  if (covered != decayed || weights.size() != decayed)
    throw Error(kExitFailure, "internal error: FP8 weight gathers need every decayed tensor of the bucket, once");
  settle_gather(b);
  fp8_w_[b] = std::move(weights);
  rest_[b] = bk.size - bk.decayed;
}

void ZeroEngine::prefetch_fp8(int b, uint64_t key) {
  if (fp8_w_[b].empty() || (fp8_queued_[b] && fp8_key_[b] == key)) return;
  // the buffer's previous occupant was handed out (or is dropped here once its gather is done)
  for (int o = b % 2 == 1 ? 1 : 2; o < layout_.n_buckets(); o += 2) settle_fp8(o);
  uint8_t* buf = fp8_buffer(b);
  const size_t shard = shape_[b].shard, lo = piece_start(b);
  for (const Fp8WeightRange& w : fp8_w_[b]) {
    const size_t s0 = std::max(lo, w.offset), s1 = std::min(lo + shard, w.offset + w.n);
    if (s1 <= s0) continue;
    Fp8Tensor q = w.q;
    q.data = buf + s0;
    be_.fp8_quantize({q, act_ptr(param_piece(b), s0 - lo), s1 - s0});
  }
  comm_.all_gather_bytes(buf + lo, buf, shard);
  comm_.record(fp8_slot(b));
  fp8_queued_[b] = 1;
  fp8_key_[b] = key;
}

const void* ZeroEngine::fp8_params(int b, uint64_t key) {
  if (fp8_w_[b].empty()) return nullptr;
  prefetch_fp8(b, key);
  settle_fp8(b);  // handed out: the next call gathers again
  return fp8_buffer(b);
}

void ZeroEngine::settle_fp8(int b) {
  if (fp8_queued_[b]) comm_.wait(fp8_slot(b));
  fp8_queued_[b] = 0;
}

void ZeroEngine::drop_fp8_gathers() {
  for (int b = 0; b < layout_.n_buckets(); ++b) settle_fp8(b);
}

// ---- gradients
void* ZeroEngine::grad_temp(int b) { return grad_temps_[role_of(layout_, b)]; }

void ZeroEngine::finish_pending_grad(int b) {
  if (!pending_[b]) return;
  comm_.wait(layout_.n_buckets() + b);
  pending_[b] = 0;
  void* piece = act_ptr(grad_temp(b), size_t(rank_) * shape_[b].shard);  // this rank's, reduce-scattered
  if (!policy_.release_grads) return be_.add_inplace(grad_piece(b), piece, shape_[b].shard);
  apply_released(b, policy_.shard_optimizer ? piece : grad_temp(b));  // else all-reduced: the whole bucket
}

// training.gradient_release: bucket b's update from its reduced gradient `grad` (this rank's piece of it),
// its sum of squares kept on the device for grad_norm (no wait in the backward)
void ZeroEngine::apply_released(int b, const void* grad) {
  const size_t n = policy_.shard_optimizer ? shape_[b].shard : shape_[b].size;  // a shard's padding holds zeros
  be_.sum_squares(SumSquares{grad, n, released_sq_ + b});
  for (const ParamRange& r : ranges(b, param_piece(b), grad)) opt_.update(be_, r, release_h_);
}

void* ZeroEngine::grads(int b) {
  if (!policy_.grads_in_temps()) return act_ptr(grads_full_, full_off_[b]);
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
  if (policy_.release_grads) {  // the bucket's whole gradient is in its role's buffer
    if (!releasing_) return;  // FP8 calibration, micro_batch: max's trial: the gradient is thrown away
    if (world_ == 1) return apply_released(b, grad_temp(b));
    // reduced on the communication stream as below (all-reduced where the optimizer is not sharded), and
    // updated once that is done (finish_pending_grad), the backward going on meanwhile
    if (!policy_.shard_optimizer) {
      comm_.all_reduce_sum(grad_temp(b), shape_[b].cap, t);
      comm_.record(layout_.n_buckets() + b);
      pending_[b] = 1;
      return;
    }
  } else if (!policy_.shard_grads) {
    if (!last_micro_ || world_ == 1) return;
    void* g = act_ptr(grads_full_, full_off_[b]);
    if (!policy_.shard_optimizer) comm_.all_reduce_sum(g, shape_[b].cap, t);
    else comm_.reduce_scatter_sum(g, act_ptr(g, size_t(rank_) * shape_[b].shard), shape_[b].shard, t);
    return;
  }
  void* g = grad_temp(b);
  if (world_ > 1) comm_.reduce_scatter_sum(g, act_ptr(g, size_t(rank_) * shape_[b].shard), shape_[b].shard, t);
  comm_.record(layout_.n_buckets() + b);
  pending_[b] = 1;
}

void ZeroEngine::begin_step() {
  if (policy_.release_grads) return;  // nothing accumulates: each bucket's buffer is zeroed as it is taken
  if (policy_.shard_grads) be_.zero(grads_shard_, esz_ * shard_total_);
  else be_.zero(grads_full_, esz_ * full_total_);
}

void ZeroEngine::release_step(const OptimizerHyper& h) {
  ++params_version_;
  be_.after_copies();  // a snapshot's copies read what the first update is about to write
  release_h_ = h;
  releasing_ = true;
}

void ZeroEngine::begin_micro_step(bool last) {
  last_micro_ = last;
  std::fill(touched_.begin(), touched_.end(), 0);
}

void ZeroEngine::end_backward() {
  releasing_ = false;
  if (policy_.grads_in_temps())
    for (int b = 0; b < layout_.n_buckets(); ++b) finish_pending_grad(b);
  comm_.join();
  std::fill(temp_owner_.begin(), temp_owner_.end(), -1);
}

double ZeroEngine::grad_norm() {
  double s = 0;
  if (policy_.release_grads) {  // bucket by bucket, in the buckets' order
    std::vector<double> sq(layout_.n_buckets());
    be_.copy_d2h(sq.data(), released_sq_, sizeof(double) * sq.size());
    for (double x : sq) s += x;
    if (policy_.shard_optimizer) s = host_.sum(s);  // each rank's pieces
  } else if (!policy_.shard_optimizer) {
    s = be_.sum_squares(SumSquares{grads_full_, full_total_});
  } else if (policy_.shard_grads) {
    s = host_.sum(be_.sum_squares(SumSquares{grads_shard_, shard_total_}));
  } else {
    double local = 0;
    for (int b = 0; b < layout_.n_buckets(); ++b) local += be_.sum_squares(SumSquares{grad_piece(b), shape_[b].shard});
    s = host_.sum(local);
  }
  return std::sqrt(s);
}

std::vector<ParamRange> ZeroEngine::ranges(int b, void* param, const void* grad) {
  std::vector<ParamRange> out;
  // decayed tensors come first in every bucket: [0, split) decays, [split, size) does not
  const Bucket& bk = layout_.bucket(b);
  const size_t split = bk.decayed;
  const size_t lo = piece_begin(b), hi = piece_end(b);
  const size_t base = piece_start(b);  // logical start of the piece
  if (policy_.state != optim::StateType::F32) {
    // bf16 and int8 state: the whole piece at once (it starts at a block's start), its decayed part first
    if (hi <= lo) return out;
    ParamRange r;
    r.param = param;
    r.master = master_ ? master_ + shard_off_[b] : nullptr;
    r.residual = residual_ ? residual_ + shard_off_[b] : nullptr;
    r.grad = grad;
    for (size_t k = 0; k < slots_.size(); ++k) {
      r.slot[k] = slot_ptr(int(k) + 2, b, 0);
      if (!scales_.empty()) r.scale[k] = scale_ptr(int(k) + 2, b, 0);
    }
    r.n = hi - lo;
    r.n_decay = std::min(hi, std::max(lo, split)) - lo;
    r.index_offset = layout_.logical_offset(b) + lo;
    r.nonfinite = nonfinite_;
    out.push_back(r);
    return out;
  }
  for (int part = 0; part < 2; ++part) {
    const size_t s0 = std::max(lo, part == 0 ? size_t(0) : split);
    const size_t s1 = std::min(hi, part == 0 ? split : bk.size);
    if (s1 <= s0) continue;
    const size_t off = s0 - base;  // within the piece
    ParamRange r;
    r.param = act_ptr(param, off);
    r.master = master_ ? master_ + shard_off_[b] + off : nullptr;
    r.residual = residual_ ? residual_ + shard_off_[b] + off : nullptr;
    r.grad = act_ptr(const_cast<void*>(grad), off);
    for (size_t k = 0; k < slots_.size(); ++k) r.slot[k] = slot_ptr(int(k) + 2, b, off);
    r.n = s1 - s0;
    r.decay = part == 0;
    r.index_offset = layout_.logical_offset(b) + s0;
    r.nonfinite = nonfinite_;
    out.push_back(r);
  }
  return out;
}

void ZeroEngine::update(const OptimizerHyper& h) {
  ++params_version_;
  be_.after_copies();  // a snapshot's copies read what the optimizer is about to write
  if (offload_) {
    update_offloaded(h);
  } else if (!policy_.release_grads) {  // released: every bucket was updated in the backward
    for (int b = 0; b < layout_.n_buckets(); ++b)
      for (const ParamRange& r : ranges(b, param_piece(b), grad_piece(b))) opt_.update(be_, r, h);
  }
  if (policy_.gathers_after_update()) {
    if (world_ > 1)
      for (int b = 0; b < layout_.n_buckets(); ++b) {
        void* p = act_ptr(params_full_, full_off_[b]);
        comm_.all_gather(act_ptr(p, size_t(rank_) * shape_[b].shard), p, shape_[b].shard, be_.act_dtype());
      }
    comm_.join();
  }
  for (int b = 0; b < layout_.n_buckets(); ++b) settle_gather(b);
  drop_fp8_gathers();
}

// training.offload: the update on the host, pipelined by bucket: the gradient pieces (and, where the
// update reads them, the parameter pieces) of the next kOffloadRing buckets come down while the host
// updates one, and each bucket's new parameters go up on the compute stream, ahead of the next forward.
// A ring slot is reused by the bucket kOffloadRing later, whose download is queued after the upload
// from that slot, so it never overwrites a piece still to go up.
void ZeroEngine::update_offloaded(const OptimizerHyper& h) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  double host_s = 0;
  const int nb = layout_.n_buckets(), ring = EngineSizes::kOffloadRing;
  const bool read_params = master_ == nullptr;  // no fp32 master: the update starts from the parameters
  std::vector<uint64_t> ticket(size_t(nb), 0);
  auto down = [&](int b) {
    const size_t n = piece_end(b) - piece_begin(b);
    if (n == 0) return;
    const size_t slot = size_t(b % ring) * ring_elems_;
    ticket[b] = be_.download(act_ptr(ring_grad_, slot), grad_piece(b), esz_ * n);
    if (read_params) ticket[b] = be_.download(act_ptr(ring_param_, slot), param_piece(b), esz_ * n);
  };
  for (int b = 0; b < std::min(ring, nb); ++b) down(b);
  for (int b = 0; b < nb; ++b) {
    const size_t n = piece_end(b) - piece_begin(b);
    if (n > 0) {
      be_.wait_download(ticket[b]);  // b's copies, the last one queued for it
      char* param = act_ptr(ring_param_, size_t(b % ring) * ring_elems_);
      const char* grad = act_ptr(ring_grad_, size_t(b % ring) * ring_elems_);
      const auto t1 = clock::now();
      for (ParamRange r : ranges(b, param, grad)) {
        // where the device's kernel would find its pointers aligned: the parameters' and gradients' own,
        // and the state's (host memory aligned as the device's, at the same offsets)
        const size_t off = (static_cast<const char*>(r.grad) - grad) / esz_;
        r.device_aligned = optim::step_aligned({{act_ptr(param_piece(b), off), esz_}, {act_ptr(grad_piece(b), off), esz_},
                                                {r.master, 4}, {r.residual, 2}, {r.slot[0], 4}, {r.slot[1], 4}});
        opt_.update_host(be_, r, h);
      }
      host_s += std::chrono::duration<double>(clock::now() - t1).count();
      be_.upload(param_piece(b), param, esz_ * n);
    }
    if (b + ring < nb) down(b + ring);
  }
  offload_ms_ = 1000.0 * host_s;
  offload_wait_ms_ = 1000.0 * std::chrono::duration<double>(clock::now() - t0).count() - offload_ms_;
}

bool ZeroEngine::state_finite() {
  unsigned flag = 0;
  if (offload_) {
    be_.synchronize();
    flag = host_nonfinite_;
    host_nonfinite_ = 0;
    return flag == 0;
  }
  be_.copy_d2h(&flag, nonfinite_, sizeof flag);
  if (flag) be_.zero(nonfinite_, sizeof flag);
  return flag == 0;
}

// ---- state exchange (initialisation, checkpoints)
void ZeroEngine::set_bucket_params(int b, const float* full, bool on_device) {
  ++params_version_;
  be_.after_copies();
  const size_t lo = piece_begin(b), hi = piece_end(b), n = shape_[b].size;
  float* staged = on_device ? nullptr : static_cast<float*>(be_.alloc(4 * n));
  if (staged) be_.copy_h2d(staged, full, 4 * n);
  const float* dev = staged ? staged : full;
  if (!policy_.shard_params) be_.f32_to_act(act_ptr(params_full_, full_off_[b]), dev, n);
  else if (hi > lo) be_.f32_to_act(params_shard_ ? act_ptr(params_shard_, shard_off_[b]) : nullptr, dev + lo, hi - lo);
  // the residuals of values on a GPU are split there (the device's initialisation: no copy to the host)
  const bool split_here = residual_ && on_device && !offload_ && be_.name() == "cuda";
  if (split_here && hi > lo) {
    uint16_t* res = residual_ + shard_off_[b];
    be_.run_op("compensated_split", [&](void* stream) { optim::compensated_residuals_cuda(res, dev + lo, hi - lo, stream); });
  }
  // what the host computes from: the local piece's values in host memory
  std::vector<float> fetched;
  const float* piece = full + lo;
  if (on_device && (offload_ || (residual_ && !split_here)) && hi > lo) {
    fetched.resize(hi - lo);
    be_.copy_d2h(fetched.data(), dev + lo, 4 * (hi - lo));
    piece = fetched.data();
  }
  if (master_ && hi > lo) {
    if (offload_) std::memcpy(master_ + shard_off_[b], piece, 4 * (hi - lo));
    else be_.copy_d2d(master_ + shard_off_[b], dev + lo, 4 * (hi - lo));
  }
  if (residual_ && !split_here && hi > lo) {  // the parameters are the values rounded to nearest: the residual is the rest
    std::vector<uint16_t> res(hi - lo);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < hi - lo; ++i) res[i] = optim::compensated_split(piece[i]).lo;
    state_from_host(residual_ + shard_off_[b], res.data(), 2 * res.size());
  }
  be_.synchronize();
  if (staged) be_.free(staged);
  if (policy_.shard_params) settle_gather(b);
  drop_fp8_gathers();
}

void ZeroEngine::get_piece(int b, int s, float* out) {
  const size_t n = piece_end(b) - piece_begin(b);
  if (n == 0) return;
  if (s == kMaster && master_) {
    state_to_host(out, master_ + shard_off_[b], 4 * n);
  } else if (s == kParam || s == kMaster) {
    float* tmp = static_cast<float*>(be_.alloc(4 * n));
    be_.act_to_f32(tmp, param_piece(b), n);
    be_.copy_d2h(out, tmp, 4 * n);
    be_.free(tmp);
    if (s == kMaster && residual_) {  // param + residual, exact in fp32
      std::vector<uint16_t> res(n);
      state_to_host(res.data(), residual_ + shard_off_[b], 2 * n);
      for (size_t i = 0; i < n; ++i) out[i] += optim::bf16_value(res[i]);
    }
  } else if (policy_.state == optim::StateType::F32) {
    state_to_host(out, slot_ptr(s, b, 0), 4 * n);
  } else {
    std::vector<char> held(optim::state_bytes(policy_.state, n));
    copy_piece_async(b, s, piece_begin(b), piece_end(b), held.data());
    be_.wait_copies();
    held_to_f32(s, held.data(), n, out);
  }
}

void ZeroEngine::held_to_f32(int s, const void* held, size_t n, float* out) const {
  if (policy_.state == optim::StateType::BF16) {
    for (size_t i = 0; i < n; ++i) out[i] = optim::bf16_value(static_cast<const uint16_t*>(held)[i]);
    return;
  }
  const uint8_t* c = static_cast<const uint8_t*>(held);
  const optim::Code& code = *state_code(s);
  for (size_t i = 0; i < n; ++i) {
    float scale;  // the scales follow the codes, unaligned
    std::memcpy(&scale, c + n + 4 * (i / optim::kQuantBlock), 4);
    out[i] = optim::decode(c[i], code.value, scale);
  }
}

DType ZeroEngine::state_dtype(int s) const {
  if (s == kMaster && residual_) return DType::BF16;
  if (s == kParam || (s == kMaster && !master_)) return be_.act_dtype();
  return s >= 2 && policy_.state == optim::StateType::BF16 ? DType::BF16 : DType::F32;
}

const optim::Code* ZeroEngine::state_code(int s) const {
  return s >= 2 && policy_.state == optim::StateType::Int8 ? &optim::code_of(opt_.slot_signed(s - 2)) : nullptr;
}

void ZeroEngine::copy_piece_async(int b, int s, size_t lo, size_t hi, void* out) {
  if (hi <= lo) return;
  if (lo < piece_begin(b) || hi > piece_end(b))
    throw Error(kExitFailure, "internal error: copy_piece_async outside this rank's piece");
  const size_t n = hi - lo, off = lo - piece_start(b);  // within the piece
  // training.offload: the state is host memory that only the next update writes: copied now
  auto copy = [&](void* dst, const void* src, size_t bytes) {
    if (offload_) std::memcpy(dst, src, bytes);
    else be_.copy_d2h_async(dst, src, bytes);
  };
  if (s == kMaster && master_) copy(out, master_ + shard_off_[b] + off, 4 * n);
  else if (s == kMaster && residual_) copy(out, residual_ + shard_off_[b] + off, 2 * n);
  else if (s == kParam || s == kMaster) be_.copy_d2h_async(out, act_ptr(param_piece(b), off), esz_ * n);
  else if (policy_.state != optim::StateType::Int8) copy(out, slot_ptr(s, b, off), optim::state_type_size(policy_.state) * n);
  else {
    if (off % optim::kQuantBlock)
      throw Error(kExitFailure, "internal error: an int8 state copy from within a quantization block");
    copy(out, slot_ptr(s, b, off), n);
    copy(static_cast<char*>(out) + n, scale_ptr(s, b, off), 4 * optim::quant_blocks(n));
  }
}

void ZeroEngine::set_piece(int b, int s, const float* in) {
  ++params_version_;
  be_.after_copies();
  const size_t n = piece_end(b) - piece_begin(b);
  std::vector<float> hi;  // compensated master values: the parameters, rounded to nearest
  if (s == kMaster && residual_) {
    std::vector<uint16_t> res(n);
    hi.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const optim::Compensated c = optim::compensated_split(in[i]);
      hi[i] = optim::bf16_value(c.hi);
      res[i] = c.lo;
    }
    if (n) state_from_host(residual_ + shard_off_[b], res.data(), 2 * n);
    in = hi.data();  // and on to the parameters
  }
  if (s == kMaster && master_) {
    if (n) state_from_host(master_ + shard_off_[b], in, 4 * n);
  } else if (s == kParam || s == kMaster) {
    if (n) {
      float* tmp = static_cast<float*>(be_.alloc(4 * n));
      be_.copy_h2d(tmp, in, 4 * n);
      be_.f32_to_act(param_piece(b), tmp, n);
      be_.synchronize();
      be_.free(tmp);
    }
    if (policy_.gathers_after_update() && world_ > 1) {  // every rank needs the whole bucket
      void* p = act_ptr(params_full_, full_off_[b]);
      comm_.all_gather(act_ptr(p, size_t(rank_) * shape_[b].shard), p, shape_[b].shard, be_.act_dtype());
      comm_.join();
      be_.synchronize();
    }
    settle_gather(b);
    drop_fp8_gathers();
  } else if (n && policy_.state == optim::StateType::F32) {
    state_from_host(slot_ptr(s, b, 0), in, 4 * n);
  } else if (n) {
    // the values as this state holds them: bf16 rounded to nearest (a bf16 state's values are exact), int8
    // quantized as a step quantizes (a checkpoint of int8 state gives back its codes and scales exactly)
    std::vector<char> held(optim::state_bytes(policy_.state, n));
    if (policy_.state == optim::StateType::BF16) {
      for (size_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(held.data())[i] = f32_to_bf16(in[i]);
      state_from_host(slot_ptr(s, b, 0), held.data(), 2 * n);
    } else {
      const optim::Code& code = *state_code(s);
      const bool sig = opt_.slot_signed(s - 2);
      uint8_t* c = reinterpret_cast<uint8_t*>(held.data());
      std::vector<float> scale(optim::quant_blocks(n));
      for (size_t blk = 0; blk < scale.size(); ++blk) {
        const size_t i0 = blk * optim::kQuantBlock;
        scale[blk] = optim::quantize_block(in + i0, std::min<size_t>(optim::kQuantBlock, n - i0), code, sig, c + i0);
      }
      state_from_host(slot_ptr(s, b, 0), c, n);
      state_from_host(scale_ptr(s, b, 0), scale.data(), 4 * scale.size());
    }
  }
}

void ZeroEngine::set_piece_codes(int b, int s, const void* in) {
  if (!state_code(s)) throw Error(kExitFailure, "internal error: set_piece_codes on a slot not held as int8 codes");
  ++params_version_;
  be_.after_copies();
  const size_t n = piece_end(b) - piece_begin(b);
  if (n == 0) return;
  state_from_host(slot_ptr(s, b, 0), in, n);
  state_from_host(scale_ptr(s, b, 0), static_cast<const char*>(in) + n, 4 * optim::quant_blocks(n));
}

void ZeroEngine::get_bucket_params(int b, float* full) {
  const size_t n = shape_[b].size;
  float* tmp = static_cast<float*>(be_.alloc(4 * n));
  const void* src;
  if (!policy_.shard_params) {
    src = act_ptr(params_full_, full_off_[b]);
  } else {  // the whole bucket, FP8 weights included, in the act dtype
    for (int o = 0; o < layout_.n_buckets(); ++o)
      if (gathered_[o] && role_of(layout_, o) == role_of(layout_, b)) settle_gather(o);
    gather_whole(b);
    comm_.record(b);
    comm_.wait(b);
    src = gather_buffer(b);
  }
  be_.act_to_f32(tmp, src, n);
  be_.copy_d2h(full, tmp, 4 * n);
  be_.free(tmp);
}

}  // namespace gpt
