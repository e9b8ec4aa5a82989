// The VLA media stage (model/vision.h), CPU fp64: every gradient of a tiny VLA (the decoder, the
// LLaVA projector, the state projection, the SigLIP tower down to the patch embedding) against
// finite differences on an episode tree; the parameter table's names, shapes and frozen flags;
// the FLOP API's tower count; and the errors a batch that does not fit the model gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/check.h"
#include "model/decoder.h"
#include "tests/equivalence/vla_fixture.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

TEST(Vision, EveryGradientMatchesFiniteDifferences) {
  const ModelConfig cfg = tt::testing::tiny_vla_config();
  Model<double> m(cfg);
  m.init(5);
  const data::Episode ep = tt::testing::tiny_episode(3, 2, 1);
  for (int window : {0, 2}) {
    const data::Tree tree = tt::testing::vla_tree(ep, window, cfg, 2);
    const data::PackedBatch b = tt::testing::vla_batch(tree, data::Packing::kTree, cfg);
    testing::expect_sampled_gradients(m, b, 0.5, 17 + window, 3, "window " + std::to_string(window));
  }
}

TEST(Vision, TableHasLlavaNamesAndFreezesOnlyTheTower) {
  const ModelConfig cfg = tt::testing::tiny_vla_config(/*freeze=*/true);
  const Architecture arch(cfg);
  const ParamTable& t = arch.table();
  EXPECT_EQ(t.num_params(), cfg.parameter_count());
  const ParamInfo& pe = t[t.find("model.vision_tower.vision_model.embeddings.patch_embedding.weight")];
  EXPECT_EQ(pe.shape, (std::vector<int64_t>{8, 3, 2, 2}));
  EXPECT_EQ(t[t.find("model.vision_tower.vision_model.embeddings.position_embedding.weight")].shape,
            (std::vector<int64_t>{4, 8}));
  for (const std::string n : {"encoder.layers.1.self_attn.out_proj.bias", "encoder.layers.0.layer_norm1.weight",
                              "encoder.layers.1.mlp.fc2.weight"}) {
    const int i = t.find("model.vision_tower.vision_model." + n);
    ASSERT_GE(i, 0) << n;
    EXPECT_FALSE(t[i].trainable) << n;
  }
  for (const std::string n : {"model.multi_modal_projector.linear_1.weight", "model.multi_modal_projector.linear_2.bias",
                              "model.state_projector.weight", "model.layers.0.mlp.up_proj.weight"}) {
    const int i = t.find(n);
    ASSERT_GE(i, 0) << n;
    EXPECT_TRUE(t[i].trainable) << n;
  }
  EXPECT_FALSE(t[t.find("model.multi_modal_projector.linear_1.bias")].decay);
  EXPECT_LT(t.find("post_layernorm.weight"), 0) << "LLaVA reads the last layer without SigLIP's post_layernorm";
  // The tower's FLOPs scale with the frames it runs on: the tree runs each frame once.
  const data::Tree tree = tt::testing::vla_tree(tt::testing::tiny_episode(4, 1, 2), 0, cfg, 3);
  const Work wt = Work::of(tt::testing::vla_batch(tree, data::Packing::kTree, cfg));
  const Work wp = Work::of(tt::testing::vla_batch(tree, data::Packing::kPerPath, cfg));
  EXPECT_EQ(wt.frames, 4);
  EXPECT_EQ(wp.frames, 1 + 2 + 3 + 4);
  Work frames_only;
  frames_only.frames = 1;
  ModelConfig trained = cfg;
  trained.vision.freeze = false;
  // One frame of P = 4 tokens, D = 8, I = 12, 2 layers, forward: patch embedding, q/k/v/o with
  // biases, attention pairs, the MLP, the projector.
  const double P = 4, D = 8, I = 12, C = 8, K = 12;
  const double fwd = 2 * (K * D + D) * P + 2 * 2 * (4 * (D * D + D) * P + 2 * D * P * P) +
                     2 * 2 * (2 * D * I + I + D) * P + 2 * ((D * C + C) + (C * C + C)) * P;
  EXPECT_DOUBLE_EQ(Architecture(trained).vision()->flops(frames_only, Pass::kForward).model, fwd);
}

// vision.vision_feature_layer: the projector reads hidden_states[k]. A two-layer tower read at -2
// (or 1) is the one-layer tower with the same tensors, bitwise (the same operations on the same
// inputs): the loss and every shared gradient; the second layer never runs, is frozen and gets no
// gradient; the FLOP API counts the layer that runs. At -3 (or 0) the projector reads the
// embeddings.
TEST(Vision, FeatureLayerReadsThatHiddenState) {
  const data::Episode ep = tt::testing::tiny_episode(3, 2, 1);
  const ModelConfig one = tt::testing::tiny_vla_config(false, /*tower_layers=*/1);
  auto run = [&](const ModelConfig& cfg, Model<double>& from, std::vector<double>* grads) {
    Model<double> m(cfg);
    for (const ParamInfo& p : m.params_info()) {  // the same tensors, by name
      const int i = from.table().find(p.name);
      EXPECT_GE(i, 0) << p.name;
      std::copy(from.params() + from.params_info()[i].offset,
                from.params() + from.params_info()[i].offset + p.numel, m.params() + p.offset);
    }
    const data::Tree tree = tt::testing::vla_tree(ep, 0, cfg, 2);
    const data::PackedBatch b = tt::testing::vla_batch(tree, data::Packing::kTree, cfg);
    m.zero_grad();
    const double loss = m.forward(b, 0.5);
    m.backward();
    grads->assign(m.grads(), m.grads() + m.num_params());
    return loss;
  };
  ModelConfig two = tt::testing::tiny_vla_config();
  Model<double> source(two);
  source.init(5);
  std::vector<double> g1, g2;
  const double want = run(one, source, &g1);
  for (int64_t k : {int64_t(-2), int64_t(1)}) {
    two.vision.vision_feature_layer = k;
    EXPECT_EQ(run(two, source, &g2), want) << k;
    const Architecture a1(one), a2(two);
    for (const ParamInfo& p : a2.table().entries()) {
      const int i = a1.table().find(p.name);
      const bool unused = p.name.find("encoder.layers.1.") != std::string::npos;
      EXPECT_EQ(i < 0, unused) << p.name;
      EXPECT_EQ(p.trainable, !unused) << p.name;
      for (int64_t j = 0; j < p.numel; ++j) {
        if (unused) ASSERT_EQ(g2[p.offset + j], 0.0) << p.name;
        else ASSERT_EQ(g2[p.offset + j], g1[a1.table()[i].offset + j]) << p.name << " " << k;
      }
    }
    Work w;
    w.frames = 1;
    EXPECT_EQ(Architecture(two).vision()->flops(w, Pass::kTrain).executed,
              Architecture(one).vision()->flops(w, Pass::kTrain).executed);
  }
  // The embeddings: both spellings read the same state; no tower layer runs, is trainable or takes
  // a gradient, the embeddings do.
  two.vision.vision_feature_layer = 0;
  const double at0 = run(two, source, &g1);
  two.vision.vision_feature_layer = -3;
  const double at_minus3 = run(two, source, &g2);
  EXPECT_EQ(at0, at_minus3);
  EXPECT_NE(at0, want);
  EXPECT_EQ(g1, g2);
  const Architecture a0(two);
  EXPECT_TRUE(a0.vision()->tower().empty());
  double embedding_grad = 0;
  for (const ParamInfo& p : a0.table().entries()) {
    const bool layer = p.name.find("vision_model.encoder.layers.") != std::string::npos;
    if (layer) EXPECT_FALSE(p.trainable) << p.name;
    for (int64_t j = 0; j < p.numel; ++j) {
      if (layer) ASSERT_EQ(g1[p.offset + j], 0.0) << p.name;
      if (p.name.find("vision_model.embeddings.") != std::string::npos) embedding_grad += std::abs(g1[p.offset + j]);
    }
  }
  EXPECT_GT(embedding_grad, 0.0);
}

TEST(Vision, BatchesThatDoNotFitTheModelAreErrors) {
  const ModelConfig cfg = tt::testing::tiny_vla_config();
  const data::Tree tree = tt::testing::vla_tree(tt::testing::tiny_episode(2, 1, 2), 0, cfg, 3);
  ModelConfig text = cfg;
  text.vision = VisionConfig{};
  Model<double> plain(text);
  data::PackedBatch b = tt::testing::vla_batch(tree, data::Packing::kTree, cfg);
  try {
    plain.forward(b, 1.0);
    FAIL() << "media rows on a model without vision";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no vision section"), std::string::npos) << e.what();
  }
  Model<double> m(cfg);
  data::PackedBatch unloaded = data::pack({&tree}, data::Packing::kTree);
  try {
    m.forward(unloaded, 1.0);
    FAIL() << "frames without pixels";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not loaded"), std::string::npos) << e.what();
  }
  ModelConfig wide = cfg;
  wide.vision.image_size = 8;  // 16 tokens a frame
  Model<double> w(wide);
  try {
    w.forward(b, 1.0);
    FAIL() << "slots of 4 rows for a tower of 16 tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gives 16 tokens per frame"), std::string::npos) << e.what();
  }
}

TEST(Vision, ConfigErrorsNameTheKey) {
  ModelConfig c = tt::testing::tiny_vla_config();
  c.vision.patch_size = 3;
  try {
    c.validate();
    FAIL();
  } catch (const KeyError& e) {
    EXPECT_EQ(e.key(), "vision.patch_size");
  }
  for (int64_t k : {int64_t(-4), int64_t(3)}) {  // two layers: hidden_states[-3 .. 2]
    c = tt::testing::tiny_vla_config();
    c.vision.vision_feature_layer = k;
    try {
      c.validate();
      FAIL() << k;
    } catch (const KeyError& e) {
      EXPECT_EQ(e.key(), "vision.vision_feature_layer");
      EXPECT_NE(std::string(e.what()).find("must be in [-3, 2]"), std::string::npos) << e.what();
    }
  }
  c = tt::testing::tiny_vla_config();
  c.vision.state_token_index = c.vision.image_token_index;
  EXPECT_THROW(c.validate(), KeyError);
}

}  // namespace
}  // namespace tt::model
