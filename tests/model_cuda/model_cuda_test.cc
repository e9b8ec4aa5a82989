// The CUDA decoder against the fp64 CPU decoder (tolerance rule in test_util.h):
//  - GpuVsCpu: loss and every parameter's gradient on random tree batches (branch points,
//    several trees, one-token nodes, partial masks, weights), qwen3 and llama, head dims 64 and
//    128, GQA and MHA, tied and untied heads, the LM head in one chunk and in many.
//  - TreeVsPerPath: the same trees packed per path on the GPU give the tree's loss and gradients.
//  - Partitioned: a tree run piece by piece through gateways on the GPU gives the unpartitioned
//    loss and gradients.
//  - PartitionedDeepChain: the same on a chain of 25 pieces (a gateway of 24 prefixes), and the
//    error past cuda::kMaxExternalKV.
//  - MixedLayers: a decoder whose layers differ (q/k norm in some) against the CPU one.
//  - NoGradForward: infer()'s loss equals the training forward's, its logits the CPU's.
//  - InitMatchesCpu: CudaModel::init draws Model::init's weights.
//  - EmptyBatchAndErrors: an empty batch, a bad token, an unsupported head dim.
// GpuVsCpu also checks that gradients accumulate and that the forward is deterministic.
#include "model/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "data/partition.h"
#include "model/partitioned.h"
#include "tests/model_cuda/test_util.h"

namespace tt::model_cuda_test {
namespace {

class GpuVsCpu : public GpuTest, public ::testing::WithParamInterface<Shape> {};

model::DecoderOptions options_of(const Shape& s) {
  model::DecoderOptions o;
  if (s.head_chunk_rows > 0) o.head_chunk_bytes = (int64_t)s.head_chunk_rows * 2 * s.V;
  return o;
}


TEST_P(GpuVsCpu, LossAndGradients) {
  const Shape& s = GetParam();
  const model::ModelConfig cfg = config_of(s);
  const std::vector<float> master = init_master(cfg, 7);
  model::CudaModel gpu(cfg, options_of(s));
  gpu.set_params(master.data());

  const std::vector<data::Tree> trees = random_trees(11, 5, s.V);
  const data::PackedBatch batch = pack_all(trees, data::Packing::kTree);
  const double scale = 1.0 / (double)batch.n_paths;
  std::printf("[ batch    ] %s: %d tokens, %zu targets, %d nodes, %d trees\n", s.name.c_str(), batch.n_tokens,
              batch.tgt_src.size(), batch.num_nodes(), batch.num_trees());
  const Reference ref = cpu_reference(cfg, bf16_weights(master), batch, scale);

  gpu.zero_grad();
  const double loss = gpu.forward_backward(batch, scale);
  expect_loss_close(loss, ref.loss, s.name);
  expect_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, s.L, s.name);

  // Gradients accumulate: a second forward_backward doubles them.
  const double loss2 = gpu.forward_backward(batch, scale);
  EXPECT_EQ(loss2, loss) << "the forward is deterministic";
  std::vector<double> twice(ref.grads);
  for (double& g : twice) g *= 2;
  expect_grads_close(gpu.params_info(), gpu.grads_host(), twice, s.L, s.name + " x2");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuVsCpu,
    ::testing::Values(Shape{"qwen3_hs64_gqa2_untied", "qwen3", 384, 192, 384, 2, 4, 2, 64, false, 0},
                      Shape{"qwen3_hs128_gqa4_tied_chunked", "qwen3", 250, 256, 512, 2, 4, 1, 128, true, 37},
                      Shape{"llama_hs64_mha_tied_chunked", "llama", 512, 256, 384, 3, 4, 4, 64, true, 64},
                      Shape{"llama_hs128_gqa2_untied", "llama", 320, 128, 256, 2, 4, 2, 128, false, 0}),
    [](const ::testing::TestParamInfo<Shape>& i) { return i.param.name; });

class CudaModelTest : public GpuTest {};

const Shape kQwen{"qwen3_hs64", "qwen3", 384, 192, 384, 2, 4, 2, 64, false, 50};

TEST_F(CudaModelTest, TreeVsPerPath) {
  const model::ModelConfig cfg = config_of(kQwen);
  const std::vector<float> master = init_master(cfg, 3);
  const std::vector<data::Tree> trees = random_trees(21, 4, kQwen.V);
  const data::PackedBatch tree = pack_all(trees, data::Packing::kTree);
  const data::PackedBatch paths = pack_all(trees, data::Packing::kPerPath);
  ASSERT_GT(paths.n_tokens, tree.n_tokens);
  std::printf("[ batch    ] tree %d tokens, per-path %d tokens\n", tree.n_tokens, paths.n_tokens);
  const double scale = 1.0 / (double)tree.n_paths;
  const Reference ref = cpu_reference(cfg, bf16_weights(master), tree, scale);

  model::CudaModel gpu(cfg, options_of(kQwen));
  gpu.set_params(master.data());
  gpu.zero_grad();
  const double l_tree = gpu.forward_backward(tree, scale);
  const std::vector<float> g_tree = gpu.grads_host();
  gpu.zero_grad();
  const double l_paths = gpu.forward_backward(paths, scale);
  const std::vector<float> g_paths = gpu.grads_host();

  expect_loss_close(l_tree, ref.loss, "tree");
  expect_loss_close(l_paths, ref.loss, "per-path");
  expect_grads_close(gpu.params_info(), g_tree, ref.grads, kQwen.L, "tree");
  expect_grads_close(gpu.params_info(), g_paths, ref.grads, kQwen.L, "per-path");
  expect_no_worse_than(gpu.params_info(), g_tree, g_paths, ref.grads, "tree vs per-path");
}

// partition.recompute on the same model (the non-leaf pieces keep their K/V rows from a no-grad
// forward and run the training forward again before their backward): within the fp64 rule, no
// further from it than the run without recompute (the same-precision rule), the same loss (the
// forward is deterministic and reads the same K/V rows), and how many gradients differ from that
// run, beside how many differ between two runs without recompute (the attention backward's fp32
// atomics add in a varying order).
void expect_recompute_same(model::CudaModel& gpu, const data::Tree& split, const data::Partition& plan, double scale,
                           double loss, const std::vector<float>& grads, const Reference& ref, int layers,
                           const std::string& what) {
  cuda::DeviceAllocator& alloc = gpu.exec().allocator();
  gpu.zero_grad();
  alloc.reset_peak();
  model::PartitionRunStats st;
  const double again = model::forward_backward_partitioned(gpu, split, plan, scale, &st, /*recompute=*/true);
  const int64_t peak_recompute = alloc.stats().peak_bytes_in_use;
  EXPECT_GT(st.pieces_recomputed, 0) << what;  // counted as they ran
  const std::vector<float> g = gpu.grads_host();
  expect_loss_close(again, ref.loss, what + ", recompute");
  expect_grads_close(gpu.params_info(), g, ref.grads, layers, what + ", recompute");
  expect_no_worse_than(gpu.params_info(), g, grads, ref.grads, what + ", recompute vs not");
  // The same bits: the kept rows come from the same kernels as the training forward's (no kernel
  // depends on the forward's mode outside decode batches); were that to change, children would
  // also read rows other than those the backward recomputes.
  EXPECT_EQ(again, loss) << what;
  gpu.zero_grad();
  alloc.reset_peak();
  model::forward_backward_partitioned(gpu, split, plan, scale);
  const int64_t peak_keep = alloc.stats().peak_bytes_in_use;
  if (plan.peak_tokens >= 4 * plan.max_piece_tokens)  // a chain of several pieces: fewer bytes held
    EXPECT_LT(peak_recompute, peak_keep) << what << ": one piece's activations at a time, not the chain's";
  const std::vector<float> g2 = gpu.grads_host();
  size_t differ = 0, differ_base = 0;
  for (size_t i = 0; i < g.size(); ++i) differ += g[i] != grads[i], differ_base += g2[i] != grads[i];
  std::printf("[ recompute] %s: loss %.9g vs %.9g, %zu of %zu gradients differ (%zu between two runs without "
              "recompute); activations of at most %lld tokens resident (K/V rows of %lld), %lld tokens run twice; "
              "peak device memory %lld vs %lld bytes\n",
              what.c_str(), again, loss, differ, g.size(), differ_base, (long long)st.peak_live_tokens,
              (long long)st.peak_kept_tokens, (long long)st.tokens_recomputed, (long long)peak_recompute,
              (long long)peak_keep);
}

TEST_F(CudaModelTest, Partitioned) {
  const model::ModelConfig cfg = config_of(kQwen);
  const std::vector<float> master = init_master(cfg, 5);
  const std::vector<data::Tree> trees = random_trees(31, 1, kQwen.V, /*max_depth=*/6, /*max_children=*/3,
                                                     /*max_len=*/40, /*max_nodes=*/40);
  const data::Tree& tree = trees[0];
  const int64_t capacity = 96;
  const data::Tree split = data::split_long_nodes(tree, capacity);
  const data::Partition plan = data::plan_partition(split, capacity);
  ASSERT_GT(plan.num_pieces(), 2) << "tree of " << tree.n_tree() << " tokens";
  const data::PackedBatch batch = pack_all(trees, data::Packing::kTree);
  const double scale = 1.0 / (double)batch.n_paths;
  const Reference ref = cpu_reference(cfg, bf16_weights(master), batch, scale);
  std::printf("[ batch    ] %lld tokens in %d pieces\n", (long long)tree.n_tree(), plan.num_pieces());

  model::CudaModel gpu(cfg, options_of(kQwen));
  gpu.set_params(master.data());
  gpu.zero_grad();
  model::PartitionRunStats st;
  const double loss = model::forward_backward_partitioned(gpu, split, plan, scale, &st);
  EXPECT_EQ(st.tokens_processed, tree.n_tree());
  expect_loss_close(loss, ref.loss, "partitioned");
  expect_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, kQwen.L, "partitioned");
  expect_recompute_same(gpu, split, plan, scale, loss, gpu.grads_host(), ref, kQwen.L, "partitioned");
}

// One sequence of `len` tokens (every token but the first a target).
data::Tree chain_of(int len, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  data::Tree t;
  t.id = "chain";
  data::Node n;
  for (int i = 0; i < len; ++i) n.tokens.push_back((int32_t)(rng() % (uint64_t)V));
  n.target_weight.assign(len, 1.0);
  n.target_count.assign(len, 1);
  n.target_weight[0] = 0;
  n.target_count[0] = 0;
  t.nodes.push_back(n);
  data::Path p;
  p.target_weight = n.target_weight;
  t.paths.push_back(p);
  return t;
}

// A chain of pieces deeper than a few ancestors: the last piece's gateway is one prefix per
// ancestor piece, up to cuda::kMaxExternalKV of them (past it, an error naming the capacity).
TEST_F(CudaModelTest, PartitionedDeepChain) {
  const model::ModelConfig cfg = config_of(kQwen);
  const std::vector<float> master = init_master(cfg, 5);
  const int64_t capacity = 16;
  const data::Tree tree = chain_of(25 * capacity, kQwen.V, 3);
  const data::Tree split = data::split_long_nodes(tree, capacity);
  const data::Partition plan = data::plan_partition(split, capacity);
  size_t deepest = 0;
  for (const data::Piece& p : plan.pieces) deepest = std::max(deepest, p.gateway.size());
  ASSERT_EQ(deepest, 24u);
  ASSERT_LE(deepest, (size_t)cuda::kMaxExternalKV);
  const data::PackedBatch batch = pack_all({tree}, data::Packing::kTree);
  const double scale = 1.0 / (double)batch.n_paths;
  const Reference ref = cpu_reference(cfg, bf16_weights(master), batch, scale);
  model::CudaModel gpu(cfg, options_of(kQwen));
  gpu.set_params(master.data());
  gpu.zero_grad();
  const double loss = model::forward_backward_partitioned(gpu, split, plan, scale);
  expect_loss_close(loss, ref.loss, "deep chain");
  expect_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, kQwen.L, "deep chain");
  expect_recompute_same(gpu, split, plan, scale, loss, gpu.grads_host(), ref, kQwen.L, "deep chain");

  const data::Tree deeper = data::split_long_nodes(chain_of((cuda::kMaxExternalKV + 2) * capacity, kQwen.V, 4), capacity);
  const data::Partition too_deep = data::plan_partition(deeper, capacity);
  try {
    model::forward_backward_partitioned(gpu, deeper, too_deep, scale);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(": piece 33 has a gateway of 33 segments; the cuda attention reads at most "
                                         "32 external prefixes (use a larger partition.capacity_tokens)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CudaModelTest, MixedLayers) {
  Shape s = kQwen;
  s.L = 3;
  const model::ModelConfig cfg = config_of(s);
  model::DecoderOptions o = options_of(s);
  o.layers.assign(3, model::LayerSpec{});
  o.layers[0].qk_norm = true;
  o.layers[2].qk_norm = true;
  const std::vector<float> master = init_master(cfg, 9, o);
  model::CudaModel gpu(cfg, o);
  gpu.set_params(master.data());
  const std::vector<data::Tree> trees = random_trees(41, 4, s.V);
  const data::PackedBatch batch = pack_all(trees, data::Packing::kTree);
  const double scale = 1.0 / (double)batch.n_paths;
  const Reference ref = cpu_reference(cfg, bf16_weights(master), batch, scale, o);
  gpu.zero_grad();
  const double loss = gpu.forward_backward(batch, scale);
  expect_loss_close(loss, ref.loss, "mixed layers");
  expect_grads_close(gpu.params_info(), gpu.grads_host(), ref.grads, s.L, "mixed layers");
  EXPECT_LT(gpu.table().find("model.layers.1.self_attn.q_norm.weight"), 0);
}

TEST_F(CudaModelTest, NoGradForward) {
  const model::ModelConfig cfg = config_of(kQwen);
  const std::vector<float> master = init_master(cfg, 13);
  model::CudaModel gpu(cfg, options_of(kQwen));
  gpu.set_params(master.data());
  const data::PackedBatch batch = pack_all(random_trees(51, 3, kQwen.V), data::Packing::kTree);
  gpu.zero_grad();
  model::Activations<model::CudaExec> acts;
  gpu.forward(batch, 1.0, acts);
  const double l_train = gpu.loss(acts);
  gpu.backward(acts);
  const std::vector<float> g = gpu.grads_host();

  model::InferRequest all = model::InferRequest::all_logits();
  all.loss = true;
  const model::InferResult r = gpu.infer(batch, all);
  // The same kernels on the same bf16 values; the fused loss-and-gradient kernel and the loss-only
  // one share the forward pass.
  EXPECT_NEAR(r.loss, l_train, kLossRel * std::abs(l_train));
  std::printf("[ nograd   ] loss %.10f vs training %.10f (%s)\n", r.loss, l_train,
              r.loss == l_train ? "bitwise" : "not bitwise");
  EXPECT_EQ(gpu.grads_host(), g) << "infer() changed a gradient";

  model::Model<double> cpu(cfg);
  const std::vector<double> w = bf16_weights(master);
  std::copy(w.begin(), w.end(), cpu.params());
  const model::InferResult c = cpu.infer(batch, all);
  ASSERT_EQ(r.logits.size(), c.logits.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < c.logits.size(); ++i) {
    num += (r.logits[i] - c.logits[i]) * (r.logits[i] - c.logits[i]);
    den += c.logits[i] * c.logits[i];
  }
  const double e = std::sqrt(num / den);
  EXPECT_LT(e, logit_bound(kQwen.L)) << "logits' relative L2 error";
  std::printf("[ errors   ] no-grad logits rel L2 %.3e (bound %.3e)\n", e, logit_bound(kQwen.L));
  expect_loss_close(r.loss, c.loss, "no-grad loss");
}

TEST_F(CudaModelTest, InitMatchesCpu) {
  for (bool tied : {false, true}) {
    Shape s = kQwen;
    s.tied = tied;
    const model::ModelConfig cfg = config_of(s);
    const std::vector<float> cpu = init_master(cfg, 1234);
    model::CudaModel gpu(cfg);
    gpu.init(1234);
    const std::vector<float> got = gpu.params_host();
    ASSERT_EQ(got.size(), cpu.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] == cpu[i]) continue;
      ++differ;
      // At most one fp32 ulp apart (fp64 log/cos/sin may differ in their last bit).
      EXPECT_LE(std::abs((double)got[i] - cpu[i]), std::ldexp(std::abs((double)cpu[i]), -23)) << "element " << i;
    }
    EXPECT_LE(differ, (int64_t)(got.size() * 1e-5) + 1) << differ << " of " << got.size() << " differ";
    std::printf("[ init     ] tied=%d: %lld of %zu weights differ from Model::init (by one ulp)\n", tied,
                (long long)differ, got.size());
  }
}

TEST_F(CudaModelTest, EmptyBatchAndErrors) {
  const model::ModelConfig cfg = config_of(kQwen);
  model::CudaModel gpu(cfg);
  gpu.init(1);
  data::PackedBatch empty;
  EXPECT_EQ(gpu.forward_backward(empty, 1.0), 0.0);
  data::PackedBatch bad = pack_all(random_trees(3, 1, kQwen.V), data::Packing::kTree);
  bad.tokens[0] = kQwen.V;
  try {
    gpu.forward_backward(bad, 1.0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside vocab_size"), std::string::npos) << e.what();
  }
  model::ModelConfig hs32 = cfg;
  hs32.head_dim = 32;
  try {
    model::CudaModel m(hs32);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 32"), std::string::npos) << e.what();
  }
}

// The repeated backward of truncated BPTT (Decoder::backward with `again`): on the GPU the
// forward takes the head's gradient, so a forward's activations get exactly one backward with the
// loss, first; further ones need `again` on the one before. Repeats without the loss and without
// relayed gradients add exact zeros (dx starts at zero), so the gradient stays bitwise that of
// the loss; the wrong orders are errors naming the rule.
TEST_F(CudaModelTest, RepeatedBackwardOrder) {
  const model::ModelConfig cfg = config_of(kQwen);
  model::CudaModel gpu(cfg);
  gpu.init(2);
  const data::PackedBatch b = pack_all(random_trees(5, 2, kQwen.V), data::Packing::kTree);
  model::Activations<model::CudaExec> acts;
  auto error_of = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  gpu.zero_grad();
  gpu.forward(b, 1.0, acts);
  EXPECT_NE(error_of([&] { gpu.backward(acts, nullptr, nullptr, /*with_loss=*/false); })
                .find("exactly one backward with the loss, before any without it"),
            std::string::npos);
  gpu.backward(acts, nullptr, nullptr, /*with_loss=*/true, /*again=*/true);
  const std::vector<float> once = gpu.grads_host();
  EXPECT_NE(error_of([&] { gpu.backward(acts, nullptr, nullptr, /*with_loss=*/true, /*again=*/true); })
                .find("exactly one backward with the loss"),
            std::string::npos);
  gpu.backward(acts, nullptr, nullptr, /*with_loss=*/false, /*again=*/true);
  gpu.backward(acts, nullptr, nullptr, /*with_loss=*/false, /*again=*/false);
  EXPECT_NE(error_of([&] { gpu.backward(acts, nullptr, nullptr, /*with_loss=*/false); })
                .find("after a backward that did not keep them"),
            std::string::npos);
  EXPECT_EQ(gpu.grads_host(), once) << "repeats without the loss and without relayed gradients add nothing";
}

}  // namespace
}  // namespace tt::model_cuda_test
