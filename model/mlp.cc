// Layer kind "swiglu_mlp": parameters, FLOPs, and forward/backward on every backend (see mlp.h).
#include "model/mlp.h"

#include "base/check.h"
#include "model/carve.h"
#include "model/exec_cpu.h"
#include "model/exec_cuda.h"

namespace tt::model {

MlpKind::MlpKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b)
    : LayerKind(layer, ParamSlice{}),
      C_((int)cfg.hidden_size),
      I_((int)cfg.intermediate_size),
      eps_(cfg.rms_norm_eps),
      norm_offset_(cfg.qwen3_5() ? 1.0 : 0.0) {
  const std::string pre = str("model.layers.", layer, ".");
  const int64_t C = C_, I = I_;
  b.begin_block(pre + "mlp");
  const int first = b.add(pre + "post_attention_layernorm.weight", {C},
                          cfg.qwen3_5() ? ParamRole::kZeroNorm : ParamRole::kNormWeight);
  norm_ = b.offset(first);
  wg_ = b.offset(b.add(pre + "mlp.gate_proj.weight", {I, C}, ParamRole::kMatrix));
  wu_ = b.offset(b.add(pre + "mlp.up_proj.weight", {I, C}, ParamRole::kMatrix));
  const int last = b.add(pre + "mlp.down_proj.weight", {C, I}, ParamRole::kMatrix);
  wd_ = b.offset(last);
  b.end_block();
  slice_ = ParamSlice{pre + "mlp", first, last + 1};
}

Flops MlpKind::flops(const Work& w, Pass p) const {
  const double f = pass_factor(p) * ((double)C_ + 3.0 * C_ * I_) * (double)w.tokens;
  return Flops{f, f};
}

template <class E>
struct MlpKind::Saved {
  using Act = typename E::Act;
  Act* n;                     // (N, C) post_attention_layernorm output
  typename E::Stat* rstd;     // (N)
  Act* gate;                  // (N, I); dgate after backward where the backend consumes it
  Act* up;                    // (N, I); dup likewise
  Act* h;                     // (N, I) swiglu(gate, up)
  size_t bytes;

  Saved(const MlpKind& m, int N, char* base) {
    const int64_t n = N;
    Carver c{base};
    this->n = c.take<Act>(n * m.C_);
    rstd = c.take<typename E::Stat>(n);
    gate = c.take<Act>(n * m.I_);
    up = c.take<Act>(n * m.I_);
    h = c.take<Act>(n * m.I_);
    bytes = c.bytes();
  }
};

template <class E>
struct MlpKind::Scratch {
  using Act = typename E::Act;
  Act* dh;     // (N, I) gradient of h
  Act* dgate;  // (N, I) only where backward keeps the saved gate/up
  Act* dup;    // (N, I)
  size_t bytes;

  Scratch(const MlpKind& m, int N, char* base) {
    const int64_t n = N;
    Carver c{base};
    dh = c.take<Act>(n * m.I_);
    dgate = c.take<Act>(E::kBackwardConsumesSaved ? 0 : n * m.I_);
    dup = c.take<Act>(E::kBackwardConsumesSaved ? 0 : n * m.I_);
    bytes = c.bytes();
  }
};

template <class E>
size_t MlpKind::saved_bytes(int N) const {
  return Saved<E>(*this, N, nullptr).bytes;
}

template <class E>
size_t MlpKind::scratch_bytes(int N) const {
  return Scratch<E>(*this, N, nullptr).bytes;
}

template <class E>
void MlpKind::forward(E& e, const BlockCall<E>& c) const {
  const int N = c.batch->N, C = C_, I = I_;
  const Saved<E> s(*this, N, c.saved);
  const auto* w = c.w;
  // The norm, gate/up and SwiGLU, then down_proj with the residual add (two kernels for a decode
  // step's rows).
  e.norm_linear_swiglu(s.n, s.rstd, c.x_in, w + norm_, N, C, eps_, norm_offset_, s.gate, s.up, s.h, w + wg_,
                       w + wu_, I);
  e.linear_residual(c.x_out, c.x_in, s.h, w + wd_, N, I, C, c.sum);
}

template <class E>
void MlpKind::backward(E& e, const BlockCall<E>& c) const {
  const int N = c.batch->N, C = C_, I = I_;
  const Saved<E> s(*this, N, c.saved);
  const Scratch<E> t(*this, N, c.scratch);
  const auto* w = c.w;
  auto* g = c.g;
  e.linear_dx(t.dh, c.dx, w + wd_, N, I, C, /*accumulate=*/false);
  e.linear_dw(g + wd_, c.dx, s.h, N, I, C);
  typename E::Act* dgate = E::kBackwardConsumesSaved ? s.gate : t.dgate;
  typename E::Act* dup = E::kBackwardConsumesSaved ? s.up : t.dup;
  e.swiglu_backward(dgate, dup, t.dh, s.gate, s.up, (int64_t)N * I);
  e.linear_dx(c.sum, dgate, w + wg_, N, C, I, /*accumulate=*/false);
  e.linear_dx(c.sum, dup, w + wu_, N, C, I, /*accumulate=*/true);
  e.linear_dw(g + wg_, dgate, s.n, N, C, I);
  e.linear_dw(g + wu_, dup, s.n, N, C, I);
  if (E::kBackwardConsumesSaved && c.keep_saved) {  // another backward reads gate and up: recompute them
    e.linear(s.gate, s.n, w + wg_, N, C, I);
    e.linear(s.up, s.n, w + wu_, N, C, I);
  }
  // The Acc sum of the two products is read without a bf16 rounding.
  norm_backward(e, norm_offset_, c.dx, g + norm_, c.sum, c.x_in, w + norm_, s.rstd, N, C, /*accumulate_dx=*/true);
}

#define TT_MLP_INSTANTIATE(E)                                                \
  template size_t MlpKind::saved_bytes<E>(int) const;                        \
  template size_t MlpKind::scratch_bytes<E>(int) const;                      \
  template void MlpKind::forward<E>(E&, const BlockCall<E>&) const;          \
  template void MlpKind::backward<E>(E&, const BlockCall<E>&) const;
TT_MLP_INSTANTIATE(CpuExec<float>)
TT_MLP_INSTANTIATE(CpuExec<double>)
TT_MLP_INSTANTIATE(CudaExec)
#undef TT_MLP_INSTANTIATE

}  // namespace tt::model
