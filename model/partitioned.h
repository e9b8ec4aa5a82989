// Partitioned training of one tree: its pieces (data/partition.h) run through the model one at a
// time, ancestors crossing each cut as differentiable gateways.
//
// Schedule (Partition::schedule): forward a piece with its gateway as external KV prefixes (one
// per gateway segment, per layer, pointing straight at the resident ancestor pieces' K/V: nothing
// is recomputed or copied); then its child pieces, recursively; then the piece's backward. Each
// piece owns per-layer K/V gradient accumulators (N_piece, NKV, HS); a child's backward adds (+=)
// its gateway gradients into the accumulators of the ancestor pieces its segments point at, and a
// piece's backward adds its own accumulators to the gradient of its K/V (RelayedKVGrads). Since
// every descendant finishes before its ancestor's backward, those gradients are complete when
// they are used. Activations live only for the pieces on the current root-to-piece chain.
//
// Exactness: the loss, parameter gradients and hence the update equal unpartitioned training of
// the tree (tests/model/partitioned_test.cc), because every query sees the same keys (gateway
// rows = the ancestor chain) and every K/V row receives the gradients of all its readers.
#pragma once

#include <cstdint>

#include "data/partition.h"
#include "data/tree.h"
#include "model/model.h"

namespace tt::model {

struct PartitionRunStats {
  int64_t tokens_processed = 0;   // sum of piece tokens (== n_tree: no recomputation)
  int64_t peak_live_tokens = 0;   // most tokens whose activations were resident at once
  int pieces = 0;
};

// Forward and backward of `split_tree` (data::split_long_nodes output) through `plan`
// (data::plan_partition of it): grads() += d(loss)/d(params); returns loss_scale * sum w * ce.
template <class T>
double forward_backward_partitioned(Model<T>& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats = nullptr);

}  // namespace tt::model
