// Seeded, resumable batch loader (see loader.h).
//
// The order of epoch e is a Fisher-Yates shuffle driven by SplitMix64 seeded from (seed, e), so it
// depends on nothing but those two numbers: restore() rebuilds it and a resumed loader continues
// with exactly the batches of an uninterrupted one.
#include "data/loader.h"

#include <limits>
#include <numeric>
#include <utility>

#include "data/rng.h"
#include "base/check.h"

namespace tt::data {

void check_fits(const Tree& tree, Packing packing, int64_t max_tokens, bool split_paths) {
  if (split_paths) {
    TT_CHECK(packing == Packing::kPerPath, "split paths need per_path packing");
    path_ranges(tree, max_tokens);  // throws for a path longer than the budget
    return;
  }
  const int64_t size = packed_size(tree, packing);
  if (size > max_tokens)
    throw Error(str("tree '", tree.id, "' has ", size, " tokens under ", packing == Packing::kTree ? "tree" : "per_path",
                    " packing, which exceeds data.max_tokens_per_batch = ", max_tokens,
                    "; expected every tree to fit one micro-batch"));
}

BatchLoader::BatchLoader(std::vector<Tree> trees, Packing packing, int64_t max_tokens, uint64_t seed, bool shuffle,
                         Oversize oversize)
    : trees_(std::move(trees)), packing_(packing), max_tokens_(max_tokens), seed_(seed), shuffle_(shuffle) {
  if (trees_.empty()) throw Error("data: no trees to load, expected at least one");
  if (max_tokens_ < 1 || max_tokens_ > std::numeric_limits<int32_t>::max())
    throw Error(str("data.max_tokens_per_batch = ", max_tokens_, ", expected a value in [1, 2^31)"));
  sizes_.reserve(trees_.size());
  for (const Tree& t : trees_) {
    t.validate();
    const int64_t size = packed_size(t, packing_);
    if (size > max_tokens_ && oversize != Oversize::kAlone)
      check_fits(t, packing_, max_tokens_, oversize == Oversize::kSplitPaths);
    sizes_.push_back(size);
  }
  start_epoch();
}

void BatchLoader::start_epoch() {
  order_.resize(trees_.size());
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  SplitMix64 rng(mix64(seed_) ^ mix64(0x5eed0000ULL + (uint64_t)state_.epoch));
  for (size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[rng.below(i + 1)]);
}

PackedBatch BatchLoader::next() {
  next_indices();
  std::vector<const Tree*> batch;
  for (int64_t t : last_) batch.push_back(&trees_[t]);
  return pack(batch, packing_);
}

std::vector<int64_t> BatchLoader::next_indices() {
  const int64_t n = (int64_t)trees_.size();
  if (state_.cursor >= n) {
    ++state_.epoch;
    state_.cursor = 0;
    start_epoch();
  }
  // A tree larger than the budget (Oversize::kAlone) closes the batch before it (it does not fit)
  // and after it (used > max_tokens), so it is packed alone.
  last_.clear();
  int64_t used = 0;
  while (state_.cursor < n) {
    const int64_t t = order_[state_.cursor];
    if (!last_.empty() && used + sizes_[t] > max_tokens_) break;
    last_.push_back(t);
    used += sizes_[t];
    ++state_.cursor;
  }
  return last_;
}

void BatchLoader::restore(const LoaderState& s) {
  if (s.epoch < 0 || s.cursor < 0 || s.cursor > (int64_t)trees_.size())
    throw Error(str("loader state (epoch ", s.epoch, ", cursor ", s.cursor,
                    ") does not fit this data, expected epoch >= 0 and cursor in [0, ", trees_.size(), "]"));
  state_ = s;
  last_.clear();
  start_epoch();
}

}  // namespace tt::data
