// Helpers for the data tests: temp files, random rollouts and tree records, and the reference
// "what every path asks for" map that both packings must reproduce.
//
// A LossMap keys each target by (context tokens, target token) and sums its weight. The reference
// comes straight from the raw records (every sequence or root-to-leaf chain on its own); from a
// packed batch, a target's context is read through the visibility rule alone (key j is visible
// from row i iff j <= i < subtree_end[j]), so equal maps mean equal losses and correct visibility.
// Random weights are dyadic (multiples of 1/4), so every sum is exact and maps compare with ==.
#pragma once

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "data/packing.h"

namespace tt::data::testing {

// One sequence as a one-node tree with its path: every token but the first a target of weight 1.
inline Tree sequence_tree(const std::string& id, std::vector<int32_t> tokens) {
  Tree t;
  t.id = id;
  Node n;
  n.target_weight.assign(tokens.size(), 1.0);
  n.target_count.assign(tokens.size(), 1);
  if (!tokens.empty()) {
    n.target_weight[0] = 0;
    n.target_count[0] = 0;
  }
  n.tokens = std::move(tokens);
  t.nodes.push_back(n);
  Path p;
  p.target_weight = n.target_weight;
  t.paths.push_back(p);
  return t;
}

// The hand examples the reader, packing and stats tests check by hand-computed numbers.
// Rollouts: s0 [1 2 3 4 5] mask 00111 w1; s1 [1 2 3 6 7] mask 01111 w2; s2 [1 2 3] no mask w0.5;
// s3 = s0's tokens, no mask, w1. Trie: node0 [1 2 3] (s2 ends there, the rest diverge), node1
// [4 5] (s0, s3), node2 [6 7] (s1); 13 mask ones after position 0.
inline const char* kHandRollouts = R"({"id": "g", "sequences": [)"
                                   R"({"tokens": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 1, 1, 1], "weight": 1.0},)"
                                   R"({"tokens": [1, 2, 3, 6, 7], "loss_mask": [0, 1, 1, 1, 1], "weight": 2},)"
                                   R"({"tokens": [1, 2, 3], "weight": 0.5},)"
                                   R"({"tokens": [1, 2, 3, 4, 5]}]})";
// Tree format: node 0 [10 11]; 1 <- 0 [12 13] mask 01 w2; 2 <- 1 [14]; 3 <- 1 [15 16] w0.5;
// 4 <- 0 [17]. Leaves 2, 3, 4: paths of lengths 5, 6, 3.
inline const char* kHandTree = R"({"id": "t", "nodes": [)"
                               R"({"parent": -1, "tokens": [10, 11]},)"
                               R"({"parent": 0, "tokens": [12, 13], "loss_mask": [0, 1], "weight": 2},)"
                               R"({"parent": 1, "tokens": [14]},)"
                               R"({"parent": 1, "tokens": [15, 16], "weight": 0.5},)"
                               R"({"parent": 0, "tokens": [17]}]})";

using LossMap = std::map<std::pair<std::vector<int32_t>, int32_t>, double>;

// Writes `content` to $TEST_TMPDIR/name and returns the path.
inline std::string write_temp(const std::string& name, const std::string& content) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << content;
  return path;
}

// Drops entries whose summed weight is 0 (per-path packing leaves weight-0 targets out).
inline LossMap nonzero(LossMap m) {
  for (auto it = m.begin(); it != m.end();) it = it->second == 0 ? m.erase(it) : std::next(it);
  return m;
}

// The (context, target) -> weight map of a packed batch, contexts read through subtree_end.
inline LossMap loss_map(const PackedBatch& b) {
  LossMap m;
  for (size_t t = 0; t < b.tgt_src.size(); ++t) {
    const int i = b.tgt_src[t];
    std::vector<int32_t> ctx;
    for (int j = 0; j <= i; ++j)
      if (i < b.subtree_end[j]) ctx.push_back(b.tokens[j]);
    m[{ctx, b.tgt_tok[t]}] += b.tgt_w[t];
  }
  return nonzero(m);
}

struct RawSequence {
  std::vector<int32_t> tokens;
  std::vector<int> mask;  // empty: missing in the record
  double weight = 1.0;
};

// Reference map of rollouts sequences: each sequence alone, token 0 never a target.
inline LossMap rollouts_reference(const std::vector<RawSequence>& seqs) {
  LossMap m;
  for (const RawSequence& s : seqs)
    for (size_t j = 1; j < s.tokens.size(); ++j)
      if (s.mask.empty() || s.mask[j])
        m[{std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + j), s.tokens[j]}] += s.weight;
  return nonzero(m);
}

inline std::string rollouts_json(const std::string& id, const std::vector<RawSequence>& seqs) {
  nlohmann::json rec = {{"id", id}, {"sequences", nlohmann::json::array()}};
  for (const RawSequence& s : seqs) {
    nlohmann::json j = {{"tokens", s.tokens}, {"weight", s.weight}};
    if (!s.mask.empty()) j["loss_mask"] = s.mask;
    rec["sequences"].push_back(j);
  }
  return rec.dump();
}

// Random rollouts group over a tiny vocabulary (lots of sharing), with duplicates, prefixes of
// earlier sequences, missing masks and zero weights. first_tokens > 1 makes several roots likely.
inline std::vector<RawSequence> random_rollouts(std::mt19937& rng, int vocab, int first_tokens) {
  auto uni = [&](int n) { return (int)(rng() % (uint32_t)n); };
  const double weights[] = {0.0, 0.25, 0.5, 1.0, 2.0};
  std::vector<RawSequence> seqs(1 + uni(6));
  for (size_t i = 0; i < seqs.size(); ++i) {
    RawSequence& s = seqs[i];
    const int kind = uni(4);
    if (i > 0 && kind == 0) {
      s.tokens = seqs[uni((int)i)].tokens;  // duplicate
    } else if (i > 0 && kind == 1) {
      s.tokens = seqs[uni((int)i)].tokens;  // prefix (or extension) of an earlier one
      s.tokens.resize(1 + uni((int)s.tokens.size() + 3), (int32_t)uni(vocab));
    } else {
      s.tokens.resize(1 + uni(10));
      for (auto& t : s.tokens) t = (int32_t)uni(vocab);
      s.tokens[0] = (int32_t)uni(first_tokens);
    }
    if (uni(3) > 0) {
      s.mask.resize(s.tokens.size());
      for (auto& m : s.mask) m = uni(3) > 0;
    }
    s.weight = weights[uni(5)];
  }
  return seqs;
}

struct RawNode {
  int parent = -1;
  std::vector<int32_t> tokens;
  std::vector<int> mask;  // empty: missing in the record
  double weight = 1.0;
};

// Reference map of a tree record: each root-to-leaf chain alone, node weights and masks.
inline LossMap tree_reference(const std::vector<RawNode>& nodes) {
  const int n = (int)nodes.size();
  std::vector<bool> has_child(n, false);
  for (int i = 1; i < n; ++i) has_child[nodes[i].parent] = true;
  LossMap m;
  for (int leaf = 0; leaf < n; ++leaf) {
    if (has_child[leaf]) continue;
    std::vector<int> chain;
    for (int c = leaf; c >= 0; c = nodes[c].parent) chain.insert(chain.begin(), c);
    std::vector<int32_t> ctx;
    for (int c : chain) {
      for (size_t j = 0; j < nodes[c].tokens.size(); ++j) {
        const bool target = !ctx.empty() && (nodes[c].mask.empty() || nodes[c].mask[j]);
        if (target) m[{ctx, nodes[c].tokens[j]}] += nodes[c].weight;
        ctx.push_back(nodes[c].tokens[j]);
      }
    }
  }
  return nonzero(m);
}

inline std::string tree_json(const std::string& id, const std::vector<RawNode>& nodes) {
  nlohmann::json rec = {{"id", id}, {"nodes", nlohmann::json::array()}};
  for (const RawNode& nd : nodes) {
    nlohmann::json j = {{"parent", nd.parent}, {"tokens", nd.tokens}, {"weight", nd.weight}};
    if (!nd.mask.empty()) j["loss_mask"] = nd.mask;
    rec["nodes"].push_back(j);
  }
  return rec.dump();
}

// Random tree record: parents are any earlier node, so listing order is not DFS order.
inline std::vector<RawNode> random_tree(std::mt19937& rng, int vocab) {
  auto uni = [&](int n) { return (int)(rng() % (uint32_t)n); };
  const double weights[] = {0.0, 0.25, 0.5, 1.0, 2.0};
  std::vector<RawNode> nodes(1 + uni(10));
  for (int i = 0; i < (int)nodes.size(); ++i) {
    RawNode& nd = nodes[i];
    nd.parent = i == 0 ? -1 : uni(i);
    nd.tokens.resize(1 + uni(4));
    for (auto& t : nd.tokens) t = (int32_t)uni(vocab);
    if (uni(3) > 0) {
      nd.mask.resize(nd.tokens.size());
      for (auto& m : nd.mask) m = uni(3) > 0;
    }
    nd.weight = weights[uni(5)];
  }
  return nodes;
}

}  // namespace tt::data::testing
