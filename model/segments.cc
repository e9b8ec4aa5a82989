// Segment-level execution: the configuration, the segment operator's prefixes and the truncated
// BPTT scheduler (see segments.h).
#include "model/segments.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <type_traits>

#include "base/check.h"
#include "model/sampler.h"

namespace tt::model {

// ---- The prefixes of one segment ----

template <class E>
SegmentReads<E>::SegmentReads(Decoder<E>& model, const SegmentConfig& cfg)
    : model_(&model),
      cfg_(&cfg),
      L_(model.architecture().num_layers()),
      NH_((int)model.config().num_attention_heads),
      NKV_((int)model.config().num_key_value_heads),
      HS_((int)model.config().head_dim),
      attention_(L_),
      tk_(L_),
      tv_(L_),
      dk_(L_),
      dv_(L_),
      rk_(L_),
      rv_(L_),
      idx_(L_) {
  for (int l = 0; l < L_; ++l) attention_[l] = model.carry_row_elems(l) > 0;
}

template <class E>
typename E::Rope SegmentReads<E>::rope(const int32_t* pos, int n) const {
  const ModelConfig& c = model_->config();
  // One table at a time (stream-ordered: each is used before the next is built); build() sizes
  // the storage for its largest first.
  model_->exec().ensure(rope_store_, std::max<size_t>(E::rope_bytes(n, (int)c.head_dim), 1));
  typename E::Rope r = model_->exec().make_rope(pos, n, (int)c.head_dim, c.rope_theta, rope_store_.data());
  if constexpr (E::kHybridOps) r.rotary_dim = c.rotary_dim() == c.head_dim ? 0 : c.rotary_dim();
  return r;
}

template <class E>
void SegmentReads<E>::build(const SegmentHistory<E>& h, bool tail_grads) {
  E& e = model_->exec();
  const SegmentConfig& cfg = *cfg_;
  const int64_t KD = (int64_t)NKV_ * HS_, QD = (int64_t)NH_ * HS_;
  const int64_t i = h.segment;
  tail_len_ = cfg.tail_rows(i);
  ret_len_ = cfg.retrieved_rows(i);
  grads_ = tail_grads && tail_len_ > 0;
  if (cfg.local_heads(NKV_) == 0) tail_len_ = 0;  // every head is long-range: nobody reads a tail
  const int M = (int)tail_len_, R = (int)ret_len_;
  const int64_t P = cfg.shift(i);
  e.ensure(rope_store_, std::max<size_t>(E::rope_bytes(std::max(M, R), HS_), 1));
  if (M > 0) {
    TT_CHECK((int64_t)h.tail_rows.size() >= M, "segments: segment ", i, " needs ", M, " tail rows, its history has ",
             h.tail_rows.size());
    // Rows computed at segment i - 1's positions move to P_i - M .. P_i - 1: one shift for all.
    const int32_t delta = (int32_t)(P - cfg.shift(i - 1) - cfg.length);
    const std::vector<int32_t> pos(M, delta);
    const std::vector<int32_t> rows(h.tail_rows.end() - M, h.tail_rows.end());
    e.ensure(tail_pos_, sizeof(int32_t) * M);
    e.ensure(tail_rows_, sizeof(int32_t) * M);
    e.upload(tail_pos_.data(), pos.data(), sizeof(int32_t) * M);
    e.upload(tail_rows_.data(), rows.data(), sizeof(int32_t) * M);
    const int32_t* d_rows = reinterpret_cast<const int32_t*>(tail_rows_.data());
    for (int l = 0; l < L_; ++l) {
      if (!attention_[l]) continue;
      TT_CHECK(h.k[l] && h.v[l], "segments: segment ", i, " has no tail source in layer ", l);
      e.ensure(tk_[l], sizeof(Act) * M * KD);
      e.ensure(tv_[l], sizeof(Act) * M * KD);
      Act* tk = reinterpret_cast<Act*>(tk_[l].data());
      e.gather_rows(tk, h.k[l], d_rows, M, (int)KD);
      e.gather_rows(reinterpret_cast<Act*>(tv_[l].data()), h.v[l], d_rows, M, (int)KD);
      e.rope_forward(tk, rope(reinterpret_cast<const int32_t*>(tail_pos_.data()), M), M, NKV_, HS_);
      if (grads_) {
        e.ensure(dk_[l], sizeof(Acc) * M * KD);
        e.ensure(dv_[l], sizeof(Acc) * M * KD);
      }
    }
  }
  if (R > 0) {
    int64_t pool_rows = 0;
    for (const PoolSpan<E>& s : h.pool) pool_rows += s.rows;
    TT_CHECK(pool_rows >= R, "segments: segment ", i, " retrieves ", R, " rows from a pool of ", pool_rows);
    std::vector<int32_t> pos(R);
    for (int j = 0; j < R; ++j) pos[j] = (int32_t)(P - R + j);
    e.ensure(ret_pos_, sizeof(int32_t) * R);
    e.upload(ret_pos_.data(), pos.data(), sizeof(int32_t) * R);
    e.ensure(q_pos_, sizeof(int32_t));
    e.upload(q_pos_.data(), &h.q_pos, sizeof(int32_t));
    const int64_t PD = (int64_t)__builtin_popcountll(cfg.long_heads()) * HS_;  // a pool row: long-range heads
    e.ensure(qn_, sizeof(Act) * QD);
    e.ensure(pool_k_, sizeof(Act) * pool_rows * PD);
    e.ensure(pool_v_, sizeof(Act) * pool_rows * PD);
    Act* pk = reinterpret_cast<Act*>(pool_k_.data());
    Act* pv = reinterpret_cast<Act*>(pool_v_.data());
    Act* qn = reinterpret_cast<Act*>(qn_.data());
    for (int l = 0; l < L_; ++l) {
      if (!attention_[l] || !cfg.long_layer(l)) continue;
      int64_t at = 0;
      for (const PoolSpan<E>& s : h.pool) {
        TT_CHECK(s.k[l] && s.v[l], "segments: the pool has no rows of long-range layer ", l);
        e.copy(pk + at * PD, s.k[l], s.rows * PD);
        e.copy(pv + at * PD, s.v[l], s.rows * PD);
        at += s.rows;
      }
      TT_CHECK(h.q[l], "segments: segment ", i, " has no end query in long-range layer ", l);
      e.copy(qn, h.q[l], QD);
      e.rope_backward(qn, rope(reinterpret_cast<const int32_t*>(q_pos_.data()), 1), 1, NH_, HS_);
      e.ensure(idx_[l], sizeof(int32_t) * NKV_ * R);
      int32_t* idx = reinterpret_cast<int32_t*>(idx_[l].data());
      e.retrieval_select(idx, qn, pk, (int)pool_rows, NH_, NKV_, HS_, cfg.long_heads(), R);
      e.ensure(rk_[l], sizeof(Act) * R * KD);
      e.ensure(rv_[l], sizeof(Act) * R * KD);
      Act* rk = reinterpret_cast<Act*>(rk_[l].data());
      e.retrieval_gather(rk, pk, idx, R, NKV_, HS_, cfg.long_heads());
      e.retrieval_gather(reinterpret_cast<Act*>(rv_[l].data()), pv, idx, R, NKV_, HS_, cfg.long_heads());
      e.rope_forward(rk, rope(reinterpret_cast<const int32_t*>(ret_pos_.data()), R), R, NKV_, HS_);
    }
  }
}

template <class E>
void SegmentReads<E>::append_to(Carry<E>& carry, int q_begin, int q_end) const {
  TT_CHECK((int)carry.size() == L_, "segments: a carry of ", carry.size(), " layers, expected ", L_);
  for (int l = 0; l < L_; ++l) {
    if (!attention_[l]) continue;
    if (tail_len_ > 0) {
      typename E::KV kv;
      kv.k = reinterpret_cast<const Act*>(tk_[l].data());
      kv.v = reinterpret_cast<const Act*>(tv_[l].data());
      kv.len = (int)tail_len_;
      kv.q_begin = q_begin;
      kv.q_end = q_end;
      kv.heads = cfg_->local_heads(NKV_);
      carry[l].kv.push_back(kv);
    }
    if (ret_len_ > 0 && cfg_->long_layer(l)) {
      typename E::KV kv;  // detached: dk, dv stay null
      kv.k = reinterpret_cast<const Act*>(rk_[l].data());
      kv.v = reinterpret_cast<const Act*>(rv_[l].data());
      kv.len = (int)ret_len_;
      kv.q_begin = q_begin;
      kv.q_end = q_end;
      kv.heads = cfg_->long_heads();
      carry[l].kv.push_back(kv);
    }
  }
}

template <class E>
void SegmentReads<E>::set_tail_grads(Carry<E>& carry, bool on) {
  if (tail_len_ == 0) return;
  TT_CHECK(!on || grads_, "segments: the tail was built without gradient accumulators");
  const int64_t KD = (int64_t)NKV_ * HS_;
  for (int l = 0; l < L_; ++l) {
    if (!attention_[l]) continue;
    for (typename E::KV& kv : carry[l].kv) {
      if (kv.k != reinterpret_cast<const Act*>(tk_[l].data())) continue;
      kv.dk = on ? reinterpret_cast<Acc*>(dk_[l].data()) : nullptr;
      kv.dv = on ? reinterpret_cast<Acc*>(dv_[l].data()) : nullptr;
    }
    if (on) {
      model_->exec().zero(dk_[l].data(), sizeof(Acc) * tail_len_ * KD);
      model_->exec().zero(dv_[l].data(), sizeof(Acc) * tail_len_ * KD);
    }
  }
}

template <class E>
void SegmentReads<E>::push_tail_grads(const std::vector<Acc*>& dk, const std::vector<Acc*>& dv) {
  if (tail_len_ == 0) return;
  TT_CHECK(grads_, "segments: the tail was built without gradient accumulators");
  E& e = model_->exec();
  const int M = (int)tail_len_, KD = NKV_ * HS_;
  const int32_t* rows = reinterpret_cast<const int32_t*>(tail_rows_.data());
  for (int l = 0; l < L_; ++l) {
    if (!attention_[l]) continue;
    Acc* gk = reinterpret_cast<Acc*>(dk_[l].data());
    // d(rotated key) -> d(key at the position it was computed at): the inverse rotation, in the
    // accumulators' precision (fp32 on the GPU).
    e.rope_backward(gk, rope(reinterpret_cast<const int32_t*>(tail_pos_.data()), M), M, NKV_, HS_);
    e.add_rows(dk[l], rows, gk, M, KD);
    e.add_rows(dv[l], rows, reinterpret_cast<const Acc*>(dv_[l].data()), M, KD);
  }
}

template <class E>
std::vector<int32_t> SegmentReads<E>::retrieved_rows(int layer) const {
  std::vector<int32_t> out((size_t)NKV_ * ret_len_);
  if (ret_len_ > 0 && cfg_->long_layer(layer))
    model_->exec().download(out.data(), idx_[layer].data(), sizeof(int32_t) * out.size());
  return out;
}

// ---- The pool ----

template <class E>
void PoolChunk<E>::assign(Decoder<E>& model, const SegmentConfig& cfg, const std::vector<const typename E::Act*>& k,
                          const std::vector<const typename E::Act*>& v, const std::vector<int32_t>& rows,
                          const std::vector<int32_t>& pos) {
  using Act = typename E::Act;
  E& e = model.exec();
  const ModelConfig& mc = model.config();
  const int L = model.architecture().num_layers(), N = (int)pos.size();
  const int NKV = (int)mc.num_key_value_heads, HS = (int)mc.head_dim;
  TT_CHECK(rows.size() == pos.size(), "segments: ", rows.size(), " pool rows with ", pos.size(), " positions");
  rows_ = N;
  k_.resize(L);
  v_.resize(L);
  row_elems_.assign(L, 0);
  typename E::Buffer d_pos, d_rows, d_rope;
  e.ensure(d_rope, std::max<size_t>(E::rope_bytes(N, HS), 1));
  e.ensure(d_pos, sizeof(int32_t) * std::max(N, 1));
  e.ensure(d_rows, sizeof(int32_t) * std::max(N, 1));
  e.upload(d_pos.data(), pos.data(), sizeof(int32_t) * N);
  e.upload(d_rows.data(), rows.data(), sizeof(int32_t) * N);
  typename E::Rope r = e.make_rope(reinterpret_cast<const int32_t*>(d_pos.data()), N, HS, mc.rope_theta, d_rope.data());
  if constexpr (E::kHybridOps) r.rotary_dim = mc.rotary_dim() == mc.head_dim ? 0 : mc.rotary_dim();
  // The long-range heads' columns only: every row gathered whole into `full`, its keys rotated
  // back, then head g's columns moved to slot pool_slot(heads, g).
  const uint64_t heads = cfg.long_heads();
  const int NL = __builtin_popcountll(heads), KD = NKV * HS;
  typename E::Buffer full;
  for (int l = 0; l < L; ++l) {
    if (!cfg.long_layer(l) || model.carry_row_elems(l) == 0) continue;
    TT_CHECK(k[l] && v[l], "segments: the pool has no rows of long-range layer ", l);
    TT_CHECK(model.carry_row_elems(l) == KD, "segments: layer ", l, " offers rows of ", model.carry_row_elems(l),
             " elements, expected ", KD);
    row_elems_[l] = (int64_t)NL * HS;
    const int64_t n = (int64_t)N * row_elems_[l];
    e.ensure(k_[l], sizeof(Act) * std::max<int64_t>(n, 1));
    e.ensure(v_[l], sizeof(Act) * std::max<int64_t>(n, 1));
    e.ensure(full, sizeof(Act) * std::max<int64_t>((int64_t)N * KD, 1));
    Act* f = reinterpret_cast<Act*>(full.data());
    const int32_t* dr = reinterpret_cast<const int32_t*>(d_rows.data());
    for (int kv = 0; kv < 2; ++kv) {
      e.gather_rows(f, kv == 0 ? k[l] : v[l], dr, N, KD);
      if (kv == 0) e.rope_backward(f, r, N, NKV, HS);
      Act* dst = reinterpret_cast<Act*>((kv == 0 ? k_[l] : v_[l]).data());
      for (int g = 0, slot = 0; g < NKV; ++g)
        if ((heads >> g) & 1) e.move_cols(dst, NL * HS, slot++ * HS, f, KD, g * HS, N, HS);
    }
  }
  e.sync();  // d_pos, d_rows and full are freed on return
}

template <class E>
PoolSpan<E> PoolChunk<E>::span(int begin, int end) const {
  using Act = typename E::Act;
  TT_CHECK(0 <= begin && begin <= end && end <= rows_, "segments: pool rows [", begin, ", ", end, ") of ", rows_);
  PoolSpan<E> s;
  s.rows = end - begin;
  s.k.assign(k_.size(), nullptr);
  s.v.assign(v_.size(), nullptr);
  for (size_t l = 0; l < k_.size(); ++l) {
    if (row_elems_[l] == 0) continue;
    s.k[l] = reinterpret_cast<const Act*>(k_[l].data()) + (int64_t)begin * row_elems_[l];
    s.v[l] = reinterpret_cast<const Act*>(v_[l].data()) + (int64_t)begin * row_elems_[l];
  }
  return s;
}

data::PackedBatch segment_batch(const SegmentConfig& cfg, const data::SegmentPlan& plan, int piece) {
  data::PackedBatch b = data::pack_piece(plan.split, plan.pieces, piece);
  for (int32_t& p : b.pos) p = (int32_t)cfg.position(p);
  return b;
}

Work segment_work(const SegmentConfig& cfg, const data::SegmentPlan& plan, const ModelConfig& model) {
  const int NKV = (int)model.num_key_value_heads;
  const double local = (double)__builtin_popcountll(cfg.local_heads(NKV)) / NKV;
  // Work::visible_pairs counts once for every attention layer (the FLOP API charges it to each
  // full_attention layer): the retrieving layers' share is of those, not of all layers.
  int attention_layers = 0;
  for (const LayerSpec& spec : model.layer_specs()) attention_layers += spec.mixer == "full_attention";
  const double long_layers =
      attention_layers > 0 ? (double)cfg.long_range.layers.size() / attention_layers : 0.0;
  Work w;
  for (int k = 0; k < plan.pieces.num_pieces(); ++k) {
    const data::PackedBatch b = segment_batch(cfg, plan, k);
    Work piece = Work::of(b);
    const int64_t i = plan.segment[k];
    double pairs = 0;
    for (int32_t p : b.pos) pairs += (double)(p - cfg.shift(i) + 1);  // in-segment ancestors and itself
    pairs += (double)b.n_tokens * (local * (double)cfg.tail_rows(i) +
                                   (1 - local) * long_layers * (double)cfg.retrieved_rows(i));
    piece.visible_pairs = (int64_t)std::llround(pairs);
    w += piece;
  }
  return w;
}

// ---- Training ----

namespace {

// Everything a live piece holds between its forward and its last column.
template <class E>
struct LivePiece {
  explicit LivePiece(Decoder<E>& m, const SegmentConfig& c) : reads(m, c) {}
  Activations<E> acts;
  SegmentReads<E> reads;
  Carry<E> carry;                        // [layer] what it reads (its prefixes)
  Carry<E> rows;                         // [layer] its own rows (export_carry)
  std::vector<typename E::Buffer> acc;   // [d] for d = 1..K: per layer (dk, dv) of its rows ([0] unused)
  std::vector<Carry<E>> relay;           // [d] its rows with dk, dv pointing into acc[d]
  // Recurrent layers: the state and conv context its root starts from (copies of what its parent
  // offered: its later columns read them after the parent is gone), where it sends their gradient
  // (the parent's offer accumulators of depth d + 1 while d < K), the nodes its child pieces hang
  // from, their end states and conv tails, and per depth d = 1..K the gradients the children's
  // column d - 1 leave there.
  typename E::Buffer in_state, in_conv;  // per layer (1, state elems) Acc, (1, conv elems) Act
  int32_t parent_slot = -1;              // its slot among the parent's offers
  std::vector<int32_t> offer_node;
  typename E::Buffer offer_state, offer_conv;  // per layer (offers, elems)
  std::vector<typename E::Buffer> offer_grad;  // [d] per layer (offers, state elems + conv elems) Acc
  std::vector<int> pending;              // [d] children whose column d - 1 has not pushed
  int columns_left = 0;
  int children_left = 0;
  int N = 0;
};

template <class E>
std::vector<typename E::Acc*> layer_ptrs(const Carry<E>& c, bool dk) {
  std::vector<typename E::Acc*> p(c.size(), nullptr);
  for (size_t l = 0; l < c.size(); ++l)
    if (!c[l].kv.empty()) p[l] = dk ? c[l].kv[0].dk : c[l].kv[0].dv;
  return p;
}

// The scheduler of forward_backward_segmented; on_forward (optional) sees each piece's
// activations after its forward.
template <class E>
double run_segmented(Decoder<E>& model, const SegmentConfig& cfg, const data::SegmentPlan& plan, double loss_scale,
                     bool train, SegmentRunStats* stats,
                     const std::function<void(int, const Activations<E>&)>& on_forward,
                     const LoadPieceFrames& load_frames) {
  using Acc = typename E::Acc;
  using Act = typename E::Act;
  cfg.validate(model.config());
  TT_CHECK(plan.length == cfg.length, "segments: a plan of ", plan.length, "-token segments for segments.length ",
           cfg.length);
  E& e = model.exec();
  const data::Partition& parts = plan.pieces;
  const int P = parts.num_pieces(), L = model.architecture().num_layers();
  const int NKV = (int)model.config().num_key_value_heads;
  const int NH = (int)model.config().num_attention_heads, HS = (int)model.config().head_dim;
  std::vector<int64_t> row_elems(L);
  for (int l = 0; l < L; ++l) row_elems[l] = model.carry_row_elems(l);
  // Recurrent layers (Gated DeltaNet): a piece's root starts from the end state of the node it
  // hangs from and reads that node's conv tail, as without segments; their gradients cross at most
  // K boundaries, as the tail's do.
  std::vector<int64_t> state_elems(L), conv_elems(L);
  int64_t max_se = 0, max_ce = 0;
  for (int l = 0; l < L; ++l) {
    state_elems[l] = model.recurrent_state_elems(l);
    conv_elems[l] = model.conv_context_elems(l);
    max_se = std::max(max_se, state_elems[l]);
    max_ce = std::max(max_ce, conv_elems[l]);
  }
  const bool recurrent = max_se > 0;
  // Depth of the gradient through the tails and states (none without a tail read by some head or
  // a recurrent layer).
  const bool tail_grads = cfg.tail > 0 && cfg.local_heads(NKV) != 0;
  const int K = train && (tail_grads || recurrent) ? (int)cfg.tbptt : 0;
  const PieceOffers offers(plan.split, parts);
  size_t max_offers = 0;
  for (const data::Piece& p : parts.pieces) max_offers = std::max(max_offers, p.child_pieces.size());
  // Gradients no backward reads (a column's offers before any child pushed: zeros) and none keeps
  // (a root's state gradient past depth K: discarded).
  typename E::Buffer zeros, discard;
  if (recurrent) {
    const size_t z = sizeof(Acc) * (size_t)std::max<int64_t>(1, (int64_t)max_offers * (max_se + max_ce));
    e.ensure(zeros, z);
    e.zero(zeros.data(), z);
    e.ensure(discard, sizeof(Acc) * (size_t)(max_se + max_ce));
    e.zero(discard.data(), sizeof(Acc) * (size_t)(max_se + max_ce));  // written, never read
  }
  Acc* const zero_acc = recurrent ? reinterpret_cast<Acc*>(zeros.data()) : nullptr;
  Acc* const discard_acc = recurrent ? reinterpret_cast<Acc*>(discard.data()) : nullptr;
  // Height of each piece in the piece tree (children have larger indices).
  std::vector<int> height(P, 0);
  for (int k = P - 1; k > 0; --k) {
    const int p = parts.pieces[k].parent_piece;
    height[p] = std::max(height[p], height[k] + 1);
  }
  std::vector<std::unique_ptr<LivePiece<E>>> live(P);
  std::vector<PoolChunk<E>> pool(cfg.retrieval() ? P : 0);
  SegmentRunStats st;
  st.pieces = P;
  double loss = 0;
  LossReader<E>& losses = model.piece_losses();
  losses.clear();
  int64_t live_tokens = 0;

  std::function<void(int)> maybe_free = [&](int k) {
    LivePiece<E>& lp = *live[k];
    if (lp.columns_left > 0 || lp.children_left > 0) return;
    live_tokens -= lp.N;
    live[k].reset();
  };
  // Column d of piece k: the backward of the losses d pieces below it (d = 0: its own), whose
  // tail gradients go on into the parent's accumulator of depth d + 1 while d < K.
  // Recurrent layers, column d of piece k: its offers' gradients are those of depth d (zeros for
  // d = 0), its root's go to the parent's of depth d + 1 when pushed, else nowhere.
  auto recurrent_grads = [&](LivePiece<E>& lp, int parent, int d, bool push) {
    const int64_t O = (int64_t)lp.offer_node.size();
    Acc* og = d >= 1 && O > 0 ? reinterpret_cast<Acc*>(lp.offer_grad[d].data()) : nullptr;
    LivePiece<E>* pp = push ? live[parent].get() : nullptr;
    Acc* pg = pp ? reinterpret_cast<Acc*>(pp->offer_grad[d + 1].data()) : nullptr;
    const int64_t PO = pp ? (int64_t)pp->offer_node.size() : 0;
    for (int l = 0; l < L; ++l) {
      const int64_t SE = state_elems[l], CE = conv_elems[l];
      if (SE == 0) continue;
      LayerCarry<E>& g = lp.carry[l];
      if (O > 0) {
        g.offer_d_state = og ? og : zero_acc;
        g.offer_d_conv = og ? og + O * SE : zero_acc;
        if (og) og += O * (SE + CE);
      }
      if (lp.parent_slot >= 0) {
        g.d_state = pg ? pg + lp.parent_slot * SE : discard_acc;
        g.d_conv = pg ? pg + PO * SE + lp.parent_slot * CE : discard_acc + max_se;
      }
      if (pg) pg += PO * (SE + CE);
    }
  };
  std::function<void(int, int)> column = [&](int k, int d) {
    LivePiece<E>& lp = *live[k];
    const int parent = parts.pieces[k].parent_piece;
    const bool push = d < K && parent >= 0;
    lp.reads.set_tail_grads(lp.carry, push);
    if (recurrent) recurrent_grads(lp, parent, d, push);
    const bool again = lp.columns_left > 1;  // a later column runs on the same activations
    if (d == 0) {
      model.backward(lp.acts, nullptr, nullptr, /*with_loss=*/true, again);
    } else {
      model.backward(lp.acts, &lp.relay[d], nullptr, /*with_loss=*/false, again);
    }
    ++st.backwards;
    --lp.columns_left;
    if (push) {
      LivePiece<E>& pp = *live[parent];
      lp.reads.push_tail_grads(layer_ptrs(pp.relay[d + 1], true), layer_ptrs(pp.relay[d + 1], false));
      if (--pp.pending[d + 1] == 0) column(parent, d + 1);
    }
    maybe_free(k);
  };

  for (int k = 0; k < P; ++k) {
    const data::Piece& piece = parts.pieces[k];
    const int64_t i = plan.segment[k];
    auto lp = std::make_unique<LivePiece<E>>(model, cfg);
    data::PackedBatch batch = segment_batch(cfg, plan, k);
    if (!batch.frames.empty()) {
      TT_CHECK(load_frames, "segments: piece ", k, " of tree '", plan.split.id, "' shows frames (",
               batch.frames.size(), ") but no frame loader was given");
      load_frames(batch);
    }
    const int N = batch.n_tokens;
    lp->N = N;
    lp->carry.assign(L, {});
    const int parent = piece.parent_piece;
    if (parent >= 0) {
      const LivePiece<E>& pp = *live[parent];
      SegmentHistory<E> h;
      h.segment = i;
      // The path's rows before the piece: the gateway chain; its last rows lie in the parent.
      std::vector<int32_t> chain_rows;
      for (const data::GatewaySegment& s : piece.gateway)
        if (s.piece == parent)
          for (int32_t r = s.row_begin; r < s.row_end; ++r) chain_rows.push_back(r);
      TT_CHECK((int64_t)chain_rows.size() == cfg.length, "segments: piece ", k, " of tree '", plan.split.id,
               "' has ", chain_rows.size(), " rows of its path in its parent piece, expected ", cfg.length);
      h.tail_rows = chain_rows;
      h.k.assign(L, nullptr);
      h.v.assign(L, nullptr);
      h.q.assign(L, nullptr);
      for (int l = 0; l < L; ++l) {
        if (pp.rows[l].kv.empty()) continue;
        h.k[l] = pp.rows[l].kv[0].k;
        h.v[l] = pp.rows[l].kv[0].v;
        if (pp.rows[l].q) h.q[l] = pp.rows[l].q + (int64_t)chain_rows.back() * NH * HS;
      }
      h.q_pos = (int32_t)cfg.position(i * cfg.length - 1);
      if (cfg.retrieval()) {
        for (const data::GatewaySegment& s : piece.gateway) h.pool.push_back(pool[s.piece].span(s.row_begin, s.row_end));
        st.pool_rows = std::max<int64_t>(st.pool_rows, piece.prefix_tokens);
      }
      lp->reads.build(h, K > 0);
      lp->reads.append_to(lp->carry, 0, N);
    }
    if (recurrent) {
      // Offers: the nodes its child pieces hang from (their end states and conv tails).
      lp->offer_node = offers.offers(k);
      const int64_t O = (int64_t)lp->offer_node.size();
      const LivePiece<E>* pp = parent >= 0 ? live[parent].get() : nullptr;
      const int64_t PO = pp ? (int64_t)pp->offer_node.size() : 0;
      if (pp) lp->parent_slot = offers.parent_slot(k, plan.split.id);
      int64_t se = 0, ce = 0;
      for (int l = 0; l < L; ++l) se += state_elems[l], ce += conv_elems[l];
      e.ensure(lp->offer_state, sizeof(Acc) * (size_t)std::max<int64_t>(1, O * se));
      e.ensure(lp->offer_conv, sizeof(Act) * (size_t)std::max<int64_t>(1, O * ce));
      e.ensure(lp->in_state, sizeof(Acc) * (size_t)se);
      e.ensure(lp->in_conv, sizeof(Act) * (size_t)std::max<int64_t>(1, ce));
      Acc* os = reinterpret_cast<Acc*>(lp->offer_state.data());
      Act* oc = reinterpret_cast<Act*>(lp->offer_conv.data());
      Acc* is = reinterpret_cast<Acc*>(lp->in_state.data());
      Act* ic = reinterpret_cast<Act*>(lp->in_conv.data());
      const Acc* ps = pp ? reinterpret_cast<const Acc*>(pp->offer_state.data()) : nullptr;
      const Act* pc = pp ? reinterpret_cast<const Act*>(pp->offer_conv.data()) : nullptr;
      for (int l = 0; l < L; ++l) {
        const int64_t SE = state_elems[l], CE = conv_elems[l];
        if (SE == 0) continue;
        LayerCarry<E>& g = lp->carry[l];
        g.state_slot = {-1};
        if (pp) {  // its own copy: its later columns read it after the parent is gone
          e.copy(is, ps + lp->parent_slot * SE, SE);
          if (CE > 0) e.copy(ic, pc + lp->parent_slot * CE, CE);
          g.state_slot = {0};
          g.state = is;
          g.conv = ic;
          is += SE;
          ic += CE;
          ps += PO * SE;
          pc += PO * CE;
        }
        if (O > 0) {
          g.offer_node = lp->offer_node;
          g.offer_state = os;
          g.offer_conv = oc;
          os += O * SE;
          oc += O * CE;
        }
      }
      recurrent_grads(*lp, parent, 0, false);  // what a training forward checks; each column sets its own
    }
    model.forward(batch, loss_scale, lp->acts, &lp->carry);
    ++st.forwards;
    st.tokens += N;
    live_tokens += N;
    st.peak_live_tokens = std::max(st.peak_live_tokens, live_tokens);
    if (on_forward) on_forward(k, lp->acts);
    lp->rows = N > 0 ? model.export_carry(lp->acts) : Carry<E>(L);
    if (cfg.retrieval() && N > 0) {  // detached copies of the rows
      std::vector<const typename E::Act*> kb(L, nullptr), vb(L, nullptr);
      for (int l = 0; l < L; ++l)
        if (!lp->rows[l].kv.empty()) kb[l] = lp->rows[l].kv[0].k, vb[l] = lp->rows[l].kv[0].v;
      std::vector<int32_t> all(N);
      std::iota(all.begin(), all.end(), 0);
      pool[k].assign(model, cfg, kb, vb, all, batch.pos);
    }
    if (train) {
      // Columns 1..min(K, height): one accumulator of the rows' relayed gradients per depth d,
      // which the children's column d - 1 fill and column d reads (and of the offers' states).
      const int depth = std::min(K, height[k]);
      if (recurrent && !lp->offer_node.empty()) {
        int64_t total = 0;
        for (int l = 0; l < L; ++l) total += (int64_t)lp->offer_node.size() * (state_elems[l] + conv_elems[l]);
        lp->offer_grad.resize(depth + 1);
        for (int d = 1; d <= depth; ++d) {
          e.ensure(lp->offer_grad[d], sizeof(Acc) * (size_t)total);
          e.zero(lp->offer_grad[d].data(), sizeof(Acc) * (size_t)total);
        }
      }
      lp->columns_left = 1 + depth;
      lp->pending.assign(depth + 1, 0);
      for (int c : piece.child_pieces)
        for (int d = 1; d <= depth; ++d)
          if (height[c] >= d - 1) ++lp->pending[d];
      lp->acc.resize(depth + 1);
      lp->relay.assign(depth + 1, Carry<E>(L));  // no tail read by a local head: no rows' gradients
      int64_t total = 0;
      for (int l = 0; l < L; ++l) total += 2 * (int64_t)N * row_elems[l];
      for (int d = 1; d <= depth && tail_grads; ++d) {
        e.ensure(lp->acc[d], sizeof(Acc) * (size_t)total);
        e.zero(lp->acc[d].data(), sizeof(Acc) * (size_t)total);
        Acc* next = reinterpret_cast<Acc*>(lp->acc[d].data());
        lp->relay[d] = lp->rows;
        for (int l = 0; l < L; ++l) {
          for (typename E::KV& kv : lp->relay[d][l].kv) {
            kv.dk = next;
            kv.dv = next + (int64_t)N * row_elems[l];
          }
          next += 2 * (int64_t)N * row_elems[l];
        }
      }
    }
    losses.add(model, lp->acts);  // read once, after the schedule: no wait between pieces
    lp->children_left = (int)piece.child_pieces.size();
    live[k] = std::move(lp);
    if (parent >= 0) --live[parent]->children_left;
    if (train) column(k, 0);
    if (parent >= 0 && live[parent]) maybe_free(parent);
    if (live[k]) maybe_free(k);
  }
  for (int k = 0; k < P; ++k)
    TT_CHECK(!live[k], "segments: piece ", k, " of tree '", plan.split.id, "' is still live after the schedule");
  const Losses l = losses.total(e);
  loss = l.loss;
  st.nll_sum = l.nll_sum;
  if (stats) *stats = st;
  return loss;
}

}  // namespace

template <class E>
double forward_backward_segmented(Decoder<E>& model, const SegmentConfig& cfg, const data::SegmentPlan& plan,
                                  double loss_scale, SegmentRunStats* stats, const LoadPieceFrames& load_frames) {
  return run_segmented<E>(model, cfg, plan, loss_scale, /*train=*/true, stats, nullptr, load_frames);
}

template <class E>
std::vector<std::vector<double>> segmented_piece_logits(Decoder<E>& model, const SegmentConfig& cfg,
                                                        const data::SegmentPlan& plan,
                                                        const LoadPieceFrames& load_frames) {
  std::vector<std::vector<double>> out(plan.pieces.num_pieces());
  run_segmented<E>(model, cfg, plan, 1.0, /*train=*/false, nullptr,
                   [&](int k, const Activations<E>& a) { out[k] = model.saved_logits(a); }, load_frames);
  return out;
}

// ---- Inference ----

namespace {

// One sequence's segments in inference: the open segment (the one its next row falls in), its
// prefixes, its rows in the KV cache so far, the pool of its closed segments, and the query of
// its last row (the end query once the segment closes). A prompt's state is copied into each of
// its samples, which share its prefixes and pool chunks until they roll into segments of their own.
template <class E>
struct SeqSegments {
  int64_t open = 0;
  std::shared_ptr<SegmentReads<E>> reads;           // null for segment 0
  std::vector<int32_t> rows;                        // cache rows of the open segment, in order
  std::vector<std::shared_ptr<PoolChunk<E>>> pool;  // closed segments, oldest first (with retrieval)
  std::shared_ptr<typename E::Buffer> last_q;       // [layer] (NH HS): the last row's queries
  // Recurrent layers: the cache slot holding the state and conv tail after its last row (null
  // before its first row: zeros), its own (a fork copies it into a slot of its own).
  std::shared_ptr<const int32_t> slot;
  // Set while a prefill takes its forward's results in (the slot, the rows, a roll): a failure
  // there leaves it set, and the sequence half updated.
  bool broken = false;
};

template <class E>
class SegmentedInference {
 public:
  using Act = typename E::Act;
  // `slots`: the sequences (with their forks) alive at once, each a state slot of a recurrent
  // model's cache (reserved here).
  SegmentedInference(Decoder<E>& model, const SegmentConfig& cfg, KVCache<E>& cache, int64_t slots)
      : model_(model), cfg_(cfg), cache_(cache), L_(model.architecture().num_layers()),
        QD_(model.config().num_attention_heads * model.config().head_dim),
        free_slots_(std::make_shared<std::vector<int32_t>>()) {
    if (!cache.recurrent()) return;
    const int64_t first = cache.reserve_slots(slots);
    free_slots_->reserve((size_t)slots);
    for (int64_t s = first + slots - 1; s >= first; --s) free_slots_->push_back((int32_t)s);
  }

  SeqSegments<E> start() {
    SeqSegments<E> st;
    st.last_q = std::make_shared<typename E::Buffer>();
    model_.exec().ensure(*st.last_q, sizeof(Act) * (size_t)std::max<int64_t>(1, L_ * QD_));
    return st;
  }
  // A copy whose last query is its own (the prefixes and pool chunks are shared, read-only).
  SeqSegments<E> fork(const SeqSegments<E>& a) {
    SeqSegments<E> b = a;
    b.last_q = std::make_shared<typename E::Buffer>();
    model_.exec().ensure(*b.last_q, sizeof(Act) * (size_t)std::max<int64_t>(1, L_ * QD_));
    model_.exec().copy(q_of(b, 0), q_of(a, 0), L_ * QD_);
    if (a.slot) {
      b.slot = new_slot();
      cache_.copy_state(*b.slot, *a.slot);
    }
    return b;
  }
  // Recurrent models: the slot st's next rows start from (-1: zeros) and the one they leave their
  // state in: with in_place st's own (a decode step, whose failure ends the generation), else, and
  // for st's first rows, a fresh one, st's once the forward succeeded: a failed forward leaves st
  // as it was, its state untouched.
  struct StateIo {
    int32_t in = -1;
    std::shared_ptr<const int32_t> out;
  };
  StateIo state_io(const SeqSegments<E>& st, bool in_place) {
    return {st.slot ? *st.slot : -1, st.slot && in_place ? st.slot : new_slot()};
  }
  // Adds what row(s) [q_begin, q_end) of the open segment read: its prefixes and its earlier rows.
  void read(const SeqSegments<E>& st, Carry<E>& carry, int q_begin, int q_end) const {
    if (st.reads) st.reads->append_to(carry, q_begin, q_end);
    for (size_t a = 0; a < st.rows.size();) {  // runs of consecutive cache rows
      size_t b = a + 1;
      while (b < st.rows.size() && st.rows[b] == st.rows[b - 1] + 1) ++b;
      cache_.read(carry, st.rows[a], (int)(b - a), q_begin, q_end);
      a = b;
    }
  }
  // The batch's query rows land in q_buf (per layer (rows, NH HS)); the write for cache rows `rows`.
  CacheWrite<E> write(const std::vector<int32_t>& rows, std::vector<int32_t> state_out = {}) {
    CacheWrite<E> w = cache_.write(rows, std::move(state_out));
    if (cfg_.retrieval()) {
      model_.exec().ensure(q_buf_, sizeof(Act) * (size_t)L_ * QD_ * std::max<size_t>(rows.size(), 1));
      w.q.assign(L_, nullptr);
      for (int l = 0; l < L_; ++l)
        if (cfg_.long_layer(l)) w.q[l] = reinterpret_cast<Act*>(q_buf_.data()) + (int64_t)l * QD_ * rows.size();
    }
    return w;
  }
  // After a forward: batch row r (of n) at cache row `row` joins the open segment of st, and its
  // queries become st's last; a full segment closes and the next one opens.
  void append(SeqSegments<E>& st, int r, int n, int32_t row) {
    st.rows.push_back(row);
    // Only the batch's last row, or the row closing the segment, is ever read as the last query.
    const bool needed = r == n - 1 || (int64_t)st.rows.size() == cfg_.length;
    if (cfg_.retrieval() && needed)
      for (int l = 0; l < L_; ++l)
        if (cfg_.long_layer(l))
          model_.exec().copy(q_of(st, l), reinterpret_cast<const Act*>(q_buf_.data()) + ((int64_t)l * n + r) * QD_, QD_);
    if ((int64_t)st.rows.size() == cfg_.length) roll(st);
  }
  // Rows of st's open segment in one forward: batch b (at the segment's positions) reads st's
  // prefixes and earlier rows, stores its K/V at cache rows `rows` and joins the segment. A
  // failed forward leaves st as it was (its recurrent state goes to a fresh slot, state_io); a
  // failure after it, as st takes the rows in, leaves st.broken set.
  InferResult prefill(SeqSegments<E>& st, const data::PackedBatch& b, const std::vector<int32_t>& rows,
                      const InferRequest& req) {
    TT_CHECK(!st.broken, "segments: a sequence left half updated by a failure");
    const int n = b.n_tokens;
    Carry<E> carry(L_);
    read(st, carry, 0, n);
    std::vector<int32_t> state_out;
    StateIo io;
    if (cache_.recurrent()) {
      io = state_io(st, /*in_place=*/false);
      cache_.read_state(carry, {io.in});
      state_out = {*io.out};
    }
    const CacheWrite<E> w = write(rows, std::move(state_out));
    InferResult res = model_.infer(b, req, &carry, &w);
    st.broken = true;
    if (io.out) st.slot = io.out;
    for (int j = 0; j < n; ++j) append(st, j, n, rows[j]);
    st.broken = false;
    return res;
  }

 private:
  std::shared_ptr<const int32_t> new_slot() {
    TT_CHECK(!free_slots_->empty(), "segments: every state slot of the cache is taken (sequences and marks alive "
             "at once)");
    int32_t* s = new int32_t(free_slots_->back());  // failing, takes nothing
    free_slots_->pop_back();
    std::shared_ptr<std::vector<int32_t>> pool = free_slots_;
    // The deleter gives the slot back, also where the holder's own allocation fails (the
    // constructor calls it); the list holds every slot's room (reserved), so that cannot throw.
    return std::shared_ptr<const int32_t>(s, [pool](const int32_t* p) {
      pool->push_back(*p);
      delete p;
    });
  }
  Act* q_of(const SeqSegments<E>& st, int l) const { return reinterpret_cast<Act*>(st.last_q->data()) + (int64_t)l * QD_; }

  void roll(SeqSegments<E>& st) {
    const int64_t i = st.open, S = cfg_.length;
    std::vector<const Act*> k(L_, nullptr), v(L_, nullptr), q(L_, nullptr);
    for (int l = 0; l < L_; ++l)
      if (model_.carry_row_elems(l) > 0) k[l] = cache_.k(l), v[l] = cache_.v(l), q[l] = q_of(st, l);
    if (cfg_.retrieval()) {
      std::vector<int32_t> pos(S);
      for (int64_t j = 0; j < S; ++j) pos[j] = (int32_t)cfg_.position(i * S + j);
      auto chunk = std::make_shared<PoolChunk<E>>();
      chunk->assign(model_, cfg_, k, v, st.rows, pos);
      st.pool.push_back(chunk);
    }
    SegmentHistory<E> h;
    h.segment = i + 1;
    h.k = k;
    h.v = v;
    h.tail_rows = st.rows;
    for (const auto& c : st.pool) h.pool.push_back(c->span(0, c->rows()));
    h.q = q;
    h.q_pos = (int32_t)cfg_.position((i + 1) * S - 1);
    st.reads = std::make_shared<SegmentReads<E>>(model_, cfg_);
    st.reads->build(h, false);
    st.open = i + 1;
    st.rows.clear();
  }

  Decoder<E>& model_;
  const SegmentConfig& cfg_;
  KVCache<E>& cache_;
  int L_;
  int64_t QD_;
  typename E::Buffer q_buf_;
  std::shared_ptr<std::vector<int32_t>> free_slots_;  // shared with the slots' deleters
};

// One node of `tokens` at depths [d0, d0 + n) as a batch (positions of the segment).
data::PackedBatch segment_rows(const SegmentConfig& cfg, const int32_t* tokens, int n, int64_t d0) {
  data::PackedBatch b;
  b.n_tokens = n;
  b.tokens.assign(tokens, tokens + n);
  for (int j = 0; j < n; ++j) {
    b.pos.push_back((int32_t)cfg.position(d0 + j));
    b.subtree_end.push_back(n);
  }
  b.node_start = {0};
  b.node_len = {n};
  b.node_parent = {-1};
  b.tree_start = {0, n};
  return b;
}

}  // namespace

template <class E>
std::vector<Completion> generate_segmented(Decoder<E>& model, const SegmentConfig& cfg,
                                           const std::vector<Prompt>& prompts, const SamplingOptions& opt,
                                           GenerateStats* stats, std::vector<std::vector<double>>* logits_out) {
  opt.validate();
  cfg.validate(model.config());
  TT_CHECK(cfg.enabled(), "generate_segmented: segments are off (segments.length 0)");
  check_prompts(model.config(), prompts, opt, /*bounded_positions=*/true);
  const int V = (int)model.config().vocab_size, K = opt.num_samples;
  const int64_t S = cfg.length;
  const bool on_backend = draws_on_backend(opt, logits_out != nullptr);
  GenerateStats st;
  std::vector<Completion> out(prompts.size());
  if (logits_out) logits_out->clear();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& tok = prompts[p].tokens;
    const int64_t plen = (int64_t)tok.size();
    // The cache holds open segments only: a closed segment's rows live on as its successor's tail
    // and in the pool (both copies), so the prompt's segments reuse one span of S rows, and each
    // sample's rows a ring of S (a segment's rows are consecutive modulo S: at most two runs).
    const int64_t ring = std::min<int64_t>(S, opt.max_new_tokens);
    KVCache<E> cache(model, std::min(plen, S) + (int64_t)K * ring, 1 + K);
    SegmentedInference<E> seg(model, cfg, cache, 1 + K);
    const int64_t prompt_rows = cache.reserve(std::min(plen, S));
    out[p].id = prompts[p].id;
    out[p].samples.resize(K);
    std::vector<SampleStream> streams;
    std::vector<int64_t> gen_row;
    for (int s = 0; s < K; ++s) {
      streams.emplace_back(opt, (int64_t)p, s, &out[p].samples[s]);
      gen_row.push_back(cache.reserve(ring));
    }
    const bool capture = logits_out && p == 0;
    // Prefill, segment by segment through the same prefixes as training.
    SeqSegments<E> prompt = seg.start();
    InferResult last;
    const double t_pre = now_s();
    for (int64_t d0 = 0; d0 < plen; d0 += S) {
      const int n = (int)std::min<int64_t>(S, plen - d0);
      const data::PackedBatch b = segment_rows(cfg, tok.data() + d0, n, d0);
      std::vector<int32_t> rows(n);
      for (int j = 0; j < n; ++j) rows[j] = (int32_t)(prompt_rows + j);
      const bool final = d0 + n == plen;
      std::vector<int32_t> want;
      if (capture) {
        for (int j = 0; j < n; ++j) want.push_back(j);
      } else if (final) {
        want.assign(K, n - 1);  // every sample's first draw
      }
      std::vector<SampleStream*> who;
      for (SampleStream& x : streams) who.push_back(&x);
      InferRequest req = draw_request(want, final && on_backend ? who : std::vector<SampleStream*>{}, opt,
                                      final && on_backend);
      if (want.empty()) req.rows = InferRequest::Rows::kNone;
      const InferResult res = seg.prefill(prompt, b, rows, req);
      ++st.forwards;
      st.prefill_rows += n;
      if (capture)
        for (int j = 0; j < n; ++j) logits_out->emplace_back(res.logits.begin() + (size_t)j * V, res.logits.begin() + (size_t)(j + 1) * V);
      if (final) last = res;
    }
    st.prefill_s += now_s() - t_pre;
    std::vector<SeqSegments<E>> state;
    for (int s = 0; s < K; ++s) {
      state.push_back(seg.fork(prompt));
      take_draw(streams[s], last, capture ? (int)(plen - 1 - (plen - 1) / S * S) : s, V, opt, on_backend);
    }
    // Decode: one row per live sample, each in its own open segment.
    const double t_dec = now_s();
    while (true) {
      std::vector<int> act;
      for (int s = 0; s < K; ++s)
        if (!streams[s].done) act.push_back(s);
      if (act.empty()) break;
      const int B = (int)act.size();
      data::PackedBatch step;
      step.n_tokens = B;
      Carry<E> carry(model.architecture().num_layers());
      std::vector<int32_t> rows, slot_in, slot_out;
      std::vector<typename SegmentedInference<E>::StateIo> ios;
      std::vector<SampleStream*> who;
      for (int r = 0; r < B; ++r) {
        const SampleStream& x = streams[act[r]];
        const int64_t j = (int64_t)x.out->tokens.size();  // the row computes token j - 1's K/V
        const int64_t depth = plen + j - 1;
        step.tokens.push_back(x.out->tokens.back());
        step.pos.push_back((int32_t)cfg.position(depth));
        step.subtree_end.push_back(r + 1);
        step.node_start.push_back(r);
        step.node_len.push_back(1);
        step.node_parent.push_back(-1);
        step.tree_start.push_back(r);
        rows.push_back((int32_t)(gen_row[act[r]] + (j - 1) % ring));
        seg.read(state[act[r]], carry, r, r + 1);
        if (cache.recurrent()) {
          ios.push_back(seg.state_io(state[act[r]], /*in_place=*/true));
          slot_in.push_back(ios.back().in);
          slot_out.push_back(*ios.back().out);
        }
        who.push_back(&streams[act[r]]);
      }
      step.tree_start.push_back(B);
      if (cache.recurrent()) cache.read_state(carry, slot_in);
      const CacheWrite<E> w = seg.write(rows, slot_out);
      std::vector<int32_t> all(B);
      std::iota(all.begin(), all.end(), 0);
      const InferResult res = model.infer(step, draw_request(all, who, opt, on_backend), &carry, &w);
      ++st.forwards;
      ++st.decode_steps;
      st.decode_rows += B;
      for (int r = 0; r < B; ++r) {
        if (capture && act[r] == 0)
          logits_out->emplace_back(res.logits.begin() + (size_t)r * V, res.logits.begin() + (size_t)(r + 1) * V);
        if (!ios.empty()) state[act[r]].slot = ios[r].out;
        seg.append(state[act[r]], r, B, rows[r]);
        take_draw(streams[act[r]], res, r, V, opt, on_backend);
      }
    }
    st.decode_s += now_s() - t_dec;
  }
  if (stats) *stats = st;
  return out;
}

// ---- A growing path (SegmentedPath) ----

namespace {

// Rows [a, e) of a one-node batch `b` at depths d0.. (the segment's positions), with its media:
// the frames its slots there show (each once), a slot the range cuts as its part (slot_first,
// slot_count), the state rows there.
data::PackedBatch slice_rows(const SegmentConfig& cfg, const data::PackedBatch& b, int a, int e, int64_t d0) {
  data::PackedBatch out = segment_rows(cfg, b.tokens.data() + a, e - a, d0);
  out.tokens_per_frame = b.tokens_per_frame;
  out.image_size = b.image_size;
  out.state_dim = b.state_dim;
  const size_t px = (size_t)3 * b.image_size * b.image_size;
  std::vector<int32_t> frame_of(b.frames.size(), -1);
  for (size_t k = 0; k < b.slot_row.size(); ++k) {
    const int32_t r0 = b.slot_row[k], lo = std::max(r0, (int32_t)a), hi = std::min(r0 + b.slot_rows(k), (int32_t)e);
    if (lo >= hi) continue;
    const int32_t f = b.slot_frame[k];
    if (frame_of[f] < 0) {
      frame_of[f] = (int32_t)out.frames.size();
      out.frames.push_back(b.frames[f]);
      if (!b.pixels.empty()) out.pixels.insert(out.pixels.end(), b.pixels.begin() + f * px, b.pixels.begin() + (f + 1) * px);
    }
    out.slot_row.push_back(lo - a);
    out.slot_frame.push_back(frame_of[f]);
    out.slot_first.push_back(b.slot_first_token(k) + (lo - r0));
    out.slot_count.push_back(hi - lo);
  }
  for (size_t k = 0; k < b.state_row.size(); ++k) {
    const int32_t r = b.state_row[k];
    if (r < a || r >= e) continue;
    out.state_row.push_back(r - a);
    out.state.insert(out.state.end(), b.state.begin() + k * b.state_dim, b.state.begin() + (k + 1) * b.state_dim);
  }
  return out;
}

}  // namespace

template <class E>
struct SegmentedPath<E>::Impl {
  // State slots (recurrent models): the path, three marks (a policy's step takes two, a window's
  // policy keeps one after the instruction) and a rewind's fork of one or a prefill's fresh slot
  // (SegmentedInference::state_io).
  static constexpr int64_t kSlots = 5;
  Impl(Decoder<E>& m, const SegmentConfig& c, int64_t ring_rows)
      : cache(m, ring_rows, kSlots), seg(m, c, cache, kSlots), st(seg.start()), ring(ring_rows) {
    base = cache.reserve(ring);
  }
  KVCache<E> cache;  // the ring: depth d at row base + d mod ring
  SegmentedInference<E> seg;
  SeqSegments<E> st;
  int64_t ring = 0, base = 0;
};

template <class E>
struct SegmentedPath<E>::Mark {
  SeqSegments<E> st;
  int64_t depth = 0;
};

template <class E>
SegmentedPath<E>::SegmentedPath(Decoder<E>& model, const SegmentConfig& cfg, int64_t ahead)
    : model_(model), cfg_(cfg), ahead_(ahead) {
  cfg_.validate(model.config());
  TT_CHECK(cfg_.enabled(), "SegmentedPath: segments are off (segments.length 0)");
  TT_CHECK(ahead >= 1, "SegmentedPath: ahead = ", ahead, ", expected >= 1");
  impl_ = std::make_unique<Impl>(model, cfg_, cfg_.length + ahead);
}

template <class E>
SegmentedPath<E>::~SegmentedPath() = default;

template <class E>
int64_t SegmentedPath<E>::bytes() const {
  int64_t n = impl_->cache.bytes();
  for (const auto& chunk : impl_->st.pool) n += chunk->bytes();
  return n;
}

template <class E>
void SegmentedPath<E>::clear() {
  impl_->st = impl_->seg.start();
  depth_ = 0;
}

template <class E>
std::vector<double> SegmentedPath<E>::append(const data::PackedBatch& b) {
  const int n = b.n_tokens;
  TT_CHECK(n >= 1 && b.num_nodes() == 1 && (int)b.tokens.size() == n, "SegmentedPath: a batch of ", n, " rows in ",
           b.num_nodes(), " nodes, expected one node of at least one row");
  data::check_packed_batch(b, model_.config().vocab_size);  // a bad batch appends nothing
  TT_CHECK(!impl_->st.broken, "SegmentedPath: a failure at depth ", depth_, " (after a forward, as its rows joined ",
           "their segment) left the path half updated; rewind() to a mark or clear() it");
  const int64_t S = cfg_.length;
  std::vector<double> logits;
  for (int a = 0; a < n;) {  // the rows up to the open segment's end, then the next segment's
    const int64_t d = depth_;  // advanced past rows [0, a) below
    const int e = (int)std::min<int64_t>(n, a + (S - d % S));
    std::vector<int32_t> rows(e - a);
    for (int j = 0; j < e - a; ++j) rows[j] = (int32_t)(impl_->base + (d + j) % impl_->ring);
    InferRequest req;
    req.loss = false;
    req.rows = e == n ? InferRequest::Rows::kList : InferRequest::Rows::kNone;
    if (e == n) req.list = {e - a - 1};
    InferResult res = impl_->seg.prefill(impl_->st, slice_rows(cfg_, b, a, e, d), rows, req);
    if (e == n) logits = std::move(res.logits);
    depth_ += e - a;  // a later segment's forward failing leaves the path after this one's rows
    a = e;
  }
  return logits;
}

template <class E>
std::shared_ptr<const typename SegmentedPath<E>::Mark> SegmentedPath<E>::mark() const {
  TT_CHECK(!impl_->st.broken, "SegmentedPath: a failure at depth ", depth_, " left the path half updated; rewind() ",
           "to a mark or clear() it");
  auto m = std::make_shared<Mark>();
  m->st = impl_->seg.fork(impl_->st);
  m->depth = depth_;
  return m;
}

template <class E>
void SegmentedPath<E>::rewind(const std::shared_ptr<const Mark>& m) {
  TT_CHECK(m && m->depth <= depth_ && depth_ - m->depth <= ahead_, "SegmentedPath: rewinding from depth ", depth_,
           " to ", m ? m->depth : -1, ", expected a mark at most ", ahead_, " rows back (the ring holds no more)");
  impl_->st = impl_->seg.fork(m->st);
  depth_ = m->depth;
}

#define TT_SEGMENTS_INSTANTIATE(E)                                                                                 \
  template class SegmentReads<E>;                                                                                  \
  template class PoolChunk<E>;                                                                                     \
  template class SegmentedPath<E>;                                                                                 \
  template double forward_backward_segmented<E>(Decoder<E>&, const SegmentConfig&, const data::SegmentPlan&,      \
                                                double, SegmentRunStats*, const LoadPieceFrames&);                 \
  template std::vector<std::vector<double>> segmented_piece_logits<E>(Decoder<E>&, const SegmentConfig&,           \
                                                                      const data::SegmentPlan&,                   \
                                                                      const LoadPieceFrames&);                    \
  template std::vector<Completion> generate_segmented<E>(Decoder<E>&, const SegmentConfig&,                        \
                                                         const std::vector<Prompt>&, const SamplingOptions&,       \
                                                         GenerateStats*, std::vector<std::vector<double>>*);
TT_SEGMENTS_INSTANTIATE(CpuExec<float>)
TT_SEGMENTS_INSTANTIATE(CpuExec<double>)
#undef TT_SEGMENTS_INSTANTIATE
// The GPU runs the segment operator in inference and training (segmented_piece_logits reads the
// training forward's logits, which only the CPU keeps).
template double forward_backward_segmented<CudaExec>(Decoder<CudaExec>&, const SegmentConfig&,
                                                     const data::SegmentPlan&, double, SegmentRunStats*,
                                                     const LoadPieceFrames&);
template class SegmentReads<CudaExec>;
template class PoolChunk<CudaExec>;
template std::vector<Completion> generate_segmented<CudaExec>(Decoder<CudaExec>&, const SegmentConfig&,
                                                              const std::vector<Prompt>&, const SamplingOptions&,
                                                              GenerateStats*, std::vector<std::vector<double>>*);

}  // namespace tt::model
