// tree_stats on the shared hand examples of test_util.h (numbers computed by hand).
#include "data/stats.h"

#include <gtest/gtest.h>

#include "data/reader.h"
#include "tests/data/test_util.h"

namespace tt::data {
namespace {

using testing::kHandRollouts;
using testing::kHandTree;

TEST(Stats, HandExamples) {
  const std::vector<Tree> trees = {parse_rollouts_line(kHandRollouts, "f:1", 0), parse_tree_line(kHandTree, "f:2", 0)};
  const nlohmann::json s = tree_stats(trees);
  EXPECT_EQ(s["trees"], 2);
  EXPECT_EQ(s["paths"], 7);
  EXPECT_EQ(s["nodes"], 8);
  EXPECT_EQ(s["n_flat"], 18 + 14);
  EXPECT_EQ(s["n_tree"], 7 + 8);
  EXPECT_DOUBLE_EQ(s["por"].get<double>(), 1.0 - 15.0 / 32.0);
  EXPECT_EQ(s["n_flat_targets"], 13 + 9);
  // Tree: sum of (pos + 1): 1+2+3+4+5+4+5 and 1+2+3+4+5+5+6+3.
  EXPECT_EQ(s["visible_pairs_tree"], 24 + 29);
  // Flat: L (L + 1) / 2 per path.
  EXPECT_EQ(s["visible_pairs_flat"], (15 + 15 + 6 + 15) + (15 + 21 + 6));
  EXPECT_EQ(s["max_depth"], 6);
  EXPECT_EQ(s["max_tree_tokens"], 8);
}

TEST(Stats, EmptyListIsAllZero) {
  const nlohmann::json s = tree_stats({});
  EXPECT_EQ(s["trees"], 0);
  EXPECT_EQ(s["por"], 0.0);
}

}  // namespace
}  // namespace tt::data
