// Tree costs, LPT balancing and greedy packing (see shard.h).
#include "distributed/shard.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace tt::distributed {

model::Work tree_work(const data::Tree& tree, data::Packing packing) {
  model::Work w;
  // Media (episode trees): the tower runs once per distinct frame a batch shows (tree packing:
  // the tree's; per_path: each path's own), the state projection once per state row.
  const data::TreeMedia& media = tree.media;
  if (packing == data::Packing::kPerPath) {
    for (int64_t k = 0; k < tree.n_paths(); ++k) {
      const data::Path& path = tree.paths[k];
      const int64_t len = (int64_t)path.target_weight.size();
      w.tokens += len;
      w.visible_pairs += len * (len + 1) / 2;
      for (int64_t i = 1; i < len; ++i) w.head_rows += path.is_target(i);  // row i - 1 predicts token i
    }
    if (media.empty()) return w;
    const data::NodeMedia nm(tree);
    std::vector<char> shown(media.frames.size());
    for (int64_t k = 0; k < tree.n_paths(); ++k) {
      std::fill(shown.begin(), shown.end(), 0);
      for (int v : tree.path_nodes(k)) {
        for (int s : nm.slots[v]) w.frames += !shown[media.slots[s].frame], shown[media.slots[s].frame] = 1;
        w.state_rows += (int64_t)nm.states[v].size();
      }
    }
    return w;
  }
  w.frames = tree.frames_shown();
  w.state_rows = (int64_t)media.states.size();
  // Node v's token j sits at depth[v] + j and sees itself and every token above it. Token j > 0
  // is predicted by the row before it; token 0 by the parent's last row, shared by its children.
  const size_t n = tree.nodes.size();
  std::vector<int64_t> depth(n, 0);
  std::vector<char> last_row_predicts(n, 0);
  for (size_t v = 0; v < n; ++v) {
    const data::Node& node = tree.nodes[v];
    const int p = node.parent;
    if (p >= 0) depth[v] = depth[p] + (int64_t)tree.nodes[p].tokens.size();
    const int64_t len = (int64_t)node.tokens.size();
    w.tokens += len;
    w.visible_pairs += len * (depth[v] + 1) + len * (len - 1) / 2;
    for (int64_t j = 1; j < len; ++j) w.head_rows += node.target_count[j] > 0;
    if (p >= 0 && len > 0 && node.target_count[0] > 0) last_row_predicts[p] = 1;
  }
  for (size_t v = 0; v < n; ++v) w.head_rows += last_row_predicts[v];
  return w;
}

double tree_cost(const model::Architecture& arch, const data::Tree& tree, data::Packing packing) {
  return arch.flops(tree_work(tree, packing), model::Pass::kTrain).executed;
}

double Shards::imbalance() const {
  if (load.empty()) return 1.0;
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (!(total > 0)) return 1.0;
  return *std::max_element(load.begin(), load.end()) / (total / (double)load.size());
}

Shards balance(const std::vector<double>& cost, int world) {
  TT_CHECK(world >= 1, "balance: world size ", world);
  Shards s;
  s.items.resize(world);
  s.load.assign(world, 0.0);
  std::vector<int64_t> order(cost.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  for (int64_t i : order) {
    const int r = (int)(std::min_element(s.load.begin(), s.load.end()) - s.load.begin());  // first minimum
    s.items[r].push_back(i);
    s.load[r] += cost[i];
  }
  for (auto& v : s.items) std::sort(v.begin(), v.end());
  return s;
}

std::vector<std::vector<int64_t>> pack_greedy(const std::vector<int64_t>& sizes, int64_t max_tokens) {
  std::vector<std::vector<int64_t>> groups;
  int64_t used = 0;
  for (int64_t i = 0; i < (int64_t)sizes.size(); ++i) {
    if (groups.empty() || used + sizes[i] > max_tokens) {
      groups.emplace_back();
      used = 0;
    }
    groups.back().push_back(i);
    used += sizes[i];
  }
  return groups;
}

}  // namespace tt::distributed
