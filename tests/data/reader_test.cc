// Readers: trie merging of rollouts, tree records, target weights and counts on hand-computed
// examples, and the exact error message (file:line, field, expectation) of each malformed input.
#include "data/reader.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "base/check.h"
#include "base/json.h"
#include "tests/data/test_util.h"

namespace tt::data {
namespace {

using testing::kHandRollouts;
using testing::kHandTree;

using testing::RawNode;
using testing::RawSequence;

std::vector<int32_t> V(std::initializer_list<int32_t> v) { return v; }
std::vector<double> W(std::initializer_list<double> v) { return v; }

TEST(Rollouts, HandExampleMergesSharedPrefixDivergenceAndEndingSequence) {
  const Tree t = parse_rollouts_line(kHandRollouts, "f:1", 0);
  EXPECT_EQ(t.id, "g");
  ASSERT_EQ(t.nodes.size(), 3u);
  EXPECT_EQ(t.nodes[0].parent, -1);
  EXPECT_EQ(t.nodes[0].tokens, V({1, 2, 3}));
  EXPECT_EQ(t.nodes[0].target_weight, W({0, 3.5, 4.5}));
  EXPECT_EQ(t.nodes[0].target_count, V({0, 3, 4}));
  EXPECT_EQ(t.nodes[1].parent, 0);
  EXPECT_EQ(t.nodes[1].tokens, V({4, 5}));
  EXPECT_EQ(t.nodes[1].target_weight, W({2, 2}));
  EXPECT_EQ(t.nodes[1].target_count, V({2, 2}));
  EXPECT_EQ(t.nodes[2].parent, 0);
  EXPECT_EQ(t.nodes[2].tokens, V({6, 7}));
  EXPECT_EQ(t.nodes[2].target_weight, W({2, 2}));
  EXPECT_EQ(t.nodes[2].target_count, V({1, 1}));

  ASSERT_EQ(t.paths.size(), 4u);  // one per sequence, duplicates included, in record order
  EXPECT_EQ(t.paths[0].end_node, 1);
  EXPECT_EQ(t.paths[0].target_weight, W({0, 0, 1, 1, 1}));
  EXPECT_EQ(t.paths[1].end_node, 2);
  EXPECT_EQ(t.paths[1].target_weight, W({0, 2, 2, 2, 2}));
  EXPECT_EQ(t.paths[2].end_node, 0);
  EXPECT_EQ(t.paths[2].target_weight, W({0, 0.5, 0.5}));
  EXPECT_EQ(t.paths[3].end_node, 1);
  EXPECT_EQ(t.paths[3].target_weight, W({0, 1, 1, 1, 1}));
  EXPECT_EQ(t.path_tokens(1), V({1, 2, 3, 6, 7}));
  EXPECT_EQ(t.path_tokens(2), V({1, 2, 3}));

  EXPECT_EQ(t.n_tree(), 7);
  EXPECT_EQ(t.n_flat(), 18);
  EXPECT_EQ(t.n_paths(), 4);
  EXPECT_EQ(t.n_flat_targets(), 13);  // 3 + 4 + 2 + 4 mask ones after position 0
  t.validate();
}

TEST(Rollouts, SequenceThatIsAPrefixOfAnotherSplitsTheNodeInEitherOrder) {
  for (const char* line : {R"({"sequences": [{"tokens": [1, 2]}, {"tokens": [1, 2, 3, 4]}]})",
                           R"({"sequences": [{"tokens": [1, 2, 3, 4]}, {"tokens": [1, 2]}]})"}) {
    const Tree t = parse_rollouts_line(line, "f:9", 0);
    EXPECT_EQ(t.id, "f:9");  // no id: file:line
    ASSERT_EQ(t.nodes.size(), 2u);
    EXPECT_EQ(t.nodes[0].tokens, V({1, 2}));
    EXPECT_EQ(t.nodes[0].target_count, V({0, 2}));
    EXPECT_EQ(t.nodes[1].tokens, V({3, 4}));
    EXPECT_EQ(t.nodes[1].parent, 0);
    EXPECT_EQ(t.nodes[1].target_count, V({1, 1}));
  }
}

TEST(Rollouts, SingleSequenceIsOneNodeAndDuplicatesAreSeparatePaths) {
  const Tree t = parse_rollouts_line(
      R"({"id": 7, "sequences": [{"tokens": [4, 5, 6], "weight": 0.25}, {"tokens": [4, 5, 6]}]})", "f:1", 0);
  EXPECT_EQ(t.id, "7");
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].target_weight, W({0, 1.25, 1.25}));
  EXPECT_EQ(t.nodes[0].target_count, V({0, 2, 2}));
  ASSERT_EQ(t.paths.size(), 2u);
  EXPECT_EQ(t.paths[0].end_node, 0);
  EXPECT_EQ(t.paths[1].end_node, 0);
}

TEST(Rollouts, FirstTokenMaskIsIgnoredAndZeroWeightKeepsTheCount) {
  const Tree t =
      parse_rollouts_line(R"({"sequences": [{"tokens": [4, 5], "loss_mask": [1, 1], "weight": 0}]})", "f:1", 0);
  EXPECT_EQ(t.nodes[0].target_weight, W({0, 0}));
  EXPECT_EQ(t.nodes[0].target_count, V({0, 1}));
  EXPECT_EQ(t.paths[0].target_weight, W({0, 0}));
}

TEST(Rollouts, SignedWeightsSumPerToken) {
  // RL advantages: negative and zero weights are read as written; a shared token sums them (here
  // to -0.672), and a zero weight keeps its targets and their count.
  const Tree t = parse_rollouts_line(
      R"({"sequences": [{"tokens": [4, 5, 6], "weight": -1.172}, {"tokens": [4, 5, 7], "weight": 0.5}, )"
      R"({"tokens": [4, 5, 8], "weight": 0}]})",
      "f:1", 0);
  ASSERT_EQ(t.nodes.size(), 4u);
  EXPECT_EQ(t.nodes[0].target_weight, W({0, -1.172 + 0.5 + 0}));
  EXPECT_EQ(t.nodes[0].target_count, V({0, 3}));
  EXPECT_EQ(t.nodes[1].target_weight, W({-1.172}));
  EXPECT_EQ(t.nodes[2].target_weight, W({0.5}));
  EXPECT_EQ(t.nodes[3].target_weight, W({0}));
  EXPECT_EQ(t.nodes[3].target_count, V({1}));
  EXPECT_EQ(t.paths[0].target_weight, W({0, -1.172, -1.172}));
  EXPECT_EQ(t.paths[2].target_weight, W({0, 0, 0}));
  EXPECT_EQ(t.n_flat_targets(), 6);
  t.validate();
}

TEST(TreeFormat, SignedNodeWeightsMultiplyThePathCount) {
  const Tree t =
      parse_tree_line(R"({"nodes": [{"parent": -1, "tokens": [1, 2], "weight": -0.5}, {"parent": 0, "tokens": [3]}, )"
                      R"({"parent": 0, "tokens": [4], "weight": -2}]})",
                      "f:1", 0);
  EXPECT_EQ(t.nodes[0].target_weight, W({0, -1}));  // two leaves below, weight -0.5 each
  EXPECT_EQ(t.nodes[2].target_weight, W({-2}));
  EXPECT_EQ(t.paths[1].target_weight, W({0, -0.5, -2}));
  t.validate();
}

TEST(Rollouts, ChildrenInOrderOfFirstAppearance) {
  const Tree t = parse_rollouts_line(
      R"({"sequences": [{"tokens": [1, 9]}, {"tokens": [1, 5, 1]}, {"tokens": [1, 5, 0]}, {"tokens": [1, 2]}]})", "f:1",
      0);
  // DFS preorder numbering: [1], [9], [5], [1], [0], [2].
  ASSERT_EQ(t.nodes.size(), 6u);
  std::vector<int32_t> first, parents;
  for (const Node& n : t.nodes) first.push_back(n.tokens[0]), parents.push_back(n.parent);
  EXPECT_EQ(first, V({1, 9, 5, 1, 0, 2}));
  EXPECT_EQ(parents, V({-1, 0, 0, 2, 2, 0}));
}

TEST(Rollouts, DifferentFirstTokensSplitIntoSeveralTrees) {
  const std::string line = R"({"id": "g", "sequences": [{"tokens": [5, 1]}, {"tokens": [6, 1]}, {"tokens": [5, 2]}]})";
  const std::vector<Tree> trees = parse_rollouts_trees(line, "f:3", 0);
  ASSERT_EQ(trees.size(), 2u);
  EXPECT_EQ(trees[0].id, "g#0");
  EXPECT_EQ(trees[1].id, "g#1");
  ASSERT_EQ(trees[0].nodes.size(), 3u);  // [5] -> [1], [2]
  EXPECT_EQ(trees[0].nodes[0].tokens, V({5}));
  EXPECT_EQ(trees[0].n_paths(), 2);
  ASSERT_EQ(trees[1].nodes.size(), 1u);
  EXPECT_EQ(trees[1].nodes[0].tokens, V({6, 1}));

  try {
    parse_rollouts_line(line, "f:3", 0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "f:3: the sequences start with 2 different tokens, expected one shared first token "
              "(parse_rollouts_trees and read_trees split such a group into one tree per first token)");
  }

  const std::string path = testing::write_temp("split.jsonl", line + "\n" + kHandRollouts + "\n");
  const std::vector<Tree> all = read_trees(path, Format::kRollouts, 10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].id, "g#0");
  EXPECT_EQ(all[1].id, "g#1");
  EXPECT_EQ(all[2].id, "g");
}

// Every trie is maximal (a node with one child has a path ending at it), reproduces each
// sequence as its path, and keeps the per-sequence weights and counts.
TEST(Rollouts, RandomGroupsRebuildEverySequence) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 400; ++iter) {
    const std::vector<RawSequence> seqs = testing::random_rollouts(rng, 3, 2);
    const std::vector<Tree> trees = parse_rollouts_trees(testing::rollouts_json("r", seqs), "f:1", 3);
    size_t k_total = 0;
    int64_t counts = 0, expected_counts = 0;
    for (const Tree& t : trees) {
      t.validate();
      std::vector<int> children(t.nodes.size(), 0), ends(t.nodes.size(), 0);
      for (size_t i = 1; i < t.nodes.size(); ++i) children[t.nodes[i].parent]++;
      for (const Path& p : t.paths) ends[p.end_node]++;
      for (size_t i = 0; i < t.nodes.size(); ++i) {
        EXPECT_TRUE(children[i] != 1 || ends[i] > 0) << "node " << i << " is not maximal";
        EXPECT_TRUE(children[i] > 0 || ends[i] > 0) << "node " << i << " is a leaf without a path";
      }
      counts += t.n_flat_targets();
      k_total += t.paths.size();
    }
    EXPECT_EQ(k_total, seqs.size());
    // Paths come back grouped by tree, each group in record order.
    std::vector<std::vector<int32_t>> got;
    for (const Tree& t : trees)
      for (int64_t k = 0; k < t.n_paths(); ++k) got.push_back(t.path_tokens(k));
    std::vector<std::vector<int32_t>> want;
    for (const Tree& t : trees)
      for (const RawSequence& s : seqs)
        if (s.tokens[0] == t.nodes[0].tokens[0]) want.push_back(s.tokens);
    EXPECT_EQ(got, want);
    for (const RawSequence& s : seqs)
      for (size_t j = 1; j < s.tokens.size(); ++j) expected_counts += s.mask.empty() || s.mask[j];
    EXPECT_EQ(counts, expected_counts);
  }
}

TEST(TreeFormat, HandExampleWeightsCountLeavesUnderEachNode) {
  const Tree t = parse_tree_line(kHandTree, "f:1", 18);
  ASSERT_EQ(t.nodes.size(), 5u);
  EXPECT_EQ(t.nodes[0].target_weight, W({0, 3}));
  EXPECT_EQ(t.nodes[0].target_count, V({0, 3}));
  EXPECT_EQ(t.nodes[1].target_weight, W({0, 4}));
  EXPECT_EQ(t.nodes[1].target_count, V({0, 2}));
  EXPECT_EQ(t.nodes[2].target_weight, W({1}));
  EXPECT_EQ(t.nodes[3].target_weight, W({0.5, 0.5}));
  EXPECT_EQ(t.nodes[3].target_count, V({1, 1}));
  EXPECT_EQ(t.nodes[4].target_weight, W({1}));
  ASSERT_EQ(t.paths.size(), 3u);
  EXPECT_EQ(t.paths[0].end_node, 2);
  EXPECT_EQ(t.paths[0].target_weight, W({0, 1, 0, 2, 1}));
  EXPECT_EQ(t.paths[1].end_node, 3);
  EXPECT_EQ(t.paths[1].target_weight, W({0, 1, 0, 2, 0.5, 0.5}));
  EXPECT_EQ(t.paths[2].end_node, 4);
  EXPECT_EQ(t.paths[2].target_weight, W({0, 1, 1}));
  EXPECT_EQ(t.path_tokens(1), V({10, 11, 12, 13, 15, 16}));
  EXPECT_EQ(t.n_tree(), 8);
  EXPECT_EQ(t.n_flat(), 14);
  EXPECT_EQ(t.n_flat_targets(), 3 + 2 + 1 + 2 + 1);
  t.validate();
}

TEST(TreeFormat, RootMaskOnFirstTokenIsIgnored) {
  const Tree t = parse_tree_line(R"({"nodes": [{"parent": -1, "tokens": [3, 4], "loss_mask": [1, 1]}]})", "f:1", 0);
  EXPECT_EQ(t.nodes[0].target_count, V({0, 1}));
  EXPECT_EQ(t.paths[0].target_weight, W({0, 1}));
}

// A `tokens` record: one long document, a one-path tree with the rollouts sequence's mask and
// weight rules.
TEST(TokensFormat, OneDocumentIsOnePathWithItsMaskAndWeight) {
  const Tree t = parse_tokens_line(R"({"id": 7, "tokens": [3, 4, 5, 6], "loss_mask": [1, 0, 1, 1], "weight": -0.5})",
                                   "f:1", 10);
  EXPECT_EQ(t.id, "7");
  ASSERT_EQ(t.nodes.size(), 1u);
  EXPECT_EQ(t.nodes[0].tokens, V({3, 4, 5, 6}));
  EXPECT_EQ(t.nodes[0].target_count, V({0, 0, 1, 1}));
  EXPECT_EQ(t.nodes[0].target_weight, W({0, 0, -0.5, -0.5}));
  ASSERT_EQ(t.n_paths(), 1);
  const Tree d = parse_tokens_line(R"({"tokens": [1, 2, 3]})", "f:2", 10);
  EXPECT_EQ(d.nodes[0].target_count, V({0, 1, 1}));
  EXPECT_EQ(d.id, "f:2");
}

TEST(Format, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_format("rollouts", "c"), Format::kRollouts);
  EXPECT_EQ(parse_format("tree", "c"), Format::kTree);
  EXPECT_EQ(parse_format("tokens", "c"), Format::kTokens);
  try {
    parse_format("trees", "run.yaml: data.format");
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "run.yaml: data.format: unknown data format 'trees', expected \"rollouts\", \"tree\" or \"tokens\"");
  }
}

// Each malformed record sits on line 3 of a file (line 1 valid, line 2 blank) so the message must
// count blank lines; the expected text is the whole message.
struct BadCase {
  const char* name;
  Format format;
  const char* line;
  const char* message;  // after "<path>:3: "
};

const BadCase kBadCases[] = {
    {"not_an_object", Format::kRollouts, R"([1, 2])", "expected a JSON object, got array"},
    {"missing_sequences", Format::kRollouts, R"({"id": "a"})",
     "missing field \"sequences\" (expected an array of {tokens, loss_mask, weight} objects)"},
    {"sequences_not_array", Format::kRollouts, R"({"sequences": 5})",
     "sequences: expected an array of {tokens, loss_mask, weight} objects, got number"},
    {"sequences_empty", Format::kRollouts, R"({"sequences": []})", "sequences is empty, expected at least one entry"},
    {"sequence_not_object", Format::kRollouts, R"({"sequences": [[1, 2]]})",
     "sequences[0]: expected an object {tokens, loss_mask, weight}, got array"},
    {"missing_tokens", Format::kRollouts, R"({"sequences": [{"tokens": [1]}, {"loss_mask": [1]}]})",
     "sequences[1]: missing field \"tokens\" (expected an array of token ids)"},
    {"tokens_not_array", Format::kRollouts, R"({"sequences": [{"tokens": "abc"}]})",
     "sequences[0].tokens: expected an array of token ids, got string"},
    {"token_not_integer", Format::kRollouts, R"({"sequences": [{"tokens": [1, "x"]}]})",
     "sequences[0].tokens[1]: expected an integer token id, got string \"x\""},
    {"token_float", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2.5]}]})",
     "sequences[0].tokens[1]: expected an integer token id, got number 2.5"},
    {"token_too_large", Format::kRollouts, R"({"sequences": [{"tokens": [1]}, {"tokens": [1, 2, 10]}]})",
     "sequences[1].tokens[2] = 10 is outside the vocabulary, expected a token id in [0, 10)"},
    {"token_negative", Format::kRollouts, R"({"sequences": [{"tokens": [-1]}]})",
     "sequences[0].tokens[0] = -1 is outside the vocabulary, expected a token id in [0, 10)"},
    {"empty_sequence", Format::kRollouts, R"({"sequences": [{"tokens": []}]})",
     "sequences[0].tokens is empty, expected at least one token"},
    {"mask_length", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2, 3], "loss_mask": [0, 1]}]})",
     "sequences[0].loss_mask has 2 entries, expected 3 (one per token)"},
    {"mask_not_array", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2], "loss_mask": 1}]})",
     "sequences[0].loss_mask: expected an array of 0/1, got number"},
    {"mask_value", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2, 3], "loss_mask": [0, 2, 1]}]})",
     "sequences[0].loss_mask[1] = 2, expected 0 or 1"},
    {"mask_float", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2], "loss_mask": [0, 0.5]}]})",
     "sequences[0].loss_mask[1] = 0.5, expected 0 or 1"},
    {"weight_not_number", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2], "weight": "1"}]})",
     "sequences[0].weight: expected a number, got string"},
    {"id_wrong_type", Format::kRollouts, R"({"id": [1], "sequences": [{"tokens": [1]}]})",
     "id: expected a string or an integer, got array"},
    {"missing_nodes", Format::kTree, R"({"id": "a", "sequences": []})",
     "missing field \"nodes\" (expected an array of {parent, tokens, loss_mask, weight} objects)"},
    {"missing_parent", Format::kTree, R"({"nodes": [{"tokens": [1]}]})",
     "nodes[0]: missing field \"parent\" (expected an earlier node index, or -1 for the root)"},
    {"parent_not_integer", Format::kTree,
     R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": "0", "tokens": [1]}]})",
     "nodes[1].parent: expected an integer node index, got string \"0\""},
    {"root_with_parent", Format::kTree, R"({"nodes": [{"parent": 0, "tokens": [1]}]})",
     "nodes[0].parent = 0, expected -1 (node 0 is the root)"},
    {"second_root", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": -1, "tokens": [2]}]})",
     "nodes[1] is a second root (parent -1), expected exactly one root, node 0"},
    {"parent_not_earlier", Format::kTree,
     R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": 0, "tokens": [2]}, {"parent": 2, "tokens": [3]}]})",
     "nodes[2].parent = 2, expected an earlier node index in [0, 2)"},
    {"parent_below_minus_one", Format::kTree,
     R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": -2, "tokens": [2]}]})",
     "nodes[1].parent = -2, expected an earlier node index in [0, 1)"},
    {"empty_node", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1]}, {"parent": 0, "tokens": []}]})",
     "nodes[1].tokens is empty, expected at least one token"},
    {"node_token_out_of_range", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1, 12]}]})",
     "nodes[0].tokens[1] = 12 is outside the vocabulary, expected a token id in [0, 10)"},
    {"node_mask_length", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1, 2], "loss_mask": [1]}]})",
     "nodes[0].loss_mask has 1 entries, expected 2 (one per token)"},
    {"node_mask_value", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1, 2], "loss_mask": [0, -1]}]})",
     "nodes[0].loss_mask[1] = -1, expected 0 or 1"},
    {"document_without_tokens", Format::kTokens, R"({"id": "d", "text": "abc"})",
     "record: missing field \"tokens\" (expected an array of token ids)"},
    {"document_token_out_of_range", Format::kTokens, R"({"tokens": [1, 2, 11]})",
     "record.tokens[2] = 11 is outside the vocabulary, expected a token id in [0, 10)"},
    {"document_mask_length", Format::kTokens, R"({"tokens": [1, 2, 3], "loss_mask": [1]})",
     "record.loss_mask has 1 entries, expected 3 (one per token)"},
    {"document_weight", Format::kTokens, R"({"tokens": [1, 2], "weight": null})",
     "record.weight: expected a number, got null"},
    {"weight_past_fp32", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2], "weight": -1e300}]})",
     "sequences[0].weight = -1e+300, expected a number within fp32's range (|weight| <= 3.4e38)"},
    // A key twice: nlohmann would keep the last value silently (here the first, longer list).
    {"duplicate_key", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2, 3]}], "sequences": [{"tokens": [4]}]})",
     "duplicate key \"sequences\": a JSON object names each key once (a second value would silently replace the "
     "first)"},
    {"duplicate_nested_key", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1], "tokens": [2]}]})",
     "duplicate key \"tokens\": a JSON object names each key once (a second value would silently replace the "
     "first)"},
    // Near misses of the optional fields (a typo would train without the weight or the mask).
    {"weight_typo", Format::kRollouts, R"({"sequences": [{"tokens": [1, 2], "wieght": 0.0}]})",
     "sequences[0]: unknown field \"wieght\"; did you mean \"weight\"? (other unknown fields are ignored; this one "
     "is a near miss of a field the format reads)"},
    {"mask_typo", Format::kTree, R"({"nodes": [{"parent": -1, "tokens": [1, 2], "loss_masks": [0, 1]}]})",
     "nodes[0]: unknown field \"loss_masks\"; did you mean \"loss_mask\"? (other unknown fields are ignored; this "
     "one is a near miss of a field the format reads)"},
    {"field_case", Format::kTokens, R"({"tokens": [1, 2], "Weight": 2})",
     "record: unknown field \"Weight\"; did you mean \"weight\"? (other unknown fields are ignored; this one is a "
     "near miss of a field the format reads)"},
    // A weight where nothing reads one (a rollouts record's, rather than each sequence's).
    {"weight_misplaced", Format::kRollouts, R"({"weight": -1.0, "sequences": [{"tokens": [1, 2]}]})",
     "record: field \"weight\" is not read here (record reads id, sequences); give it where it applies, e.g. to each "
     "sequence or node"},
};

// Metadata fields, even short ones close to "id", stay ignored.
TEST(ReadTrees, MetadataFieldsAreIgnored) {
  const std::string path = testing::write_temp(
      "metadata.jsonl",
      R"({"idx": 3, "uid": "u", "height": 2, "tokens": [9], "reward": 0.5, )"
      R"("sequences": [{"tokens": [1, 2], "weight": 0.5, "logprobs": [0, 0]}]})"
      "\n");
  const std::vector<Tree> t = read_trees(path, Format::kRollouts, 10);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].nodes[0].target_weight[1], 0.5);
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class MalformedInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(MalformedInput, ErrorNamesFileLineFieldAndExpectation) {
  const BadCase& c = GetParam();
  const char* good = c.format == Format::kRollouts ? R"({"sequences": [{"tokens": [1, 2]}]})"
                     : c.format == Format::kTree   ? R"({"nodes": [{"parent": -1, "tokens": [1, 2]}]})"
                                                   : R"({"tokens": [1, 2]})";
  const std::string path =
      testing::write_temp(std::string(c.name) + ".jsonl", std::string(good) + "\n\n" + c.line + "\n");
  try {
    read_trees(path, c.format, 10);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":3: " + c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(Reader, MalformedInput, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

// Nesting past kMaxJsonDepth is an error naming the line: a value 100k levels deep parses, but
// quoting it in an error (dump()) would recurse once a level and overflow the stack.
TEST(ReadTrees, DeepNestingIsAnErrorNotACrash) {
  auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_EQ(parse_json_strict(nested(kMaxJsonDepth)).dump(), nested(kMaxJsonDepth));
  for (int n : {kMaxJsonDepth + 1, 100000}) {
    try {
      parse_json_strict(nested(n));
      FAIL() << "expected tt::Error at depth " << n;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "arrays and objects nested deeper than 256 levels");
    }
    EXPECT_TRUE(parse_json_or_discarded(nested(n)).is_discarded());
  }
  // A NUL byte would end nlohmann's input: {"a": 1} followed by anything would parse.
  try {
    parse_json_strict(std::string("{\"a\": 1}\0{", 10));
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "a NUL byte at offset 8 (JSON text has none)");
  }
  const std::string path = testing::write_temp(
      "deep.jsonl", "{\"sequences\": [{\"tokens\": [1]}]}\n{\"sequences\": [{\"tokens\": [1, " + nested(100000) + "]}]}\n");
  try {
    read_trees(path, Format::kRollouts, 10);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2: arrays and objects nested deeper than 256 levels");
  }
}

// Lines are parsed on several threads: the trees still come in line order (ids 0..n-1; groups
// split by first token in their order), and with several bad lines the error is the first's.
TEST(ReadTrees, ParallelParsingKeepsLineOrderAndTheFirstError) {
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text += "{\"id\": \"t" + std::to_string(i) + "\", \"sequences\": [{\"tokens\": [1, " + std::to_string(i % 7 + 2) + "]}";
    if (i % 50 == 7) text += ", {\"tokens\": [3, 4]}";  // a second first token: two trees
    text += "]}\n";
  }
  const std::vector<Tree> t = read_trees(testing::write_temp("many.jsonl", text), Format::kRollouts, 10);
  ASSERT_EQ(t.size(), 510u);
  size_t k = 0;
  for (int i = 0; i < 500; ++i) {
    const std::string id = "t" + std::to_string(i);
    if (i % 50 == 7) {
      EXPECT_EQ(t[k++].id, id + "#0");
      EXPECT_EQ(t[k++].id, id + "#1");
    } else {
      EXPECT_EQ(t[k++].id, id);
    }
  }
  std::string bad;
  for (int i = 0; i < 300; ++i)
    bad += i == 123 ? "{\"sequences\": []}\n" : i == 200 || i == 250 ? "{\"id\": 1,\n" : "{\"sequences\": [{\"tokens\": [1, 2]}]}\n";
  const std::string path = testing::write_temp("bad_many.jsonl", bad);
  try {
    read_trees(path, Format::kRollouts, 10);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":124: ", 0), 0u) << e.what();
  }
}

TEST(ReadTrees, BadJsonNamesLineAndParserMessage) {
  const std::string path =
      testing::write_temp("bad_json.jsonl", "{\"sequences\": [{\"tokens\": [1]}]}\r\n{\"id\": 1, \n");
  try {
    read_trees(path, Format::kRollouts, 0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ":2: invalid JSON ([json.exception.parse_error.101] parse error", 0), 0u) << msg;
    EXPECT_NE(msg.find("), expected one JSON object per line"), std::string::npos) << msg;
  }
}

// JSON has no NaN or infinity, and the parser rejects overflowing numbers, so a non-finite
// weight surfaces as invalid JSON on its line.
TEST(ReadTrees, OverflowingWeightIsInvalidJson) {
  const std::string path =
      testing::write_temp("inf_weight.jsonl", R"({"sequences": [{"tokens": [1, 2], "weight": 1e999}]})"
                                              "\n");
  try {
    read_trees(path, Format::kRollouts, 0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path +
                                         ":1: invalid JSON ([json.exception.out_of_range.406] number overflow parsing "
                                         "'1e999'), expected one JSON object per line");
  }
}

TEST(ReadTrees, VocabSizeZeroSkipsRangeButNotSign) {
  const std::string line = R"({"sequences": [{"tokens": [1, 100000]}]})";
  EXPECT_EQ(parse_rollouts_line(line, "f:1", 0).nodes[0].tokens, V({1, 100000}));
  EXPECT_THROW(parse_rollouts_line(R"({"sequences": [{"tokens": [-3]}]})", "f:1", 0), Error);
  EXPECT_THROW(parse_rollouts_line(R"({"sequences": [{"tokens": [4294967296]}]})", "f:1", 0), Error);
}

TEST(ReadTrees, MissingAndEmptyFiles) {
  try {
    read_trees("/nonexistent/x.jsonl", Format::kTree, 0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot open data file '/nonexistent/x.jsonl'");
  }
  const std::string path = testing::write_temp("empty.jsonl", "\n  \n");
  try {
    read_trees(path, Format::kTree, 0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": no records, expected one JSON object per line");
  }
  const std::string folder = ::testing::TempDir();
  try {
    read_trees(folder, Format::kTree, 0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "data file '" + folder + "' is a folder, expected a JSONL file");
  }
}

TEST(ReadTrees, ReadsBothFormatsInFileOrder) {
  const std::string path = testing::write_temp("trees.jsonl", std::string(kHandTree) + "\n" + kHandTree + "\n");
  const std::vector<Tree> trees = read_trees(path, Format::kTree, 18);
  ASSERT_EQ(trees.size(), 2u);
  EXPECT_EQ(trees[1].n_tree(), 8);
}

// The trees' fingerprint (data-parallel ranks compare it): the same for the same data read twice,
// another one when a token, a weight, a parent, a path's mask or a frame's file differs.
TEST(Trees, FingerprintSeesEveryField) {
  const Tree t = parse_tree_line(kHandTree, "f:1", 18);
  const uint64_t base = trees_fingerprint({t});
  EXPECT_EQ(trees_fingerprint({parse_tree_line(kHandTree, "f:1", 18)}), base);
  EXPECT_NE(trees_fingerprint({t, t}), base);
  EXPECT_NE(trees_fingerprint({}), base);
  std::vector<std::function<void(Tree&)>> edits = {
      [](Tree& x) { x.nodes[1].tokens[0] ^= 1; },
      [](Tree& x) { x.nodes[1].target_weight[0] += 0.5; },
      [](Tree& x) { x.nodes[1].target_count[0] += 1; },
      [](Tree& x) { x.nodes[3].parent = 0; },
      [](Tree& x) { x.paths[0].target_weight.back() = -x.paths[0].target_weight.back() - 1; },
      [](Tree& x) { x.paths[0].target_mask.assign(x.paths[0].target_weight.size(), 1); },
      [](Tree& x) { x.id += "x"; },
      [](Tree& x) { x.media.frames.push_back(FrameRef{0, 0, 0, "a.png", nullptr}); },
  };
  for (size_t k = 0; k < edits.size(); ++k) {
    Tree x = t;
    edits[k](x);
    EXPECT_NE(trees_fingerprint({x}), base) << "edit " << k;
  }
  Tree a = t, b = t;
  a.media.frames.push_back(FrameRef{0, 0, 0, "a.png", nullptr});
  b.media.frames.push_back(FrameRef{0, 0, 0, "b.png", nullptr});
  EXPECT_NE(trees_fingerprint({a}), trees_fingerprint({b}));
}

}  // namespace
}  // namespace tt::data
