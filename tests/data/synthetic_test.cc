// Synthetic data: determinism, the formats round-trip through the readers with the promised
// shapes and masks, the token rule holds, and the benchmark shapes come out at their exact sizes.
#include "data/synthetic.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "data/reader.h"
#include "data/stats.h"
#include "base/check.h"
#include "tests/data/test_util.h"

namespace tt::data {
namespace {

std::vector<Tree> parse_all(const std::vector<std::string>& lines, Format format, int64_t vocab) {
  std::vector<Tree> trees;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = "gen:" + std::to_string(i + 1);
    if (format == Format::kRollouts) {
      trees.push_back(parse_rollouts_line(lines[i], where, vocab));
    } else {
      trees.push_back(parse_tree_line(lines[i], where, vocab));
    }
  }
  return trees;
}

TEST(Synthetic, DeterministicForASeed) {
  for (const char* kind : {"rollouts", "comb"}) {
    SyntheticSpec spec;
    spec.kind = kind;
    spec.num_trees = 6;
    const auto a = generate_jsonl(spec);
    const auto b = generate_jsonl(spec);
    EXPECT_EQ(a, b);
    spec.seed = 2;
    const auto c = generate_jsonl(spec);
    EXPECT_NE(a, c);
    // Tree i does not depend on how many trees are generated.
    spec.seed = 1;
    spec.num_trees = 3;
    const auto d = generate_jsonl(spec);
    EXPECT_EQ(std::vector<std::string>(a.begin(), a.begin() + 3), d);
  }
}

TEST(Synthetic, RolloutsShapeAndMasks) {
  SyntheticSpec spec;  // prompt 32, 3 turns of 16, 2 branches at the first 2 turns
  spec.num_trees = 4;
  const std::vector<Tree> trees = parse_all(generate_jsonl(spec), Format::kRollouts, spec.vocab_size);
  for (const Tree& t : trees) {
    EXPECT_EQ(t.n_paths(), 4);
    // Prompt, 2 turn nodes, 4 turn nodes; the third turn continues each leaf (same node).
    EXPECT_EQ(t.nodes.size(), 7u);
    EXPECT_EQ(t.nodes[0].tokens.size(), 32u);
    EXPECT_EQ(t.n_tree(), 32 + 2 * 16 + 4 * 32);
    EXPECT_EQ(t.n_flat(), 4 * (32 + 3 * 16));
    for (const Path& p : t.paths)
      for (int j = 0; j < 80; ++j) EXPECT_EQ(p.target_weight[j], j < 32 ? 0.0 : 1.0);
  }
  EXPECT_EQ(trees[0].id, "rollouts-000000");
  EXPECT_EQ(trees[3].id, "rollouts-000003");
}

TEST(Synthetic, EpisodesCombShapeAndActionMasks) {
  SyntheticSpec spec;
  spec.kind = "comb";
  spec.num_trees = 3;  // prefix 32, 8 steps of history 8 and leaf 16 (4 action tokens)
  const std::vector<Tree> trees = parse_all(generate_jsonl(spec), Format::kTree, spec.vocab_size);
  for (const Tree& t : trees) {
    ASSERT_EQ(t.nodes.size(), 1u + 2 * 8);
    EXPECT_EQ(t.n_paths(), 8);
    for (int s = 0; s < 8; ++s) {
      const Node& h = t.nodes[1 + 2 * s];
      const Node& leaf = t.nodes[2 + 2 * s];
      EXPECT_EQ(h.parent, s == 0 ? 0 : 2 * s - 1);
      EXPECT_EQ(leaf.parent, 1 + 2 * s);
      EXPECT_EQ(h.tokens.size(), 8u);
      EXPECT_EQ(h.target_count, std::vector<int32_t>(8, 0));
      EXPECT_EQ(leaf.target_count, std::vector<int32_t>({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}));
    }
    EXPECT_EQ(t.n_flat_targets(), 8 * 4);
  }
}

// Within a node, every token follows x' = (5 x + k) mod V with one key per tree.
TEST(Synthetic, TokensFollowTheKeyedRule) {
  for (const char* kind : {"rollouts", "comb"}) {
    SyntheticSpec spec;
    spec.kind = kind;
    spec.num_trees = 5;
    spec.vocab_size = 97;
    const Format f = std::string(kind) == "rollouts" ? Format::kRollouts : Format::kTree;
    std::set<int> keys;
    for (const Tree& t : parse_all(generate_jsonl(spec), f, spec.vocab_size)) {
      const auto& r = t.nodes[0].tokens;
      const int key = ((r[1] - 5 * r[0]) % 97 + 97) % 97;
      EXPECT_EQ(key % 2, 1);
      keys.insert(key);
      for (const Node& n : t.nodes)
        for (size_t j = 1; j < n.tokens.size(); ++j) ASSERT_EQ(n.tokens[j], (5 * n.tokens[j - 1] + key) % 97);
    }
    EXPECT_GT(keys.size(), 1u);
  }
}

TEST(Synthetic, WritesTheSameLinesAtomically) {
  SyntheticSpec spec;
  spec.num_trees = 3;
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/syn.jsonl";
  write_jsonl(spec, path);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(lines, generate_jsonl(spec));
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  EXPECT_EQ(read_trees(path, Format::kRollouts, spec.vocab_size).size(), 3u);
}

TEST(Synthetic, BenchmarkShapesHaveTheirExactSizes) {
  SyntheticSpec agent;
  agent.num_trees = 1;
  agent.vocab_size = 32000;
  agent.prompt_len = 4096;
  agent.turns = 6;
  agent.turn_len = 1024;
  agent.branches = 4;
  agent.branch_turns = 2;
  const nlohmann::json a = tree_stats(parse_all(generate_jsonl(agent), Format::kRollouts, agent.vocab_size));
  EXPECT_EQ(a["paths"], 16);
  EXPECT_EQ(a["nodes"], 1 + 4 + 16);
  EXPECT_EQ(a["n_tree"], 4096 + 4 * 1024 + 16 * 5 * 1024);
  EXPECT_EQ(a["n_flat"], 16 * (4096 + 6 * 1024));

  SyntheticSpec comb;
  comb.kind = "comb";
  comb.num_trees = 1;
  comb.vocab_size = 32000;
  comb.prefix_len = 512;
  comb.steps = 40;
  comb.history_len = 128;
  comb.leaf_len = 256;
  const nlohmann::json c = tree_stats(parse_all(generate_jsonl(comb), Format::kTree, comb.vocab_size));
  EXPECT_EQ(c["paths"], 40);
  EXPECT_EQ(c["nodes"], 81);
  EXPECT_EQ(c["n_tree"], 512 + 40 * (128 + 256));
  EXPECT_EQ(c["n_flat"], 40 * (512 + 256) + 128 * (40 * 41 / 2));
  EXPECT_EQ(c["n_flat_targets"], 40 * 64);
}

TEST(Synthetic, InvalidSpecNamesTheField) {
  SyntheticSpec spec;
  spec.kind = "trees";
  try {
    generate_jsonl(spec);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "synthetic.kind = 'trees', expected \"rollouts\" or \"comb\"");
  }
  spec.kind = "rollouts";
  spec.branch_turns = 4;
  try {
    generate_jsonl(spec);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "synthetic.branch_turns = 4, expected in [0, turns = 3]");
  }
  spec.branch_turns = 2;
  spec.turn_len = 0;
  EXPECT_THROW(generate_jsonl(spec), Error);
}

}  // namespace
}  // namespace tt::data
