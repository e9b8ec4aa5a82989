// Leakage: no token ever sees a sibling branch, and targets never enter the inputs.
//
// Each check packs a tree, changes some tokens, packs again, and compares the logits row by row.
// Rows whose visible context did not change must be bitwise identical (the CPU backend computes a
// row from its visible keys only, in a fixed order); rows whose context changed must differ.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "data/packing.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "tests/equivalence/random_trees.h"

namespace tt {
namespace {

struct SpecNode {
  int parent;
  std::vector<int> tokens;
};

// qwen3 (attention only) and qwen3_5_text (a Gated DeltaNet layer whose conv window and
// recurrent state must follow the tree, then gated attention).
model::ModelConfig config(const std::string& arch) {
  model::ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 24;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.initializer_range = 0.3;
  if (arch == "qwen3_5_text") testing::make_qwen35_hybrid(c);
  return c;
}

class Leakage : public ::testing::TestWithParam<std::string> {};

data::Tree make_tree(const std::vector<SpecNode>& nodes) {
  std::ostringstream os;
  os << "{\"id\": \"t\", \"nodes\": [";
  for (size_t i = 0; i < nodes.size(); ++i) {
    os << (i ? ", " : "") << "{\"parent\": " << nodes[i].parent << ", \"tokens\": [";
    for (size_t j = 0; j < nodes[i].tokens.size(); ++j) os << (j ? "," : "") << nodes[i].tokens[j];
    os << "]}";
  }
  os << "]}";
  return data::parse_tree_line(os.str(), "leakage_test", 24);
}

// Logits per (node, offset) of the tree, keyed by the input node index (packed node k is input
// node preorder[k]).
struct Logits {
  std::vector<std::vector<std::vector<double>>> by_node;  // [node][offset] -> (V)
};

Logits run(model::Model<double>& m, const std::vector<SpecNode>& nodes,
           data::ChildOrder child_order = data::ChildOrder::kLargestFirst) {
  data::Tree tree = make_tree(nodes);
  data::PackedBatch b = data::pack({&tree}, data::Packing::kTree, child_order);
  const std::vector<double> logits = m.infer(b, model::InferRequest::all_logits()).logits;
  const int64_t V = m.config().vocab_size;
  std::vector<int> order = tree.preorder(child_order);
  EXPECT_EQ((int)order.size(), b.num_nodes());
  Logits out;
  out.by_node.resize(nodes.size());
  for (int k = 0; k < b.num_nodes(); ++k) {
    int n = order[k];
    EXPECT_EQ(b.node_len[k], (int)nodes[n].tokens.size());
    for (int j = 0; j < b.node_len[k]; ++j) {
      const double* row = logits.data() + (int64_t)(b.node_start[k] + j) * V;
      out.by_node[n].emplace_back(row, row + V);
    }
  }
  return out;
}

bool in_subtree(const std::vector<SpecNode>& nodes, int n, int root) {
  for (; n >= 0; n = nodes[n].parent)
    if (n == root) return true;
  return false;
}

// Changes node `changed` from token offset `from` on; checks every row.
void expect_only_subtree_changes(model::Model<double>& m, std::vector<SpecNode> nodes, int changed, int from) {
  Logits before = run(m, nodes);
  for (size_t j = from; j < nodes[changed].tokens.size(); ++j)
    nodes[changed].tokens[j] = (nodes[changed].tokens[j] + 1 + (int)j) % 24;
  Logits after = run(m, nodes);
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (size_t j = 0; j < nodes[n].tokens.size(); ++j) {
      bool sees_change = in_subtree(nodes, (int)n, changed) && ((int)n != changed || (int)j >= from);
      if (sees_change) {
        EXPECT_NE(before.by_node[n][j], after.by_node[n][j])
            << "node " << n << " offset " << j << " should see the change in node " << changed;
      } else {
        EXPECT_EQ(before.by_node[n][j], after.by_node[n][j])
            << "node " << n << " offset " << j << " must not see node " << changed;
      }
    }
  }
}

// root(0) -> A(1) -> A1(3), A2(4); root -> B(2) -> B1(5)
const std::vector<SpecNode> kTree = {
    {-1, {1, 2, 3}}, {0, {4, 5}}, {0, {6, 7, 8}}, {1, {9, 10}}, {1, {11}}, {2, {12, 13, 14}},
};

TEST_P(Leakage, ChangingASiblingBranchLeavesTheOtherBranchUnchanged) {
  model::Model<double> m(config(GetParam()));
  m.init(1);
  expect_only_subtree_changes(m, kTree, /*B*/ 2, 0);
  expect_only_subtree_changes(m, kTree, /*A2*/ 4, 0);
}

TEST_P(Leakage, ChangingASiblingsLengthLeavesTheOtherBranchUnchanged) {
  model::Model<double> m(config(GetParam()));
  m.init(1);
  Logits before = run(m, kTree);
  auto longer = kTree;
  longer[3].tokens.insert(longer[3].tokens.end(), {3, 3, 3, 3});  // A1 grows; B's rows move in packed order
  Logits after = run(m, longer);
  for (int n : {0, 1, 2, 4, 5})
    for (size_t j = 0; j < kTree[n].tokens.size(); ++j) EXPECT_EQ(before.by_node[n][j], after.by_node[n][j]);
}

TEST_P(Leakage, ChangingAnAncestorChangesAllDescendants) {
  model::Model<double> m(config(GetParam()));
  m.init(2);
  expect_only_subtree_changes(m, kTree, /*root*/ 0, 2);
  expect_only_subtree_changes(m, kTree, /*A*/ 1, 0);
}

TEST_P(Leakage, ChangingAChildLeavesAncestorsAndOtherBranchesUnchanged) {
  model::Model<double> m(config(GetParam()));
  m.init(3);
  expect_only_subtree_changes(m, kTree, /*A1*/ 3, 1);
  expect_only_subtree_changes(m, kTree, /*B1*/ 5, 0);
}

TEST_P(Leakage, SwappingSiblingOrderLeavesEveryPathUnchanged) {
  model::Model<double> m(config(GetParam()));
  m.init(4);
  // Packed in listed order, so that listing the children the other way round moves them.
  Logits before = run(m, kTree, data::ChildOrder::kListed);
  // same tree with the children of root and of A listed in the opposite order
  std::vector<SpecNode> swapped = {
      {-1, {1, 2, 3}}, {0, {6, 7, 8}}, {0, {4, 5}}, {2, {11}}, {2, {9, 10}}, {1, {12, 13, 14}},
  };
  const int old_of_new[] = {0, 2, 1, 4, 3, 5};
  const data::Tree t0 = make_tree(kTree), t1 = make_tree(swapped);
  ASSERT_NE(data::pack({&t0}, data::Packing::kTree, data::ChildOrder::kListed).tokens,
            data::pack({&t1}, data::Packing::kTree, data::ChildOrder::kListed).tokens);
  Logits after = run(m, swapped, data::ChildOrder::kListed);
  for (int n = 0; n < 6; ++n)
    for (size_t j = 0; j < swapped[n].tokens.size(); ++j)
      EXPECT_EQ(after.by_node[n][j], before.by_node[old_of_new[n]][j]) << "node " << n << " offset " << j;
}

TEST_P(Leakage, TheLargestFirstLayoutLeavesEveryPathUnchanged) {
  // Training packs larger subtrees first (B before A here, A1 before A2); every row's logits are
  // those of the listed layout, bit for bit.
  model::Model<double> m(config(GetParam()));
  m.init(4);
  const data::Tree t = make_tree(kTree);
  ASSERT_NE(t.preorder(), t.preorder(data::ChildOrder::kListed));
  const Logits listed = run(m, kTree, data::ChildOrder::kListed);
  const Logits largest = run(m, kTree);
  for (size_t n = 0; n < kTree.size(); ++n)
    for (size_t j = 0; j < kTree[n].tokens.size(); ++j)
      EXPECT_EQ(largest.by_node[n][j], listed.by_node[n][j]) << "node " << n << " offset " << j;
}

TEST_P(Leakage, TargetsNeverEnterTheirOwnPredictionRow) {
  // For every target: changing the target token (an input at its own position) leaves the logits
  // of the row that predicts it unchanged.
  model::Model<double> m(config(GetParam()));
  m.init(5);
  data::Tree tree = make_tree(kTree);
  data::PackedBatch b = data::pack({&tree}, data::Packing::kTree);
  ASSERT_GT(b.tgt_src.size(), 0u);
  const int64_t V = m.config().vocab_size;
  const std::vector<double> base = m.infer(b, model::InferRequest::all_logits()).logits;
  for (size_t t = 0; t < b.tgt_src.size(); ++t) {
    // the target token sits at the packed position whose source is tgt_src[t]; find it by value
    // and by being the next token of the source's chain: the first position p > src in the
    // source's subtree with token tgt_tok[t]
    int src = b.tgt_src[t];
    int p = -1;
    for (int i = src + 1; i < b.subtree_end[src] && p < 0; ++i) {
      bool child_of_src = b.pos[i] == b.pos[src] + 1;
      if (child_of_src && b.tokens[i] == b.tgt_tok[t]) p = i;
    }
    ASSERT_GE(p, 0);
    data::PackedBatch changed = b;
    changed.tokens[p] = (changed.tokens[p] + 7) % (int)V;
    const std::vector<double> after = m.infer(changed, model::InferRequest::all_logits()).logits;
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(after[(int64_t)src * V + v], base[(int64_t)src * V + v]);
  }
}

TEST_P(Leakage, RandomTreesOnlyTheChangedSubtreeMoves) {
  model::Model<double> m(config(GetParam()));
  m.init(6);
  testing::Rng rng(99);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<SpecNode> nodes{{-1, {}}};
    int n_nodes = rng.uniform(2, 12);
    for (int i = 1; i < n_nodes; ++i) nodes.push_back({rng.uniform(0, i - 1), {}});
    for (auto& n : nodes) {
      int len = rng.uniform(1, 4);
      for (int j = 0; j < len; ++j) n.tokens.push_back(rng.uniform(0, 23));
    }
    int changed = rng.uniform(0, n_nodes - 1);
    int from = rng.uniform(0, (int)nodes[changed].tokens.size() - 1);
    expect_only_subtree_changes(m, nodes, changed, from);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, Leakage, ::testing::Values("qwen3", "qwen3_5_text"));

}  // namespace
}  // namespace tt
