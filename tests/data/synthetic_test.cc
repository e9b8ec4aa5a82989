// Synthetic data: determinism, the formats round-trip through the readers with the promised
// shapes and masks, the token rule holds, and the benchmark shapes come out at their exact sizes.
#include "data/synthetic.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/reader.h"
#include "data/stats.h"
#include "base/check.h"
#include "base/files.h"
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

// The sizes together are capped (synthetic.h), named with their flags: a tree's line, and the file.
TEST(Synthetic, OversizeTreesAndFilesNameTheFlags) {
  SyntheticSpec spec;
  spec.num_trees = 1;
  spec.turn_len = 1 << 30;
  EXPECT_EQ(tree_tokens(spec), 4 * (32 + 3 * (int64_t{1} << 30)));
  try {
    generate_jsonl(spec);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "synthetic: a tree of branches^branch_turns x (prompt_len + turns x turn_len) = 2^2 x (32 + 3 x "
              "1073741824) (--branches, --branch-turns, --prompt-len, --turns, --turn-len) is 12884902016 tokens, "
              "expected at most 2^28 = 268435456");
  }
  // Saturated, not overflowed: 2^20 sequences of about 2^30 x 2^30 tokens.
  spec.branches = 1 << 10;
  spec.vocab_size = 1 << 10;
  spec.branch_turns = 2;
  spec.turns = 1 << 30;
  EXPECT_EQ(tree_tokens(spec), INT64_MAX);
  EXPECT_THROW(generate_jsonl(spec), Error);

  SyntheticSpec comb;
  comb.kind = "comb";
  comb.num_trees = 1 << 20;
  comb.steps = 64;
  comb.leaf_len = 64;
  EXPECT_EQ(tree_tokens(comb), 32 + 64 * (8 + 64));
  try {
    generate_jsonl(comb);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "synthetic: num_trees x tokens a tree = 1048576 x 4640 = 4865392640 tokens (--num-trees; a tree of "
              "prefix_len + steps x (history_len + leaf_len) = 32 + 64 x (8 + 64) (--prefix-len, --steps, "
              "--history-len, --leaf-len)), expected at most 2^31 = 2147483648 in a file");
  }
  // The published example and the benchmark shapes are well inside.
  EXPECT_EQ(tree_tokens(published_example_spec()), 82688);
}

// A failed write leaves no tmp file; a folder is refused by name.
TEST(Synthetic, FailedWritesLeaveNothingBehind) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / "syn_folder";
  std::filesystem::create_directories(dir);
  SyntheticSpec spec;
  spec.num_trees = 2;
  try {
    write_jsonl(spec, dir.string());
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir.string() + ": is a folder, expected a regular file or a new name");
  }
  EXPECT_FALSE(std::filesystem::exists(atomic_temp_path(dir.string(), (long)::getpid())));
  // Nor into a missing folder.
  const std::string missing = (dir / "no" / "x.jsonl").string();
  EXPECT_THROW(write_jsonl(spec, missing), Error);
  EXPECT_FALSE(std::filesystem::exists(atomic_temp_path(missing, (long)::getpid())));
}

}  // namespace
}  // namespace tt::data
