// Generated tree-structured data with a learnable pattern, for the quickstart, tests and
// benchmarks. Deterministic for a seed. Writes the same JSONL formats that the readers take.
//
// kinds:
//  - "rollouts": groups of sequences sharing a prompt, branching at a few turns (agent rollouts).
//  - "episodes": navigation-episode combs: an instruction prefix, then steps; each step adds a
//    history node on the trunk and a leaf for the current observation and action (tree format).
// Token streams follow a rule the model can learn (each token determined by the previous ones
// most of the time), so the training loss falls clearly within a few hundred steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tt::data {

struct SyntheticSpec {
  std::string kind = "rollouts";  // "rollouts" | "episodes"
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
  // episodes: prefix, then `steps` steps of a history node and a leaf.
  int prefix_len = 32;
  int steps = 8;
  int history_len = 8;
  int leaf_len = 16;
};

// One JSON object per line (no trailing newline in the strings).
std::vector<std::string> generate_jsonl(const SyntheticSpec& spec);

// Writes generate_jsonl(spec) to path atomically (tmp file + rename).
void write_jsonl(const SyntheticSpec& spec, const std::string& path);

}  // namespace tt::data
