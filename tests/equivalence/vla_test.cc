// The VLA path's exactness contract (issue 16), CPU fp64: an episode packed as a tree (its frames
// through the tower once each) against its per-timestep samples (every step's whole context its
// own sequence, the tower run for every occurrence of a frame): the loss, every gradient (the
// decoder's, the projector's, the state projection's and the tower's), and one AdamW step; with
// full and window histories, with the tower trained and frozen. Then the leakage rules: a step
// never sees a later frame, any step's action tokens but its own (as targets), or a frame outside
// its window. Partitioned episode trees, and episode trees run segment by segment where nothing
// is truncated, equal the whole tree.
//
// Tolerance rule (as tree_vs_path_test.cc): both sides sum the same fp64 terms in other groupings
// (the frame gradient sums over slots in another order), so relative 1e-10 is a loose bound.
// Leakage checks are exact: a row's logits only read visible rows, so they are bitwise unchanged.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <vector>

#include "data/frames.h"
#include "data/packing.h"
#include "data/partition.h"
#include "model/decoder.h"
#include "model/partitioned.h"
#include "model/segments.h"
#include "tests/model/model_test_util.h"
#include "tests/equivalence/random_trees.h"
#include "tests/equivalence/vla_fixture.h"

namespace tt {
namespace {

using data::Packing;
using data::PackedBatch;
using testing::max_abs;
using testing::max_diff;

struct Grads {
  double loss;
  std::vector<double> g;
};

Grads train(model::Model<double>& m, const PackedBatch& b, double scale) {
  m.zero_grad();
  const double loss = m.forward(b, scale);
  m.backward();
  return {loss, std::vector<double>(m.grads(), m.grads() + m.num_params())};
}

// The largest |gradient| over the tensors whose names start with `prefix`.
double max_grad(const model::Model<double>& m, const std::vector<double>& g, const std::string& prefix) {
  double most = 0;
  for (const model::ParamInfo& p : m.params_info())
    if (p.name.rfind(prefix, 0) == 0)
      for (int64_t i = 0; i < p.numel; ++i) most = std::max(most, std::fabs(g[p.offset + i]));
  return most;
}

struct Case {
  int window;
  bool freeze;
  bool hybrid = false;  // Qwen3.5's hybrid decoder (Gated DeltaNet layers 0 and 2)
};

// Both comparisons start from the tiny VLA (weights of seed 7) and the tree of a 5-step episode
// with two cameras in the case's history.
class VlaTreeVsSteps : public ::testing::TestWithParam<Case> {
 protected:
  VlaTreeVsSteps() { m.init(7); }
  const Case c = GetParam();
  const model::ModelConfig cfg = [this] {
    model::ModelConfig x = testing::tiny_vla_config(c.freeze);
    if (c.hybrid) model::testing::make_hybrid(x, "qwen3_5_text");
    return x;
  }();
  model::Model<double> m{cfg};
  const data::Tree tree = testing::vla_tree(testing::tiny_episode(/*steps=*/5, /*cameras=*/2, /*seed=*/3), c.window,
                                            cfg, 11);
};

TEST_P(VlaTreeVsSteps, LossGradientsAndAdamWStepAgree) {
  const PackedBatch t = testing::vla_batch(tree, Packing::kTree, cfg);
  const PackedBatch p = testing::vla_batch(tree, Packing::kPerPath, cfg);
  // The tower runs once per unique frame on the tree, once per occurrence per timestep.
  EXPECT_EQ((int)t.frames.size(), 10);
  int occurrences = 0;
  for (int s = 0; s < 5; ++s) occurrences += 2 * (c.window == 0 ? s + 1 : std::min(s + 1, c.window));
  EXPECT_EQ((int)p.frames.size(), occurrences);
  EXPECT_EQ(p.n_paths, 5);
  const double scale = 1.0 / 5;
  const Grads gt = train(m, t, scale);
  const std::vector<double> after_tree = testing::params_after_adamw_step(m);
  const Grads gp = train(m, p, scale);
  const std::vector<double> after_paths = testing::params_after_adamw_step(m);
  EXPECT_NEAR(gt.loss, gp.loss, 1e-10 * std::fabs(gt.loss));
  const double big = max_abs(gt.g);
  EXPECT_LE(max_diff(gt.g, gp.g), 1e-10 * big);
  // The tower's k_proj bias has gradient 0 in exact arithmetic (it adds q.b to every score of a
  // query's row, which the softmax cancels), so both sides hold rounding noise (~1e-17) there,
  // which AdamW's first step (g / (|g| + eps)) amplifies to ~lr 1e-9: those entries are checked to
  // be noise, and the step is compared on the others (rule of tree_vs_path_test.cc: 1e-10 of the
  // largest parameter).
  std::vector<double> st, sp;
  for (const model::ParamInfo& q : m.params_info()) {
    const bool k_bias = q.name.find("self_attn.k_proj.bias") != std::string::npos;
    for (int64_t i = 0; i < q.numel; ++i) {
      if (k_bias) {
        EXPECT_LE(std::fabs(gt.g[q.offset + i]), 1e-12 * big) << q.name;
        EXPECT_LE(std::fabs(gp.g[q.offset + i]), 1e-12 * big) << q.name;
        continue;
      }
      st.push_back(after_tree[q.offset + i]);
      sp.push_back(after_paths[q.offset + i]);
    }
  }
  EXPECT_LE(max_diff(st, sp), 1e-10 * max_abs(sp));
  // The comparison is of real gradients: the projector, the state projection and (unless frozen)
  // every part of the tower get some.
  EXPECT_GT(max_grad(m, gt.g, "model.multi_modal_projector."), 1e-6 * big);
  EXPECT_GT(max_grad(m, gt.g, "model.state_projector."), 1e-6 * big);
  for (const char* part : {"model.vision_tower.vision_model.embeddings.patch_embedding.",
                           "model.vision_tower.vision_model.embeddings.position_embedding.",
                           "model.vision_tower.vision_model.encoder.layers.0.self_attn.",
                           "model.vision_tower.vision_model.encoder.layers.1.mlp."}) {
    if (c.freeze) EXPECT_EQ(max_grad(m, gt.g, part), 0.0) << part << " is frozen";
    else EXPECT_GT(max_grad(m, gt.g, part), 1e-6 * big) << part;
  }
  // The placeholder ids' embeddings take no gradient from media rows (those rows are replaced);
  // id 0 and 1 appear nowhere else in the episode.
  const model::ParamInfo& wte = m.params_info()[m.table().find("model.embed_tokens.weight")];
  for (int64_t id : {0, 1})
    for (int64_t j = 0; j < cfg.hidden_size; ++j)
      EXPECT_EQ(gt.g[wte.offset + id * cfg.hidden_size + j], 0.0) << "placeholder id " << id;
}

// Partitioned episode trees (partition.capacity_tokens with a vision tower): each piece runs the
// tower on the frames its slots show, and ancestors' frames reach it as gateway K/V rows; the loss
// and every gradient (the tower's included) equal the whole tree's, at capacities from one frame
// (4 rows) to the whole tree, and with partition.recompute bitwise those without it. A frame that
// slots of two pieces show (window histories) runs the tower in both: its gradient is the sum over
// its slots either way. Tolerance: as above (fp64, other groupings).
TEST_P(VlaTreeVsSteps, PartitionedTreesMatchTheWholeTree) {
  const double scale = 1.0 / 5;
  const Grads whole = train(m, testing::vla_batch(tree, Packing::kTree, cfg), scale);
  const double big = max_abs(whole.g);
  data::FrameSpec spec;
  spec.image_size = (int)cfg.vision.image_size;
  int frame_loads = 0;
  const model::LoadPieceFrames load = [&](PackedBatch& b) {
    ++frame_loads;
    data::load_frames(b, spec);
  };
  const int64_t P = cfg.vision.tokens_per_frame();
  for (int64_t cap : {P, P + 1, 2 * P + 3, 3 * P, tree.n_tree() / 2 + 1, tree.n_tree()}) {
    const data::Tree split = data::split_long_nodes(tree, cap);
    const data::Partition plan = data::plan_partition(split, cap);
    if (cap < tree.n_tree() / 2) {
      EXPECT_GT(plan.num_pieces(), 4) << "capacity " << cap;
    }
    int with_frames = 0;  // each such piece's frames are decoded once, when it runs (also with recompute)
    for (int k = 0; k < plan.num_pieces(); ++k) with_frames += !data::pack_piece(split, plan, k).frames.empty();
    Grads runs[2];
    for (int recompute = 0; recompute < 2; ++recompute) {
      m.zero_grad();
      model::PartitionRunStats st;
      frame_loads = 0;
      runs[recompute].loss =
          model::forward_backward_partitioned(m, split, plan, scale, &st, recompute == 1, load);
      runs[recompute].g.assign(m.grads(), m.grads() + m.num_params());
      EXPECT_EQ(st.tokens_processed, tree.n_tree()) << "capacity " << cap;
      EXPECT_EQ(frame_loads, with_frames) << "capacity " << cap;
    }
    EXPECT_NEAR(runs[0].loss, whole.loss, 1e-10 * std::fabs(whole.loss)) << "capacity " << cap;
    EXPECT_LE(max_diff(runs[0].g, whole.g), 1e-10 * big) << "capacity " << cap;
    EXPECT_EQ(runs[1].loss, runs[0].loss) << "capacity " << cap << ", recompute";
    EXPECT_EQ(max_diff(runs[1].g, runs[0].g), 0.0) << "capacity " << cap << ", recompute";
  }
  // A piece with frames and no loader is an error, not a tower run on missing pixels.
  const data::Tree split = data::split_long_nodes(tree, P);
  const data::Partition plan = data::plan_partition(split, P);
  try {
    model::forward_backward_partitioned(m, split, plan, scale);
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("piece 1 shows frames (1) but no frame loader was given"), std::string::npos)
        << e.what();
  }
}

// Segments (model/segments.h) on an episode tree: with segments of S > max_depth / 2 tokens (at
// most two on a path), a whole-segment tail (M = S) and K = 1, every row sees its whole history
// and every gradient crosses the boundary, so the loss and every gradient (the tower's included)
// equal the whole tree's, under tree packing and per path (path_tree keeps each path's frame
// slots and state rows). Each segment piece runs the tower on the frames its slots show: with the
// full history the boundary cuts a frame's slots, which then run the tower in both pieces, its
// gradient the sum over the slots either way. Tolerance: as above (fp64, other groupings).
TEST_P(VlaTreeVsSteps, SegmentsWithAWholeSegmentTailMatchTheWholeTree) {
  const double scale = 1.0 / 5;
  model::SegmentConfig seg;
  seg.length = tree.max_depth() / 2 + 1;
  seg.tail = seg.length;
  seg.tbptt = 1;
  data::FrameSpec spec;
  spec.image_size = (int)cfg.vision.image_size;
  int frame_loads = 0;
  const model::LoadPieceFrames load = [&](PackedBatch& b) {
    ++frame_loads;
    data::load_frames(b, spec);
  };
  {  // tree packing
    const Grads whole = train(m, testing::vla_batch(tree, Packing::kTree, cfg), scale);
    const data::SegmentPlan plan = data::plan_segments(tree, seg.length);
    ASSERT_GE(plan.pieces.num_pieces(), 2);
    int64_t shown = 0, with_frames = 0;
    for (int k = 0; k < plan.pieces.num_pieces(); ++k) {
      const size_t f = model::segment_batch(seg, plan, k).frames.size();
      shown += (int64_t)f;
      with_frames += f > 0;
    }
    if (c.window == 0) {
      EXPECT_GT(shown, tree.frames_shown()) << "a frame whose slots the boundary cuts";
    }
    m.zero_grad();
    model::SegmentRunStats st;
    const double loss = model::forward_backward_segmented(m, seg, plan, scale, &st, load);
    const std::vector<double> g(m.grads(), m.grads() + m.num_params());
    EXPECT_EQ(frame_loads, with_frames);
    EXPECT_EQ(st.tokens, tree.n_tree());
    EXPECT_NEAR(loss, whole.loss, 1e-10 * std::fabs(whole.loss));
    EXPECT_LE(max_diff(g, whole.g), 1e-10 * max_abs(whole.g));
    if (!c.freeze) {
      EXPECT_GT(max_grad(m, g, "model.vision_tower."), 0.0);
    }
  }
  {  // per path: each path a tree of its own (data::path_tree), against per_path packing
    const Grads whole = train(m, testing::vla_batch(tree, Packing::kPerPath, cfg), scale);
    m.zero_grad();
    double loss = 0;
    for (int64_t k = 0; k < tree.n_paths(); ++k) {
      const data::Tree path = data::path_tree(tree, k);
      EXPECT_NO_THROW(path.validate()) << "path " << k;
      EXPECT_EQ(path.frames_shown(), (int64_t)path.media.frames.size()) << "path " << k;
      if (c.window == 0) {
        EXPECT_EQ(path.frames_shown(), 2 * (k + 1)) << "path " << k << ": its steps' two cameras";
      }
      loss += model::forward_backward_segmented(m, seg, data::plan_segments(path, seg.length), scale, nullptr, load);
    }
    const std::vector<double> g(m.grads(), m.grads() + m.num_params());
    EXPECT_NEAR(loss, whole.loss, 1e-10 * std::fabs(whole.loss));
    EXPECT_LE(max_diff(g, whole.g), 1e-10 * max_abs(whole.g));
  }
  // A segment piece with frames and no loader is an error, not a tower run on missing pixels.
  try {
    model::forward_backward_segmented(m, seg, data::plan_segments(tree, seg.length), scale);
    ADD_FAILURE() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shows frames"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("but no frame loader was given"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Histories, VlaTreeVsSteps,
                         ::testing::Values(Case{0, false}, Case{2, false}, Case{0, true}, Case{3, true},
                                           Case{0, false, true}, Case{2, false, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.window == 0 ? "full" : "window" + std::to_string(i.param.window)) +
                                  (i.param.freeze ? "_frozen" : "") + (i.param.hybrid ? "_hybrid" : "");
                         });

// Each step's action logits: the rows that predict its action tokens, under tree packing of
// `tree`. Targets are listed in packed order of the predicted token, the action leaves (path s
// ends at step s's) are the only nodes with targets, 2 each, so the step whose leaf comes k-th in
// the tree's preorder owns targets [2 k, 2 k + 2); checked against the episode.
std::vector<std::vector<double>> step_logits(model::Model<double>& m, const PackedBatch& b, const data::Tree& tree,
                                             const data::Episode& ep) {
  const int A = 2, V = (int)m.config().vocab_size;
  EXPECT_EQ(b.tgt_src.size(), ep.steps.size() * A);
  EXPECT_EQ(tree.paths.size(), ep.steps.size());
  const std::vector<int> order = tree.preorder();
  std::vector<int> rank(order.size()), leaf_rank(ep.steps.size());
  for (size_t k = 0; k < order.size(); ++k) rank[order[k]] = (int)k;
  for (size_t s = 0; s < ep.steps.size(); ++s) leaf_rank[s] = rank[tree.paths[s].end_node];
  std::vector<int> block(ep.steps.size());  // step -> its target block
  for (size_t s = 0; s < ep.steps.size(); ++s)
    block[s] = (int)std::count_if(leaf_rank.begin(), leaf_rank.end(), [&](int r) { return r < leaf_rank[s]; });
  model::InferRequest req;
  req.loss = false;
  req.rows = model::InferRequest::Rows::kList;
  req.list = b.tgt_src;
  const model::InferResult r = m.infer(b, req);
  std::vector<std::vector<double>> out(ep.steps.size());
  for (size_t s = 0; s < ep.steps.size(); ++s)
    for (int a = 0; a < A; ++a) {
      const size_t t = (size_t)block[s] * A + a;
      EXPECT_EQ(b.tgt_tok[t], ep.steps[s].action_ids[a]) << "step " << s;
      out[s].insert(out[s].end(), r.logits.begin() + t * V, r.logits.begin() + (t + 1) * V);
    }
  return out;
}

TEST(VlaLeakage, NoStepSeesALaterFrameOrAnotherStepsAction) {
  const model::ModelConfig cfg = testing::tiny_vla_config();
  model::Model<double> m(cfg);
  m.init(9);
  const data::Episode ep = testing::tiny_episode(5, 2, 4);
  const data::Tree tree = testing::vla_tree(ep, 0, cfg, 21);
  const std::vector<std::vector<double>> base = step_logits(m, testing::vla_batch(tree, Packing::kTree, cfg), tree, ep);
  for (int t = 0; t < 4; ++t) {
    // A different frame at step t + 1 (camera 1).
    data::Tree changed = tree;
    for (data::FrameRef& f : changed.media.frames)
      if (f.step == t + 1 && f.camera == 1) f.pixels = testing::frame_pixels(4, f.step, f.camera, 99);
    const auto l = step_logits(m, testing::vla_batch(changed, Packing::kTree, cfg), changed, ep);
    for (int s = 0; s <= t; ++s) EXPECT_EQ(l[s], base[s]) << "step " << s << " saw frame " << t + 1;
    EXPECT_NE(l[t + 1], base[t + 1]) << "the changed frame must matter to its own step";
  }
  for (int t = 0; t < 5; ++t) {
    // Step t's ground-truth action changes: no other step moves, nor step t's first prediction.
    data::Episode ep2 = ep;
    ep2.steps[t].action_ids = {ep.steps[t].action_ids[0] == 23 ? 22 : 23, ep.steps[t].action_ids[1]};
    const data::Tree tree2 = testing::vla_tree(ep2, 0, cfg, 21);
    const auto l = step_logits(m, testing::vla_batch(tree2, Packing::kTree, cfg), tree2, ep2);
    const size_t V = (size_t)cfg.vocab_size;
    for (int s = 0; s < 5; ++s) {
      if (s != t) {
        EXPECT_EQ(l[s], base[s]) << "step " << s << " saw step " << t << "'s action";
      }
    }
    EXPECT_TRUE(std::equal(l[t].begin(), l[t].begin() + V, base[t].begin())) << "step " << t << "'s first action "
                                                                                  "token saw itself";
    EXPECT_FALSE(std::equal(l[t].begin() + V, l[t].end(), base[t].begin() + V))
        << "step " << t << "'s second action token is predicted from its first";
  }
}

TEST(VlaLeakage, AWindowHistorySeesExactlyItsWindow) {
  const int W = 2;
  const model::ModelConfig cfg = testing::tiny_vla_config();
  model::Model<double> m(cfg);
  m.init(10);
  const data::Episode ep = testing::tiny_episode(5, 1, 5);
  const data::Tree tree = testing::vla_tree(ep, W, cfg, 31);
  const auto base = step_logits(m, testing::vla_batch(tree, Packing::kTree, cfg), tree, ep);
  for (int f = 0; f < 5; ++f) {
    data::Tree changed = tree;
    for (data::FrameRef& fr : changed.media.frames)
      if (fr.step == f) fr.pixels = testing::frame_pixels(4, fr.step, fr.camera, 77);
    const auto l = step_logits(m, testing::vla_batch(changed, Packing::kTree, cfg), changed, ep);
    for (int s = 0; s < 5; ++s) {
      const bool in_window = f <= s && f > s - W;
      if (in_window) EXPECT_NE(l[s], base[s]) << "step " << s << " must see frame " << f;
      else EXPECT_EQ(l[s], base[s]) << "step " << s << " saw frame " << f << " outside its window";
    }
  }
}

}  // namespace
}  // namespace tt
