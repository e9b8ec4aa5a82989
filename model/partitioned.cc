// Partitioned forward/backward through gateways, on every backend; see partitioned.h.
#include "model/partitioned.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "base/check.h"

namespace tt::model {

namespace {

// Everything a resident piece holds between its forward and its backward.
template <class E>
struct LivePiece {
  Activations<E> acts;
  Carry<E> gateway;              // [layer] what the piece reads: one prefix per gateway segment
  Carry<E> rows;                 // [layer] its own rows, dk/dv pointing into relay
  typename E::Buffer relay;      // per layer (dk, dv) accumulators of its rows
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

template <class E>
double forward_backward_partitioned(Decoder<E>& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats) {
  using Acc = typename E::Acc;
  E& e = model.exec();
  const int L = model.architecture().num_layers();
  std::vector<int64_t> row_elems(L);
  for (int l = 0; l < L; ++l) row_elems[l] = model.carry_row_elems(l);
  std::vector<std::unique_ptr<LivePiece<E>>> live(plan.num_pieces());
  double loss = 0, nll = 0;
  auto forward = [&](int k) {
    const data::Piece& piece = plan.pieces[k];
    TT_CHECK((int)piece.gateway.size() <= E::kMaxExternalKV, "partition of tree '", split_tree.id, "': piece ", k,
             " has a gateway of ", piece.gateway.size(), " segments; the ", E::kName, " attention reads at most ",
             E::kMaxExternalKV, " external prefixes (use a larger partition.capacity_tokens)");
    auto lp = std::make_unique<LivePiece<E>>();
    const data::PackedBatch batch = data::pack_piece(split_tree, plan, k);
    const int N = batch.n_tokens;
    lp->gateway.assign(L, {});
    for (const data::GatewaySegment& seg : piece.gateway) {
      const LivePiece<E>& src = *live[seg.piece];
      for (int l = 0; l < L; ++l)
        for (const typename E::KV& kv : src.rows[l].kv)
          lp->gateway[l].kv.push_back(slice(kv, row_elems[l], seg.row_begin, seg.row_end, N));
    }
    model.forward(batch, loss_scale, lp->acts, &lp->gateway);
    if (N > 0) {
      lp->rows = model.export_carry(lp->acts);
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
    model.backward(lp.acts, &lp.rows);
    const Losses l = model.losses(lp.acts);
    loss += l.loss;
    nll += l.nll_sum;
    live[k].reset();
  };
  PartitionRunStats st = walk_partition_schedule(plan, split_tree.id, forward, backward);
  st.nll_sum = nll;
  if (stats) *stats = st;
  return loss;
}

template double forward_backward_partitioned<CpuExec<float>>(Decoder<CpuExec<float>>&, const data::Tree&,
                                                             const data::Partition&, double, PartitionRunStats*);
template double forward_backward_partitioned<CpuExec<double>>(Decoder<CpuExec<double>>&, const data::Tree&,
                                                              const data::Partition&, double, PartitionRunStats*);
template double forward_backward_partitioned<CudaExec>(Decoder<CudaExec>&, const data::Tree&, const data::Partition&,
                                                       double, PartitionRunStats*);

}  // namespace tt::model
