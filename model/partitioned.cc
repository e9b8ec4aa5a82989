// Partitioned forward/backward through gateways; see partitioned.h.
#include "model/partitioned.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "base/check.h"

namespace tt::model {

namespace {

// Everything a resident piece holds between its forward and its backward.
template <class T>
struct LivePiece {
  data::PackedBatch batch;
  Activations<T> acts;
  LayerPrefixes<T> prefixes;              // [layer][gateway segment]
  std::vector<std::vector<T>> relay_dk;   // [layer] (N, NKV, HS): gradients from child gateways
  std::vector<std::vector<T>> relay_dv;
};

}  // namespace

template <class T>
double forward_backward_partitioned(Model<T>& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats) {
  const ModelConfig& cfg = model.config();
  const int L = (int)cfg.num_hidden_layers;
  const int64_t KD = cfg.num_key_value_heads * cfg.head_dim;
  std::vector<std::unique_ptr<LivePiece<T>>> live(plan.num_pieces());
  double loss = 0;
  auto forward = [&](int k) {
    auto lp = std::make_unique<LivePiece<T>>();
    lp->batch = data::pack_piece(split_tree, plan, k);
    const int N = lp->batch.n_tokens;
    lp->prefixes.assign(L, {});
    for (const data::GatewaySegment& seg : plan.pieces[k].gateway) {
      LivePiece<T>& src = *live[seg.piece];
      for (int l = 0; l < L; ++l) {
        cpu::ExternalKV<T> e;
        e.k = model.layer_k(src.acts, l) + (int64_t)seg.row_begin * KD;
        e.v = model.layer_v(src.acts, l) + (int64_t)seg.row_begin * KD;
        e.dk = src.relay_dk[l].data() + (int64_t)seg.row_begin * KD;
        e.dv = src.relay_dv[l].data() + (int64_t)seg.row_begin * KD;
        e.len = seg.row_end - seg.row_begin;
        e.q_begin = 0;
        e.q_end = N;
        lp->prefixes[l].push_back(e);
      }
    }
    lp->relay_dk.assign(L, std::vector<T>((size_t)N * KD, T(0)));
    lp->relay_dv.assign(L, std::vector<T>((size_t)N * KD, T(0)));
    loss += model.forward(lp->batch, loss_scale, lp->acts, &lp->prefixes);
    live[k] = std::move(lp);
  };
  auto backward = [&](int k) {
    LivePiece<T>& lp = *live[k];
    RelayedKVGrads<T> relayed;
    for (int l = 0; l < L; ++l) {
      relayed.dk.push_back(lp.relay_dk[l].data());
      relayed.dv.push_back(lp.relay_dv[l].data());
    }
    model.backward(lp.acts, &relayed);
    live[k].reset();
  };
  const PartitionRunStats st = walk_partition_schedule(plan, split_tree.id, forward, backward);
  if (stats) *stats = st;
  return loss;
}

template double forward_backward_partitioned<float>(Model<float>&, const data::Tree&, const data::Partition&, double,
                                                    PartitionRunStats*);
template double forward_backward_partitioned<double>(Model<double>&, const data::Tree&, const data::Partition&, double,
                                                     PartitionRunStats*);

}  // namespace tt::model
