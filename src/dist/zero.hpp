// ZeRO: where parameters, gradients and optimizer state live across ranks, and the optimizer step.
// Buckets (model/layout.hpp) are split into world-size pieces of equal length (the tail padded with
// zeros); rank r owns piece r of every bucket. What is sharded is the ZeroPolicy's (dist/zero_policy.hpp):
// stage 0 nothing; stage 1 master weights and AdamW moments; stage 2 also gradients (reduce-scattered
// bucket by bucket as backward finishes them); stage 3 also the parameters (gathered bucket by bucket
// just before use, next one prefetched).
#pragma once
#include <array>
#include <vector>

#include "backend/backend.hpp"
#include "base/memory.hpp"
#include "dist/comm.hpp"
#include "dist/zero_policy.hpp"
#include "model/layout.hpp"
#include "model/param_store.hpp"

namespace gpt {

// Sizes of one bucket under a stage and world size.
struct BucketShape {
  size_t size = 0;       // logical elements
  size_t shard = 0;      // elements per rank (stage 0: size)
  size_t cap = 0;        // elements of a full-bucket buffer (world * shard, or size)
};
std::vector<BucketShape> bucket_shapes(const ParamLayout& layout, int world, const ZeroPolicy& policy);

// The buffers a ZeroEngine allocates, in elements: the engine allocates exactly these, and the memory
// prediction is their bytes().
struct EngineSizes {
  std::vector<BucketShape> shape;
  size_t full_total = 0, shard_total = 0;  // sums of the buckets' cap and shard
  size_t params = 0, grads = 0;            // the parameter and gradient buffers (full or shard)
  std::array<size_t, 4> role_cap{};        // each gather / gradient-temp buffer: embedding, final, even, odd layer
  bool grad_temps = false, gather_bufs = false;
  static bool has_master(DType act, bool master_weights) { return master_weights && act != DType::F32; }
  MemoryBreakdown bytes(DType act, bool master_weights) const;  // state bytes per rank (no activations)
};
EngineSizes engine_sizes(const ParamLayout& layout, int world, const ZeroPolicy& policy);

struct OptimizerHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float grad_scale;
  int step;              // 1-based
  uint64_t seed;
};

class ZeroEngine final : public ParamStore {
 public:
  ZeroEngine(const ParamLayout& layout, Backend& be, Communicator& comm, HostComm& host, const ZeroPolicy& policy,
             bool master_weights);
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // ParamStore
  const void* params(int b) override;
  void prefetch(int b) override;
  void* grads(int b) override;
  void grads_done(int b) override;
  uint64_t params_version() const override { return params_version_; }

  // The step, in order: begin_step, {begin_micro_step, forward, backward}..., end_backward,
  // grad_norm, update.
  void begin_step();
  void begin_micro_step(bool last);
  void end_backward();
  double grad_norm();                     // global L2 norm over all ranks' gradients
  void update(const OptimizerHyper& h);   // AdamW on the local shard, then parameters made whole
  // Whether every value the updates since the last call wrote on this rank (parameters, master weights,
  // AdamW moments) is finite; reads and clears the optimizer's flag (synchronises).
  bool state_finite();

  // State exchange with checkpoints and initialisation, bucket by bucket, in fp32 on the host.
  // The local piece of bucket b covers logical elements [piece_begin(b), piece_end(b)) of the bucket.
  const ZeroPolicy& policy() const { return policy_; }
  size_t piece_begin(int b) const;
  size_t piece_end(int b) const;
  // Sets the whole bucket's parameters (every rank passes the same full bucket values).
  void set_bucket_params(int b, const float* full);
  // Reads/writes this rank's piece (length piece_end-piece_begin) of each state kind.
  enum class State { param, master, m, v };  // master without master weights = param
  void get_piece(int b, State s, float* out);
  void set_piece(int b, State s, const float* in);
  // Checkpoint snapshots: queues a copy of logical elements [lo, hi) of bucket b's state s (within this
  // rank's piece) into host memory `out` as they are stored: state_dtype(s) (parameters in the compute
  // dtype, the rest fp32). It lands at backend().wait_copies(); the next update() and set_piece wait
  // for it on the device, so training goes on meanwhile and the copy stays consistent.
  void copy_piece_async(int b, State s, size_t lo, size_t hi, void* out);
  DType state_dtype(State s) const;
  Backend& backend() const { return be_; }
  // The full bucket's parameters in fp32 (gathers at stage 3; collective).
  void get_bucket_params(int b, float* full);
  bool has_master() const { return master_ != nullptr; }
  const MemoryBreakdown& allocated() const { return alloc_; }

 private:
  char* act_ptr(void* base, size_t elems) const;
  size_t piece_start(int b) const;  // logical start of this rank's piece (unclamped)
  void* gather_buffer(int b);
  void* grad_temp(int b);
  void finish_pending_grad(int b);
  void* param_piece(int b);
  void* grad_piece(int b);

  const ParamLayout& layout_;
  Backend& be_;
  Communicator& comm_;
  HostComm& host_;
  ZeroPolicy policy_;
  uint64_t params_version_ = 1;
  int world_, rank_;
  size_t esz_;
  std::vector<BucketShape> shape_;
  std::vector<size_t> full_off_, shard_off_;
  size_t full_total_ = 0, shard_total_ = 0, max_layer_cap_ = 0;
  // buffers
  void* params_full_ = nullptr;   // stages 0-2: (sum cap) act
  void* params_shard_ = nullptr;  // stage 3: (sum shard) act
  void* grads_full_ = nullptr;    // stages 0-1: (sum cap) act
  void* grads_shard_ = nullptr;   // stages 2-3: (sum shard) act
  float* master_ = nullptr;       // (sum shard) fp32, when act is bf16 and master weights are on
  float* m_ = nullptr;            // (sum shard) fp32
  float* v_ = nullptr;            // (sum shard) fp32
  unsigned* nonfinite_ = nullptr; // (1) set by AdamW when it writes a non-finite value
  std::vector<void*> gather_bufs_;  // stage 3: [embedding, final, layer even, layer odd]
  std::vector<void*> grad_temps_;   // stages 2-3: same four roles
  std::vector<int> gathered_;       // stage 3: bucket is in its gather buffer
  std::vector<int> temp_owner_;     // stages 2-3: which bucket occupies each grad temp (-1 none)
  std::vector<int> pending_;        // stages 2-3: bucket's reduce-scatter issued, not yet added
  std::vector<int> touched_;        // bucket's grad temp zeroed this micro-step
  bool last_micro_ = true;
  MemoryBreakdown alloc_;
};

}  // namespace gpt
