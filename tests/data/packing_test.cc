// Packing: hand-checked layouts (positions, subtree ends, node ranges, targets at branch points),
// several trees per batch, and on many random trees: visibility equals the ancestor relation, and
// tree and per-path packings hold exactly the (context, target, weight) of the raw records.
#include "data/packing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "data/reader.h"
#include "base/check.h"
#include "tests/data/test_util.h"

namespace tt::data {
namespace {

using testing::kHandRollouts;
using testing::kHandTree;

using I = std::vector<int32_t>;
using D = std::vector<double>;

TEST(PackTree, RolloutsHandExample) {
  const Tree t = parse_rollouts_line(kHandRollouts, "f:1", 0);
  const PackedBatch b = pack({&t}, Packing::kTree);
  EXPECT_EQ(b.n_tokens, 7);
  EXPECT_EQ(b.tokens, I({1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(b.subtree_end, I({7, 7, 7, 5, 5, 7, 7}));
  EXPECT_EQ(b.node_start, I({0, 3, 5}));
  EXPECT_EQ(b.node_len, I({3, 2, 2}));
  EXPECT_EQ(b.node_parent, I({-1, 0, 0}));
  EXPECT_EQ(b.tree_start, I({0, 7}));
  // Row 2 (token 3) is the branch point: the source of both children's first tokens.
  EXPECT_EQ(b.tgt_src, I({0, 1, 2, 3, 2, 5}));
  EXPECT_EQ(b.tgt_tok, I({2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.tgt_w, D({3.5, 4.5, 2, 2, 2, 2}));
  EXPECT_EQ(b.n_paths, 4);
  EXPECT_EQ(b.n_flat, 18);
  EXPECT_EQ(b.n_tree, 7);
  EXPECT_EQ(b.n_flat_targets, 13);
  EXPECT_EQ(b.visible_pairs, 1 + 2 + 3 + 4 + 5 + 4 + 5);
  EXPECT_EQ(b.num_nodes(), 3);
  EXPECT_EQ(b.num_trees(), 1);
  EXPECT_EQ(packed_size(t, Packing::kTree), 7);
  EXPECT_EQ(packed_size(t, Packing::kPerPath), 18);
}

TEST(PackPerPath, RolloutsHandExampleIsOneChainPerSequence) {
  const Tree t = parse_rollouts_line(kHandRollouts, "f:1", 0);
  const PackedBatch b = pack({&t}, Packing::kPerPath);
  EXPECT_EQ(b.n_tokens, 18);
  EXPECT_EQ(b.tokens, I({1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2, 3, 1, 2, 3, 4, 5}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4}));
  EXPECT_EQ(b.subtree_end, I({5, 5, 5, 5, 5, 10, 10, 10, 10, 10, 13, 13, 13, 18, 18, 18, 18, 18}));
  EXPECT_EQ(b.node_start, I({0, 5, 10, 13}));
  EXPECT_EQ(b.node_len, I({5, 5, 3, 5}));
  EXPECT_EQ(b.node_parent, I({-1, -1, -1, -1}));
  EXPECT_EQ(b.tree_start, I({0, 5, 10, 13, 18}));
  EXPECT_EQ(b.tgt_src, I({1, 2, 3, 5, 6, 7, 8, 10, 11, 13, 14, 15, 16}));
  EXPECT_EQ(b.tgt_tok, I({3, 4, 5, 2, 3, 6, 7, 2, 3, 2, 3, 4, 5}));
  EXPECT_EQ(b.tgt_w, D({1, 1, 1, 2, 2, 2, 2, 0.5, 0.5, 1, 1, 1, 1}));
  // Statistics describe the trees; visible pairs and n_tokens follow the packing.
  EXPECT_EQ(b.n_paths, 4);
  EXPECT_EQ(b.n_flat, 18);
  EXPECT_EQ(b.n_tree, 7);
  EXPECT_EQ(b.n_flat_targets, 13);
  EXPECT_EQ(b.visible_pairs, 15 + 15 + 6 + 15);
}

// kHandTree: 0 [10 11]; 1 <- 0 [12 13]; 2 <- 1 [14]; 3 <- 1 [15 16]; 4 <- 0 [17].
TEST(PackTree, TreeFormatHandExampleBranchPoints) {
  const Tree t = parse_tree_line(kHandTree, "f:1", 0);
  // Children in listed order: 0, 1, 2, 3, 4.
  const PackedBatch b = pack({&t}, Packing::kTree, ChildOrder::kListed);
  EXPECT_EQ(b.tokens, I({10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 4, 4, 5, 2}));
  EXPECT_EQ(b.subtree_end, I({8, 8, 7, 7, 5, 7, 7, 8}));
  EXPECT_EQ(b.node_start, I({0, 2, 4, 5, 7}));
  EXPECT_EQ(b.node_len, I({2, 2, 1, 2, 1}));
  EXPECT_EQ(b.node_parent, I({-1, 0, 1, 1, 0}));
  EXPECT_EQ(b.tgt_src, I({0, 2, 3, 3, 5, 1}));
  EXPECT_EQ(b.tgt_tok, I({11, 13, 14, 15, 16, 17}));
  EXPECT_EQ(b.tgt_w, D({3, 4, 1, 0.5, 0.5, 1}));
  EXPECT_EQ(b.visible_pairs, 1 + 2 + 3 + 4 + 5 + 5 + 6 + 3);
}

TEST(PackTree, LargerSubtreesComeFirst) {
  // The default order: node 1 (5 tokens under it) before node 4 (1), and under node 1, node 3 (2
  // tokens) before node 2 (1): 0, 1, 3, 2, 4.
  const Tree t = parse_tree_line(kHandTree, "f:1", 0);
  const PackedBatch b = pack({&t}, Packing::kTree);
  EXPECT_EQ(b.tokens, I({10, 11, 12, 13, 15, 16, 14, 17}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 4, 5, 4, 2}));
  EXPECT_EQ(b.subtree_end, I({8, 8, 7, 7, 6, 6, 7, 8}));
  EXPECT_EQ(b.node_start, I({0, 2, 4, 6, 7}));
  EXPECT_EQ(b.node_len, I({2, 2, 2, 1, 1}));
  EXPECT_EQ(b.node_parent, I({-1, 0, 1, 1, 0}));
  // The same targets as in listed order, in the new packed order of their tokens.
  EXPECT_EQ(b.tgt_src, I({0, 2, 3, 4, 3, 1}));
  EXPECT_EQ(b.tgt_tok, I({11, 13, 15, 16, 14, 17}));
  EXPECT_EQ(b.tgt_w, D({3, 4, 0.5, 0.5, 1, 1}));
  EXPECT_EQ(b.visible_pairs, 1 + 2 + 3 + 4 + 5 + 6 + 5 + 3);
  EXPECT_EQ(t.preorder(), std::vector<int>({0, 1, 3, 2, 4}));
  EXPECT_EQ(t.preorder(ChildOrder::kListed), std::vector<int>({0, 1, 2, 3, 4}));
}

TEST(PackTree, EqualSubtreesKeepTheirListedOrder) {
  // 0 [1]; 1 <- 0 [2 3]; 2 <- 0 [4]; 3 <- 2 [5]; 4 <- 0 [6 7]: three 2-token subtrees.
  const Tree t = parse_tree_line(R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": 0, "tokens": [2, 3]},)"
                                 R"( {"parent": 0, "tokens": [4]}, {"parent": 2, "tokens": [5]},)"
                                 R"( {"parent": 0, "tokens": [6, 7]}]})",
                                 "f:1", 0);
  EXPECT_EQ(t.preorder(), std::vector<int>({0, 1, 2, 3, 4}));
  EXPECT_EQ(pack({&t}, Packing::kTree).tokens, I({1, 2, 3, 4, 5, 6, 7}));
}

TEST(PackTree, ACombsTrunkIsContiguousItsLeavesAfterIt) {
  // An episode comb: a prefix, then per step a trunk node and a leaf off it, listed trunk first
  // (as data/episode_tree.cc lists an episode). Laid out: prefix, the trunk nodes in order, then
  // the leaves, the deepest first (each leaf follows the end of its trunk node's other subtree).
  std::string line = R"({"nodes": [{"parent": -1, "tokens": [0, 0]})";
  const int steps = 4;
  for (int s = 0; s < steps; ++s) {
    const int trunk_parent = s == 0 ? 0 : 2 * s - 1;  // node 2s+1 is step s's trunk node
    line += str(R"(, {"parent": )", trunk_parent, R"(, "tokens": [)", 10 + s, ", ", 10 + s, "]}");
    line += str(R"(, {"parent": )", 2 * s + 1, R"(, "tokens": [)", 20 + s, "]}");
  }
  line += "]}";
  const Tree t = parse_tree_line(line, "f:1", 0);
  EXPECT_EQ(t.preorder(), std::vector<int>({0, 1, 3, 5, 7, 8, 6, 4, 2}));
  const PackedBatch b = pack({&t}, Packing::kTree);
  EXPECT_EQ(b.tokens, I({0, 0, 10, 10, 11, 11, 12, 12, 13, 13, 23, 22, 21, 20}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 8, 6, 4}));
  // Trunk key j is seen by every later row up to its leaf: one contiguous run of queries.
  EXPECT_EQ(b.subtree_end, I({14, 14, 14, 14, 13, 13, 12, 12, 11, 11, 11, 12, 13, 14}));
  // The listed order interleaves them: prefix, trunk 0, leaf 0, trunk 1, leaf 1, ...
  EXPECT_EQ(pack({&t}, Packing::kTree, ChildOrder::kListed).tokens,
            I({0, 0, 10, 10, 20, 11, 11, 21, 12, 12, 22, 13, 13, 23}));
}

TEST(PackTree, NodesListedOutOfDfsOrderArePackedInDfsOrder) {
  // 0 [1]; 1 <- 0 [2]; 2 <- 0 [3]; 3 <- 1 [4]: DFS visits 0, 1, 3, 2.
  const Tree t = parse_tree_line(R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": 0, "tokens": [2]},)"
                                 R"( {"parent": 0, "tokens": [3]}, {"parent": 1, "tokens": [4, 5]}]})",
                                 "f:1", 0);
  const PackedBatch b = pack({&t}, Packing::kTree);
  EXPECT_EQ(b.tokens, I({1, 2, 4, 5, 3}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 1}));
  EXPECT_EQ(b.subtree_end, I({5, 4, 4, 4, 5}));
  EXPECT_EQ(b.node_parent, I({-1, 0, 1, 0}));
  EXPECT_EQ(b.tgt_src, I({0, 1, 2, 0}));
  EXPECT_EQ(b.tgt_tok, I({2, 4, 5, 3}));
  // Paths stay in leaf index order (leaves 2 and 3); per-path packing follows them.
  const PackedBatch p = pack({&t}, Packing::kPerPath);
  EXPECT_EQ(p.tokens, I({1, 3, 1, 2, 4, 5}));
}

TEST(PackTree, SeveralTreesShareABatchWithoutSeeingEachOther) {
  const Tree a = parse_rollouts_line(kHandRollouts, "f:1", 0);
  const Tree c = parse_tree_line(kHandTree, "f:2", 0);
  const PackedBatch b = pack({&a, &c}, Packing::kTree);
  EXPECT_EQ(b.n_tokens, 15);
  EXPECT_EQ(b.tree_start, I({0, 7, 15}));
  EXPECT_EQ(b.num_trees(), 2);
  // The second tree as in LargerSubtreesComeFirst, 7 rows on.
  EXPECT_EQ(b.node_start, I({0, 3, 5, 7, 9, 11, 13, 14}));
  EXPECT_EQ(b.node_parent, I({-1, 0, 0, -1, 3, 4, 4, 3}));
  EXPECT_EQ(b.pos, I({0, 1, 2, 3, 4, 3, 4, 0, 1, 2, 3, 4, 5, 4, 2}));
  EXPECT_EQ(b.subtree_end, I({7, 7, 7, 5, 5, 7, 7, 15, 15, 14, 14, 13, 13, 14, 15}));
  EXPECT_EQ(b.tgt_src, I({0, 1, 2, 3, 2, 5, 7, 9, 10, 11, 10, 8}));
  EXPECT_EQ(b.n_paths, 7);
  EXPECT_EQ(b.n_flat, 18 + 14);
  EXPECT_EQ(b.n_tree, 15);
  EXPECT_EQ(b.visible_pairs, 24 + 29);
  const PackedBatch p = pack({&a, &c}, Packing::kPerPath);
  EXPECT_EQ(p.n_tokens, 32);
  EXPECT_EQ(p.tree_start, I({0, 5, 10, 13, 18, 23, 29, 32}));
  EXPECT_EQ(p.n_tree, 15);
}

TEST(Pack, EmptyListGivesAnEmptyBatch) {
  const PackedBatch b = pack({}, Packing::kTree);
  EXPECT_EQ(b.n_tokens, 0);
  EXPECT_EQ(b.tree_start, I({0}));
  EXPECT_EQ(b.num_trees(), 0);
}

TEST(Pack, SignedWeightsPackAsTargets) {
  // Weights of any sign; a target's summed weight may be 0 (it stays a target under tree
  // packing: the mask decides) and the per-path baseline lists only the nonzero ones.
  Tree t;
  t.id = "signed";
  t.nodes.resize(1);
  t.nodes[0].tokens = {1, 2, 3};
  t.nodes[0].target_weight = {0, -1.5, 0};
  t.nodes[0].target_count = {0, 1, 1};
  t.paths.push_back({0, {0, -1.5, 0}});
  const PackedBatch tree = pack({&t}, Packing::kTree);
  EXPECT_EQ(tree.tgt_w, std::vector<double>({-1.5, 0}));
  const PackedBatch path = pack({&t}, Packing::kPerPath);
  EXPECT_EQ(path.tgt_w, std::vector<double>({-1.5}));
  EXPECT_EQ(tree.n_flat_targets, 2);
  EXPECT_EQ(path.n_flat_targets, 2);
  t.nodes[0].target_weight[1] = NAN;
  try {
    pack({&t}, Packing::kTree);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'signed': node 0 token 1 has target weight nan and count 1, expected a finite weight (of any "
              "sign) and a count >= 0");
  }
}

TEST(Pack, RejectsMalformedHandBuiltTrees) {
  Tree t;
  t.id = "hand";
  t.nodes.resize(1);
  t.nodes[0].tokens = {1, 2};
  t.nodes[0].target_weight = {0, 1};
  t.nodes[0].target_count = {0, 0};
  t.paths.push_back({0, {0, 1}});
  try {
    pack({&t}, Packing::kTree);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'hand': node 0 token 1 has target weight 1 but target count 0, expected a count > 0 for every "
              "weighted token");
  }
  t.nodes[0].target_count = {0, 1};
  t.nodes.push_back(t.nodes[0]);
  t.nodes[1].parent = 1;
  EXPECT_THROW(pack({&t}, Packing::kTree), Error);
}

// Visibility from subtree_end (j <= i < subtree_end[j]) equals "j's node is i's node or one of its
// ancestors, and j <= i", checked on every pair; node ranges tile each tree's range in order.
void check_layout(const PackedBatch& b) {
  const int N = b.n_tokens;
  ASSERT_EQ((int)b.tokens.size(), N);
  ASSERT_EQ(b.tree_start.front(), 0);
  ASSERT_EQ(b.tree_start.back(), N);
  std::vector<int> node_of(N, -1);
  int expect_start = 0;
  for (int n = 0; n < b.num_nodes(); ++n) {
    ASSERT_EQ(b.node_start[n], expect_start);
    ASSERT_GT(b.node_len[n], 0);
    ASSERT_LT(b.node_parent[n], n);
    expect_start += b.node_len[n];
    for (int j = 0; j < b.node_len[n]; ++j) {
      node_of[b.node_start[n] + j] = n;
      const int p = b.node_parent[n];
      const int depth = p < 0 ? 0 : b.pos[b.node_start[p] + b.node_len[p] - 1] + 1;
      ASSERT_EQ(b.pos[b.node_start[n] + j], depth + j);
    }
  }
  ASSERT_EQ(expect_start, N);
  for (int i = 0; i < N; ++i) {
    int visible = 0;
    for (int j = 0; j < N; ++j) {
      bool ancestor = false;
      for (int n = node_of[i]; n >= 0; n = b.node_parent[n]) ancestor |= n == node_of[j];
      const bool expected = ancestor && j <= i;
      ASSERT_EQ(j <= i && i < b.subtree_end[j], expected) << "query " << i << " key " << j;
      visible += expected;
    }
    ASSERT_EQ(visible, b.pos[i] + 1);
  }
  for (size_t t = 0; t < b.tgt_src.size(); ++t) {
    ASSERT_GE(b.tgt_src[t], 0);
    ASSERT_LT(b.tgt_src[t], N);
  }
}

TEST(PackRandom, RolloutsTreeAndPerPathHoldTheRecordsTargets) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<std::vector<testing::RawSequence>> groups(1 + rng() % 3);
    std::vector<Tree> trees;
    testing::LossMap want;
    for (auto& g : groups) {
      g = testing::random_rollouts(rng, 3, 2);
      for (Tree& t : parse_rollouts_trees(testing::rollouts_json("r", g), "f:1", 3)) trees.push_back(std::move(t));
      for (auto& [k, w] : testing::rollouts_reference(g)) want[k] += w;
    }
    std::vector<const Tree*> ptrs;
    int64_t n_tree = 0, n_flat = 0;
    for (const Tree& t : trees) ptrs.push_back(&t), n_tree += t.n_tree(), n_flat += t.n_flat();
    const PackedBatch tb = pack(ptrs, Packing::kTree);
    const PackedBatch pb = pack(ptrs, Packing::kPerPath);
    ASSERT_NO_FATAL_FAILURE(check_layout(tb));
    ASSERT_NO_FATAL_FAILURE(check_layout(pb));
    EXPECT_EQ(tb.n_tokens, n_tree);
    EXPECT_EQ(pb.n_tokens, n_flat);
    EXPECT_EQ(testing::loss_map(tb), want);
    EXPECT_EQ(testing::loss_map(pb), want);
    EXPECT_EQ(tb.n_flat_targets, pb.n_flat_targets);
  }
}

// A tree's paths cut into ranges under a budget: each range fits it, the ranges cover the paths
// in order, and their batches together are the tree's per-path batch, row for row and target for
// target (statistics summed; n_tree counted once).
TEST(PackRandom, PathRangesTogetherAreThePerPathBatch) {
  std::mt19937 rng(13);
  for (int iter = 0; iter < 300; ++iter) {
    const std::vector<testing::RawSequence> g = testing::random_rollouts(rng, 3, 2);
    const std::vector<Tree> trees = parse_rollouts_trees(testing::rollouts_json("r", g), "f:1", 3);
    const Tree& t = trees[0];
    int64_t longest = 0;
    for (int64_t k = 0; k < t.n_paths(); ++k) longest = std::max<int64_t>(longest, (int64_t)t.path_tokens(k).size());
    const int64_t budget = longest + (int64_t)(rng() % 8);
    const PackedBatch whole = pack({&t}, Packing::kPerPath);
    PackedBatch joined;
    int64_t next = 0, n_tree = 0;
    for (const auto& [first, end] : path_ranges(t, budget)) {
      ASSERT_EQ(first, next);
      ASSERT_LT(first, end);
      const PackedBatch b = pack_path_range(t, first, end);
      ASSERT_NO_FATAL_FAILURE(check_layout(b));
      EXPECT_LE(b.n_tokens, budget);
      EXPECT_EQ(b.n_paths, end - first);
      EXPECT_EQ(b.n_flat, b.n_tokens);
      EXPECT_EQ(b.n_flat_targets, (int64_t)b.tgt_src.size());
      const int32_t base = (int32_t)joined.tokens.size();
      for (int i = 0; i < b.n_tokens; ++i) {
        joined.tokens.push_back(b.tokens[i]);
        joined.pos.push_back(b.pos[i]);
        joined.subtree_end.push_back(base + b.subtree_end[i]);
      }
      for (size_t k = 0; k < b.tgt_src.size(); ++k) {
        joined.tgt_src.push_back(base + b.tgt_src[k]);
        joined.tgt_tok.push_back(b.tgt_tok[k]);
        joined.tgt_w.push_back(b.tgt_w[k]);
      }
      joined.n_paths += b.n_paths;
      joined.n_flat_targets += b.n_flat_targets;
      joined.visible_pairs += b.visible_pairs;
      n_tree += b.n_tree;
      next = end;
    }
    EXPECT_EQ(next, t.n_paths());
    EXPECT_EQ(n_tree, t.n_tree());
    EXPECT_EQ(joined.tokens, whole.tokens);
    EXPECT_EQ(joined.pos, whole.pos);
    EXPECT_EQ(joined.subtree_end, whole.subtree_end);
    EXPECT_EQ(joined.tgt_src, whole.tgt_src);
    EXPECT_EQ(joined.tgt_tok, whole.tgt_tok);
    EXPECT_EQ(joined.tgt_w, whole.tgt_w);
    EXPECT_EQ(joined.n_paths, whole.n_paths);
    EXPECT_EQ(joined.n_flat_targets, whole.n_flat_targets);
    EXPECT_EQ(joined.visible_pairs, whole.visible_pairs);
  }
}

TEST(Pack, PathRangesNameAPathLongerThanTheBudget) {
  const std::vector<Tree> trees = parse_rollouts_trees(
      R"({"id": "g", "sequences": [{"tokens": [1, 2, 3]}, {"tokens": [1, 4, 5, 6, 7]}]})", "f:1", 8);
  EXPECT_EQ(path_ranges(trees[0], 5), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}}));
  EXPECT_EQ(path_ranges(trees[0], 8), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}}));
  try {
    path_ranges(trees[0], 4);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'g': path 1 has 5 tokens, which exceeds data.max_tokens_per_batch = 4; expected every path to "
              "fit one micro-batch under per_path packing");
  }
}

TEST(PackRandom, TreeFormatTreeAndPerPathHoldTheRecordsTargets) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<Tree> trees;
    testing::LossMap want;
    const int n = 1 + rng() % 3;
    for (int k = 0; k < n; ++k) {
      const std::vector<testing::RawNode> nodes = testing::random_tree(rng, 3);
      trees.push_back(parse_tree_line(testing::tree_json("t", nodes), "f:1", 3));
      for (auto& [key, w] : testing::tree_reference(nodes)) want[key] += w;
    }
    std::vector<const Tree*> ptrs;
    for (const Tree& t : trees) ptrs.push_back(&t);
    const PackedBatch tb = pack(ptrs, Packing::kTree);
    const PackedBatch pb = pack(ptrs, Packing::kPerPath);
    ASSERT_NO_FATAL_FAILURE(check_layout(tb));
    ASSERT_NO_FATAL_FAILURE(check_layout(pb));
    EXPECT_EQ(testing::loss_map(tb), want);
    EXPECT_EQ(testing::loss_map(pb), want);
  }
}

}  // namespace
}  // namespace tt::data
