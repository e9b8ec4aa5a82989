// Training a VLA through the trainer (issue 16): the shipped configs/vla_tiny.yaml on generated
// robot episodes (data.format: episodes, PNG frames decoded per micro-batch): a resumed run
// repeats the uninterrupted one bitwise; every checkpoint holds the action bins; tree packing and
// the per-timestep baseline take the same first step; a frozen tower stays as it was; and the
// config errors a VLA run can hit name their key.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/actions.h"
#include "data/toy_episodes.h"
#include "tests/trainer/test_util.h"
#include "trainer/config.h"
#include "trainer/train.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::fresh_dir;
using testing::slurp;

// configs/vla_tiny.yaml on `episodes` toy episodes of `steps` steps, written under dir.
RunConfig vla_config(const fs::path& dir, int episodes, int steps, std::vector<std::string> overrides = {}) {
  data::ToyEpisodeSpec spec;
  spec.num_episodes = episodes;
  spec.steps = steps;
  spec.seed = 5;
  const std::string data = (dir / "data" / "episodes.jsonl").string();
  data::write_toy_episodes(spec, data);
  std::vector<std::string> o = {"run_dir=" + (dir / "run").string(), "data.path=" + data, "train.log_every=1",
                                "schedule.warmup_steps=1"};
  o.insert(o.end(), overrides.begin(), overrides.end());
  return load_config("configs/vla_tiny.yaml", o);
}

std::vector<double> losses(const std::vector<StepMetrics>& ms) {
  std::vector<double> out;
  for (const StepMetrics& m : ms) out.push_back(m.loss);
  return out;
}

TEST(VlaTrain, ResumeIsBitwiseAndCheckpointsHoldTheActionBins) {
  const fs::path dir = fresh_dir("vla_resume");
  RunConfig a = vla_config(dir, 6, 4, {"train.max_steps=4", "train.checkpoint_every=2", "data.max_tokens_per_batch=256"});
  Trainer full(a);
  const std::vector<double> want = losses(full.run());
  ASSERT_EQ(want.size(), 4u);
  const std::vector<float> want_params = full.backend().params_host();
  const fs::path ckpt = fs::path(a.run_dir) / "checkpoints" / "step_4";
  const data::ActionBins bins = data::ActionBins::from_json(slurp(ckpt / "action_bins.json"), "action_bins.json");
  EXPECT_EQ(bins.dims(), 2);
  EXPECT_EQ(bins.bins, 16);
  EXPECT_EQ(bins.vocab_size, 64);
  EXPECT_NE(slurp(ckpt / "trainer_state.json").find("action_bins.json"), std::string::npos) << "in the manifest";
  EXPECT_NE(slurp(ckpt / "config.json").find("LlavaForConditionalGeneration"), std::string::npos);

  RunConfig b = a;
  b.run_dir = (dir / "run_b").string();
  b.train.checkpoint_every = 0;
  std::vector<double> got;
  {
    Trainer first(b);
    for (int i = 0; i < 2; ++i) got.push_back(first.train_step().loss);
    first.save_checkpoint();
  }
  b.train.resume = true;
  Trainer resumed(b);
  EXPECT_EQ(resumed.start_step(), 2);
  for (double l : losses(resumed.run())) got.push_back(l);
  EXPECT_EQ(got, want);
  EXPECT_EQ(resumed.backend().params_host(), want_params);
}

// The same trees in one micro-batch either way: the per-timestep baseline (each step's context its
// own sequence, the tower run for every occurrence of a frame) takes the tree's first step.
// AdamW's first update is lr g / (|g| + eps): with the default eps 1e-8 it is +-lr wherever
// |g| >> eps and ill-conditioned where |g| ~ eps, where the two packings' fp32 summation orders
// show; optim.eps 1e-4 makes it linear in the small gradients, so the comparison measures the
// gradients (expect_params_match's rule).
TEST(VlaTrain, TreeAndPerTimestepTakeTheSameStep) {
  const fs::path dir = fresh_dir("vla_packings");
  std::vector<float> p0, after[2];
  double loss[2];
  for (int k = 0; k < 2; ++k) {
    RunConfig c = vla_config(dir / std::to_string(k), 3, 4,
                             {"train.max_steps=1", "data.shuffle=false", "data.max_tokens_per_batch=8192",
                              std::string("data.packing=") + (k ? "per_path" : "tree"), "train.final_checkpoint=false",
                              "data.history={window: 2}", "optim.eps=1e-4"});
    Trainer t(c);
    if (k == 0) p0 = t.backend().params_host();
    const StepMetrics m = t.train_step();
    loss[k] = m.loss;
    after[k] = t.backend().params_host();
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-5 * std::abs(loss[1]));
  testing::expect_params_match(after[0], after[1], p0, "tree vs per_path");
}

// Episode trees over the micro-batch budget train piece by piece (partition.capacity_tokens, with
// and without partition.recompute; each piece's frames decoded when it runs) and take the step of
// the same trees unpartitioned in one micro-batch (expect_params_match's rule, as above), with full
// and window histories. executed_flops: the same with full history (each frame in one piece), more
// with a window (a frame shown in several pieces runs the tower in each) and with recompute.
TEST(VlaTrain, PartitionedEpisodesTakeTheSameStep) {
  for (const std::string history : {"full", "{window: 2}"}) {
    const fs::path dir = fresh_dir("vla_partitioned");
    std::vector<float> p0, after[3];
    double loss[3], executed[3];
    for (int k = 0; k < 3; ++k) {
      std::vector<std::string> o = {"train.max_steps=1", "data.shuffle=false", "train.final_checkpoint=false",
                                    "optim.eps=1e-4", "data.history=" + history};
      if (k == 0) {
        o.insert(o.end(), {"data.max_tokens_per_batch=8192", "train.grad_accum=1"});
      } else {  // each tree alone in a micro-batch of 64, cut into pieces of <= 32 tokens
        o.insert(o.end(), {"data.max_tokens_per_batch=64", "train.grad_accum=3", "partition.capacity_tokens=32"});
        if (k == 2) o.push_back("partition.recompute=true");
      }
      RunConfig c = vla_config(dir / std::to_string(k), 3, 5, o);
      Trainer t(c);
      if (k == 0) p0 = t.backend().params_host();
      const StepMetrics m = t.train_step();
      if (k == 0) EXPECT_EQ(m.pieces, 0);
      else EXPECT_GE(m.pieces, 3 * 3) << history << ": several pieces a tree";
      EXPECT_EQ(m.paths, 3 * 5);
      loss[k] = m.loss;
      executed[k] = m.executed_flops;
      after[k] = t.backend().params_host();
    }
    for (int k = 1; k < 3; ++k) {
      EXPECT_NEAR(loss[k], loss[0], 1e-5 * std::abs(loss[0])) << history << " k " << k;
      testing::expect_params_match(after[k], after[0], p0,
                                   history + (k == 1 ? ", partitioned" : ", partitioned, recompute"));
    }
    if (history == "full") EXPECT_DOUBLE_EQ(executed[1], executed[0]);
    else EXPECT_GT(executed[1], executed[0]) << "towers run again in other pieces";
    EXPECT_GT(executed[2], executed[1]) << history << ": recompute's second forwards";
  }
}

// Episode trees deeper than segments.length train segment by segment (each segment piece's
// frames decoded when it runs). The toy episodes (5 steps: instruction 3 rows, 17 a step, 2 action
// tokens) are 90 deep; segments of 46 with a 46-row tail and K = 1 let every row see its whole
// history and every gradient through, so the step equals the unsegmented one (expect_params_match's
// rule), under tree packing and per path; the boundary at depth 46 cuts step 2's frame slot (rows
// 37-52), whose frame then runs the tower in both segments (more executed FLOPs).
TEST(VlaTrain, SegmentedEpisodesTakeTheSameStep) {
  for (const std::string packing : {"tree", "per_path"}) {
    const fs::path dir = fresh_dir("vla_segmented");
    std::vector<float> p0, after[2];
    double loss[2], executed[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<std::string> o = {"train.max_steps=1", "data.shuffle=false", "train.final_checkpoint=false",
                                    "optim.eps=1e-4", "data.packing=" + packing};
      if (k == 0) {
        o.insert(o.end(), {"data.max_tokens_per_batch=8192", "train.grad_accum=1"});
      } else {
        o.insert(o.end(), {"data.max_tokens_per_batch=128", "train.grad_accum=3", "segments.length=46",
                           "segments.tail=46", "segments.tbptt=1"});
      }
      RunConfig c = vla_config(dir / std::to_string(k), 3, 5, o);
      Trainer t(c);
      if (k == 0) p0 = t.backend().params_host();
      const StepMetrics m = t.train_step();
      if (k == 0) {
        EXPECT_EQ(m.pieces, 0);
      } else {
        EXPECT_GE(m.pieces, 3 * 2) << packing << ": two segments a tree";
      }
      EXPECT_EQ(m.paths, 3 * 5);
      loss[k] = m.loss;
      executed[k] = m.executed_flops;
      after[k] = t.backend().params_host();
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::abs(loss[0])) << packing;
    testing::expect_params_match(after[1], after[0], p0, packing + ", segmented");
    EXPECT_GT(executed[1], executed[0]) << packing << ": the cut frame's tower runs in both segments";
  }
}

// Runs `c` to its end: per tensor, its name and whether training changed it.
std::vector<std::pair<std::string, bool>> changed_tensors(const RunConfig& c) {
  Trainer t(c);
  const std::vector<float> p0 = t.backend().params_host();
  t.run();
  const std::vector<float> p1 = t.backend().params_host();
  std::vector<std::pair<std::string, bool>> out;
  for (const model::ParamInfo& p : t.backend().params_info()) {
    bool changed = false;
    for (int64_t i = 0; i < p.numel; ++i) changed |= p0[p.offset + i] != p1[p.offset + i];
    out.emplace_back(p.name, changed);
  }
  return out;
}

TEST(VlaTrain, AFrozenTowerStaysAsItWas) {
  const fs::path dir = fresh_dir("vla_frozen");
  RunConfig c = vla_config(dir, 2, 3, {"train.max_steps=2", "vision.freeze=true", "train.final_checkpoint=false"});
  int64_t tower = 0, moved = 0;
  for (const auto& [name, changed] : changed_tensors(c)) {
    const bool in_tower = name.rfind("model.vision_tower.", 0) == 0;
    if (in_tower) {
      ++tower;
      EXPECT_FALSE(changed) << name << " is frozen";
    } else {
      moved += changed;
    }
  }
  EXPECT_GT(tower, 0);
  EXPECT_GT(moved, 0);
}

// vision.vision_feature_layer -2 (LLaVA-1.5's): the tower's last layer never runs and AdamW leaves
// it as it was (transformers gives it no gradient), the layer before it trains; the checkpoint's
// config.json says -2.
TEST(VlaTrain, ALayerPastTheFeatureLayerStaysAsItWas) {
  const fs::path dir = fresh_dir("vla_feature_layer");
  RunConfig c = vla_config(dir, 2, 3, {"train.max_steps=2", "vision.vision_feature_layer=-2"});
  int64_t last = 0, moved = 0;
  for (const auto& [name, changed] : changed_tensors(c)) {
    if (name.rfind("model.vision_tower.vision_model.encoder.layers.1.", 0) == 0) {
      ++last;
      EXPECT_FALSE(changed) << name << " is past the feature layer";
    } else if (name.rfind("model.vision_tower.vision_model.encoder.layers.0.", 0) == 0) {
      moved += changed;
    }
  }
  EXPECT_EQ(last, 16);  // layer_norm1, layer_norm2, q/k/v/out_proj, fc1, fc2: a weight and a bias each
  EXPECT_GT(moved, 0);
  const std::string cfg = slurp(fs::path(c.run_dir) / "checkpoints" / "step_2" / "config.json");
  EXPECT_NE(cfg.find("\"vision_feature_layer\": -2"), std::string::npos) << cfg;
}

TEST(VlaTrain, ConfigErrorsNameTheKey) {
  const fs::path dir = fresh_dir("vla_errors");
  std::string e = error_of([&] { vla_config(dir, 1, 2, {"vision.num_hidden_layers=0"}); });
  EXPECT_NE(e.find("data.format must be rollouts or tree without a vision section"), std::string::npos) << e;
  e = error_of([&] { vla_config(dir, 1, 2, {"data.format=rollouts", "data.history={window: 2}"}); });
  EXPECT_NE(e.find("data.history must be full unless data.format is episodes"), std::string::npos) << e;
  e = error_of([&] { vla_config(dir, 1, 2, {"data.history={window: 0}"}); });
  EXPECT_NE(e.find("data.history.window: expected an integer >= 1, got '0'"), std::string::npos) << e;
  e = error_of([&] { vla_config(dir, 1, 2, {"data.history={steps: 2}"}); });
  EXPECT_NE(e.find("data.history: expected full or {window: W} with W >= 1, got a mapping"), std::string::npos) << e;
  e = error_of([&] { vla_config(dir, 1, 2, {"vision.patch_size=3"}); });
  EXPECT_NE(e.find("vision.patch_size must divide vision.image_size (16)"), std::string::npos) << e;
  e = error_of([&] { vla_config(dir, 1, 2, {"vision.state_dim=3"}); });
  EXPECT_EQ(e, "");  // the config is fine; the data disagrees at load
  e = error_of([&] { Trainer t(vla_config(dir, 1, 2, {"vision.state_dim=3"})); });
  EXPECT_NE(e.find("has states of 2 values, but vision.state_dim is 3"), std::string::npos) << e;
  e = error_of([&] { vla_config(dir, 1, 2, {"partition.capacity_tokens=15"}); });
  EXPECT_NE(e.find("partition.capacity_tokens must be >= 16, the tokens of a frame ((vision.image_size / "
                   "vision.patch_size)^2: a piece holds whole frames), or 0 (got 15)"),
            std::string::npos)
      << e;
}

// Frames are decoded as batches need them: a frame that is no image stops the step that needs it,
// naming the image file and whose frame it is (the episode's place in the data file, its step
// and camera).
TEST(VlaTrain, ACorruptFrameNamesItsEpisodeAndFile) {
  const fs::path dir = fresh_dir("vla_corrupt_frame");
  RunConfig c = vla_config(dir, 2, 2, {"train.max_steps=1", "data.shuffle=false"});
  const fs::path frame = dir / "data" / "episodes_frames" / "1_0.png";
  ASSERT_TRUE(fs::is_regular_file(frame));
  { std::ofstream(frame, std::ios::trunc) << "not an image"; }
  Trainer t(c);
  const std::string e = error_of([&] { t.run(); });
  EXPECT_NE(e.find("the frame of the data file's episode 1 (counting from 0), step 0, camera 0: " + frame.string() +
                   ": not a PNG or JPEG file"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace tt::trainer
