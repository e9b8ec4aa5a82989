// Partitioned training equals unpartitioned training: loss, every parameter's gradient and the
// parameters after one AdamW step, for dense models and a hybrid (Gated DeltaNet state and conv
// tails crossing the cuts), on random trees of every shape in tree_shapes(), many
// capacities (1 token, smaller than a node, a few nodes, half the tree, the whole tree) and
// several trees per batch; and the tokens processed equal N_tree (no ancestor is re-run as a
// naive partitioner would).
// With partition.recompute (non-leaf pieces keep only their K/V rows and run their forward again
// before their backward) the loss and gradients are bitwise those without it.
//
// Tolerance rule as in tree_vs_path_test: fp64 sums in different groupings agree to relative
// 1e-10; fp32 partitioned may differ from the fp64 truth by at most 2x what fp32 unpartitioned
// does (plus a 1e-6 relative floor).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "data/packing.h"
#include "data/partition.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "model/partitioned.h"
#include "tests/equivalence/random_trees.h"

namespace tt {
namespace {

using testing::max_abs;
using testing::max_diff;

model::ModelConfig config(const std::string& arch) {
  model::ModelConfig c;
  if (arch == "hybrid") {  // Gated DeltaNet layers around gated attention: state and conv tails cross cuts
    c = config("qwen3");
    testing::make_qwen35_hybrid(c);
    c.num_hidden_layers = 3;
    c.layer_types = {"linear_attention", "full_attention", "linear_attention"};
    return c;
  }
  c.architecture = arch;
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
  int64_t processed = 0;
};

template <class T>
Result finish(model::Model<T>& m, double loss) {
  Result r;
  r.loss = loss;
  r.grads.assign(m.grads(), m.grads() + m.num_params());
  r.stepped = testing::params_after_adamw_step(m);
  return r;
}

template <class T>
Result unpartitioned(model::Model<T>& m, const std::vector<data::Tree>& trees, double scale) {
  std::vector<const data::Tree*> ptrs;
  for (const auto& t : trees) ptrs.push_back(&t);
  data::PackedBatch b = data::pack(ptrs, data::Packing::kTree);
  m.zero_grad();
  double loss = m.forward(b, scale);
  m.backward();
  Result r = finish(m, loss);
  r.processed = b.n_tokens;
  return r;
}

// recompute (partition.recompute): non-leaf pieces keep only their K/V rows (and offered states)
// and run their forward again before their backward.
template <class T>
Result partitioned(model::Model<T>& m, const std::vector<data::Tree>& trees, int64_t capacity, double scale,
                   bool recompute = false) {
  m.zero_grad();
  double loss = 0;
  int64_t processed = 0;
  for (const auto& t : trees) {
    data::Tree split = data::split_long_nodes(t, capacity);
    data::Partition plan = data::plan_partition(split, capacity);
    model::PartitionRunStats st;
    loss += model::forward_backward_partitioned(m, split, plan, scale, &st, recompute);
    EXPECT_EQ(st.pieces, plan.num_pieces());
    EXPECT_LE(st.peak_live_tokens, plan.peak_tokens);
    int64_t non_leaf = 0, largest = 0;
    int non_leaf_pieces = 0;  // with tokens: an empty piece runs no forward to keep rows from
    for (const data::Piece& p : plan.pieces) {
      if (!p.child_pieces.empty()) non_leaf += p.tokens, non_leaf_pieces += p.tokens > 0;
      largest = std::max<int64_t>(largest, p.tokens);
    }
    // Counted as the pieces ran (not from the plan): the flag reached the executor.
    EXPECT_EQ(st.pieces_recomputed, recompute ? non_leaf_pieces : 0) << "capacity " << capacity;
    if (recompute) {  // one piece's activations at a time; the chain's rows kept without them
      EXPECT_EQ(st.peak_live_tokens, largest) << "capacity " << capacity;
      EXPECT_EQ(st.peak_kept_tokens, plan.kept_peak_tokens) << "capacity " << capacity;
      EXPECT_EQ(st.tokens_recomputed, non_leaf) << "capacity " << capacity;
      EXPECT_EQ(st.tokens_recomputed, plan.recompute_tokens) << "capacity " << capacity;
    } else {
      EXPECT_EQ(st.peak_kept_tokens, 0);
      EXPECT_EQ(st.tokens_recomputed, 0);
    }
    processed += st.tokens_processed;
  }
  Result r = finish(m, loss);
  r.processed = processed;
  return r;
}

std::vector<data::Tree> random_trees(const testing::TreeShape& shape, bool rollouts, int count, uint64_t seed) {
  testing::Rng rng(seed);
  std::vector<data::Tree> trees;
  for (int i = 0; i < count; ++i) {
    std::string id = "p" + std::to_string(i);
    std::string line = rollouts ? testing::random_rollouts_line(shape, 32, rng, id)
                                : testing::random_tree_line(shape, 32, rng, id);
    trees.push_back(rollouts ? data::parse_rollouts_line(line, id, 32) : data::parse_tree_line(line, id, 32));
  }
  return trees;
}

struct Case {
  testing::TreeShape shape;
  bool rollouts;
  int trees;
};

class Partitioned : public ::testing::TestWithParam<Case> {};

// Every capacity of the fp64 check, on `seeds` seeds of the architectures `archs` cycles through.
void expect_partitioned_equals_unpartitioned(const Case& c, const std::vector<std::string>& archs, int seeds) {
  for (uint64_t seed = 1; seed <= (uint64_t)seeds; ++seed) {
    auto trees = random_trees(c.shape, c.rollouts, c.trees, seed * 104729 + c.trees);
    int64_t n_tree = 0, n_paths = 0, max_node = 1;
    for (const auto& t : trees) {
      n_tree += t.n_tree();
      n_paths += t.n_paths();
      for (const auto& n : t.nodes) max_node = std::max<int64_t>(max_node, (int64_t)n.tokens.size());
    }
    model::Model<double> m(config(archs[seed % archs.size()]));
    m.init(seed);
    const double scale = 1.0 / (double)n_paths;
    const Result ref = unpartitioned(m, trees, scale);
    for (int64_t cap : {int64_t(1), int64_t(2), std::max<int64_t>(1, max_node - 1), int64_t(5), n_tree / 2 + 1, n_tree}) {
      const Result got = partitioned(m, trees, cap, scale);
      EXPECT_EQ(got.processed, n_tree) << "capacity " << cap << ": every unique token computed exactly once";
      EXPECT_NEAR(got.loss, ref.loss, 1e-10 * std::max(1.0, std::fabs(ref.loss))) << "capacity " << cap;
      EXPECT_LE(max_diff(got.grads, ref.grads), 1e-10 * std::max(1e-3, max_abs(ref.grads))) << "capacity " << cap;
      EXPECT_LE(max_diff(got.stepped, ref.stepped), 1e-10 * max_abs(ref.stepped)) << "capacity " << cap;
      // Recomputing the non-leaf pieces runs the same operations on the same inputs: the same bits.
      const Result again = partitioned(m, trees, cap, scale, /*recompute=*/true);
      EXPECT_EQ(again.processed, n_tree) << "capacity " << cap;
      EXPECT_EQ(again.loss, got.loss) << "capacity " << cap << ", recompute";
      EXPECT_EQ(max_diff(again.grads, got.grads), 0.0) << "capacity " << cap << ", recompute";
    }
  }
}

TEST_P(Partitioned, LossGradientsAndUpdateMatchUnpartitionedInFp64) {
  expect_partitioned_equals_unpartitioned(GetParam(), {"llama", "qwen3"}, 3);
}

// A hybrid: the recurrent state and the conv window (4 taps: one-token nodes and capacities of 1
// and 2 make the window span several pieces) cross every cut, with their gradients relayed back.
TEST_P(Partitioned, HybridLossGradientsAndUpdateMatchUnpartitionedInFp64) {
  expect_partitioned_equals_unpartitioned(GetParam(), {"hybrid"}, 2);
}

TEST_P(Partitioned, Fp32PartitionedErrorWithinTwiceFp32Unpartitioned) {
  const Case& c = GetParam();
  auto trees = random_trees(c.shape, c.rollouts, c.trees, 777 + c.trees);
  int64_t n_paths = 0;
  for (const auto& t : trees) n_paths += t.n_paths();
  const double scale = 1.0 / (double)n_paths;
  for (const std::string arch : {"qwen3", "hybrid"}) {
    model::Model<double> ref(config(arch));
    ref.init(9);
    const Result truth = unpartitioned(ref, trees, scale);
    model::Model<float> m(config(arch));
    m.init(9);
    const Result base = unpartitioned(m, trees, scale);
    const Result got = partitioned(m, trees, 3, scale);
    auto tol = [](double err, double scale_) { return 2.0 * err + 1e-6 * scale_; };
    EXPECT_LE(std::fabs(got.loss - truth.loss), tol(std::fabs(base.loss - truth.loss), std::fabs(truth.loss))) << arch;
    EXPECT_LE(max_diff(got.grads, truth.grads), tol(max_diff(base.grads, truth.grads), max_abs(truth.grads))) << arch;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& s : testing::tree_shapes())
    for (bool rollouts : {false, true})
      for (int k : {1, 3}) out.push_back({s, rollouts, k});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Partitioned, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.shape.name) + (i.param.rollouts ? "_Rollouts_" : "_Tree_") +
                                  std::to_string(i.param.trees) + "Trees";
                         });

}  // namespace
}  // namespace tt
