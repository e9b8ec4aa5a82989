// DFS packing of trees into one batch (see packing.h for the layout contract).
//
// kTree lays each tree's nodes out in DFS preorder (Tree::preorder: by default larger subtrees
// first, so a comb's trunk is contiguous), so a node's subtree is the contiguous packed range
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

#include "base/check.h"

namespace tt::data {
namespace {

// The batch's media fields agree with a tree's (the first tree with media sets them).
void adopt_media_shape(const Tree& tree, PackedBatch& b) {
  const TreeMedia& m = tree.media;
  if (m.empty()) return;
  if (!m.slots.empty()) {
    TT_CHECK(b.tokens_per_frame == 0 || b.tokens_per_frame == m.tokens_per_frame, "pack: tree '", tree.id, "' has ",
             m.tokens_per_frame, " tokens per frame, another tree of the batch ", b.tokens_per_frame);
    b.tokens_per_frame = m.tokens_per_frame;
  }
  if (!m.states.empty()) {
    const int d = (int)m.states[0].values.size();
    TT_CHECK(b.state_dim == 0 || b.state_dim == d, "pack: tree '", tree.id, "' has states of ", d,
             " values, another tree of the batch ", b.state_dim);
    b.state_dim = d;
  }
}

// Appends node `v`'s media rows, the node starting at packed row `start`; frame_index maps the
// tree's frames to the batch's (-1: not yet in the batch; per_path passes a fresh map per path).
void pack_node_media(const Tree& tree, const NodeMedia& nm, int v, int32_t start, std::vector<int>& frame_index,
                     PackedBatch& b) {
  for (int k : nm.slots[v]) {
    const FrameSlot& s = tree.media.slots[k];
    if (frame_index[s.frame] < 0) {
      frame_index[s.frame] = (int)b.frames.size();
      b.frames.push_back(tree.media.frames[s.frame]);
    }
    b.slot_row.push_back(start + s.offset);
    b.slot_frame.push_back(frame_index[s.frame]);
    b.slot_first.push_back(s.first);
    b.slot_count.push_back(s.rows(tree.media.tokens_per_frame));
  }
  for (int k : nm.states[v]) {
    const StateRow& s = tree.media.states[k];
    b.state_row.push_back(start + s.offset);
    b.state.insert(b.state.end(), s.values.begin(), s.values.end());
  }
}

// Appends one tree in DFS order to the batch (kTree).
void pack_tree(const Tree& tree, ChildOrder child_order, PackedBatch& b) {
  const int n = (int)tree.nodes.size();
  const std::vector<int> order = tree.preorder(child_order);

  adopt_media_shape(tree, b);
  const NodeMedia nm(tree);
  std::vector<int> frame_index(tree.media.frames.size(), -1);  // each unique frame once
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
    pack_node_media(tree, nm, v, start, frame_index, b);
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
        b.tgt_cnt.push_back(node.target_count[j]);
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

// Appends the paths [first, end) of a tree, each as its own chain (kPerPath).
void pack_paths(const Tree& tree, int64_t first, int64_t end, PackedBatch& b) {
  adopt_media_shape(tree, b);
  const NodeMedia nm(tree);
  for (int64_t k = first; k < end; ++k) {
    const std::vector<int32_t> toks = tree.path_tokens(k);
    const Path& path = tree.paths[k];
    const std::vector<double>& w = path.target_weight;
    const int32_t start = (int32_t)b.tokens.size();
    if (!tree.media.empty()) {  // every occurrence of a frame its own (a per-timestep sample's)
      std::vector<int> frame_index(tree.media.frames.size(), -1);
      int32_t at = start;
      for (int v : tree.path_nodes(k)) {
        pack_node_media(tree, nm, v, at, frame_index, b);
        at += (int32_t)tree.nodes[v].tokens.size();
      }
    }
    const int32_t len = (int32_t)toks.size();
    b.node_start.push_back(start);
    b.node_len.push_back(len);
    b.node_parent.push_back(-1);
    b.tree_start.push_back(start);
    for (int32_t j = 0; j < len; ++j) {
      b.tokens.push_back(toks[j]);
      b.pos.push_back(j);
      b.subtree_end.push_back(start + len);
      if (j > 0 && path.is_target(j)) {
        b.tgt_src.push_back(start + j - 1);
        b.tgt_tok.push_back(toks[j]);
        b.tgt_w.push_back(w[j]);
        b.tgt_cnt.push_back(1);
      }
    }
    b.visible_pairs += (int64_t)len * (len + 1) / 2;
  }
}

}  // namespace

void pack_nodes_media(const Tree& tree, const std::vector<int>& nodes, const std::vector<int32_t>& node_rows,
                      PackedBatch& b) {
  TT_CHECK(nodes.size() == node_rows.size(), "pack_nodes_media: ", nodes.size(), " nodes but ", node_rows.size(),
           " rows");
  if (tree.media.empty()) return;
  adopt_media_shape(tree, b);
  const NodeMedia nm(tree);
  std::vector<int> frame_index(tree.media.frames.size(), -1);  // each unique frame once
  for (size_t i = 0; i < nodes.size(); ++i) pack_node_media(tree, nm, nodes[i], node_rows[i], frame_index, b);
}

int64_t packed_size(const Tree& tree, Packing packing) {
  return packing == Packing::kTree ? tree.n_tree() : tree.n_flat();
}

PackedBatch pack(const std::vector<const Tree*>& trees, Packing packing, ChildOrder child_order) {
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
      pack_tree(*t, child_order, b);
    } else {
      pack_paths(*t, 0, t->n_paths(), b);
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

std::vector<std::pair<int64_t, int64_t>> path_ranges(const Tree& tree, int64_t max_tokens) {
  TT_CHECK(max_tokens >= 1, "path_ranges: max_tokens ", max_tokens, ", expected >= 1");
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t first = 0, used = 0;
  for (int64_t k = 0; k < tree.n_paths(); ++k) {
    const int64_t len = (int64_t)tree.path_tokens(k).size();
    if (len > max_tokens)
      throw Error(str("tree '", tree.id, "': path ", k, " has ", len, " tokens, which exceeds data.max_tokens_per_batch = ",
                      max_tokens, "; expected every path to fit one micro-batch under per_path packing"));
    if (k > first && used + len > max_tokens) {
      out.emplace_back(first, k);
      first = k;
      used = 0;
    }
    used += len;
  }
  if (tree.n_paths() > first) out.emplace_back(first, tree.n_paths());
  return out;
}

PackedBatch pack_path_range(const Tree& tree, int64_t first, int64_t end) {
  tree.validate();
  TT_CHECK(0 <= first && first < end && end <= tree.n_paths(), "pack_path_range: paths [", first, ", ", end,
           ") of tree '", tree.id, "', which has ", tree.n_paths());
  PackedBatch b;
  pack_paths(tree, first, end, b);
  b.tree_start.push_back((int32_t)b.tokens.size());
  b.n_tokens = (int)b.tokens.size();
  b.n_paths = end - first;
  b.n_flat = b.n_tokens;
  b.n_tree = first == 0 ? tree.n_tree() : 0;
  b.n_flat_targets = (int64_t)b.tgt_src.size();
  return b;
}

void check_packed_batch(const PackedBatch& b, int64_t vocab_size) {
  const int N = b.n_tokens;
  const int64_t V = vocab_size;
  TT_CHECK(N >= 0, "packed batch: n_tokens ", N, " is negative");
  TT_CHECK((int)b.tokens.size() == N && (int)b.pos.size() == N && (int)b.subtree_end.size() == N,
           "packed batch: tokens (", b.tokens.size(), "), pos (", b.pos.size(), ") and subtree_end (",
           b.subtree_end.size(), ") must have n_tokens = ", N, " entries");
  for (int i = 0; i < N; ++i) {
    TT_CHECK(b.tokens[i] >= 0 && b.tokens[i] < V, "packed batch: token ", b.tokens[i], " at row ", i,
             " outside vocab_size ", V);
    TT_CHECK(b.pos[i] >= 0, "packed batch: negative position ", b.pos[i], " at row ", i);
    TT_CHECK(b.subtree_end[i] > i && b.subtree_end[i] <= N, "packed batch: subtree_end ", b.subtree_end[i],
             " at row ", i, ", expected in (", i, ", ", N, "]");
  }
  const int nn = b.num_nodes();
  TT_CHECK((int)b.node_len.size() == nn && (int)b.node_parent.size() == nn,
           "packed batch: node_start, node_len, node_parent sizes differ (", nn, ", ", b.node_len.size(),
           ", ", b.node_parent.size(), ")");
  int32_t next = 0;
  for (int n = 0; n < nn; ++n) {
    TT_CHECK(b.node_start[n] == next && b.node_len[n] > 0,
             "packed batch: node ", n, " must start at ", next, " with a positive length, got start ",
             b.node_start[n], " len ", b.node_len[n]);
    TT_CHECK(b.node_parent[n] >= -1 && b.node_parent[n] < n, "packed batch: node ", n, " has parent ",
             b.node_parent[n], " (expected -1 or an earlier node)");
    next += b.node_len[n];
  }
  TT_CHECK(next == N, "packed batch: nodes cover ", next, " tokens, expected n_tokens = ", N);
  const size_t nt = b.tgt_src.size();
  TT_CHECK(b.tgt_tok.size() == nt && b.tgt_w.size() == nt, "packed batch: tgt_src, tgt_tok, tgt_w sizes differ (",
           nt, ", ", b.tgt_tok.size(), ", ", b.tgt_w.size(), ")");
  TT_CHECK(b.tgt_cnt.empty() || b.tgt_cnt.size() == nt, "packed batch: ", b.tgt_cnt.size(), " target counts for ",
           nt, " targets (tgt_cnt is empty or one per target)");
  for (size_t t = 0; t < nt; ++t) {
    TT_CHECK(b.tgt_src[t] >= 0 && b.tgt_src[t] < N, "packed batch: target ", t, " source row ", b.tgt_src[t],
             " outside [0, ", N, ")");
    TT_CHECK(b.tgt_tok[t] >= 0 && b.tgt_tok[t] < V, "packed batch: target ", t, " token ", b.tgt_tok[t],
             " outside vocab_size ", V);
  }
  check_media(b);
}

int64_t PackedBatch::media_slot_rows() const {
  int64_t n = 0;
  for (size_t k = 0; k < slot_row.size(); ++k) n += slot_rows(k);
  return n;
}

void check_media(const PackedBatch& b) {
  const int N = b.n_tokens, F = (int)b.frames.size();
  const size_t ns = b.slot_row.size(), nst = b.state_row.size();
  TT_CHECK(b.slot_frame.size() == ns, "packed batch: ", ns, " slot rows but ", b.slot_frame.size(), " slot frames");
  TT_CHECK(b.slot_first.size() == b.slot_count.size() && (b.slot_count.empty() || b.slot_count.size() == ns),
           "packed batch: ", ns, " slot rows with ", b.slot_first.size(), " first tokens and ", b.slot_count.size(),
           " counts, expected both ", ns, " or both empty");
  TT_CHECK(ns == 0 || b.tokens_per_frame >= 1, "packed batch: ", ns, " frame slots with tokens_per_frame ",
           b.tokens_per_frame, ", expected >= 1");
  TT_CHECK(nst == 0 || b.state_dim >= 1, "packed batch: ", nst, " state rows with state_dim ", b.state_dim);
  TT_CHECK(b.state.size() == nst * (size_t)std::max(b.state_dim, 0), "packed batch: ", b.state.size(),
           " state values for ", nst, " state rows of ", b.state_dim);
  if (ns == 0 && nst == 0) return;
  // node of each row, to check that a slot lies inside one node; no row is claimed twice.
  std::vector<int32_t> node_of(N);
  for (int n = 0; n < b.num_nodes(); ++n)
    for (int j = 0; j < b.node_len[n]; ++j) node_of[b.node_start[n] + j] = n;
  std::vector<uint8_t> used(N, 0);
  for (size_t k = 0; k < ns; ++k) {
    const int32_t r = b.slot_row[k], P = b.slot_rows(k), t0 = b.slot_first_token(k);
    TT_CHECK(P >= 1 && t0 >= 0 && t0 + P <= b.tokens_per_frame, "packed batch: frame slot ", k, " shows tokens [",
             t0, ", ", t0 + P, ") of its frame, expected a non-empty range in [0, ", b.tokens_per_frame, ")");
    TT_CHECK(r >= 0 && (int64_t)r + P <= N && node_of[r] == node_of[r + P - 1], "packed batch: frame slot ", k,
             " at rows [", r, ", ", (int64_t)r + P, "), expected ", P, " rows inside one node of the ", N);
    TT_CHECK(b.slot_frame[k] >= 0 && b.slot_frame[k] < F, "packed batch: frame slot ", k, " shows frame ",
             b.slot_frame[k], ", expected one of the batch's ", F);
    for (int j = r; j < r + P; ++j) {
      TT_CHECK(!used[j], "packed batch: frame slot ", k, " overlaps another media row at row ", j);
      used[j] = 1;
    }
  }
  for (size_t k = 0; k < nst; ++k) {
    const int32_t r = b.state_row[k];
    TT_CHECK(r >= 0 && r < N && !used[r], "packed batch: state row ", k, " at row ", r,
             ", expected a row in [0, ", N, ") that no frame slot covers");
    used[r] = 1;
  }
  if (b.image_size > 0)
    TT_CHECK(b.pixels.size() == (size_t)F * 3 * b.image_size * b.image_size, "packed batch: ", b.pixels.size(),
             " pixel values for ", F, " frames of 3 x ", b.image_size, " x ", b.image_size);
}

}  // namespace tt::data
