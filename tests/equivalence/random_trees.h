// Random prefix trees for the equivalence and leakage tests, built through the real readers
// (JSONL text in, data::Tree out) so the tests cover parsing, merging and packing too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tree.h"

namespace tt::testing {

struct TreeShape {
  const char* name;
  int max_depth;        // nodes on the longest chain
  int max_children;     // children per inner node
  int min_len, max_len; // tokens per node
  bool partial_masks;   // random 0/1 loss masks
  bool weights;         // random node / sequence weights
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
// masks, path weights.
const std::vector<TreeShape>& tree_shapes();

}  // namespace tt::testing
