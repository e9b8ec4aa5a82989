// The attention benchmark's host-side layout statistics (trainer/attention_bench.h): tile
// occupancy, and the fine-grained workloads' shapes (fixed by their seeds).
#include "trainer/attention_bench.h"

#include <gtest/gtest.h>

namespace tt::trainer {
namespace {

TEST(AttentionBench, TileOccupancyCountsTouchedTiles) {
  // Causal 256 with 128 x 128 tiles: key block 0 touches query tiles 0 and 1, key block 1 only
  // tile 1: three tiles of 16384 pairs for 256 * 257 / 2 visible pairs.
  const data::PackedBatch c = pack_one(causal_tree(256));
  EXPECT_DOUBLE_EQ(tile_occupancy(c, 128, 128), 32896.0 / (3 * 16384.0));
  // One-token tiles see exactly the visible pairs.
  EXPECT_DOUBLE_EQ(tile_occupancy(c, 1, 1), 1.0);
  // Laid out in listed order a comb's leaves sit between its trunk nodes and hide from later
  // queries: less than half of a touched tile is visible (a causal run of its length: ~0.99).
  const data::PackedBatch listed = pack_one(comb_short_tree(), data::ChildOrder::kListed);
  EXPECT_EQ(listed.n_tokens, 1024 + 200 * (24 + 40));
  EXPECT_LT(tile_occupancy(listed, 128, 128), 0.5);
  EXPECT_GT(tile_occupancy(pack_one(causal_tree(listed.n_tokens)), 128, 128), 0.99);
}

TEST(AttentionBench, LargestFirstLayoutFillsTheTilesOfFineGrainedTrees) {
  // What training packs (data::Tree::preorder, larger subtrees first): the trunk is one causal
  // run and the leaves follow it, so touched tiles are more than 9/10 visible; the same pairs.
  for (const data::Tree& t : {comb_short_tree(), trunk_tree()}) {
    const data::PackedBatch largest = pack_one(t), listed = pack_one(t, data::ChildOrder::kListed);
    EXPECT_EQ(largest.visible_pairs, listed.visible_pairs);
    EXPECT_LT(tile_occupancy(listed, 128, 128), 0.6);
    EXPECT_GT(tile_occupancy(largest, 128, 128), 0.9);
    EXPECT_GT(tile_occupancy(largest, 64, 128), 0.9);
  }
}

TEST(AttentionBench, TrunkWorkloadIsFixedBySeed) {
  const data::PackedBatch a = pack_one(trunk_tree()), b = pack_one(trunk_tree());
  EXPECT_EQ(a.subtree_end, b.subtree_end);
  EXPECT_LE(a.n_tokens, 16384);
  EXPECT_GT(a.n_tokens, 16384 - 64);
  int one_token = 0;
  for (int n = 0; n < a.num_nodes(); ++n) one_token += a.node_len[n] == 1;
  EXPECT_GT(one_token, 10) << "one-token trunk nodes are mixed in";
  EXPECT_NE(pack_one(trunk_tree(16384, 8)).subtree_end, a.subtree_end);
}

}  // namespace
}  // namespace tt::trainer
