// Training data against the run config (see data_checks.h).
#include "trainer/data_checks.h"

#include "base/check.h"

namespace tt::trainer {

std::vector<std::string> check_training_data(const std::vector<data::Tree>& trees, const RunConfig& cfg) {
  const int64_t max_pos = cfg.model.max_position_embeddings;
  int64_t untargeted = 0, untargeted_paths = 0, paths = 0;
  bool weighted = false;  // some target's summed weight is not 0
  for (const data::Tree& t : trees) {
    for (const data::Node& n : t.nodes)
      for (double w : n.target_weight) weighted = weighted || w != 0.0;
    const int64_t depth = t.max_depth();
    if (depth > max_pos)
      throw Error(str(cfg.where("model.max_position_embeddings"), ": model.max_position_embeddings is ", max_pos,
                      ", but tree '", t.id, "' of ", cfg.data.path, " has a path of ", depth, " tokens (positions 0..",
                      depth - 1, ")"));
    paths += t.n_paths();
    if (t.n_flat_targets() == 0) {
      ++untargeted;
      untargeted_paths += t.n_paths();
    }
  }
  if (untargeted == (int64_t)trees.size())
    throw Error(str(cfg.where("data.path"), ": data.path ", cfg.data.path,
                    ": no token is a target (every loss_mask is 0 in all ", trees.size(), " trees): nothing to train"));
  if (!weighted)
    throw Error(str(cfg.where("data.path"), ": data.path ", cfg.data.path, ": every target's weight is 0 in all ",
                    trees.size(), " trees (the weights of the sequences or nodes over each target sum to 0): the loss "
                    "and every gradient would be 0, nothing to train"));
  std::vector<std::string> out;
  if (untargeted > 0)
    out.push_back(str("data: ", untargeted, " of ", trees.size(), " trees (", untargeted_paths, " of ", paths,
                      " paths) have no target (every loss_mask is 0): they add no loss",
                      cfg.train.loss_norm == "path_mean" ? ", but their paths count in the path_mean normaliser"
                                                         : " (a step that draws only such trees has a zero gradient)"));
  return out;
}

}  // namespace tt::trainer
