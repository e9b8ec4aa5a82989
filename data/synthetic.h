// Generated tree-structured data with a learnable pattern, for the quickstart, tests and
// benchmarks. Deterministic for a seed. Writes the same JSONL formats that the readers take.
//
// kinds:
//  - "rollouts": groups of sequences sharing a prompt, branching at a few turns (agent rollouts).
//  - "comb": navigation-episode combs (token ids only): an instruction prefix, then steps; each step adds a
//    history node on the trunk and a leaf for the current observation and action (tree format).
// Token streams follow a rule the model can learn (each token determined by the previous ones
// most of the time), so the training loss falls clearly within a few hundred steps: per tree a key
// k from 8 odd values, x[t+1] = (5 x[t] + k) mod V, a random token at each branch start.
// Masks as in real data: rollouts mask the prompt 0 and the turns 1; combs mask prefix,
// history and observation 0 and the action (the last max(1, leaf_len / 4) tokens of each leaf) 1.
// Benchmark shapes: the navigation comb is {comb, prefix_len 512, steps 40, history_len 128,
// leaf_len 256}; the agent rollout tree is {rollouts, prompt_len 4096, turns 6, turn_len 1024,
// branches 4, branch_turns 2}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tt::data {

struct SyntheticSpec {
  std::string kind = "rollouts";  // "rollouts" | "comb"
  int num_trees = 64;
  int vocab_size = 256;
  uint64_t seed = 1;
  // rollouts: prompt, then `turns` turns of `turn_len` tokens; `branches` children at each of the
  // first `branch_turns` turns.
  int prompt_len = 32;
  int turns = 3;
  int turn_len = 16;
  int branches = 2;
  int branch_turns = 2;
  // comb: prefix, then `steps` steps of a history node and a leaf.
  int prefix_len = 32;
  int steps = 8;
  int history_len = 8;
  int leaf_len = 16;
};

// Size caps: the tokens one tree's line holds (a rollouts group's sequences as written, each
// with the prompt; a comb's nodes), and those of a whole file.
constexpr int64_t kMaxTreeTokens = int64_t{1} << 28;
constexpr int64_t kMaxFileTokens = int64_t{1} << 31;

// The tokens one tree of `spec` writes: branches^branch_turns x (prompt_len + turns x turn_len) for
// rollouts, prefix_len + steps x (history_len + leaf_len) for a comb (INT64_MAX when larger).
int64_t tree_tokens(const SyntheticSpec& spec);

// One JSON object per line (no trailing newline in the strings); ids "<kind>-000000", ...
// Throws tt::Error naming the field for an invalid spec, and the fields (and their flags) when a
// tree or the file would pass its cap above.
std::vector<std::string> generate_jsonl(const SyntheticSpec& spec);

// Writes generate_jsonl(spec)'s lines to path atomically (tmp file + rename), one line in memory at
// a time; on any failure the tmp file is removed. path must not be a folder.
void write_jsonl(const SyntheticSpec& spec, const std::string& path);

// A tree with the totals of the published partitioning example (about 164k tokens flattened,
// 83k unique, 102k when a naive partitioner re-runs every piece's ancestors): one comb
// {prefix_len 8960, steps 9, history_len 256, leaf_len 7936}, V = 32000. Only the totals are
// matched, not the published tree's shape. n_flat 163584, n_tree 82688; at capacity
// kPublishedExampleCapacity the planner (data/partition.h) makes 3 pieces (17152, 32768 and
// 32768 tokens, one chain), so gateways compute 82688 tokens and the naive partitioner 102144.
SyntheticSpec published_example_spec();
constexpr int64_t kPublishedExampleCapacity = 32768;

}  // namespace tt::data
