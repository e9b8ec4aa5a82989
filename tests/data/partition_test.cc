// Partitioning: split_long_nodes keeps the packed batch, the planner on hand examples, and the
// exactness contract on many random trees and capacities (1, below one node, up to >= n_tree):
// every token in exactly one piece, connected pieces within capacity, the same targets, positions
// and visible key sequences (gateway rows, then in-piece keys) as the unpartitioned batch; the
// greedy's piece count equals a brute-force minimum on small trees; the published example's
// totals; episode trees: no cut inside a frame, every frame slot and state row in one piece.
//
// Random trees get unique token ids (a running counter), so a token id names one token of the
// tree, and pieces map back to the unpartitioned batch through their ids alone.
#include "data/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "data/episode_tree.h"
#include "data/reader.h"
#include "data/stats.h"
#include "data/synthetic.h"
#include "base/check.h"
#include "tests/data/test_util.h"

namespace tt::data {
namespace {

using testing::kHandRollouts;
using testing::kHandTree;

using I = std::vector<int32_t>;
using D = std::vector<double>;

// Gives every token of the tree its own id.
Tree relabel(Tree t) {
  int32_t id = 0;
  for (Node& n : t.nodes)
    for (int32_t& tok : n.tokens) tok = id++;
  return t;
}

enum class Shape { kRandom, kChain, kFan, kBushy };

// A tree record of n nodes of 1..max_len tokens each. kRandom: parent any earlier node; kChain:
// mostly the previous node; kFan: mostly the root; kBushy: one of the last few nodes.
std::vector<testing::RawNode> shaped_nodes(std::mt19937& rng, Shape shape, int n, int max_len) {
  auto uni = [&](int k) { return (int)(rng() % (uint32_t)k); };
  const double weights[] = {0.0, 0.25, 0.5, 1.0, 2.0};
  std::vector<testing::RawNode> nodes(n);
  for (int i = 0; i < n; ++i) {
    testing::RawNode& nd = nodes[i];
    if (i == 0) {
      nd.parent = -1;
    } else if (shape == Shape::kChain) {
      nd.parent = uni(5) > 0 ? i - 1 : uni(i);
    } else if (shape == Shape::kFan) {
      nd.parent = uni(5) > 0 ? 0 : uni(i);
    } else if (shape == Shape::kBushy) {
      nd.parent = std::max(0, i - 1 - uni(3));
    } else {
      nd.parent = uni(i);
    }
    nd.tokens.resize(1 + uni(max_len));
    for (auto& t : nd.tokens) t = (int32_t)uni(3);
    if (uni(3) > 0) {
      nd.mask.resize(nd.tokens.size());
      for (auto& m : nd.mask) m = uni(3) > 0;
    }
    nd.weight = weights[uni(5)];
  }
  return nodes;
}

Tree parse_nodes(const std::vector<testing::RawNode>& nodes) {
  return parse_tree_line(testing::tree_json("t", nodes), "f:1", 0);
}

// The trees of the random sweeps: tree records of every shape, rollouts groups (merged tries,
// paths ending inside nodes), and the small records of test_util.h.
std::vector<Tree> random_trees(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::vector<Tree> trees;
  for (int k = 0; k < count; ++k) {
    switch (k % 4) {
      case 0:
        trees.push_back(parse_nodes(testing::random_tree(rng, 3)));
        break;
      case 1:
        for (Tree& t : parse_rollouts_trees(testing::rollouts_json("r", testing::random_rollouts(rng, 3, 2)), "f:1", 3))
          trees.push_back(std::move(t));
        break;
      default:
        trees.push_back(parse_nodes(shaped_nodes(rng, (Shape)(rng() % 4), 1 + (int)(rng() % 24), 1 + (int)(rng() % 9))));
    }
  }
  for (Tree& t : trees) t = relabel(std::move(t));
  return trees;
}

// Capacities that break assumptions: 1, below the longest node, exactly it, the tree minus one,
// the tree, beyond it.
std::vector<int64_t> capacities(const Tree& t) {
  int64_t longest = 0;
  for (const Node& n : t.nodes) longest = std::max(longest, (int64_t)n.tokens.size());
  std::vector<int64_t> c = {1, 2, 3, 5, 8, longest - 1, longest, t.n_tree() - 1, t.n_tree(), t.n_tree() + 3};
  c.erase(std::remove_if(c.begin(), c.end(), [](int64_t x) { return x < 1; }), c.end());
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

// (source token id, target token id) -> weight; fails on a repeated pair.
using TargetMap = std::map<std::pair<int32_t, int32_t>, double>;

void add_targets(const PackedBatch& b, TargetMap& m) {
  for (size_t t = 0; t < b.tgt_src.size(); ++t) {
    const bool fresh = m.emplace(std::make_pair(b.tokens[b.tgt_src[t]], b.tgt_tok[t]), b.tgt_w[t]).second;
    ASSERT_TRUE(fresh) << "target (" << b.tokens[b.tgt_src[t]] << " -> " << b.tgt_tok[t] << ") listed twice";
  }
}

// Token ids of the keys row i sees in batch b (j <= i < subtree_end[j]), in packed order.
std::vector<int32_t> visible_ids(const PackedBatch& b, int i) {
  std::vector<int32_t> ids;
  for (int j = 0; j <= i; ++j)
    if (i < b.subtree_end[j]) ids.push_back(b.tokens[j]);
  return ids;
}

// The whole contract for one tree (unique token ids) and one capacity.
void check_partition(const Tree& original, int64_t capacity) {
  SCOPED_TRACE(::testing::Message() << "capacity " << capacity << ", " << original.nodes.size() << " nodes, "
                                    << original.n_tree() << " tokens");
  const Tree tree = split_long_nodes(original, capacity);
  const Partition plan = plan_partition(tree, capacity);
  const PackedBatch full = pack({&tree}, Packing::kTree);
  const int N = full.n_tokens;
  std::unordered_map<int32_t, int> full_row;  // token id -> row of the unpartitioned batch
  for (int r = 0; r < N; ++r) full_row[full.tokens[r]] = r;
  ASSERT_EQ((int)full_row.size(), N);

  const int P = plan.num_pieces();
  ASSERT_GE(P, 1);
  ASSERT_EQ(plan.capacity, capacity);
  ASSERT_EQ(plan.piece_of_node.size(), tree.nodes.size());
  std::vector<PackedBatch> pb(P);
  for (int k = 0; k < P; ++k) pb[k] = pack_piece(tree, plan, k);

  // (a) Each token in exactly one piece; pieces connected, within capacity, parent piece earlier.
  std::vector<int> seen(N, 0);
  size_t nodes_seen = 0;
  int64_t max_piece = 0, naive = 0;
  for (int k = 0; k < P; ++k) {
    const Piece& pc = plan.pieces[k];
    const PackedBatch& b = pb[k];
    ASSERT_GE(pc.tokens, 1);
    ASSERT_LE(pc.tokens, capacity);
    ASSERT_EQ(b.n_tokens, pc.tokens);
    ASSERT_EQ(b.num_nodes(), (int)pc.nodes.size());
    ASSERT_EQ(b.tree_start, I({0, b.n_tokens}));
    ASSERT_EQ(pc.nodes.front(), pc.root_node);
    ASSERT_EQ(k == 0, pc.root_node == 0);
    ASSERT_LT(pc.parent_piece, k);
    const int root_parent = tree.nodes[pc.root_node].parent;
    ASSERT_EQ(pc.parent_piece, root_parent < 0 ? -1 : plan.piece_of_node[root_parent]);
    if (k > 0) {
      const auto& siblings = plan.pieces[pc.parent_piece].child_pieces;
      ASSERT_EQ(std::count(siblings.begin(), siblings.end(), k), 1);
    }
    for (int c : pc.child_pieces) ASSERT_EQ(plan.pieces[c].parent_piece, k);
    for (size_t q = 0; q < pc.nodes.size(); ++q) {
      const int v = pc.nodes[q];
      ASSERT_EQ(plan.piece_of_node[v], k);
      ASSERT_EQ(plan.row_of_node[v], b.node_start[q]);
      ASSERT_EQ(b.node_len[q], (int)tree.nodes[v].tokens.size());
      // Connected: every node but the piece root hangs off a node of the same piece.
      if (q > 0) {
        ASSERT_EQ(plan.piece_of_node[tree.nodes[v].parent], k);
        ASSERT_GE(b.node_parent[q], 0);
        ASSERT_EQ(pc.nodes[b.node_parent[q]], tree.nodes[v].parent);
      } else {
        ASSERT_EQ(b.node_parent[q], -1);
      }
    }
    nodes_seen += pc.nodes.size();
    for (int r = 0; r < b.n_tokens; ++r) {
      ASSERT_EQ(full_row.count(b.tokens[r]), 1u);
      ++seen[full_row[b.tokens[r]]];
    }
    max_piece = std::max(max_piece, pc.tokens);
    naive += pc.tokens + pc.prefix_tokens;
  }
  ASSERT_EQ(nodes_seen, tree.nodes.size());
  for (int r = 0; r < N; ++r) ASSERT_EQ(seen[r], 1) << "row " << r;
  EXPECT_EQ(plan.max_piece_tokens, max_piece);
  EXPECT_EQ(plan.naive_tokens, naive);

  // (b) The union of the pieces' targets is the unpartitioned batch's, weights included; a target
  // sits in the piece holding its source row.
  TargetMap want, got;
  ASSERT_NO_FATAL_FAILURE(add_targets(full, want));
  for (int k = 0; k < P; ++k) ASSERT_NO_FATAL_FAILURE(add_targets(pb[k], got));
  EXPECT_EQ(got, want);
  if (N > 0) {
    for (size_t t = 0; t < full.tgt_tok.size(); ++t) ASSERT_NE(full.tgt_tok[t], full.tokens[0]);
  }

  // (c) Positions: the depths of the whole tree, and the unpartitioned batch's; (d) visible keys (gateway rows, then in-piece keys) are the unpartitioned
  // batch's, in the same order, with positions 0, 1, ..., pos.
  std::vector<int64_t> depth(tree.nodes.size(), 0);  // tokens before each node on its root chain
  for (size_t v = 1; v < tree.nodes.size(); ++v) {
    const int p = tree.nodes[v].parent;
    depth[v] = depth[p] + (int64_t)tree.nodes[p].tokens.size();
  }
  for (int k = 0; k < P; ++k) {
    const Piece& pc = plan.pieces[k];
    const PackedBatch& b = pb[k];
    ASSERT_EQ(b.pos[0], pc.prefix_tokens);
    ASSERT_EQ(pc.prefix_tokens, depth[pc.root_node]);
    for (size_t q = 0; q < pc.nodes.size(); ++q)
      for (int j = 0; j < b.node_len[q]; ++j) ASSERT_EQ(b.pos[b.node_start[q] + j], depth[pc.nodes[q]] + j);
    std::vector<int32_t> gateway;
    for (const GatewaySegment& s : pc.gateway) {
      bool ancestor = false;
      for (int a = plan.pieces[k].parent_piece; a >= 0; a = plan.pieces[a].parent_piece) ancestor |= a == s.piece;
      ASSERT_TRUE(ancestor) << "gateway of piece " << k << " reads piece " << s.piece;
      ASSERT_LE(0, s.row_begin);
      ASSERT_LT(s.row_begin, s.row_end);
      ASSERT_LE(s.row_end, pb[s.piece].n_tokens);
      for (int r = s.row_begin; r < s.row_end; ++r) gateway.push_back(pb[s.piece].tokens[r]);
    }
    for (size_t i = 1; i < pc.gateway.size(); ++i)  // adjacent rows of one piece are one range
      ASSERT_FALSE(pc.gateway[i].piece == pc.gateway[i - 1].piece &&
                   pc.gateway[i].row_begin == pc.gateway[i - 1].row_end)
          << "piece " << k << " gateway range " << i;
    ASSERT_EQ((int64_t)gateway.size(), pc.prefix_tokens);
    for (int i = 0; i < b.n_tokens; ++i) {
      const int fi = full_row[b.tokens[i]];
      ASSERT_EQ(b.pos[i], full.pos[fi]);
      std::vector<int32_t> keys = gateway;
      for (int32_t id : visible_ids(b, i)) keys.push_back(id);
      ASSERT_EQ(keys, visible_ids(full, fi)) << "piece " << k << " row " << i;
      for (size_t j = 0; j < keys.size(); ++j) ASSERT_EQ(full.pos[full_row[keys[j]]], (int32_t)j);
    }
  }

  // Statistics: sums over pieces are the tree's.
  int64_t n_tree = 0, n_paths = 0, n_flat = 0, n_flat_targets = 0, pairs = 0;
  for (int k = 0; k < P; ++k) {
    n_tree += pb[k].n_tree;
    n_paths += pb[k].n_paths;
    n_flat += pb[k].n_flat;
    n_flat_targets += pb[k].n_flat_targets;
    pairs += pb[k].visible_pairs;
    if (k > 0) {
      EXPECT_EQ(pb[k].n_paths, 0);
    }
  }
  EXPECT_EQ(n_tree, full.n_tree);
  EXPECT_EQ(n_paths, full.n_paths);
  EXPECT_EQ(n_flat, full.n_flat);
  EXPECT_EQ(n_flat_targets, full.n_flat_targets);
  EXPECT_EQ(pairs, full.visible_pairs);

  // Schedule: each piece forward once, after its parent's forward, and backward once, after all
  // of its children's backwards; the most tokens held at once is peak_tokens. With recompute the
  // pieces that have child pieces hold only K/V rows until their backward: kept_peak_tokens.
  ASSERT_EQ((int)plan.schedule.size(), 2 * P);
  std::vector<int> state(P, 0);  // 0 not run, 1 forwarded, 2 backwarded
  int64_t held = 0, peak = 0, kept = 0, kept_peak = 0, recomputed = 0;
  for (const Step& s : plan.schedule) {
    const Piece& pc = plan.pieces[s.piece];
    if (s.phase == Phase::kForward) {
      ASSERT_EQ(state[s.piece], 0);
      if (pc.parent_piece >= 0) {
        ASSERT_EQ(state[pc.parent_piece], 1);
      }
      for (const GatewaySegment& g : pc.gateway) ASSERT_EQ(state[g.piece], 1);
      state[s.piece] = 1;
      held += pc.tokens;
      peak = std::max(peak, held);
      if (!pc.child_pieces.empty()) {
        kept += pc.tokens;
        recomputed += pc.tokens;
        kept_peak = std::max(kept_peak, kept);
      }
    } else {
      ASSERT_EQ(state[s.piece], 1);
      for (int c : pc.child_pieces) ASSERT_EQ(state[c], 2);
      state[s.piece] = 2;
      held -= pc.tokens;
      if (!pc.child_pieces.empty()) kept -= pc.tokens;
    }
  }
  EXPECT_EQ(held, 0);
  EXPECT_EQ(plan.peak_tokens, peak);
  EXPECT_EQ(plan.kept_peak_tokens, kept_peak);
  EXPECT_EQ(plan.recompute_tokens, recomputed);
}

TEST(SplitLongNodes, HandTreeIntoSingleTokens) {
  const Tree t = parse_tree_line(kHandTree, "f:1", 0);
  const Tree s = split_long_nodes(t, 1);
  // 0 [10 11] -> 0 [10], 1 [11]; 1 [12 13] -> 2, 3; 2 [14] -> 4; 3 [15 16] -> 5, 6; 4 [17] -> 7.
  ASSERT_EQ(s.nodes.size(), 8u);
  std::vector<int> parents;
  for (const Node& n : s.nodes) parents.push_back(n.parent);
  EXPECT_EQ(parents, std::vector<int>({-1, 0, 1, 2, 3, 3, 5, 1}));
  EXPECT_EQ(s.nodes[3].target_weight, D({4}));
  EXPECT_EQ(s.nodes[3].target_count, I({2}));  // token 13: weight 2 on each of the paths to leaves 2 and 3
  std::vector<int> ends;
  for (const Path& p : s.paths) ends.push_back(p.end_node);
  EXPECT_EQ(ends, std::vector<int>({4, 6, 7}));
  // Nodes that fit stay as they are.
  const Tree same = split_long_nodes(t, 2);
  ASSERT_EQ(same.nodes.size(), t.nodes.size());
  for (size_t i = 0; i < t.nodes.size(); ++i) EXPECT_EQ(same.nodes[i].tokens, t.nodes[i].tokens);
  EXPECT_THROW(split_long_nodes(t, 0), Error);
}

// (f) The split tree packs to the same tokens, positions, subtree ends and targets, and holds
// the raw record's (context, target, weight) map.
TEST(SplitLongNodes, KeepsThePackedBatch) {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 300; ++iter) {
    const auto raw = iter % 2 ? testing::random_tree(rng, 3)
                              : shaped_nodes(rng, (Shape)(rng() % 4), 1 + (int)(rng() % 16), 1 + (int)(rng() % 9));
    const Tree t = parse_nodes(raw);
    const PackedBatch a = pack({&t}, Packing::kTree);
    for (int64_t max_len : {1, 2, 3, 5, 8}) {
      const Tree s = split_long_nodes(t, max_len);
      for (const Node& n : s.nodes) ASSERT_LE((int64_t)n.tokens.size(), max_len);
      const PackedBatch b = pack({&s}, Packing::kTree);
      ASSERT_EQ(b.tokens, a.tokens);
      ASSERT_EQ(b.pos, a.pos);
      ASSERT_EQ(b.subtree_end, a.subtree_end);
      ASSERT_EQ(b.tgt_src, a.tgt_src);
      ASSERT_EQ(b.tgt_tok, a.tgt_tok);
      ASSERT_EQ(b.tgt_w, a.tgt_w);
      ASSERT_EQ(b.n_paths, a.n_paths);
      ASSERT_EQ(b.n_flat, a.n_flat);
      ASSERT_EQ(b.n_tree, a.n_tree);
      ASSERT_EQ(b.n_flat_targets, a.n_flat_targets);
      ASSERT_EQ(b.visible_pairs, a.visible_pairs);
      ASSERT_EQ(testing::loss_map(b), testing::tree_reference(raw));
      for (int64_t k = 0; k < t.n_paths(); ++k) {
        ASSERT_EQ(s.path_tokens(k), t.path_tokens(k));
        ASSERT_EQ(s.paths[k].target_weight, t.paths[k].target_weight);
      }
      const PackedBatch pa = pack({&t}, Packing::kPerPath);
      const PackedBatch pb = pack({&s}, Packing::kPerPath);
      ASSERT_EQ(pb.tokens, pa.tokens);
      ASSERT_EQ(pb.tgt_w, pa.tgt_w);
    }
  }
}

TEST(PlanPartition, HandTreeCapacity3) {
  // 0 [10 11]; 1 <- 0 [12 13]; 2 <- 1 [14]; 3 <- 1 [15 16]; 4 <- 0 [17]. Post-order residuals:
  // node 1: 2 + 1 + 2 = 5 > 3, cut node 3 (2) -> 3; node 0: 2 + 3 + 1 = 6 > 3, cut node 1 -> 3.
  const Tree t = parse_tree_line(kHandTree, "f:1", 0);
  const Partition p = plan_partition(t, 3);
  ASSERT_EQ(p.num_pieces(), 3);
  EXPECT_EQ(p.pieces[0].nodes, std::vector<int>({0, 4}));
  EXPECT_EQ(p.pieces[1].nodes, std::vector<int>({1, 2}));
  EXPECT_EQ(p.pieces[2].nodes, std::vector<int>({3}));
  EXPECT_EQ(p.pieces[0].child_pieces, std::vector<int>({1}));
  EXPECT_EQ(p.pieces[1].child_pieces, std::vector<int>({2}));
  EXPECT_EQ(p.pieces[1].parent_piece, 0);
  EXPECT_EQ(p.pieces[2].parent_piece, 1);
  EXPECT_EQ(p.pieces[0].tokens, 3);
  EXPECT_EQ(p.pieces[1].tokens, 3);
  EXPECT_EQ(p.pieces[2].tokens, 2);
  EXPECT_EQ(p.pieces[1].prefix_tokens, 2);
  EXPECT_EQ(p.pieces[2].prefix_tokens, 4);
  EXPECT_TRUE(p.pieces[0].gateway.empty());
  ASSERT_EQ(p.pieces[1].gateway.size(), 1u);
  EXPECT_EQ(p.pieces[1].gateway[0].piece, 0);
  EXPECT_EQ(p.pieces[1].gateway[0].row_begin, 0);
  EXPECT_EQ(p.pieces[1].gateway[0].row_end, 2);
  ASSERT_EQ(p.pieces[2].gateway.size(), 2u);
  EXPECT_EQ(p.pieces[2].gateway[1].piece, 1);
  EXPECT_EQ(p.pieces[2].gateway[1].row_begin, 0);
  EXPECT_EQ(p.pieces[2].gateway[1].row_end, 2);
  EXPECT_EQ(p.peak_tokens, 3 + 3 + 2);
  EXPECT_EQ(p.max_piece_tokens, 3);
  EXPECT_EQ(p.naive_tokens, 3 + (3 + 2) + (2 + 4));
  std::vector<std::pair<int, Phase>> steps;
  for (const Step& s : p.schedule) steps.push_back({s.piece, s.phase});
  using F = std::pair<int, Phase>;
  EXPECT_EQ(steps, std::vector<F>({{0, Phase::kForward}, {1, Phase::kForward}, {2, Phase::kForward},
                                   {2, Phase::kBackward}, {1, Phase::kBackward}, {0, Phase::kBackward}}));

  // Piece 0 holds [10 11] and [17]; node 1's first token 12 is not a target (mask 0).
  const PackedBatch b0 = pack_piece(t, p, 0);
  EXPECT_EQ(b0.tokens, I({10, 11, 17}));
  EXPECT_EQ(b0.pos, I({0, 1, 2}));
  EXPECT_EQ(b0.subtree_end, I({3, 3, 3}));
  EXPECT_EQ(b0.node_start, I({0, 2}));
  EXPECT_EQ(b0.node_parent, I({-1, 0}));
  EXPECT_EQ(b0.tgt_src, I({0, 1}));
  EXPECT_EQ(b0.tgt_tok, I({11, 17}));
  EXPECT_EQ(b0.tgt_w, D({3, 1}));
  EXPECT_EQ(b0.n_paths, 3);
  EXPECT_EQ(b0.n_flat, 14);
  EXPECT_EQ(b0.visible_pairs, 1 + 2 + 3);
  // Piece 1: [12 13] [14]; row 1 (token 13) is the branch point that predicts piece 2's 15.
  const PackedBatch b1 = pack_piece(t, p, 1);
  EXPECT_EQ(b1.tokens, I({12, 13, 14}));
  EXPECT_EQ(b1.pos, I({2, 3, 4}));
  EXPECT_EQ(b1.subtree_end, I({3, 3, 3}));
  EXPECT_EQ(b1.node_parent, I({-1, 0}));
  EXPECT_EQ(b1.tgt_src, I({0, 1, 1}));
  EXPECT_EQ(b1.tgt_tok, I({13, 14, 15}));
  EXPECT_EQ(b1.tgt_w, D({4, 1, 0.5}));
  EXPECT_EQ(b1.n_paths, 0);
  EXPECT_EQ(b1.n_tree, 3);
  EXPECT_EQ(b1.visible_pairs, 3 + 4 + 5);
  const PackedBatch b2 = pack_piece(t, p, 2);
  EXPECT_EQ(b2.tokens, I({15, 16}));
  EXPECT_EQ(b2.pos, I({4, 5}));
  EXPECT_EQ(b2.tgt_src, I({0}));
  EXPECT_EQ(b2.tgt_tok, I({16}));
  EXPECT_EQ(b2.tgt_w, D({0.5}));
  EXPECT_EQ(b2.visible_pairs, 5 + 6);
}

TEST(PlanPartition, OnePieceWhenTheTreeFits) {
  const Tree t = parse_rollouts_line(kHandRollouts, "f:1", 0);
  for (int64_t c : {7, 8, 1000}) {
    const Partition p = plan_partition(t, c);
    ASSERT_EQ(p.num_pieces(), 1);
    EXPECT_EQ(p.pieces[0].nodes, std::vector<int>({0, 1, 2}));
    EXPECT_EQ(p.peak_tokens, 7);
    EXPECT_EQ(p.naive_tokens, 7);
    const PackedBatch a = pack({&t}, Packing::kTree);
    const PackedBatch b = pack_piece(t, p, 0);
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.pos, a.pos);
    EXPECT_EQ(b.subtree_end, a.subtree_end);
    EXPECT_EQ(b.tgt_src, a.tgt_src);
    EXPECT_EQ(b.tgt_tok, a.tgt_tok);
    EXPECT_EQ(b.tgt_w, a.tgt_w);
    EXPECT_EQ(b.n_flat, a.n_flat);
  }
}

TEST(PlanPartition, RejectsLongNodesAndBadArguments) {
  const Tree t = parse_tree_line(kHandTree, "f:1", 0);
  try {
    plan_partition(t, 1);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "plan_partition: tree 't' node 0 has 2 tokens, expected <= capacity 1 (split it first with "
              "split_long_nodes(tree, capacity))");
  }
  EXPECT_THROW(plan_partition(t, 0), Error);
  const Partition p = plan_partition(t, 3);
  EXPECT_THROW(pack_piece(t, p, 3), Error);
  EXPECT_THROW(pack_piece(t, p, -1), Error);
  EXPECT_THROW(pack_piece(split_long_nodes(t, 1), p, 0), Error);
}

Tree one_node(int64_t len) { return testing::sequence_tree("long", std::vector<int32_t>(len, 7)); }

// Every node its own piece on a deep chain: piece k's gateway is k one-row ranges, n^2 / 2 in all.
// Within kMaxGatewayRanges the plan is built (fast: a range at a time); past it, planning stops
// with an error naming the setting before anything quadratic is allocated.
TEST(PlanPartition, GatewaysOfADeepChainAreBoundedWithAnError) {
  const Tree small = split_long_nodes(one_node(2000), 1);
  const Partition p = plan_partition(small, 1);
  ASSERT_EQ(p.num_pieces(), 2000);
  for (int k : {0, 1, 999, 1999}) {
    ASSERT_EQ((int)p.pieces[k].gateway.size(), k);
    for (int i = 0; i < k; ++i) {
      const GatewaySegment& g = p.pieces[k].gateway[i];
      ASSERT_EQ(g.piece, i);
      ASSERT_EQ(g.row_begin, 0);
      ASSERT_EQ(g.row_end, 1);
    }
  }
  const Tree deep = split_long_nodes(one_node(100000), 1);
  try {
    plan_partition(deep, 1);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'long': capacity 1 cuts its 100000 tokens into 100000 pieces whose gateways would list "
              "4999950000 ancestor row ranges in all (99999 for one piece), expected at most 16777216; use a "
              "larger capacity (partition.capacity_tokens)");
  }
  try {
    plan_segments(one_node(20000), 1);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'long': segment length 1 cuts its 20000 tokens into 20000 pieces whose gateways would list "
              "199990000 ancestor row ranges in all (19999 for one piece), expected at most 16777216; use a "
              "longer segment (segments.length)");
  }
  // The same chain at a capacity of 64 tokens: 1563 pieces, one range each from every ancestor piece.
  const Partition q = plan_partition(split_long_nodes(one_node(100000), 64), 64);
  EXPECT_EQ(q.num_pieces(), 1563);
  EXPECT_EQ(q.pieces.back().gateway.size(), 1562u);
}

// (a)-(d) on random trees of every shape at every capacity of capacities().
TEST(PlanPartitionRandom, PiecesReproduceTheUnpartitionedBatch) {
  int checked = 0, multi_piece = 0;
  for (const Tree& t : random_trees(17, 240)) {
    for (int64_t c : capacities(t)) {
      ASSERT_NO_FATAL_FAILURE(check_partition(t, c));
      ++checked;
      multi_piece += plan_partition(split_long_nodes(t, c), c).num_pieces() > 1;
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(multi_piece, checked / 2);
}

// The fewest pieces any cut set gives: every subset of the non-root nodes as piece roots.
int brute_force_min_pieces(const Tree& t, int64_t capacity) {
  const int n = (int)t.nodes.size();
  int best = n + 1;
  std::vector<int64_t> weight(n);
  for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
    const int pieces = 1 + __builtin_popcount(cuts);
    if (pieces >= best) continue;
    std::fill(weight.begin(), weight.end(), 0);
    bool ok = true;
    // Children after parents: add each node into its component root, found through the parent.
    std::vector<int> comp(n);
    for (int v = 0; v < n && ok; ++v) {
      comp[v] = (v == 0 || (cuts >> (v - 1)) & 1) ? v : comp[t.nodes[v].parent];
      weight[comp[v]] += (int64_t)t.nodes[v].tokens.size();
      ok = weight[comp[v]] <= capacity;
    }
    if (ok) best = pieces;
  }
  return best;
}

// (e) The greedy's piece count is the minimum on small trees (at most 12 nodes after splitting).
TEST(PlanPartitionRandom, GreedyMatchesBruteForceMinimum) {
  std::mt19937 rng(23);
  int compared = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const Tree t = parse_nodes(iter % 2 ? testing::random_tree(rng, 3)
                                        : shaped_nodes(rng, (Shape)(rng() % 4), 1 + (int)(rng() % 10),
                                                       1 + (int)(rng() % 6)));
    for (int64_t c : capacities(t)) {
      const Tree s = split_long_nodes(t, c);
      if (s.nodes.size() > 12) continue;
      ASSERT_EQ(plan_partition(s, c).num_pieces(), brute_force_min_pieces(s, c)) << "capacity " << c;
      ++compared;
    }
  }
  EXPECT_GT(compared, 1000);
}

TEST(PartitionStats, HandExamples) {
  const std::vector<Tree> trees = {parse_rollouts_line(kHandRollouts, "f:1", 0), parse_tree_line(kHandTree, "f:2", 0)};
  // Rollouts [1 2 3] [4 5] [6 7] at 3: both children cut (3 + 2 + 2): 3 pieces, naive 7 + 3 + 3,
  // peak 3 + 2. Tree format: see PlanPartition.HandTreeCapacity3.
  const nlohmann::json s = partition_stats(trees, 3);
  EXPECT_EQ(s["capacity"], 3);
  EXPECT_EQ(s["trees"], 2);
  EXPECT_EQ(s["pieces"], 3 + 3);
  EXPECT_EQ(s["n_flat"], 18 + 14);
  EXPECT_EQ(s["n_tree"], 7 + 8);
  EXPECT_EQ(s["tokens_with_gateways"], 7 + 8);
  EXPECT_EQ(s["tokens_naive"], 13 + 14);
  EXPECT_EQ(s["peak_tokens"], 8);
  EXPECT_EQ(s["max_piece_tokens"], 3);
  // Capacity 1 splits to single tokens: 15 pieces; naive adds every token's depth.
  const nlohmann::json one = partition_stats(trees, 1);
  EXPECT_EQ(one["pieces"], 15);
  EXPECT_EQ(one["tokens_with_gateways"], 15);
  EXPECT_EQ(one["tokens_naive"], (7 + 0 + 1 + 2 + 3 + 4 + 3 + 4) + (8 + 0 + 1 + 2 + 3 + 4 + 4 + 5 + 2));
  EXPECT_EQ(one["peak_tokens"], 6);
  EXPECT_EQ(one["max_piece_tokens"], 1);
  EXPECT_THROW(partition_stats(trees, 0), Error);
}

// The published example's totals: about 164k flattened, 83k unique, 102k naive. The generated
// comb lands within 1% of each at capacity 32768.
TEST(PartitionStats, PublishedExampleTotals) {
  const SyntheticSpec spec = published_example_spec();
  std::vector<Tree> trees;
  for (const std::string& line : generate_jsonl(spec)) trees.push_back(parse_tree_line(line, "gen:1", spec.vocab_size));
  ASSERT_EQ(trees.size(), 1u);
  const nlohmann::json s = partition_stats(trees, kPublishedExampleCapacity);
  EXPECT_EQ(s["capacity"], 32768);
  EXPECT_EQ(s["n_flat"], 163584);
  EXPECT_EQ(s["n_tree"], 82688);
  EXPECT_EQ(s["tokens_with_gateways"], 82688);
  EXPECT_EQ(s["tokens_naive"], 102144);
  EXPECT_EQ(s["pieces"], 3);
  EXPECT_EQ(s["max_piece_tokens"], 32768);
  EXPECT_EQ(s["peak_tokens"], 82688);  // the pieces form one chain along the trunk
  EXPECT_NEAR(s["n_flat"].get<double>() / 164000.0, 1.0, 0.01);
  EXPECT_NEAR(s["n_tree"].get<double>() / 83000.0, 1.0, 0.01);
  EXPECT_NEAR(s["tokens_naive"].get<double>() / 102000.0, 1.0, 0.01);
  // The plan itself, on the exactness contract's cheap parts.
  const Tree split = split_long_nodes(trees[0], kPublishedExampleCapacity);
  const Partition p = plan_partition(split, kPublishedExampleCapacity);
  std::vector<int64_t> tokens, prefix;
  for (const Piece& pc : p.pieces) tokens.push_back(pc.tokens), prefix.push_back(pc.prefix_tokens);
  EXPECT_EQ(tokens, std::vector<int64_t>({17152, 32768, 32768}));
  EXPECT_EQ(prefix, std::vector<int64_t>({0, 8960 + 256, 8960 + 5 * 256}));
  int64_t targets = 0;
  for (int k = 0; k < p.num_pieces(); ++k) targets += (int64_t)pack_piece(split, p, k).tgt_src.size();
  EXPECT_EQ(targets, (int64_t)pack({&split}, Packing::kTree).tgt_src.size());
}

// An episode of `steps` steps, `cameras` frames a step (3 rows each), a state and two action ids.
Tree media_tree(int steps, int cameras, int window) {
  Episode ep;
  ep.id = "ep";
  ep.instruction = {5, 6};
  for (int s = 0; s < steps; ++s) {
    EpisodeStep st;
    for (int c = 0; c < cameras; ++c) st.images.push_back("s" + std::to_string(s) + "c" + std::to_string(c) + ".png");
    st.state = {0.25f * s, -1.0f};
    st.action_ids = {20 + s, 30 + s};
    ep.steps.push_back(st);
  }
  EpisodeTreeSpec spec;
  spec.tokens_per_frame = 3;
  spec.image_token = 1;
  spec.state_token = 2;
  spec.window = window;
  return episode_tree(ep, 0, nullptr, spec);
}

// Episode trees (frame slots, state rows) at capacities from one frame up: no cut falls inside a
// frame; the split tree packs to the same rows, slots, frames and states; and the pieces' batches
// together hold every slot (showing its frame) and state row exactly once, at the whole batch's rows.
TEST(PartitionMedia, PiecesHoldWholeFramesAndEveryMediaRowOnce) {
  int multi = 0;
  for (int window : {0, 2})
    for (int cameras : {1, 2}) {
      const Tree t = media_tree(5, cameras, window);
      const PackedBatch a = pack({&t}, Packing::kTree);
      // Whole batch: row -> the file of the frame its slot shows, or the state's first value.
      std::map<int32_t, std::string> slot_file;
      for (size_t k = 0; k < a.slot_row.size(); ++k) slot_file[a.slot_row[k]] = a.frames[a.slot_frame[k]].path;
      std::map<int32_t, std::vector<float>> state_at;
      for (size_t k = 0; k < a.state_row.size(); ++k)
        state_at[a.state_row[k]] = {a.state.begin() + 2 * k, a.state.begin() + 2 * k + 2};
      for (int64_t cap : {int64_t(3), int64_t(4), int64_t(5), int64_t(7), int64_t(11), t.n_tree() / 2 + 1,
                          t.n_tree()}) {
        const Tree s = split_long_nodes(t, cap);
        for (const Node& n : s.nodes) ASSERT_LE((int64_t)n.tokens.size(), cap);
        const PackedBatch b = pack({&s}, Packing::kTree);
        ASSERT_NO_THROW(check_packed_batch(b, 64)) << "capacity " << cap;  // slots inside one node each
        ASSERT_EQ(b.tokens, a.tokens);
        ASSERT_EQ(b.pos, a.pos);
        ASSERT_EQ(b.tgt_src, a.tgt_src);
        ASSERT_EQ(b.slot_row, a.slot_row);
        ASSERT_EQ(b.slot_frame, a.slot_frame);
        ASSERT_EQ(b.state_row, a.state_row);
        ASSERT_EQ(b.state, a.state);
        const Partition plan = plan_partition(s, cap);
        multi += plan.num_pieces() > 1;
        // Each split node's first row in the whole batch (pack lays nodes out in this preorder).
        std::vector<int32_t> row(s.nodes.size());
        int32_t next = 0;
        for (int v : s.preorder()) row[v] = next, next += (int32_t)s.nodes[v].tokens.size();
        std::map<int32_t, std::string> seen_slots;
        std::map<int32_t, std::vector<float>> seen_states;
        int64_t tower_runs = 0;
        for (int k = 0; k < plan.num_pieces(); ++k) {
          const PackedBatch p = pack_piece(s, plan, k);
          tower_runs += (int64_t)p.frames.size();
          ASSERT_NO_THROW(check_packed_batch(p, 64)) << "capacity " << cap << " piece " << k;
          std::vector<int32_t> global(p.n_tokens);  // piece row -> whole-batch row
          for (int i = 0; i < p.num_nodes(); ++i)
            for (int32_t j = 0; j < p.node_len[i]; ++j) global[p.node_start[i] + j] = row[plan.pieces[k].nodes[i]] + j;
          std::set<std::string> files;
          for (size_t q = 0; q < p.slot_row.size(); ++q) {
            ASSERT_TRUE(seen_slots.emplace(global[p.slot_row[q]], p.frames[p.slot_frame[q]].path).second);
            files.insert(p.frames[p.slot_frame[q]].path);
          }
          EXPECT_EQ(files.size(), p.frames.size()) << "each of the piece's frames once, every one shown";
          for (size_t q = 0; q < p.state_row.size(); ++q)
            ASSERT_TRUE(seen_states.emplace(global[p.state_row[q]], std::vector<float>(p.state.begin() + 2 * q,
                                                                                       p.state.begin() + 2 * q + 2))
                            .second);
        }
        EXPECT_EQ(seen_slots, slot_file) << "capacity " << cap;
        EXPECT_EQ(seen_states, state_at) << "capacity " << cap;
        // stats --capacity counts the same tower runs, and the whole tree's distinct frames.
        const nlohmann::json st = partition_stats({t}, cap);
        EXPECT_EQ(st.at("frames").at("tower_runs").get<int64_t>(), tower_runs) << "capacity " << cap;
        EXPECT_EQ(st.at("frames").at("unique").get<int64_t>(), (int64_t)a.frames.size()) << "capacity " << cap;
        if (window > 0 && cap <= 5) EXPECT_GT(tower_runs, (int64_t)a.frames.size()) << "frames shown in two pieces";
      }
    }
  EXPECT_GT(multi, 20);
}

// Segments on episode trees (plan_segments): a boundary may fall inside a frame slot, which then
// becomes one part a segment (FrameSlot::first, count). At every segment length, the pieces'
// batches together show every row of every slot once, as the same token of the same frame as the
// whole batch, and every state row once.
TEST(PartitionMedia, SegmentsCutSlotsIntoPartsThatShowEachRowOnce) {
  int parts = 0;
  for (int window : {0, 2})
    for (int cameras : {1, 2}) {
      const Tree t = media_tree(5, cameras, window);
      const PackedBatch a = pack({&t}, Packing::kTree);
      std::map<int32_t, std::pair<std::string, int>> shows;  // whole-batch row -> (frame file, token)
      for (size_t k = 0; k < a.slot_row.size(); ++k)
        for (int i = 0; i < a.tokens_per_frame; ++i) shows[a.slot_row[k] + i] = {a.frames[a.slot_frame[k]].path, i};
      std::set<int32_t> states(a.state_row.begin(), a.state_row.end());
      for (int64_t length = 1; length <= 8; ++length) {
        const SegmentPlan plan = plan_segments(t, length);
        ASSERT_NO_THROW(plan.split.validate()) << "length " << length;
        std::vector<int32_t> row(plan.split.nodes.size());
        int32_t next = 0;
        for (int v : plan.split.preorder()) row[v] = next, next += (int32_t)plan.split.nodes[v].tokens.size();
        std::map<int32_t, std::pair<std::string, int>> seen;
        std::set<int32_t> seen_states;
        for (int k = 0; k < plan.pieces.num_pieces(); ++k) {
          const PackedBatch p = pack_piece(plan.split, plan.pieces, k);
          ASSERT_NO_THROW(check_packed_batch(p, 64)) << "length " << length << " piece " << k;
          std::vector<int32_t> global(p.n_tokens);
          for (int i = 0; i < p.num_nodes(); ++i)
            for (int32_t j = 0; j < p.node_len[i]; ++j)
              global[p.node_start[i] + j] = row[plan.pieces.pieces[k].nodes[i]] + j;
          for (size_t q = 0; q < p.slot_row.size(); ++q) {
            parts += p.slot_rows(q) < p.tokens_per_frame;
            for (int i = 0; i < p.slot_rows(q); ++i)
              ASSERT_TRUE(seen.emplace(global[p.slot_row[q] + i],
                                       std::make_pair(p.frames[p.slot_frame[q]].path, p.slot_first_token(q) + i))
                              .second)
                  << "length " << length << " piece " << k << " slot " << q;
          }
          for (int32_t r : p.state_row) ASSERT_TRUE(seen_states.insert(global[r]).second);
        }
        EXPECT_EQ(seen, shows) << "length " << length;
        EXPECT_EQ(seen_states, states) << "length " << length;
      }
    }
  EXPECT_GT(parts, 50) << "boundaries inside slots";
}

TEST(PartitionMedia, ACapacityBelowAFrameIsAnError) {
  const Tree t = media_tree(2, 1, 0);
  try {
    split_long_nodes(t, 2);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tree 'ep' has frames of 3 rows; a piece of at most 2 tokens cannot hold one (expected a capacity >= 3)");
  }
}

}  // namespace
}  // namespace tt::data
