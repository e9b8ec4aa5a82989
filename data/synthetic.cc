// Synthetic tree data with a learnable pattern (see synthetic.h).
//
// Each tree draws a key k from kNumKeys odd values; its token stream follows
//   x[t+1] = (kMul * x[t] + k) mod V,
// restarting at a random token at every branch start (siblings get distinct starts, so they
// really branch). A model that reads one earlier (x[t], x[t+1]) pair of the tree knows k and can
// predict every token but the branch starts; a bigram model alone gets to log(kNumKeys). So the
// loss falls from log(V) to well below log(kNumKeys) once attention picks up the key.
//
// Shapes (all from SyntheticSpec):
//  - rollouts: a prompt of prompt_len tokens (mask 0), then `turns` turns of turn_len tokens
//    (mask 1); each of the first branch_turns turns forks into `branches` children, so a group has
//    branches^branch_turns sequences, written out flat (the reader merges them back).
//  - comb (tree format): a prefix node (mask 0), then per step a history node on the trunk
//    (mask 0) and a leaf hanging off it whose last max(1, leaf_len / 4) tokens are the action
//    (mask 1), the rest the observation (mask 0). Nodes are listed prefix, h1, l1, h2, l2, ...
// Every tree has its own generator seeded from (seed, tree index), and lines are written with
// plain integer formatting, so large shapes (e.g. 4096-token prompts, 6 turns of 1024 tokens,
// 4 x 4 branches) stay cheap.
#include "data/synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "data/rng.h"
#include "base/check.h"
#include "base/files.h"

namespace tt::data {
namespace {

constexpr int64_t kMul = 5;      // LCG multiplier: a = 1 mod 4 gives full period mod 2^n for odd keys
constexpr int64_t kNumKeys = 8;  // keys 1, 3, ..., 15 (mod V)
constexpr int64_t kMaxLeaves = 1 << 20;

// a * b and a + b, held at INT64_MAX instead of overflowing (the operands are >= 0).
int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
int64_t add_sat(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

// A tree's token rule.
struct Stream {
  int64_t vocab;
  int64_t key;
  int32_t next(int32_t prev) const { return (int32_t)((kMul * prev + key) % vocab); }
  // Appends len tokens: `first`, then the rule.
  void append(int32_t first, int len, std::vector<int32_t>& out) const {
    int32_t x = first;
    for (int i = 0; i < len; ++i) {
      out.push_back(x);
      x = next(x);
    }
  }
};

void append_int(std::string& s, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  s.append(buf, res.ptr);
}

template <class T>
void append_array(std::string& s, const char* key, const std::vector<T>& values) {
  s += '"';
  s += key;
  s += "\":[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) s += ',';
    append_int(s, (int64_t)values[i]);
  }
  s += ']';
}

std::string tree_id(const SyntheticSpec& spec, int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%06d", i);
  return spec.kind + "-" + buf;
}

void check_spec(const SyntheticSpec& spec) {
  auto positive = [](int v, const char* name) {
    if (v < 1) throw Error(str("synthetic.", name, " = ", v, ", expected >= 1"));
  };
  if (spec.kind != "rollouts" && spec.kind != "comb")
    throw Error(str("synthetic.kind = '", spec.kind, "', expected \"rollouts\" or \"comb\""));
  positive(spec.num_trees, "num_trees");
  if (spec.vocab_size < 2) throw Error(str("synthetic.vocab_size = ", spec.vocab_size, ", expected >= 2"));
  if (spec.kind == "rollouts") {
    positive(spec.prompt_len, "prompt_len");
    positive(spec.turns, "turns");
    positive(spec.turn_len, "turn_len");
    positive(spec.branches, "branches");
    if (spec.branches > spec.vocab_size)
      throw Error(str("synthetic.branches = ", spec.branches, ", expected <= vocab_size = ", spec.vocab_size,
                      " (siblings start with distinct tokens)"));
    if (spec.branch_turns < 0 || spec.branch_turns > spec.turns)
      throw Error(str("synthetic.branch_turns = ", spec.branch_turns, ", expected in [0, turns = ", spec.turns, "]"));
    int64_t leaves = 1;
    for (int t = 0; t < spec.branch_turns; ++t) {
      leaves *= spec.branches;
      if (leaves > kMaxLeaves)
        throw Error(str("synthetic: branches^branch_turns = ", spec.branches, "^", spec.branch_turns,
                        " sequences per group, expected at most ", kMaxLeaves));
    }
  } else {
    positive(spec.prefix_len, "prefix_len");
    positive(spec.steps, "steps");
    positive(spec.history_len, "history_len");
    positive(spec.leaf_len, "leaf_len");
  }
  // The sizes together: the tokens one line writes, and the file's.
  const int64_t per_tree = tree_tokens(spec);
  const std::string shape =
      spec.kind == "rollouts"
          ? str("branches^branch_turns x (prompt_len + turns x turn_len) = ", spec.branches, "^", spec.branch_turns,
                " x (", spec.prompt_len, " + ", spec.turns, " x ", spec.turn_len,
                ") (--branches, --branch-turns, --prompt-len, --turns, --turn-len)")
          : str("prefix_len + steps x (history_len + leaf_len) = ", spec.prefix_len, " + ", spec.steps, " x (",
                spec.history_len, " + ", spec.leaf_len, ") (--prefix-len, --steps, --history-len, --leaf-len)");
  if (per_tree > kMaxTreeTokens)
    throw Error(str("synthetic: a tree of ", shape, " is ", per_tree == INT64_MAX ? "over 2^63" : str(per_tree),
                    " tokens, expected at most 2^28 = ", kMaxTreeTokens));
  const int64_t total = mul_sat(spec.num_trees, per_tree);
  if (total > kMaxFileTokens)
    throw Error(str("synthetic: num_trees x tokens a tree = ", spec.num_trees, " x ", per_tree, " = ", total,
                    " tokens (--num-trees; a tree of ", shape, "), expected at most 2^31 = ", kMaxFileTokens,
                    " in a file"));
}

std::string rollouts_line(const SyntheticSpec& spec, int index, SplitMix64& rng, const Stream& s) {
  // Segments of the conceptual tree: the prompt, then one per turn and branch.
  struct Segment {
    int parent;
    std::vector<int32_t> tokens;
  };
  std::vector<Segment> segs(1);
  segs[0].parent = -1;
  s.append((int32_t)rng.below(s.vocab), spec.prompt_len, segs[0].tokens);
  std::vector<int> frontier = {0};
  for (int t = 0; t < spec.turns; ++t) {
    std::vector<int> next;
    for (int p : frontier) {
      const int32_t prev_last = segs[p].tokens.back();
      if (t < spec.branch_turns) {
        const int64_t r = (int64_t)rng.below(s.vocab);
        for (int b = 0; b < spec.branches; ++b) {
          segs.push_back({p, {}});
          s.append((int32_t)((r + b) % s.vocab), spec.turn_len, segs.back().tokens);
          next.push_back((int)segs.size() - 1);
        }
      } else {
        segs.push_back({p, {}});
        s.append(s.next(prev_last), spec.turn_len, segs.back().tokens);
        next.push_back((int)segs.size() - 1);
      }
    }
    frontier = std::move(next);
  }

  std::string line = "{\"id\":\"" + tree_id(spec, index) + "\",\"sequences\":[";
  std::vector<int32_t> tokens;
  std::vector<int32_t> mask;
  for (size_t leaf = 0; leaf < frontier.size(); ++leaf) {
    std::vector<int> chain;
    for (int c = frontier[leaf]; c >= 0; c = segs[c].parent) chain.push_back(c);
    tokens.clear();
    mask.clear();
    for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
      tokens.insert(tokens.end(), segs[*c].tokens.begin(), segs[*c].tokens.end());
      mask.insert(mask.end(), segs[*c].tokens.size(), *c == 0 ? 0 : 1);
    }
    if (leaf) line += ',';
    line += '{';
    append_array(line, "tokens", tokens);
    line += ',';
    append_array(line, "loss_mask", mask);
    line += ",\"weight\":1.0}";
  }
  line += "]}";
  return line;
}

std::string comb_line(const SyntheticSpec& spec, int index, SplitMix64& rng, const Stream& s) {
  std::string line = "{\"id\":\"" + tree_id(spec, index) + "\",\"nodes\":[";
  std::vector<int32_t> tokens;
  std::vector<int32_t> mask;
  auto add_node = [&](int parent, int32_t first, int len, int action_len) {
    tokens.clear();
    s.append(first, len, tokens);
    mask.assign(len, 0);
    for (int i = len - action_len; i < len; ++i) mask[i] = 1;
    if (parent >= 0) line += ',';
    line += "{\"parent\":";
    append_int(line, parent);
    line += ',';
    append_array(line, "tokens", tokens);
    line += ',';
    append_array(line, "loss_mask", mask);
    line += ",\"weight\":1.0}";
    return tokens.back();
  };
  const int action_len = std::max(1, spec.leaf_len / 4);
  int32_t trunk_last = add_node(-1, (int32_t)rng.below(s.vocab), spec.prefix_len, 0);
  int trunk = 0;
  int n_nodes = 1;
  for (int step = 0; step < spec.steps; ++step) {
    // History continues the trunk's stream; the leaf (observation, action) starts at random.
    trunk_last = add_node(trunk, s.next(trunk_last), spec.history_len, 0);
    trunk = n_nodes++;
    add_node(trunk, (int32_t)rng.below(s.vocab), spec.leaf_len, action_len);
    ++n_nodes;
  }
  line += "]}";
  return line;
}

// Tree i's line: its kind's shape from its own generator.
std::string tree_line(const SyntheticSpec& spec, int i) {
  SplitMix64 rng(mix64(spec.seed) ^ mix64(0x7ee50000ULL + (uint64_t)i));
  const int64_t n_keys = std::min<int64_t>(kNumKeys, spec.vocab_size);
  const Stream stream{spec.vocab_size, (int64_t)((2 * rng.below(n_keys) + 1) % spec.vocab_size)};
  return spec.kind == "rollouts" ? rollouts_line(spec, i, rng, stream) : comb_line(spec, i, rng, stream);
}

}  // namespace

int64_t tree_tokens(const SyntheticSpec& spec) {
  if (spec.kind == "rollouts") {
    int64_t leaves = 1;
    for (int t = 0; t < spec.branch_turns; ++t) leaves = mul_sat(leaves, spec.branches);
    return mul_sat(leaves, add_sat(spec.prompt_len, mul_sat(spec.turns, spec.turn_len)));
  }
  return add_sat(spec.prefix_len, mul_sat(spec.steps, add_sat(spec.history_len, spec.leaf_len)));
}

std::vector<std::string> generate_jsonl(const SyntheticSpec& spec) {
  check_spec(spec);
  std::vector<std::string> lines;
  lines.reserve(spec.num_trees);
  for (int i = 0; i < spec.num_trees; ++i) lines.push_back(tree_line(spec, i));
  return lines;
}

SyntheticSpec published_example_spec() {
  SyntheticSpec spec;
  spec.kind = "comb";
  spec.num_trees = 1;
  spec.vocab_size = 32000;
  spec.prefix_len = 8960;
  spec.steps = 9;
  spec.history_len = 256;
  spec.leaf_len = 7936;
  return spec;
}

void write_jsonl(const SyntheticSpec& spec, const std::string& path) {
  check_spec(spec);
  std::error_code ec;
  const std::string target = atomic_write_target(path);  // a link kept, a folder or FIFO refused
  const std::string tmp = atomic_temp_path(target, (long)::getpid());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw Error(str("cannot write synthetic data to '", tmp, "'"));
      for (int i = 0; i < spec.num_trees; ++i) out << tree_line(spec, i) << '\n';  // a line at a time in memory
      out.flush();
      if (!out) throw Error(str("error writing synthetic data to '", tmp, "'"));
    }
    fsync_path(tmp, false);  // on disk before the rename makes it the data
    if (std::rename(tmp.c_str(), target.c_str()) != 0) throw Error(str("cannot rename '", tmp, "' to '", target, "'"));
  } catch (...) {
    std::filesystem::remove(tmp, ec);  // no leftover on failure
    throw;
  }
}

}  // namespace tt::data
