// Segment-level inference and training on the GPU (model/segments.h on CudaModel) against the
// fp64 CPU, and the retrieval op (ops/cuda/retrieval.h) against its CPU reference:
//  - SegmentedTrainingMatchesTheCpu: truncated BPTT with K = 0, 1, 2 on a branching tree whose
//    paths cross five segments (rule at the test);
//  - SegmentedGenerationMatchesTheCpu: a 300-token prompt prefilled in segments of 64 (carried
//    tail of 16 for the local KV head, the whole pool retrieved for the long-range one, so the
//    selection has no near tie), then greedy decoding across a segment boundary: every prompt
//    row's logits and every decode step's (until the first near-tie divergence of the tokens) are
//    the CPU's within the logit rule below.
//  - RetrievalSelectMatchesTheCpu: scores with exact ties (distinct keys repeated through the
//    pool, scores between distinct keys well apart): the GPU keeps the same rows as the fp64
//    reference, the lower row on every tie; the gather on the CPU's indices is bitwise the CPU's.
//
// Logit rule: test_util.h's logit_bound counts 13 bf16 roundings per layer on the path of a
// logit; a segment's prefixes add at most 2 (a tail key re-rotated once; a retrieved key rotated
// back into the pool and forward to its prefix position), hence 15 per layer here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>

#include "model/decoder.h"
#include "model/segments.h"
#include "ops/cpu/retrieval.h"
#include "ops/cuda/check.h"
#include "ops/cuda/memory.h"
#include "ops/cuda/retrieval.h"
#include "tests/model_cuda/test_util.h"

namespace tt::model_cuda_test {
namespace {

const Shape kShape{"qwen3_hs128", "qwen3", 300, 256, 512, 2, 4, 2, 128, false, 0};

double segment_logit_bound(int layers) { return 3.0 * std::sqrt((15.0 * layers + 2) / 3.0) * kBf16U; }

class SegmentsCuda : public GpuTest {};

TEST_F(SegmentsCuda, SegmentedGenerationMatchesTheCpu) {
  const model::ModelConfig cfg = config_of(kShape);
  const std::vector<double> wd = bf16_weights(init_master(cfg, 21));
  const std::vector<float> w(wd.begin(), wd.end());
  model::DecoderOptions o;
  o.inference = true;
  model::CudaModel gpu(cfg, o);
  gpu.set_params(w.data());
  model::Model<double> cpu(cfg);
  std::copy(w.begin(), w.end(), cpu.params());

  model::SegmentConfig seg;
  seg.length = 64;
  seg.tail = 16;
  seg.tbptt = 1;
  seg.long_range.layers = {1};
  seg.long_range.heads = {1};
  seg.long_range.retrieve = 1024;  // past the history: every pool row, in order
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int> tok(0, kShape.V - 1);
  model::Prompt p;
  p.id = "p";
  p.tokens.resize(300);
  for (int32_t& t : p.tokens) t = tok(rng);
  model::SamplingOptions so;
  so.temperature = 0;
  so.max_new_tokens = 30;  // the boundary at depth 320 falls inside
  std::vector<std::vector<double>> lg, lc;
  const std::vector<model::Completion> g = model::generate_segmented(gpu, seg, {p}, so, nullptr, &lg);
  const std::vector<model::Completion> c = model::generate_segmented(cpu, seg, {p}, so, nullptr, &lc);
  const double bound = segment_logit_bound(kShape.L);
  double worst = 0;
  for (size_t j = 0; j < p.tokens.size(); ++j) {
    const double e = rel_l2(lg[j].data(), lc[j].data(), kShape.V);
    EXPECT_LT(e, bound) << "prompt row " << j << " (segment " << j / 64 << ")";
    worst = std::max(worst, e);
  }
  const std::vector<int32_t>& gt = g[0].samples[0].tokens;
  const std::vector<int32_t>& ct = c[0].samples[0].tokens;
  int steps = 0;
  for (size_t t = 0; t < ct.size(); ++t) {
    if (gt[t] != ct[t]) {  // a near tie: the CPU's top-2 gap below the GPU's logit error
      const std::vector<double>& row = lc[p.tokens.size() - 1 + t];
      double top = -INFINITY, second = -INFINITY, ss = 0;
      for (double x : row) {
        ss += x * x;
        if (x > top) second = top, top = x;
        else if (x > second) second = x;
      }
      EXPECT_LT(top - second, 6 * bound * std::sqrt(ss / row.size())) << "token " << t;
      break;
    }
    if (t + 1 < ct.size()) {  // decode step t read token t
      const double e = rel_l2(lg[p.tokens.size() + t].data(), lc[p.tokens.size() + t].data(), kShape.V);
      EXPECT_LT(e, bound) << "decode step " << t << " (depth " << p.tokens.size() + t << ")";
      worst = std::max(worst, e);
      ++steps;
    }
  }
  std::printf("[ segments ] %zu prompt rows and %d decode steps: worst logit rel L2 %.3e (bound %.3e)\n",
              p.tokens.size(), steps, worst, bound);
  EXPECT_GT(steps, 20) << "the decode must reach past the segment boundary at depth 320";
}

// A tree whose paths cross several 64-token segments, with boundaries inside nodes and at a
// branch point: a 150-token root, two 100-token children, each with two 70-token leaves (depths
// up to 320); random tokens, all targets weighted 1.
std::string segment_tree_line(std::mt19937_64& rng, int vocab) {
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  const int parent[7] = {-1, 0, 0, 1, 1, 2, 2}, len[7] = {150, 100, 100, 70, 70, 70, 70};
  std::ostringstream os;
  os << "{\"id\":\"seg\",\"nodes\":[";
  for (int n = 0; n < 7; ++n) {
    os << (n ? "," : "") << "{\"parent\":" << parent[n] << ",\"tokens\":[";
    for (int t = 0; t < len[n]; ++t) os << (t ? "," : "") << tok(rng);
    os << "]}";
  }
  os << "]}";
  return os.str();
}

// Segmented training on the GPU against the fp64 CPU scheduler, for K = 0, 1, 2: each TBPTT
// column is a backward on the same forward's activations (Decoder::backward with `again`), the
// tail's key gradients are rotated back in fp32 and added to their rows. Loss within kLossRel;
// gradients by the grad_bound rule with a path of (K + 1) L + 1 layers: a gradient crosses at
// most K + 1 segments' layer stacks, each with 24 roundings per layer plus the re-rotated tail
// key (25 (K + 1) L + 5 <= 24 ((K + 1) L + 1) + 5 here). Retrieval takes the whole pool in order,
// so no near tie can pick other rows on the GPU.
TEST_F(SegmentsCuda, SegmentedTrainingMatchesTheCpu) {
  const model::ModelConfig cfg = config_of(kShape);
  const std::vector<float> master = init_master(cfg, 23);
  const std::vector<double> wd = bf16_weights(master);
  std::mt19937_64 rng(5);
  const data::Tree tree = data::parse_tree_line(segment_tree_line(rng, kShape.V), "segments:1", kShape.V);
  model::CudaModel gpu(cfg);
  gpu.set_params(master.data());
  model::Model<double> cpu(cfg);
  std::copy(wd.begin(), wd.end(), cpu.params());
  for (int K : {0, 1, 2}) {
    model::SegmentConfig seg;
    seg.length = 64;
    seg.tail = 16;
    seg.tbptt = K;
    seg.long_range.layers = {1};
    seg.long_range.heads = {1};
    seg.long_range.retrieve = 1024;
    const data::SegmentPlan plan = data::plan_segments(tree, seg.length);
    const double scale = 1.0 / (double)tree.n_paths();
    cpu.zero_grad();
    model::SegmentRunStats cs, gs;
    const double lc = model::forward_backward_segmented(cpu, seg, plan, scale, &cs);
    gpu.zero_grad();
    const double lg = model::forward_backward_segmented(gpu, seg, plan, scale, &gs);
    EXPECT_EQ(gs.backwards, cs.backwards) << "K = " << K << ": the same columns";
    if (K == 0) EXPECT_EQ(cs.backwards, cs.forwards) << "K = 0: one column a segment";
    else EXPECT_GT(cs.backwards, cs.forwards) << "K = " << K << ": columns past the first ran";
    const std::string what = "segments K = " + std::to_string(K);
    expect_loss_close(lg, lc, what);
    const std::vector<double> ref(cpu.grads(), cpu.grads() + cpu.num_params());
    expect_grads_close(gpu.params_info(), gpu.grads_host(), ref, (K + 1) * kShape.L + 1, what);
  }
}

TEST_F(SegmentsCuda, RetrievalSelectMatchesTheCpu) {
  const int P = 3000, NH = 8, NKV = 4, HS = 128, R = 200, distinct = 50;
  const uint64_t heads = 0b1011;
  const int NL = 3;  // the pool keeps the long-range heads only: slots 0, 1, 2 hold heads 0, 1, 3
  std::mt19937_64 rng(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q((size_t)NH * HS), keys((size_t)distinct * NL * HS), pool((size_t)P * NL * HS);
  for (float& x : q) x = cuda::round_to_bf16(nd(rng));
  for (float& x : keys) x = cuda::round_to_bf16(nd(rng));
  std::uniform_int_distribution<int> pick(0, distinct - 1);
  for (int j = 0; j < P; ++j) {  // each row a copy of a random distinct key: exact ties, 60 each on average
    const int s = pick(rng);
    std::copy(keys.begin() + (size_t)s * NL * HS, keys.begin() + (size_t)(s + 1) * NL * HS,
              pool.begin() + (size_t)j * NL * HS);
  }
  std::vector<int32_t> want((size_t)NKV * R);
  cpu::retrieval_select<float>(want.data(), q.data(), pool.data(), P, NH, NKV, HS, heads, R);

  auto to_device = [](const std::vector<float>& x) {
    std::vector<cuda::bf16> b(x.size());
    cuda::floats_to_bf16(b.data(), x.data(), x.size());
    cuda::DeviceBuffer<cuda::bf16> d(b.size());
    d.copy_from_host(b);
    return d;
  };
  cuda::DeviceBuffer<cuda::bf16> qd = to_device(q), pd = to_device(pool);
  cuda::DeviceBuffer<int32_t> idx((size_t)NKV * R);
  cuda::DeviceBuffer<char> ws(cuda::retrieval_select_workspace_bytes(P, R));
  cuda::retrieval_select(idx.data(), qd.data(), pd.data(), P, NH, NKV, HS, heads, R,
                         cuda::Workspace{ws.data(), ws.size()}, nullptr);
  TT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(idx.to_host(), want) << "the same rows, ties to the lower row, ascending; -1 for local heads";

  // The gather on the CPU's indices.
  idx.copy_from_host(want);
  cuda::DeviceBuffer<cuda::bf16> out((size_t)R * NKV * HS);
  cuda::retrieval_gather(out.data(), pd.data(), idx.data(), R, NKV, HS, heads, nullptr);
  TT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ref((size_t)R * NKV * HS), got(ref.size());
  cpu::retrieval_gather<float>(ref.data(), pool.data(), want.data(), R, NKV, HS, heads);
  const std::vector<cuda::bf16> oh = out.to_host();
  cuda::bf16_to_floats(got.data(), oh.data(), oh.size());
  EXPECT_EQ(got, ref);
}

}  // namespace
}  // namespace tt::model_cuda_test
