// Dataset statistics (see stats.h for the fields; partitioning in partition.h).
#include "data/stats.h"

#include <algorithm>

#include "data/partition.h"
#include "base/check.h"

namespace tt::data {

nlohmann::json tree_stats(const std::vector<Tree>& trees) {
  int64_t paths = 0, nodes = 0, n_flat = 0, n_tree = 0, n_flat_targets = 0;
  int64_t pairs_tree = 0, pairs_flat = 0, max_depth = 0, max_tree_tokens = 0;
  for (const Tree& t : trees) {
    // end_depth[i]: tokens from the root through node i (parents come first).
    std::vector<int64_t> end_depth(t.nodes.size());
    for (size_t i = 0; i < t.nodes.size(); ++i) {
      const Node& node = t.nodes[i];
      const int64_t depth = node.parent >= 0 ? end_depth[node.parent] : 0;
      const int64_t len = (int64_t)node.tokens.size();
      end_depth[i] = depth + len;
      // sum_{j < len} (depth + j + 1)
      pairs_tree += len * depth + len * (len + 1) / 2;
    }
    for (const Path& p : t.paths) {
      const int64_t len = end_depth[p.end_node];
      pairs_flat += len * (len + 1) / 2;
      max_depth = std::max(max_depth, len);
    }
    paths += t.n_paths();
    nodes += (int64_t)t.nodes.size();
    n_flat += t.n_flat();
    n_tree += t.n_tree();
    n_flat_targets += t.n_flat_targets();
    max_tree_tokens = std::max(max_tree_tokens, t.n_tree());
  }
  nlohmann::json j;
  j["trees"] = (int64_t)trees.size();
  j["paths"] = paths;
  j["nodes"] = nodes;
  j["n_flat"] = n_flat;
  j["n_tree"] = n_tree;
  j["por"] = n_flat > 0 ? 1.0 - (double)n_tree / (double)n_flat : 0.0;
  j["n_flat_targets"] = n_flat_targets;
  j["visible_pairs_tree"] = pairs_tree;
  j["visible_pairs_flat"] = pairs_flat;
  j["max_depth"] = max_depth;
  j["max_tree_tokens"] = max_tree_tokens;
  return j;
}

nlohmann::json partition_stats(const std::vector<Tree>& trees, int64_t capacity) {
  TT_CHECK(capacity >= 1, "partition_stats: capacity = ", capacity, ", expected >= 1");
  int64_t pieces = 0, n_flat = 0, n_tree = 0, with_gateways = 0, naive = 0, peak = 0, max_piece = 0, kept = 0,
          recomputed = 0, unique_frames = 0, frame_runs = 0;
  bool media = false;
  for (const Tree& t : trees) {
    const Tree split = split_long_nodes(t, capacity);
    const Partition plan = plan_partition(split, capacity);
    frame_runs += tower_runs(split, plan);
    unique_frames += t.frames_shown();
    media = media || !t.media.slots.empty();
    pieces += plan.num_pieces();
    n_flat += t.n_flat();
    n_tree += t.n_tree();
    for (const Piece& p : plan.pieces) with_gateways += p.tokens;
    naive += plan.naive_tokens;
    peak = std::max(peak, plan.peak_tokens);
    max_piece = std::max(max_piece, plan.max_piece_tokens);
    kept = std::max(kept, plan.kept_peak_tokens);
    recomputed += plan.recompute_tokens;
  }
  nlohmann::json j;
  j["capacity"] = capacity;
  j["trees"] = (int64_t)trees.size();
  j["pieces"] = pieces;
  j["n_flat"] = n_flat;
  j["n_tree"] = n_tree;
  j["tokens_with_gateways"] = with_gateways;
  j["tokens_naive"] = naive;
  j["peak_tokens"] = peak;
  j["max_piece_tokens"] = max_piece;
  // partition.recompute: one piece's activations at a time, the K/V rows of the pieces with child
  // pieces kept along the chain, and those pieces' forward run twice.
  j["recompute"] = {{"peak_tokens", max_piece}, {"kept_peak_tokens", kept}, {"tokens_recomputed", recomputed}};
  // Episode trees: the vision tower's runs, once per distinct frame of a piece (a frame shown in
  // several pieces runs in each) against once per distinct frame of a tree unpartitioned.
  if (media) j["frames"] = {{"unique", unique_frames}, {"tower_runs", frame_runs}};
  return j;
}

}  // namespace tt::data
