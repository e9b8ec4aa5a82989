// Segmented training of trees (model/segments.h) equals segmented training of every path on its
// own, with segment boundaries inside the trees (segments of 2 and 3 tokens cut through nodes,
// branch points and one-token nodes): loss, every parameter's gradient and the parameters after
// one AdamW step, for every shape of tree_shapes(), with and without retrieval, K = 1 and 2.
// And the leakage suite on segmented trees: changing any subtree changes no logit outside it
// (bitwise), also through the carried tail and the retrieval pool, which hold a piece's own
// ancestors only.
//
// Tolerance rule as in tree_vs_path_test: fp64 sums in different groupings agree to relative
// 1e-10. Leakage is checked bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/packing.h"
#include "data/partition.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "model/segments.h"
#include "tests/equivalence/random_trees.h"

namespace tt {
namespace {

using testing::max_abs;
using testing::max_diff;

model::ModelConfig config() {
  model::ModelConfig c;
  c.architecture = "qwen3";
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.initializer_range = 0.3;
  return c;
}

struct Result {
  double loss = 0;
  std::vector<double> grads, stepped;
};

Result run(model::Model<double>& m, const model::SegmentConfig& cfg, const std::vector<data::Tree>& trees,
           double scale) {
  m.zero_grad();
  Result r;
  for (const data::Tree& t : trees) r.loss += model::forward_backward_segmented(m, cfg, data::plan_segments(t, cfg.length), scale);
  r.grads.assign(m.grads(), m.grads() + m.num_params());
  r.stepped = testing::params_after_adamw_step(m);
  return r;
}

std::vector<data::Tree> random_trees(const testing::TreeShape& shape, bool rollouts, int count, uint64_t seed) {
  testing::Rng rng(seed);
  std::vector<data::Tree> trees;
  for (int i = 0; i < count; ++i) {
    std::string id = "s" + std::to_string(i);
    std::string line = rollouts ? testing::random_rollouts_line(shape, 32, rng, id)
                                : testing::random_tree_line(shape, 32, rng, id);
    trees.push_back(rollouts ? data::parse_rollouts_line(line, id, 32) : data::parse_tree_line(line, id, 32));
  }
  return trees;
}

// Segment settings: tails of 1 and all-but-one rows, retrieval in one layer for KV head 1.
std::vector<model::SegmentConfig> settings() {
  std::vector<model::SegmentConfig> out;
  model::SegmentConfig a;
  a.length = 3;
  a.tail = 2;
  a.tbptt = 1;
  out.push_back(a);
  model::SegmentConfig b;
  b.length = 2;
  b.tail = 1;
  b.tbptt = 2;
  b.long_range = {{1}, {1}, 2};
  out.push_back(b);
  model::SegmentConfig c = a;
  c.long_range = {{0, 1}, {0}, 4};
  out.push_back(c);
  return out;
}

struct Case {
  testing::TreeShape shape;
  bool rollouts;
};

class SegmentedTrees : public ::testing::TestWithParam<Case> {};

TEST_P(SegmentedTrees, TreeEqualsEveryPathSegmentedInFp64) {
  const Case& c = GetParam();
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    const std::vector<data::Tree> trees = random_trees(c.shape, c.rollouts, 2, seed * 7919);
    std::vector<data::Tree> paths;
    for (const data::Tree& t : trees)
      for (int64_t k = 0; k < t.n_paths(); ++k) paths.push_back(data::path_tree(t, k));
    model::Model<double> m(config());
    m.init(seed);
    const double scale = 1.0 / (double)paths.size();
    int pieces = 0;
    for (const data::Tree& t : trees) pieces += data::plan_segments(t, 2).pieces.num_pieces();
    EXPECT_GT(pieces, (int)trees.size()) << "segment boundaries must fall inside the trees";
    for (const model::SegmentConfig& cfg : settings()) {
      const Result tree = run(m, cfg, trees, scale);
      const Result per_path = run(m, cfg, paths, scale);
      const std::string what = "S=" + std::to_string(cfg.length) + " M=" + std::to_string(cfg.tail) +
                               " K=" + std::to_string(cfg.tbptt) + " R=" + std::to_string(cfg.long_range.retrieve);
      EXPECT_NEAR(tree.loss, per_path.loss, 1e-10 * std::max(1.0, std::fabs(per_path.loss))) << what;
      EXPECT_LE(max_diff(tree.grads, per_path.grads), 1e-10 * std::max(1e-3, max_abs(per_path.grads))) << what;
      EXPECT_LE(max_diff(tree.stepped, per_path.stepped), 1e-10 * max_abs(per_path.stepped)) << what;
    }
  }
}

// Changing the tokens of any subtree of the split tree changes no logit of a row outside it.
TEST_P(SegmentedTrees, ChangingASubtreeMovesNoLogitOutsideIt) {
  const Case& c = GetParam();
  const std::vector<data::Tree> trees = random_trees(c.shape, c.rollouts, 1, 4241);
  model::Model<double> m(config());
  m.init(3);
  int checked = 0;
  for (const model::SegmentConfig& cfg : settings()) {
    const data::SegmentPlan plan = data::plan_segments(trees[0], cfg.length);
    const data::Tree& split = plan.split;
    const std::vector<std::vector<double>> base = model::segmented_piece_logits(m, cfg, plan);
    const int V = 32;
    for (int v = 1; v < (int)split.nodes.size(); ++v) {
      std::vector<char> inside(split.nodes.size(), 0);
      inside[v] = 1;
      for (int u = v + 1; u < (int)split.nodes.size(); ++u) inside[u] = split.nodes[u].parent >= 0 && inside[split.nodes[u].parent];
      data::SegmentPlan changed = plan;
      for (int u = 0; u < (int)split.nodes.size(); ++u)
        if (inside[u])
          for (int32_t& x : changed.split.nodes[u].tokens) x = (x + 7) % V;
      const std::vector<std::vector<double>> got = model::segmented_piece_logits(m, cfg, changed);
      int outside = 0;
      for (int k = 0; k < plan.pieces.num_pieces(); ++k) {
        const data::Piece& piece = plan.pieces.pieces[k];
        std::vector<int> node_of_row;
        for (int u : piece.nodes) node_of_row.insert(node_of_row.end(), split.nodes[u].tokens.size(), u);
        std::vector<int32_t> rows = model::segment_batch(cfg, plan, k).tgt_src;
        std::sort(rows.begin(), rows.end());
        rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
        ASSERT_EQ(base[k].size(), rows.size() * V);
        for (size_t r = 0; r < rows.size(); ++r) {
          if (inside[node_of_row[rows[r]]]) continue;
          ++outside;
          for (int x = 0; x < V; ++x)
            ASSERT_EQ(got[k][r * V + x], base[k][r * V + x])
                << "split node " << v << " changed; piece " << k << " row " << rows[r] << " moved (S="
                << cfg.length << ")";
        }
      }
      checked += outside;
    }
  }
  EXPECT_GT(checked, 0) << "some rows lie outside the changed subtrees";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& s : testing::tree_shapes())
    for (bool rollouts : {false, true}) out.push_back({s, rollouts});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, SegmentedTrees, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.shape.name) + (i.param.rollouts ? "_Rollouts" : "_Tree");
                         });

}  // namespace
}  // namespace tt
