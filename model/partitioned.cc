// Partitioned forward/backward through gateways; see partitioned.h.
#include "model/partitioned.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "ops/check.h"

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
  const int P = plan.num_pieces();
  TT_CHECK(P > 0, "partition of tree '", split_tree.id, "' has no pieces");
  TT_CHECK(plan.schedule.size() == 2 * (size_t)P, "partition of tree '", split_tree.id, "': schedule has ",
           plan.schedule.size(), " steps, expected ", 2 * P);

  std::vector<std::unique_ptr<LivePiece<T>>> live(P);
  double loss = 0;
  int64_t live_tokens = 0;
  PartitionRunStats st;
  st.pieces = P;
  for (const data::Step& step : plan.schedule) {
    const int k = step.piece;
    const data::Piece& piece = plan.pieces[k];
    if (step.phase == data::Phase::kForward) {
      TT_CHECK(!live[k], "partition schedule runs the forward of piece ", k, " twice");
      auto lp = std::make_unique<LivePiece<T>>();
      lp->batch = data::pack_piece(split_tree, plan, k);
      const int N = lp->batch.n_tokens;
      lp->prefixes.assign(L, {});
      for (const data::GatewaySegment& seg : piece.gateway) {
        TT_CHECK(seg.piece < k && live[seg.piece], "piece ", k, " reads a gateway of piece ", seg.piece,
                 ", which is not resident (schedule or plan is inconsistent)");
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
      live_tokens += N;
      st.tokens_processed += N;
      st.peak_live_tokens = std::max(st.peak_live_tokens, live_tokens);
      live[k] = std::move(lp);
    } else {
      TT_CHECK(live[k], "partition schedule runs the backward of piece ", k, " before its forward");
      for (int c : piece.child_pieces)
        TT_CHECK(!live[c], "partition schedule runs the backward of piece ", k, " before that of its child ", c);
      LivePiece<T>& lp = *live[k];
      RelayedKVGrads<T> relayed;
      for (int l = 0; l < L; ++l) {
        relayed.dk.push_back(lp.relay_dk[l].data());
        relayed.dv.push_back(lp.relay_dv[l].data());
      }
      model.backward(lp.acts, &relayed);
      live_tokens -= lp.batch.n_tokens;
      live[k].reset();
    }
  }
  for (int k = 0; k < P; ++k) TT_CHECK(!live[k], "partition schedule leaves piece ", k, " without a backward");
  if (stats) *stats = st;
  return loss;
}

template double forward_backward_partitioned<float>(Model<float>&, const data::Tree&, const data::Partition&, double,
                                                    PartitionRunStats*);
template double forward_backward_partitioned<double>(Model<double>&, const data::Tree&, const data::Partition&, double,
                                                     PartitionRunStats*);

}  // namespace tt::model
