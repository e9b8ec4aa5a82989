// Data-parallel sharding of an optimizer step: which rank trains which of the step's trees.
//
// Every rank draws the step's micro-batches from the same seeded loader (so every rank knows the
// step's trees and the loader position is the same everywhere, which makes rank 0's checkpoint
// valid for all). The trees of the step are then dealt to ranks by estimated compute, cost(tree)
// = the executed FLOPs of a training step on it (tree_cost: the layer kinds' FLOP API on the
// tree's packed work, its tokens, visible attention pairs, target rows and media).
// The deal is LPT: trees by decreasing cost (ties: earlier in the step first) each go to the rank
// with the least load so far (ties: the lowest rank), within 4/3 of the best possible makespan.
// It depends only on the step's trees, hence only on the seed: every rank computes the same deal.
// A rank keeps its trees in step order and packs them greedily into micro-batches under
// data.max_tokens_per_batch (the loader's rule; a tree larger than the budget goes alone).
//
// Trees are independent in the loss (a tree never attends to another), so this changes only the
// fp32 summation order of the gradients, never what is summed.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packing.h"
#include "data/tree.h"
#include "model/decoder.h"
#include "model/flops.h"

namespace tt::distributed {

// The tree's work under the packing, equal to model::Work::of its packed batch (media included:
// the frames the tower runs on, the state rows).
model::Work tree_work(const data::Tree& tree, data::Packing packing);

// Executed FLOPs of a training step (forward + backward) on the tree.
double tree_cost(const model::Architecture& arch, const data::Tree& tree, data::Packing packing);

struct Shards {
  std::vector<std::vector<int64_t>> items;  // (world) indices into the cost list, ascending
  std::vector<double> load;                 // (world) summed cost
  // max load / mean load: 1 is a perfect balance, W means one rank does everything.
  double imbalance() const;
};
Shards balance(const std::vector<double>& cost, int world);

// Consecutive groups of items whose sizes sum to at most max_tokens (a group holds at least one
// item; an item larger than max_tokens is a group of its own).
std::vector<std::vector<int64_t>> pack_greedy(const std::vector<int64_t>& sizes, int64_t max_tokens);

}  // namespace tt::distributed
