// Shared fixtures for the model tests: a tiny config and a hand-built packed batch of two trees,
// the first with branch points, so no test depends on the data/ readers or packer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "data/packing.h"
#include "model/config.h"
#include "model/decoder.h"

namespace tt::model::testing {

// V=11, C=8, I=12, L=2, NH=2, NKV=1, HS=4.
inline ModelConfig tiny_config(const std::string& arch, bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.3;
  c.max_position_embeddings = 64;
  return c;
}

// Turns c into a tiny hybrid of arch (qwen3_5_text: split projections; qwen3_next: fused ones
// grouped per key head): 3 layers, Gated DeltaNet around gated attention, RoPE on half of the
// head dim, 1 key head of 2 value heads (qwen3_next: 2 of 4, so the grouping is not trivial), key
// head dim 4, conv window 4.
inline void make_hybrid(ModelConfig& c, const std::string& arch, int value_head_dim = 3) {
  c.architecture = arch;
  c.partial_rotary_factor = 0.5;
  c.num_hidden_layers = 3;
  c.layer_types = {"linear_attention", "full_attention", "linear_attention"};
  c.linear_num_key_heads = arch == "qwen3_next" ? 2 : 1;
  c.linear_num_value_heads = arch == "qwen3_next" ? 4 : 2;
  c.linear_key_head_dim = 4;
  c.linear_value_head_dim = value_head_dim;
  c.linear_conv_kernel_dim = 4;
}

// Tree 1: A (3 tokens, root) -> B (2) -> D (2), and A -> C (2); tree 2: E (2 tokens).
// DFS packing: A rows 0-2, B 3-4, D 5-6, C 7-8, E 9-10. Row 2 (A's last token) is a branch point
// predicting both B[0] and C[0]; row 4 predicts D[0]. Leaf rows 6 and 8 and 10 predict nothing.
struct TreeBatch {
  data::PackedBatch batch;
  // Root-to-leaf paths as packed rows, for a dense causal reference.
  std::vector<std::vector<int>> path_rows;
};

inline TreeBatch tree_batch() {
  TreeBatch t;
  data::PackedBatch& b = t.batch;
  b.n_tokens = 11;
  b.tokens = {3, 7, 1, 4, 9, 2, 10, 5, 0, 6, 8};
  b.pos = {0, 1, 2, 3, 4, 5, 6, 3, 4, 0, 1};
  b.subtree_end = {9, 9, 9, 7, 7, 7, 7, 9, 9, 11, 11};
  b.node_start = {0, 3, 5, 7, 9};
  b.node_len = {3, 2, 2, 2, 2};
  b.node_parent = {-1, 0, 1, 0, -1};
  b.tree_start = {0, 9, 11};
  b.tgt_src = {0, 1, 2, 2, 3, 4, 5, 7, 9};
  b.tgt_w = {2.0, 2.0, 1.0, 1.0, 1.0, 0.5, 0.5, 1.5, 1.0};
  // Target token: the next token along the path (branch targets name the child's first token).
  const std::vector<int> tgt_row = {1, 2, 3, 7, 4, 5, 6, 8, 10};
  for (int r : tgt_row) b.tgt_tok.push_back(b.tokens[r]);
  t.path_rows = {{0, 1, 2, 3, 4, 5, 6}, {0, 1, 2, 7, 8}, {9, 10}};
  return t;
}

// One node of n tokens: a plain causal sequence; row i predicts token i+1 with weight 1.
inline data::PackedBatch chain_batch(const std::vector<int32_t>& tokens) {
  data::PackedBatch b;
  const int n = (int)tokens.size();
  b.n_tokens = n;
  b.tokens = tokens;
  for (int i = 0; i < n; ++i) {
    b.pos.push_back(i);
    b.subtree_end.push_back(n);
  }
  b.node_start = {0};
  b.node_len = {n};
  b.node_parent = {-1};
  b.tree_start = {0, n};
  for (int i = 0; i + 1 < n; ++i) {
    b.tgt_src.push_back(i);
    b.tgt_tok.push_back(tokens[i + 1]);
    b.tgt_w.push_back(1.0);
  }
  return b;
}

// The training gradient of m on b (loss scale `scale`) against central differences on up to
// `per_tensor` sampled entries of every tensor, Richardson-extrapolated: with D(h) = (L(w + h) -
// L(w - h)) / 2h, (4 D(h/2) - D(h)) / 3 cancels the h^2 term, so the estimate's truncation error is
// O(h^4) (gated products, as in the hybrids, make the third derivative large enough that plain
// D(1e-5) is off by ~1e-6 relative) and its rounding error ~1e-16 |L| / h = 1e-12 |L| at h = 1e-4,
// far inside the bound 1e-6 |grad| + 1e-9.
inline void expect_sampled_gradients(Model<double>& m, const data::PackedBatch& b, double scale, uint64_t seed,
                                     int per_tensor, const std::string& what = "") {
  m.zero_grad();
  m.forward(b, scale);
  m.backward();
  const std::vector<double> grad(m.grads(), m.grads() + m.num_params());
  std::mt19937_64 rng(seed);
  const double h = 1e-4;
  for (const ParamInfo& p : m.params_info()) {
    std::vector<int64_t> idx(p.numel);
    for (int64_t i = 0; i < p.numel; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(std::min<int64_t>(p.numel, per_tensor));
    for (int64_t i : idx) {
      double& w = m.params()[p.offset + i];
      const double w0 = w;
      auto central = [&](double step) {
        w = w0 + step;
        const double lp = m.forward(b, scale);
        w = w0 - step;
        const double lm = m.forward(b, scale);
        w = w0;
        return (lp - lm) / (2 * step);
      };
      const double fd = (4 * central(h / 2) - central(h)) / 3, an = grad[p.offset + i];
      EXPECT_NEAR(an, fd, 1e-6 * std::fabs(an) + 1e-9) << what << " " << p.name << "[" << i << "]";
    }
  }
}

// One step's loss and gradients of `tree` packed as a tree and packed per path (every path its
// own sequence) agree to 1e-10 relative (fp64: the same terms in another order). Returns the
// largest |gradient|, for the caller to check the comparison was not of zeros.
inline double expect_tree_equals_per_path(Model<double>& m, const data::Tree& tree, double scale) {
  const data::PackedBatch t = data::pack({&tree}, data::Packing::kTree);
  const data::PackedBatch p = data::pack({&tree}, data::Packing::kPerPath);
  EXPECT_GT(p.n_tokens, t.n_tokens);
  m.zero_grad();
  const double l_tree = m.forward(t, scale);
  m.backward();
  const std::vector<double> g_tree(m.grads(), m.grads() + m.num_params());
  m.zero_grad();
  const double l_paths = m.forward(p, scale);
  m.backward();
  EXPECT_NEAR(l_tree, l_paths, 1e-10 * std::fabs(l_tree));
  double diff = 0, scale_g = 0;
  for (int64_t i = 0; i < m.num_params(); ++i) {
    diff = std::max(diff, std::fabs(g_tree[i] - m.grads()[i]));
    scale_g = std::max(scale_g, std::fabs(g_tree[i]));
  }
  EXPECT_LE(diff, 1e-10 * scale_g);
  return scale_g;
}

// Message of the tt::Error thrown by f, checked to contain every part.
template <class F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected tt::Error";
}

}  // namespace tt::model::testing
