#include "model/classifier.hpp"

#include <algorithm>
#include <string>

namespace gpt {

namespace {
// FP8 evaluation of one row: the product runs over the row's group of this many rows (training's row
// counts are multiples of 16, seq_len % 16 == 0, as FP8 tensor cores want them)
constexpr int kFp8RowGroup = 16;
}  // namespace

Classifier::Classifier(const ParamLayout& L, int chunk_rows, LayerPrecision p)
    : wte_(L.bucket(0).tensor(L.dims().tied_head ? "wte" : "lmhead").offset),
      C_(L.dims().n_embd),
      V_(L.dims().vocab_size),
      Vp_(L.dims().padded_vocab),
      chunk_(chunk_rows),
      q_(p.fp8, [](const char* role) { return std::string("classifier.") + role; }, Vp_, C_) {}

void Classifier::forward(const LayerCtx& c, const BucketView& w, const BucketView* g, uint64_t params_version,
                         const ClassifierActs& a, float dloss) const {
  const int N = c.N;
  const size_t e = dtype_size(c.be.act_dtype());
  if (!q_.on()) {  // logits -> losses (and, training, dlogits in place -> dx, dwte)
    const void* wte = w.at(wte_);
    void* dwte = g ? g->at(wte_) : nullptr;
    for (int r0 = 0; r0 < N; r0 += chunk_) {
      const int n = std::min(chunk_, N - r0);
      const void* x = static_cast<const char*>(a.x) + e * size_t(r0) * C_;
      c.be.matmul_fwd(a.logits, x, wte, nullptr, n, C_, Vp_, nullptr);
      c.be.classifier(a.logits, a.losses + r0, a.targets + r0, n, V_, Vp_, g ? dloss : 0.0f);
      if (g) {
        void* dx = static_cast<char*>(a.dx) + e * size_t(r0) * C_;
        c.be.matmul_bwd(dx, dwte, nullptr, a.logits, x, wte, n, C_, Vp_, nullptr, nullptr);
      }
    }
    return;
  }
  // FP8: logits from FP8 operands -> losses; training: dlogits as FP8 bytes -> dx (from wte transposed)
  // and dwte (from dlogits and x, both transposed)
  q_.cast_weight(c, w, wte_, params_version);
  for (int r0 = 0; r0 < N; r0 += chunk_) {
    const int n = std::min(chunk_, N - r0);
    const Fp8Tensor x = input_q(static_cast<char*>(a.x) + size_t(r0) * C_, g != nullptr);
    MatmulFwd fwd;
    fwd.out = a.logits, fwd.inp = fp8_bytes(x), fwd.w = fp8_bytes(q_.weight(false)), fwd.N = n, fwd.IC = C_, fwd.OC = Vp_;
    c.be.matmul_fwd(fwd);
    if (!g) {
      c.be.classifier(a.logits, a.losses + r0, a.targets + r0, n, V_, Vp_, 0.0f);
      continue;
    }
    const Fp8Tensor d = q_.grad(a.dlogits_q);
    ClassifierLoss loss;
    loss.logits = a.logits, loss.losses = a.losses + r0, loss.targets = a.targets + r0, loss.N = n, loss.V = V_;
    loss.Vp = Vp_, loss.dloss = dloss, loss.dlogits = d;
    c.be.classifier(loss);
    MatmulBwd bwd;  // the input gradient from wte transposed, then the weight gradient from both transposed
    bwd.N = n, bwd.IC = C_, bwd.OC = Vp_;
    bwd.dinp = static_cast<char*>(a.dx) + e * size_t(r0) * C_, bwd.dout = fp8_bytes(d), bwd.w = fp8_bytes(q_.weight(true));
    c.be.matmul_bwd(bwd);
    c.be.fp8_transpose({a.logits, a.dlogits_q, n, Vp_});  // (Vp, n) bytes over the dead logits
    c.be.fp8_transpose({a.x_t, x.data, n, C_});
    bwd.dinp = nullptr, bwd.dw = g->at(wte_), bwd.dout_t = d, bwd.dout_t.data = a.logits;
    bwd.inp = fp8_bytes(input_q(a.x_t, false));
    c.be.matmul_bwd(bwd);
  }
}

void Classifier::logits_row(const LayerCtx& c, const BucketView& w, uint64_t params_version,
                            const ClassifierActs& a, int row, float* out) const {
  const size_t e = dtype_size(c.be.act_dtype());
  const void* logits = a.logits;
  if (!q_.on()) {
    const void* x = static_cast<const char*>(a.x) + e * size_t(row) * C_;
    c.be.matmul_fwd(a.logits, x, w.at(wte_), nullptr, 1, C_, Vp_, nullptr);
  } else {
    q_.cast_weight(c, w, wte_, params_version);
    const int r0 = row - row % kFp8RowGroup, n = std::min(kFp8RowGroup, c.N - r0);
    MatmulFwd fwd;
    fwd.out = a.logits, fwd.inp = fp8_bytes(input_q(static_cast<char*>(a.x) + size_t(r0) * C_, false));
    fwd.w = fp8_bytes(q_.weight(false)), fwd.N = n, fwd.IC = C_, fwd.OC = Vp_;
    c.be.matmul_fwd(fwd);
    logits = static_cast<const char*>(a.logits) + e * size_t(row - r0) * Vp_;
  }
  float* tmp = static_cast<float*>(c.be.alloc(4 * size_t(Vp_)));
  c.be.act_to_f32(tmp, logits, Vp_);
  c.be.copy_d2h(out, tmp, 4 * size_t(V_));
  c.be.free(tmp);
}

}  // namespace gpt
