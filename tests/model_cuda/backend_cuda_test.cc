// The "cuda" trainer backend (trainer/backend.h):
//  - AdamWTracksCpu: a few AdamW steps (clipping, weight decay) on the GPU and on the CPU
//    backend from the same seed: the loss curves agree step by step within kCurveRel.
//  - NoDeviceAllocationInSteadyState: once the largest batch has run, whole training steps
//    (several micro-batch sizes, a partitioned tree, norm, update) call no cudaMalloc.
//  - CheckpointRoundTrip: weights and AdamW moments through the host copies and an HF directory
//    come back bit for bit, and the next forward gives the same loss bit for bit.
//  - NotifyReportsEachGradientOnceWhenFinal: forward_backward_notify (the data-parallel overlap
//    hook) reports every parameter once, the final norm first, layers last to first, the
//    embedding last; a gradient copied at its report (ordered on the compute stream) equals the
//    one at the end of the call bit for bit, so nothing writes it after the report; the loss is
//    forward_backward's, bit for bit.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

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
    gpu->forward_backward_partitioned(split, plan, 0.01, /*recompute=*/false, {});
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
  // A piece at an offset (how checkpoints move the state: a tensor at a time) reads and writes
  // just those elements.
  const int64_t off = gpu->num_params() / 3, n = 1000;
  std::vector<float> piece(n), m_new(m.begin() + off, m.begin() + off + n), v_new(n, 0.25f);
  back->optim_slice_host(true, off, n, piece.data());
  EXPECT_EQ(piece, std::vector<float>(v.begin() + off, v.begin() + off + n));
  for (float& x : m_new) x = 1.0f - 2.0f * x;  // differs from x everywhere (m may hold zeros)
  back->set_optim_slice(off, m_new.data(), v_new.data(), n);
  std::copy(m_new.begin(), m_new.end(), m.begin() + off);
  std::copy(v_new.begin(), v_new.end(), v.begin() + off);
  back->optim_state_host(&m2, &v2);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);

  gpu->zero_grad();
  back->zero_grad();
  EXPECT_EQ(back->forward_backward(batch, 0.1), gpu->forward_backward(batch, 0.1));
}

TEST_F(BackendCudaTest, NotifyReportsEachGradientOnceWhenFinal) {
  const model::ModelConfig cfg = config_of(kShape);
  std::unique_ptr<trainer::Backend> gpu = trainer::make_backend("cuda", cfg);
  gpu->init(5);
  ASSERT_TRUE(gpu->grads_on_device());
  ASSERT_NE(gpu->grads_data(), nullptr);
  const auto stream = static_cast<cudaStream_t>(gpu->compute_stream());
  ASSERT_NE(stream, nullptr);
  const std::vector<model::ParamInfo>& info = gpu->params_info();
  const int n = (int)info.size();
  const int per_layer = cfg.qk_norm() ? 11 : 9;
  const data::PackedBatch batch = pack_all(random_trees(71, 3, kShape.V), data::Packing::kTree);

  gpu->zero_grad();
  const double want_loss = gpu->forward_backward(batch, 0.1);

  gpu->zero_grad();
  std::vector<std::pair<int, int>> calls;
  std::vector<float> at_report(gpu->num_params());
  const double loss = gpu->forward_backward_notify(batch, 0.1, [&](int begin, int end) {
    calls.emplace_back(begin, end);
    if (begin >= end) return;
    const int64_t o = info[begin].offset, len = info[end - 1].offset + info[end - 1].numel - o;
    ASSERT_EQ(cudaMemcpyAsync(at_report.data() + o, gpu->grads_data() + o, sizeof(float) * len,
                              cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // a test may wait; the trainer never does
  });
  EXPECT_EQ(loss, want_loss);

  const int k_norm = 1 + (int)cfg.num_hidden_layers * per_layer;
  std::vector<std::pair<int, int>> want = {{k_norm, n}};
  for (int l = (int)cfg.num_hidden_layers - 1; l >= 0; --l) want.emplace_back(1 + l * per_layer, 1 + (l + 1) * per_layer);
  want.emplace_back(0, 1);
  EXPECT_EQ(calls, want);
  std::vector<int> times(n, 0);
  for (const auto& c : calls)
    for (int p = c.first; p < c.second; ++p) ++times[p];
  EXPECT_EQ(times, std::vector<int>(n, 1));
  EXPECT_EQ(at_report, gpu->grads_host()) << "a gradient was written after it was reported";
}

}  // namespace
}  // namespace tt::model_cuda_test
