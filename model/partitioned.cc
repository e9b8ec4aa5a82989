// Partitioned forward/backward through gateways, on every backend; see partitioned.h.
#include "model/partitioned.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "base/check.h"

namespace tt::model {

namespace {

// Everything a resident piece holds between its forward and its backward.
template <class E>
struct LivePiece {
  Activations<E> acts;
  // recompute (keeps_rows_only): the piece's batch and its K/V rows, kept for its children and
  // for the training forward its backward runs again; acts are empty until then.
  bool rows_only = false;
  data::PackedBatch batch;
  typename E::Buffer kept;       // per layer (k, v) rows, as attention reads them
  Carry<E> gateway;              // [layer] what the piece reads: one prefix per gateway segment
  Carry<E> rows;                 // [layer] its own rows, dk/dv pointing into relay
  typename E::Buffer relay;      // per layer (dk, dv) accumulators of its rows
  // Recurrent layers: the nodes its child pieces hang from (offers, batch node indices), their end
  // states and conv tails, and the gradients the children add there (per layer, into `offers`).
  std::vector<int32_t> offer_node;
  typename E::Buffer offers, offer_rows;               // Acc: state, d_state, d_conv; Act: conv
  std::vector<typename E::Acc*> d_state, d_conv;       // [layer]
};

// Rows [begin, end) of an exported entry (row_elems elements per row), visible to queries [0, q_end).
template <class KV>
KV slice(const KV& kv, int64_t row_elems, int begin, int end, int q_end) {
  KV s = kv;
  s.k = kv.k + begin * row_elems;
  s.v = kv.v + begin * row_elems;
  s.dk = kv.dk ? kv.dk + begin * row_elems : nullptr;
  s.dv = kv.dv ? kv.dv + begin * row_elems : nullptr;
  s.len = end - begin;
  s.q_begin = 0;
  s.q_end = q_end;
  return s;
}

}  // namespace

PieceOffers::PieceOffers(const data::Tree& split, const data::Partition& plan)
    : plan_(&plan), offers_(plan.pieces.size()), slot_(plan.pieces.size(), -1), listed_by_(plan.pieces.size(), -1) {
  std::vector<int32_t> local(split.nodes.size(), -1);  // each node's index in its piece's batch
  for (const data::Piece& p : plan.pieces)
    for (size_t i = 0; i < p.nodes.size(); ++i) local[p.nodes[i]] = (int32_t)i;
  std::vector<int32_t> slot_of(split.nodes.size(), -1);  // a node's slot among its piece's offers
  for (size_t k = 0; k < plan.pieces.size(); ++k)
    for (int c : plan.pieces[k].child_pieces) {
      const int32_t node = split.nodes[plan.pieces[c].root_node].parent;
      if (slot_of[node] < 0) {
        slot_of[node] = (int32_t)offers_[k].size();
        offers_[k].push_back(local[node]);
      }
      slot_[c] = slot_of[node];
      listed_by_[c] = (int32_t)k;
    }
}

int32_t PieceOffers::parent_slot(int k, const std::string& tree_id) const {
  const int parent = plan_->pieces[k].parent_piece;
  TT_CHECK(parent >= 0 && listed_by_[k] == parent && slot_[k] >= 0, "tree '", tree_id, "': piece ", k,
           " (parent piece ", parent, ") is not among its parent piece's child pieces");
  return slot_[k];
}

template <class E>
double forward_backward_partitioned(Decoder<E>& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats, bool recompute,
                                    const LoadPieceFrames& load_frames) {
  using Acc = typename E::Acc;
  using Act = typename E::Act;
  E& e = model.exec();
  const int L = model.architecture().num_layers();
  std::vector<int64_t> row_elems(L);
  for (int l = 0; l < L; ++l) row_elems[l] = model.carry_row_elems(l);
  // Recurrent layers (Gated DeltaNet): a child piece's root starts from the end state of the node
  // it hangs from and reads that node's conv tail (the parent piece offers both); their gradients
  // come back into the parent's accumulators.
  std::vector<int64_t> state_elems(L), conv_elems(L);
  bool recurrent = false;
  for (int l = 0; l < L; ++l) {
    state_elems[l] = model.recurrent_state_elems(l);
    conv_elems[l] = model.conv_context_elems(l);
    recurrent = recurrent || state_elems[l] > 0;
  }
  const PieceOffers offers(split_tree, plan);
  std::vector<std::unique_ptr<LivePiece<E>>> live(plan.num_pieces());
  double loss = 0;
  LossReader<E>& losses = model.piece_losses();
  losses.clear();
  int rows_only_pieces = 0;
  auto recurrent_gateway = [&](int k, LivePiece<E>& lp) {
    const data::Piece& piece = plan.pieces[k];
    lp.offer_node = offers.offers(k);
    const int64_t O = (int64_t)lp.offer_node.size();
    int64_t acc = 0, act = 0;
    for (int l = 0; l < L; ++l) {
      acc += O * (2 * state_elems[l] + conv_elems[l]);
      act += O * conv_elems[l];
    }
    e.ensure(lp.offers, sizeof(Acc) * (size_t)acc);
    e.ensure(lp.offer_rows, sizeof(typename E::Act) * (size_t)act);
    e.zero(lp.offers.data(), sizeof(Acc) * (size_t)acc);
    Acc* next = reinterpret_cast<Acc*>(lp.offers.data());
    auto* next_row = reinterpret_cast<typename E::Act*>(lp.offer_rows.data());
    lp.d_state.assign(L, nullptr);
    lp.d_conv.assign(L, nullptr);
    const int32_t slot = piece.parent_piece >= 0 ? offers.parent_slot(k, split_tree.id) : -1;  // of its parent's offers
    for (int l = 0; l < L; ++l) {
      if (state_elems[l] == 0) continue;
      LayerCarry<E>& g = lp.gateway[l];
      g.state_slot = {-1};
      if (piece.parent_piece >= 0) {
        const LivePiece<E>& par = *live[piece.parent_piece];
        g.state_slot = {slot};
        g.state = par.gateway[l].offer_state;
        g.conv = par.gateway[l].offer_conv;
        g.d_state = par.d_state[l];
        g.d_conv = par.d_conv[l];
      }
      if (O == 0) continue;
      g.offer_node = lp.offer_node;
      g.offer_state = next;
      lp.d_state[l] = next + O * state_elems[l];
      lp.d_conv[l] = next + 2 * O * state_elems[l];
      next += O * (2 * state_elems[l] + conv_elems[l]);
      g.offer_d_state = lp.d_state[l];
      g.offer_d_conv = lp.d_conv[l];
      g.offer_conv = next_row;
      next_row += O * conv_elems[l];
    }
  };
  auto forward = [&](int k) {
    const data::Piece& piece = plan.pieces[k];
    TT_CHECK((int)piece.gateway.size() <= E::kMaxExternalKV, "partition of tree '", split_tree.id, "': piece ", k,
             " has a gateway of ", piece.gateway.size(), " segments; the ", E::kName, " attention reads at most ",
             E::kMaxExternalKV, " external prefixes (use a larger partition.capacity_tokens)");
    auto lp = std::make_unique<LivePiece<E>>();
    data::PackedBatch batch = data::pack_piece(split_tree, plan, k);
    if (!batch.frames.empty()) {
      TT_CHECK(load_frames, "partition of tree '", split_tree.id, "': piece ", k, " shows frames (",
               batch.frames.size(), ") but no frame loader was given");
      load_frames(batch);
    }
    const int N = batch.n_tokens;
    lp->gateway.assign(L, {});
    for (const data::GatewaySegment& seg : piece.gateway) {
      const LivePiece<E>& src = *live[seg.piece];
      for (int l = 0; l < L; ++l)
        for (const typename E::KV& kv : src.rows[l].kv)
          lp->gateway[l].kv.push_back(slice(kv, row_elems[l], seg.row_begin, seg.row_end, N));
    }
    if (recurrent) recurrent_gateway(k, *lp);
    lp->rows_only = N > 0 && keeps_rows_only(plan, k, recompute);
    if (lp->rows_only) {  // a no-grad forward that stores the rows its children read
      int64_t total = 0;
      for (int l = 0; l < L; ++l) total += 2 * (int64_t)N * row_elems[l];
      e.ensure(lp->kept, sizeof(Act) * (size_t)total);
      CacheWrite<E> w;
      w.k.assign(L, nullptr);
      w.v.assign(L, nullptr);
      w.rows.resize(N);
      std::iota(w.rows.begin(), w.rows.end(), 0);
      lp->rows.assign(L, {});
      Act* next = reinterpret_cast<Act*>(lp->kept.data());
      for (int l = 0; l < L; ++l) {
        if (row_elems[l] == 0) continue;
        w.k[l] = next;
        w.v[l] = next + (int64_t)N * row_elems[l];
        typename E::KV kv;
        kv.k = w.k[l];
        kv.v = w.v[l];
        kv.len = N;
        lp->rows[l].kv.assign(1, kv);
        next += 2 * (int64_t)N * row_elems[l];
      }
      InferRequest req;
      req.loss = false;
      req.rows = InferRequest::Rows::kNone;
      model.infer(batch, req, &lp->gateway, &w);
      lp->batch = std::move(batch);  // for the training forward its backward runs again
    } else {
      model.forward(batch, loss_scale, lp->acts, &lp->gateway);
    }
    if (lp->rows_only) ++rows_only_pieces;
    if (N > 0 && !piece.child_pieces.empty()) {  // rows and relay accumulators only where children read them
      if (!lp->rows_only) lp->rows = model.export_carry(lp->acts);
      int64_t total = 0;
      for (int l = 0; l < L; ++l) total += 2 * (int64_t)N * row_elems[l];
      e.ensure(lp->relay, sizeof(Acc) * (size_t)total);
      e.zero(lp->relay.data(), sizeof(Acc) * (size_t)total);
      Acc* next = reinterpret_cast<Acc*>(lp->relay.data());
      for (int l = 0; l < L; ++l) {
        for (typename E::KV& kv : lp->rows[l].kv) {
          kv.dk = next;
          kv.dv = next + (int64_t)N * row_elems[l];
        }
        next += 2 * (int64_t)N * row_elems[l];
      }
    } else {
      lp->rows.assign(L, {});
    }
    live[k] = std::move(lp);
  };
  auto backward = [&](int k) {
    LivePiece<E>& lp = *live[k];
    if (lp.rows_only) {
      // The training forward again, on the same batch and gateway: the same rows as the kept ones
      // (the children read those), whose gradients the relay accumulators hold.
      model.forward(lp.batch, loss_scale, lp.acts, &lp.gateway);
      Carry<E> rows = model.export_carry(lp.acts);
      for (int l = 0; l < L; ++l) {
        TT_CHECK(rows[l].kv.size() == lp.rows[l].kv.size(), "partition of tree '", split_tree.id, "': piece ", k,
                 " exports ", rows[l].kv.size(), " K/V entries at layer ", l, " on its second forward, ",
                 lp.rows[l].kv.size(), " on its first");
        for (size_t i = 0; i < rows[l].kv.size(); ++i) {
          rows[l].kv[i].dk = lp.rows[l].kv[i].dk;
          rows[l].kv[i].dv = lp.rows[l].kv[i].dv;
        }
      }
      model.backward(lp.acts, &rows);
    } else {
      model.backward(lp.acts, &lp.rows);
    }
    losses.add(model, lp.acts);  // read once, after the schedule: no wait between pieces
    live[k].reset();
  };
  PartitionRunStats st = walk_partition_schedule(plan, split_tree.id, forward, backward, recompute);
  const Losses l = losses.total(e);
  loss = l.loss;
  st.nll_sum = l.nll_sum;
  st.pieces_recomputed = rows_only_pieces;
  if (stats) *stats = st;
  return loss;
}

template double forward_backward_partitioned<CpuExec<float>>(Decoder<CpuExec<float>>&, const data::Tree&,
                                                             const data::Partition&, double, PartitionRunStats*,
                                                             bool, const LoadPieceFrames&);
template double forward_backward_partitioned<CpuExec<double>>(Decoder<CpuExec<double>>&, const data::Tree&,
                                                              const data::Partition&, double, PartitionRunStats*,
                                                              bool, const LoadPieceFrames&);
template double forward_backward_partitioned<CudaExec>(Decoder<CudaExec>&, const data::Tree&, const data::Partition&,
                                                       double, PartitionRunStats*, bool, const LoadPieceFrames&);

}  // namespace tt::model
