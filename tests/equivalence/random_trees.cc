// Random trees in both input formats; see random_trees.h.
#include "tests/equivalence/random_trees.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace tt::testing {

uint64_t Rng::next() {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int Rng::uniform(int lo, int hi) { return lo + (int)(next() % (uint64_t)(hi - lo + 1)); }

double Rng::unit() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }

namespace {

void write_tokens(std::ostringstream& os, const char* key, int n, int vocab, Rng& rng) {
  os << "\"" << key << "\": [";
  for (int i = 0; i < n; ++i) os << (i ? "," : "") << rng.uniform(0, vocab - 1);
  os << "]";
}

void write_mask(std::ostringstream& os, int n, Rng& rng) {
  os << "\"loss_mask\": [";
  for (int i = 0; i < n; ++i) os << (i ? "," : "") << (rng.unit() < 0.6 ? 1 : 0);
  os << "]";
}

// A node or sequence weight of the shape ("" when the shape has none).
std::string random_weight(const TreeShape& shape, Rng& rng) {
  std::ostringstream os;
  if (shape.signed_weights) {
    os.precision(17);
    os << ", \"weight\": " << (rng.unit() < 0.25 ? 0.0 : -2.0 + 4.0 * rng.unit());
  } else if (shape.weights) {
    os << ", \"weight\": " << 0.25 + 2.0 * rng.unit();
  }
  return os.str();
}

}  // namespace

std::string random_tree_line(const TreeShape& shape, int vocab, Rng& rng, const std::string& id) {
  // Grow nodes breadth-first: each node at depth < max_depth gets 0..max_children children,
  // the root at least one so the tree has a branch or a chain below it.
  struct Pending { int parent, depth; };
  std::vector<Pending> nodes{{-1, 1}};
  for (size_t i = 0; i < nodes.size() && nodes.size() < 40; ++i) {
    if (nodes[i].depth >= shape.max_depth) continue;
    int kids = rng.uniform(i == 0 ? 1 : 0, shape.max_children);
    for (int c = 0; c < kids; ++c) nodes.push_back({(int)i, nodes[i].depth + 1});
  }
  std::ostringstream os;
  os << "{\"id\": \"" << id << "\", \"nodes\": [";
  for (size_t i = 0; i < nodes.size(); ++i) {
    int len = rng.uniform(shape.min_len, shape.max_len);
    os << (i ? ", " : "") << "{\"parent\": " << nodes[i].parent << ", ";
    write_tokens(os, "tokens", len, vocab, rng);
    if (shape.partial_masks) { os << ", "; write_mask(os, len, rng); }
    os << random_weight(shape, rng) << "}";
  }
  os << "]}";
  return os.str();
}

std::string random_rollouts_line(const TreeShape& shape, int vocab, Rng& rng, const std::string& id) {
  // Sequences that share random prefixes: each new sequence copies a random prefix of an earlier
  // one (sometimes all of it, so one sequence can be a prefix of another, or a duplicate) and
  // appends fresh tokens.
  int n_seq = rng.uniform(2, 2 + shape.max_children * shape.max_depth / 2);
  std::vector<std::vector<int>> seqs;
  int first = rng.uniform(0, vocab - 1);
  for (int s = 0; s < n_seq; ++s) {
    std::vector<int> seq;
    if (!seqs.empty()) {
      const auto& base = seqs[rng.uniform(0, (int)seqs.size() - 1)];
      int keep = rng.uniform(1, (int)base.size());
      seq.assign(base.begin(), base.begin() + keep);
    } else {
      seq.push_back(first);
    }
    int extra = rng.uniform(seqs.empty() ? shape.min_len : 0, shape.max_len * 2);
    for (int i = 0; i < extra; ++i) seq.push_back(rng.uniform(0, vocab - 1));
    seqs.push_back(seq);
  }
  std::ostringstream os;
  os << "{\"id\": \"" << id << "\", \"sequences\": [";
  for (size_t s = 0; s < seqs.size(); ++s) {
    os << (s ? ", " : "") << "{\"tokens\": [";
    for (size_t i = 0; i < seqs[s].size(); ++i) os << (i ? "," : "") << seqs[s][i];
    os << "]";
    if (shape.partial_masks) { os << ", "; write_mask(os, (int)seqs[s].size(), rng); }
    os << random_weight(shape, rng) << "}";
  }
  os << "]}";
  return os.str();
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

const std::vector<TreeShape>& tree_shapes() {
  static const std::vector<TreeShape> shapes = {
      {"SingleTokenNodes", 5, 3, 1, 1, false, false},
      {"DeepChain", 12, 1, 1, 4, false, false},
      {"WideFan", 2, 8, 1, 3, false, false},
      {"BranchPointsMasksWeights", 4, 3, 1, 5, true, true},
      {"SignedWeights", 4, 3, 1, 5, true, false, true},
      {"Mixed", 5, 2, 1, 6, true, true},
  };
  return shapes;
}

}  // namespace tt::testing
