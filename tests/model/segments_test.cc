// Segment-level execution on the CPU in fp64 (model/segments.h): the segment operator against the
// ordinary decoder where the two must agree (one segment; a whole-segment tail; retrieval of the
// whole history by every head), the truncated-BPTT scheduler against an independent reference
// for K = 0, 1, 2, finite differences where nothing is truncated, the detached retrieval, and the
// configuration's errors.
//
// Tolerances: fp64 throughout. Where the two sides compute the same sums in another order or
// with RoPE applied in two rotations instead of one (a rounding of ~1e-16 per element), results
// agree to 1e-10 relative to the largest element (errors grow by ~1e3 over a few layers at most).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/check.h"
#include "data/packing.h"
#include "data/partition.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "model/segments.h"
#include "tests/base/alloc_faults.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using testing::tiny_config;
using tt::testing::fail_allocation;  // tests/base/alloc_faults.h

// qwen3 (q/k norms), 3 layers, 4 query heads on 2 KV heads of 4 dims.
ModelConfig seg_model() {
  ModelConfig c = tiny_config("qwen3", false);
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  return c;
}

// The same with Gated DeltaNet layers (Qwen3.5: linear, full, linear attention), or only those.
ModelConfig hybrid_model(bool all_linear = false) {
  ModelConfig c = seg_model();
  testing::make_hybrid(c, "qwen3_5_text");
  if (all_linear) c.layer_types.assign(3, "linear_attention");
  return c;
}

std::vector<int32_t> random_tokens(int n, uint64_t seed, int V = 11) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = (int32_t)std::uniform_int_distribution<int>(0, V - 1)(rng);
  return t;
}

std::string tokens_json(const std::vector<int32_t>& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? "," : "") + std::to_string(t[i]);
  return s + "]";
}

// A rollouts group: the sequences merge into a prefix tree.
data::Tree group_tree(const std::vector<std::vector<int32_t>>& seqs, const std::vector<double>& weights = {}) {
  std::string line = R"({"id": "g", "sequences": [)";
  for (size_t i = 0; i < seqs.size(); ++i) {
    line += (i ? "," : "") + std::string(R"({"tokens": )") + tokens_json(seqs[i]);
    if (!weights.empty()) line += R"(, "weight": )" + std::to_string(weights[i]);
    line += "}";
  }
  return data::parse_rollouts_line(line + "]}", "test", 0);
}

double rel_max(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, mx = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    mx = std::max(mx, std::abs(b[i]));
  }
  return diff / std::max(mx, 1e-300);
}

std::vector<double> grads_of(const Model<double>& m) { return std::vector<double>(m.grads(), m.grads() + m.num_params()); }

// Loss and gradients of ordinary (unsegmented) training of a tree.
std::pair<double, std::vector<double>> ordinary(Model<double>& m, const data::Tree& t, double scale) {
  m.zero_grad();
  const double loss = m.forward_backward(data::pack({&t}, data::Packing::kTree), scale);
  return {loss, grads_of(m)};
}

std::pair<double, std::vector<double>> segmented(Model<double>& m, const SegmentConfig& cfg, const data::Tree& t,
                                                 double scale, SegmentRunStats* st = nullptr) {
  m.zero_grad();
  const double loss = forward_backward_segmented(m, cfg, data::plan_segments(t, cfg.length), scale, st);
  return {loss, grads_of(m)};
}

TEST(Segments, OneSegmentLongerThanTheTreeIsOrdinaryTraining) {
  Model<double> m(seg_model());
  m.init(3);
  std::vector<int32_t> a = random_tokens(17, 1), b(a.begin(), a.begin() + 5);
  for (int32_t x : random_tokens(4, 2)) b.push_back(x);
  const data::Tree t = group_tree({a, b});
  SegmentConfig cfg;
  cfg.length = 32;
  cfg.tail = 8;
  cfg.long_range = {{1}, {0}, 4};
  const auto [l0, g0] = ordinary(m, t, 0.5);
  SegmentRunStats st;
  const auto [l1, g1] = segmented(m, cfg, t, 0.5, &st);
  EXPECT_EQ(st.pieces, 1);
  EXPECT_EQ(st.backwards, 1);
  EXPECT_NEAR(l1, l0, 1e-12 * std::abs(l0));
  EXPECT_LE(rel_max(g1, g0), 1e-12);
}

// With M = S, a path of at most two segments sees its whole history through the tail, at
// re-indexed positions whose distances are the true ones, and K = 1 lets every gradient through:
// ordinary training, on a chain and on a tree whose branches start in either segment.
TEST(Segments, WholeSegmentTailOverTwoSegmentsIsOrdinaryTraining) {
 for (const ModelConfig& mc : {seg_model(), hybrid_model()}) {
  SCOPED_TRACE(mc.architecture);
  Model<double> m(mc);
  m.init(5);
  const std::vector<int32_t> base = random_tokens(12, 7);
  std::vector<int32_t> b1(base.begin(), base.begin() + 4), b2(base.begin(), base.begin() + 8);
  for (int32_t x : random_tokens(6, 8)) b1.push_back(x);
  for (int32_t x : random_tokens(3, 9)) b2.push_back(x);
  const std::vector<data::Tree> trees = {group_tree({base}), group_tree({base, b1, b2}, {1.0, -0.5, 2.0})};
  for (const data::Tree& t : trees) {
    SegmentConfig cfg;
    cfg.length = 6;
    cfg.tail = 6;
    cfg.tbptt = 1;
    const auto [l0, g0] = ordinary(m, t, 1.0);
    SegmentRunStats st;
    const auto [l1, g1] = segmented(m, cfg, t, 1.0, &st);
    EXPECT_GE(st.pieces, 2);
    EXPECT_NEAR(l1, l0, 1e-10 * std::abs(l0));
    EXPECT_LE(rel_max(g1, g0), 1e-10) << st.pieces << " pieces";
  }
 }
}

// A Gated DeltaNet layer's state and conv window follow the path across segment boundaries as
// they do without segments: with only such layers the segmented forward is the ordinary one for any
// tail, and with K >= the segments a path spans so is the gradient. Segments of 2 tokens are
// shorter than the conv window's 3 context rows (which then reach back over several pieces),
// branches start on and between boundaries, one-token nodes. K = 0 detaches the states: the loss
// stays the ordinary one, the gradient does not.
TEST(Segments, RecurrentStatesCrossSegmentsExactly) {
  Model<double> m(hybrid_model(/*all_linear=*/true));
  m.init(61);
  const std::vector<int32_t> base = random_tokens(13, 62);
  std::vector<int32_t> b1(base.begin(), base.begin() + 4), b2(base.begin(), base.begin() + 7),
      b3(base.begin(), base.begin() + 7);
  for (int32_t x : random_tokens(5, 63)) b1.push_back(x);
  b2.push_back(3);
  for (int32_t x : random_tokens(4, 64)) b3.push_back(x);
  const std::vector<data::Tree> trees = {group_tree({base}), group_tree({base, b1, b2, b3}, {1.0, -0.5, 2.0, 0.7})};
  for (const data::Tree& t : trees) {
    for (int64_t S : {2, 3, 5}) {
      SegmentConfig cfg;
      cfg.length = S;
      cfg.tail = S == 3 ? 0 : S / 2;  // (no attention layer reads it; 0: no tail gradients at all)
      cfg.tbptt = 16;
      const auto [l0, g0] = ordinary(m, t, 1.0);
      SegmentRunStats st;
      const auto [l1, g1] = segmented(m, cfg, t, 1.0, &st);
      EXPECT_GE(st.pieces, 3);
      EXPECT_NEAR(l1, l0, 1e-10 * std::abs(l0)) << "S " << S;
      EXPECT_LE(rel_max(g1, g0), 1e-10) << "S " << S << ", " << st.pieces << " pieces";
      cfg.tbptt = 0;
      const auto [l2, g2] = segmented(m, cfg, t, 1.0);
      EXPECT_NEAR(l2, l0, 1e-10 * std::abs(l0)) << "S " << S;
      EXPECT_GT(rel_max(g2, g0), 1e-6) << "K = 0 must detach the states";
    }
  }
}

// Every KV head long-range in every layer, no tail, retrieval of R >= the whole history: each
// segment's queries see every earlier key at its true position, so the forward is ordinary
// attention (the gradient is not: retrieved pairs are detached).
TEST(Segments, RetrievingTheWholeHistoryGivesTheOrdinaryForward) {
  Model<double> m(seg_model());
  m.init(11);
  const data::Tree t = group_tree({random_tokens(18, 12)});
  SegmentConfig cfg;
  cfg.length = 6;
  cfg.tail = 0;
  cfg.long_range = {{0, 1, 2}, {1, 0}, 12};
  const auto [l0, g0] = ordinary(m, t, 1.0);
  const auto [l1, g1] = segmented(m, cfg, t, 1.0);
  EXPECT_NEAR(l1, l0, 1e-10 * std::abs(l0));
  // Logits row by row: on a chain the pieces' head rows are the rows 0 .. n - 2 in order.
  const InferResult ref = m.infer(data::pack({&t}, data::Packing::kTree), InferRequest::all_logits());
  std::vector<double> seg;
  for (const std::vector<double>& x : segmented_piece_logits(m, cfg, data::plan_segments(t, cfg.length)))
    seg.insert(seg.end(), x.begin(), x.end());
  ASSERT_EQ(seg.size(), ref.logits.size() - 11);  // every row but the last, V = 11
  EXPECT_LE(rel_max(seg, std::vector<double>(ref.logits.begin(), ref.logits.end() - 11)), 1e-10);
  EXPECT_GT(rel_max(g1, g0), 1e-3) << "retrieved pairs take no gradient, so the gradients must differ";
}

// ---- The independent truncated-BPTT reference ----
//
// L_K = sum_j l_j, where l_j is segment j's loss with the tail entering segment j - K detached.
// For every j it runs the chain of segments max(0, j - K) .. j from scratch (fresh activations),
// the first reading its tail from a plain forward of the whole sequence (detached), the others
// from the chain's own rows with gradient accumulators, and back-propagates l_j alone through
// the chain. Pools and end queries come from the plain forward (they are detached anyway). It
// shares the segment operator (SegmentReads, PoolChunk, segment_batch) with the scheduler, but
// none of the scheduler's bookkeeping (columns, depths, pushes, freeing).
// Points the K/V rows a forward of n rows exports (own) at zeroed gradient accumulators in acc.
void own_grads(Model<double>& m, Carry<CpuExec<double>>& own, int n, std::vector<double>& acc) {
  const int L = m.architecture().num_layers();
  int64_t total = 0;
  for (int l = 0; l < L; ++l) total += 2 * (int64_t)n * m.carry_row_elems(l);
  acc.assign(total, 0.0);
  double* next = acc.data();
  for (int l = 0; l < L; ++l) {
    if (own[l].kv.empty()) continue;
    own[l].kv[0].dk = next;
    own[l].kv[0].dv = next + (int64_t)n * m.carry_row_elems(l);
    next += 2 * (int64_t)n * m.carry_row_elems(l);
  }
}

// Recurrent layers: the state and conv tail a chain segment's one node offers, and their gradients.
struct Offers {
  std::vector<std::vector<double>> state, conv, d_state, d_conv;  // [layer]
};

std::vector<double> tbptt_reference(Model<double>& m, const SegmentConfig& cfg, const data::Tree& t) {
  using E = CpuExec<double>;
  const data::SegmentPlan plan = data::plan_segments(t, cfg.length);
  const int P = plan.pieces.num_pieces(), L = m.architecture().num_layers();
  const int NH = (int)m.config().num_attention_heads, HS = (int)m.config().head_dim;
  for (int k = 1; k < P; ++k) TT_CHECK(plan.pieces.pieces[k].parent_piece == k - 1, "the reference runs chains");
  for (int k = 0; k < P; ++k) TT_CHECK(plan.pieces.pieces[k].nodes.size() == 1, "the reference runs one-node pieces");
  // Recurrent layers: segment s starts from `from`'s offer (null: zeros) and sends its gradient to
  // `back`'s accumulators (null: detached), and offers its own end state in `own`.
  std::vector<double> discard(1 << 16);
  auto recurrent = [&](Carry<E>& c, int s, Offers* from, Offers* back, Offers& own) {
    own.state.resize(L), own.conv.resize(L), own.d_state.resize(L), own.d_conv.resize(L);
    for (int l = 0; l < L; ++l) {
      const int64_t SE = m.recurrent_state_elems(l), CE = m.conv_context_elems(l);
      if (SE == 0) continue;
      TT_CHECK(SE + CE <= (int64_t)discard.size(), "the reference's discard buffer is too small");
      LayerCarry<E>& g = c[l];
      g.state_slot = {from ? 0 : -1};
      if (from) {
        g.state = from->state[l].data();
        g.conv = from->conv[l].data();
        g.d_state = back ? back->d_state[l].data() : discard.data();
        g.d_conv = back ? back->d_conv[l].data() : discard.data() + SE;
      }
      if (s == P - 1) continue;
      own.state[l].assign(SE, 0.0);
      own.conv[l].assign(CE, 0.0);
      own.d_state[l].assign(SE, 0.0);
      own.d_conv[l].assign(CE, 0.0);
      g.offer_node = {0};
      g.offer_state = own.state[l].data();
      g.offer_conv = own.conv[l].data();
      g.offer_d_state = own.d_state[l].data();
      g.offer_d_conv = own.d_conv[l].data();
    }
  };
  std::vector<Offers> plain_offers(P);
  // The plain forward: every segment's rows, pool chunk and activations.
  std::vector<Activations<E>> plain(P);
  std::vector<Carry<E>> rows(P);
  std::vector<PoolChunk<E>> pool(P);
  std::vector<std::unique_ptr<SegmentReads<E>>> reads(P);
  std::vector<Carry<E>> carry(P, Carry<E>(L));
  auto history = [&](int k, const Carry<E>& prev_rows) {
    SegmentHistory<E> h;
    h.segment = k;
    for (int r = 0; r < (int)cfg.length; ++r) h.tail_rows.push_back(r);
    h.k.assign(L, nullptr);
    h.v.assign(L, nullptr);
    h.q.assign(L, nullptr);
    for (int l = 0; l < L; ++l) {
      if (prev_rows[l].kv.empty()) continue;  // a recurrent layer
      h.k[l] = prev_rows[l].kv[0].k;
      h.v[l] = prev_rows[l].kv[0].v;
      h.q[l] = rows[k - 1][l].q + (cfg.length - 1) * NH * HS;
    }
    h.q_pos = (int32_t)cfg.position(k * cfg.length - 1);
    for (int a = 0; a < k; ++a) h.pool.push_back(pool[a].span(0, pool[a].rows()));
    return h;
  };
  for (int k = 0; k < P; ++k) {
    const data::PackedBatch b = segment_batch(cfg, plan, k);
    if (k > 0) {
      reads[k] = std::make_unique<SegmentReads<E>>(m, cfg);
      reads[k]->build(history(k, rows[k - 1]), false);
      reads[k]->append_to(carry[k], 0, b.n_tokens);
    }
    recurrent(carry[k], k, k > 0 ? &plain_offers[k - 1] : nullptr, nullptr, plain_offers[k]);
    m.forward(b, 1.0, plain[k], &carry[k]);
    rows[k] = m.export_carry(plain[k]);
    std::vector<const double*> kb(L), vb(L);
    for (int l = 0; l < L; ++l)
      if (!rows[k][l].kv.empty()) kb[l] = rows[k][l].kv[0].k, vb[l] = rows[k][l].kv[0].v;
    std::vector<int32_t> all(b.n_tokens);
    for (int r = 0; r < b.n_tokens; ++r) all[r] = r;
    pool[k].assign(m, cfg, kb, vb, all, b.pos);
  }
  m.zero_grad();
  for (int j = 0; j < P; ++j) {
    const int first = std::max(0, j - (int)cfg.tbptt);
    const int n = j - first + 1;
    std::vector<Activations<E>> acts(n);
    std::vector<Carry<E>> own(n), chain_carry(n, Carry<E>(L));
    std::vector<std::vector<double>> acc(n);
    std::vector<std::unique_ptr<SegmentReads<E>>> rd(n);
    std::vector<Offers> offers(n);
    for (int s = first; s <= j; ++s) {
      const int x = s - first;
      const data::PackedBatch b = segment_batch(cfg, plan, s);
      if (s > 0) {
        rd[x] = std::make_unique<SegmentReads<E>>(m, cfg);
        rd[x]->build(history(s, s == first ? rows[s - 1] : own[x - 1]), s > first);
        rd[x]->append_to(chain_carry[x], 0, b.n_tokens);
        rd[x]->set_tail_grads(chain_carry[x], s > first);
      }
      Offers* from = s == 0 ? nullptr : s == first ? &plain_offers[s - 1] : &offers[x - 1];
      recurrent(chain_carry[x], s, from, s > first ? &offers[x - 1] : nullptr, offers[x]);
      m.forward(b, 1.0, acts[x], &chain_carry[x]);
      own[x] = m.export_carry(acts[x]);
      own_grads(m, own[x], b.n_tokens, acc[x]);
    }
    for (int s = j; s >= first; --s) {
      const int x = s - first;
      m.backward(acts[x], s == j ? nullptr : &own[x], nullptr, /*with_loss=*/s == j);
      if (s > first) {
        std::vector<double*> dk(L, nullptr), dv(L, nullptr);
        for (int l = 0; l < L; ++l)
          if (!own[x - 1][l].kv.empty()) dk[l] = own[x - 1][l].kv[0].dk, dv[l] = own[x - 1][l].kv[0].dv;
        rd[x]->push_tail_grads(dk, dv);
      }
    }
  }
  return grads_of(m);
}

// A mixed configuration: a tail of 2 rows, KV head 1 long-range, retrieval in layer 1.
SegmentConfig mixed(int K) {
  SegmentConfig cfg;
  cfg.length = 4;
  cfg.tail = 2;
  cfg.tbptt = K;
  cfg.long_range = {{1}, {1}, 3};
  return cfg;
}

// ---- The truncated-BPTT reference on trees (no retrieval) ----
//
// The same objective on a branching tree: for every piece j, the chain of its ancestor pieces
// up to K levels above it runs from scratch (the top one reading its tail and recurrent state
// from a plain forward of every piece, detached; each lower one reading the chain's own rows
// and offer with gradient accumulators) and back-propagates piece j's loss alone through it.
// Each chain piece offers only the node the next one hangs from. Independent of the scheduler's
// columns, depths and pushes.
std::vector<double> tree_tbptt_reference(Model<double>& m, const SegmentConfig& cfg, const data::Tree& t) {
  using E = CpuExec<double>;
  TT_CHECK(!cfg.retrieval(), "the tree reference takes no retrieval");
  const data::SegmentPlan plan = data::plan_segments(t, cfg.length);
  const data::Partition& parts = plan.pieces;
  const int P = parts.num_pieces(), L = m.architecture().num_layers();
  std::vector<int32_t> local(plan.split.nodes.size());  // node -> index in its piece
  for (const data::Piece& p : parts.pieces)
    for (size_t i = 0; i < p.nodes.size(); ++i) local[p.nodes[i]] = (int32_t)i;
  // The node of piece k's parent piece that k hangs from, and k's path rows there.
  auto hangs_from = [&](int k) { return local[plan.split.nodes[parts.pieces[k].root_node].parent]; };
  auto tail_rows = [&](int k) {
    std::vector<int32_t> rows;
    for (const data::GatewaySegment& g : parts.pieces[k].gateway)
      if (g.piece == parts.pieces[k].parent_piece)
        for (int32_t r = g.row_begin; r < g.row_end; ++r) rows.push_back(r);
    return rows;
  };
  auto history = [&](int k, const Carry<E>& parent_rows) {
    SegmentHistory<E> h;
    h.segment = plan.segment[k];
    h.tail_rows = tail_rows(k);
    h.k.assign(L, nullptr);
    h.v.assign(L, nullptr);
    h.q.assign(L, nullptr);
    for (int l = 0; l < L; ++l)
      if (!parent_rows[l].kv.empty()) h.k[l] = parent_rows[l].kv[0].k, h.v[l] = parent_rows[l].kv[0].v;
    return h;
  };
  std::vector<double> discard(1 << 16);
  // Recurrent layers of piece k's carry: start from slot `slot` of `from` (null: zeros), send the
  // gradient to `back` (null: detached), offer `nodes` in `own`.
  auto recurrent = [&](Carry<E>& c, const Offers* from, int slot, Offers* back, const std::vector<int32_t>& nodes,
                       Offers& own) {
    own.state.resize(L), own.conv.resize(L), own.d_state.resize(L), own.d_conv.resize(L);
    for (int l = 0; l < L; ++l) {
      const int64_t SE = m.recurrent_state_elems(l), CE = m.conv_context_elems(l), O = (int64_t)nodes.size();
      if (SE == 0) continue;
      LayerCarry<E>& g = c[l];
      g.state_slot = {from ? slot : -1};
      if (from) {
        g.state = from->state[l].data();
        g.conv = from->conv[l].data();
        g.d_state = back ? back->d_state[l].data() : discard.data();
        g.d_conv = back ? back->d_conv[l].data() : discard.data() + SE;
        if (!back) g.state_slot = {0}, g.state += slot * SE, g.conv += slot * CE;
      }
      if (O == 0) continue;
      own.state[l].assign(O * SE, 0.0);
      own.conv[l].assign(O * CE, 0.0);
      own.d_state[l].assign(O * SE, 0.0);
      own.d_conv[l].assign(O * CE, 0.0);
      g.offer_node = nodes;
      g.offer_state = own.state[l].data();
      g.offer_conv = own.conv[l].data();
      g.offer_d_state = own.d_state[l].data();
      g.offer_d_conv = own.d_conv[l].data();
    }
  };
  // The plain forward: every piece offering every node a child piece hangs from.
  std::vector<Activations<E>> plain(P);
  std::vector<Carry<E>> rows(P), carry(P, Carry<E>(L));
  std::vector<std::unique_ptr<SegmentReads<E>>> reads(P);
  std::vector<Offers> offers(P);
  std::vector<std::vector<int32_t>> offered(P);
  for (int k = 0; k < P; ++k)
    for (int c : parts.pieces[k].child_pieces)
      if (std::find(offered[k].begin(), offered[k].end(), hangs_from(c)) == offered[k].end())
        offered[k].push_back(hangs_from(c));
  auto slot_in = [&](int k) {
    const std::vector<int32_t>& o = offered[parts.pieces[k].parent_piece];
    return (int)(std::find(o.begin(), o.end(), hangs_from(k)) - o.begin());
  };
  for (int k = 0; k < P; ++k) {
    const data::PackedBatch b = segment_batch(cfg, plan, k);
    const int par = parts.pieces[k].parent_piece;
    if (par >= 0) {
      reads[k] = std::make_unique<SegmentReads<E>>(m, cfg);
      reads[k]->build(history(k, rows[par]), false);
      reads[k]->append_to(carry[k], 0, b.n_tokens);
    }
    recurrent(carry[k], par >= 0 ? &offers[par] : nullptr, par >= 0 ? slot_in(k) : -1, nullptr, offered[k], offers[k]);
    m.forward(b, 1.0, plain[k], &carry[k]);
    rows[k] = m.export_carry(plain[k]);
  }
  m.zero_grad();
  for (int j = 0; j < P; ++j) {
    std::vector<int> chain = {j};  // j, its parent, ... up to K levels up; then top first
    while ((int)chain.size() <= cfg.tbptt && parts.pieces[chain.back()].parent_piece >= 0)
      chain.push_back(parts.pieces[chain.back()].parent_piece);
    std::reverse(chain.begin(), chain.end());
    const int n = (int)chain.size();
    std::vector<Activations<E>> acts(n);
    std::vector<Carry<E>> own(n), cc(n, Carry<E>(L));
    std::vector<std::vector<double>> acc(n);
    std::vector<std::unique_ptr<SegmentReads<E>>> rd(n);
    std::vector<Offers> off(n);
    for (int x = 0; x < n; ++x) {
      const int s = chain[x], par = parts.pieces[s].parent_piece;
      const data::PackedBatch b = segment_batch(cfg, plan, s);
      if (par >= 0) {
        rd[x] = std::make_unique<SegmentReads<E>>(m, cfg);
        rd[x]->build(history(s, x == 0 ? rows[par] : own[x - 1]), x > 0);
        rd[x]->append_to(cc[x], 0, b.n_tokens);
        rd[x]->set_tail_grads(cc[x], x > 0);
      }
      const std::vector<int32_t> next = x + 1 < n ? std::vector<int32_t>{hangs_from(chain[x + 1])} : std::vector<int32_t>{};
      if (x == 0) recurrent(cc[x], par >= 0 ? &offers[par] : nullptr, par >= 0 ? slot_in(s) : -1, nullptr, next, off[x]);
      else recurrent(cc[x], &off[x - 1], 0, &off[x - 1], next, off[x]);
      m.forward(b, 1.0, acts[x], &cc[x]);
      own[x] = m.export_carry(acts[x]);
      own_grads(m, own[x], b.n_tokens, acc[x]);
    }
    for (int x = n - 1; x >= 0; --x) {
      m.backward(acts[x], x == n - 1 ? nullptr : &own[x], nullptr, /*with_loss=*/x == n - 1);
      if (x > 0) {
        std::vector<double*> dk(L, nullptr), dv(L, nullptr);
        for (int l = 0; l < L; ++l)
          if (!own[x - 1][l].kv.empty()) dk[l] = own[x - 1][l].kv[0].dk, dv[l] = own[x - 1][l].kv[0].dv;
        rd[x]->push_tail_grads(dk, dv);
      }
    }
  }
  return grads_of(m);
}

// On trees (branches inside segments, on a boundary and one token before one), for qwen3 and the
// hybrid: the scheduler's gradient is the tree reference's for K = 0 .. 3, and the depths differ.
TEST(Segments, TruncatedGradientOnTreesEqualsTheTreeReference) {
  const std::vector<int32_t> base = random_tokens(14, 101);
  std::vector<int32_t> b1(base.begin(), base.begin() + 3), b2(base.begin(), base.begin() + 8),
      b3(base.begin(), base.begin() + 7), b4(base.begin(), base.begin() + 11);
  for (int32_t x : random_tokens(9, 102)) b1.push_back(x);
  for (int32_t x : random_tokens(6, 103)) b2.push_back(x);
  for (int32_t x : random_tokens(5, 104)) b3.push_back(x);
  for (int32_t x : random_tokens(4, 105)) b4.push_back(x);
  const data::Tree t = group_tree({base, b1, b2, b3, b4}, {1.0, -0.5, 2.0, 0.7, -1.2});
  for (const ModelConfig& mc : {seg_model(), hybrid_model()}) {
    SCOPED_TRACE(mc.architecture);
    Model<double> m(mc);
    m.init(107);
    std::vector<double> prev;
    for (int K : {0, 1, 2, 3}) {
      SegmentConfig cfg;
      cfg.length = 4;
      cfg.tail = 2;
      cfg.tbptt = K;
      const auto [loss, g] = segmented(m, cfg, t, 1.0);
      EXPECT_LE(rel_max(g, tree_tbptt_reference(m, cfg, t)), 1e-10) << "K=" << K;
      if (K > 0) {
        EXPECT_GT(rel_max(g, prev), 1e-6) << "K=" << K << " against K - 1";
      }
      prev = g;
    }
  }
}

// With no tail the Gated DeltaNet layers alone link the segments, through K boundaries.
TEST(Segments, WithoutATailTheStatesAloneCarryTheGradient) {
  Model<double> m(hybrid_model());
  m.init(91);
  const data::Tree t = group_tree({random_tokens(17, 92)});  // 5 segments of 4
  for (int K : {0, 1, 2}) {
    SegmentConfig cfg;
    cfg.length = 4;
    cfg.tail = 0;
    cfg.tbptt = K;
    SegmentRunStats st;
    const auto [loss, g] = segmented(m, cfg, t, 1.0, &st);
    EXPECT_LE(rel_max(g, tbptt_reference(m, cfg, t)), 1e-10) << "K=" << K;
    int expect_backwards = 0;
    for (int k = 0; k < 5; ++k) expect_backwards += 1 + std::min(K, 4 - k);
    EXPECT_EQ(st.backwards, expect_backwards) << "K=" << K;
  }
}

// (K, model): 0 qwen3, 1 the hybrid (its Gated DeltaNet layers' states and conv tails cross the
// boundaries beside the attention layer's tail; the mixed config's retrieval layer 1 is that one).
class Tbptt : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Tbptt, GradientEqualsTheIndependentReference) {
  const int K = std::get<0>(GetParam()), kind = std::get<1>(GetParam());
  Model<double> m(kind == 0 ? seg_model() : hybrid_model());
  m.init(21);
  const data::Tree t = group_tree({random_tokens(21, 22)});  // 6 segments, the last of one token
  const SegmentConfig cfg = mixed(K);
  SegmentRunStats st;
  const auto [loss, g] = segmented(m, cfg, t, 1.0, &st);
  const std::vector<double> ref = tbptt_reference(m, cfg, t);
  EXPECT_LE(rel_max(g, ref), 1e-10) << "K=" << K;
  EXPECT_EQ(st.pieces, 6);
  EXPECT_EQ(st.forwards, 6);
  // Every segment runs its own column and one per depth below it that has a loss: K + 1 at most.
  int expect_backwards = 0;
  for (int k = 0; k < 6; ++k) expect_backwards += 1 + std::min(K, 5 - k);
  EXPECT_EQ(st.backwards, expect_backwards);
  EXPECT_LE(st.peak_live_tokens, (int64_t)(K + 2) * cfg.length) << "K + 1 segments live, plus the next one";
  // Truncation matters: the gradients of different depths differ.
  if (K > 0) {
    const std::vector<double> shallower = tbptt_reference(m, mixed(K - 1), t);
    EXPECT_GT(rel_max(g, shallower), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Depths, Tbptt, ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(0, 1)));

// Without retrieval and with K >= segments - 1 nothing is truncated: the gradient is the loss's
// own, checked by central differences on sampled entries of every tensor (Richardson-
// extrapolated as in model_test_util.h).
TEST(Segments, UntruncatedGradientMatchesFiniteDifferences) {
 for (const ModelConfig& mc : {seg_model(), hybrid_model()}) {
  SCOPED_TRACE(mc.architecture);
  Model<double> m(mc);
  m.init(31);
  const data::Tree t = group_tree({random_tokens(11, 32)});  // 3 segments of 4
  SegmentConfig cfg;
  cfg.length = 4;
  cfg.tail = 3;
  cfg.tbptt = 2;
  const auto [loss, g] = segmented(m, cfg, t, 1.0);
  const data::SegmentPlan plan = data::plan_segments(t, cfg.length);
  auto objective = [&] {
    m.zero_grad();
    return forward_backward_segmented(m, cfg, plan, 1.0);
  };
  std::mt19937_64 rng(33);
  const double h = 1e-4;
  int checked = 0;
  for (const ParamInfo& p : m.params_info()) {
    for (int s = 0; s < 3; ++s) {
      const int64_t i = p.offset + std::uniform_int_distribution<int64_t>(0, p.numel - 1)(rng);
      double* w = m.params() + i;
      const double w0 = *w;
      auto d = [&](double step) {
        *w = w0 + step;
        const double a = objective();
        *w = w0 - step;
        const double b = objective();
        *w = w0;
        return (a - b) / (2 * step);
      };
      const double fd = (4 * d(h / 2) - d(h)) / 3;
      EXPECT_NEAR(g[i], fd, 1e-6 * std::abs(fd) + 1e-9) << p.name << " entry " << i - p.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
 }
}

// Retrieved pairs change the forward but take no gradient: with no tail, the segmented gradient is
// the sum of each segment's gradient with its prefixes as constants (the K = 0 reference), the
// loss moves when an early segment's tokens change (only retrieval links the segments), and the
// true derivative of the loss (finite differences) differs from that gradient.
TEST(Segments, RetrievedPairsTakeNoGradient) {
  Model<double> m(seg_model());
  m.init(41);
  std::vector<int32_t> tok = random_tokens(12, 42);
  SegmentConfig cfg;
  cfg.length = 4;
  cfg.tail = 0;
  cfg.tbptt = 2;
  cfg.long_range = {{0, 1, 2}, {0}, 3};
  const data::Tree t = group_tree({tok});
  const auto [loss, g] = segmented(m, cfg, t, 1.0);
  SegmentConfig k0 = cfg;
  k0.tbptt = 0;
  EXPECT_LE(rel_max(g, tbptt_reference(m, k0, t)), 1e-12);
  // The last segment's logits depend on the first segment's tokens.
  const data::SegmentPlan plan = data::plan_segments(t, cfg.length);
  const std::vector<std::vector<double>> before = segmented_piece_logits(m, cfg, plan);
  tok[1] = (tok[1] + 1) % 11;
  const data::SegmentPlan changed = data::plan_segments(group_tree({tok}), cfg.length);
  const std::vector<std::vector<double>> after = segmented_piece_logits(m, cfg, changed);
  EXPECT_GT(rel_max(after[2], before[2]), 1e-6) << "retrieval must carry information forward";
  // d loss / d w by differences differs from the gradient somewhere.
  const ParamInfo& wk = m.params_info()[m.table().find("model.layers.0.self_attn.k_proj.weight")];
  double worst = 0;
  for (int64_t j = 0; j < std::min<int64_t>(wk.numel, 8); ++j) {
    double* w = m.params() + wk.offset + j;
    const double w0 = *w, h = 1e-5;
    *w = w0 + h;
    m.zero_grad();
    const double a = forward_backward_segmented(m, cfg, plan, 1.0);
    *w = w0 - h;
    m.zero_grad();
    const double b = forward_backward_segmented(m, cfg, plan, 1.0);
    *w = w0;
    worst = std::max(worst, std::abs((a - b) / (2 * h) - g[wk.offset + j]));
  }
  EXPECT_GT(worst, 1e-6);
}

// The segment operator runs the same in training and inference: generating with segments (prefill
// segment by segment, decode inside the open segment, rolling every S tokens) gives at every
// position exactly the logits of the segmented training forward of the generated sequence: the
// same ops on the same values in the same order, so bitwise on the CPU. Prompts that end inside a
// segment, on its boundary and after one token; samples that diverge (temperature 1).
TEST(Segments, InferenceLogitsEqualTheTrainingForwardBitwise) {
 for (const ModelConfig& mc : {seg_model(), hybrid_model()}) {
  SCOPED_TRACE(mc.architecture);
  Model<double> m(mc);
  m.init(51);
  SegmentConfig whole;
  whole.length = 4;
  whole.tail = 4;
  for (const SegmentConfig& cfg : {mixed(1), whole}) {
    for (int plen : {9, 8, 1}) {
      const std::vector<int32_t> prompt = random_tokens(plen, 52 + plen);
      SamplingOptions opt;
      opt.max_new_tokens = 11;
      opt.temperature = 1.0;
      opt.num_samples = 2;
      opt.seed = 5;
      std::vector<std::vector<double>> got;
      GenerateStats st;
      const std::vector<Completion> out = generate_segmented(m, cfg, {Prompt{"p", prompt}}, opt, &st, &got);
      std::vector<int32_t> seq = prompt;
      for (int32_t t : out[0].samples[0].tokens) seq.push_back(t);
      ASSERT_EQ(seq.size(), (size_t)plen + 11);
      EXPECT_EQ(st.prefill_rows, plen) << "the prompt is prefilled once for both samples";
      const data::SegmentPlan plan = data::plan_segments(group_tree({seq}), cfg.length);
      std::vector<double> train;
      for (const std::vector<double>& x : segmented_piece_logits(m, cfg, plan)) train.insert(train.end(), x.begin(), x.end());
      ASSERT_EQ(got.size(), seq.size() - 1);
      ASSERT_EQ(train.size(), got.size() * 11);
      for (size_t r = 0; r < got.size(); ++r)
        for (int x = 0; x < 11; ++x)
          ASSERT_EQ(got[r][x], train[r * 11 + x]) << "position " << r << " (prompt " << plen << ", S " << cfg.length
                                                  << ", tail " << cfg.tail << ")";
      // The two samples drew differently (temperature 1) and each got its logprobs.
      EXPECT_NE(out[0].samples[0].tokens, out[0].samples[1].tokens);
      EXPECT_EQ(out[0].samples[1].logprobs.size(), 11u);
    }
  }
 }
}

// One node of `tokens` as SegmentedPath::append takes it (its positions are ignored).
data::PackedBatch one_node(const std::vector<int32_t>& tokens) {
  data::PackedBatch b;
  b.n_tokens = (int)tokens.size();
  b.tokens = tokens;
  b.pos.assign(tokens.size(), 0);
  b.subtree_end.assign(tokens.size(), b.n_tokens);
  b.node_start = {0};
  b.node_len = {b.n_tokens};
  b.node_parent = {-1};
  b.tree_start = {0, b.n_tokens};
  return b;
}

// A growing path (SegmentedPath, a policy's context) on a hybrid: rows appended in uneven pieces,
// each after a detour (rows appended, then rewound to a mark: the Gated DeltaNet states and conv
// tails come back from the mark's copy of its slot) give the logits of the segmented training
// forward of the path at each piece's last row, bitwise.
TEST(Segments, AGrowingPathOnAHybridRewindsItsStates) {
  Model<double> m(hybrid_model());
  m.init(71);
  const SegmentConfig cfg = mixed(1);
  const std::vector<int32_t> seq = random_tokens(19, 72);
  std::vector<double> train;  // rows 0 .. 17 (the path's target sources), 11 logits each
  for (const std::vector<double>& x : segmented_piece_logits(m, cfg, data::plan_segments(group_tree({seq}), cfg.length)))
    train.insert(train.end(), x.begin(), x.end());
  ASSERT_EQ(train.size(), 18u * 11);
  SegmentedPath<CpuExec<double>> path(m, cfg, /*ahead=*/6);
  int at = 0, detour = 0;
  for (int n : {3, 5, 1, 4, 5}) {
    const auto mark = path.mark();
    path.append(one_node(random_tokens(2 + detour % 5, 80 + detour)));
    ++detour;
    path.rewind(mark);
    const std::vector<int32_t> piece(seq.begin() + at, seq.begin() + at + n);
    const std::vector<double> got = path.append(one_node(piece));
    at += n;
    ASSERT_EQ(path.depth(), at);
    ASSERT_EQ(got.size(), 11u);
    for (int x = 0; x < 11; ++x) ASSERT_EQ(got[x], train[(size_t)(at - 1) * 11 + x]) << "row " << at - 1;
  }
  EXPECT_EQ(at, 18);
}

// A batch SegmentedPath::append refuses (a token past the vocabulary in its second segment's
// rows) appends nothing: depth() stays, and the path goes on as if it had never been offered.
TEST(Segments, AGrowingPathRefusesABadBatchWhole) {
  Model<double> m(hybrid_model());
  m.init(73);
  const SegmentConfig cfg = mixed(1);  // S = 4
  const std::vector<int32_t> seq = random_tokens(7, 74);
  SegmentedPath<CpuExec<double>> path(m, cfg, /*ahead=*/6), fresh(m, cfg, /*ahead=*/6);
  path.append(one_node({seq[0], seq[1]}));
  std::vector<int32_t> bad(seq.begin() + 2, seq.end());
  bad.back() = (int32_t)m.config().vocab_size;  // rows 2, 3 close segment 0; the bad one is in segment 1
  try {
    path.append(one_node(bad));
    ADD_FAILURE() << "a token outside the vocabulary must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside vocab_size"), std::string::npos) << e.what();
  }
  EXPECT_EQ(path.depth(), 2);
  const std::vector<double> got = path.append(one_node(std::vector<int32_t>(seq.begin() + 2, seq.end())));
  EXPECT_EQ(path.depth(), 7);
  EXPECT_EQ(got, fresh.append(one_node(seq)));
}

// An append that fails anywhere (an allocation failing at each of its allocations in turn: the
// forward's buffers, the segment's roll) never leaves a path that goes on silently wrong: the
// recurrent states are written to a fresh slot and taken only once the forward is through, so
// after a failed forward the path appends as if the batch had never been offered, to the bit; a
// failure after the forward (as a segment rolls) leaves it refusing appends and marks, naming
// what to do, until it is rewound to a mark taken before, which brings it back whole; and no
// failure loses a state slot.
TEST(Segments, AGrowingPathSurvivesAFailedForward) {
  Model<double> m(hybrid_model());
  m.init(75);
  const SegmentConfig cfg = mixed(1);  // S = 4
  const std::vector<int32_t> seq = random_tokens(9, 76);
  const std::vector<int32_t> head(seq.begin(), seq.begin() + 3), piece(seq.begin() + 3, seq.begin() + 6),
      rest(seq.begin() + 6, seq.end());
  SegmentedPath<CpuExec<double>> ref(m, cfg, /*ahead=*/6);
  ref.append(one_node(head));
  const std::vector<double> want_piece = ref.append(one_node(piece)), want_rest = ref.append(one_node(rest));
  int64_t failed = 0, refused = 0;
  for (int64_t n = 0;; ++n) {
    SegmentedPath<CpuExec<double>> path(m, cfg, /*ahead=*/6);
    path.append(one_node(head));
    const auto mark = path.mark();
    // Rows 3 .. 5: close segment 0 (a roll), open segment 1.
    const bool threw = fail_allocation(n, [&] { path.append(one_node(piece)); }).threw;
    if (!threw) {
      ASSERT_EQ(path.depth(), 6);
      ASSERT_EQ(path.append(one_node(rest)), want_rest) << "allocations " << n;
      break;
    }
    ++failed;
    // Rows 3 (the open segment's last) and 4, 5 (the next segment's) come in two forwards.
    ASSERT_TRUE(path.depth() == 3 || path.depth() == 4) << "allocation " << n << ": depth " << path.depth();
    std::vector<double> got;
    try {
      got = path.append(one_node(std::vector<int32_t>(seq.begin() + path.depth(), seq.begin() + 6)));
    } catch (const Error& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find("rewind() to a mark or clear()"), std::string::npos) << e.what();
      path.rewind(mark);
      ASSERT_EQ(path.depth(), 3);
      got = path.append(one_node(piece));
    }
    ASSERT_EQ(got, want_piece) << "allocation " << n << " failed";
    ASSERT_EQ(path.append(one_node(rest)), want_rest) << "allocation " << n << " failed";
    // No state slot leaked: three marks alive (`mark` and two more) and an append (a fresh slot)
    // take all five.
    const auto m1 = path.mark(), m2 = path.mark();
    path.append(one_node({seq[0]}));
  }
  EXPECT_GT(failed, 10);  // the sweep met the forwards' allocations
  EXPECT_GT(refused, 0);  // and some after a forward, as the rows joined their segment
  std::printf("[ faults   ] %lld failed appends, %lld left the path refusing until a rewind\n", (long long)failed,
              (long long)refused);
}

// segment_work's visible pairs count once for every attention layer (as Work::visible_pairs does),
// so retrieval's share is of the attention layers: a hybrid whose attention layers all retrieve
// executes the pairs of a dense model whose layers all do, and one retrieving in half of its
// attention layers those of a dense model retrieving in half of its layers.
TEST(Segments, WorkCountsRetrievalPerAttentionLayer) {
  ModelConfig dense = seg_model();
  dense.num_hidden_layers = 4;
  ModelConfig hybrid = dense;
  testing::make_hybrid(hybrid, "qwen3_5_text");
  hybrid.num_hidden_layers = 4;
  hybrid.layer_types = {"linear_attention", "full_attention", "linear_attention", "full_attention"};
  hybrid.validate();
  const data::Tree t = group_tree({random_tokens(40, 3)});
  auto pairs = [&](const ModelConfig& m, std::vector<int> layers) {
    SegmentConfig c;
    c.length = 8;
    c.tail = 2;
    c.long_range = {layers, {0}, 4};
    c.validate(m);
    return segment_work(c, data::plan_segments(t, c.length), m).visible_pairs;
  };
  EXPECT_GT(pairs(dense, {0, 1, 2, 3}), pairs(dense, {0, 1}));
  EXPECT_EQ(pairs(hybrid, {1, 3}), pairs(dense, {0, 1, 2, 3}));
  EXPECT_EQ(pairs(hybrid, {1}), pairs(dense, {0, 1}));
}

TEST(Segments, ConfigErrorsNameTheKey) {
  const ModelConfig mc = seg_model();
  auto error_of = [&](const SegmentConfig& c) {
    try {
      c.validate(mc);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SegmentConfig c;
  c.length = 8;
  c.tail = 9;
  EXPECT_NE(error_of(c).find("segments.tail: 9"), std::string::npos) << error_of(c);
  c.tail = 4;
  c.tbptt = -1;
  EXPECT_NE(error_of(c).find("segments.tbptt"), std::string::npos);
  c.tbptt = 1;
  c.long_range = {{3}, {0}, 2};
  EXPECT_NE(error_of(c).find("segments.long_range.layers: layer 3"), std::string::npos) << error_of(c);
  c.long_range = {{1, 1}, {0}, 2};
  EXPECT_NE(error_of(c).find("listed twice"), std::string::npos);
  c.long_range = {{1}, {2}, 2};
  EXPECT_NE(error_of(c).find("segments.long_range.heads: KV head 2"), std::string::npos);
  c.long_range = {{}, {}, 2};
  EXPECT_NE(error_of(c).find("segments.long_range.retrieve"), std::string::npos);
  c.long_range = {{1}, {0}, 60};
  EXPECT_NE(error_of(c).find("max_position_embeddings"), std::string::npos) << error_of(c);
  c.long_range = {{1}, {0}, 2};
  EXPECT_EQ(error_of(c), "");
  const ModelConfig hybrid = hybrid_model();  // layers 0 and 2 linear_attention
  EXPECT_NO_THROW(c.validate(hybrid));
  c.long_range = {{0}, {0}, 2};
  try {
    c.validate(hybrid);
    ADD_FAILURE() << "retrieval in a linear_attention layer must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("segments.long_range.layers: layer 0 is linear_attention"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tt::model
