// Batches for training: trees in a seeded order, greedily packed up to a token budget.
//
// The loader walks the trees of one epoch in a permutation drawn from (seed, epoch) (or file
// order when shuffle is off) and packs consecutive trees into a micro-batch until the next one
// would exceed max_tokens (a micro-batch holds at least one tree, and never trees of two epochs:
// the last batch of an epoch may be short, and the next call starts the next epoch). The
// permutation comes from a fixed, portable generator (data/rng.h), so it is the same on every
// platform. Its position (epoch, cursor) is saved in checkpoints, so a resumed run sees exactly
// the batches an uninterrupted run would.
//
// A tree larger than max_tokens is an error (Oversize::kError), or, when the trainer partitions
// trees (Oversize::kAlone, partition.capacity_tokens > 0), a micro-batch of its own: the greedy
// rule already closes a batch before a tree that does not fit and after one that overflows it,
// so such a tree never shares a batch and the order of the epoch is unchanged. Under per_path
// packing (Oversize::kSplitPaths) a tree whose paths do not fit together comes alone the same way,
// and the trainer spreads its paths over micro-batches of one step (data::path_ranges); each path
// must fit the budget.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packing.h"
#include "data/tree.h"

namespace tt::data {

// What the loader does with a tree whose packed size exceeds max_tokens.
enum class Oversize {
  kError,  // the constructor throws tt::Error naming the tree
  kAlone,  // the tree is emitted alone, as its own micro-batch (to be partitioned by the trainer)
  // per_path packing: the tree is emitted alone, its paths to be spread over micro-batches by the
  // trainer; the constructor throws tt::Error naming a path longer than max_tokens.
  kSplitPaths,
};

// Throws tt::Error naming the tree when it cannot run within max_tokens: with split_paths
// (per_path packing, its paths spread over micro-batches) a path longer than max_tokens, else
// the tree's packed size over max_tokens. The loader's check for Oversize::kError and kSplitPaths.
void check_fits(const Tree& tree, Packing packing, int64_t max_tokens, bool split_paths);

struct LoaderState {
  int64_t epoch = 0;
  int64_t cursor = 0;  // index into the epoch's order of the next tree
};

class BatchLoader {
 public:
  // Throws tt::Error naming the tree id when a single tree exceeds max_tokens under `packing`
  // and oversize is kError (and for no trees, a budget outside [1, 2^31), or a malformed tree).
  BatchLoader(std::vector<Tree> trees, Packing packing, int64_t max_tokens, uint64_t seed, bool shuffle,
              Oversize oversize = Oversize::kError);

  PackedBatch next();
  // The trees of the next batch, in packed order, without packing them (next() packs these).
  // Data parallelism draws a step's trees this way and deals them to ranks (distributed/shard.h).
  std::vector<int64_t> next_indices();
  // Indices into trees() of the trees of the last next() batch, in packed order (empty before the
  // first call and after restore()). A batch holding one tree that exceeds max_tokens has exactly one index.
  const std::vector<int64_t>& last_tree_indices() const { return last_; }
  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);  // throws tt::Error unless epoch >= 0, cursor in [0, #trees]
  const std::vector<Tree>& trees() const { return trees_; }

 private:
  void start_epoch();
  std::vector<Tree> trees_;
  Packing packing_;
  int64_t max_tokens_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<int64_t> sizes_;  // (#trees) packed_size of each tree under packing_
  std::vector<int64_t> order_;  // (#trees) this epoch's tree order
  std::vector<int64_t> last_;   // trees of the last batch
  LoaderState state_;
};

}  // namespace tt::data
