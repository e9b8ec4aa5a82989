// The attention primitive's decode mode on the GPU (ops/cuda/attention_decode.h) against the fp64
// CPU reference (ops/cpu/attention.h) on the same batch: every row its own one-token tree, reading
// external prefixes with their query ranges. Cases: one row with a long prefix (many key chunks;
// at 16k, chunks of several tiles), K samples sharing a prompt prefix plus one own prefix each
// (more prefixes than the tree kernels take), independent rows each with its own prefix, prefixes
// of length 0 and 1, rows that see no prefix, more rows than a row group, HS 64, 128 and 256, GQA
// ratios 1, 2 and 8, prefixes read by some KV heads only (head sets), a row of 257 partials (the
// merge's rounds), more prefixes than go by value, and plans whose row groups merge their partials
// inside a thread-block cluster (the plan's cluster size checked). Outputs are poisoned before the run; a plan
// reused by three calls on a stream gives the one-shot call's result bit for bit; the q/k norm
// fused into clustered plans equals the q/k norm kernel followed by the attention, bit for bit
// (and unclustered plans refuse it). Tolerance rule:
// attention_cases.h (kRelL2Bf16 for out, whose bf16 roundings are P before P V and out, k = 2
// there; kLseRel for lse).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/cpu/attention.h"
#include "ops/cuda/attention_decode.h"
#include "ops/cuda/check.h"
#include "ops/cuda/memory.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/rope.h"
#include "tests/ops_cuda_attention/attention_cases.h"

namespace tt::cuda {
namespace {

using attn_test::kLseRel;
using attn_test::kRelL2Bf16;
using attn_test::random_bf16;
using attn_test::rel_l2;
using attn_test::to_bf16;
using attn_test::to_float;

struct Prefix {
  int len, q_begin, q_end;
  uint64_t heads = ~uint64_t(0);  // the KV heads that read it
};

struct DecodeCase {
  std::string name;
  int N, NH, NKV, HS;
  std::vector<Prefix> prefixes;
  int cluster = 0;  // the plan's cluster size (0: the merge kernel); above 8, or any of 0..8 where the
                    // device cannot co-schedule that many blocks
};

std::ostream& operator<<(std::ostream& os, const DecodeCase& c) { return os << c.name; }

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> v;
  v.push_back({"one_row_long_prefix_hs128", 1, 16, 8, 128, {{3000, 0, 1}}});
  v.push_back({"one_row_long_prefix_hs64_mha", 1, 4, 4, 64, {{1100, 0, 1}}, 9});  // 9 chunks of 128
  // 16k keys: the chunk grows past one tile (at most kTargetBlocks blocks), the last one partial.
  v.push_back({"one_row_16k_hs128", 1, 16, 8, 128, {{16385, 0, 1}}});
  // 16 samples of one prompt: the prompt visible to all, one generated span per sample.
  DecodeCase k{"samples16_shared_prompt", 16, 16, 8, 128, {{700, 0, 16}}};
  for (int s = 0; s < 16; s++) k.prefixes.push_back({s * 3, s, s + 1});  // 0 .. 45 keys each
  v.push_back(k);
  // Two prompts of 3 and 5 samples; a row with no prefix at all; GQA 8.
  DecodeCase m{"two_prompts_gqa8", 9, 16, 2, 128, {{300, 0, 3}, {1, 3, 8}}};
  for (int s = 0; s < 8; s++) m.prefixes.push_back({17 + s, s, s + 1});
  v.push_back(m);
  v.push_back({"rows_without_prefix_hs64", 5, 8, 2, 64, {{0, 0, 5}, {64, 1, 3}}});
  // Independent sequences (batch decode of separate prompts): each row reads only its own prefix,
  // of 1 to 2,500 keys.
  v.push_back({"rows_own_prefixes_hs128", 4, 16, 8, 128, {{1000, 0, 1}, {70, 1, 2}, {1, 2, 3}, {2500, 3, 4}}});
  // A segment's decode step: the carried tail read by the local KV heads (even), the retrieval
  // prefix by the long-range ones (odd), the segment's cache rows by all; a prefix read by none.
  v.push_back({"segment_head_sets_hs128", 3, 16, 4, 128,
               {{512, 0, 3, 0x5}, {300, 0, 3, 0xA}, {900, 0, 3}, {40, 1, 2, 0}}});
  // Head dim 256 (Qwen3-Next, Qwen3.5): a long prefix (chunks of several tiles, the last
  // partial), shared-prompt samples and GQA 8.
  v.push_back({"one_row_long_prefix_hs256", 1, 16, 2, 256, {{3001, 0, 1}}});
  DecodeCase k256{"samples8_shared_prompt_hs256", 8, 16, 2, 256, {{333, 0, 8}}};
  for (int s = 0; s < 8; s++) k256.prefixes.push_back({s * 5, s, s + 1});
  v.push_back(k256);
  // One KV head: 16,400 keys in 257 one-tile chunks, so the merge takes a row's partials in three
  // rounds of 128.
  v.push_back({"one_row_257_partials_mqa", 1, 8, 1, 128, {{16400, 0, 1}}});
  // 130 independent rows, one prefix each (1 to 90 keys): more prefixes than the kernel takes by
  // value (kDecodeByValue = 96), so their pointers go through the per-call device table.
  DecodeCase many{"rows_130_prefixes_hs64", 130, 4, 2, 64, {}};
  for (int s = 0; s < 130; s++) many.prefixes.push_back({1 + s * 37 % 90, s, s + 1});
  many.cluster = 2;  // one or two 64-key chunks a row: clusters of 2, the one-chunk rows padded
  v.push_back(many);
  // Clustered plans (each row group's partials merged inside one thread-block cluster): batch 1
  // with a prompt and its generated rows (16 + 1 chunks of 64 keys do not fit 16 blocks: 8 + 1 of
  // 128), a portable cluster of 8, rows of several lengths (clusters padded with empty items), head
  // sets at HS 256 (8 + 2 chunks, one block a multiprocessor), and row groups of several rows (one
  // partial) at GQA 4.
  v.push_back({"one_row_1k_and_generated_hs128", 1, 16, 8, 128, {{1024, 0, 1}, {37, 0, 1}}, 9});
  v.push_back({"one_row_two_prefixes_cluster8_hs128", 1, 16, 8, 128, {{400, 0, 1}, {30, 0, 1}}, 8});
  v.push_back({"rows_own_prefixes_padded_hs128", 4, 16, 8, 128, {{300, 0, 1}, {70, 1, 2}, {1, 2, 3}, {500, 3, 4}}, 8});
  v.push_back({"head_sets_clustered_hs256", 2, 16, 2, 256, {{500, 0, 2, 0x1}, {100, 0, 2, 0x2}}, 10});
  v.push_back({"row_groups_clustered_hs64_gqa4", 6, 8, 2, 64, {{200, 0, 6}, {50, 0, 6}}, 5});
  return v;
}

// x as bf16 on the device (one element at least).
DeviceBuffer<bf16> upload(const std::vector<float>& x) {
  DeviceBuffer<bf16> b(std::max<size_t>(x.size(), 1));
  if (!x.empty()) b.copy_from_host(to_bf16(x));
  return b;
}

// The case's prefixes over their K and V (device buffers: ExternalKV; host fp64 vectors:
// cpu::ExternalKV<double>).
template <class KV, class Buf>
std::vector<KV> prefixes_over(const DecodeCase& c, const std::vector<Buf>& k, const std::vector<Buf>& v) {
  std::vector<KV> ext;
  for (size_t e = 0; e < c.prefixes.size(); e++) {
    KV x;
    x.k = k[e].data();
    x.v = v[e].data();
    x.len = c.prefixes[e].len;
    x.q_begin = c.prefixes[e].q_begin;
    x.q_end = c.prefixes[e].q_end;
    x.heads = c.prefixes[e].heads;
    ext.push_back(x);
  }
  return ext;
}

class AttentionDecode : public ::testing::TestWithParam<DecodeCase> {
 protected:
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess) << "no CUDA driver/device";
    ASSERT_GT(n, 0) << "no CUDA device";
  }
};

TEST_P(AttentionDecode, MatchesTheCpuReference) {
  const DecodeCase& c = GetParam();
  const int N = c.N, NH = c.NH, NKV = c.NKV, HS = c.HS;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  const std::vector<float> q = random_bf16(rng, (size_t)N * NH * HS, 1.f);
  const std::vector<float> k = random_bf16(rng, (size_t)N * NKV * HS, 1.f);
  const std::vector<float> v = random_bf16(rng, (size_t)N * NKV * HS, 1.f);
  std::vector<std::vector<float>> pk, pv;
  for (const Prefix& p : c.prefixes) {
    pk.push_back(random_bf16(rng, (size_t)p.len * NKV * HS, 1.f));
    pv.push_back(random_bf16(rng, (size_t)p.len * NKV * HS, 1.f));
  }

  // fp64 reference: N one-token trees and the same prefixes.
  std::vector<int32_t> start(N), len(N, 1), parent(N, -1);
  for (int i = 0; i < N; i++) start[i] = i;
  const cpu::AttnLayout layout{N, start.data(), len.data(), parent.data()};
  auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const std::vector<double> qd = d(q), kd = d(k), vd = d(v);
  std::vector<std::vector<double>> pkd, pvd;
  for (size_t e = 0; e < c.prefixes.size(); e++) {
    pkd.push_back(d(pk[e]));
    pvd.push_back(d(pv[e]));
  }
  const std::vector<cpu::ExternalKV<double>> ext_ref = prefixes_over<cpu::ExternalKV<double>>(c, pkd, pvd);
  std::vector<double> ref_out((size_t)N * NH * HS), ref_lse((size_t)N * NH);
  cpu::attention_forward<double>(ref_out.data(), ref_lse.data(), qd.data(), kd.data(), vd.data(), layout,
                                 ext_ref.data(), (int)ext_ref.size(), N, NH, NKV, HS);

  // GPU.
  DeviceBuffer<bf16> qg = upload(q), kg = upload(k), vg = upload(v), out(q.size());
  DeviceBuffer<float> lse((size_t)N * NH);
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  std::vector<DeviceBuffer<bf16>> pkg, pvg;
  for (size_t e = 0; e < c.prefixes.size(); e++) {
    pkg.push_back(upload(pk[e]));
    pvg.push_back(upload(pv[e]));
  }
  const std::vector<ExternalKV> ext = prefixes_over<ExternalKV>(c, pkg, pvg);
  const size_t ws_bytes = attention_decode_workspace_bytes(ext.data(), (int)ext.size(), N, NH, NKV, HS);
  DeviceBuffer<char> ws(std::max<size_t>(ws_bytes, 1));
  attention_decode_forward(out.data(), lse.data(), qg.data(), kg.data(), vg.data(), ext.data(), (int)ext.size(), N,
                           NH, NKV, HS, Workspace{ws.data(), ws.size()}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<bf16> out_h(out.size());
  std::vector<float> lse_h(lse.size());
  out.copy_to_host(out_h.data(), out_h.size());
  lse.copy_to_host(lse_h.data(), lse_h.size());

  const double e_out = rel_l2(to_float(out_h), ref_out);
  double e_lse = 0;
  for (size_t i = 0; i < lse_h.size(); i++)
    e_lse = std::max(e_lse, std::fabs(lse_h[i] - ref_lse[i]) / std::max(1.0, std::fabs(ref_lse[i])));
  EXPECT_LE(e_out, kRelL2Bf16) << c.name;
  EXPECT_LE(e_lse, kLseRel) << c.name;
  std::printf("%-32s N=%d NH=%d NKV=%d HS=%d prefixes=%zu: out rel L2 %.3e (bf16 rounding alone %.3e), lse %.2e\n",
              c.name.c_str(), N, NH, NKV, HS, c.prefixes.size(), e_out, attn_test::bf16_floor(ref_out), e_lse);

  // A plan built once and used by three calls back to back on a stream (the layers of a step, the
  // kernels launched with programmatic dependent launch, each call's partials overwriting the
  // last's in the same workspace): each call's result equals the one-shot call's, bit for bit
  // (fixed orders).
  AttentionDecodePlan plan;
  plan.make(ext.data(), (int)ext.size(), N, NH, NKV, HS);
  if (c.cluster <= 8)
    EXPECT_EQ(plan.cluster_size(), c.cluster) << c.name;
  else
    EXPECT_TRUE(plan.cluster_size() == c.cluster || plan.cluster_size() <= 8) << c.name << ": " << plan.cluster_size();
  std::printf("%-32s clusters of %d%s\n", c.name.c_str(), plan.cluster_size(),
              plan.cluster_size() ? "" : " (merge kernel)");
  DeviceBuffer<char> tables(std::max<size_t>(plan.table_bytes(), 1)), ws2(std::max<size_t>(plan.workspace_bytes(), 1));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  plan.upload(tables.data(), stream);
  std::vector<DeviceBuffer<bf16>> outs;
  std::vector<DeviceBuffer<float>> lses;
  for (int call = 0; call < 3; call++) {
    outs.emplace_back(q.size());
    lses.emplace_back((size_t)N * NH);
    outs.back().fill_bytes(0xFF);
    lses.back().fill_bytes(0xFF);
  }
  for (int call = 0; call < 3; call++)
    attention_decode_forward(outs[call].data(), lses[call].data(), qg.data(), kg.data(), vg.data(), ext.data(),
                             (int)ext.size(), N, NH, NKV, HS, plan, Workspace{ws2.data(), ws2.size()}, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  for (int call = 0; call < 3; call++) {
    std::vector<bf16> o(out.size());
    std::vector<float> l(lse.size());
    outs[call].copy_to_host(o.data(), o.size());
    lses[call].copy_to_host(l.data(), l.size());
    EXPECT_EQ(std::memcmp(o.data(), out_h.data(), sizeof(bf16) * o.size()), 0) << c.name << ": planned call " << call;
    EXPECT_EQ(std::memcmp(l.data(), lse_h.data(), sizeof(float) * l.size()), 0) << c.name << ": planned call " << call;
  }
}

// The q/k norm and RoPE fused into a clustered plan's kernel (DecodeQkNorm) against the q/k norm
// kernel (qk_norm_rope_pair, with the cache stores) followed by the same plan's attention: out,
// lse, q, k, both rstd and the cache rows bit for bit (the two share the row function); HS 256
// with Qwen3.5's zero-centred weights (w_offset 1). Unclustered plans refuse the fused call.
TEST_P(AttentionDecode, FusedQkNormMatchesTheQkNormKernel) {
  const DecodeCase& c = GetParam();
  const int N = c.N, NH = c.NH, NKV = c.NKV, HS = c.HS, rows = N + 3;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name) + 1);
  DeviceBuffer<bf16> q_pre = upload(random_bf16(rng, (size_t)N * NH * HS, 2.f));
  DeviceBuffer<bf16> k_pre = upload(random_bf16(rng, (size_t)N * NKV * HS, 2.f));
  DeviceBuffer<bf16> v = upload(random_bf16(rng, (size_t)N * NKV * HS, 1.f));
  const float w_offset = HS == 256 ? 1.f : 0.f;
  std::vector<float> qw = random_bf16(rng, HS, 0.5f), kw = random_bf16(rng, HS, 0.5f);
  for (int d = 0; d < HS; d++) qw[d] += 1.f - w_offset, kw[d] += 1.f - w_offset;
  DeviceBuffer<bf16> q_w = upload(qw), k_w = upload(kw);
  std::vector<int32_t> pos(N), store_rows(N);
  for (int i = 0; i < N; i++) pos[i] = 1000 + 37 * i, store_rows[i] = rows - 1 - i;
  DeviceBuffer<int32_t> pos_g(N), store_rows_g(N);
  pos_g.copy_from_host(pos);
  store_rows_g.copy_from_host(store_rows);
  DeviceBuffer<float2> rope_cs((size_t)N * HS / 2);
  rope_table(rope_cs.data(), pos_g.data(), N, HS, 1e6, nullptr);
  std::vector<DeviceBuffer<bf16>> pk, pv;
  for (const Prefix& p : c.prefixes) {
    pk.push_back(upload(random_bf16(rng, (size_t)p.len * NKV * HS, 1.f)));
    pv.push_back(upload(random_bf16(rng, (size_t)p.len * NKV * HS, 1.f)));
  }
  const std::vector<ExternalKV> ext = prefixes_over<ExternalKV>(c, pk, pv);
  AttentionDecodePlan plan;
  plan.make(ext.data(), (int)ext.size(), N, NH, NKV, HS);
  DeviceBuffer<char> tables(std::max<size_t>(plan.table_bytes(), 1)), ws(std::max<size_t>(plan.workspace_bytes(), 1));
  plan.upload(tables.data(), nullptr);

  struct Outputs {  // one run's outputs, poisoned
    DeviceBuffer<bf16> out, q, k, cache_k, cache_v;
    DeviceBuffer<float> lse, q_rstd, k_rstd;
    Outputs(int N, int NH, int NKV, int HS, int rows)
        : out((size_t)N * NH * HS), q((size_t)N * NH * HS), k((size_t)N * NKV * HS),
          cache_k((size_t)rows * NKV * HS), cache_v((size_t)rows * NKV * HS), lse((size_t)N * NH),
          q_rstd((size_t)N * NH), k_rstd((size_t)N * NKV) {
      for (DeviceBuffer<bf16>* b : {&out, &q, &k, &cache_k, &cache_v}) b->fill_bytes(0xFF);
      for (DeviceBuffer<float>* b : {&lse, &q_rstd, &k_rstd}) b->fill_bytes(0xFF);
    }
  };
  const double eps = 1e-6;
  Outputs sep(N, NH, NKV, HS, rows), fused(N, NH, NKV, HS, rows);
  DecodeQkNorm n;
  n.q = fused.q.data(), n.q_rstd = fused.q_rstd.data(), n.q_pre = q_pre.data(), n.q_w = q_w.data();
  n.k = fused.k.data(), n.k_rstd = fused.k_rstd.data(), n.k_pre = k_pre.data(), n.k_w = k_w.data();
  n.rope_cs = rope_cs.data(), n.eps = (float)eps, n.w_offset = w_offset;
  n.store_k = fused.cache_k.data(), n.store_v = fused.cache_v.data(), n.store_rows = store_rows_g.data();
  if (plan.cluster_size() == 0) {
    try {
      attention_decode_forward(fused.out.data(), fused.lse.data(), n, v.data(), ext.data(), (int)ext.size(), N, NH,
                               NKV, HS, plan, Workspace{ws.data(), ws.size()}, nullptr);
      ADD_FAILURE() << c.name << ": the fused call ran on an unclustered plan";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the plan is not clustered (cluster_size() 0)"), std::string::npos)
          << e.what();
    }
    return;
  }
  qk_norm_rope_pair(sep.q.data(), sep.q_rstd.data(), q_pre.data(), q_w.data(), NH, sep.k.data(), sep.k_rstd.data(),
                    k_pre.data(), k_w.data(), NKV, rope_cs.data(), N, HS, eps, w_offset, v.data(), sep.cache_k.data(),
                    sep.cache_v.data(), store_rows_g.data(), nullptr);
  attention_decode_forward(sep.out.data(), sep.lse.data(), sep.q.data(), sep.k.data(), v.data(), ext.data(),
                           (int)ext.size(), N, NH, NKV, HS, plan, Workspace{ws.data(), ws.size()}, nullptr);
  attention_decode_forward(fused.out.data(), fused.lse.data(), n, v.data(), ext.data(), (int)ext.size(), N, NH, NKV,
                           HS, plan, Workspace{ws.data(), ws.size()}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto same = [&](const auto& a, const auto& b, const char* what) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(a.data())>>;
    std::vector<T> x(a.size()), y(b.size());
    a.copy_to_host(x.data(), x.size());
    b.copy_to_host(y.data(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), sizeof(T) * x.size()), 0) << c.name << ": " << what;
  };
  same(sep.out, fused.out, "out");
  same(sep.lse, fused.lse, "lse");
  same(sep.q, fused.q, "q");
  same(sep.k, fused.k, "k");
  same(sep.q_rstd, fused.q_rstd, "q rstd");
  same(sep.k_rstd, fused.k_rstd, "k rstd");
  same(sep.cache_k, fused.cache_k, "cache k rows");
  same(sep.cache_v, fused.cache_v, "cache v rows");
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionDecode, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) { return i.param.name; });

}  // namespace
}  // namespace tt::cuda
