// ZeRO: where parameters, gradients and optimizer state live across ranks, and the optimizer step.
// Buckets (model/params.hpp) are split into world-size pieces of equal length (the tail padded with
// zeros); rank r owns piece r of every bucket. What is sharded is the ZeroPolicy's (parallel/zero_policy.hpp):
// stage 0 nothing; stage 1 master weights and the optimizer's state slots; stage 2 also gradients
// (reduce-scattered bucket by bucket as backward finishes them); stage 3 also the parameters (gathered
// bucket by bucket just before use, next one prefetched). The optimizer (optim/optimizer.hpp) says which
// slots it keeps; the engine allocates, shards and checkpoints whatever it declares.
#pragma once
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "base/memory.hpp"
#include "parallel/comm.hpp"
#include "parallel/sharded_state.hpp"
#include "parallel/zero_policy.hpp"
#include "model/params.hpp"
#include "model/param_store.hpp"
#include "optim/optimizer.hpp"

namespace gpt {


// The buffers a ZeroEngine allocates, in elements: the engine allocates exactly these, and the memory
// prediction is their bytes().
struct EngineSizes {
  std::vector<BucketShape> shape;
  size_t full_total = 0, shard_total = 0;  // sums of the buckets' cap and shard
  size_t params = 0, grads = 0;            // the parameter and gradient buffers (full or shard)
  std::array<size_t, 4> role_cap{};        // each gather / gradient-temp buffer: embedding, final, even, odd layer
  bool grad_temps = false, gather_bufs = false;
  // gather_fp8: two byte buffers of a layer bucket's cap (the FP8 weights), two of world x the largest
  // rest of a layer bucket past its weights (act dtype elements)
  size_t fp8_gather_bytes = 0, rest_gather = 0;
  // each optimizer slot: its values per rank (the shards; with int8 state each bucket's rounded up to whole
  // quantization blocks) and how they are held
  size_t state_total = 0;
  optim::StateType state = optim::StateType::F32;
  // the master copy the engine keeps for parameters of dtype act (none for fp32 parameters)
  static optim::MasterKind master_kind(DType act, optim::MasterKind m) { return act == DType::F32 ? optim::MasterKind::None : m; }
  static bool has_master(DType act, optim::MasterKind m) { return master_kind(act, m) != optim::MasterKind::None; }
  // training.offload: master weights and slots in host memory, and kOffloadRing transfer buffers of the
  // largest piece for gradients and as many for parameters
  bool offload = false;
  size_t max_shard = 0;
  static constexpr int kOffloadRing = 3;
  // state bytes per rank on the device (no activations), for an optimizer of n_slots slots; with offload
  // without master weights and optimizer state (host_bytes)
  MemoryBreakdown bytes(DType act, optim::MasterKind master, int n_slots) const;
  // training.offload: the host memory per rank (master weights, slots, transfer buffers); 0 without
  size_t host_bytes(DType act, optim::MasterKind master, int n_slots) const;
};
EngineSizes engine_sizes(const ParamLayout& layout, int world, const ZeroPolicy& policy);

class ZeroEngine final : public ParamStore, public ShardedState {
 public:
  ZeroEngine(const ParamLayout& layout, Backend& be, Communicator& comm, HostComm& host, const ZeroPolicy& policy,
             optim::MasterKind master, const Optimizer& optimizer);
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Stage 3 with policy().gather_fp8: bucket b's FP8 weights (the model's, by offset; they must be the
  // bucket's decayed tensors, every one) are gathered as FP8 from now on (ParamStore::fp8_params), and
  // params(b) gathers the rest of the bucket. Not called for a bucket: it is gathered whole, as before.
  void gather_fp8(int b, std::vector<Fp8WeightRange> weights);

  // ParamStore
  const void* params(int b) override;
  void prefetch(int b) override;
  bool gathers_fp8(int b) const override { return !fp8_w_[b].empty(); }
  void prefetch_fp8(int b, uint64_t key) override;
  const void* fp8_params(int b, uint64_t key) override;
  void* grads(int b) override;
  void grads_done(int b) override;
  uint64_t params_version() const override { return params_version_; }

  // The step, in order: begin_step, {begin_micro_step, forward, backward}..., end_backward,
  // grad_norm, update. With training.gradient_release, release_step(h) after begin_step: the backward
  // then updates each bucket with h as its gradient completes (update() only makes the parameters whole),
  // and grad_norm is that of the gradients released. Without it (FP8's calibration passes, a trial
  // micro-batch) the backward's gradients are thrown away.
  void begin_step();
  void release_step(const OptimizerHyper& h);
  void begin_micro_step(bool last);
  void end_backward();
  double grad_norm();                     // global L2 norm over all ranks' gradients
  void update(const OptimizerHyper& h);   // the optimizer on the local shard, then parameters made whole
  // Whether every value the updates since the last call wrote on this rank (parameters, master weights,
  // optimizer state) is finite; reads and clears the optimizer's flag (synchronises).
  bool state_finite();
  // training.offload: the last update's wall time on the host's threads (the optimizer's loops) and the
  // rest of its wall time (waiting for transfers, queueing them), in ms; NaN without offload
  double offload_ms() const { return offload_ms_; }
  double offload_wait_ms() const { return offload_wait_ms_; }

  // State exchange with checkpoints and initialisation, bucket by bucket, in fp32 on the host.
  // The local piece of bucket b covers logical elements [piece_begin(b), piece_end(b)) of the bucket.
  const ZeroPolicy& policy() const { return policy_; }
  // Sets the whole bucket's parameters (every rank passes the same full bucket values): `full` in host
  // memory, or with on_device in the backend's (read before this returns).
  void set_bucket_params(int b, const float* full, bool on_device = false);
  // ShardedState (what checkpoints see; copy_piece_async: the next update() and set_piece wait for the
  // copies on the device)
  const std::vector<std::string>& state_names() const override { return state_names_; }
  bool holds(int s) const override { return s != kMaster || has_master(); }
  bool has_master() const override { return master_ != nullptr || residual_ != nullptr; }
  bool master_is_residual() const override { return residual_ != nullptr; }
  int zero_stage() const override { return policy_.stage; }
  bool shards() const override { return policy_.shard_optimizer; }
  size_t piece_begin(int b) const override;
  size_t piece_end(int b) const override;
  Backend& backend() const override { return be_; }
  void set_piece(int b, int s, const float* in) override;
  void set_piece_codes(int b, int s, const void* in) override;
  void copy_piece_async(int b, int s, size_t lo, size_t hi, void* out) override;
  DType state_dtype(int s) const override;
  const optim::Code* state_code(int s) const override;
  size_t piece_align() const override { return policy_.state == optim::StateType::Int8 ? optim::kQuantBlock : 1; }
  // This rank's piece (length piece_end-piece_begin) of state kind s, in fp32 on the host.
  void get_piece(int b, int s, float* out);
  // The full bucket's parameters in fp32 (gathers at stage 3; collective).
  void get_bucket_params(int b, float* full);
  const MemoryBreakdown& allocated() const { return alloc_; }

 private:
  char* act_ptr(void* base, size_t elems) const;
  // The ranges the optimizer updates in bucket b (fp32 state: its decayed part and the rest; bf16 and int8:
  // the whole piece) with the piece's parameters at `param` and gradients at `grad` (act dtype)
  std::vector<ParamRange> ranges(int b, void* param, const void* grad);
  void update_offloaded(const OptimizerHyper& h);
  // training.offload: page-locked host memory (zeroed; freed by the destructor), counted in `tally`
  void* host_take(size_t bytes, size_t& tally);
  // state (master weights, slots, scales) to and from host memory: on the device, or with offload a host copy
  void state_to_host(void* dst, const void* src, size_t bytes);
  void state_from_host(void* dst, const void* src, size_t bytes);
  size_t piece_start(int b) const;  // logical start of this rank's piece (unclamped)
  void* gather_buffer(int b);
  void gather_whole(int b);       // the whole bucket in the act dtype into its gather buffer (queued)
  void unpack_rest(int b);        // a gathered rest (gather_fp8) into the bucket's gather buffer
  void settle_gather(int b);      // a queued gather of b waited for and forgotten (its buffers reused next)
  void settle_fp8(int b);         // a queued FP8 gather of b waited for and forgotten
  void drop_fp8_gathers();        // every FP8 gather forgotten (the parameters changed)
  std::pair<size_t, size_t> rest_part(int b, int r) const;
  // event slots: parameter gathers b, gradient reductions n_buckets + b, FP8 gathers 2 n_buckets + b
  int fp8_slot(int b) const { return 2 * layout_.n_buckets() + b; }
  uint8_t* fp8_buffer(int b) { return static_cast<uint8_t*>(fp8_bufs_[(b - 1) % 2]); }
  void* rest_buffer(int b) { return rest_bufs_[(b - 1) % 2]; }
  void* grad_temp(int b);
  void finish_pending_grad(int b);
  void apply_released(int b, const void* grad);
  void* param_piece(int b);
  void* grad_piece(int b);

  // state kind s >= 2 (an optimizer slot) of bucket b, from element `off` of this rank's piece on
  void* slot_ptr(int s, int b, size_t off) const;
  float* scale_ptr(int s, int b, size_t off) const;  // int8: the scale of the block at off
  // n values of slot s as copy_piece_async copies them (bf16, or int8 codes and scales) in fp32
  void held_to_f32(int s, const void* held, size_t n, float* out) const;
  const ParamLayout& layout_;
  Backend& be_;
  const Optimizer& opt_;
  std::vector<std::string> state_names_;
  Communicator& comm_;
  HostComm& host_;
  ZeroPolicy policy_;
  uint64_t params_version_ = 1;
  int world_, rank_;
  size_t esz_;
  std::vector<BucketShape> shape_;
  std::vector<size_t> full_off_, shard_off_, state_off_;  // state_off_: each slot's, in values
  size_t full_total_ = 0, shard_total_ = 0, max_layer_cap_ = 0;
  // buffers
  void* params_full_ = nullptr;   // stages 0-2: (sum cap) act
  void* params_shard_ = nullptr;  // stage 3: (sum shard) act
  void* grads_full_ = nullptr;    // stages 0-1: (sum cap) act
  void* grads_shard_ = nullptr;   // stages 2-3: (sum shard) act
  float* master_ = nullptr;       // (sum shard) fp32, when act is bf16 and master weights are fp32
  uint16_t* residual_ = nullptr;  // (sum shard) bf16 residuals, when act is bf16 and master weights compensated
  std::vector<void*> slots_;      // (state_total) each: the optimizer's state, held as policy_.state says
  std::vector<float*> scales_;    // int8: (state_total / kQuantBlock) each, the blocks' scales
  unsigned* nonfinite_ = nullptr; // (1) set by the optimizer when it writes a non-finite value
  // training.offload (policy_.offload): master_, residual_, slots_, scales_ and nonfinite_ are host
  // memory, and these the transfer rings: (kOffloadRing x max shard) act each, a bucket's piece of
  // gradients down and parameters (down where the update reads them, and) up
  bool offload_ = false;
  std::vector<void*> host_blocks_, pinned_;
  void* ring_grad_ = nullptr;
  void* ring_param_ = nullptr;
  size_t ring_elems_ = 0, host_bytes_ = 0;
  unsigned host_nonfinite_ = 0;
  double offload_ms_ = NAN, offload_wait_ms_ = NAN;
  // training.gradient_release: the step's hyperparameters, whether this backward updates, and each
  // bucket's sum of squares of the gradient it released (device memory, one double a bucket)
  OptimizerHyper release_h_{};
  bool releasing_ = false;
  double* released_sq_ = nullptr;
  std::vector<void*> gather_bufs_;  // stage 3: [embedding, final, layer even, layer odd]
  std::vector<void*> grad_temps_;   // stages 2-3: same four roles
  // gather_fp8: per bucket, its FP8 weights (empty: gathered whole) and the elements past them
  std::vector<std::vector<Fp8WeightRange>> fp8_w_;
  std::vector<size_t> rest_;              // per rank in the rest's gather: size - decayed
  std::vector<char> fp8_queued_;          // an FP8 gather queued and not yet handed out
  std::vector<uint64_t> fp8_key_;         // the scales' version it was cast with
  void* fp8_bufs_[2] = {nullptr, nullptr};   // even / odd layer buckets: cap bytes
  void* rest_bufs_[2] = {nullptr, nullptr};  // world x rest elements, act dtype
  std::vector<int> gathered_;       // stage 3: bucket is in its gather buffer
  std::vector<int> temp_owner_;     // stages 2-3: which bucket occupies each grad temp (-1 none)
  std::vector<int> pending_;        // stages 2-3 (and released gradients on several ranks): the bucket's
                                    // reduction issued, not yet added (or applied)
  std::vector<int> touched_;        // bucket's grad temp zeroed this micro-step
  bool last_micro_ = true;
  MemoryBreakdown alloc_;
};

}  // namespace gpt
