// Dataset statistics: how much a tree saves over flattened paths.
// POR (potential overlap ratio) = 1 - N_tree / N_flat.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "data/tree.h"

namespace tt::data {

// {"trees", "paths", "nodes", "n_flat", "n_tree", "por", "n_flat_targets", "visible_pairs_tree",
//  "visible_pairs_flat", "max_depth", "max_tree_tokens"}
nlohmann::json tree_stats(const std::vector<Tree>& trees);

}  // namespace tt::data
