// Llama/Qwen3 decoder on the CPU reference ops: parameter table, initialisation, forward and the
// exact reverse of it.
//
// Saved activations live in a caller-owned Activations buffer, carved by Acts into fixed regions
// for the batch size N (per layer x_in, n1, rstd1, [q_pre, k_pre, q_rstd, k_rstd], q, k, v, att, lse, x_mid, n2,
// rstd2, gate, up, h; then x_final, nf, rstd_f, ce_lse), followed by backward's gradient scratch.
// The buffer only grows, so a run whose batch sizes vary allocates once for the largest batch.
//
// The per-layer forward and backward take external KV prefixes (ops/cpu/attention.h): partition
// gateways and carried KV tails are passed per layer through LayerPrefixes, and gradients that
// readers outside the batch send back to its own K/V enter through RelayedKVGrads.
//
// The loss scale enters as the cross-entropy backward's dloss: loss_scale * sum_t w_t * ce_t has
// the same gradient as weights scaled by loss_scale, without a scaled copy of the target weights.
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "model/layout.h"
#include "base/check.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/embedding.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "ops/cpu/swiglu.h"

namespace tt::model {

std::vector<ParamInfo> param_table(const ModelConfig& cfg) {
  cfg.validate();
  const int64_t V = cfg.vocab_size, C = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t HS = cfg.head_dim, QD = cfg.num_attention_heads * HS, KD = cfg.num_key_value_heads * HS;
  std::vector<ParamInfo> t;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParamInfo p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.offset = offset;
    p.decay = p.shape.size() > 1;
    offset += p.numel;
    t.push_back(std::move(p));
  };
  add("model.embed_tokens.weight", {V, C});
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string pre = str("model.layers.", l, ".");
    add(pre + "input_layernorm.weight", {C});
    add(pre + "self_attn.q_proj.weight", {QD, C});
    add(pre + "self_attn.k_proj.weight", {KD, C});
    add(pre + "self_attn.v_proj.weight", {KD, C});
    add(pre + "self_attn.o_proj.weight", {C, QD});
    if (cfg.qk_norm()) {
      add(pre + "self_attn.q_norm.weight", {HS});
      add(pre + "self_attn.k_norm.weight", {HS});
    }
    add(pre + "post_attention_layernorm.weight", {C});
    add(pre + "mlp.gate_proj.weight", {I, C});
    add(pre + "mlp.up_proj.weight", {I, C});
    add(pre + "mlp.down_proj.weight", {C, I});
  }
  add("model.norm.weight", {C});
  if (!cfg.tie_word_embeddings) add("lm_head.weight", {V, C});
  return t;
}

namespace {

// Saved activations of one layer.
template <class T>
struct LayerActs {
  T* x_in;    // (N, C) residual stream entering the layer
  T* n1;      // (N, C) input_layernorm output
  T* rstd1;   // (N)
  T* q_pre;   // (N, NH, HS) q_proj output before q_norm (qwen3 only)
  T* k_pre;   // (N, NKV, HS) k_proj output before k_norm (qwen3 only)
  T* q_rstd;  // (N, NH) (qwen3 only)
  T* k_rstd;  // (N, NKV) (qwen3 only)
  T* q;       // (N, NH, HS) after q_norm and RoPE: the attention input
  T* k;       // (N, NKV, HS) after k_norm and RoPE
  T* v;       // (N, NKV, HS)
  T* att;     // (N, NH, HS) attention output
  T* lse;     // (N, NH)
  T* x_mid;   // (N, C) residual after attention
  T* n2;      // (N, C) post_attention_layernorm output
  T* rstd2;   // (N)
  T* gate;    // (N, I)
  T* up;      // (N, I)
  T* h;       // (N, I) swiglu(gate, up)
};

// Gradient scratch of backward(), shared by all layers.
template <class T>
struct Scratch {
  T* dlogits;  // (N, V)
  T* dx;       // (N, C) gradient of the residual stream
  T* dn;       // (N, C) gradient of a norm output
  T* datt;     // (N, QD) gradient of the attention output, then of q_pre
  T* dq;       // (N, QD)
  T* dk;       // (N, KD)
  T* dv;       // (N, KD)
  T* dk_pre;   // (N, KD)
  T* dh;       // (N, I)
  T* dgate;    // (N, I)
  T* dup;      // (N, I)
};

// Hands out consecutive regions of a buffer; with a null base it only counts.
template <class T>
struct Carver {
  T* base;
  int64_t used = 0;
  T* take(int64_t n) {
    T* p = (base && n > 0) ? base + used : nullptr;
    used += n;
    return p;
  }
};

template <class T>
void add_inplace(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <class T>
void zero(T* p, int64_t n) {
  std::fill(p, p + n, T(0));
}

// x_out (N, C) = layer(a.x_in); fills a.
template <class T>
void layer_forward(const Dims& d, const LayerParams<const T>& w, const LayerActs<T>& a, T* x_out,
                   const int32_t* pos, const cpu::AttnLayout& layout, const cpu::ExternalKV<T>* ext,
                   int n_ext) {
  const int N = d.N;
  cpu::rmsnorm_forward(a.n1, a.rstd1, a.x_in, w.in_norm, N, d.C, d.eps);
  if (d.qk_norm) {
    cpu::matmul_forward(a.q_pre, a.n1, w.wq, N, d.C, d.QD);
    cpu::matmul_forward(a.k_pre, a.n1, w.wk, N, d.C, d.KD);
    cpu::rmsnorm_forward(a.q, a.q_rstd, a.q_pre, w.q_norm, N * d.NH, d.HS, d.eps);
    cpu::rmsnorm_forward(a.k, a.k_rstd, a.k_pre, w.k_norm, N * d.NKV, d.HS, d.eps);
  } else {
    cpu::matmul_forward(a.q, a.n1, w.wq, N, d.C, d.QD);
    cpu::matmul_forward(a.k, a.n1, w.wk, N, d.C, d.KD);
  }
  cpu::matmul_forward(a.v, a.n1, w.wv, N, d.C, d.KD);
  cpu::rope_forward(a.q, pos, N, d.NH, d.HS, d.theta);
  cpu::rope_forward(a.k, pos, N, d.NKV, d.HS, d.theta);
  cpu::attention_forward(a.att, a.lse, a.q, a.k, a.v, layout, ext, n_ext, N, d.NH, d.NKV, d.HS);
  cpu::matmul_forward(a.x_mid, a.att, w.wo, N, d.QD, d.C);
  add_inplace(a.x_mid, a.x_in, (int64_t)N * d.C);
  cpu::rmsnorm_forward(a.n2, a.rstd2, a.x_mid, w.post_norm, N, d.C, d.eps);
  cpu::matmul_forward(a.gate, a.n2, w.wg, N, d.C, d.I);
  cpu::matmul_forward(a.up, a.n2, w.wu, N, d.C, d.I);
  cpu::swiglu_forward(a.h, a.gate, a.up, (int64_t)N * d.I);
  cpu::matmul_forward(x_out, a.h, w.wd, N, d.I, d.C);
  add_inplace(x_out, a.x_mid, (int64_t)N * d.C);
}

// s.dx holds d(loss)/d(x_out) on entry and d(loss)/d(x_in) on exit; g += parameter gradients;
// external prefixes' dk/dv += (when set); relayed_dk/dv (N, KD), when set, are added to the
// gradient of this layer's own K/V as attention reads them.
template <class T>
void layer_backward(const Dims& d, const LayerParams<const T>& w, const LayerParams<T>& g,
                    const LayerActs<T>& a, const Scratch<T>& s, const int32_t* pos,
                    const cpu::AttnLayout& layout, const cpu::ExternalKV<T>* ext, int n_ext,
                    const T* relayed_dk, const T* relayed_dv) {
  const int N = d.N;
  // MLP: x_out = x_mid + down(swiglu(gate(n2), up(n2))).
  zero(s.dh, (int64_t)N * d.I);
  cpu::matmul_backward(s.dh, g.wd, s.dx, a.h, w.wd, N, d.I, d.C);
  cpu::swiglu_backward(s.dgate, s.dup, s.dh, a.gate, a.up, (int64_t)N * d.I);
  zero(s.dn, (int64_t)N * d.C);
  cpu::matmul_backward(s.dn, g.wg, s.dgate, a.n2, w.wg, N, d.C, d.I);
  cpu::matmul_backward(s.dn, g.wu, s.dup, a.n2, w.wu, N, d.C, d.I);
  cpu::rmsnorm_backward(s.dx, g.post_norm, s.dn, a.x_mid, w.post_norm, a.rstd2, N, d.C);
  // Attention: x_mid = x_in + o_proj(attn(rope(qk_norm(q_pre)), rope(qk_norm(k_pre)), v)).
  zero(s.datt, (int64_t)N * d.QD);
  cpu::matmul_backward(s.datt, g.wo, s.dx, a.att, w.wo, N, d.QD, d.C);
  cpu::attention_backward(s.dq, s.dk, s.dv, s.datt, a.att, a.lse, a.q, a.k, a.v, layout, ext, n_ext,
                          N, d.NH, d.NKV, d.HS);
  // Readers of this batch's K/V outside it (child pieces' gateways) add their gradients here.
  if (relayed_dk) add_inplace(s.dk, relayed_dk, (int64_t)N * d.KD);
  if (relayed_dv) add_inplace(s.dv, relayed_dv, (int64_t)N * d.KD);
  cpu::rope_backward(s.dq, pos, N, d.NH, d.HS, d.theta);
  cpu::rope_backward(s.dk, pos, N, d.NKV, d.HS, d.theta);
  const T* dq_proj = s.dq;  // gradient of the q_proj output
  const T* dk_proj = s.dk;
  if (d.qk_norm) {
    T* dq_pre = s.datt;  // datt is consumed; reuse it
    zero(dq_pre, (int64_t)N * d.QD);
    zero(s.dk_pre, (int64_t)N * d.KD);
    cpu::rmsnorm_backward(dq_pre, g.q_norm, s.dq, a.q_pre, w.q_norm, a.q_rstd, N * d.NH, d.HS);
    cpu::rmsnorm_backward(s.dk_pre, g.k_norm, s.dk, a.k_pre, w.k_norm, a.k_rstd, N * d.NKV, d.HS);
    dq_proj = dq_pre;
    dk_proj = s.dk_pre;
  }
  zero(s.dn, (int64_t)N * d.C);
  cpu::matmul_backward(s.dn, g.wq, dq_proj, a.n1, w.wq, N, d.C, d.QD);
  cpu::matmul_backward(s.dn, g.wk, dk_proj, a.n1, w.wk, N, d.C, d.KD);
  cpu::matmul_backward(s.dn, g.wv, s.dv, a.n1, w.wv, N, d.C, d.KD);
  cpu::rmsnorm_backward(s.dx, g.in_norm, s.dn, a.x_in, w.in_norm, a.rstd1, N, d.C);
}

// splitmix64 (Steele, Lea, Flood 2014): a portable, well-mixed 64-bit stream.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

}  // namespace

template <class T>
struct Model<T>::Acts {
  std::vector<LayerActs<T>> layers;
  T* x_final;  // (N, C) residual stream after the last layer
  T* nf;       // (N, C) final norm output (LM head input)
  T* rstd_f;   // (N)
  T* ce_lse;   // (N) cross-entropy log-sum-exp per row
  Scratch<T> s;
  int64_t total = 0;

  // Lays out activations and scratch for N rows at base (null: only computes total).
  Acts(const ModelConfig& cfg, int N, T* base) {
    const Dims d = dims_of(cfg, N);
    const int64_t n = N;
    Carver<T> c{base};
    layers.resize(cfg.num_hidden_layers);
    for (LayerActs<T>& a : layers) {
      a.x_in = c.take(n * d.C);
      a.n1 = c.take(n * d.C);
      a.rstd1 = c.take(n);
      a.q_pre = c.take(d.qk_norm ? n * d.QD : 0);
      a.k_pre = c.take(d.qk_norm ? n * d.KD : 0);
      a.q_rstd = c.take(d.qk_norm ? n * d.NH : 0);
      a.k_rstd = c.take(d.qk_norm ? n * d.NKV : 0);
      a.q = c.take(n * d.QD);
      a.k = c.take(n * d.KD);
      a.v = c.take(n * d.KD);
      a.att = c.take(n * d.QD);
      a.lse = c.take(n * d.NH);
      a.x_mid = c.take(n * d.C);
      a.n2 = c.take(n * d.C);
      a.rstd2 = c.take(n);
      a.gate = c.take(n * d.I);
      a.up = c.take(n * d.I);
      a.h = c.take(n * d.I);
    }
    x_final = c.take(n * d.C);
    nf = c.take(n * d.C);
    rstd_f = c.take(n);
    ce_lse = c.take(n);
    s.dlogits = c.take(n * d.V);
    s.dx = c.take(n * d.C);
    s.dn = c.take(n * d.C);
    s.datt = c.take(n * d.QD);
    s.dq = c.take(n * d.QD);
    s.dk = c.take(n * d.KD);
    s.dv = c.take(n * d.KD);
    s.dk_pre = c.take(n * d.KD);
    s.dh = c.take(n * d.I);
    s.dgate = c.take(n * d.I);
    s.dup = c.take(n * d.I);
    total = c.used;
  }
};

template <class T>
Model<T>::Model(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  info_ = param_table(cfg_);
  const int64_t n = info_.empty() ? 0 : info_.back().offset + info_.back().numel;
  params_.assign(n, T(0));
  grads_.assign(n, T(0));
}

template <class T>
T* Model<T>::param(const std::string& name) {
  for (const ParamInfo& p : info_)
    if (p.name == name) return params_.data() + p.offset;
  throw Error(str("model: unknown parameter \"", name, "\" for architecture ", cfg_.architecture,
                  cfg_.tie_word_embeddings ? " (tied embeddings)" : ""));
}

template <class T>
void Model<T>::init(uint64_t seed) {
  for (const ParamInfo& p : info_) {
    T* w = params_.data() + p.offset;
    if (p.shape.size() == 1) {
      std::fill(w, w + p.numel, T(1));
      continue;
    }
    SplitMix64 rng{param_init_seed(seed, p.name)};
    const double kTwoPi = 6.283185307179586476925286766559;
    for (int64_t i = 0; i < p.numel; i += 2) {
      // Box-Muller: u1 in (0, 1] keeps the log finite.
      const double u1 = 1.0 - rng.uniform();
      const double u2 = rng.uniform();
      const double r = std::sqrt(-2.0 * std::log(u1));
      w[i] = T(cfg_.initializer_range * r * std::cos(kTwoPi * u2));
      if (i + 1 < p.numel) w[i + 1] = T(cfg_.initializer_range * r * std::sin(kTwoPi * u2));
    }
  }
}

template <class T>
void Model<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <class T>
double Model<T>::forward(const data::PackedBatch& batch, double loss_scale) {
  return forward(batch, loss_scale, own_, nullptr);
}

template <class T>
double Model<T>::forward(const data::PackedBatch& batch, double loss_scale, Activations<T>& out,
                         const LayerPrefixes<T>* prefixes) {
  data::check_packed_batch(batch, cfg_.vocab_size);
  const int L = (int)cfg_.num_hidden_layers;
  TT_CHECK(prefixes == nullptr || (int)prefixes->size() == L, "model: external prefixes for ",
           prefixes ? prefixes->size() : 0, " layers, expected one list per layer (", L, ")");
  out.batch_ = &batch;
  out.prefixes_ = prefixes;
  out.loss_scale_ = loss_scale;
  const int N = batch.n_tokens;
  const Dims d = dims_of(cfg_, N);
  out.logits_.resize((size_t)N * d.V);
  if (N == 0) return 0.0;
  const int64_t need = Acts(cfg_, N, nullptr).total;
  if ((int64_t)out.buf_.size() < need) out.buf_.resize(need);
  const Acts acts(cfg_, N, out.buf_.data());

  const cpu::AttnLayout layout{batch.num_nodes(), batch.node_start.data(), batch.node_len.data(),
                               batch.node_parent.data()};
  const T* P = params_.data();
  const T* wte = P + info_.front().offset;
  cpu::embedding_forward(acts.layers[0].x_in, batch.tokens.data(), wte, N, d.C);
  for (int l = 0; l < L; ++l) {
    T* x_out = l + 1 < L ? acts.layers[l + 1].x_in : acts.x_final;
    const cpu::ExternalKV<T>* ext = prefixes ? (*prefixes)[l].data() : nullptr;
    const int n_ext = prefixes ? (int)(*prefixes)[l].size() : 0;
    layer_forward<T>(d, layer_params(P, info_, cfg_, l), acts.layers[l], x_out, batch.pos.data(), layout,
                     ext, n_ext);
  }
  const int k_norm = 1 + L * tensors_per_layer(cfg_);
  const T* w_norm = P + info_[k_norm].offset;
  const T* w_lm = cfg_.tie_word_embeddings ? wte : P + info_[k_norm + 1].offset;
  cpu::rmsnorm_forward(acts.nf, acts.rstd_f, acts.x_final, w_norm, N, d.C, d.eps);
  cpu::matmul_forward(out.logits_.data(), acts.nf, w_lm, N, d.C, d.V);
  const double loss = cpu::cross_entropy_forward(acts.ce_lse, out.logits_.data(), batch.tgt_src.data(),
                                                 batch.tgt_tok.data(), batch.tgt_w.data(),
                                                 (int)batch.tgt_src.size(), N, d.V);
  return loss_scale * loss;
}

template <class T>
const T* Model<T>::layer_k(const Activations<T>& a, int l) const {
  TT_CHECK(a.batch_ != nullptr && l >= 0 && l < cfg_.num_hidden_layers, "model: layer_k(", l,
           ") needs a forward on these activations and a valid layer");
  return Acts(cfg_, a.batch_->n_tokens, const_cast<T*>(a.buf_.data())).layers[l].k;
}

template <class T>
const T* Model<T>::layer_v(const Activations<T>& a, int l) const {
  TT_CHECK(a.batch_ != nullptr && l >= 0 && l < cfg_.num_hidden_layers, "model: layer_v(", l,
           ") needs a forward on these activations and a valid layer");
  return Acts(cfg_, a.batch_->n_tokens, const_cast<T*>(a.buf_.data())).layers[l].v;
}

template <class T>
void Model<T>::backward() {
  backward(own_, nullptr);
}

template <class T>
void Model<T>::backward(Activations<T>& a, const RelayedKVGrads<T>* relayed) {
  TT_CHECK(a.batch_ != nullptr, "model: backward() without a preceding forward()");
  const data::PackedBatch& batch = *a.batch_;
  const int N = batch.n_tokens;
  if (N == 0) return;
  const Dims d = dims_of(cfg_, N);
  const Acts acts(cfg_, N, a.buf_.data());
  const LayerPrefixes<T>* prefixes = a.prefixes_;
  const Scratch<T>& s = acts.s;
  const cpu::AttnLayout layout{batch.num_nodes(), batch.node_start.data(), batch.node_len.data(),
                               batch.node_parent.data()};
  const T* P = params_.data();
  T* G = grads_.data();
  const int L = (int)cfg_.num_hidden_layers;
  const int k_norm = 1 + L * tensors_per_layer(cfg_);
  const int k_lm = cfg_.tie_word_embeddings ? 0 : k_norm + 1;

  cpu::cross_entropy_backward(s.dlogits, a.logits_.data(), acts.ce_lse, batch.tgt_src.data(),
                              batch.tgt_tok.data(), batch.tgt_w.data(), (int)batch.tgt_src.size(), N,
                              d.V, a.loss_scale_);
  zero(s.dn, (int64_t)N * d.C);
  cpu::matmul_backward(s.dn, G + info_[k_lm].offset, s.dlogits, acts.nf, P + info_[k_lm].offset, N, d.C,
                       d.V);
  zero(s.dx, (int64_t)N * d.C);
  cpu::rmsnorm_backward(s.dx, G + info_[k_norm].offset, s.dn, acts.x_final, P + info_[k_norm].offset,
                        acts.rstd_f, N, d.C);
  TT_CHECK(relayed == nullptr || ((int)relayed->dk.size() == L && (int)relayed->dv.size() == L),
           "model: relayed K/V gradients need one entry per layer (", L, ")");
  for (int l = L - 1; l >= 0; --l) {
    const cpu::ExternalKV<T>* ext = prefixes ? (*prefixes)[l].data() : nullptr;
    const int n_ext = prefixes ? (int)(*prefixes)[l].size() : 0;
    const T* rdk = relayed ? relayed->dk[l] : nullptr;
    const T* rdv = relayed ? relayed->dv[l] : nullptr;
    layer_backward<T>(d, layer_params(P, info_, cfg_, l), layer_params(G, info_, cfg_, l), acts.layers[l],
                      s, batch.pos.data(), layout, ext, n_ext, rdk, rdv);
  }
  cpu::embedding_backward(G + info_.front().offset, s.dx, batch.tokens.data(), N, d.C);
}

template class Model<float>;
template class Model<double>;

}  // namespace tt::model
