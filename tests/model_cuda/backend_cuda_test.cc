// The "cuda" trainer backend (trainer/backend.h):
//  - AdamWTracksCpu: a few AdamW steps (clipping, weight decay) on the GPU and on the CPU
//    backend from the same seed: the loss curves agree step by step within kCurveRel.
//  - NoDeviceAllocationInSteadyState: once the largest batch has run, whole training steps
//    (several micro-batch sizes, a partitioned tree, norm, update) call no cudaMalloc.
//  - CheckpointRoundTrip: weights and AdamW moments through the host copies and an HF directory
//    come back bit for bit, and the next forward gives the same loss bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "data/partition.h"
#include "tests/model_cuda/test_util.h"
#include "trainer/backend.h"

namespace tt::model_cuda_test {
namespace {

// Loss curves: per step |l_gpu - l_cpu| / l_cpu < 1e-2. Step 1 differs by at most kLossRel
// (test_util.h); Adam's update is a ratio m / sqrt(v) of the same gradients (bf16 noise of about
// 1e-2 relative per tensor), so a few steps of lr 2e-3 move the weights apart by a small fraction
// of the step and the loss by far less than the 1e-2 bound, which is 2 kLossRel.
constexpr double kCurveRel = 1e-2;

const Shape kShape{"qwen3_hs64", "qwen3", 384, 192, 384, 2, 4, 2, 64, false, 0};

class BackendCudaTest : public GpuTest {};

trainer::OptimStep step_params(int64_t step, double grad_norm) {
  trainer::OptimStep p;
  p.lr = 2e-3;
  p.weight_decay = 0.1;
  p.step = step;
  p.grad_scale = std::min(1.0, 1.0 / (grad_norm + 1e-6));  // grad_clip 1.0, as the trainer folds it
  return p;
}

TEST_F(BackendCudaTest, AdamWTracksCpu) {
  const model::ModelConfig cfg = config_of(kShape);
  std::unique_ptr<trainer::Backend> gpu = trainer::make_backend("cuda", cfg);
  std::unique_ptr<trainer::Backend> cpu = trainer::make_backend("cpu", cfg);
  ASSERT_EQ(gpu->name(), "cuda");
  gpu->init(9);
  cpu->init(9);
  const std::vector<data::Tree> trees_a = random_trees(41, 3, kShape.V);
  const std::vector<data::Tree> trees_b = random_trees(42, 3, kShape.V);
  const data::PackedBatch a = pack_all(trees_a, data::Packing::kTree);
  const data::PackedBatch b = pack_all(trees_b, data::Packing::kTree);
  const double scale = 1.0 / (double)(a.n_paths + b.n_paths);
  std::vector<double> lg, lc;
  for (int64_t step = 1; step <= 8; ++step) {
    double loss[2] = {0, 0};
    int i = 0;
    for (trainer::Backend* be : {gpu.get(), cpu.get()}) {
      be->zero_grad();
      loss[i] = be->forward_backward(a, scale) + be->forward_backward(b, scale);
      const double norm = std::sqrt(be->grad_sum_squares());
      be->adamw_step(step_params(step, norm));
      ++i;
    }
    lg.push_back(loss[0]);
    lc.push_back(loss[1]);
    const double rel = std::abs(loss[0] - loss[1]) / loss[1];
    std::printf("[ curve    ] step %lld: gpu %.6f cpu %.6f rel %.2e\n", (long long)step, loss[0], loss[1], rel);
    EXPECT_LT(rel, kCurveRel) << "step " << step;
  }
  EXPECT_LT(lg.back(), lg.front() - 0.05) << "the GPU run learns";
  EXPECT_LT(lc.back(), lc.front() - 0.05) << "the CPU run learns";
}

TEST_F(BackendCudaTest, NoDeviceAllocationInSteadyState) {
  const model::ModelConfig cfg = config_of(kShape);
  std::unique_ptr<trainer::Backend> gpu = trainer::make_backend("cuda", cfg);
  gpu->init(2);
  const data::PackedBatch big = pack_all(random_trees(51, 6, kShape.V), data::Packing::kTree);
  const data::PackedBatch small = pack_all(random_trees(52, 2, kShape.V), data::Packing::kTree);
  const std::vector<data::Tree> one = random_trees(53, 1, kShape.V, 6, 3, 40, 40);
  const data::Tree split = data::split_long_nodes(one[0], 96);
  const data::Partition plan = data::plan_partition(split, 96);
  ASSERT_LT(small.n_tokens, big.n_tokens);
  auto round = [&](int64_t step) {
    gpu->zero_grad();
    gpu->forward_backward(small, 0.01);
    gpu->forward_backward(big, 0.01);
    gpu->forward_backward_partitioned(split, plan, 0.01);
    gpu->forward_backward(small, 0.01);
    gpu->adamw_step(step_params(step, std::sqrt(gpu->grad_sum_squares())));
  };
  round(1);
  round(2);
  const int64_t warm = gpu->device_malloc_count();
  for (int64_t step = 3; step <= 6; ++step) round(step);
  EXPECT_EQ(gpu->device_malloc_count(), warm) << "cudaMalloc calls after warm-up";
  std::printf("[ alloc    ] %lld cudaMalloc calls in warm-up, none after\n", (long long)warm);
}

TEST_F(BackendCudaTest, CheckpointRoundTrip) {
  const model::ModelConfig cfg = config_of(kShape);
  std::unique_ptr<trainer::Backend> gpu = trainer::make_backend("cuda", cfg);
  gpu->init(4);
  const data::PackedBatch batch = pack_all(random_trees(61, 3, kShape.V), data::Packing::kTree);
  gpu->zero_grad();
  gpu->forward_backward(batch, 0.1);
  gpu->adamw_step(step_params(1, std::sqrt(gpu->grad_sum_squares())));

  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "cuda_ckpt").string();
  gpu->save_hf(dir);
  std::vector<float> m, v;
  gpu->optim_state_host(&m, &v);

  std::unique_ptr<trainer::Backend> back = trainer::make_backend("cuda", cfg);
  back->load_hf(dir);
  back->set_optim_state(m, v);
  EXPECT_EQ(back->params_host(), gpu->params_host());
  std::vector<float> m2, v2;
  back->optim_state_host(&m2, &v2);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);

  gpu->zero_grad();
  back->zero_grad();
  EXPECT_EQ(back->forward_backward(batch, 0.1), gpu->forward_backward(batch, 0.1));
}

}  // namespace
}  // namespace tt::model_cuda_test
