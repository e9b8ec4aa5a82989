// Prefix trees: path helpers, sizes and the structural check that packing relies on.
//
// Node indices satisfy parent[i] < i, so one forward pass over the nodes computes anything that
// flows from the root (depths); paths are recovered by walking parent links from end_node.
#include "data/tree.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace tt::data {

std::vector<int> Tree::path_nodes(int64_t k) const {
  TT_CHECK(k >= 0 && k < n_paths(), "tree '", id, "': path ", k, " out of range [0, ", n_paths(), ")");
  std::vector<int> chain;
  for (int n = paths[k].end_node; n >= 0; n = nodes[n].parent) chain.push_back(n);
  std::reverse(chain.begin(), chain.end());
  return chain;
}

std::vector<int32_t> Tree::path_tokens(int64_t k) const {
  std::vector<int32_t> out;
  for (int n : path_nodes(k)) out.insert(out.end(), nodes[n].tokens.begin(), nodes[n].tokens.end());
  return out;
}

int64_t Tree::n_tree() const {
  int64_t n = 0;
  for (const Node& node : nodes) n += (int64_t)node.tokens.size();
  return n;
}

int64_t Tree::n_flat() const {
  // Path length = tokens on the root-to-end chain; prefix sums over nodes make it O(1) per path.
  std::vector<int64_t> end_depth(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    int p = nodes[i].parent;
    end_depth[i] = (p >= 0 ? end_depth[p] : 0) + (int64_t)nodes[i].tokens.size();
  }
  int64_t n = 0;
  for (const Path& path : paths) n += end_depth[path.end_node];
  return n;
}

int64_t Tree::n_flat_targets() const {
  // target_count sums, per token, the paths that make it a target.
  int64_t n = 0;
  for (const Node& node : nodes)
    for (int32_t c : node.target_count) n += c;
  return n;
}

int64_t Tree::max_depth() const {
  std::vector<int64_t> end_depth(nodes.size());
  int64_t m = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int p = nodes[i].parent;
    end_depth[i] = (p >= 0 ? end_depth[p] : 0) + (int64_t)nodes[i].tokens.size();
    m = std::max(m, end_depth[i]);
  }
  return m;
}

std::vector<int> Tree::preorder(ChildOrder child_order) const {
  const int n = (int)nodes.size();
  std::vector<int64_t> size(n);  // tokens of each node's subtree (children have larger indices)
  if (child_order == ChildOrder::kLargestFirst)
    for (int i = n - 1; i >= 0; --i) {
      size[i] += (int64_t)nodes[i].tokens.size();
      if (nodes[i].parent >= 0) size[nodes[i].parent] += size[i];
    }
  std::vector<std::vector<int>> children(n);
  for (int i = 1; i < n; ++i) children[nodes[i].parent].push_back(i);
  std::vector<int> order;
  order.reserve(n);
  std::vector<int> stack = {0};  // explicit: trees can be deep chains
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    order.push_back(v);
    std::vector<int>& c = children[v];
    if (child_order == ChildOrder::kLargestFirst)
      std::stable_sort(c.begin(), c.end(), [&](int a, int b) { return size[a] > size[b]; });
    for (auto it = c.rbegin(); it != c.rend(); ++it) stack.push_back(*it);
  }
  return order;
}

void Tree::validate() const {
  const std::string t = "tree '" + id + "'";
  if (nodes.empty()) throw Error(str(t, ": has no nodes, expected a root node 0"));
  if (paths.empty()) throw Error(str(t, ": has no paths, expected at least one"));
  std::vector<int64_t> end_depth(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& nd = nodes[i];
    if (i == 0 && nd.parent != -1)
      throw Error(str(t, ": node 0 has parent ", nd.parent, ", expected -1 (node 0 is the root)"));
    if (i > 0 && (nd.parent < 0 || nd.parent >= (int)i))
      throw Error(str(t, ": node ", i, " has parent ", nd.parent, ", expected an earlier node in [0, ", i, ")"));
    if (nd.tokens.empty()) throw Error(str(t, ": node ", i, " has no tokens, expected at least one"));
    if (nd.target_weight.size() != nd.tokens.size() || nd.target_count.size() != nd.tokens.size())
      throw Error(str(t, ": node ", i, " has ", nd.tokens.size(), " tokens but ", nd.target_weight.size(),
                      " target weights and ", nd.target_count.size(), " target counts, expected one each per token"));
    for (size_t j = 0; j < nd.tokens.size(); ++j) {
      if (!std::isfinite(nd.target_weight[j]) || nd.target_count[j] < 0)
        throw Error(str(t, ": node ", i, " token ", j, " has target weight ", nd.target_weight[j], " and count ",
                        nd.target_count[j], ", expected a finite weight (of any sign) and a count >= 0"));
      if (nd.target_weight[j] != 0 && nd.target_count[j] == 0)
        throw Error(str(t, ": node ", i, " token ", j, " has target weight ", nd.target_weight[j],
                        " but target count 0, expected a count > 0 for every weighted token"));
    }
    if (i == 0 && (nd.target_weight[0] != 0 || nd.target_count[0] != 0))
      throw Error(str(t, ": the root's first token has a target, expected none (nothing predicts it)"));
    end_depth[i] = (i > 0 ? end_depth[nd.parent] : 0) + (int64_t)nd.tokens.size();
  }
  for (size_t k = 0; k < paths.size(); ++k) {
    const Path& p = paths[k];
    if (p.end_node < 0 || p.end_node >= (int)nodes.size())
      throw Error(str(t, ": path ", k, " ends at node ", p.end_node, ", expected a node in [0, ", nodes.size(), ")"));
    if ((int64_t)p.target_weight.size() != end_depth[p.end_node])
      throw Error(str(t, ": path ", k, " has ", p.target_weight.size(), " target weights, expected ",
                      end_depth[p.end_node], " (one per token of the path)"));
    if (p.target_weight[0] != 0)
      throw Error(str(t, ": path ", k, " gives its first token a target weight, expected 0"));
    if (!p.target_mask.empty() && (p.target_mask.size() != p.target_weight.size() || p.target_mask[0] != 0))
      throw Error(str(t, ": path ", k, " has a target mask of ", p.target_mask.size(), " entries for ",
                      p.target_weight.size(), " tokens (expected one per token, the first 0)"));
  }
  validate_media(t);
}

NodeMedia::NodeMedia(const Tree& t) : slots(t.nodes.size()), states(t.nodes.size()) {
  for (size_t k = 0; k < t.media.slots.size(); ++k) slots[t.media.slots[k].node].push_back((int)k);
  for (size_t k = 0; k < t.media.states.size(); ++k) states[t.media.states[k].node].push_back((int)k);
}

int64_t Tree::frames_shown() const {
  std::vector<char> shown(media.frames.size(), 0);
  int64_t n = 0;
  for (const FrameSlot& s : media.slots) n += !shown[s.frame], shown[s.frame] = 1;
  return n;
}

void Tree::validate_media(const std::string& t) const {
  if (media.empty()) return;
  const TreeMedia& m = media;
  if (!m.slots.empty() && m.tokens_per_frame < 1)
    throw Error(str(t, ": ", m.slots.size(), " frame slots with tokens_per_frame ", m.tokens_per_frame,
                    ", expected >= 1"));
  std::vector<std::vector<uint8_t>> used(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) used[i].assign(nodes[i].tokens.size(), 0);
  // Rows [offset, offset + len) of node: inside it, no other media row, and never a target (a
  // media row's token is a placeholder: predicting it would train on nothing).
  auto claim = [&](const char* what, size_t k, int node, int offset, int len) {
    if (node < 0 || node >= (int)nodes.size() || offset < 0 || offset + len > (int)nodes[node].tokens.size())
      throw Error(str(t, ": ", what, " ", k, " covers rows [", offset, ", ", (int64_t)offset + len, ") of node ", node,
                      ", expected rows inside an existing node"));
    for (int j = offset; j < offset + len; ++j) {
      if (used[node][j]) throw Error(str(t, ": ", what, " ", k, " overlaps another media row at node ", node, " row ", j));
      if (nodes[node].target_count[j] != 0)
        throw Error(str(t, ": ", what, " ", k, " covers row ", j, " of node ", node,
                        ", which is a target; expected media rows never to be predicted"));
      used[node][j] = 1;
    }
  };
  for (size_t k = 0; k < m.slots.size(); ++k) {
    const FrameSlot& s = m.slots[k];
    if (s.frame < 0 || s.frame >= (int)m.frames.size())
      throw Error(str(t, ": frame slot ", k, " shows frame ", s.frame, ", expected one of the tree's ", m.frames.size(),
                      " frames"));
    if (s.count < 0 || s.first < 0 || (s.count == 0 && s.first != 0) || s.first + s.rows(m.tokens_per_frame) > m.tokens_per_frame)
      throw Error(str(t, ": frame slot ", k, " shows tokens [", s.first, ", ", s.first + s.rows(m.tokens_per_frame),
                      ") of its frame, expected a non-empty part of its ", m.tokens_per_frame, " tokens"));
    claim("frame slot", k, s.node, s.offset, s.rows(m.tokens_per_frame));
  }
  for (size_t k = 0; k < m.states.size(); ++k) {
    const StateRow& s = m.states[k];
    if (s.values.empty() || s.values.size() != m.states[0].values.size())
      throw Error(str(t, ": state row ", k, " has ", s.values.size(), " values, expected ", m.states[0].values.size(),
                      " (every state row of a tree the same length, at least one)"));
    for (float v : s.values)
      if (!std::isfinite(v)) throw Error(str(t, ": state row ", k, " holds ", v, ", expected finite values"));
    claim("state row", k, s.node, s.offset, 1);
  }
}

Tree path_tree(const Tree& tree, int64_t k) {
  TT_CHECK(k >= 0 && k < tree.n_paths(), "path_tree: path ", k, " of tree '", tree.id, "' with ", tree.n_paths(),
           " paths");
  const Path& p = tree.paths[k];
  Tree out;
  out.id = str(tree.id, "/path", k);
  Node n;
  n.tokens = tree.path_tokens(k);
  n.target_weight = p.target_weight;
  for (size_t j = 0; j < n.tokens.size(); ++j) n.target_count.push_back(j > 0 && p.is_target(j) ? 1 : 0);
  out.nodes.push_back(std::move(n));
  Path q = p;
  q.end_node = 0;
  out.paths.push_back(std::move(q));
  if (tree.media.empty()) return out;
  // Media: the slots and state rows of the path's nodes, at their depth on the path (node 0's
  // offsets), and the frames they show, renumbered in order of first appearance.
  const std::vector<int> nodes = tree.path_nodes(k);
  std::vector<int> start(tree.nodes.size(), -1);  // a path node's first depth
  int depth = 0;
  for (int v : nodes) {
    start[v] = depth;
    depth += (int)tree.nodes[v].tokens.size();
  }
  TreeMedia& m = out.media;
  m.tokens_per_frame = tree.media.tokens_per_frame;
  for (const FrameSlot& s : tree.media.slots)
    if (start[s.node] >= 0) {
      FrameSlot f = s;
      f.node = 0;
      f.offset += start[s.node];
      m.slots.push_back(f);
    }
  for (const StateRow& r : tree.media.states)
    if (start[r.node] >= 0) m.states.push_back({0, start[r.node] + r.offset, r.values});
  std::sort(m.slots.begin(), m.slots.end(), [](const FrameSlot& a, const FrameSlot& b) { return a.offset < b.offset; });
  std::sort(m.states.begin(), m.states.end(), [](const StateRow& a, const StateRow& b) { return a.offset < b.offset; });
  std::vector<int> frame_of(tree.media.frames.size(), -1);
  for (FrameSlot& s : m.slots) {
    if (frame_of[s.frame] < 0) {
      frame_of[s.frame] = (int)m.frames.size();
      m.frames.push_back(tree.media.frames[s.frame]);
    }
    s.frame = frame_of[s.frame];
  }
  return out;
}

namespace {

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001b3ull;
  }
  template <class T>
  void value(const T& x) {
    bytes(&x, sizeof x);
  }
  template <class T>
  void vec(const std::vector<T>& v) {  // its length, then its elements
    value((uint64_t)v.size());
    if (!v.empty()) bytes(v.data(), v.size() * sizeof(T));
  }
  void text(const std::string& s) {
    value((uint64_t)s.size());
    bytes(s.data(), s.size());
  }
};

}  // namespace

uint64_t trees_fingerprint(const std::vector<Tree>& trees) {
  Fnv f;
  f.value((uint64_t)trees.size());
  for (const Tree& t : trees) {
    f.text(t.id);
    f.value((uint64_t)t.nodes.size());
    for (const Node& n : t.nodes) {
      f.value(n.parent);
      f.vec(n.tokens);
      f.vec(n.target_weight);
      f.vec(n.target_count);
    }
    f.value((uint64_t)t.paths.size());
    for (const Path& p : t.paths) {
      f.value(p.end_node);
      f.vec(p.target_weight);
      f.vec(p.target_mask);
    }
    f.value(t.media.tokens_per_frame);
    f.value((uint64_t)t.media.frames.size());
    for (const FrameRef& r : t.media.frames) {
      f.value(r.episode);
      f.value(r.step);
      f.value(r.camera);
      f.text(r.path);
      if (r.pixels) f.vec(*r.pixels);
    }
    f.value((uint64_t)t.media.slots.size());
    for (const FrameSlot& s : t.media.slots) {
      f.value(s.node);
      f.value(s.offset);
      f.value(s.frame);
      f.value(s.first);
      f.value(s.count);
    }
    f.value((uint64_t)t.media.states.size());
    for (const StateRow& r : t.media.states) {
      f.value(r.node);
      f.value(r.offset);
      f.vec(r.values);
    }
  }
  return f.h;
}

}  // namespace tt::data
