// Tree partitioning: cutting a tree that does not fit in memory into connected pieces of at most
// C tokens that together compute every unique token exactly once.
//
// 1. split_long_nodes(tree, C) cuts every node longer than C into a chain of segments, so that
//    every node fits in a piece. The token-level tree is unchanged (see below), so the split tree
//    packs to exactly the same batch as the original.
// 2. plan_partition(split, C) cuts the split tree at node boundaries into pieces: connected node
//    sets of <= C tokens, each with exactly one parent piece (the piece holding the parent of its
//    root node). Pieces are numbered in DFS preorder of their root nodes, so piece 0 is the root
//    piece and parent_piece < index.
// 3. pack_piece(split, plan, k) is piece k as its own PackedBatch. A child piece reads its
//    ancestors' per-layer K/V (the tokens on the chain from the tree root to its root's parent
//    node, which live in ancestor pieces) as one external KV prefix of the attention primitive
//    (ops/cpu/attention.h): its "gateway", visible to every query of the piece. So every unique
//    token is computed once (sum of piece tokens = n_tree); a naive partitioner that re-runs each
//    piece's ancestor chain computes sum over pieces of (tokens + prefix_tokens).
//
// Execution (Partition::schedule): DFS over the piece tree: forward a piece (its activations and
// per-layer K/V stay resident), then recursively each child piece (whose gateway gathers K/V rows
// of the resident ancestors), then backward the piece. A child's backward accumulates (+=) the
// gradients of its gateway rows into the K/V gradients of the ancestor pieces; every descendant's
// backward runs before the piece's own backward, so those gradients are complete when it runs.
// The activations held at once are the pieces on the current root-to-piece chain: peak_tokens is
// the largest sum of piece tokens over root-to-leaf piece chains.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packing.h"
#include "data/tree.h"

namespace tt::data {

// Splits every node longer than max_len (>= 1) into a chain of segments: full segments of
// max_len tokens first, the remainder last. Per-token target weights and counts move with their
// tokens; the original node's children hang off its last segment; a path ending at the node ends
// at its last segment (its per-token weights are unchanged: it has the same tokens). Segments
// take consecutive indices in place of their node (node i's segments come after those of every
// node j < i), so parent < index still holds and children stay in their original order.
//
// Episode trees: a cut never falls inside a frame slot (the segment ends where the slot starts, so
// it may be shorter than max_len; a tt::Error when a frame has more than max_len rows); slots and
// state rows move with their rows.
//
// Why nothing changes: a node is only a run of tokens each of whose parent token is the previous
// one; the segments keep every token's parent token, so root-to-token chains, hence positions
// (depths), visibility (ancestor tokens) and paths, are the same. A segment's first token is
// predicted by the previous segment's last token, the token before it in the original node, so
// targets (source token, target token, weight) are the same. DFS preorder visits a chain's
// segments consecutively, so pack() of the split tree gives the same tokens, positions,
// subtree_end and targets as pack() of the original; only node_start/node_len are finer.
Tree split_long_nodes(const Tree& tree, int64_t max_len);

// A run of rows of an ancestor piece's packed batch (pack_piece(split, plan, piece)).
struct GatewaySegment {
  int piece = 0;
  int32_t row_begin = 0;  // rows [row_begin, row_end)
  int32_t row_end = 0;
};

// A piece: a connected set of nodes of the split tree.
struct Piece {
  int root_node = 0;
  std::vector<int> nodes;  // Tree::preorder(); nodes[0] == root_node
  int parent_piece = -1;   // -1 for the root piece
  std::vector<int> child_pieces;  // in execution order (DFS preorder of their root nodes)
  int64_t tokens = 0;             // sum of the nodes' lengths (<= capacity)
  int64_t prefix_tokens = 0;      // ancestor-chain tokens = depth of the root node's first token
  // The gateway: the ancestor chain (tree root to the parent node of root_node), root first, as
  // row ranges of ancestor pieces' batches. Concatenated, its rows are exactly prefix_tokens K/V
  // rows with positions 0, 1, ..., prefix_tokens - 1, and every query of the piece sees all of
  // them (ExternalKV with q_begin = 0, q_end = tokens). Empty for the root piece. One segment per
  // ancestor node, adjacent ranges of one piece merged: at most the chain's node count.
  std::vector<GatewaySegment> gateway;
};

enum class Phase { kForward, kBackward };

struct Step {
  int piece = 0;
  Phase phase = Phase::kForward;
};

// The most gateway ranges (GatewaySegment) a plan lists over all its pieces (12 bytes each);
// beyond it plan_partition / plan_segments stop with an error naming the setting. A tiny capacity
// or segment length on a deep tree (every node its own piece) would list its ancestors
// quadratically, and run out of memory instead.
constexpr int64_t kMaxGatewayRanges = int64_t{1} << 24;

struct Partition {
  int64_t capacity = 0;
  std::vector<Piece> pieces;  // piece 0 is the root piece; parent_piece < index
  std::vector<int> piece_of_node;    // (split tree nodes) the piece holding each node
  std::vector<int32_t> row_of_node;  // (split tree nodes) first row of the node in its piece's batch
  std::vector<Step> schedule;        // forward piece, then its child pieces (recursively), then backward
  int64_t peak_tokens = 0;       // max over root-to-leaf piece chains of the sum of piece tokens
  int64_t max_piece_tokens = 0;  // largest piece
  int64_t naive_tokens = 0;      // sum over pieces of tokens + prefix_tokens (re-running ancestors)
  // With partition.recompute (model/partitioned.h) the pieces that have child pieces keep only
  // their K/V rows between a no-grad forward and their backward, and one piece's activations are
  // resident at a time (max_piece_tokens):
  int64_t kept_peak_tokens = 0;   // max over chains of the sum of tokens of pieces with child pieces
  int64_t recompute_tokens = 0;   // tokens of the pieces with child pieces (their forward runs twice)

  int num_pieces() const { return (int)pieces.size(); }
};

// Plans the partition of a tree whose nodes are all <= capacity tokens (pass
// split_long_nodes(tree, capacity); a longer node is a tt::Error saying so).
//
// The cut is the bottom-up greedy of Kundu and Misra ("A linear tree partitioning algorithm",
// SIAM J. Comput. 6(1), 1977) for the fewest connected components of weight <= C: in post-order,
// a node's residual is its tokens plus the residuals of the children it keeps; while the residual
// exceeds C, the kept child with the largest residual is cut off (it becomes a piece root; ties go
// to the lower node index). This gives the minimum number of pieces. By induction on subtrees,
// with the pair (cuts inside the subtree, weight of the component holding its root) compared
// lexicographically: if every child subtree is optimal for that pair, a cut of a child's edge
// removes that child's whole residual for one cut, which no cut inside the child can beat, and
// cutting the largest residuals first brings the node under C with the fewest edge cuts and
// leaves the lightest root component among those; so the node's subtree is optimal as well.
// Among minimum-piece plans it also leaves the root piece lightest; peak_tokens is reported,
// not minimised. Each node's children are sorted once: O(n log n).
Partition plan_partition(const Tree& tree, int64_t capacity);

// Segment-level execution (model/segments.h): every path cut into segments of `length` tokens by
// depth (segment i holds depths [i length, (i + 1) length)). The tree's nodes are cut at depths
// that are multiples of `length` (split_long_nodes' argument: the token-level tree is unchanged),
// and the pieces are the connected parts of one segment: a piece's root node starts at depth
// i length (or is the tree root), so all its tokens lie in segment i, and its gateway (the
// ancestor chain) is its paths' history: the last rows of that chain, all in the parent piece,
// form its carried tail, and the chain over every ancestor piece is its retrieval pool (its own
// ancestors only: no sibling branch). A chain (one long sequence) gives one piece per segment.
// Episode trees: a frame slot that a segment boundary cuts becomes a part in each segment
// (FrameSlot::first, count), so each piece runs the tower on the frame and takes its own rows.
struct SegmentPlan {
  int64_t length = 0;
  Tree split;               // nodes cut at depths that are multiples of length
  Partition pieces;         // planned on `split`; capacity = the largest piece
  std::vector<int> segment;  // (pieces) the segment index i of each piece (prefix_tokens / length)
};
SegmentPlan plan_segments(const Tree& tree, int64_t length);

// Piece k of `plan` (planned on `split_tree`) as its own batch (one tree):
//  - nodes in the piece's DFS order; node_parent within the piece (-1 for the piece root);
//  - pos: TRUE depth positions in the whole tree (the piece root's first token has pos =
//    prefix_tokens); subtree_end: the node's subtree within the piece, so in-piece visibility is
//    the usual j <= i < subtree_end[j], and the gateway adds the ancestor chain;
//  - targets: those whose SOURCE row lies in the piece. First the piece's own tokens in packed
//    order (as pack(); the first token of a child piece's root is not among them), then one target
//    per child piece whose root's first token is a target, in child_pieces order: it is predicted
//    from the last row of the root's parent node (a branch point of this piece, which holds that
//    logits row). The root piece's first token is never a target.
//  - media (episode trees): the frame slots and state rows of the piece's nodes, each of their
//    frames once (a frame shown in several pieces runs the tower in each: its gradient is the
//    sum over its slots either way);
//  - statistics: n_tree = piece tokens; visible_pairs = sum of (pos + 1) over the piece's tokens
//    (gateway keys included); n_paths, n_flat, n_flat_targets are the tree's on the root piece and
//    0 elsewhere. Summed over pieces, every statistic equals pack({&split_tree})'s.
PackedBatch pack_piece(const Tree& split_tree, const Partition& plan, int piece);

// Episode trees: the vision tower's runs when the pieces of `plan` train, summed over pieces (each
// runs it on the distinct frames its slots show: pack_piece's frames). 0 without media.
int64_t tower_runs(const Tree& split_tree, const Partition& plan);

}  // namespace tt::data
