// Tree training equals per-path training. For random trees of every shape in tree_shapes(),
// in both input formats, one and several trees per batch, Llama and Qwen3, tied and untied:
// the logits of every path token, the loss (path_mean and token_mean), every parameter's
// gradient, and the parameters after one AdamW step agree between the tree-packed batch and the
// per-path baseline.
//
// Tolerance rule: in fp64 both sides compute the same sums in different groupings, so they agree
// to a few ulps times the depth of the computation: relative 1e-10 is a loose fp64 bound. In fp32
// the tree run may differ from the fp64 truth by no more than 2x what the fp32 per-path run
// differs from it (plus a floor of 1e-6 relative for sums that happen to round identically).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "data/packing.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "tests/equivalence/random_trees.h"

namespace tt {
namespace {

using data::Packing;
using data::PackedBatch;
using testing::max_abs;
using testing::max_diff;
using testing::Rng;
using testing::TreeShape;

model::ModelConfig tiny_config(const std::string& arch, bool tied) {
  model::ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.3;  // large enough that attention is far from uniform
  if (arch == "qwen3_5_text") testing::make_qwen35_hybrid(c);
  return c;
}

// Context (root-to-row token sequence, with the tree index) of every packed row.
std::map<std::vector<int32_t>, int> row_contexts(const PackedBatch& b) {
  std::map<std::vector<int32_t>, int> out;
  for (int n = 0; n < b.num_nodes(); ++n) {
    std::vector<int> chain;
    for (int a = b.node_parent[n]; a >= 0; a = b.node_parent[a]) chain.push_back(a);
    std::reverse(chain.begin(), chain.end());
    // tree index: the tree whose range holds the node
    int tree = (int)(std::upper_bound(b.tree_start.begin(), b.tree_start.end(), b.node_start[n]) -
                     b.tree_start.begin()) - 1;
    std::vector<int32_t> ctx{-1 - tree};
    for (int a : chain)
      ctx.insert(ctx.end(), b.tokens.begin() + b.node_start[a], b.tokens.begin() + b.node_start[a] + b.node_len[a]);
    for (int i = b.node_start[n]; i < b.node_start[n] + b.node_len[n]; ++i) {
      ctx.push_back(b.tokens[i]);
      out[ctx] = i;
    }
  }
  return out;
}

struct RunResult {
  double loss = 0;
  std::vector<double> logits;  // (N, V)
  std::vector<double> grads;
  std::vector<double> stepped;  // params after one AdamW step
};

template <class T>
RunResult run(model::Model<T>& m, const PackedBatch& b, double norm) {
  RunResult r;
  m.zero_grad();
  r.loss = m.forward(b, 1.0 / norm);
  const int64_t V = m.config().vocab_size;
  const std::vector<double> logits = m.infer(b, model::InferRequest::all_logits()).logits;
  EXPECT_EQ((int64_t)logits.size(), (int64_t)b.n_tokens * V);
  r.logits.assign(logits.begin(), logits.end());
  m.backward();
  r.grads.assign(m.grads(), m.grads() + m.num_params());
  r.stepped = testing::params_after_adamw_step(m);
  return r;
}

// Per-path rows' logits gathered in tree order, so the two runs compare element by element.
std::vector<double> tree_logits_for_path_rows(const PackedBatch& tree, const PackedBatch& path,
                                              const std::vector<double>& tree_logits, int64_t V) {
  auto tree_rows = row_contexts(tree);
  auto path_rows = row_contexts(path);
  std::vector<double> out((size_t)path.n_tokens * V, NAN);
  // per-path trees are numbered per path; map each path row's context (minus tree tag) into the
  // tree batch by searching the tree tags
  for (const auto& [ctx, prow] : path_rows) {
    std::vector<int32_t> body(ctx.begin() + 1, ctx.end());
    int trow = -1;
    for (int t = 0; t < tree.num_trees() && trow < 0; ++t) {
      std::vector<int32_t> key{-1 - t};
      key.insert(key.end(), body.begin(), body.end());
      auto it = tree_rows.find(key);
      if (it != tree_rows.end()) trow = it->second;
    }
    EXPECT_GE(trow, 0) << "a per-path context is missing from the tree batch";
    if (trow < 0) continue;
    std::copy(tree_logits.begin() + (int64_t)trow * V, tree_logits.begin() + (int64_t)(trow + 1) * V,
              out.begin() + (int64_t)prow * V);
  }
  return out;
}

struct Case {
  TreeShape shape;
  bool rollouts;
  int trees_per_batch;
  std::string arch;
  bool tied;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.shape.name) + (c.rollouts ? "_Rollouts" : "_Tree") + "_" +
         std::to_string(c.trees_per_batch) + "Trees_" + c.arch + (c.tied ? "_Tied" : "");
}

std::vector<data::Tree> make_trees(const Case& c, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<data::Tree> trees;
  for (int t = 0; t < c.trees_per_batch; ++t) {
    std::string id = "t" + std::to_string(t);
    std::string line = c.rollouts ? testing::random_rollouts_line(c.shape, vocab, rng, id)
                                  : testing::random_tree_line(c.shape, vocab, rng, id);
    trees.push_back(c.rollouts ? data::parse_rollouts_line(line, "random:" + id, vocab)
                               : data::parse_tree_line(line, "random:" + id, vocab));
  }
  return trees;
}

class TreeVsPath : public ::testing::TestWithParam<Case> {};

TEST_P(TreeVsPath, LogitsLossGradientsAndUpdateMatchInFp64) {
  const Case& c = GetParam();
  auto cfg = tiny_config(c.arch, c.tied);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    auto trees = make_trees(c, (int)cfg.vocab_size, seed * 7919 + c.trees_per_batch);
    std::vector<const data::Tree*> ptrs;
    for (const auto& t : trees) ptrs.push_back(&t);
    PackedBatch tree = data::pack(ptrs, Packing::kTree);
    PackedBatch path = data::pack(ptrs, Packing::kPerPath);
    ASSERT_EQ(tree.n_paths, path.n_paths);
    ASSERT_EQ(tree.n_flat_targets, path.n_flat_targets);
    ASSERT_LE(tree.n_tokens, path.n_tokens);

    model::Model<double> m(cfg);
    m.init(seed);
    for (double norm : {(double)tree.n_paths, (double)std::max<int64_t>(1, tree.n_flat_targets)}) {
      RunResult rt = run(m, tree, norm);
      RunResult rp = run(m, path, norm);
      auto gathered = tree_logits_for_path_rows(tree, path, rt.logits, cfg.vocab_size);
      EXPECT_LE(max_diff(gathered, rp.logits), 1e-10 * std::max(1.0, max_abs(rp.logits)))
          << "seed " << seed;
      EXPECT_NEAR(rt.loss, rp.loss, 1e-10 * std::max(1.0, std::fabs(rp.loss))) << "seed " << seed;
      EXPECT_LE(max_diff(rt.grads, rp.grads), 1e-10 * std::max(1e-3, max_abs(rp.grads))) << "seed " << seed;
      EXPECT_LE(max_diff(rt.stepped, rp.stepped), 1e-10 * max_abs(rp.stepped)) << "seed " << seed;
    }
  }
}

TEST_P(TreeVsPath, Fp32TreeErrorWithinTwiceFp32PathError) {
  const Case& c = GetParam();
  auto cfg = tiny_config(c.arch, c.tied);
  auto trees = make_trees(c, (int)cfg.vocab_size, 424242 + c.trees_per_batch);
  std::vector<const data::Tree*> ptrs;
  for (const auto& t : trees) ptrs.push_back(&t);
  PackedBatch tree = data::pack(ptrs, Packing::kTree);
  PackedBatch path = data::pack(ptrs, Packing::kPerPath);
  const double norm = (double)tree.n_paths;

  model::Model<double> ref(cfg);
  ref.init(3);
  RunResult truth = run(ref, path, norm);
  model::Model<float> m(cfg);
  m.init(3);
  RunResult rt = run(m, tree, norm);
  RunResult rp = run(m, path, norm);
  auto tol = [](double path_err, double scale) { return 2.0 * path_err + 1e-6 * scale; };
  EXPECT_LE(std::fabs(rt.loss - truth.loss), tol(std::fabs(rp.loss - truth.loss), std::fabs(truth.loss)));
  EXPECT_LE(max_diff(rt.grads, truth.grads), tol(max_diff(rp.grads, truth.grads), max_abs(truth.grads)));
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& s : testing::tree_shapes())
    for (bool rollouts : {false, true})
      for (int k : {1, 3}) cases.push_back({s, rollouts, k, "qwen3", false});
  const auto& mixed = testing::tree_shapes().back();
  cases.push_back({mixed, false, 2, "llama", true});
  cases.push_back({mixed, true, 2, "llama", false});
  cases.push_back({mixed, true, 2, "qwen3", true});
  // Hybrids (Qwen3.5): the recurrent state and conv window must follow the tree on every shape.
  for (const auto& s : testing::tree_shapes())
    for (bool rollouts : {false, true}) cases.push_back({s, rollouts, rollouts ? 3 : 1, "qwen3_5_text", false});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, TreeVsPath, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace tt
