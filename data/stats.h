// Dataset statistics: how much a tree saves over flattened paths.
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

}  // namespace tt::data
