// Tree costs, LPT balancing and greedy packing (see shard.h).
#include "distributed/shard.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace tt::distributed {

TreeWork tree_work(const data::Tree& tree, data::Packing packing) {
  TreeWork w;
  if (packing == data::Packing::kPerPath) {
    for (int64_t k = 0; k < tree.n_paths(); ++k) {
      const int64_t len = (int64_t)tree.path_tokens(k).size();
      w.tokens += len;
      w.visible_pairs += len * (len + 1) / 2;
    }
    return w;
  }
  // Node v's token j sits at depth[v] + j and sees itself and every token above it.
  std::vector<int64_t> depth(tree.nodes.size(), 0);
  for (size_t v = 0; v < tree.nodes.size(); ++v) {
    const int p = tree.nodes[v].parent;
    if (p >= 0) depth[v] = depth[p] + (int64_t)tree.nodes[p].tokens.size();
    const int64_t len = (int64_t)tree.nodes[v].tokens.size();
    w.tokens += len;
    w.visible_pairs += len * (depth[v] + 1) + len * (len - 1) / 2;
  }
  return w;
}

double attention_pair_weight(const model::ModelConfig& c) {
  const double q = (double)c.num_attention_heads * c.head_dim;
  const double kv = (double)c.num_key_value_heads * c.head_dim;
  // Multiply-adds per token: q, k, v, o projections and the SwiGLU MLP per layer, plus the head.
  const double linear = c.num_hidden_layers * (c.hidden_size * (q + 2 * kv) + q * c.hidden_size +
                                               3.0 * c.hidden_size * c.intermediate_size) +
                        (double)c.hidden_size * c.vocab_size;
  // Multiply-adds per visible pair: one score (q . k) and one value row (p * v) per head, per layer.
  const double pair = c.num_hidden_layers * 2.0 * q;
  return linear > 0 ? pair / linear : 0.0;
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
