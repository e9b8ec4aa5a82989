// Prefix trees: the unit of treetrain's data.
//
// A Tree is a list of nodes, each a token segment with a parent (an earlier node, or -1 for the
// root; exactly one root, node 0). Every root-to-leaf path, and every path that a rollout
// sequence ends on (a sequence may end inside what is shared with a longer one; the node is
// split there), is one training sequence: a "path". Per token the tree keeps the summed loss
// weight of the paths that make it a target, so one tree holds everything the per-path baseline
// needs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tt::data {

struct Node {
  int parent = -1;
  std::vector<int32_t> tokens;
  // (tokens.size()) sum over the paths through this token of path_weight * loss_mask (weights
  // have any sign, so the sum can be 0 or negative for a target); the
  // node's first token is predicted by the parent's last token (a branch point when the parent
  // has several children). Token 0 of the root is never a target.
  std::vector<double> target_weight;
  // (tokens.size()) how many paths make this token a target (for the token_mean normaliser).
  std::vector<int32_t> target_count;
};

// A path, for the per-path baseline: it runs from the root to the end of node end_node, and
// target_weight holds per token the weight that this one sequence gives it (weight * mask, no
// sums over other paths; [0] is 0).
struct Path {
  int end_node = 0;
  std::vector<double> target_weight;  // (path length)
  // (path length) 1 where the sequence's loss mask makes the token a target (whatever its
  // weight, zero included); empty: where target_weight != 0.
  std::vector<uint8_t> target_mask;
  bool is_target(size_t j) const { return target_mask.empty() ? target_weight[j] != 0 : target_mask[j] != 0; }
};

// Media rows (VLA episodes, data/episode_tree.h): rows of a node whose input is not their token's
// embedding. A frame slot is `tokens_per_frame` consecutive rows of one node showing a camera frame
// (the vision tower's projected tokens replace them); a state row holds a proprioceptive state
// vector (a learned projection replaces it). A frame is identified by (episode, step, camera) and
// listed once per tree however many slots show it.
struct FrameRef {
  int64_t episode = 0;
  int step = 0, camera = 0;
  std::string path;  // the image file (decoded per batch: data/frames.h)
  // In-memory pixels (3, S, S) of the tower's size instead of a file (tests, generated data); null: decode path.
  std::shared_ptr<const std::vector<float>> pixels;
};
struct FrameSlot {
  int node = 0, offset = 0;  // the slot's first row: `offset` tokens into `node`
  int frame = 0;             // index into TreeMedia::frames
  // A part of a slot, where a segment boundary cuts one (data::plan_segments): rows [offset,
  // offset + count) show the frame's tokens [first, first + count). count 0: the whole frame.
  int first = 0, count = 0;
  int rows(int tokens_per_frame) const { return count > 0 ? count : tokens_per_frame; }
};
struct StateRow {
  int node = 0, offset = 0;
  std::vector<float> values;  // (state dim)
};
struct TreeMedia {
  int tokens_per_frame = 0;
  std::vector<FrameRef> frames;  // unique frames, in order of first appearance
  std::vector<FrameSlot> slots;  // every slot of every node
  std::vector<StateRow> states;
  bool empty() const { return slots.empty() && states.empty(); }
};

struct Tree;
// Each node's media rows: indices into tree.media.slots and .states, in their order.
struct NodeMedia {
  std::vector<std::vector<int>> slots, states;  // (nodes)
  explicit NodeMedia(const Tree& t);
};

// How Tree::preorder orders a node's children.
enum class ChildOrder { kLargestFirst, kListed };

struct Tree {
  std::string id;
  std::vector<Node> nodes;  // node 0 is the root; parent[i] < i
  // The paths as read, with their own masks and weights; packing per_path uses them, and
  // statistics count them.
  std::vector<Path> paths;
  TreeMedia media;  // empty for token-only data
  int64_t frame_occurrences() const { return (int64_t)media.slots.size(); }
  int64_t frames_shown() const;  // distinct frames some slot shows: the tower's runs on the whole tree

  std::vector<int32_t> path_tokens(int64_t k) const;  // tokens of path k, root first
  std::vector<int> path_nodes(int64_t k) const;       // nodes of path k, root first

  // Checks the invariants that packing relies on (node 0 the only root, parent[i] < i, non-empty
  // nodes, per-token vectors sized like the tokens, finite weights of any sign, counts >= 0, a
  // weighted token has a count, valid paths; media: slots and state rows inside their node and
  // not overlapping, frames indexed in range, one state length, no media row a target);
  // throws tt::Error naming the tree id and what was expected.
  void validate() const;
  void validate_media(const std::string& what) const;  // the media part of validate()

  int64_t n_tree() const;          // unique tokens = sum of node lengths
  int64_t n_flat() const;          // sum of path lengths
  int64_t n_paths() const { return (int64_t)paths.size(); }
  int64_t n_flat_targets() const;  // targets summed over all flattened paths
  int64_t max_depth() const;       // tokens on the longest root-to-node chain: the largest position id + 1

  // The nodes in DFS preorder, each node's children in decreasing order of their subtrees' token
  // counts (kLargestFirst, ties in index order: the order pack() and the partitioner lay nodes out
  // in) or in index order (kListed). Any preorder gives the same attention (a subtree is a
  // contiguous range); kLargestFirst keeps the trunk of a comb (an episode's observations, an
  // agent's turns) contiguous with its leaves after it, instead of interleaving them, so a query
  // tile of the trunk sees dense key tiles rather than ones half made of sibling leaves
  // (docs/BENCHMARKS.md, fine-grained trees).
  std::vector<int> preorder(ChildOrder child_order = ChildOrder::kLargestFirst) const;
};

// Path k of a tree as a tree of its own (one node), with that sequence's own weights and mask:
// the per-path baseline of a run that executes trees as trees (segments, model/segments.h).
// Media (episode trees): the path's frame slots and state rows at their depths, and the frames
// they show (in order of first appearance).
Tree path_tree(const Tree& tree, int64_t k);

// A 64-bit FNV-1a hash of everything the trees hold that training reads (ids, parents, tokens,
// weights, counts, paths, media: frame files by name and in-memory pixels, slots, states): equal
// for equal data, for data-parallel ranks to check that they read the same trees.
uint64_t trees_fingerprint(const std::vector<Tree>& trees);

}  // namespace tt::data
