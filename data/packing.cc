// DFS packing of trees into one batch (see packing.h for the layout contract).
//
// kTree lays each tree's nodes out in DFS preorder (children in index order, i.e. the order they
// were created or listed), so a node's subtree is the contiguous packed range
// [node_start, subtree_end). Token positions are depths; a token is a target iff some path makes it
// one (target_count > 0), with the node's summed weight; its source row is the token before it in
// the node, or, for a node's first token, the last token of the parent node (the branch point).
//
// kPerPath writes every path as its own single-node tree: positions 0..L-1, a target for each
// token the path weights (target_weight != 0), sourced from the token before it. Over a tree both
// packings hold the same (context, target token) pairs with the same summed weights, hence the
// same loss sum_t w_t * CE_t.
#include "data/packing.h"

#include <algorithm>
#include <limits>

#include "ops/check.h"

namespace tt::data {
namespace {

// Appends one tree in DFS order to the batch (kTree).
void pack_tree(const Tree& tree, PackedBatch& b) {
  const int n = (int)tree.nodes.size();
  std::vector<std::vector<int>> children(n);
  for (int i = 1; i < n; ++i) children[tree.nodes[i].parent].push_back(i);

  // Preorder with an explicit stack (trees can be deep chains).
  std::vector<int> order;
  order.reserve(n);
  std::vector<int> stack = {0};
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    order.push_back(v);
    for (auto c = children[v].rbegin(); c != children[v].rend(); ++c) stack.push_back(*c);
  }

  const int node_base = b.num_nodes();
  std::vector<int> packed_node(n);  // tree node -> packed node index
  std::vector<int32_t> depth(n);    // tokens on the root-to-node path before the node
  for (int k = 0; k < n; ++k) {
    const int v = order[k];
    const Node& node = tree.nodes[v];
    const int p = node.parent;
    const int32_t start = (int32_t)b.tokens.size();
    const int32_t len = (int32_t)node.tokens.size();
    packed_node[v] = node_base + k;
    depth[v] = p < 0 ? 0 : depth[p] + (int32_t)tree.nodes[p].tokens.size();
    b.node_start.push_back(start);
    b.node_len.push_back(len);
    b.node_parent.push_back(p < 0 ? -1 : packed_node[p]);
    for (int32_t j = 0; j < len; ++j) {
      b.tokens.push_back(node.tokens[j]);
      b.pos.push_back(depth[v] + j);
      b.subtree_end.push_back(0);  // filled below, once the subtree is laid out
      b.visible_pairs += depth[v] + j + 1;
      if (node.target_count[j] > 0) {
        const int32_t src = j > 0 ? start + j - 1 : b.node_start[packed_node[p]] + b.node_len[packed_node[p]] - 1;
        b.tgt_src.push_back(src);
        b.tgt_tok.push_back(node.tokens[j]);
        b.tgt_w.push_back(node.target_weight[j]);
      }
    }
  }
  // Subtree ends: children come after their parents in preorder, so a reverse pass propagates
  // each node's end (the end of its last descendant) to its parent.
  std::vector<int32_t> end(n);
  for (int k = n - 1; k >= 0; --k) {
    const int v = order[k];
    const int q = node_base + k;
    end[v] = std::max(end[v], b.node_start[q] + b.node_len[q]);
    if (tree.nodes[v].parent >= 0) end[tree.nodes[v].parent] = std::max(end[tree.nodes[v].parent], end[v]);
  }
  for (int k = 0; k < n; ++k) {
    const int q = node_base + k;
    for (int32_t j = 0; j < b.node_len[q]; ++j) b.subtree_end[b.node_start[q] + j] = end[order[k]];
  }
}

// Appends every path of a tree as its own chain (kPerPath).
void pack_paths(const Tree& tree, PackedBatch& b) {
  for (int64_t k = 0; k < tree.n_paths(); ++k) {
    const std::vector<int32_t> toks = tree.path_tokens(k);
    const std::vector<double>& w = tree.paths[k].target_weight;
    const int32_t start = (int32_t)b.tokens.size();
    const int32_t len = (int32_t)toks.size();
    b.node_start.push_back(start);
    b.node_len.push_back(len);
    b.node_parent.push_back(-1);
    b.tree_start.push_back(start);
    for (int32_t j = 0; j < len; ++j) {
      b.tokens.push_back(toks[j]);
      b.pos.push_back(j);
      b.subtree_end.push_back(start + len);
      if (j > 0 && w[j] != 0) {
        b.tgt_src.push_back(start + j - 1);
        b.tgt_tok.push_back(toks[j]);
        b.tgt_w.push_back(w[j]);
      }
    }
    b.visible_pairs += (int64_t)len * (len + 1) / 2;
  }
}

}  // namespace

int64_t packed_size(const Tree& tree, Packing packing) {
  return packing == Packing::kTree ? tree.n_tree() : tree.n_flat();
}

PackedBatch pack(const std::vector<const Tree*>& trees, Packing packing) {
  PackedBatch b;
  int64_t total = 0;
  for (const Tree* t : trees) {
    TT_CHECK(t != nullptr, "pack: null tree");
    t->validate();
    total += packed_size(*t, packing);
  }
  TT_CHECK(total <= std::numeric_limits<int32_t>::max(), "pack: ", total,
           " packed tokens, expected fewer than 2^31 (int32 indices)");
  b.tokens.reserve(total);
  b.pos.reserve(total);
  b.subtree_end.reserve(total);
  for (const Tree* t : trees) {
    if (packing == Packing::kTree) {
      b.tree_start.push_back((int32_t)b.tokens.size());
      pack_tree(*t, b);
    } else {
      pack_paths(*t, b);
    }
    b.n_paths += t->n_paths();
    b.n_flat += t->n_flat();
    b.n_tree += t->n_tree();
    b.n_flat_targets += t->n_flat_targets();
  }
  b.tree_start.push_back((int32_t)b.tokens.size());
  b.n_tokens = (int)b.tokens.size();
  return b;
}

}  // namespace tt::data
