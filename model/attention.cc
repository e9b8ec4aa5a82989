// Layer kind "full_attention": parameters, FLOPs, and forward/backward on every backend (see
// attention.h). The body is written once over the op vocabulary of model/exec.h.
#include "model/attention.h"

#include "base/check.h"
#include "model/carve.h"
#include "model/exec_cpu.h"
#include "model/exec_cuda.h"

namespace tt::model {

AttentionKind::AttentionKind(const ModelConfig& cfg, const LayerSpec& spec, int layer, ParamTable::Builder& b)
    : LayerKind(layer, ParamSlice{}),
      C_((int)cfg.hidden_size),
      NH_((int)cfg.num_attention_heads),
      NKV_((int)cfg.num_key_value_heads),
      HS_((int)cfg.head_dim),
      eps_(cfg.rms_norm_eps),
      qk_norm_(spec.qk_norm),
      gate_(spec.output_gate),
      norm_offset_(cfg.qwen3_5() ? 1.0 : 0.0) {
  TT_CHECK(!gate_ || qk_norm_, "model: layer ", layer, ": the output gate is Qwen3.5's, which has q/k norms");
  const std::string pre = str("model.layers.", layer, ".");
  const int64_t C = C_, QD = (int64_t)NH_ * HS_, KD = (int64_t)NKV_ * HS_;
  b.begin_block(pre + "self_attn");
  const ParamRole norm = cfg.qwen3_5() ? ParamRole::kZeroNorm : ParamRole::kNormWeight;
  const int first = b.add(pre + "input_layernorm.weight", {C}, norm);
  in_norm_ = b.offset(first);
  wq_ = b.offset(b.add(pre + "self_attn.q_proj.weight", {gate_ ? 2 * QD : QD, C}, ParamRole::kMatrix));
  wk_ = b.offset(b.add(pre + "self_attn.k_proj.weight", {KD, C}, ParamRole::kMatrix));
  wv_ = b.offset(b.add(pre + "self_attn.v_proj.weight", {KD, C}, ParamRole::kMatrix));
  int last = b.add(pre + "self_attn.o_proj.weight", {C, QD}, ParamRole::kMatrix);
  wo_ = b.offset(last);
  if (qk_norm_) {
    q_norm_ = b.offset(b.add(pre + "self_attn.q_norm.weight", {(int64_t)HS_}, norm));
    last = b.add(pre + "self_attn.k_norm.weight", {(int64_t)HS_}, norm);
    k_norm_ = b.offset(last);
  }
  b.end_block();
  slice_ = ParamSlice{pre + "self_attn", first, last + 1};
}

Flops AttentionKind::flops(const Work& w, Pass p) const {
  const double QD = (double)NH_ * HS_, KD = (double)NKV_ * HS_;
  const double weights = (double)C_ + (gate_ ? 3 : 2) * QD * C_ + 2 * KD * C_ + (qk_norm_ ? 2.0 * HS_ : 0.0);
  const double f = pass_factor(p) * (weights * (double)w.tokens + 2.0 * QD * (double)w.visible_pairs);
  return Flops{f, f};
}

// What forward saves; see attention.h.
template <class E>
struct AttentionKind::Saved {
  using Act = typename E::Act;
  using Stat = typename E::Stat;
  Act* n;       // (N, C) input_layernorm output
  Stat* rstd;   // (N)
  Act* q_pre;   // (N, NH, HS) q_proj output (qk_norm only)
  Act* k_pre;   // (N, NKV, HS) (qk_norm only)
  Stat* q_rstd; // (N, NH) (qk_norm only)
  Stat* k_rstd; // (N, NKV) (qk_norm only)
  Act* q;       // (N, NH, HS) after q_norm and RoPE: the attention input
  Act* k;       // (N, NKV, HS)
  Act* v;       // (N, NKV, HS)
  Act* att;     // (N, NH, HS) attention output
  Stat* lse;    // (N, NH)
  Act* qg;      // (N, NH, 2 HS) q_proj output with the gate (gate_ only)
  Act* gate;    // (N, NH, HS) (gate_ only)
  Act* gated;   // (N, NH, HS) att sigmoid(gate), o_proj's input (gate_ only)
  size_t bytes;

  Saved(const AttentionKind& a, int N, char* base) {
    const int64_t n = N, QD = (int64_t)a.NH_ * a.HS_, KD = (int64_t)a.NKV_ * a.HS_;
    const bool qk = a.qk_norm_;
    Carver c{base};
    this->n = c.take<Act>(n * a.C_);
    rstd = c.take<Stat>(n);
    q_pre = c.take<Act>(qk ? n * QD : 0);
    k_pre = c.take<Act>(qk ? n * KD : 0);
    q_rstd = c.take<Stat>(qk ? n * a.NH_ : 0);
    k_rstd = c.take<Stat>(qk ? n * a.NKV_ : 0);
    q = c.take<Act>(n * QD);
    k = c.take<Act>(n * KD);
    v = c.take<Act>(n * KD);
    att = c.take<Act>(n * QD);
    lse = c.take<Stat>(n * a.NH_);
    qg = c.take<Act>(a.gate_ ? 2 * n * QD : 0);
    gate = c.take<Act>(a.gate_ ? n * QD : 0);
    gated = c.take<Act>(a.gate_ ? n * QD : 0);
    bytes = c.bytes();
  }
};

// Backward's scratch.
template <class E>
struct AttentionKind::Scratch {
  using Act = typename E::Act;
  Act* datt;    // (N, QD) gradient of the attention output, then of q_pre
  Act* dq;      // (N, QD)
  Act* dk;      // (N, KD)
  Act* dv;      // (N, KD)
  Act* dk_pre;  // (N, KD)
  Act* dgate;   // (N, QD) (gate_ only)
  Act* dqg;     // (N, 2 QD) (gate_ only)
  size_t bytes;

  Scratch(const AttentionKind& a, int N, char* base) {
    const int64_t n = N, QD = (int64_t)a.NH_ * a.HS_, KD = (int64_t)a.NKV_ * a.HS_;
    Carver c{base};
    datt = c.take<Act>(n * QD);
    dq = c.take<Act>(n * QD);
    dk = c.take<Act>(n * KD);
    dv = c.take<Act>(n * KD);
    dk_pre = c.take<Act>(a.qk_norm_ ? n * KD : 0);
    dgate = c.take<Act>(a.gate_ ? n * QD : 0);
    dqg = c.take<Act>(a.gate_ ? 2 * n * QD : 0);
    bytes = c.bytes();
  }
};

template <class E>
size_t AttentionKind::saved_bytes(int N) const {
  return Saved<E>(*this, N, nullptr).bytes;
}

template <class E>
size_t AttentionKind::scratch_bytes(int N) const {
  return Scratch<E>(*this, N, nullptr).bytes;
}

template <class E>
void AttentionKind::forward(E& e, const BlockCall<E>& c) const {
  const BatchView<E>& b = *c.batch;
  const int N = b.N, C = C_, NH = NH_, NKV = NKV_, HS = HS_, QD = NH * HS, KD = NKV * HS;
  const Saved<E> s(*this, N, c.saved);
  const auto* w = c.w;
  const typename E::KV* ext = c.carry ? c.carry->kv.data() : nullptr;
  const int n_ext = c.carry ? (int)c.carry->kv.size() : 0;

  // input_layernorm and the q, k, v projections (one kernel for a decode step's rows).
  using Out = LinearOut<typename E::Act, typename E::Weight>;
  if (qk_norm_) {
    const Out outs[3] = {{gate_ ? s.qg : s.q_pre, w + wq_, gate_ ? 2 * QD : QD}, {s.k_pre, w + wk_, KD},
                         {s.v, w + wv_, KD}};
    e.norm_linear(s.n, s.rstd, c.x_in, w + in_norm_, N, C, eps_, norm_offset_, outs, 3);
    if (gate_) {
      if constexpr (E::kHybridOps) {
        e.split_heads(s.q_pre, s.gate, s.qg, N, NH, HS);
      } else {
        throw Error("model: the attention output gate runs on the cpu backend only");
      }
    }
    // q_norm and k_norm with RoPE, then the attention; the inference cache keeps k and v as
    // attention reads them.
    e.qk_norm_rope_attention(s.q, s.q_rstd, s.q_pre, w + q_norm_, NH, s.k, s.k_rstd, s.k_pre, w + k_norm_, NKV,
                             b.rope, N, HS, eps_, norm_offset_, s.v, c.store_k, c.store_v, c.store_rows, s.att, s.lse,
                             b.layout, ext, n_ext);
  } else {
    const Out outs[3] = {{s.q, w + wq_, QD}, {s.k, w + wk_, KD}, {s.v, w + wv_, KD}};
    e.norm_linear(s.n, s.rstd, c.x_in, w + in_norm_, N, C, eps_, norm_offset_, outs, 3);
    e.rope_forward(s.q, b.rope, N, NH, HS);
    e.rope_forward(s.k, b.rope, N, NKV, HS);
    if (c.store_k) {  // the inference cache keeps the rows as attention reads them
      e.scatter_rows(c.store_k, s.k, c.store_rows, N, KD);
      e.scatter_rows(c.store_v, s.v, c.store_rows, N, KD);
    }
    e.attention_forward(s.att, s.lse, s.q, s.k, s.v, b.layout, ext, n_ext, N, NH, NKV, HS);
  }
  if (c.store_q) e.copy(c.store_q, s.q, (int64_t)N * QD);
  const typename E::Act* o_in = s.att;  // o_proj's input
  if constexpr (E::kHybridOps) {
    if (gate_) {
      e.sigmoid_gate_forward(s.gated, s.att, s.gate, (int64_t)N * QD);
      o_in = s.gated;
    }
  }
  e.linear_residual(c.x_out, c.x_in, o_in, w + wo_, N, QD, C, c.sum);
}

template <class E>
void AttentionKind::backward(E& e, const BlockCall<E>& c) const {
  const BatchView<E>& b = *c.batch;
  const int N = b.N, C = C_, NH = NH_, NKV = NKV_, HS = HS_, QD = NH * HS, KD = NKV * HS;
  const Saved<E> s(*this, N, c.saved);
  const Scratch<E> t(*this, N, c.scratch);
  const auto* w = c.w;
  auto* g = c.g;
  const typename E::KV* ext = c.carry ? c.carry->kv.data() : nullptr;
  const int n_ext = c.carry ? (int)c.carry->kv.size() : 0;

  // x_out = x_in + o_proj(att): the residual passes dx through; o_proj's output gradient is dx.
  e.linear_dx(t.datt, c.dx, w + wo_, N, QD, C, /*accumulate=*/false);
  e.linear_dw(g + wo_, c.dx, gate_ ? s.gated : s.att, N, QD, C);
  if constexpr (E::kHybridOps) {
    if (gate_) {  // datt holds d(gated): d att = d(gated) sigmoid(gate), and the gate's gradient
      e.sigmoid_gate_backward(t.datt, t.dgate, t.datt, s.att, s.gate, (int64_t)N * QD);
    }
  }
  e.attention_backward(t.dq, t.dk, t.dv, t.datt, s.att, s.lse, s.q, s.k, s.v, b.layout, ext, n_ext, N, NH, NKV, HS);
  // Readers of this batch's K/V outside it (child pieces' gateways) add their gradients here.
  if (c.relay && !c.relay->kv.empty()) {
    TT_CHECK(c.relay->kv.size() == 1 && c.relay->kv[0].len == N, "layer ", layer_,
             ": relayed K/V gradients must be one entry of the batch's ", N, " rows");
    const typename E::KV& r = c.relay->kv[0];
    if (r.dk) e.add_inplace(t.dk, r.dk, (int64_t)N * KD);
    if (r.dv) e.add_inplace(t.dv, r.dv, (int64_t)N * KD);
  }
  const typename E::Act* dq_proj = t.dq;  // gradient of the q_proj output
  const typename E::Act* dk_proj = t.dk;
  if (qk_norm_) {
    typename E::Act* dq_pre = t.datt;  // datt is consumed; reuse it
    qk_norm_backward(e, norm_offset_, dq_pre, g + q_norm_, t.dq, s.q_pre, w + q_norm_, s.q_rstd, b.rope, N, NH, HS);
    qk_norm_backward(e, norm_offset_, t.dk_pre, g + k_norm_, t.dk, s.k_pre, w + k_norm_, s.k_rstd, b.rope, N, NKV,
                     HS);
    dq_proj = dq_pre;
    dk_proj = t.dk_pre;
    if constexpr (E::kHybridOps) {
      if (gate_) {
        e.merge_heads(t.dqg, dq_pre, t.dgate, N, NH, HS);
        dq_proj = t.dqg;
      }
    }
  } else {
    e.rope_backward(t.dq, b.rope, N, NH, HS);
    e.rope_backward(t.dk, b.rope, N, NKV, HS);
  }
  const int QO = gate_ ? 2 * QD : QD;  // q_proj's outputs
  e.linear_dx(c.sum, dq_proj, w + wq_, N, C, QO, /*accumulate=*/false);
  e.linear_dx(c.sum, dk_proj, w + wk_, N, C, KD, /*accumulate=*/true);
  e.linear_dx(c.sum, t.dv, w + wv_, N, C, KD, /*accumulate=*/true);
  e.linear_dw(g + wq_, dq_proj, s.n, N, C, QO);
  e.linear_dw(g + wk_, dk_proj, s.n, N, C, KD);
  e.linear_dw(g + wv_, t.dv, s.n, N, C, KD);
  // The fp32 (Acc) sum of the three products is read without a bf16 rounding.
  norm_backward(e, norm_offset_, c.dx, g + in_norm_, c.sum, c.x_in, w + in_norm_, s.rstd, N, C,
                /*accumulate_dx=*/true);
}

template <class E>
void AttentionKind::export_carry(const char* saved, int N, LayerCarry<E>& out) const {
  const Saved<E> s(*this, N, const_cast<char*>(saved));
  typename E::KV kv;
  kv.k = s.k;
  kv.v = s.v;
  kv.len = N;
  kv.q_begin = 0;
  kv.q_end = 0;
  out.kv.assign(1, kv);
  out.q = s.q;
}

#define TT_ATTENTION_INSTANTIATE(E)                                                          \
  template size_t AttentionKind::saved_bytes<E>(int) const;                                  \
  template size_t AttentionKind::scratch_bytes<E>(int) const;                                \
  template void AttentionKind::forward<E>(E&, const BlockCall<E>&) const;                    \
  template void AttentionKind::backward<E>(E&, const BlockCall<E>&) const;                   \
  template void AttentionKind::export_carry<E>(const char*, int, LayerCarry<E>&) const;
TT_ATTENTION_INSTANTIATE(CpuExec<float>)
TT_ATTENTION_INSTANTIATE(CpuExec<double>)
TT_ATTENTION_INSTANTIATE(CudaExec)
#undef TT_ATTENTION_INSTANTIATE

}  // namespace tt::model
