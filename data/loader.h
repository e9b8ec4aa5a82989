// Batches for training: trees in a seeded order, greedily packed up to a token budget.
//
// The loader walks the trees of one epoch in a permutation drawn from (seed, epoch) (or file
// order when shuffle is off) and packs consecutive trees into a micro-batch until the next one
// would exceed max_tokens. Its position (epoch, cursor) is saved in checkpoints, so a resumed run
// sees exactly the batches an uninterrupted run would.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packing.h"
#include "data/tree.h"

namespace tt::data {

struct LoaderState {
  int64_t epoch = 0;
  int64_t cursor = 0;  // index into the epoch's order of the next tree
};

class BatchLoader {
 public:
  // Throws tt::Error naming the tree id when a single tree exceeds max_tokens under `packing`.
  BatchLoader(std::vector<Tree> trees, Packing packing, int64_t max_tokens, uint64_t seed, bool shuffle);

  PackedBatch next();
  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);
  const std::vector<Tree>& trees() const { return trees_; }

 private:
  void start_epoch();
  std::vector<Tree> trees_;
  Packing packing_;
  int64_t max_tokens_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<int64_t> order_;
  LoaderState state_;
};

}  // namespace tt::data
