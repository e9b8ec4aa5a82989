// Checks of the training data against the run config, once per tree when the trainer loads it.
//
// - Positions: a token's position id is its depth in the tree (the tokens before it on its path),
//   the same under tree and per-path packing and in partition pieces, so a tree whose longest
//   root-to-node chain holds more than model.max_position_embeddings tokens is an error naming
//   the key and the tree.
// - Targets: a tree every loss_mask of which is 0 adds nothing to the loss but its paths still
//   count in the path_mean normaliser: a warning with the count. No target at all is an error, and
//   so is data whose every target weighs 0 (weights all 0, or summing to 0 on every token).
#pragma once

#include <string>
#include <vector>

#include "data/tree.h"
#include "trainer/config.h"

namespace tt::trainer {

// Throws tt::Error for the errors above; returns the warnings (one message each) for the caller
// to log.
std::vector<std::string> check_training_data(const std::vector<data::Tree>& trees, const RunConfig& cfg);


}  // namespace tt::trainer
