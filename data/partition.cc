// Tree partitioning (see partition.h for the contracts and the planner's optimality argument).
//
// Node indices satisfy parent[i] < i, so a backward sweep over the indices is a post-order (every
// child before its parent: the greedy's residuals) and a forward sweep flows from the root
// (depths). Pieces, node rows and the piece batches follow Tree::preorder (DFS preorder, larger
// subtrees first), the order pack() uses, so a piece batch is the restriction of the whole tree's batch.
#include "data/partition.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/check.h"

namespace tt::data {
namespace {

std::vector<std::vector<int>> children_of(const Tree& tree) {
  std::vector<std::vector<int>> children(tree.nodes.size());
  for (size_t i = 1; i < tree.nodes.size(); ++i) children[tree.nodes[i].parent].push_back((int)i);
  return children;
}

// Cuts every node of `tree` at the offsets cuts(node, first token's depth, length) gives
// (ascending, inside (0, length)); see split_long_nodes for why nothing else changes. Media rows
// move with their tokens: a slot or state row of node i at offset o belongs to the segment
// holding row o, at o minus the segment's start; a slot that a cut falls inside (segments; the
// partitioner's cuts avoid slots) becomes one part a segment (FrameSlot::first, count). `tree` is
// validated by the caller; nm is its NodeMedia.
template <class Cuts>
Tree split_nodes(const Tree& tree, const NodeMedia& nm, Cuts&& cuts) {
  Tree out;
  out.id = tree.id;
  out.media.tokens_per_frame = tree.media.tokens_per_frame;
  out.media.frames = tree.media.frames;
  std::vector<int> last(tree.nodes.size());     // original node -> index of its last segment
  std::vector<int64_t> depth(tree.nodes.size());  // of the node's first token
  std::vector<int64_t> at;
  for (size_t i = 0; i < tree.nodes.size(); ++i) {
    const Node& node = tree.nodes[i];
    const int64_t len = (int64_t)node.tokens.size();
    depth[i] = node.parent < 0 ? 0 : depth[node.parent] + (int64_t)tree.nodes[node.parent].tokens.size();
    int parent = node.parent < 0 ? -1 : last[node.parent];
    at.clear();
    cuts((int)i, depth[i], len, &at);
    at.push_back(len);
    const int first = (int)out.nodes.size();  // node i's first segment
    int64_t begin = 0;
    for (int64_t end : at) {
      Node seg;
      seg.parent = parent;
      seg.tokens.assign(node.tokens.begin() + begin, node.tokens.begin() + end);
      seg.target_weight.assign(node.target_weight.begin() + begin, node.target_weight.begin() + end);
      seg.target_count.assign(node.target_count.begin() + begin, node.target_count.begin() + end);
      out.nodes.push_back(std::move(seg));
      parent = (int)out.nodes.size() - 1;
      begin = end;
    }
    last[i] = parent;
    // The segment holding row o of node i, and o's offset in it.
    auto place = [&](int o, int* seg, int* offset) {
      const int j = (int)(std::upper_bound(at.begin(), at.end(), (int64_t)o) - at.begin());
      *seg = first + j;
      *offset = o - (j > 0 ? (int)at[j - 1] : 0);
    };
    const int P = tree.media.tokens_per_frame;
    for (int k : nm.slots[i]) {
      const FrameSlot& s = tree.media.slots[k];
      const int end = s.offset + s.rows(P);
      for (int o = s.offset; o < end;) {  // the slot's rows in each segment they fall in
        FrameSlot f = s;
        place(o, &f.node, &f.offset);
        const int part_end = std::min(end, (int)at[f.node - first]);
        f.first = s.first + (o - s.offset);
        f.count = part_end - o;
        if (f.first == 0 && f.count == P) f.count = 0;  // the whole frame
        out.media.slots.push_back(f);
        o = part_end;
      }
    }
    for (int k : nm.states[i]) {
      StateRow r = tree.media.states[k];
      place(r.offset, &r.node, &r.offset);
      out.media.states.push_back(std::move(r));
    }
  }
  out.paths = tree.paths;
  for (Path& p : out.paths) p.end_node = last[p.end_node];
  return out;
}

// The pieces whose roots are the nodes marked in is_root (node 0 among them), in DFS preorder,
// with their gateways, statistics and schedule (see Partition).
// `cut` and `advice` name the setting in the gateway-size error.
Partition build_partition(const Tree& tree, const std::vector<char>& is_root, int64_t capacity, const std::string& cut,
                          const char* advice) {
  const int n = (int)tree.nodes.size();
  auto len = [&](int v) { return (int64_t)tree.nodes[v].tokens.size(); };
  // Pieces in DFS preorder of their roots; nodes and rows in DFS preorder within each piece.
  Partition plan;
  plan.capacity = capacity;
  plan.piece_of_node.assign(n, -1);
  plan.row_of_node.assign(n, 0);
  std::vector<int64_t> depth(n, 0);
  for (int v : tree.preorder()) {
    const int p = tree.nodes[v].parent;
    depth[v] = p < 0 ? 0 : depth[p] + len(p);
    if (is_root[v]) {
      Piece piece;
      piece.root_node = v;
      piece.parent_piece = p < 0 ? -1 : plan.piece_of_node[p];
      piece.prefix_tokens = depth[v];
      plan.pieces.push_back(std::move(piece));
      const int k = plan.num_pieces() - 1;
      if (p >= 0) plan.pieces[plan.pieces[k].parent_piece].child_pieces.push_back(k);
    }
    const int k = is_root[v] ? plan.num_pieces() - 1 : plan.piece_of_node[p];
    Piece& piece = plan.pieces[k];
    plan.piece_of_node[v] = k;
    plan.row_of_node[v] = (int32_t)piece.tokens;
    piece.nodes.push_back(v);
    piece.tokens += len(v);
  }

  // Gateways: the chain from the root to the piece root's parent, root first, one range per run
  // of nodes whose rows follow each other in one piece. Per node v: ranges[v], the ranges of the
  // chain root..v, and run_top[v], the first node of v's run; so a gateway is built a range at a
  // time, and its total size is known before anything is allocated: a tiny capacity on a deep
  // tree (every node its own piece) lists ancestors quadratically, an error here rather than an
  // exhausted memory.
  std::vector<int64_t> ranges(n, 0);
  std::vector<int> run_top(n, 0);
  for (int v : tree.preorder()) {
    const int p = tree.nodes[v].parent;
    const bool joins = p >= 0 && plan.piece_of_node[p] == plan.piece_of_node[v] &&
                       plan.row_of_node[p] + len(p) == plan.row_of_node[v];
    ranges[v] = (p < 0 ? 0 : ranges[p]) + (joins ? 0 : 1);
    run_top[v] = joins ? run_top[p] : v;
  }
  int64_t total = 0, largest = 0;
  for (const Piece& piece : plan.pieces) {
    const int a = tree.nodes[piece.root_node].parent;
    if (a < 0) continue;
    total += ranges[a];
    largest = std::max(largest, ranges[a]);
  }
  if (total > kMaxGatewayRanges)
    throw Error(str("tree '", tree.id, "': ", cut, " cuts its ", tree.n_tree(), " tokens into ", plan.num_pieces(),
                    " pieces whose gateways would list ", total, " ancestor row ranges in all (", largest,
                    " for one piece), expected at most ", kMaxGatewayRanges, "; ", advice));
  for (Piece& piece : plan.pieces) {
    const int a = tree.nodes[piece.root_node].parent;
    if (a < 0) continue;
    piece.gateway.resize(ranges[a]);
    int x = a;  // walks up the chain a run at a time, filling the ranges from the last
    for (int64_t i = ranges[a] - 1; i >= 0; --i) {
      const int top = run_top[x];
      piece.gateway[i] = {plan.piece_of_node[x], plan.row_of_node[top], plan.row_of_node[x] + (int32_t)len(x)};
      x = tree.nodes[top].parent;
    }
  }

  // Statistics: chain sums (parents come first), the naive re-run count.
  std::vector<int64_t> chain_tokens(plan.num_pieces()), kept_tokens(plan.num_pieces());
  for (int k = 0; k < plan.num_pieces(); ++k) {
    const Piece& piece = plan.pieces[k];
    chain_tokens[k] = piece.tokens + (piece.parent_piece < 0 ? 0 : chain_tokens[piece.parent_piece]);
    plan.peak_tokens = std::max(plan.peak_tokens, chain_tokens[k]);
    const int64_t kept = piece.child_pieces.empty() ? 0 : piece.tokens;
    kept_tokens[k] = kept + (piece.parent_piece < 0 ? 0 : kept_tokens[piece.parent_piece]);
    plan.kept_peak_tokens = std::max(plan.kept_peak_tokens, kept_tokens[k]);
    plan.recompute_tokens += kept;
    plan.max_piece_tokens = std::max(plan.max_piece_tokens, piece.tokens);
    plan.naive_tokens += piece.tokens + piece.prefix_tokens;
  }

  // Schedule: forward, children recursively, backward (explicit stack of (piece, next child)).
  std::vector<std::pair<int, size_t>> stack = {{0, 0}};
  plan.schedule.push_back({0, Phase::kForward});
  while (!stack.empty()) {
    const int k = stack.back().first;
    const size_t next = stack.back().second;
    if (next < plan.pieces[k].child_pieces.size()) {
      const int c = plan.pieces[k].child_pieces[next];
      stack.back().second = next + 1;
      plan.schedule.push_back({c, Phase::kForward});
      stack.push_back({c, 0});
    } else {
      plan.schedule.push_back({k, Phase::kBackward});
      stack.pop_back();
    }
  }
  return plan;
}

}  // namespace

Tree split_long_nodes(const Tree& tree, int64_t max_len) {
  TT_CHECK(max_len >= 1, "split_long_nodes: max_len = ", max_len, ", expected >= 1");
  tree.validate();  // before the slots index anything
  const int64_t P = tree.media.tokens_per_frame;
  if (!tree.media.slots.empty() && P > max_len)
    throw Error(str("tree '", tree.id, "' has frames of ", P, " rows; a piece of at most ", max_len,
                    " tokens cannot hold one (expected a capacity >= ", P, ")"));
  const NodeMedia nm(tree);
  return split_nodes(tree, nm, [&](int node, int64_t, int64_t len, std::vector<int64_t>* at) {
    // Greedy: each segment max_len tokens, or up to the frame slot the cut would fall inside (at
    // most one: slots do not overlap; a slot of P <= max_len rows starts after the previous cut,
    // so the segment is never empty).
    for (int64_t c = max_len; c < len; c += max_len) {
      for (int k : nm.slots[node]) {
        const int64_t s = tree.media.slots[k].offset, e = s + tree.media.slots[k].rows((int)P);
        if (s < c && c < e) c = s;
      }
      at->push_back(c);
    }
  });
}

Partition plan_partition(const Tree& tree, int64_t capacity) {
  TT_CHECK(capacity >= 1, "plan_partition: capacity = ", capacity, ", expected >= 1");
  tree.validate();
  const int n = (int)tree.nodes.size();
  for (int i = 0; i < n; ++i) {
    const int64_t len = (int64_t)tree.nodes[i].tokens.size();
    if (len > capacity)
      throw Error(str("plan_partition: tree '", tree.id, "' node ", i, " has ", len, " tokens, expected <= capacity ",
                      capacity, " (split it first with split_long_nodes(tree, capacity))"));
  }
  TT_CHECK(tree.n_tree() <= std::numeric_limits<int32_t>::max(), "plan_partition: tree '", tree.id, "' has ",
           tree.n_tree(), " tokens, expected fewer than 2^31 (int32 rows)");
  const std::vector<std::vector<int>> children = children_of(tree);
  auto len = [&](int v) { return (int64_t)tree.nodes[v].tokens.size(); };

  // Greedy cut, children before parents.
  std::vector<int64_t> residual(n);
  std::vector<char> is_root(n, 0);
  is_root[0] = 1;
  std::vector<int> kept;
  for (int v = n - 1; v >= 0; --v) {
    int64_t r = len(v);
    for (int c : children[v]) r += residual[c];
    kept = children[v];
    std::stable_sort(kept.begin(), kept.end(), [&](int a, int b) { return residual[a] > residual[b]; });
    for (size_t k = 0; r > capacity; ++k) {  // every residual is <= capacity, so this ends with r <= capacity
      is_root[kept[k]] = 1;
      r -= residual[kept[k]];
    }
    residual[v] = r;
  }

  return build_partition(tree, is_root, capacity, str("capacity ", capacity),
                         "use a larger capacity (partition.capacity_tokens)");
}

SegmentPlan plan_segments(const Tree& tree, int64_t length) {
  TT_CHECK(length >= 1, "plan_segments: length = ", length, ", expected >= 1");
  TT_CHECK(tree.n_tree() <= std::numeric_limits<int32_t>::max(), "plan_segments: tree '", tree.id, "' has ",
           tree.n_tree(), " tokens, expected fewer than 2^31 (int32 rows)");
  SegmentPlan plan;
  plan.length = length;
  tree.validate();
  plan.split = split_nodes(tree, NodeMedia(tree), [&](int, int64_t depth, int64_t len, std::vector<int64_t>* at) {
    for (int64_t c = (length - depth % length) % length; c < len; c += length)
      if (c > 0) at->push_back(c);
  });
  const Tree& split = plan.split;
  const int n = (int)split.nodes.size();
  std::vector<int64_t> depth(n, 0);
  std::vector<char> is_root(n, 0);
  for (int v = 0; v < n; ++v) {
    const int p = split.nodes[v].parent;
    depth[v] = p < 0 ? 0 : depth[p] + (int64_t)split.nodes[p].tokens.size();
    is_root[v] = p < 0 || depth[v] % length == 0;
  }
  plan.pieces = build_partition(split, is_root, 0, str("segment length ", length),
                                "use a longer segment (segments.length)");
  plan.pieces.capacity = plan.pieces.max_piece_tokens;
  for (const Piece& piece : plan.pieces.pieces) plan.segment.push_back(piece.prefix_tokens / length);
  return plan;
}

int64_t tower_runs(const Tree& split_tree, const Partition& plan) {
  TT_CHECK(plan.piece_of_node.size() == split_tree.nodes.size(), "tower_runs: the plan covers ",
           plan.piece_of_node.size(), " nodes but tree '", split_tree.id, "' has ", split_tree.nodes.size(),
           ", expected the tree the plan was made for");
  std::vector<std::pair<int, int>> piece_frame;  // (piece, frame) per slot
  piece_frame.reserve(split_tree.media.slots.size());
  for (const FrameSlot& s : split_tree.media.slots) piece_frame.emplace_back(plan.piece_of_node[s.node], s.frame);
  std::sort(piece_frame.begin(), piece_frame.end());
  return std::unique(piece_frame.begin(), piece_frame.end()) - piece_frame.begin();
}

PackedBatch pack_piece(const Tree& split_tree, const Partition& plan, int piece) {
  TT_CHECK(piece >= 0 && piece < plan.num_pieces(), "pack_piece: piece ", piece, " out of range [0, ",
           plan.num_pieces(), ")");
  TT_CHECK(plan.piece_of_node.size() == split_tree.nodes.size(), "pack_piece: the plan covers ",
           plan.piece_of_node.size(), " nodes but tree '", split_tree.id, "' has ", split_tree.nodes.size(),
           ", expected the tree the plan was made for");
  const Piece& pc = plan.pieces[piece];
  const int m = (int)pc.nodes.size();
  PackedBatch b;
  b.tokens.reserve(pc.tokens);
  b.pos.reserve(pc.tokens);
  b.subtree_end.reserve(pc.tokens);
  std::unordered_map<int, int> local;  // tree node -> index within the piece
  local.reserve(m);
  for (int k = 0; k < m; ++k) {
    const int v = pc.nodes[k];
    const Node& node = split_tree.nodes[v];
    const int32_t start = (int32_t)b.tokens.size();
    const int32_t len = (int32_t)node.tokens.size();
    TT_CHECK(plan.piece_of_node[v] == piece && plan.row_of_node[v] == start, "pack_piece: node ", v,
             " does not lie in piece ", piece, " at row ", start, ", expected the tree the plan was made for");
    local[v] = k;
    const bool piece_root = k == 0;
    const int32_t parent_local = piece_root ? -1 : local.at(node.parent);
    // The node's first token: its depth; the parent's last row sources its target when in the piece.
    const int32_t depth = piece_root ? (int32_t)pc.prefix_tokens
                                     : b.pos[b.node_start[parent_local] + b.node_len[parent_local] - 1] + 1;
    b.node_start.push_back(start);
    b.node_len.push_back(len);
    b.node_parent.push_back(parent_local);
    for (int32_t j = 0; j < len; ++j) {
      b.tokens.push_back(node.tokens[j]);
      b.pos.push_back(depth + j);
      b.subtree_end.push_back(0);
      b.visible_pairs += depth + j + 1;
      if (node.target_count[j] > 0 && (j > 0 || !piece_root)) {
        b.tgt_src.push_back(j > 0 ? start + j - 1 : b.node_start[parent_local] + b.node_len[parent_local] - 1);
        b.tgt_tok.push_back(node.tokens[j]);
        b.tgt_w.push_back(node.target_weight[j]);
        b.tgt_cnt.push_back(node.target_count[j]);
      }
    }
  }
  // Child pieces' root tokens are predicted from this piece's branch points.
  for (int c : pc.child_pieces) {
    const Node& root = split_tree.nodes[plan.pieces[c].root_node];
    if (root.target_count[0] == 0) continue;
    const int q = local.at(root.parent);
    b.tgt_src.push_back(b.node_start[q] + b.node_len[q] - 1);
    b.tgt_tok.push_back(root.tokens[0]);
    b.tgt_w.push_back(root.target_weight[0]);
    b.tgt_cnt.push_back(root.target_count[0]);
  }
  // Subtree ends within the piece (children follow parents in preorder).
  std::vector<int32_t> end(m);
  for (int k = m - 1; k >= 0; --k) {
    end[k] = std::max(end[k], b.node_start[k] + b.node_len[k]);
    if (b.node_parent[k] >= 0) end[b.node_parent[k]] = std::max(end[b.node_parent[k]], end[k]);
  }
  for (int k = 0; k < m; ++k)
    for (int32_t j = 0; j < b.node_len[k]; ++j) b.subtree_end[b.node_start[k] + j] = end[k];
  b.tree_start = {0, (int32_t)b.tokens.size()};
  b.n_tokens = (int)b.tokens.size();
  b.n_tree = b.n_tokens;
  pack_nodes_media(split_tree, pc.nodes, b.node_start, b);  // the piece's frames, each once
  if (piece == 0) {
    b.n_paths = split_tree.n_paths();
    b.n_flat = split_tree.n_flat();
    b.n_flat_targets = split_tree.n_flat_targets();
  }
  return b;
}

}  // namespace tt::data
