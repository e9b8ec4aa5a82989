// Episode -> prefix tree (data/episode_tree.h): the full-history comb and the window trie, the
// frame table and its slots, each step's path equal to that step's own sample, action tokens only
// as leaves (no step sees another's action), and the loss on action tokens only.
#include "data/episode_tree.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "base/check.h"
#include "data/packing.h"

namespace tt::data {
namespace {

// Three steps, one camera, state, discrete actions {20 + s, 30 + s}.
Episode episode(bool with_state) {
  Episode ep;
  ep.id = "ep";
  ep.instruction = {5, 6};
  for (int s = 0; s < 3; ++s) {
    EpisodeStep st;
    st.images = {"f" + std::to_string(s) + ".png"};
    if (with_state) st.state = {0.5f};
    st.action_ids = {20 + s, 30 + s};
    ep.steps.push_back(st);
  }
  return ep;
}

EpisodeTreeSpec spec(int window) {
  EpisodeTreeSpec sp;
  sp.tokens_per_frame = 2;
  sp.image_token = 1;
  sp.state_token = 2;
  sp.window = window;
  return sp;
}

TEST(EpisodeTree, FullHistoryIsACombWithActionLeaves) {
  const Tree et = episode_tree(episode(true), 4, nullptr, spec(0));
  const Tree& t = et;
  // root, then per step an observation on the trunk and its action leaf.
  ASSERT_EQ(t.nodes.size(), 7u);
  EXPECT_EQ(t.nodes[1].parent, 0);
  EXPECT_EQ(t.nodes[1].tokens, (std::vector<int32_t>{1, 1, 2}));  // 2 image rows + the state row
  EXPECT_EQ(t.nodes[2].parent, 1);
  EXPECT_EQ(t.nodes[2].tokens, (std::vector<int32_t>{20, 30}));
  EXPECT_EQ(t.nodes[3].parent, 1) << "step 1's observation follows step 0's, not its action";
  ASSERT_EQ(et.media.frames.size(), 3u);
  EXPECT_EQ(et.media.frames[2].episode, 4);
  EXPECT_EQ(et.media.frames[2].step, 2);
  EXPECT_EQ(et.media.frames[2].path, "f2.png");
  EXPECT_EQ(et.frame_occurrences(), 3);
  // Each path is its step's own sample: instruction, observations 0..t, action t.
  ASSERT_EQ(t.paths.size(), 3u);
  EXPECT_EQ(t.path_tokens(2), (std::vector<int32_t>{5, 6, 1, 1, 2, 1, 1, 2, 1, 1, 2, 22, 32}));
  // Targets: the action tokens only, the first predicted by the observation's last row.
  const PackedBatch b = pack({&t}, Packing::kTree);
  EXPECT_EQ(b.tgt_src.size(), 6u);
  for (size_t k = 0; k < b.tgt_tok.size(); ++k) EXPECT_GE(b.tgt_tok[k], 20) << "only action tokens are targets";
  EXPECT_EQ(b.n_flat_targets, 6);
  // No action token is an input of another step: action nodes are leaves.
  for (size_t n = 1; n < t.nodes.size(); ++n)
    if (t.nodes[t.nodes[n].parent].tokens[0] >= 20) ADD_FAILURE() << "node " << n << " hangs off an action";
}

TEST(EpisodeTree, WindowHistoryBranchesAndReusesFrames) {
  const Tree et = episode_tree(episode(false), 0, nullptr, spec(2));
  const Tree& t = et;
  // Contexts: step 0 [o0], step 1 [o0 o1], step 2 [o1 o2]: step 2 cannot share step 1's prefix.
  EXPECT_EQ(t.path_tokens(1), (std::vector<int32_t>{5, 6, 1, 1, 1, 1, 21, 31}));
  EXPECT_EQ(t.path_tokens(2), (std::vector<int32_t>{5, 6, 1, 1, 1, 1, 22, 32}));
  int children_of_root = 0;
  for (const Node& n : t.nodes) children_of_root += n.parent == 0;
  EXPECT_EQ(children_of_root, 2) << "o0 (steps 0 and 1) and o1 (step 2's window start)";
  EXPECT_EQ(et.media.frames.size(), 3u) << "three frames";
  EXPECT_EQ(et.frame_occurrences(), 4) << "frame 1 is shown by two observation nodes";
  int shows_frame1 = 0;
  for (const FrameSlot& s : et.media.slots) shows_frame1 += s.frame == 1;
  EXPECT_EQ(shows_frame1, 2);
  // Window 1: each step sees only its own observation.
  const Tree w1 = episode_tree(episode(false), 0, nullptr, spec(1));
  EXPECT_EQ(w1.path_tokens(2), (std::vector<int32_t>{5, 6, 1, 1, 22, 32}));
}

TEST(EpisodeTree, ContinuousActionsNeedBinsAndBadSpecsAreErrors) {
  Episode ep = episode(false);
  for (EpisodeStep& s : ep.steps) {
    s.action_ids.clear();
    s.action = {0.25f, -0.5f};
  }
  try {
    episode_tree(ep, 0, nullptr, spec(0));
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "episode 'ep': step 0 has a continuous action, but no action bins were given");
  }
  const ActionBins bins = fit_action_bins({{0, -1}, {1, 0}}, 100, 10);
  const Tree et = episode_tree(ep, 0, &bins, spec(0));
  EXPECT_EQ(et.nodes[2].tokens, bins.encode({0.25f, -0.5f}));
  EpisodeTreeSpec bad = spec(0);
  bad.window = -1;
  EXPECT_THROW(episode_tree(ep, 0, &bins, bad), Error);
}

// The placeholder ids (spec: image 1, state 2) mark rows whose embeddings are replaced: an
// instruction or a discrete action spelled with them is an error naming the episode and the place.
TEST(EpisodeTree, PlaceholderIdsInTextOrActionsAreErrors) {
  auto error = [](const Episode& ep) {
    try {
      episode_tree(ep, 0, nullptr, spec(0));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Episode ep = episode(true);
  ep.instruction = {5, 1, 6};
  EXPECT_EQ(error(ep),
            "episode 'ep': instruction[1] is 1, the image placeholder id (vision.image_token_index); expected other ids");
  ep = episode(true);
  ep.steps[2].action_ids = {20, 2};
  EXPECT_EQ(error(ep),
            "episode 'ep': step 2: action_ids[1] is 2, the state placeholder id (vision.state_token_index); expected "
            "other ids");
  // Without states the state id marks no row (often it is BOS, id 1, at the instruction's start).
  ep = episode(false);
  ep.instruction = {2, 5};
  ep.steps[2].action_ids = {20, 2};
  EXPECT_EQ(error(ep), "no error");
}

// Continuous actions take the vocabulary's last ids; bins over a placeholder id, or more bins than
// the vocabulary, are errors naming the file and the key.
TEST(EpisodeTree, ActionBinsMustMissThePlaceholdersAndFitTheVocabulary) {
  const std::string dir = ::testing::TempDir(), path = dir + "/bins_episodes.jsonl";
  std::ofstream(dir + "/a.png") << "";  // read_episodes checks that the frames exist; none is decoded
  std::ofstream(dir + "/b.png") << "";
  std::ofstream(path) << R"({"id": "e", "instruction": [5], "steps": [{"images": ["a.png"], "state": [0.1], )"
                      << R"("action": [0.5]}, {"images": ["b.png"], "state": [0.2], "action": [-0.5]}]})" << "\n";
  EpisodeTreeSpec sp = spec(0);  // image 1, state 2
  auto error = [&](int64_t vocab, int bins) {
    try {
      read_episode_trees(path, vocab, sp, bins, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(16, 14), path +
                              ": continuous actions take the last 14 ids of the vocabulary of 16 (2..15), which include "
                              "the state placeholder id 2: use at most 13 action bins (data.action_bins) or "
                              "placeholder ids below 2");
  // All 16: no placeholder id could be below them; the bins must miss both placeholders (1, 2).
  EXPECT_EQ(error(16, 16), path +
                              ": continuous actions take the last 16 ids of the vocabulary of 16 (0..15), which include "
                              "the state placeholder id 2: use at most 13 action bins (data.action_bins)");
  // An instruction token among the bins would read as an action.
  EXPECT_EQ(error(16, 11), path +
                              ": episode 'e': instruction[0] is 5, one of the continuous actions' 11 bin ids (the "
                              "vocabulary's last: 5..15); expected instruction ids below 5 (or fewer action bins: "
                              "data.action_bins)");
  EXPECT_EQ(error(16, 10), "no error");  // ids 6..15
  sp.state_token = 14;  // near the top: no count of bins (at least 2) misses it
  EXPECT_EQ(error(16, 3), path +
                             ": continuous actions take the last 3 ids of the vocabulary of 16 (13..15), which include "
                             "the state placeholder id 14: use placeholder ids below 13");
  EXPECT_EQ(error(16, 17), path +
                              ": action bins: 17 bins (data.action_bins; stats --action-bins) for a vocabulary of 16 "
                              "ids (model.vocab_size; --vocab-size): the bins are the vocabulary's last ids, expected "
                              "2 <= bins <= 16");
}

}  // namespace
}  // namespace tt::data
