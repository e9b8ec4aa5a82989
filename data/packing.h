// DFS packing of trees into batches.
//
// Per token: its id, its position id (depth: the length of the root-to-node path before it), and
// subtree_end, the end of its node's subtree in packed order, so that key j is visible from query i
// exactly when j <= i < subtree_end[j]. Nodes are laid out in DFS order (Tree::preorder) with
// their ranges, the form the attention primitive reads (ops/cpu/attention.h). Several trees share
// a batch up to a token budget, never seeing each other.
//
// Targets are an explicit list: target t is token tgt_tok[t] predicted from packed row tgt_src[t]
// with weight tgt_w[t] (unnormalised: summed over the paths that make it a target; the trainer
// divides by the step's normaliser). A branch point's last token is the source of one target per
// child. Under kTree a token is a target iff some path makes it one (Node::target_count > 0, even
// when its summed weight is 0); targets are listed in packed order of the predicted token.
//
// Packing kPerPath is the baseline: every path becomes its own chain (its own causal sequence:
// one node and one tree per path, in Tree::paths order) with its own weights (a target for each
// token its loss mask selects, Path::is_target, zero weights included), so tree and per-path
// batches define the same loss sum_t w_t * CE_t, for weights of any sign, and the same unweighted
// NLL sum_t cnt_t * CE_t.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "data/tree.h"

namespace tt::data {

enum class Packing { kTree, kPerPath };

struct PackedBatch {
  int n_tokens = 0;
  std::vector<int32_t> tokens;       // (N)
  std::vector<int32_t> pos;          // (N) depth position ids
  std::vector<int32_t> subtree_end;  // (N)
  std::vector<int32_t> node_start;   // (num_nodes) DFS order
  std::vector<int32_t> node_len;     // (num_nodes)
  std::vector<int32_t> node_parent;  // (num_nodes) -1 at each tree root
  std::vector<int32_t> tree_start;   // (num_trees + 1) packed range of each tree
  std::vector<int32_t> tgt_src;      // (n_tgt)
  std::vector<int32_t> tgt_tok;      // (n_tgt)
  std::vector<double> tgt_w;         // (n_tgt) unnormalised
  // (n_tgt) how many flattened paths make the target one (Node::target_count; 1 per target under
  // kPerPath): the weights of the unweighted mean NLL. Empty in a hand-built batch: all ones.
  std::vector<int32_t> tgt_cnt;
  // Statistics of the trees in the batch (the same for both packings, except visible_pairs,
  // which counts this packing's attention: sum of (pos + 1) over the packed tokens).
  int64_t n_paths = 0;
  int64_t n_flat = 0;          // tokens of all paths flattened
  int64_t n_tree = 0;          // unique tokens
  int64_t n_flat_targets = 0;  // targets counted over all flattened paths
  int64_t visible_pairs = 0;   // (query, key) pairs visible in this batch's attention
  // Media rows (empty for token-only data; Tree::media): the batch's frames (under kTree one per
  // unique frame of each tree, however many slots show it; under kPerPath one per occurrence, as
  // per-timestep samples would run the tower), each slot's first packed row and frame, and the
  // state rows with their values. pixels (frames, 3, S, S) are filled by data::load_frames.
  int tokens_per_frame = 0;
  std::vector<FrameRef> frames;     // (n_frames)
  std::vector<int32_t> slot_row;    // (n_slots) rows [slot_row, slot_row + slot_rows(k))
  std::vector<int32_t> slot_frame;  // (n_slots) index into frames
  // (n_slots) each, or both empty (every slot its frame's whole tokens): slot k's rows show the
  // frame's tokens [slot_first[k], slot_first[k] + slot_count[k]) (parts of slots: segments).
  std::vector<int32_t> slot_first, slot_count;
  std::vector<int32_t> state_row;   // (n_state)
  std::vector<float> state;         // (n_state, state_dim)
  int state_dim = 0;
  int image_size = 0;               // S of pixels (0: not loaded)
  std::vector<float> pixels;        // (n_frames, 3, S, S)

  int num_nodes() const { return (int)node_start.size(); }
  int num_trees() const { return (int)tree_start.size() - 1; }
  int32_t slot_rows(size_t k) const { return slot_count.empty() ? tokens_per_frame : slot_count[k]; }
  int32_t slot_first_token(size_t k) const { return slot_first.empty() ? 0 : slot_first[k]; }
  int64_t media_slot_rows() const;  // rows the frame slots cover (sum of slot_rows)
};

// Checks that a batch is well formed before a model reads it (batches may come from pack(),
// pack_piece() or be built by hand): array sizes agree with n_tokens, tokens lie in
// [0, vocab_size), positions are >= 0, subtree_end[i] lies in (i, N], nodes tile [0, N) in order
// with positive lengths and earlier parents, targets name rows in [0, N) and tokens in the
// vocabulary, and media rows (frame slots, state rows) lie inside one node each, apart, with frames
// and values sized as stated. Throws tt::Error saying which entry is wrong.
void check_packed_batch(const PackedBatch& batch, int64_t vocab_size);
void check_media(const PackedBatch& batch);  // the media part of check_packed_batch

// Packs the given trees, in order, into one batch (each checked with Tree::validate()); trees with
// media must agree on tokens_per_frame and the state length. Under kTree each tree's nodes follow
// Tree::preorder(child_order): the default, larger subtrees first, is what training uses;
// kListed (children in index order) is for comparisons (the attention bench, order-invariance
// tests): every preorder defines the same loss and gradients.
PackedBatch pack(const std::vector<const Tree*>& trees, Packing packing,
                 ChildOrder child_order = ChildOrder::kLargestFirst);

// Appends the media rows of `nodes` (indices into tree.nodes) laid out from packed rows
// node_rows[i] (each node's slots and state rows at their offsets; each of the tree's frames once,
// however many of the slots show it, as kTree does): the media of a batch built node by node
// (pack_piece, data/partition.h).
void pack_nodes_media(const Tree& tree, const std::vector<int>& nodes, const std::vector<int32_t>& node_rows,
                      PackedBatch& b);

// Tokens a tree occupies in a batch under the given packing (n_tree or n_flat).
int64_t packed_size(const Tree& tree, Packing packing);

// Per-path packing of a tree too large for one micro-batch: its paths, in Tree::paths order, cut
// into consecutive ranges [first, end) of at most max_tokens flattened tokens each (greedy: a
// range closes before the path that would overflow it). Throws tt::Error naming the tree and the
// path when a single path is longer than max_tokens.
std::vector<std::pair<int64_t, int64_t>> path_ranges(const Tree& tree, int64_t max_tokens);

// The paths [first, end) of a tree packed per_path: exactly the rows and targets that
// pack({&tree}, kPerPath) gives them, so the batches of a tree's ranges together hold its per-path
// batch (the same loss, NLL, n_paths, n_flat, n_flat_targets and visible_pairs when summed).
// n_tree, a statistic of the whole tree, is counted in the range that starts at path 0 only.
PackedBatch pack_path_range(const Tree& tree, int64_t first, int64_t end);

}  // namespace tt::data
