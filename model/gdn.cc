// Layer kind "linear_attention" (Gated DeltaNet): parameters, FLOPs, forward and backward (see
// gdn.h). Written once over the op vocabulary; instantiated for the backends that have the GDN
// ops (E::kHybridOps: both backends; the carried state is host memory, the CPU backend's).
#include "model/gdn.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "base/check.h"
#include "model/carve.h"
#include "model/exec_cpu.h"
#include "model/exec_cuda.h"
#include "ops/cpu/gdn.h"

namespace tt::model {

GdnKind::GdnKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b)
    : LayerKind(layer, ParamSlice{}),
      C_((int)cfg.hidden_size),
      nk_((int)cfg.linear_num_key_heads),
      nv_((int)cfg.linear_num_value_heads),
      dk_((int)cfg.linear_key_head_dim),
      dv_((int)cfg.linear_value_head_dim),
      K_((int)cfg.linear_conv_kernel_dim),
      eps_(cfg.rms_norm_eps),
      norm_offset_(cfg.qwen3_5() ? 1.0 : 0.0),
      fused_(cfg.qwen3_next()) {
  TT_CHECK(nk_ > 0 && nv_ > 0 && dk_ > 0 && dv_ > 0 && K_ > 0, "model: layer ", layer,
           " is linear_attention but the linear_* sizes are not set (ModelConfig::validate says which)");
  KD_ = nk_ * dk_;
  VD_ = nv_ * dv_;
  CD_ = 2 * KD_ + VD_;
  const std::string pre = str("model.layers.", layer, ".");
  const std::string la = pre + "linear_attn.";
  const int64_t C = C_;
  b.begin_block(pre + "linear_attn");
  const int first = b.add(pre + "input_layernorm.weight", {C},
                          cfg.qwen3_5() ? ParamRole::kZeroNorm : ParamRole::kNormWeight);
  in_norm_ = b.offset(first);
  if (fused_) {  // Qwen3-Next: rows grouped per key head (see gdn.h)
    w_qkv_ = b.offset(b.add(la + "in_proj_qkvz.weight", {CD_ + VD_, C}, ParamRole::kMatrix));
    w_b_ = b.offset(b.add(la + "in_proj_ba.weight", {2 * nv_, C}, ParamRole::kMatrix));
  } else {
    w_qkv_ = b.offset(b.add(la + "in_proj_qkv.weight", {CD_, C}, ParamRole::kMatrix));
    w_z_ = b.offset(b.add(la + "in_proj_z.weight", {VD_, C}, ParamRole::kMatrix));
    w_b_ = b.offset(b.add(la + "in_proj_b.weight", {nv_, C}, ParamRole::kMatrix));
    w_a_ = b.offset(b.add(la + "in_proj_a.weight", {nv_, C}, ParamRole::kMatrix));
  }
  conv_ = b.offset(b.add(la + "conv1d.weight", {CD_, 1, K_}, ParamRole::kMatrix));
  a_log_ = b.offset(b.add(la + "A_log", {nv_}, ParamRole::kLogDecay));
  dt_bias_ = b.offset(b.add(la + "dt_bias", {nv_}, ParamRole::kNormWeight));  // ones, no decay
  norm_ = b.offset(b.add(la + "norm.weight", {dv_}, ParamRole::kNormWeight));
  const int last = b.add(la + "out_proj.weight", {C, VD_}, ParamRole::kMatrix);
  w_out_ = b.offset(last);
  b.end_block();
  slice_ = ParamSlice{pre + "linear_attn", first, last + 1};
}

Flops GdnKind::flops(const Work& w, Pass p) const {
  // Per token: the projections' and the conv's multiply-adds (pass_factor counts a multiply-add
  // as 2 forward and 4 backward FLOPs), and the delta rule's per value head: decay, S^T k, the
  // rank-1 update and S^T q, 4 dk dv multiply-adds (the chunked form's extra O(chunk dk) work per
  // token is not counted: it is an implementation's, not the model's).
  const double per_token = (double)C_ * (CD_ + VD_ + 2.0 * nv_) + (double)VD_ * C_ + (double)CD_ * K_ +
                           4.0 * nv_ * (double)dk_ * dv_ + (double)C_;
  const double f = pass_factor(p) * per_token * (double)w.tokens;
  return Flops{f, f};
}

template <class E>
struct GdnKind::Saved {
  using Act = typename E::Act;
  using Stat = typename E::Stat;
  using Acc = typename E::Acc;
  Act* n;            // (N, C) input_layernorm output
  Stat* rstd;        // (N)
  Act* qkv;          // (N, CD) before the conv
  Act* z;            // (N, VD)
  Act* a;            // (N, nv)
  Act* b;            // (N, nv)
  Act* u;            // (N, CD) after conv + SiLU
  Act* q;            // (N, nk, dk) before the L2 norm
  Act* k;            // (N, nk, dk)
  Stat* q_rstd;      // (N nk)
  Stat* k_rstd;      // (N nk)
  Act* qn;           // (N, nk, dk)
  Act* kn;           // (N, nk, dk)
  Act* v;            // (N, nv, dv)
  Acc* g;            // (N, nv) log decay, fp32 on the GPU (transformers computes it in fp32)
  Act* beta;         // (N, nv)
  Act* o;            // (N, nv, dv) the delta rule's output
  Act* y;            // (N, nv, dv) gated norm output
  Stat* y_rstd;      // (N nv)
  int32_t* prev;     // (N) path_prev
  Act* qkvz;         // (N, CD + VD) Qwen3-Next's fused projection, grouped per key head (else none)
  Act* ba;           // (N, 2 nv) likewise
  size_t bytes;

  Saved(const GdnKind& m, int N, char* base) {
    const int64_t n = N;
    Carver c{base};
    this->n = c.take<Act>(n * m.C_);
    rstd = c.take<Stat>(n);
    qkv = c.take<Act>(n * m.CD_);
    z = c.take<Act>(n * m.VD_);
    a = c.take<Act>(n * m.nv_);
    b = c.take<Act>(n * m.nv_);
    u = c.take<Act>(n * m.CD_);
    q = c.take<Act>(n * m.KD_);
    k = c.take<Act>(n * m.KD_);
    q_rstd = c.take<Stat>(n * m.nk_);
    k_rstd = c.take<Stat>(n * m.nk_);
    qn = c.take<Act>(n * m.KD_);
    kn = c.take<Act>(n * m.KD_);
    v = c.take<Act>(n * m.VD_);
    g = c.take<Acc>(n * m.nv_);
    beta = c.take<Act>(n * m.nv_);
    o = c.take<Act>(n * m.VD_);
    y = c.take<Act>(n * m.VD_);
    y_rstd = c.take<Stat>(n * m.nv_);
    prev = c.take<int32_t>(n);
    qkvz = c.take<Act>(m.fused_ ? n * (m.CD_ + m.VD_) : 0);
    ba = c.take<Act>(m.fused_ ? n * 2 * m.nv_ : 0);
    bytes = c.bytes();
  }
};

// Qwen3-Next's grouped layout <-> the flat one: per key head g (r = nv / nk value heads each),
// in_proj_qkvz rows [q_g (dk) | k_g (dk) | v_g (r dv) | z_g (r dv)] and in_proj_ba rows
// [b_g (r) | a_g (r)]; the flat layout is [q (all heads) | k | v], z, b, a. to_flat copies
// grouped -> flat, else flat -> grouped (both cover every column: no accumulation needed).
template <class E>
void GdnKind::regroup(E& e, bool to_flat, typename E::Act* qkvz, typename E::Act* ba, typename E::Act* qkv,
                      typename E::Act* z, typename E::Act* b, typename E::Act* a, int N) const {
  const int r = nv_ / nk_, gw = 2 * dk_ + 2 * r * dv_, QZ = CD_ + VD_;
  for (int g = 0; g < nk_; ++g) {
    struct Move {
      typename E::Act* flat;
      int flat_cols, flat_col0, grouped_col0, cols;
    };
    const Move moves[4] = {{qkv, CD_, g * dk_, g * gw, dk_},
                           {qkv, CD_, KD_ + g * dk_, g * gw + dk_, dk_},
                           {qkv, CD_, 2 * KD_ + g * r * dv_, g * gw + 2 * dk_, r * dv_},
                           {z, VD_, g * r * dv_, g * gw + 2 * dk_ + r * dv_, r * dv_}};
    for (const Move& m : moves) {
      if (to_flat) e.move_cols(m.flat, m.flat_cols, m.flat_col0, qkvz, QZ, m.grouped_col0, N, m.cols);
      else e.move_cols(qkvz, QZ, m.grouped_col0, m.flat, m.flat_cols, m.flat_col0, N, m.cols);
    }
    if (to_flat) {
      e.move_cols(b, nv_, g * r, ba, 2 * nv_, g * 2 * r, N, r);
      e.move_cols(a, nv_, g * r, ba, 2 * nv_, g * 2 * r + r, N, r);
    } else {
      e.move_cols(ba, 2 * nv_, g * 2 * r, b, nv_, g * r, N, r);
      e.move_cols(ba, 2 * nv_, g * 2 * r + r, a, nv_, g * r, N, r);
    }
  }
}

template <class E>
struct GdnKind::Scratch {
  using Act = typename E::Act;
  using Acc = typename E::Acc;
  Act* dy;    // (N, VD)
  Act* d_o;   // (N, VD)
  Act* dz;    // (N, VD)
  Act* dqn;   // (N, KD)
  Act* dkn;   // (N, KD)
  Act* dv;    // (N, VD)
  Acc* dg;    // (N, nv) fp32 on the GPU: dA_log and dt_bias's gradients sum it with cancellation
  Acc* dbeta; // (N, nv)
  Act* da;    // (N, nv)
  Act* db;    // (N, nv)
  Act* dq;    // (N, KD)
  Act* dk;    // (N, KD)
  Act* du;    // (N, CD)
  Act* dqkv;  // (N, CD)
  size_t bytes;

  Scratch(const GdnKind& m, int N, char* base) {
    const int64_t n = N;
    Carver c{base};
    dy = c.take<Act>(n * m.VD_);
    d_o = c.take<Act>(n * m.VD_);
    dz = c.take<Act>(n * m.VD_);
    dqn = c.take<Act>(n * m.KD_);
    dkn = c.take<Act>(n * m.KD_);
    dv = c.take<Act>(n * m.VD_);
    dg = c.take<Acc>(n * m.nv_);
    dbeta = c.take<Acc>(n * m.nv_);
    da = c.take<Act>(n * m.nv_);
    db = c.take<Act>(n * m.nv_);
    dq = c.take<Act>(n * m.KD_);
    dk = c.take<Act>(n * m.KD_);
    du = c.take<Act>(n * m.CD_);
    dqkv = c.take<Act>(n * m.CD_);
    bytes = c.bytes();
  }
};

template <class E>
size_t GdnKind::saved_bytes(int N) const {
  return Saved<E>(*this, N, nullptr).bytes;
}

template <class E>
size_t GdnKind::scratch_bytes(int N) const {
  return Scratch<E>(*this, N, nullptr).bytes;
}

// A batch's recurrent context (host memory: the CPU backends). Carried (a carry lists each root's
// slot): each root's conv context becomes K - 1 rows chained before its first row (rows
// N + r (K - 1) ..), so the conv reads them through the same path walk in forward and backward,
// and its state slot the delta rule's init. Outputs (the inference cache, or a partition piece's
// offers): each node's end state, and conv tails walked back through `links` (the extended rows
// when carried, else the batch's).
template <class E>
struct GdnKind::Recurrent {
  std::vector<int> root_node;               // (R) node of each root, in node order
  std::vector<typename E::Act> x;           // carried: (N + R (K - 1), CD) pre-conv rows
  std::vector<int32_t> prev;                // carried: (N + R (K - 1))
  std::vector<double> init, end;            // carried: (R, nv dk dv); with outputs: (num_nodes, nv dk dv)
  const typename E::Act* rows = nullptr;    // the pre-conv rows tails are read from
  const int32_t* links = nullptr;           // their path_prev
  int64_t rows_n = 0;                       // N, or N + R (K - 1) when carried
};

template <class E>
GdnKind::Recurrent<E> GdnKind::recurrent_begin(const BlockCall<E>& c, const typename E::Act* qkv,
                                               const int32_t* prev, bool carried, bool outputs) const {
  const auto& l = c.batch->layout;
  const int N = c.batch->N, Kc = K_ - 1;
  const int64_t SE = recurrent_state_elems(), CE = conv_context_elems();
  Recurrent<E> r;
  for (int n = 0; n < l.num_nodes; ++n)
    if (l.node_parent[n] < 0) r.root_node.push_back(n);
  const int R = (int)r.root_node.size();
  if (outputs) r.end.assign((size_t)l.num_nodes * SE, 0.0);
  r.rows = qkv;
  r.links = prev;
  r.rows_n = N;
  if (!carried) return r;
  const LayerCarry<E>& cr = *c.carry;  // check_carry: one slot per root
  const int64_t Na = N + (int64_t)R * Kc;
  r.x.assign((size_t)Na * CD_, typename E::Act(0));
  std::copy(qkv, qkv + (size_t)N * CD_, r.x.begin());
  r.prev.assign(prev, prev + N);
  r.prev.resize(Na);
  r.init.assign((size_t)R * SE, 0.0);
  for (int q = 0; q < R; ++q) {
    const int64_t base = N + (int64_t)q * Kc;
    const int slot = cr.state_slot[q];
    TT_CHECK(slot < 0 || (cr.state && cr.conv), "model: layer ", layer_, ": root ", q, " reads state slot ", slot,
             " of a carry without state buffers");
    for (int m = 0; m < Kc; ++m) {
      r.prev[base + m] = m == 0 ? -1 : (int32_t)(base + m - 1);
      if (slot >= 0) std::copy(cr.conv + slot * CE + (int64_t)m * CD_, cr.conv + slot * CE + (int64_t)(m + 1) * CD_,
                               r.x.begin() + (base + m) * CD_);
    }
    if (Kc > 0) r.prev[l.node_start[r.root_node[q]]] = (int32_t)(base + Kc - 1);
    if (slot >= 0)
      for (int64_t i = 0; i < SE; ++i) r.init[(size_t)q * SE + i] = (double)cr.state[slot * SE + i];
  }
  r.rows = r.x.data();
  r.links = r.prev.data();
  r.rows_n = Na;
  return r;
}

// Calls f(m, row) for m = K - 2 .. 0 (newest first) along the path ending at node n's last row:
// row is the pre-conv row (of r.rows) at tail position m (oldest first), or -1 past the root.
template <class E, class F>
static void walk_tail(const typename E::Layout& l, const int32_t* links, int n, int Kc, F f) {
  int32_t row = l.node_start[n] + l.node_len[n] - 1;
  for (int m = Kc - 1; m >= 0; --m) {
    f(m, row);
    if (row >= 0) row = links[row];
  }
}

// Node n's end state and the last K - 1 pre-conv rows of its path (oldest first).
template <class E>
void GdnKind::recurrent_write(const BlockCall<E>& c, const Recurrent<E>& r, int n, typename E::Acc* state,
                              typename E::Act* conv) const {
  const int64_t SE = recurrent_state_elems();
  const double* end = r.end.data() + (size_t)n * SE;
  for (int64_t i = 0; i < SE; ++i) state[i] = (typename E::Acc)end[i];
  walk_tail<E>(c.batch->layout, r.links, n, K_ - 1, [&](int m, int32_t row) {
    typename E::Act* dst = conv + (int64_t)m * CD_;
    if (row >= 0) std::copy(r.rows + (int64_t)row * CD_, r.rows + (int64_t)(row + 1) * CD_, dst);
    else std::fill(dst, dst + CD_, typename E::Act(0));
  });
}

// The inference cache: each stored root's end state and conv tail (one-node trees only).
template <class E>
void GdnKind::recurrent_store(const BlockCall<E>& c, const Recurrent<E>& r) const {
  const auto& l = c.batch->layout;
  const int R = (int)r.root_node.size();
  TT_CHECK((int)c.store_slot->size() == R && c.store_conv, "model: layer ", layer_, ": ", c.store_slot->size(),
           " state slots to store for a batch of ", R, " roots");
  for (int q = 0; q < R; ++q) {
    const int slot = (*c.store_slot)[q];
    if (slot < 0) continue;
    const int n = r.root_node[q];
    TT_CHECK((q + 1 < R ? r.root_node[q + 1] : l.num_nodes) == n + 1, "model: layer ", layer_,
             ": stores the state of one-node trees only (tree ", q, " has several nodes)");
    recurrent_write(c, r, n, c.store_state + slot * recurrent_state_elems(),
                    c.store_conv + slot * conv_context_elems());
  }
}

// Whether the batch reads a recurrent state from its carry (some root's slot >= 0): only then do
// context rows and initial states enter; a carry whose roots all start from zeros is no carry.
template <class E>
static bool reads_state(const BlockCall<E>& c) {
  return c.carry && std::any_of(c.carry->state_slot.begin(), c.carry->state_slot.end(), [](int32_t s) { return s >= 0; });
}

// The layout's node parents in host memory (the CUDA layout keeps a host copy of its node arrays).
template <class E>
static const int32_t* host_parents(const typename E::Layout& l) {
  if constexpr (E::kHostRecurrent) return l.node_parent;
  else return l.host_parent.data();
}

// What a carry may hold for this layer: no K/V prefixes, and the roots' slots when it reads state.
template <class E>
void GdnKind::check_carry(const BlockCall<E>& c) const {

  if ((c.carry && !c.carry->kv.empty()) || (c.relay && !c.relay->kv.empty()))
    throw Error(str("model: layer ", layer_, " is linear_attention: its carry holds a recurrent state and conv "
                    "context, not K/V prefixes"));
  if (c.carry && c.carry->state_slot.empty())
    throw Error(str("model: layer ", layer_, " is linear_attention: a carry must give each root's recurrent state "
                    "slot (KVCache::read_state; slot -1 for a root that starts from zeros)"));
  if (c.carry) {
    const auto& l = c.batch->layout;
    const int32_t* parent = host_parents<E>(l);
    const int roots = (int)std::count_if(parent, parent + l.num_nodes, [](int32_t p) { return p < 0; });
    TT_CHECK((int)c.carry->state_slot.size() == roots, "model: layer ", layer_, ": a carry of ",
             c.carry->state_slot.size(), " state slots for a batch of ", roots, " roots");
  }
  if (c.carry && c.mode == Mode::kTrain)  // a state read in training sends its gradient back
    for (int32_t slot : c.carry->state_slot)
      if (slot >= 0 && !(c.carry->d_state && c.carry->d_conv))
        throw Error(str("model: layer ", layer_, " is linear_attention: a training forward reads state slot ", slot,
                        " without d_state / d_conv accumulators for its gradient"));
  if (c.carry && !c.carry->offer_node.empty()) {
    const LayerCarry<E>& cr = *c.carry;
    // A no-grad forward offers too (partition.recompute: a piece's first forward keeps only what
    // its children read); only a training forward's backward reads the gradient buffers.
    const bool train = c.mode == Mode::kTrain;
    TT_CHECK(cr.offer_state && cr.offer_conv && (!train || (cr.offer_d_state && cr.offer_d_conv)), "model: layer ",
             layer_, " offers ", cr.offer_node.size(), " nodes without ", !cr.offer_state ? "offer_state" :
             !cr.offer_conv ? "offer_conv" : !cr.offer_d_state ? "offer_d_state" : "offer_d_conv",
             " (a partition piece's offers need the state, conv tail and, in training, their gradient buffers)");
    for (int32_t n : c.carry->offer_node)
      TT_CHECK(n >= 0 && n < c.batch->layout.num_nodes, "model: layer ", layer_, ": offers node ", n,
               " of a batch of ", c.batch->layout.num_nodes, " nodes");
  }
}

template <class E>
struct GdnKind::DeviceContext {
  typename E::Buffer x_buf, prev_buf, init_buf, end_buf, idx_buf;
  typename E::Act* x = nullptr;   // carried: (N + R (K - 1), CD) the pre-conv rows, context rows after them
  int32_t* prev = nullptr;        // carried: their links (device)
  float* init = nullptr;          // carried: (R, nv dk dv)
  float* end = nullptr;           // with ends: (num_nodes, nv dk dv)
  std::vector<int32_t> host_prev;  // the links on the host (conv tails are walked here)
  std::vector<int> root_node;      // (R) node of each root, in node order
  int64_t rows_n = 0;              // N, or N + R (K - 1) when carried
  const int32_t *start = nullptr, *len = nullptr;  // the layout's host node arrays
};

// Uploads host int32 arrays into buf and returns the device copy.
template <class E>
static const int32_t* upload_ints(E& e, typename E::Buffer& buf, const std::vector<int32_t>& v) {
  e.ensure(buf, sizeof(int32_t) * std::max<size_t>(v.size(), 1));
  e.upload(buf.data(), v.data(), sizeof(int32_t) * v.size());
  return reinterpret_cast<const int32_t*>(buf.data());
}

template <class E>
void GdnKind::device_begin(E& e, const BlockCall<E>& c, const typename E::Act* qkv, bool carried, bool ends,
                           DeviceContext<E>& d) const {
  const auto& l = c.batch->layout;
  const int N = c.batch->N, Kc = K_ - 1, nodes = (int)l.host_parent.size();
  const int64_t SE = recurrent_state_elems();
  for (int n = 0; n < nodes; ++n)
    if (l.host_parent[n] < 0) d.root_node.push_back(n);
  const int R = (int)d.root_node.size();
  d.start = l.host_start.data();
  d.len = l.host_len.data();
  d.host_prev.resize(N);
  cpu::path_prev(d.host_prev.data(), l.host_start.data(), l.host_len.data(), l.host_parent.data(), nodes, N);
  d.rows_n = N;
  if (ends) {
    e.ensure(d.end_buf, sizeof(float) * (size_t)std::max<int64_t>(nodes * SE, 1));
    d.end = reinterpret_cast<float*>(d.end_buf.data());
  }
  if (!carried) return;
  // As Recurrent: root q's context rows at N + q (K - 1) .., chained before its first row.
  const LayerCarry<E>& cr = *c.carry;
  const int64_t Na = N + (int64_t)R * Kc;
  d.rows_n = Na;
  d.host_prev.resize(Na);
  for (int q = 0; q < R; ++q) {
    const int64_t base = N + (int64_t)q * Kc;
    for (int m = 0; m < Kc; ++m) d.host_prev[base + m] = m == 0 ? -1 : (int32_t)(base + m - 1);
    if (Kc > 0) d.host_prev[l.host_start[d.root_node[q]]] = (int32_t)(base + Kc - 1);
  }
  std::vector<int32_t> dst, src;  // the context rows read from slots
  for (int q = 0; q < R; ++q)
    if (cr.state_slot[q] >= 0)
      for (int m = 0; m < Kc; ++m) {
        dst.push_back((int32_t)(N + (int64_t)q * Kc + m));
        src.push_back((int32_t)((int64_t)cr.state_slot[q] * Kc + m));
      }
  const int n_ctx = (int)dst.size();
  dst.insert(dst.end(), src.begin(), src.end());
  e.ensure(d.x_buf, sizeof(typename E::Act) * (size_t)Na * CD_);
  d.x = reinterpret_cast<typename E::Act*>(d.x_buf.data());
  e.copy(d.x, qkv, (int64_t)N * CD_);
  e.zero(d.x + (int64_t)N * CD_, sizeof(typename E::Act) * (size_t)(Na - N) * CD_);
  if (n_ctx > 0) {
    const int32_t* di = upload_ints(e, d.idx_buf, dst);
    e.copy_rows(d.x, di, cr.conv, di + n_ctx, n_ctx, CD_);
  }
  e.ensure(d.prev_buf, sizeof(int32_t) * (size_t)Na);
  d.prev = reinterpret_cast<int32_t*>(d.prev_buf.data());
  e.upload(d.prev, d.host_prev.data(), sizeof(int32_t) * (size_t)Na);
  e.ensure(d.init_buf, sizeof(float) * (size_t)std::max<int64_t>(R * SE, 1));
  d.init = reinterpret_cast<float*>(d.init_buf.data());
  e.zero(d.init, sizeof(float) * (size_t)(R * SE));
  for (int q = 0; q < R; ++q)
    if (cr.state_slot[q] >= 0) e.copy(d.init + q * SE, cr.state + cr.state_slot[q] * SE, SE);
}

// Node nodes[i]'s end state into state[slots[i]] and its conv tail (the last K - 1 pre-conv rows
// of its path, oldest first; zeros past the root) into conv rows slots[i] (K - 1) .. (the inference
// cache's slots, or a partition piece's offers).
template <class E>
void GdnKind::device_write(E& e, DeviceContext<E>& d, const typename E::Act* qkv, const std::vector<int>& nodes,
                           const std::vector<int64_t>& slots, typename E::Acc* state, typename E::Act* conv) const {
  const int Kc = K_ - 1;
  const int64_t SE = recurrent_state_elems();
  std::vector<int32_t> dst, src, zero;
  const int32_t *start = d.start, *len = d.len;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int n = nodes[i];
    e.copy(state + slots[i] * SE, d.end + n * SE, SE);
    int32_t row = start[n] + len[n] - 1;
    for (int m = Kc - 1; m >= 0; --m) {
      const int32_t at = (int32_t)(slots[i] * Kc + m);
      if (row >= 0) dst.push_back(at), src.push_back(row);
      else zero.push_back(at);
      if (row >= 0) row = d.host_prev[row];
    }
  }
  const int n_copy = (int)dst.size(), n_zero = (int)zero.size();
  if (n_copy + n_zero == 0) return;
  dst.insert(dst.end(), src.begin(), src.end());
  dst.insert(dst.end(), zero.begin(), zero.end());
  const int32_t* di = upload_ints(e, d.idx_buf, dst);
  if (n_copy) e.copy_rows(conv, di, d.x ? d.x : qkv, di + n_copy, n_copy, CD_);
  if (n_zero) e.zero_rows(conv, di + 2 * n_copy, n_zero, CD_);
}

template <class E>
void GdnKind::forward(E& e, const BlockCall<E>& c) const {
  check_carry(c);
  const int N = c.batch->N, C = C_;
  const Saved<E> s(*this, N, c.saved);  // no-grad: the region every block shares
  const auto* w = c.w;
  norm_forward(e, norm_offset_, s.n, s.rstd, c.x_in, w + in_norm_, N, C, eps_);
  if (fused_) {
    e.linear(s.qkvz, s.n, w + w_qkv_, N, C, CD_ + VD_);
    e.linear(s.ba, s.n, w + w_b_, N, C, 2 * nv_);
    regroup(e, /*to_flat=*/true, s.qkvz, s.ba, s.qkv, s.z, s.b, s.a, N);
  } else {
    e.linear(s.qkv, s.n, w + w_qkv_, N, C, CD_);
    e.linear(s.z, s.n, w + w_z_, N, C, VD_);
    e.linear(s.b, s.n, w + w_b_, N, C, nv_);
    e.linear(s.a, s.n, w + w_a_, N, C, nv_);
  }
  e.path_prev(s.prev, c.batch->layout, N);
  const bool carried = reads_state(c);
  const bool stores = c.store_slot && !c.store_slot->empty() && c.store_state;
  const bool offers = c.carry && !c.carry->offer_node.empty();
  Recurrent<E> rec;
  DeviceContext<E> dev;
  const typename E::Act* conv_in = s.qkv;
  const int32_t* links = s.prev;
  if constexpr (E::kHostRecurrent) {
    if (carried || stores || offers) rec = recurrent_begin(c, s.qkv, s.prev, carried, stores || offers);
    if (carried) conv_in = rec.rows, links = rec.links;
  } else {
    if (carried || stores || offers) device_begin(e, c, s.qkv, carried, stores || offers, dev);
    if (carried) conv_in = dev.x, links = dev.prev;
  }
  // The batch's rows only; their windows reach the context rows (after them) through the links.
  e.conv1d_silu_forward(s.u, conv_in, w + conv_, links, N, CD_, K_);
  e.copy_cols(s.q, s.u, N, CD_, 0, KD_);
  e.copy_cols(s.k, s.u, N, CD_, KD_, KD_);
  e.copy_cols(s.v, s.u, N, CD_, 2 * KD_, VD_);
  e.l2norm_forward(s.qn, s.q_rstd, s.q, N * nk_, dk_, 1e-6);
  e.l2norm_forward(s.kn, s.k_rstd, s.k, N * nk_, dk_, 1e-6);
  e.gdn_gates_forward(s.g, s.beta, s.a, s.b, w + a_log_, w + dt_bias_, N, nv_);
  const double scale = 1.0 / std::sqrt((double)dk_);
  if constexpr (E::kHostRecurrent) {
    e.gdn_forward(s.o, s.qn, s.kn, s.v, s.g, s.beta, c.batch->layout, N, nk_, nv_, dk_, dv_, scale,
                  carried ? rec.init.data() : nullptr, stores || offers ? rec.end.data() : nullptr);
  } else {
    e.gdn_forward(s.o, s.qn, s.kn, s.v, s.g, s.beta, c.batch->layout, N, nk_, nv_, dk_, dv_, scale,
                  carried ? (const float*)dev.init : nullptr, stores || offers ? dev.end : nullptr);
    if (stores) {  // the inference cache: one-node trees only (as recurrent_store)
      const int R = (int)dev.root_node.size(), nodes = (int)c.batch->layout.host_parent.size();
      TT_CHECK((int)c.store_slot->size() == R && c.store_conv, "model: layer ", layer_, ": ", c.store_slot->size(),
               " state slots to store for a batch of ", R, " roots");
      std::vector<int> ns;
      std::vector<int64_t> slots;
      for (int q = 0; q < R; ++q) {
        if ((*c.store_slot)[q] < 0) continue;
        const int n = dev.root_node[q];
        TT_CHECK((q + 1 < R ? dev.root_node[q + 1] : nodes) == n + 1, "model: layer ", layer_,
                 ": stores the state of one-node trees only (tree ", q, " has several nodes)");
        ns.push_back(n);
        slots.push_back((*c.store_slot)[q]);
      }
      device_write(e, dev, s.qkv, ns, slots, c.store_state, c.store_conv);
    }
    if (offers) {  // a partition piece's: the offered nodes' end states and conv tails
      const std::vector<int> ns(c.carry->offer_node.begin(), c.carry->offer_node.end());
      std::vector<int64_t> slots(ns.size());
      for (size_t o = 0; o < ns.size(); ++o) slots[o] = (int64_t)o;
      device_write(e, dev, s.qkv, ns, slots, c.carry->offer_state, c.carry->offer_conv);
    }
  }
  if constexpr (E::kHostRecurrent) {
    if (stores) recurrent_store(c, rec);
    if (offers)
      for (size_t o = 0; o < c.carry->offer_node.size(); ++o)
        recurrent_write(c, rec, c.carry->offer_node[o], c.carry->offer_state + o * recurrent_state_elems(),
                        c.carry->offer_conv + o * conv_context_elems());
  }
  e.gated_rmsnorm_forward(s.y, s.y_rstd, s.o, s.z, w + norm_, N * nv_, dv_, eps_);
  e.linear(c.sum, s.y, w + w_out_, N, VD_, C);
  e.residual_add(c.x_out, c.x_in, c.sum, (int64_t)N * C);
}

// The conv's backward with a carry, in device memory: with context rows (carried) the conv runs
// over its own DFS layout, each root's K - 1 context rows placed just before its tree (so the
// descendant gather of ops/cuda/gdn.h reaches them: their depths and subtree ends are those of
// ancestors), then the batch rows' input gradients go to dx and the context rows' into the slots'
// d_conv accumulators (fp32); offered conv tails add their readers' gradients at their rows.
template <class E>
void GdnKind::device_conv_backward(E& e, const BlockCall<E>& c, DeviceContext<E>& d, const typename E::Act* du,
                                   typename E::Act* dx, bool carried) const {
  using Act = typename E::Act;
  const auto& l = c.batch->layout;
  const int N = c.batch->N, Kc = K_ - 1, nodes = (int)l.host_parent.size();
  const int R = (int)d.root_node.size();
  const int64_t Na = d.rows_n;  // N + R (K - 1) when carried
  // ext[a]: the row of the conv's layout of appended row a (a < N the batch's, else context).
  std::vector<int32_t> ext(Na);
  std::vector<int32_t> tree_of(N);
  for (int q = 0; q < R; ++q) {
    const int32_t r0 = l.host_start[d.root_node[q]], r1 = q + 1 < R ? l.host_start[d.root_node[q + 1]] : N;
    for (int32_t i = r0; i < r1; ++i) tree_of[i] = q;
  }
  for (int32_t i = 0; i < N; ++i) ext[i] = i + (carried ? Kc * (tree_of[i] + 1) : 0);
  if (carried)
    for (int q = 0; q < R; ++q)
      for (int m = 0; m < Kc; ++m) ext[N + (int64_t)q * Kc + m] = l.host_start[d.root_node[q]] + Kc * q + m;
  // Links, depths and subtree ends of the conv's layout (rows' subtree ends from the node arrays).
  std::vector<int32_t> node_end(nodes);
  for (int n = nodes - 1; n >= 0; --n) {
    node_end[n] = std::max(node_end[n], l.host_start[n] + l.host_len[n]);
    if (l.host_parent[n] >= 0) node_end[l.host_parent[n]] = std::max(node_end[l.host_parent[n]], node_end[n]);
  }
  std::vector<int32_t> meta(3 * Na);  // prev | pos | subtree_end, in the conv's layout
  int32_t *prev2 = meta.data(), *pos2 = prev2 + Na, *end2 = pos2 + Na;
  for (int64_t a = 0; a < Na; ++a) prev2[ext[a]] = d.host_prev[a] >= 0 ? ext[d.host_prev[a]] : -1;
  for (int n = 0; n < nodes; ++n)
    for (int32_t i = l.host_start[n]; i < l.host_start[n] + l.host_len[n]; ++i)
      end2[ext[i]] = node_end[n] + (carried ? Kc * (tree_of[i] + 1) : 0);
  if (carried)
    for (int q = 0; q < R; ++q) {
      const int n = d.root_node[q];
      for (int m = 0; m < Kc; ++m) end2[ext[N + (int64_t)q * Kc + m]] = node_end[n] + Kc * (q + 1);
    }
  for (int64_t x = 0; x < Na; ++x) pos2[x] = prev2[x] < 0 ? 0 : pos2[prev2[x]] + 1;  // prev2[x] < x
  // Offered tails: (row in the conv's layout, offer row o (K - 1) + m) of each tail row. Two
  // offers' tails share rows where the offered nodes lie within K - 1 rows below a common row (a
  // branch just before a segment boundary), and add_rows takes distinct destinations a call: the
  // entries go in rounds, a row at most once a round, in offer order (deterministic; as many
  // rounds as the most tails sharing a row, one when none do).
  std::vector<int32_t> tail_dst, tail_src, round_begin = {0};
  if (c.carry && !c.carry->offer_node.empty()) {
    std::vector<std::array<int32_t, 3>> entries;  // (round, dst, src)
    std::unordered_map<int32_t, int32_t> uses;
    for (size_t o = 0; o < c.carry->offer_node.size(); ++o) {
      const int n = c.carry->offer_node[o];
      int32_t row = l.host_start[n] + l.host_len[n] - 1;
      for (int m = Kc - 1; m >= 0 && row >= 0; --m) {
        entries.push_back({uses[ext[row]]++, ext[row], (int32_t)(o * Kc + m)});
        row = d.host_prev[row];
      }
    }
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0 && entries[i][0] != entries[i - 1][0]) round_begin.push_back((int32_t)i);
      tail_dst.push_back(entries[i][1]);
      tail_src.push_back(entries[i][2]);
    }
  }
  round_begin.push_back((int32_t)tail_dst.size());
  std::vector<int32_t> iota(Na);
  for (int64_t a = 0; a < Na; ++a) iota[a] = (int32_t)a;
  std::vector<int32_t> ints = meta;
  ints.insert(ints.end(), ext.begin(), ext.end());
  ints.insert(ints.end(), iota.begin(), iota.end());
  ints.insert(ints.end(), tail_dst.begin(), tail_dst.end());
  ints.insert(ints.end(), tail_src.begin(), tail_src.end());
  typename E::Buffer ints_buf, rows_buf;
  const int32_t* di = upload_ints(e, ints_buf, ints);
  const int32_t *d_prev = di, *d_pos = di + Na, *d_end = di + 2 * Na, *d_ext = di + 3 * Na, *d_iota = di + 4 * Na;
  const int32_t *d_tdst = di + 5 * Na, *d_tsrc = d_tdst + tail_dst.size();
  // x2, du2 (Na, CD) in the conv's layout, and its input gradient dx2 in fp32: the offered tails'
  // relayed gradients and the context rows' go in and out unrounded, each row rounded once.
  using Acc = typename E::Acc;
  typename E::Buffer dx_buf;
  e.ensure(rows_buf, sizeof(Act) * (size_t)2 * Na * CD_);
  e.ensure(dx_buf, sizeof(Acc) * (size_t)Na * CD_);
  Act* x2 = reinterpret_cast<Act*>(rows_buf.data());
  Act* du2 = x2 + Na * CD_;
  Acc* dx2 = reinterpret_cast<Acc*>(dx_buf.data());
  e.zero(du2, sizeof(Act) * (size_t)Na * CD_);
  e.zero(dx2, sizeof(Acc) * (size_t)Na * CD_);
  const Saved<E> s(*this, N, c.saved);
  e.copy_rows(x2, d_ext, carried ? d.x : s.qkv, d_iota, (int)Na, CD_);
  e.copy_rows(du2, d_ext, du, d_iota, N, CD_);
  for (size_t r = 0; r + 1 < round_begin.size(); ++r)
    if (round_begin[r + 1] > round_begin[r])
      e.add_rows(dx2, d_tdst + round_begin[r], (const Acc*)c.carry->offer_d_conv, d_tsrc + round_begin[r],
                 round_begin[r + 1] - round_begin[r], CD_);
  e.conv1d_silu_backward(dx2, c.g + conv_, du2, x2, c.w + conv_, d_prev, d_pos, d_end, (int)Na, CD_, K_);
  e.add_rows(dx, d_iota, (const Acc*)dx2, d_ext, N, CD_);  // dx is zero: one rounding
  if (carried) {  // the context rows' gradients into the slots' accumulators
    const LayerCarry<E>& cr = *c.carry;
    std::vector<int32_t> idx, src;
    for (int q = 0; q < R; ++q)
      if (cr.state_slot[q] >= 0)
        for (int m = 0; m < Kc; ++m) {
          idx.push_back((int32_t)((int64_t)cr.state_slot[q] * Kc + m));
          src.push_back(ext[N + (int64_t)q * Kc + m]);
        }
    const int m = (int)idx.size();
    idx.insert(idx.end(), src.begin(), src.end());
    const int32_t* ci = upload_ints(e, d.idx_buf, idx);
    if (m) e.add_rows(cr.d_conv, ci, (const Acc*)dx2, ci + m, m, CD_);
  }
}

template <class E>
void GdnKind::backward(E& e, const BlockCall<E>& c) const {
  check_carry(c);
  const int N = c.batch->N, C = C_;
  const Saved<E> s(*this, N, c.saved);
  const Scratch<E> t(*this, N, c.scratch);
  const auto* w = c.w;
  auto* g = c.g;
  using Act = typename E::Act;
  using Acc = typename E::Acc;
  auto zero = [&](Act* p, int64_t n) { e.zero(p, sizeof(Act) * (size_t)n); };
  const int64_t n = N, SE = recurrent_state_elems(), CE = conv_context_elems();
  const int Kc = K_ - 1;
  // A carry: the roots' context (their init states, the context rows the conv reads) and, for a
  // partition piece, the gradients its readers left at the offered nodes' end states and tails.
  const bool carried = reads_state(c);
  const bool offers = c.carry && !c.carry->offer_node.empty();
  Recurrent<E> rec;
  std::vector<double> d_init, d_end;  // the host path's
  DeviceContext<E> dev;               // the device path's, with its state gradients:
  typename E::Buffer dstate_buf;
  float *dinit_dev = nullptr, *dend_dev = nullptr;
  if constexpr (E::kHostRecurrent) {
    if (carried) rec = recurrent_begin(c, s.qkv, s.prev, /*carried=*/true, /*outputs=*/false);
    if (carried) d_init.assign(rec.root_node.size() * (size_t)SE, 0.0);
    if (offers) {
      d_end.assign((size_t)c.batch->layout.num_nodes * SE, 0.0);
      for (size_t o = 0; o < c.carry->offer_node.size(); ++o)
        for (int64_t i = 0; i < SE; ++i)
          d_end[(size_t)c.carry->offer_node[o] * SE + i] += (double)c.carry->offer_d_state[o * SE + i];
    }
  } else if (carried || offers) {
    device_begin(e, c, s.qkv, carried, /*ends=*/false, dev);
    const int64_t R = (int64_t)dev.root_node.size(), nodes = (int64_t)c.batch->layout.host_parent.size();
    const int64_t n_init = carried ? R * SE : 0, n_end = offers ? nodes * SE : 0;
    e.ensure(dstate_buf, sizeof(float) * (size_t)std::max<int64_t>(n_init + n_end, 1));
    e.zero(dstate_buf.data(), sizeof(float) * (size_t)(n_init + n_end));
    float* base = reinterpret_cast<float*>(dstate_buf.data());
    if (carried) dinit_dev = base;
    if (offers) {  // d_end[offer_node[o]] = offer_d_state[o] (offered nodes are distinct)
      dend_dev = base + n_init;
      const int O = (int)c.carry->offer_node.size();
      std::vector<int32_t> idx(c.carry->offer_node.begin(), c.carry->offer_node.end());
      for (int o = 0; o < O; ++o) idx.push_back(o);
      const int32_t* di = upload_ints(e, dev.idx_buf, idx);
      e.add_rows(dend_dev, di, c.carry->offer_d_state, di + O, O, (int)SE);
    }
  }
  e.linear_dx(t.dy, c.dx, w + w_out_, N, VD_, C, /*accumulate=*/false);
  e.linear_dw(g + w_out_, c.dx, s.y, N, VD_, C);
  zero(t.d_o, n * VD_);
  zero(t.dz, n * VD_);
  e.gated_rmsnorm_backward(t.d_o, t.dz, g + norm_, t.dy, s.o, s.z, w + norm_, s.y_rstd, N * nv_, dv_);
  zero(t.dqn, n * KD_);
  zero(t.dkn, n * KD_);
  zero(t.dv, n * VD_);
  e.zero(t.dg, sizeof(Acc) * (size_t)n * nv_);
  e.zero(t.dbeta, sizeof(Acc) * (size_t)n * nv_);
  if constexpr (E::kHostRecurrent)
    e.gdn_backward(t.dqn, t.dkn, t.dv, t.dg, t.dbeta, t.d_o, s.qn, s.kn, s.v, s.g, s.beta, c.batch->layout, N, nk_,
                   nv_, dk_, dv_, 1.0 / std::sqrt((double)dk_), carried ? rec.init.data() : nullptr,
                   carried ? d_init.data() : nullptr, offers ? d_end.data() : nullptr);
  else
    e.gdn_backward(t.dqn, t.dkn, t.dv, t.dg, t.dbeta, t.d_o, s.qn, s.kn, s.v, s.g, s.beta, c.batch->layout, N, nk_,
                   nv_, dk_, dv_, 1.0 / std::sqrt((double)dk_), carried ? (const float*)dev.init : nullptr, dinit_dev,
                   (const float*)dend_dev);
  e.gdn_gates_backward(t.da, t.db, g + a_log_, g + dt_bias_, t.dg, t.dbeta, s.a, s.b, w + a_log_, w + dt_bias_, N,
                       nv_);
  zero(t.dq, n * KD_);
  zero(t.dk, n * KD_);
  e.l2norm_backward(t.dq, t.dqn, s.q, s.q_rstd, N * nk_, dk_);
  e.l2norm_backward(t.dk, t.dkn, s.k, s.k_rstd, N * nk_, dk_);
  zero(t.du, n * CD_);
  e.add_cols(t.du, t.dq, N, CD_, 0, KD_);
  e.add_cols(t.du, t.dk, N, CD_, KD_, KD_);
  e.add_cols(t.du, t.dv, N, CD_, 2 * KD_, VD_);
  zero(t.dqkv, n * CD_);
  // With context rows the conv runs over the extended rows: the context rows' outputs have no
  // gradient, their inputs receive the gradient of the batch's first K - 1 rows' windows (and of
  // offered tails reaching back).
  if constexpr (!E::kHostRecurrent) {
    if (carried || offers) {
      device_conv_backward(e, c, dev, t.du, t.dqkv, carried);
      if (carried) {  // the roots' init-state gradients into the slots they read (fp32)
        const LayerCarry<E>& cr = *c.carry;
        std::vector<int32_t> idx, src;
        for (size_t q = 0; q < cr.state_slot.size(); ++q)
          if (cr.state_slot[q] >= 0) idx.push_back(cr.state_slot[q]), src.push_back((int32_t)q);
        const int m = (int)idx.size();
        idx.insert(idx.end(), src.begin(), src.end());
        const int32_t* di = upload_ints(e, dev.idx_buf, idx);
        if (m) e.add_rows(cr.d_state, di, (const Acc*)dinit_dev, di + m, m, (int)SE);
      }
    } else {
      e.conv1d_silu_backward(t.dqkv, g + conv_, t.du, s.qkv, w + conv_, s.prev, c.batch->layout, N, CD_, K_);
    }
  } else {  // the host path: carried context rows, offered tails
    Act* dx = t.dqkv;
    std::vector<Act> du_ext, dx_ext;
    if (carried) {
      const size_t Na = (size_t)rec.rows_n;
      du_ext.assign(Na * CD_, Act(0));
      dx_ext.assign(Na * CD_, Act(0));
      std::copy(t.du, t.du + (size_t)N * CD_, du_ext.begin());
      e.conv1d_silu_backward(dx_ext.data(), g + conv_, du_ext.data(), rec.rows, w + conv_, rec.links,
                             c.batch->layout, (int)Na, CD_, K_);
      dx = dx_ext.data();
    } else {
      e.conv1d_silu_backward(t.dqkv, g + conv_, t.du, s.qkv, w + conv_, s.prev, c.batch->layout, N, CD_, K_);
    }
    if (offers)
      for (size_t o = 0; o < c.carry->offer_node.size(); ++o)
        walk_tail<E>(c.batch->layout, carried ? rec.links : s.prev, c.carry->offer_node[o], Kc,
                     [&](int m, int32_t row) {
          if (row < 0) return;
          const Acc* src = c.carry->offer_d_conv + (int64_t)o * CE + (int64_t)m * CD_;
          for (int j = 0; j < CD_; ++j) dx[(size_t)row * CD_ + j] += (Act)src[j];
        });
    if (carried) {
      std::copy(dx_ext.begin(), dx_ext.begin() + (size_t)N * CD_, t.dqkv);
      const LayerCarry<E>& cr = *c.carry;
      for (int q = 0; q < (int)rec.root_node.size(); ++q) {
        const int slot = cr.state_slot[q];
        if (slot < 0) continue;  // check_carry: slots >= 0 have accumulators
        for (int64_t i = 0; i < SE; ++i) cr.d_state[slot * SE + i] += (Acc)d_init[(size_t)q * SE + i];
        for (int64_t i = 0; i < CE; ++i)
          cr.d_conv[slot * CE + i] += (Acc)dx_ext[((size_t)N + (size_t)q * Kc) * CD_ + i];
      }
    }
  }
  if (fused_) {  // the gradients back into the grouped layout (reusing the fused outputs' buffers,
                 // which backward does not read)
    regroup(e, /*to_flat=*/false, s.qkvz, s.ba, t.dqkv, t.dz, t.db, t.da, N);
    e.linear_dx(c.sum, s.qkvz, w + w_qkv_, N, C, CD_ + VD_, /*accumulate=*/false);
    e.linear_dx(c.sum, s.ba, w + w_b_, N, C, 2 * nv_, /*accumulate=*/true);
    e.linear_dw(g + w_qkv_, s.qkvz, s.n, N, C, CD_ + VD_);
    e.linear_dw(g + w_b_, s.ba, s.n, N, C, 2 * nv_);
  } else {
    e.linear_dx(c.sum, t.dqkv, w + w_qkv_, N, C, CD_, /*accumulate=*/false);
    e.linear_dx(c.sum, t.dz, w + w_z_, N, C, VD_, /*accumulate=*/true);
    e.linear_dx(c.sum, t.db, w + w_b_, N, C, nv_, /*accumulate=*/true);
    e.linear_dx(c.sum, t.da, w + w_a_, N, C, nv_, /*accumulate=*/true);
    e.linear_dw(g + w_qkv_, t.dqkv, s.n, N, C, CD_);
    e.linear_dw(g + w_z_, t.dz, s.n, N, C, VD_);
    e.linear_dw(g + w_b_, t.db, s.n, N, C, nv_);
    e.linear_dw(g + w_a_, t.da, s.n, N, C, nv_);
  }
  norm_backward(e, norm_offset_, c.dx, g + in_norm_, c.sum, c.x_in, w + in_norm_, s.rstd, N, C,
                /*accumulate_dx=*/true);
}

#define TT_GDN_INSTANTIATE(E)                                                \
  template size_t GdnKind::saved_bytes<E>(int) const;                        \
  template size_t GdnKind::scratch_bytes<E>(int) const;                      \
  template void GdnKind::forward<E>(E&, const BlockCall<E>&) const;          \
  template void GdnKind::backward<E>(E&, const BlockCall<E>&) const;
TT_GDN_INSTANTIATE(CpuExec<float>)
TT_GDN_INSTANTIATE(CpuExec<double>)
TT_GDN_INSTANTIATE(CudaExec)
#undef TT_GDN_INSTANTIATE

}  // namespace tt::model
