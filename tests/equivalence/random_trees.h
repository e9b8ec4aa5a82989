// Support for the equivalence suite: random prefix trees built through the real readers (JSONL
// text in, data::Tree out, so the tests cover parsing, merging and packing too), the comparison
// helpers, and the one-AdamW-step probe shared by the tree-vs-path and partition tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tree.h"
#include "model/decoder.h"
#include "ops/cpu/adamw.h"

namespace tt::testing {

struct TreeShape {
  const char* name;
  int max_depth;        // nodes on the longest chain
  int max_children;     // children per inner node
  int min_len, max_len; // tokens per node
  bool partial_masks;   // random 0/1 loss masks
  bool weights;         // random node / sequence weights in [0.25, 2.25)
  bool signed_weights = false;  // weights of any sign instead: a quarter exactly 0, the rest in [-2, 2)
};

// Small portable RNG (splitmix64).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next();
  int uniform(int lo, int hi);  // [lo, hi]
  double unit();                // [0, 1)
};

// A random tree-format JSONL line and a random rollouts JSONL line of the given shape.
std::string random_tree_line(const TreeShape& shape, int vocab, Rng& rng, const std::string& id);
std::string random_rollouts_line(const TreeShape& shape, int vocab, Rng& rng, const std::string& id);

// The shapes the tests sweep: single-token nodes, deep chains, wide fans, branch points, partial
// masks, path weights, signed and zero weights (RL advantages).
const std::vector<TreeShape>& tree_shapes();

double max_abs(const std::vector<double>& a);
double max_diff(const std::vector<double>& a, const std::vector<double>& b);  // max |a - b|, same sizes

// The model's parameters after one AdamW step (lr 1e-2, weight decay 0.1) on its current
// gradients, as doubles; the model itself is unchanged.
template <class T>
std::vector<double> params_after_adamw_step(const model::Model<T>& m) {
  std::vector<T> p(m.params(), m.params() + m.num_params()), mom(p.size(), T(0)), var(p.size(), T(0));
  cpu::AdamWParams ap;
  ap.lr = 1e-2;
  ap.weight_decay = 0.1;
  cpu::adamw_update(p.data(), m.grads(), mom.data(), var.data(), (int64_t)p.size(), ap);
  return std::vector<double>(p.begin(), p.end());
}

// Makes c the Qwen3.5 hybrid the equivalence suites run (qwen3_5_text: a Gated DeltaNet layer,
// whose conv window and recurrent state must follow the tree, then gated attention with RoPE on
// half of each head); c's other sizes stay.
inline void make_qwen35_hybrid(model::ModelConfig& c) {
  c.architecture = "qwen3_5_text";
  c.num_hidden_layers = 2;
  c.layer_types = {"linear_attention", "full_attention"};
  c.partial_rotary_factor = 0.5;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 8;
  c.linear_value_head_dim = 8;
  c.linear_conv_kernel_dim = 4;
}

}  // namespace tt::testing
