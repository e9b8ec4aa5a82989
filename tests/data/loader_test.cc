// BatchLoader: greedy budget packing, epochs covering every tree once, determinism from the
// seed, a pinned portable permutation, resume from a saved state, the oversize-tree error, and
// oversize trees emitted alone when the trainer partitions them.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "data/reader.h"
#include "data/rng.h"
#include "base/check.h"
#include "tests/data/test_util.h"

namespace tt::data {
namespace {

// A single-node tree whose first token is its index (to identify it in a batch) and whose length
// varies with the index.
Tree chain_tree(int index, int len) {
  std::vector<int32_t> tokens(len, 0);
  tokens[0] = index;
  return testing::sequence_tree("tree" + std::to_string(index), tokens);
}

std::vector<Tree> make_trees(int n) {
  std::vector<Tree> trees;
  for (int i = 0; i < n; ++i) trees.push_back(chain_tree(i, 1 + (i * 7) % 11));
  return trees;
}

// The tree indices of a batch, in packed order.
std::vector<int> ids(const PackedBatch& b) {
  std::vector<int> out;
  for (int t = 0; t < b.num_trees(); ++t) out.push_back(b.tokens[b.tree_start[t]]);
  return out;
}

TEST(Rng, SplitMix64MatchesTheReferenceStream) {
  // First outputs of the reference splitmix64.c for seed 1234567.
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.next(), 6457827717110365317ULL);
  EXPECT_EQ(rng.next(), 3203168211198807973ULL);
  EXPECT_EQ(rng.next(), 9817491932198370423ULL);
  EXPECT_EQ(rng.next(), 4593380528125082431ULL);
  EXPECT_EQ(rng.next(), 16408922859458223821ULL);
  SplitMix64 r2(5);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(r2.below(7), 7u);
}

TEST(Loader, EachEpochCoversEveryTreeOnceWithinTheBudget) {
  const int n = 23;
  const std::vector<Tree> trees = make_trees(n);
  BatchLoader loader(trees, Packing::kTree, 20, 3, true);
  std::vector<std::vector<int>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int> seen;
    do {
      const PackedBatch b = loader.next();
      EXPECT_EQ(loader.state().epoch, e);
      EXPECT_LE(b.n_tokens, 20);
      ASSERT_GE(b.num_trees(), 1);
      const std::vector<int> got = ids(b);
      seen.insert(seen.end(), got.begin(), got.end());
      // Greedy: the next tree of the epoch would not have fit.
      const LoaderState after = loader.state();
      if (after.cursor < n) {
        BatchLoader peek(trees, Packing::kTree, 20, 3, true);
        peek.restore(after);
        const int next_size = peek.next().tree_start[1];
        EXPECT_GT(b.n_tokens + next_size, 20);
      }
    } while (loader.state().cursor < n);
    std::vector<int> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> all(n);
    for (int i = 0; i < n; ++i) all[i] = i;
    EXPECT_EQ(sorted, all) << "epoch " << e;
    epochs.push_back(seen);
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a fresh permutation each epoch
  EXPECT_EQ(loader.state().epoch, 2);
}

TEST(Loader, PermutationIsPinned) {
  // Golden order for seed 1, epoch 0, computed by an independent Python transcription of
  // SplitMix64 and Fisher-Yates: the same on every platform. A change here changes every run's
  // data order.
  std::vector<Tree> trees;
  for (int i = 0; i < 8; ++i) trees.push_back(chain_tree(i, 4));
  BatchLoader loader(trees, Packing::kTree, 4, 1, true);  // one tree per batch
  std::vector<int> order;
  for (int i = 0; i < 8; ++i) order.push_back(ids(loader.next())[0]);
  EXPECT_EQ(order, std::vector<int>({3, 5, 7, 4, 0, 1, 2, 6}));
}

TEST(Loader, SameSeedSameBatchesOtherSeedOtherOrder) {
  BatchLoader a(make_trees(30), Packing::kPerPath, 25, 9, true);
  BatchLoader b(make_trees(30), Packing::kPerPath, 25, 9, true);
  BatchLoader c(make_trees(30), Packing::kPerPath, 25, 10, true);
  std::vector<int> ia, ic;
  for (int i = 0; i < 40; ++i) {
    const PackedBatch x = a.next(), y = b.next(), z = c.next();
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.tgt_src, y.tgt_src);
    for (int t : ids(x)) ia.push_back(t);
    for (int t : ids(z)) ic.push_back(t);
  }
  EXPECT_NE(ia, ic);
}

TEST(Loader, NoShuffleKeepsFileOrder) {
  BatchLoader loader(make_trees(5), Packing::kTree, 1000, 1, false);
  EXPECT_EQ(ids(loader.next()), std::vector<int>({0, 1, 2, 3, 4}));
  EXPECT_EQ(ids(loader.next()), std::vector<int>({0, 1, 2, 3, 4}));  // the next epoch
  EXPECT_EQ(loader.state().epoch, 1);
}

TEST(Loader, RestoredStateContinuesWithTheSameBatches) {
  const std::vector<Tree> trees = make_trees(17);
  for (int stop : {0, 1, 4, 9, 13}) {
    BatchLoader full(trees, Packing::kTree, 18, 42, true);
    for (int i = 0; i < stop; ++i) full.next();
    const LoaderState saved = full.state();
    BatchLoader resumed(trees, Packing::kTree, 18, 42, true);
    resumed.restore(saved);
    for (int i = 0; i < 25; ++i) {
      const PackedBatch x = full.next(), y = resumed.next();
      ASSERT_EQ(x.tokens, y.tokens) << "stop " << stop << " batch " << i;
      ASSERT_EQ(x.tree_start, y.tree_start);
      ASSERT_EQ(full.state().epoch, resumed.state().epoch);
      ASSERT_EQ(full.state().cursor, resumed.state().cursor);
    }
  }
}

TEST(Loader, RejectsATreeLargerThanTheBudgetAndBadStates) {
  std::vector<Tree> trees = make_trees(3);
  trees.push_back(chain_tree(3, 30));
  try {
    BatchLoader(trees, Packing::kTree, 25, 1, true);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'tree3' has 30 tokens under tree packing, which exceeds data.max_tokens_per_batch = 25; "
              "expected every tree to fit one micro-batch");
  }
  EXPECT_THROW(BatchLoader({}, Packing::kTree, 25, 1, true), Error);
  EXPECT_THROW(BatchLoader(make_trees(2), Packing::kTree, 0, 1, true), Error);
  BatchLoader ok(make_trees(4), Packing::kTree, 100, 1, true);
  EXPECT_THROW(ok.restore({0, 5}), Error);
  EXPECT_THROW(ok.restore({-1, 0}), Error);
  ok.restore({3, 4});  // at the end of epoch 3: next() starts epoch 4
  ok.next();
  EXPECT_EQ(ok.state().epoch, 4);
}

// Under per_path packing a tree too large for the budget comes alone (its paths are spread by
// the trainer), unless one of its paths is itself too long.
TEST(Loader, PerPathOversizeTreesComeAloneUnlessAPathIsTooLong) {
  std::vector<Tree> trees = {chain_tree(0, 2), chain_tree(1, 3), chain_tree(2, 2), chain_tree(3, 1)};
  trees.push_back(parse_rollouts_trees(
      R"({"id": "wide", "sequences": [{"tokens": [1, 2, 3, 4]}, {"tokens": [1, 2, 5, 6]}, {"tokens": [1, 7, 8]}]})",
      "f:1", 16)[0]);
  BatchLoader loader(trees, Packing::kPerPath, 6, 1, false, Oversize::kSplitPaths);
  bool seen = false;
  for (int b = 0; b < 5; ++b) {
    const std::vector<int64_t> t = loader.next_indices();
    if (std::find(t.begin(), t.end(), 4) != t.end()) {
      EXPECT_EQ(t, std::vector<int64_t>{4});
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
  try {
    BatchLoader(trees, Packing::kPerPath, 3, 1, false, Oversize::kSplitPaths);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'wide': path 0 has 4 tokens, which exceeds data.max_tokens_per_batch = 3; expected every path "
              "to fit one micro-batch under per_path packing");
  }
}

// Trees 3, 7 and 11 (those below n) exceed the budget of 20 tokens; the others are 1..11 tokens.
std::vector<Tree> trees_with_oversize(int n) {
  std::vector<Tree> trees = make_trees(n);
  for (int i : {3, 7, 11})
    if (i < n) trees[i] = chain_tree(i, 25 + i);
  return trees;
}

TEST(Loader, OversizeTreesComeAloneWhenPartitioning) {
  const int n = 14;
  const std::vector<Tree> trees = trees_with_oversize(n);
  EXPECT_THROW(BatchLoader(trees, Packing::kTree, 20, 5, true), Error);  // kError is the default
  BatchLoader loader(trees, Packing::kTree, 20, 5, true, Oversize::kAlone);
  EXPECT_TRUE(loader.last_tree_indices().empty());
  for (int e = 0; e < 3; ++e) {
    std::vector<int> seen;
    int alone = 0;
    do {
      const PackedBatch b = loader.next();
      const std::vector<int> got = ids(b);
      const std::vector<int64_t>& idx = loader.last_tree_indices();
      ASSERT_EQ(idx.size(), got.size());
      for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(idx[k], got[k]);
      if (b.n_tokens > 20) {
        // Alone, with the statistics of its tree (the trainer's normaliser and metrics).
        ASSERT_EQ(got.size(), 1u);
        const Tree& t = trees[got[0]];
        EXPECT_EQ(b.n_tree, t.n_tree());
        EXPECT_EQ(b.n_flat, t.n_flat());
        EXPECT_EQ(b.n_paths, t.n_paths());
        EXPECT_EQ(b.n_flat_targets, t.n_flat_targets());
        ++alone;
      }
      seen.insert(seen.end(), got.begin(), got.end());
    } while (loader.state().cursor < n);
    EXPECT_EQ(alone, 3) << "epoch " << e;
    std::sort(seen.begin(), seen.end());
    std::vector<int> all(n);
    for (int i = 0; i < n; ++i) all[i] = i;
    EXPECT_EQ(seen, all) << "epoch " << e;
  }
}

TEST(Loader, OversizeTreesKeepTheOrderOfTheEpoch) {
  // Without shuffling the batches follow file order, each oversize tree cutting it.
  BatchLoader loader(trees_with_oversize(6), Packing::kTree, 20, 1, false, Oversize::kAlone);
  // Sizes: 1, 8, 4, 28 (oversize), 7, 3.
  EXPECT_EQ(ids(loader.next()), std::vector<int>({0, 1, 2}));
  EXPECT_EQ(ids(loader.next()), std::vector<int>({3}));
  EXPECT_EQ(loader.last_tree_indices(), std::vector<int64_t>({3}));
  EXPECT_EQ(ids(loader.next()), std::vector<int>({4, 5}));
  EXPECT_EQ(loader.last_tree_indices(), std::vector<int64_t>({4, 5}));
  EXPECT_EQ(ids(loader.next()), std::vector<int>({0, 1, 2}));
  EXPECT_EQ(loader.state().epoch, 1);
}

TEST(Loader, RestoredStateContinuesWithOversizeTrees) {
  const std::vector<Tree> trees = trees_with_oversize(15);
  for (int stop : {0, 2, 5, 11}) {
    BatchLoader full(trees, Packing::kTree, 20, 8, true, Oversize::kAlone);
    for (int i = 0; i < stop; ++i) full.next();
    BatchLoader resumed(trees, Packing::kTree, 20, 8, true, Oversize::kAlone);
    resumed.restore(full.state());
    EXPECT_TRUE(resumed.last_tree_indices().empty());
    for (int i = 0; i < 25; ++i) {
      const PackedBatch x = full.next(), y = resumed.next();
      ASSERT_EQ(x.tokens, y.tokens) << "stop " << stop << " batch " << i;
      ASSERT_EQ(full.last_tree_indices(), resumed.last_tree_indices());
      ASSERT_EQ(full.state().epoch, resumed.state().epoch);
      ASSERT_EQ(full.state().cursor, resumed.state().cursor);
    }
  }
}

}  // namespace
}  // namespace tt::data
