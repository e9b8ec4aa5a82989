// The VLA model path on the GPU (issue 16) against the fp64 CPU decoder: a SigLIP tower (head dim
// 64, bidirectional attention over frames whose 36 tokens straddle the kernels' 64- and 128-key
// tiles), the LLaVA projector, the state projection and a Qwen3 decoder, on episode trees with
// two cameras and a state, full and window histories.
//  - LossAndGradients: loss and every gradient (tower, projector, state projection, decoder);
//    then the tree partitioned (each piece's frames through the tower), with and without recompute;
//    then segment by segment with a whole-segment tail (not yet run on a GPU).
//  - FrozenTower: vision.freeze: the tower's gradients are exactly zero, the rest within the rule.
//  - FeatureLayer: vision.vision_feature_layer -2: the last tower layer never runs (zero gradients),
//    the rest within the rule (not yet run on a GPU: added after this session's device time).
//  - TreeVsPerTimestep: the per-timestep samples (per_path packing, the tower once per
//    occurrence) on the GPU give the tree's loss and gradients; the tree run is no further from
//    the fp64 reference than they are (the same-precision rule of test_util.h).
//
// Tolerance: test_util.h's rule, grad_bound(L) for the roundings along a gradient's path, with L
// counting the decoder's layers, the tower's and one for the media stage: a tower layer stores
// fewer bf16 tensors on a gradient's path than a decoder layer's 24 (forward: LN1, q, k, v, att,
// the residual, LN2, fc1, gelu, the residual = 10; backward: datt, dq, dk, dv, dn, dx, da, dh, dn,
// dx = 10), and so does the media stage (patches, the embedding with its bias and positions (3),
// linear_1, gelu, linear_2, and in the backward the slot sum, dh, da1, dh1, dxv = 11).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "data/frames.h"
#include "data/partition.h"
#include "model/decoder.h"
#include "model/partitioned.h"
#include "model/segments.h"
#include "tests/equivalence/vla_fixture.h"
#include "tests/model_cuda/test_util.h"

namespace tt::model_cuda_test {
namespace {

// Decoder V=64, C=128, 2 layers, NH=2, NKV=1, HS=64; tower D=128, 2 heads (HS 64), 2 layers,
// 48 px frames of 8 px patches (36 tokens); state_dim 3.
model::ModelConfig vla_config(bool freeze) {
  model::ModelConfig c = tt::testing::tiny_vla_config(freeze);
  c.vocab_size = 64;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.head_dim = 64;
  c.initializer_range = 0.05;
  c.max_position_embeddings = 1024;  // the full history's 516 deep, and its segments' 2 S - 1
  model::VisionConfig& v = c.vision;
  v.hidden_size = 128;
  v.intermediate_size = 256;
  v.num_attention_heads = 2;
  v.image_size = 48;
  v.patch_size = 8;
  return c;
}

int layers_of(const model::ModelConfig& c) { return (int)(c.num_hidden_layers + c.vision.num_hidden_layers + 1); }

bool is_tower_key_bias(const std::string& name) {
  const std::string suffix = "self_attn.k_proj.bias";
  return name.find("vision_tower") != std::string::npos && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<model::ParamInfo> without_key_biases(const std::vector<model::ParamInfo>& info) {
  std::vector<model::ParamInfo> r;
  for (const model::ParamInfo& p : info)
    if (!is_tower_key_bias(p.name)) r.push_back(p);
  return r;
}

// The rule of test_util.h for every tensor but the tower's key biases, whose exact gradient is
// zero: a bias on every key of an image adds q . b to all scores of a query, which the softmax
// ignores (sum_j dS_ij = 0). The fp64 reference shows it (below 1e-9 of the value bias's
// gradient); the GPU's is the rounding noise of summing dK over the keys, bounded like any
// gradient but against the size of the same layer's v_proj.bias gradient.
void expect_vla_grads_close(const std::vector<model::ParamInfo>& info, const std::vector<float>& got,
                            const std::vector<double>& ref, int layers, const std::string& what,
                            int tower_layers = 2) {
  std::vector<model::ParamInfo> rest;
  auto norm = [](const auto* x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += (double)x[i] * (double)x[i];
    return std::sqrt(s);
  };
  int key_biases = 0;
  for (const model::ParamInfo& p : info) {
    const std::string suffix = "self_attn.k_proj.bias";
    if (!is_tower_key_bias(p.name)) {
      rest.push_back(p);
      continue;
    }
    const std::string v_name = p.name.substr(0, p.name.size() - suffix.size()) + "self_attn.v_proj.bias";
    const model::ParamInfo* v = nullptr;
    for (const model::ParamInfo& q : info)
      if (q.name == v_name) v = &q;
    ASSERT_NE(v, nullptr) << v_name;
    const double scale = norm(ref.data() + v->offset, v->numel);
    ASSERT_GT(scale, 0) << v_name;
    EXPECT_LT(norm(ref.data() + p.offset, p.numel), 1e-9 * scale) << what << ": " << p.name << " (fp64)";
    EXPECT_LT(norm(got.data() + p.offset, p.numel), grad_bound(layers) * scale) << what << ": " << p.name;
    ++key_biases;
  }
  EXPECT_EQ(key_biases, tower_layers) << "one key bias per tower layer that runs";
  expect_grads_close(rest, got, ref, layers, what);
}

class VlaCuda : public GpuTest, public ::testing::WithParamInterface<int> {};

TEST_P(VlaCuda, LossAndGradients) {
  const int window = GetParam();
  const model::ModelConfig cfg = vla_config(false);
  const std::vector<float> master = init_master(cfg, 5);
  const data::Tree t = tt::testing::vla_tree(tt::testing::tiny_episode(7, 2, 31), window, cfg, 4);
  const data::PackedBatch batch = tt::testing::vla_batch(t, data::Packing::kTree, cfg);
  ASSERT_GT(batch.frames.size(), 0u);
  if (window > 0) {
    ASSERT_GT(batch.slot_row.size(), batch.frames.size()) << "a window history shows frames twice";
  }
  const double scale = 1.0 / (double)batch.n_paths;
  std::printf("[ batch    ] window %d: %d tokens, %zu frames, %zu slots, %zu targets\n", window, batch.n_tokens,
              batch.frames.size(), batch.slot_row.size(), batch.tgt_src.size());
  const Reference ref = cpu_reference(cfg, bf16_weights(master), batch, scale);

  model::CudaModel gpu(cfg, model::DecoderOptions{});
  gpu.set_params(master.data());
  gpu.zero_grad();
  const double loss = gpu.forward_backward(batch, scale);
  const std::string what = window == 0 ? "full history" : "window history";
  expect_loss_close(loss, ref.loss, what);
  expect_vla_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, layers_of(cfg), what);

  // Deterministic forward, accumulating gradients (the second backward adds the same again).
  const std::vector<float> g1 = gpu.grads_host();
  const double loss2 = gpu.forward_backward(batch, scale);
  EXPECT_EQ(loss2, loss);
  const std::vector<float> g2 = gpu.grads_host();
  std::vector<double> twice(ref.grads.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * ref.grads[i];
  expect_vla_grads_close(gpu.params_info(), g2, twice, layers_of(cfg), what + " (accumulated twice)");

  // Partitioned into pieces of <= 80 tokens (two frames and a state row; each piece runs the tower
  // on its own frames), with and without partition.recompute: the same rule, the same reference.
  const int64_t cap = 80;
  const data::Tree split = data::split_long_nodes(t, cap);
  const data::Partition plan = data::plan_partition(split, cap);
  ASSERT_GT(plan.num_pieces(), 4);
  data::FrameSpec spec;
  spec.image_size = (int)cfg.vision.image_size;
  const model::LoadPieceFrames load = [&](data::PackedBatch& b) { data::load_frames(b, spec); };
  for (bool recompute : {false, true}) {
    gpu.zero_grad();
    model::PartitionRunStats st;
    const double lp = model::forward_backward_partitioned(gpu, split, plan, scale, &st, recompute, load);
    const std::string w = what + (recompute ? ", partitioned, recompute" : ", partitioned");
    EXPECT_EQ(st.tokens_processed, t.n_tree()) << w;
    expect_loss_close(lp, ref.loss, w);
    expect_vla_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, layers_of(cfg), w);
  }

  // Segments of S > max_depth / 2 with a whole-segment tail and K = 1 (every row sees its whole
  // history, every gradient crosses): the same reference; the boundary cuts a frame's slot, whose
  // frame runs the tower in both segments (parts of slots: PackedBatch::slot_first, slot_count).
  model::SegmentConfig seg;
  seg.length = t.max_depth() / 2 + 1;
  seg.tail = seg.length;
  seg.tbptt = 1;
  gpu.zero_grad();
  const double ls = model::forward_backward_segmented(gpu, seg, data::plan_segments(t, seg.length), scale, nullptr, load);
  const std::string ws = what + ", segments";
  expect_loss_close(ls, ref.loss, ws);
  expect_vla_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, layers_of(cfg), ws);
}

INSTANTIATE_TEST_SUITE_P(Histories, VlaCuda, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == 0 ? std::string("full") : "window" + std::to_string(i.param);
                         });

// One training forward and backward of a 5-step one-camera episode on the GPU, beside the fp64
// CPU reference of the same config and bf16 weights; the loss checked (`what`), the gradients and
// the frozen tensors returned. Frozen tensors' gradients must be exactly zero.
struct FrozenRun {
  Reference ref;
  std::vector<float> grads;
  std::vector<model::ParamInfo> info, trainable, frozen;
};
FrozenRun run_with_frozen(const model::ModelConfig& cfg, const std::string& what) {
  const std::vector<float> master = init_master(cfg, 6);
  const data::Tree t = tt::testing::vla_tree(tt::testing::tiny_episode(5, 1, 8), 0, cfg, 2);
  const data::PackedBatch batch = tt::testing::vla_batch(t, data::Packing::kTree, cfg);
  const double scale = 1.0 / (double)batch.n_paths;
  FrozenRun r;
  r.ref = cpu_reference(cfg, bf16_weights(master), batch, scale);
  model::CudaModel gpu(cfg, model::DecoderOptions{});
  gpu.set_params(master.data());
  gpu.zero_grad();
  expect_loss_close(gpu.forward_backward(batch, scale), r.ref.loss, what);
  r.grads = gpu.grads_host();
  r.info = gpu.params_info();
  for (const model::ParamInfo& p : r.info) {
    (p.trainable ? r.trainable : r.frozen).push_back(p);
    if (p.trainable) continue;
    for (int64_t i = 0; i < p.numel; ++i)
      EXPECT_EQ(r.grads[p.offset + i], 0.f) << what << ": " << p.name << " is frozen";
  }
  return r;
}

TEST_F(GpuTest, VlaFrozenTower) {
  const model::ModelConfig cfg = vla_config(true);
  const FrozenRun r = run_with_frozen(cfg, "frozen tower");
  EXPECT_GT(r.frozen.size(), 0u);
  expect_grads_close(r.info, r.grads, r.ref.grads, layers_of(cfg), "frozen tower");  // key biases: 0 == 0
}

// vision.vision_feature_layer -2: the tower's last layer never runs (its tensors frozen, their
// gradients exactly zero), the rest within the rule against the fp64 CPU decoder of the same config.
TEST_F(GpuTest, VlaFeatureLayer) {
  model::ModelConfig cfg = vla_config(false);
  cfg.vision.vision_feature_layer = -2;
  const FrozenRun r = run_with_frozen(cfg, "vision_feature_layer -2");
  EXPECT_EQ(r.frozen.size(), 16u);
  for (const model::ParamInfo& p : r.frozen)
    EXPECT_NE(p.name.find("vision_model.encoder.layers.1."), std::string::npos) << p.name;
  expect_vla_grads_close(r.trainable, r.grads, r.ref.grads, layers_of(cfg), "vision_feature_layer -2",
                         /*tower_layers=*/1);
}

TEST_F(GpuTest, VlaTreeVsPerTimestep) {
  const model::ModelConfig cfg = vla_config(false);
  const std::vector<float> master = init_master(cfg, 9);
  const data::Tree t = tt::testing::vla_tree(tt::testing::tiny_episode(6, 2, 12), 2, cfg, 3);
  const data::PackedBatch tree = tt::testing::vla_batch(t, data::Packing::kTree, cfg);
  const data::PackedBatch steps = tt::testing::vla_batch(t, data::Packing::kPerPath, cfg);
  ASSERT_GT(steps.frames.size(), tree.frames.size()) << "per-timestep samples run the tower per occurrence";
  const double scale = 1.0 / (double)tree.n_paths;
  const Reference ref = cpu_reference(cfg, bf16_weights(master), tree, scale);
  model::CudaModel gpu(cfg, model::DecoderOptions{});
  gpu.set_params(master.data());
  gpu.zero_grad();
  const double l_tree = gpu.forward_backward(tree, scale);
  const std::vector<float> g_tree = gpu.grads_host();
  gpu.zero_grad();
  const double l_steps = gpu.forward_backward(steps, scale);
  const std::vector<float> g_steps = gpu.grads_host();
  expect_loss_close(l_tree, ref.loss, "tree");
  expect_loss_close(l_steps, ref.loss, "per-timestep");
  expect_vla_grads_close(gpu.params_info(), g_tree, ref.grads, layers_of(cfg), "tree");
  expect_vla_grads_close(gpu.params_info(), g_steps, ref.grads, layers_of(cfg), "per-timestep");
  expect_no_worse_than(without_key_biases(gpu.params_info()), g_tree, g_steps, ref.grads, "tree vs per-timestep");
}

}  // namespace
}  // namespace tt::model_cuda_test
