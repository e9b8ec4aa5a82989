// Generation on the GPU (model/generate.h on CudaModel) against the fp64 CPU decoder on the same
// (bf16) weights:
//  - DecodeLogits: a prompt prefilled into the KV cache, then two samples decoding different
//    continuations (the decode mode of the attention: one-token rows reading the shared prompt and
//    their own rows): every decode row's logits are the CPU full forward's within the logit rule
//    (test_util.h: logit_bound).
//  - GreedyAgreesWithTheCpu: greedy generation on both backends gives the same tokens wherever
//    the CPU's top-2 logit gap exceeds the GPU's logit error; the first disagreement must sit at a
//    near tie (gap below that error), after which the sequences differ by design.
//  - InferenceModelHoldsWeightsOnly: an inference-only CudaModel holds the bf16 weights and
//    nothing else (no fp32 master weights, no gradients).
//  - HybridDecodeLogits / HybridGreedyAgreesWithTheCpu: the same for a hybrid (Gated DeltaNet
//    layers, model/gdn.h), whose recurrent state and conv window live in the cache's state slots:
//    a prompt stores its slot, each sample's first step reads it and stores its own.
//  - OverlappedStepsDrawWhatOneStepAtATimeDraws: decode steps enqueued ahead of the draws they
//    take (SamplingOptions::overlap) draw what one step at a time draws; with stop ids, every
//    logprob taken is the CPU's within the logit rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "model/decoder.h"
#include "model/generate.h"
#include "tests/model_cuda/test_util.h"

namespace tt::model_cuda_test {
namespace {

const Shape kShape{"qwen3_hs128", "qwen3", 300, 256, 512, 2, 4, 2, 128, false, 0};

class GenerateCuda : public GpuTest {};

model::DecoderOptions inference() {
  model::DecoderOptions o;
  o.inference = true;
  return o;
}

// The master weights of a seeded CPU init, rounded to bf16 (what the GPU computes with).
std::vector<float> weights(const model::ModelConfig& cfg, uint64_t seed) {
  model::Model<float> m(cfg);
  m.init(seed);
  std::vector<float> w(m.params(), m.params() + m.num_params());
  for (float& x : w) x = cuda::round_to_bf16(x);
  return w;
}

// n prompts "p0", "p1", ... of len0 + step p random tokens below V.
std::vector<model::Prompt> random_prompts(std::mt19937_64& rng, int V, int n, int len0, int step) {
  std::uniform_int_distribution<int> tok(0, V - 1);
  std::vector<model::Prompt> prompts;
  for (int p = 0; p < n; ++p) {
    model::Prompt pr;
    pr.id = "p" + std::to_string(p);
    pr.tokens.resize(len0 + step * p);
    for (int32_t& t : pr.tokens) t = tok(rng);
    prompts.push_back(pr);
  }
  return prompts;
}

// The gap between a row's two largest logits (a greedy draw the GPU may take otherwise when the
// gap is within its logit error).
double top2_gap(const double* row, int V) {
  double top = -INFINITY, second = -INFINITY;
  for (int v = 0; v < V; ++v) {
    if (row[v] > top) second = top, top = row[v];
    else if (row[v] > second) second = row[v];
  }
  return top - second;
}

// The GPU's error on a row of V logits: within `bound` of the row's RMS (relative L2), taken 6 x.
double logit_error(const double* row, int V, double bound) {
  double ss = 0;
  for (int v = 0; v < V; ++v) ss += row[v] * row[v];
  return 6 * bound * std::sqrt(ss / V);
}

std::vector<double> cpu_logits(model::Model<double>& m, const std::vector<int32_t>& tokens) {
  data::PackedBatch b;
  b.n_tokens = (int)tokens.size();
  b.tokens = tokens;
  for (int i = 0; i < b.n_tokens; ++i) {
    b.pos.push_back(i);
    b.subtree_end.push_back(b.n_tokens);
  }
  b.node_start = {0};
  b.node_len = {b.n_tokens};
  b.node_parent = {-1};
  b.tree_start = {0, b.n_tokens};
  return m.infer(b, model::InferRequest::all_logits()).logits;
}

TEST_F(GenerateCuda, DecodeLogits) {
  const model::ModelConfig cfg = config_of(kShape);
  const std::vector<float> w = weights(cfg, 3);
  model::CudaModel gpu(cfg, inference());
  gpu.set_params(w.data());
  model::Model<double> cpu(cfg);
  std::copy(w.begin(), w.end(), cpu.params());
  const int V = kShape.V, L = kShape.L;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> tok(0, V - 1);
  std::vector<int32_t> prompt(300);
  for (int32_t& t : prompt) t = tok(rng);
  std::vector<std::vector<int32_t>> cont(2, std::vector<int32_t>(20));
  for (auto& c : cont)
    for (int32_t& t : c) t = tok(rng);
  const int P = (int)prompt.size(), T = 20;
  model::KVCache<model::CudaExec> cache(gpu, P + 2 * T);
  const int64_t span = cache.reserve(P);
  std::vector<int32_t> rows(P);
  for (int i = 0; i < P; ++i) rows[i] = (int32_t)(span + i);
  const model::CacheWrite<model::CudaExec> w0 = cache.write(rows);
  data::PackedBatch pre;
  pre.n_tokens = P;
  pre.tokens = prompt;
  for (int i = 0; i < P; ++i) {
    pre.pos.push_back(i);
    pre.subtree_end.push_back(P);
  }
  pre.node_start = {0};
  pre.node_len = {P};
  pre.node_parent = {-1};
  pre.tree_start = {0, P};
  gpu.infer(pre, model::InferRequest{false, model::InferRequest::Rows::kNone, {}}, nullptr, &w0);
  const int64_t gen[2] = {cache.reserve(T), cache.reserve(T)};
  double worst = 0;
  for (int j = 0; j < T; ++j) {
    model::Carry<model::CudaExec> carry(L);
    cache.read(carry, span, P, 0, 2);
    for (int s = 0; s < 2; ++s) cache.read(carry, gen[s], j, s, s + 1);
    const model::CacheWrite<model::CudaExec> wj = cache.write({(int32_t)(gen[0] + j), (int32_t)(gen[1] + j)});
    data::PackedBatch step;
    step.n_tokens = 2;
    step.tokens = {cont[0][j], cont[1][j]};
    step.pos = {P + j, P + j};
    step.subtree_end = {1, 2};
    step.node_start = {0, 1};
    step.node_len = {1, 1};
    step.node_parent = {-1, -1};
    step.tree_start = {0, 1, 2};
    const model::InferResult r = gpu.infer(step, model::InferRequest::all_logits(), &carry, &wj);
    for (int s = 0; s < 2; ++s) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), cont[s].begin(), cont[s].begin() + j + 1);
      const std::vector<double> ref = cpu_logits(cpu, seq);
      const double e = rel_l2(r.logits.data() + (size_t)s * V, ref.data() + (size_t)(P + j) * V, V);
      EXPECT_LT(e, logit_bound(L)) << "sample " << s << " step " << j;
      worst = std::max(worst, e);
    }
  }
  std::printf("[ errors   ] decode logits vs fp64 full forward: worst rel L2 %.3e (bound %.3e)\n", worst,
              logit_bound(L));
}

TEST_F(GenerateCuda, GreedyAgreesWithTheCpu) {
  const model::ModelConfig cfg = config_of(kShape);
  const std::vector<float> w = weights(cfg, 11);
  model::CudaModel gpu(cfg, inference());
  gpu.set_params(w.data());
  model::Model<double> cpu(cfg);
  std::copy(w.begin(), w.end(), cpu.params());
  std::mt19937_64 rng(7);
  const std::vector<model::Prompt> prompts = random_prompts(rng, kShape.V, 4, 20, 37);
  model::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 24;
  const std::vector<model::Completion> g = model::generate(gpu, prompts, o);
  const std::vector<model::Completion> c = model::generate(cpu, prompts, o);
  const int V = kShape.V;
  int agreed = 0, ties = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& gt = g[p].samples[0].tokens;
    const std::vector<int32_t>& ct = c[p].samples[0].tokens;
    ASSERT_EQ(gt.size(), ct.size());
    std::vector<int32_t> seq = prompts[p].tokens;
    seq.insert(seq.end(), ct.begin(), ct.end());
    const std::vector<double> ref = cpu_logits(cpu, seq);
    for (size_t j = 0; j < ct.size(); ++j) {
      const double* row = ref.data() + (prompts[p].tokens.size() + j - 1) * V;
      const double err = logit_error(row, V, logit_bound(kShape.L));
      if (gt[j] == ct[j]) {
        ++agreed;
        continue;
      }
      const double gap = top2_gap(row, V);
      EXPECT_LT(gap, err) << "prompt " << p << " token " << j << ": the GPU chose " << gt[j] << ", the CPU " << ct[j]
                          << " with a top-2 gap " << gap << " above the logit error " << err;
      ++ties;
      break;  // past a near tie the two continuations differ by design
    }
  }
  std::printf("[ greedy   ] %d tokens agreed, %d near-tie divergences\n", agreed, ties);
  EXPECT_GT(agreed, 40);
}

TEST_F(GenerateCuda, InferenceModelHoldsWeightsOnly) {
  const model::ModelConfig cfg = config_of(kShape);
  model::CudaModel gpu(cfg, inference());
  const int64_t P = gpu.num_params();
  const int64_t used = gpu.exec().allocator().stats().bytes_in_use;
  model::CudaModel train(cfg);
  const int64_t used_train = train.exec().allocator().stats().bytes_in_use;
  EXPECT_GE(used, 2 * P);
  EXPECT_GE(used_train - used, 8 * P) << "no fp32 master weights and no fp32 gradients";
  EXPECT_EQ(gpu.params(), nullptr);
  EXPECT_EQ(gpu.grads(), nullptr);
  EXPECT_THROW(gpu.zero_grad(), Error);
  const std::vector<float> w = weights(cfg, 1);
  gpu.set_params(w.data());
  EXPECT_EQ(gpu.params_host(), w) << "the weights are the bf16 values given";
}

const HybridShape kHybrid{{"qwen3_5_hs64", "qwen3_5_text", 300, 192, 384, 3, 4, 2, 64, false, 0}, 2, 4, 64, 64};

// Decode steps of two samples after a 150-token prompt against the fp64 full forward.
void hybrid_decode_logits(const HybridShape& shape) {
  const model::ModelConfig cfg = hybrid_config_of(shape);
  const std::vector<float> w = weights(cfg, 3);
  model::CudaModel gpu(cfg, inference());
  gpu.set_params(w.data());
  model::Model<double> cpu(cfg);
  std::copy(w.begin(), w.end(), cpu.params());
  const int V = shape.base.V, L = cfg.num_hidden_layers;
  const double bound = hybrid_logit_bound(2, 1);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> tok(0, V - 1);
  std::vector<int32_t> prompt(150);  // three chunks of the delta rule, the last partial
  for (int32_t& t : prompt) t = tok(rng);
  const int P = (int)prompt.size(), T = 12;
  std::vector<std::vector<int32_t>> cont(2, std::vector<int32_t>(T));
  for (auto& c : cont)
    for (int32_t& t : c) t = tok(rng);
  model::KVCache<model::CudaExec> cache(gpu, P + 2 * T, /*state_slots=*/3);
  ASSERT_TRUE(cache.recurrent());
  const int32_t prompt_slot = (int32_t)cache.reserve_slots(1);
  const int32_t slot[2] = {(int32_t)cache.reserve_slots(1), (int32_t)cache.reserve_slots(1)};
  const int64_t span = cache.reserve(P);
  std::vector<int32_t> rows(P);
  for (int i = 0; i < P; ++i) rows[i] = (int32_t)(span + i);
  data::PackedBatch pre;
  pre.n_tokens = P;
  pre.tokens = prompt;
  for (int i = 0; i < P; ++i) {
    pre.pos.push_back(i);
    pre.subtree_end.push_back(P);
  }
  pre.node_start = {0};
  pre.node_len = {P};
  pre.node_parent = {-1};
  pre.tree_start = {0, P};
  const model::CacheWrite<model::CudaExec> w0 = cache.write(rows, {prompt_slot});
  gpu.infer(pre, model::InferRequest{false, model::InferRequest::Rows::kNone, {}}, nullptr, &w0);
  const int64_t gen[2] = {cache.reserve(T), cache.reserve(T)};
  double worst = 0;
  for (int j = 0; j < T; ++j) {
    model::Carry<model::CudaExec> carry(L);
    cache.read(carry, span, P, 0, 2);
    for (int s = 0; s < 2; ++s) cache.read(carry, gen[s], j, s, s + 1);
    cache.read_state(carry, j == 0 ? std::vector<int32_t>{prompt_slot, prompt_slot}
                                   : std::vector<int32_t>{slot[0], slot[1]});
    const model::CacheWrite<model::CudaExec> wj =
        cache.write({(int32_t)(gen[0] + j), (int32_t)(gen[1] + j)}, {slot[0], slot[1]});
    data::PackedBatch step;
    step.n_tokens = 2;
    step.tokens = {cont[0][j], cont[1][j]};
    step.pos = {P + j, P + j};
    step.subtree_end = {1, 2};
    step.node_start = {0, 1};
    step.node_len = {1, 1};
    step.node_parent = {-1, -1};
    step.tree_start = {0, 1, 2};
    const model::InferResult r = gpu.infer(step, model::InferRequest::all_logits(), &carry, &wj);
    for (int s = 0; s < 2; ++s) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), cont[s].begin(), cont[s].begin() + j + 1);
      const std::vector<double> ref = cpu_logits(cpu, seq);
      const double e = rel_l2(r.logits.data() + (size_t)s * V, ref.data() + (size_t)(P + j) * V, V);
      EXPECT_LT(e, bound) << "sample " << s << " step " << j;
      worst = std::max(worst, e);
    }
  }
  std::printf("[ errors   ] %s decode logits vs fp64 full forward: worst rel L2 %.3e (bound %.3e)\n",
              shape.base.name.c_str(), worst, bound);
}

TEST_F(GenerateCuda, HybridDecodeLogits) { hybrid_decode_logits(kHybrid); }

// Head dim 256 and linear heads of 128 (Qwen3.5's and Qwen3-Next's shapes, scaled down): the
// attention's 256 kernels in prefill and decode.
TEST_F(GenerateCuda, HybridDecodeLogitsHeadDim256) {
  hybrid_decode_logits(
      HybridShape{{"qwen3_5_hs256", "qwen3_5_text", 300, 256, 512, 3, 4, 2, 256, false, 0}, 2, 4, 128, 128});
}

TEST_F(GenerateCuda, HybridGreedyAgreesWithTheCpu) {
  const model::ModelConfig cfg = hybrid_config_of(kHybrid);
  const std::vector<float> w = weights(cfg, 11);
  model::CudaModel gpu(cfg, inference());
  gpu.set_params(w.data());
  model::Model<double> cpu(cfg);
  std::copy(w.begin(), w.end(), cpu.params());
  std::mt19937_64 rng(7);
  const std::vector<model::Prompt> prompts = random_prompts(rng, kHybrid.base.V, 3, 20, 45);
  model::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 16;
  o.num_samples = 2;
  const std::vector<model::Completion> g = model::generate(gpu, prompts, o);
  const std::vector<model::Completion> c = model::generate(cpu, prompts, o);
  const int V = kHybrid.base.V;
  const double bound = hybrid_logit_bound(2, 1);
  int agreed = 0, ties = 0;
  for (size_t p = 0; p < prompts.size(); ++p)
    for (size_t k = 0; k < c[p].samples.size(); ++k) {
      const std::vector<int32_t>& gt = g[p].samples[k].tokens;
      const std::vector<int32_t>& ct = c[p].samples[k].tokens;
      ASSERT_EQ(gt.size(), ct.size());
      std::vector<int32_t> seq = prompts[p].tokens;
      seq.insert(seq.end(), ct.begin(), ct.end());
      const std::vector<double> ref = cpu_logits(cpu, seq);
      for (size_t j = 0; j < ct.size(); ++j) {
        const double* row = ref.data() + (prompts[p].tokens.size() + j - 1) * V;
        const double err = logit_error(row, V, bound);
        if (gt[j] == ct[j]) {
          ++agreed;
          continue;
        }
        const double gap = top2_gap(row, V);
        EXPECT_LT(gap, err) << "prompt " << p << " sample " << k << " token " << j << ": the GPU chose " << gt[j]
                            << ", the CPU " << ct[j] << " with a top-2 gap " << gap;
        ++ties;
        break;
      }
    }
  std::printf("[ greedy   ] hybrid: %d tokens agreed, %d near-tie divergences\n", agreed, ties);
  EXPECT_GT(agreed, 40);
}


// Each decode step enqueued before the draws of the step before come back (SamplingOptions::
// overlap, the tokens fed on the GPU): without stop ids every step has the same rows either way,
// so the samples are the one-step-at-a-time samples bit for bit, for the dense model and the
// hybrid (its state slots). With stop ids, rows that stopped while the next step was in flight are
// computed and dropped; every logprob taken is still the CPU fp64 full forward's within twice
// the logit error (the token's logit and the log-sum-exp each within it).
TEST_F(GenerateCuda, OverlappedStepsDrawWhatOneStepAtATimeDraws) {
  for (const bool hybrid : {false, true}) {
    const model::ModelConfig cfg = hybrid ? hybrid_config_of(kHybrid) : config_of(kShape);
    const int V = (int)cfg.vocab_size;
    const std::vector<float> w = weights(cfg, 11);
    model::CudaModel gpu(cfg, inference());
    gpu.set_params(w.data());
    std::mt19937_64 rng(9);
    const std::vector<model::Prompt> prompts = random_prompts(rng, V, 3, 30, 20);
    model::SamplingOptions o;
    o.temperature = 1;
    o.num_samples = 4;
    o.max_new_tokens = 20;
    o.seed = 3;
    model::GenerateStats on, off;
    const std::vector<model::Completion> a = model::generate(gpu, prompts, o, &on);
    o.overlap = false;
    const std::vector<model::Completion> b = model::generate(gpu, prompts, o, &off);
    EXPECT_EQ(on.overlapped_steps, on.decode_steps - 1) << "every step but the first is enqueued ahead";
    EXPECT_EQ(off.overlapped_steps, 0);
    for (size_t p = 0; p < prompts.size(); ++p)
      for (int k = 0; k < o.num_samples; ++k) {
        EXPECT_EQ(a[p].samples[k].tokens, b[p].samples[k].tokens) << "hybrid " << hybrid << " prompt " << p;
        EXPECT_EQ(a[p].samples[k].logprobs, b[p].samples[k].logprobs) << "hybrid " << hybrid << " prompt " << p;
      }

    o.overlap = true;
    for (int t = 0; t < V / 10; ++t) o.stop.push_back(t);  // about one token in ten stops a sample
    model::GenerateStats st;
    const std::vector<model::Completion> c = model::generate(gpu, prompts, o, &st);
    EXPECT_GT(st.dropped_rows, 0) << "hybrid " << hybrid << ": some sample stopped with the next step in flight";
    model::Model<double> cpu(cfg);
    std::copy(w.begin(), w.end(), cpu.params());
    const double bound = hybrid ? hybrid_logit_bound(2, 1) : logit_bound(kShape.L);
    int checked = 0;
    for (size_t p = 0; p < prompts.size(); ++p)
      for (int k = 0; k < o.num_samples; ++k) {
        const model::Sample& x = c[p].samples[k];
        std::vector<int32_t> seq = prompts[p].tokens;
        seq.insert(seq.end(), x.tokens.begin(), x.tokens.end());
        const std::vector<double> ref = cpu_logits(cpu, seq);
        for (size_t j = 0; j < x.tokens.size(); ++j) {
          const double* row = ref.data() + (prompts[p].tokens.size() + j - 1) * V;
          double mx = row[0], z = 0;
          for (int v = 0; v < V; ++v) mx = std::max(mx, row[v]);
          for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
          const double err = logit_error(row, V, bound);
          EXPECT_NEAR(x.logprobs[j], row[x.tokens[j]] - mx - std::log(z), 2 * err)
              << "hybrid " << hybrid << " prompt " << p << " sample " << k << " token " << j;
          ++checked;
        }
      }
    std::printf("[ overlap  ] hybrid %d: %lld of %lld steps ahead, %lld rows dropped, %d logprobs checked\n", hybrid,
                (long long)st.overlapped_steps, (long long)st.decode_steps, (long long)st.dropped_rows, checked);
  }
}

}  // namespace
}  // namespace tt::model_cuda_test
