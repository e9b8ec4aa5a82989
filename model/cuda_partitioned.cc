// Partitioned forward/backward through gateways on the GPU; see cuda_partitioned.h and
// partitioned.h (the CPU version this mirrors step by step).
#include "model/cuda_partitioned.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::model {

namespace {

// Everything a resident piece holds between its forward and its backward.
struct LivePiece {
  CudaActivations acts;
  CudaLayerPrefixes prefixes;        // [layer][gateway segment]
  cuda::DeviceBuffer<float> relay;  // (L, 2, N, NKV, HS) fp32: dk then dv per layer, from child gateways
  int n = 0;
  float* relay_dk(int l, int64_t KD) { return relay.data() + (2 * (int64_t)l) * n * KD; }
  float* relay_dv(int l, int64_t KD) { return relay.data() + (2 * (int64_t)l + 1) * n * KD; }
};

}  // namespace

double forward_backward_partitioned(CudaModel& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats) {
  const ModelConfig& cfg = model.config();
  const int L = (int)cfg.num_hidden_layers;
  const int64_t KD = cfg.num_key_value_heads * cfg.head_dim;
  std::vector<std::unique_ptr<LivePiece>> live(plan.num_pieces());
  double loss = 0;
  auto forward = [&](int k) {
    const data::Piece& piece = plan.pieces[k];
    TT_CHECK((int)piece.gateway.size() <= cuda::kMaxExternalKV, "partition of tree '", split_tree.id, "': piece ", k,
             " has a gateway of ", piece.gateway.size(), " segments; the CUDA attention reads at most ",
             cuda::kMaxExternalKV, " external prefixes (use a larger partition.capacity_tokens)");
    auto lp = std::make_unique<LivePiece>();
    const data::PackedBatch batch = data::pack_piece(split_tree, plan, k);
    const int N = batch.n_tokens;
    lp->n = N;
    lp->prefixes.assign(L, {});
    for (const data::GatewaySegment& seg : piece.gateway) {
      LivePiece& src = *live[seg.piece];
      for (int l = 0; l < L; ++l) {
        cuda::ExternalKV e;
        e.k = model.layer_k(src.acts, l) + (int64_t)seg.row_begin * KD;
        e.v = model.layer_v(src.acts, l) + (int64_t)seg.row_begin * KD;
        e.dk = src.relay_dk(l, KD) + (int64_t)seg.row_begin * KD;
        e.dv = src.relay_dv(l, KD) + (int64_t)seg.row_begin * KD;
        e.len = seg.row_end - seg.row_begin;
        e.q_begin = 0;
        e.q_end = N;
        lp->prefixes[l].push_back(e);
      }
    }
    lp->relay = cuda::DeviceBuffer<float>((size_t)L * 2 * N * KD, &model.allocator());
    lp->relay.fill_bytes(0, model.stream());
    model.forward(batch, loss_scale, lp->acts, &lp->prefixes);
    live[k] = std::move(lp);
  };
  auto backward = [&](int k) {
    LivePiece& lp = *live[k];
    CudaRelayedKVGrads relayed;
    for (int l = 0; l < L; ++l) {
      relayed.dk.push_back(lp.relay_dk(l, KD));
      relayed.dv.push_back(lp.relay_dv(l, KD));
    }
    model.backward(lp.acts, &relayed);
    loss += model.loss(lp.acts);
    live[k].reset();
  };
  const PartitionRunStats st = walk_partition_schedule(plan, split_tree.id, forward, backward);
  if (stats) *stats = st;
  return loss;
}

}  // namespace tt::model
