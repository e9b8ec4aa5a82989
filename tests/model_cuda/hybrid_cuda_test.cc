// Hybrid decoders (model/gdn.h: Gated DeltaNet layers between Qwen3.5's gated full attention) on
// the CUDA backend against the fp64 CPU decoder, by the hybrid rounding rule of test_util.h:
//  - HybridGpuVsCpu: loss and every parameter's gradient on random tree batches (one-token nodes,
//    branch points, several trees) for qwen3_5_text (split projections, zero-centred norms,
//    partial RoPE, the attention output gate) and qwen3_next (fused projections grouped per key
//    head), head dims 64 and 128; gradients accumulate and the forward is deterministic.
//  - TreeVsPerPath: the same trees packed per path give the tree's loss and gradients.
//  - Errors: what the CUDA backend refuses (linear head shapes its kernels do not take, a carried
//    recurrent state: partition pieces) names the key or the reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>

#include "data/partition.h"
#include "model/decoder.h"
#include "model/partitioned.h"
#include "tests/model_cuda/test_util.h"

namespace tt::model_cuda_test {
namespace {

const double kBound = hybrid_grad_bound(2, 1);

class HybridGpuVsCpu : public GpuTest, public ::testing::WithParamInterface<HybridShape> {};

TEST_P(HybridGpuVsCpu, LossAndGradients) {
  const HybridShape& h = GetParam();
  const model::ModelConfig cfg = hybrid_config_of(h);
  const std::vector<float> master = init_master(cfg, 7);
  model::CudaModel gpu(cfg);
  gpu.set_params(master.data());
  const std::vector<data::Tree> trees = random_trees(17, 5, h.base.V);
  const data::PackedBatch batch = pack_all(trees, data::Packing::kTree);
  const double scale = 1.0 / (double)batch.n_paths;
  std::printf("[ batch    ] %s: %d tokens, %d nodes, %d trees\n", h.base.name.c_str(), batch.n_tokens,
              batch.num_nodes(), batch.num_trees());
  const Reference ref = cpu_reference(cfg, bf16_weights(master), batch, scale);
  gpu.zero_grad();
  const double loss = gpu.forward_backward(batch, scale);
  expect_loss_close(loss, ref.loss, h.base.name);
  expect_grads_within(gpu.params_info(), gpu.grads_host(), ref.grads, kBound, h.base.name);
  const double loss2 = gpu.forward_backward(batch, scale);
  EXPECT_EQ(loss2, loss) << "the forward is deterministic";
  std::vector<double> twice(ref.grads);
  for (double& g : twice) g *= 2;
  expect_grads_within(gpu.params_info(), gpu.grads_host(), twice, kBound, h.base.name + " x2");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, HybridGpuVsCpu,
    ::testing::Values(HybridShape{{"qwen3_5_hs64", "qwen3_5_text", 384, 192, 384, 3, 4, 2, 64, false, 0}, 2, 4, 64, 64},
                      HybridShape{{"qwen3_next_hs128", "qwen3_next", 320, 256, 512, 3, 4, 2, 128, true, 0},
                                  2, 4, 128, 96}),
    [](const ::testing::TestParamInfo<HybridShape>& i) { return i.param.base.name; });

const HybridShape kHybrid{{"qwen3_5_hs64", "qwen3_5_text", 384, 192, 384, 3, 4, 2, 64, false, 0}, 2, 4, 64, 64};

TEST_F(GpuTest, HybridTreeVsPerPath) {
  const model::ModelConfig cfg = hybrid_config_of(kHybrid);
  const std::vector<float> master = init_master(cfg, 3);
  const std::vector<data::Tree> trees = random_trees(23, 4, kHybrid.base.V);
  const data::PackedBatch tree = pack_all(trees, data::Packing::kTree);
  const data::PackedBatch paths = pack_all(trees, data::Packing::kPerPath);
  ASSERT_GT(paths.n_tokens, tree.n_tokens);
  const double scale = 1.0 / (double)tree.n_paths;
  const Reference ref = cpu_reference(cfg, bf16_weights(master), tree, scale);
  model::CudaModel gpu(cfg);
  gpu.set_params(master.data());
  gpu.zero_grad();
  const double l_tree = gpu.forward_backward(tree, scale);
  const std::vector<float> g_tree = gpu.grads_host();
  gpu.zero_grad();
  const double l_paths = gpu.forward_backward(paths, scale);
  const std::vector<float> g_paths = gpu.grads_host();
  expect_loss_close(l_tree, ref.loss, "hybrid tree");
  expect_loss_close(l_paths, ref.loss, "hybrid per-path");
  expect_grads_within(gpu.params_info(), g_tree, ref.grads, kBound, "hybrid tree");
  expect_grads_within(gpu.params_info(), g_paths, ref.grads, kBound, "hybrid per-path");
  expect_no_worse_than(gpu.params_info(), g_tree, g_paths, ref.grads, "hybrid tree vs per-path");
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected tt::Error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(GpuTest, HybridErrors) {
  model::ModelConfig dk4 = hybrid_config_of(kHybrid);
  dk4.linear_key_head_dim = 4;
  expect_error([&] { model::CudaModel m(dk4); }, "model.linear_key_head_dim 4");
  model::ModelConfig dv48 = hybrid_config_of(kHybrid);
  dv48.linear_value_head_dim = 48;
  expect_error([&] { model::CudaModel m(dv48); }, "model.linear_value_head_dim 48");
  // A partition piece carries the recurrent state across its cut: the CPU backend's so far.
  const model::ModelConfig cfg = hybrid_config_of(kHybrid);
  model::CudaModel gpu(cfg);
  gpu.init(1);
  const std::vector<data::Tree> trees = random_trees(31, 1, kHybrid.base.V, 6, 3, 40, 40);
  const data::Tree split = data::split_long_nodes(trees[0], 96);
  const data::Partition plan = data::plan_partition(split, 96);
  ASSERT_GT(plan.num_pieces(), 1);
  gpu.zero_grad();
  expect_error([&] { model::forward_backward_partitioned(gpu, split, plan, 1.0); },
               "runs on the cpu backend only so far");
}

}  // namespace
}  // namespace tt::model_cuda_test
