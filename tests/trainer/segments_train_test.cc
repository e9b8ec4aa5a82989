// Segment-level training through the trainer (segments config section, model/segments.h): a step
// is the model's segment scheduler on the step's trees with the step's normaliser; tree and
// per_path packing train alike; trees shallower than a segment train as usual; a resumed run
// repeats the uninterrupted one bitwise; `tokens` documents train; a segment piece over the
// budget is an error naming the tree, and so is a tree that runs whole over it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/partition.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "model/segments.h"
#include "tests/model/model_test_util.h"
#include "tests/trainer/test_util.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/train.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

// Four combs of 42 tokens, 30 deep; segments of 8 tokens with a 4-row tail, K = 1, retrieval of
// 6 pairs by KV head 0 of layer 1 (2 query heads on 2 KV heads).
RunConfig seg_config(const fs::path& dir) {
  RunConfig c = testing::tiny_run_config(dir);
  testing::use_combs(c, dir);
  c.model.num_key_value_heads = 2;
  c.train.max_steps = 4;
  c.train.grad_accum = 2;
  c.optim.eps = 1e-3;  // as in train_test: fp32 summation-order differences stay fp32-sized
  c.data.max_tokens_per_batch = testing::kTinyCombTokens;
  c.segments.length = 8;
  c.segments.tail = 4;
  c.segments.tbptt = 1;
  c.segments.long_range = {{1}, {0}, 6};
  c.validate();
  return c;
}

// One step, grad_accum 1, no shuffle: the first comb alone. Its loss and every gradient are the
// model's segment scheduler on that tree with the step's normaliser (its paths), bitwise: the
// trainer adds nothing in between.
// Also for a hybrid (qwen3_5_text: Gated DeltaNet layers 0 and 2, whose states and conv tails
// cross the segment boundaries; retrieval in its attention layer 1).
class SegmentsStep : public ::testing::TestWithParam<bool> {};

TEST_P(SegmentsStep, AStepIsTheSchedulerOnTheStepsTrees) {
  const fs::path dir = testing::fresh_dir(GetParam() ? "seg_step_hybrid" : "seg_step");
  RunConfig c = seg_config(dir);
  if (GetParam()) {
    model::testing::make_hybrid(c.model, "qwen3_5_text");
    c.validate();
  }
  c.data.shuffle = false;
  c.train.grad_accum = 1;
  Trainer t(c);
  const std::vector<float> p0 = t.backend().params_host();
  const StepMetrics m = t.train_step();
  const std::vector<float> got = t.backend().grads_host();

  const std::vector<data::Tree> trees = data::read_trees(c.data.path, data::Format::kTree, c.model.vocab_size);
  model::Model<float> ref(c.model);
  ref.set_params(p0.data());
  ref.zero_grad();
  const data::SegmentPlan plan = data::plan_segments(trees[0], c.segments.length);
  const double loss = model::forward_backward_segmented(ref, c.segments, plan, 1.0 / (double)trees[0].n_paths());
  EXPECT_EQ(m.loss, loss);
  EXPECT_EQ(m.pieces, plan.pieces.num_pieces());
  EXPECT_GT(m.pieces, 4);
  EXPECT_EQ(got, ref.grads_host());
  // What the step executed: the segments' own work, less than the whole tree's attention.
  const model::Work w = model::segment_work(c.segments, plan, c.model);
  EXPECT_EQ(w.tokens, trees[0].n_tree());
  EXPECT_LT(w.visible_pairs, model::Work::of(data::pack({&trees[0]}, data::Packing::kTree)).visible_pairs);
}

INSTANTIATE_TEST_SUITE_P(Models, SegmentsStep, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "hybrid" : "qwen3"; });

// Tree packing and the per_path baseline (each path segmented on its own) take the same steps.
TEST(SegmentsTrain, TreeAndPerPathTrainAlike) {
  const fs::path dir = testing::fresh_dir("seg_packing");
  RunConfig tree = seg_config(dir), path = seg_config(dir);
  tree.run_dir = (dir / "tree").string();
  path.run_dir = (dir / "path").string();
  path.data.packing = "per_path";
  Trainer tt(tree), tp(path);
  ASSERT_EQ(tt.backend().params_host(), tp.backend().params_host());
  for (int s = 0; s < 4; ++s) {
    const StepMetrics a = tt.train_step(), b = tp.train_step();
    EXPECT_EQ(a.paths, b.paths);
    // fp32 against fp32 in another summation order: relative 1e-5 (PartitionedTrainingEqualsUnpartitioned's rule).
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(b.loss)) << "step " << s + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * b.grad_norm) << "step " << s + 1;
    EXPECT_GT(b.pieces, a.pieces) << "per_path runs every path's segments";
  }
}

// A resumed segmented run repeats the uninterrupted one bitwise (the CPU backend is deterministic,
// the plans are remade the same).
TEST(SegmentsTrain, ResumeGivesBitwiseTheSameRun) {
  const fs::path dir = testing::fresh_dir("seg_resume");
  RunConfig a = seg_config(dir);
  std::vector<double> want;
  std::vector<float> want_params;
  {
    Trainer full(a);
    for (const StepMetrics& m : full.run()) want.push_back(m.loss);
    want_params = full.backend().params_host();
  }
  RunConfig b = a;
  b.run_dir = (dir / "run_b").string();
  std::vector<double> got;
  {
    Trainer first(b);
    for (int i = 0; i < 2; ++i) got.push_back(first.train_step().loss);
    first.save_checkpoint();
  }
  b.train.resume = true;
  Trainer resumed(b);
  for (const StepMetrics& m : resumed.run()) got.push_back(m.loss);
  EXPECT_EQ(got, want);
  EXPECT_EQ(resumed.backend().params_host(), want_params);
}

// Long documents in the `tokens` format train segment by segment; a segment's piece over the
// budget is an error naming the tree.
TEST(SegmentsTrain, TokenDocumentsTrainAndOversizePiecesAreErrors) {
  const fs::path dir = testing::fresh_dir("seg_tokens");
  {
    std::ofstream out(dir / "docs.jsonl");
    for (int d = 0; d < 3; ++d) {
      out << "{\"id\": \"doc" << d << "\", \"tokens\": [";
      for (int i = 0; i < 60; ++i) out << (i ? ", " : "") << (i * 7 + d * 3) % 32;
      out << "]}\n";
    }
  }
  RunConfig c = seg_config(dir);
  c.data.path = (dir / "docs.jsonl").string();
  c.data.format = "tokens";
  c.data.max_tokens_per_batch = 16;  // a document (60) is over it, a segment (8) is not
  c.validate();
  Trainer t(c);
  const StepMetrics m = t.train_step();
  EXPECT_EQ(m.pieces, 2 * 8) << "two documents of 8 segments each";
  EXPECT_EQ(m.n_tree, 120);
  EXPECT_TRUE(std::isfinite(m.loss));

  RunConfig wide = seg_config(dir);
  wide.run_dir = (dir / "wide").string();
  wide.data.max_tokens_per_batch = 6;  // a comb's segments hold 8 to 12 tokens (branches)
  wide.validate();
  // Segment plans are made when the trainer starts: the error comes before any step.
  const std::string err = error_of([&] { Trainer tw(wide); });
  EXPECT_NE(err.find("tokens exceeds data.max_tokens_per_batch 6 (with segments the budget bounds a piece"),
            std::string::npos)
      << err;
  // Every comb fails; the trees are planned on several threads, and the error names the first,
  // after the budget's key and file and the data file.
  const std::vector<data::Tree> combs = data::read_trees(wide.data.path, data::Format::kTree, wide.model.vocab_size);
  EXPECT_EQ(err.rfind(wide.where("data.max_tokens_per_batch") + ": data.path " + wide.data.path + ": tree '" +
                          combs[0].id + "': a segment piece",
                      0),
            0u)
      << err;
}

// With segments on, a tree no deeper than segments.length runs whole, so over the budget it is an
// error when the trainer starts, naming the budget's key, the file and the tree (tree packing) or
// the path (per_path), as without segments; per_path paths that each fit spread over micro-batches.
TEST(SegmentsTrain, ShallowTreesOverTheBudgetAreErrorsAtStart) {
  const fs::path dir = testing::fresh_dir("seg_shallow_over");
  RunConfig c = seg_config(dir);
  c.segments.length = 40;            // deeper than the combs (30): every tree runs whole
  c.data.max_tokens_per_batch = 20;  // under a comb (42 tokens) and its paths (22 to 30 tokens)
  c.validate();
  // The error a trainer on `rc` stops with at start: the budget's key and file, the tree, then `body`.
  const std::string prefix = c.where("data.max_tokens_per_batch") + ": data.path " + c.data.path + ": ";
  auto expect_start_error = [&](const RunConfig& rc, const std::string& body) {
    const std::string err = error_of([&] { Trainer t(rc); });
    EXPECT_EQ(err.rfind(prefix + "tree '", 0), 0u) << err;
    EXPECT_NE(err.find(body), std::string::npos) << err;
  };
  expect_start_error(c, "' has 42 tokens under tree packing, which exceeds data.max_tokens_per_batch = 20; expected "
                        "every tree to fit one micro-batch (or set partition.capacity_tokens to cut larger trees "
                        "into pieces) (with segments only trees deeper than segments.length 40 train segment by "
                        "segment; this one's depth is 30)");

  RunConfig pp = c;
  pp.run_dir = (dir / "per_path").string();
  pp.data.packing = "per_path";
  pp.validate();
  expect_start_error(pp, "': path 0 has 22 tokens, which exceeds data.max_tokens_per_batch = 20; expected every path "
                         "to fit one micro-batch under per_path packing (with segments only trees deeper than "
                         "segments.length 40 train segment by segment; this one's depth is 30)");

  RunConfig fits = pp;
  fits.run_dir = (dir / "fits").string();
  fits.data.max_tokens_per_batch = 30;  // every path fits; a comb's paths (n_flat > 30) spread
  fits.validate();
  Trainer t(fits);
  const StepMetrics m = t.train_step();
  EXPECT_EQ(m.pieces, 0) << "no tree is deeper than a segment";
  EXPECT_TRUE(std::isfinite(m.loss));
}

// Deep trees are planned on several threads before the shallow ones are checked, yet the run stops
// at the first tree in data order that cannot run: a shallow tree over the budget before a deep
// tree with an oversize segment piece, and the other way round.
TEST(SegmentsTrain, StartErrorsComeInDataOrder) {
  const fs::path dir = testing::fresh_dir("seg_error_order");
  auto chain = [](const std::string& id, int n) {  // depth n, one node
    std::string t = "{\"id\": \"" + id + "\", \"nodes\": [{\"parent\": -1, \"tokens\": [";
    for (int i = 0; i < n; ++i) t += (i ? ", " : "") + std::to_string(1 + i % 9);
    return t + "]}]}\n";
  };
  const std::string wide = R"({"id": "wide", "nodes": [{"parent": -1, "tokens": [1, 2, 3, 4]}, )"
                           R"({"parent": 0, "tokens": [5, 6, 7]}, {"parent": 0, "tokens": [7, 6, 5]}, )"
                           R"({"parent": 0, "tokens": [2, 2, 2]}]})"
                           "\n";  // depth 7, 13 tokens
  for (bool shallow_first : {true, false}) {
    const fs::path data = dir / (shallow_first ? "a.jsonl" : "b.jsonl");
    {
      std::ofstream out(data);
      out << chain("ok0", 5) << (shallow_first ? wide + chain("deep", 30) : chain("deep", 30) + wide) << chain("ok1", 5);
    }
    RunConfig c = seg_config(dir);
    c.run_dir = (dir / (shallow_first ? "a" : "b")).string();
    c.data.path = data.string();
    c.data.format = "tree";
    c.data.max_tokens_per_batch = 6;  // under a segment of the chain (8) and the wide tree (13)
    c.validate();
    const std::string err = error_of([&] { Trainer t(c); });
    EXPECT_NE(err.find(shallow_first ? "tree 'wide'" : "tree 'deep'"), std::string::npos) << err;
    EXPECT_EQ(err.find(shallow_first ? "tree 'deep'" : "tree 'wide'"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace tt::trainer
