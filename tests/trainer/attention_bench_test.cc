// The attention benchmark's host-side layout statistics (trainer/attention_bench.h): tile
// occupancy, and the fine-grained workloads' shapes (fixed by their seeds).
#include "trainer/attention_bench.h"

#include <gtest/gtest.h>

namespace tt::trainer {
namespace {

TEST(AttentionBench, TileOccupancyCountsTouchedTiles) {
  // Causal 256 with 128 x 128 tiles: key block 0 touches query tiles 0 and 1, key block 1 only
  // tile 1: three tiles of 16384 pairs for 256 * 257 / 2 visible pairs.
  const data::PackedBatch c = causal_batch(256);
  EXPECT_DOUBLE_EQ(tile_occupancy(c, 128, 128), 32896.0 / (3 * 16384.0));
  // One-token tiles see exactly the visible pairs.
  EXPECT_DOUBLE_EQ(tile_occupancy(c, 1, 1), 1.0);
  // A comb's leaves hide from later queries: its occupancy is below a causal run of its length.
  const data::PackedBatch comb = comb_short_batch();
  EXPECT_EQ(comb.n_tokens, 1024 + 200 * (24 + 40));
  EXPECT_LT(tile_occupancy(comb, 128, 128), tile_occupancy(causal_batch(comb.n_tokens), 128, 128));
  EXPECT_GT(tile_occupancy(comb, 128, 128), 0.0);
}

TEST(AttentionBench, TrunkWorkloadIsFixedBySeed) {
  const data::PackedBatch a = trunk_batch(), b = trunk_batch();
  EXPECT_EQ(a.subtree_end, b.subtree_end);
  EXPECT_LE(a.n_tokens, 16384);
  EXPECT_GT(a.n_tokens, 16384 - 64);
  int one_token = 0;
  for (int n = 0; n < a.num_nodes(); ++n) one_token += a.node_len[n] == 1;
  EXPECT_GT(one_token, 10) << "one-token trunk nodes are mixed in";
  EXPECT_NE(trunk_batch(16384, 8).subtree_end, a.subtree_end);
}

}  // namespace
}  // namespace tt::trainer
