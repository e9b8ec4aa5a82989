// Sharding a step's trees over ranks: the cost inputs equal what packing reports, the deal is
// LPT with deterministic ties and covers every tree once, and the per-rank packing follows the
// loader's greedy rule.
#include "distributed/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "data/episode_tree.h"
#include "data/loader.h"
#include "data/reader.h"
#include "data/synthetic.h"
#include "base/check.h"
#include "tests/distributed/test_util.h"

namespace tt::distributed {
namespace {

std::vector<data::Tree> synthetic(const std::string& kind, int n, uint64_t seed) {
  data::SyntheticSpec s;
  s.kind = kind;
  s.num_trees = n;
  s.vocab_size = 64;
  s.seed = seed;
  s.prompt_len = 5;
  s.turns = 3;
  s.turn_len = 3;
  s.branches = 3;
  s.branch_turns = 2;
  s.prefix_len = 7;
  s.steps = 4;
  s.history_len = 2;
  s.leaf_len = 5;
  const std::string path = (testing::test_dir("shard_" + kind) / "data.jsonl").string();
  data::write_jsonl(s, path);
  return data::read_trees(path, kind == "rollouts" ? data::Format::kRollouts : data::Format::kTree, 64);
}

TEST(ShardTest, TreeWorkEqualsThePackedBatch) {
  for (const std::string kind : {"rollouts", "comb"}) {
    for (const data::Tree& t : synthetic(kind, 8, 11)) {
      for (data::Packing p : {data::Packing::kTree, data::Packing::kPerPath}) {
        const data::PackedBatch b = data::pack({&t}, p);
        const model::Work w = tree_work(t, p);
        EXPECT_EQ(w.tokens, b.n_tokens) << kind << " " << t.id;
        EXPECT_EQ(w.tokens, data::packed_size(t, p)) << kind << " " << t.id;
        EXPECT_EQ(w.visible_pairs, b.visible_pairs) << kind << " " << t.id;
        EXPECT_EQ(w.head_rows, model::Work::of(b).head_rows) << kind << " " << t.id;
        EXPECT_GT(w.head_rows, 0) << kind << " " << t.id;
      }
    }
  }
}

// Episode trees: the tower's frames and the state rows as packing lays them out (tree packing:
// each distinct frame once; per_path: once per path that shows it), full and window histories.
TEST(ShardTest, TreeWorkOfEpisodesCountsFramesAndStates) {
  for (int window : {0, 2}) {
    data::Episode ep;
    ep.id = "ep";
    ep.instruction = {5, 6};
    for (int s = 0; s < 5; ++s) {
      data::EpisodeStep st;
      st.images = {"a" + std::to_string(s) + ".png", "b" + std::to_string(s) + ".png"};
      st.state = {0.5f};
      st.action_ids = {20 + s};
      ep.steps.push_back(st);
    }
    data::EpisodeTreeSpec spec;
    spec.tokens_per_frame = 3;
    spec.image_token = 1;
    spec.state_token = 2;
    spec.window = window;
    const data::Tree t = data::episode_tree(ep, 0, nullptr, spec);
    for (data::Packing p : {data::Packing::kTree, data::Packing::kPerPath}) {
      const model::Work b = model::Work::of(data::pack({&t}, p));
      const model::Work w = tree_work(t, p);
      EXPECT_EQ(w.tokens, b.tokens) << "window " << window;
      EXPECT_EQ(w.visible_pairs, b.visible_pairs) << "window " << window;
      EXPECT_EQ(w.head_rows, b.head_rows) << "window " << window;
      EXPECT_EQ(w.frames, b.frames) << "window " << window;
      EXPECT_EQ(w.state_rows, b.state_rows) << "window " << window;
      EXPECT_EQ(w.frames, p == data::Packing::kTree ? 10 : 2 * (window == 0 ? 15 : 9)) << "window " << window;
    }
  }
}

TEST(ShardTest, BalanceIsLptWithDeterministicTies) {
  // Decreasing cost: 5 -> r0, 4 -> r1, 3 (item 2) -> r1 (4 < 5), 3 (item 3) -> r0 (5 < 7),
  // 3 (item 4) -> r1 (7 < 8).
  const Shards s = balance({5, 4, 3, 3, 3}, 2);
  EXPECT_EQ(s.items[0], (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(s.items[1], (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(s.load, (std::vector<double>{8, 10}));
  EXPECT_DOUBLE_EQ(s.imbalance(), 10.0 / 9.0);
  // Equal costs alternate from rank 0; more ranks than trees leaves ranks empty.
  const Shards t = balance({1, 1, 1}, 5);
  EXPECT_EQ(t.items[0], (std::vector<int64_t>{0}));
  EXPECT_EQ(t.items[2], (std::vector<int64_t>{2}));
  EXPECT_TRUE(t.items[3].empty() && t.items[4].empty());
  EXPECT_DOUBLE_EQ(t.imbalance(), 1.0 / (3.0 / 5.0));
  EXPECT_DOUBLE_EQ(balance({}, 3).imbalance(), 1.0);
  EXPECT_DOUBLE_EQ(balance({2, 7}, 1).imbalance(), 1.0);
}

TEST(ShardTest, BalanceCoversEveryTreeOnceAndStaysNearTheBound) {
  const std::vector<data::Tree> trees = synthetic("rollouts", 40, 5);
  const model::Architecture arch{model::ModelConfig{}};
  std::vector<double> cost;
  for (const data::Tree& t : trees) cost.push_back(tree_cost(arch, t, data::Packing::kTree));
  for (int world : {2, 3, 8}) {
    const Shards s = balance(cost, world);
    std::vector<int64_t> all;
    for (const auto& v : s.items) {
      EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
      all.insert(all.end(), v.begin(), v.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(cost.size());
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(all, want) << world;
    // LPT: the makespan is at most 4/3 of the optimum, itself >= max(mean load, largest item).
    const double lower = std::max(std::accumulate(cost.begin(), cost.end(), 0.0) / world,
                                  *std::max_element(cost.begin(), cost.end()));
    EXPECT_LE(*std::max_element(s.load.begin(), s.load.end()), 4.0 / 3.0 * lower + 1e-9) << world;
    EXPECT_EQ(balance(cost, world).items, s.items);  // deterministic
  }
}

// The cost of a tree is the executed FLOPs of a training step on it (the FLOP API).
TEST(ShardTest, TreeCostIsTheExecutedTrainingFlops) {
  model::ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  // Weights per packed row: 2 layers x (attention: norm 8 + q, k, v, o 8 x 8 + 2 x 8 x 4 + 8 x 8 +
  // q/k norms 2 x 4 = 208; MLP: norm 8 + 3 x 8 x 16 = 392) + final norm 8 = 1208; the LM head
  // 8 x 100 = 800 per head row; per visible pair 2 layers x 2 x 8 = 32 multiply-adds. Training:
  // 6 FLOPs per weight and row (2 forward, 4 backward).
  const model::Architecture arch(c);
  for (const std::string kind : {"rollouts", "comb"}) {
    for (const data::Tree& t : synthetic(kind, 4, 3)) {
      for (data::Packing p : {data::Packing::kTree, data::Packing::kPerPath}) {
        const model::Work w = model::Work::of(data::pack({&t}, p));
        const double want = 6.0 * (1208.0 * w.tokens + 800.0 * w.head_rows + 32.0 * w.visible_pairs);
        EXPECT_DOUBLE_EQ(tree_cost(arch, t, p), want) << kind << " " << t.id;
      }
    }
  }
}

TEST(ShardTest, PackGreedyFollowsTheLoaderRule) {
  EXPECT_EQ(pack_greedy({3, 4, 2, 9, 1, 1}, 8),
            (std::vector<std::vector<int64_t>>{{0, 1}, {2}, {3}, {4, 5}}));  // 9 > 8 goes alone
  EXPECT_TRUE(pack_greedy({}, 8).empty());
  // The loader's batches of one epoch, unshuffled, are pack_greedy of the trees' sizes.
  const std::vector<data::Tree> trees = synthetic("rollouts", 20, 9);
  std::vector<int64_t> sizes;
  for (const data::Tree& t : trees) sizes.push_back(data::packed_size(t, data::Packing::kTree));
  const int64_t budget = 2 * *std::max_element(sizes.begin(), sizes.end()) - 1;
  data::BatchLoader loader(trees, data::Packing::kTree, budget, 1, /*shuffle=*/false);
  for (const std::vector<int64_t>& group : pack_greedy(sizes, budget)) EXPECT_EQ(loader.next_indices(), group);
}

}  // namespace
}  // namespace tt::distributed
