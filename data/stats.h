// Dataset statistics: how much a tree saves over flattened paths, and what partitioning a tree
// into pieces of bounded size costs with and without gateways.
// POR (potential overlap ratio) = 1 - N_tree / N_flat.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "data/tree.h"

namespace tt::data {

// {"trees", "paths", "nodes", "n_flat", "n_tree", "por", "n_flat_targets", "visible_pairs_tree",
//  "visible_pairs_flat", "max_depth", "max_tree_tokens"}
//  - por: 1 - n_tree / n_flat (0 when there are no tokens).
//  - visible_pairs_tree: sum over unique tokens of (depth + 1), the (query, key) pairs of tree
//    attention; visible_pairs_flat: sum over paths of L (L + 1) / 2, those of per-path attention.
//  - max_depth: the longest path in tokens (the largest position id + 1).
//  - max_tree_tokens: the largest n_tree of one tree (the smallest batch budget for kTree).
nlohmann::json tree_stats(const std::vector<Tree>& trees);

// Redundancy of partitioned training at a capacity of C tokens per piece (data/partition.h):
// each tree is split with split_long_nodes(tree, C) and planned with plan_partition(split, C).
// {"capacity", "trees", "pieces", "n_flat", "n_tree", "tokens_with_gateways", "tokens_naive",
//  "peak_tokens", "max_piece_tokens"}
//  - pieces: summed over trees.
//  - tokens_with_gateways: tokens computed when pieces read their ancestors through gateways
//    (sum of piece tokens, == n_tree); tokens_naive: when every piece re-runs its ancestor chain
//    (sum over pieces of tokens + prefix_tokens).
//  - peak_tokens: the largest, over trees, of the most tokens held at once by the DFS schedule
//    (max over root-to-leaf piece chains of the summed piece tokens); max_piece_tokens: the
//    largest piece (<= capacity).
//  - frames (episode trees only): {"unique", "tower_runs"}: the vision tower's runs on the trees
//    whole (each distinct frame a slot shows, once) and partitioned (once per piece that shows it).
// Throws tt::Error for capacity < 1.
nlohmann::json partition_stats(const std::vector<Tree>& trees, int64_t capacity);

}  // namespace tt::data
