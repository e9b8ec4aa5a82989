// The CUDA tree attention on the GPU against the fp64 CPU reference (ops/cpu/attention.h), on
// fresh random bf16 inputs, with every output poisoned (NaN) before the run. Cases sweep what
// breaks tiling assumptions: lengths that are not tile multiples (97, 1025), one-token nodes, a
// deep chain, a wide fan, several trees per batch, HS 64, 128 and 256, GQA ratios 1, 2 and 4, and an
// external prefix with gradients on (dk/dv accumulated) and one with gradients off (its dk/dv
// buffers left alone). Tolerance rule: attention_cases.h. Needs a GPU: without one the first
// CUDA call fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/check.h"
#include "ops/cuda/tree_tiles.h"
#include "ops/cuda/memory.h"
#include "tests/ops_cuda_attention/attention_cases.h"

namespace tt::cuda {
namespace {

using attn_test::Inputs;
using attn_test::kRelL2Bf16;
using attn_test::Reference;
using attn_test::to_bf16;
using attn_test::to_float;

DeviceBuffer<bf16> upload(const std::vector<float>& x) {
  DeviceBuffer<bf16> b(x.size());
  b.copy_from_host(to_bf16(x));
  return b;
}

struct GpuOutputs {
  std::vector<float> out, lse, dq, dk, dv;
  std::vector<std::vector<float>> ext_dk, ext_dv;  // final values, also of gradient-off prefixes
};

// Forward then backward on the GPU; every output poisoned first.
GpuOutputs run_gpu(const Inputs& in) {
  const int N = in.layout.n, NH = in.NH, NKV = in.NKV, HS = in.HS;
  DeviceBuffer<bf16> q = upload(in.q), k = upload(in.k), v = upload(in.v), dout = upload(in.dout);
  DeviceBuffer<bf16> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  DeviceBuffer<float> lse((size_t)N * NH);
  for (auto* b : {&out, &dq, &dk, &dv}) b->fill_bytes(0xFF);
  lse.fill_bytes(0xFF);

  DeviceBuffer<int32_t> subtree_end(N), key_lo(N);
  subtree_end.copy_from_host(in.layout.subtree_end);
  if (in.layout.bidirectional) key_lo.copy_from_host(in.layout.key_lo());
  DeviceBuffer<char> tile_storage(tree_tiles_bytes(N));
  const TreeTiles tiles = build_tree_tiles(subtree_end.data(), N, Workspace{tile_storage.data(), tile_storage.size()},
                                           nullptr, in.layout.bidirectional ? key_lo.data() : nullptr);

  std::vector<DeviceBuffer<bf16>> ek, ev;
  std::vector<DeviceBuffer<float>> edk, edv;  // fp32 prefix gradients
  std::vector<ExternalKV> ext;
  for (const auto& x : in.ext) {
    ek.push_back(upload(x.k));
    ev.push_back(upload(x.v));
    edk.emplace_back(x.dk0.size());
    edk.back().copy_from_host(x.dk0);
    edv.emplace_back(x.dv0.size());
    edv.back().copy_from_host(x.dv0);
  }
  for (size_t e = 0; e < in.ext.size(); e++) {
    const auto& x = in.ext[e];
    ext.push_back(ExternalKV{ek[e].data(), ev[e].data(), x.grad ? edk[e].data() : nullptr,
                             x.grad ? edv[e].data() : nullptr, x.len, x.q_begin, x.q_end, x.heads});
  }

  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), tiles, ext.data(), (int)ext.size(), N, NH,
                    NKV, HS, nullptr);
  DeviceBuffer<char> ws(attention_backward_workspace_bytes(N, NH, HS));
  ws.fill_bytes(0xFF);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                     v.data(), tiles, ext.data(), (int)ext.size(), N, NH, NKV, HS, Workspace{ws.data(), ws.size()},
                     nullptr);
  TT_CUDA_CHECK(cudaDeviceSynchronize());

  GpuOutputs r;
  r.out = to_float(out.to_host());
  r.lse = lse.to_host();
  r.dq = to_float(dq.to_host());
  r.dk = to_float(dk.to_host());
  r.dv = to_float(dv.to_host());
  for (size_t e = 0; e < ext.size(); e++) {
    r.ext_dk.push_back(edk[e].to_host());
    r.ext_dv.push_back(edv[e].to_host());
  }
  return r;
}

struct GpuCase {
  std::string layout;
  int NH, NKV, HS, ext_mode;
};

void PrintTo(const GpuCase& c, std::ostream* os) {
  *os << c.layout << " NH=" << c.NH << " NKV=" << c.NKV << " HS=" << c.HS << " ext=" << c.ext_mode;
}

class GpuAttention : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuAttention, MatchesCpuReference) {
  const GpuCase c = GetParam();
  attn_test::LayoutCase lc;
  for (const auto& x : attn_test::layout_cases())
    if (x.name == c.layout) lc = x;
  ASSERT_TRUE(lc.make) << c.layout;
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Inputs in = attn_test::make_inputs(lc, c.NH, c.NKV, c.HS, c.ext_mode, rng);
  const Reference ref = attn_test::reference(in);
  const GpuOutputs got = run_gpu(in);

  EXPECT_LE(attn_test::rel_l2(got.out, ref.out), kRelL2Bf16) << "out";
  EXPECT_LE(attn_test::max_rel(got.lse, ref.lse), attn_test::kLseRel) << "lse";
  EXPECT_LE(attn_test::rel_l2(got.dq, ref.dq), kRelL2Bf16) << "dq";
  EXPECT_LE(attn_test::rel_l2(got.dk, ref.dk), kRelL2Bf16) << "dk";
  EXPECT_LE(attn_test::rel_l2(got.dv, ref.dv), kRelL2Bf16) << "dv";
  for (size_t e = 0; e < in.ext.size(); e++) {
    const auto& x = in.ext[e];
    if (x.grad && attn_test::read_by_some_head(x, c.NKV)) {
      EXPECT_EQ(attn_test::unread_heads_changed(got.ext_dk[e], x.dk0, x, c.NKV, c.HS), 0) << "ext " << e << " dk";
      EXPECT_EQ(attn_test::unread_heads_changed(got.ext_dv[e], x.dv0, x, c.NKV, c.HS), 0) << "ext " << e << " dv";
      EXPECT_LE(attn_test::rel_l2(attn_test::minus(got.ext_dk[e], x.dk0), attn_test::minus(ref.ext_dk[e], x.dk0)),
                kRelL2Bf16)
          << "ext " << e << " dk (+=)";
      EXPECT_LE(attn_test::rel_l2(attn_test::minus(got.ext_dv[e], x.dv0), attn_test::minus(ref.ext_dv[e], x.dv0)),
                kRelL2Bf16)
          << "ext " << e << " dv (+=)";
    } else {
      EXPECT_EQ(got.ext_dk[e], x.dk0) << "ext " << e << " dk must stay untouched (gradients off)";
      EXPECT_EQ(got.ext_dv[e], x.dv0) << "ext " << e << " dv must stay untouched (gradients off)";
    }
  }
  std::printf("%-16s N=%5d NH=%d NKV=%d HS=%3d: rel L2 out %.2e (bf16 rounding alone %.2e) dq %.2e dk %.2e dv %.2e;"
              " lse max rel %.2e\n",
              c.layout.c_str(), in.layout.n, c.NH, c.NKV, c.HS, attn_test::rel_l2(got.out, ref.out),
              attn_test::bf16_floor(ref.out), attn_test::rel_l2(got.dq, ref.dq), attn_test::rel_l2(got.dk, ref.dk),
              attn_test::rel_l2(got.dv, ref.dv), attn_test::max_rel(got.lse, ref.lse));
}

INSTANTIATE_TEST_SUITE_P(Trees, GpuAttention,
                         ::testing::Values(GpuCase{"chain97", 2, 2, 64, 1}, GpuCase{"chain1025", 4, 2, 128, 0},
                                           GpuCase{"one_token_nodes", 8, 2, 64, 0}, GpuCase{"deep_chain", 2, 2, 128, 1},
                                           GpuCase{"wide_fan", 4, 2, 64, 1}, GpuCase{"several_trees", 8, 2, 128, 0},
                                           GpuCase{"random_tree", 4, 2, 128, 1}, GpuCase{"random_tree", 2, 2, 64, 0},
                                           GpuCase{"comb", 4, 1, 128, 1}, GpuCase{"comb", 4, 2, 64, 1},
                                           GpuCase{"frames196", 12, 12, 64, 0}, GpuCase{"frames16", 4, 4, 128, 0},
                                           GpuCase{"bidirectional_tree", 4, 2, 64, 1},
                                           GpuCase{"bidirectional_tree", 4, 1, 128, 0},
                                           GpuCase{"random_tree", 8, 4, 128, 2}, GpuCase{"comb", 4, 2, 64, 2},
                                           GpuCase{"chain1025", 16, 8, 128, 2},
                                           // Head dim 256 (Qwen3-Next, Qwen3.5): its own tiles.
                                           GpuCase{"chain1025", 4, 2, 256, 0}, GpuCase{"one_token_nodes", 8, 2, 256, 1},
                                           GpuCase{"random_tree", 4, 1, 256, 2}, GpuCase{"comb", 8, 2, 256, 1},
                                           GpuCase{"deep_chain", 2, 2, 256, 0}, GpuCase{"wide_fan", 4, 4, 256, 1},
                                           GpuCase{"bidirectional_tree", 4, 2, 256, 1},
                                           // A deep gateway: kMaxExternalKV prefixes, each head dim.
                                           GpuCase{"chain97", 2, 1, 64, 3}, GpuCase{"random_tree", 8, 2, 128, 3},
                                           GpuCase{"comb", 4, 2, 256, 3}),
                         [](const ::testing::TestParamInfo<GpuCase>& i) {
                           const GpuCase& c = i.param;
                           return c.layout + "_hs" + std::to_string(c.HS) + "_gqa" + std::to_string(c.NH / c.NKV) +
                                  (c.ext_mode == 1   ? "_ext"
                                   : c.ext_mode == 2 ? "_headsets"
                                   : c.ext_mode == 3 ? "_gateway"
                                                     : "");
                         });

// dk and dv have one writer per element and a fixed order: two runs agree bit for bit.
TEST(GpuAttentionDeterminism, DkDvBitwiseRepeatable) {
  std::mt19937_64 rng(7);
  const Inputs in = attn_test::make_inputs(attn_test::layout_cases()[6], 4, 2, 128, 1, rng);
  const GpuOutputs a = run_gpu(in), b = run_gpu(in);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  EXPECT_EQ(a.out, b.out);
}

// build_tree_tiles against the host: per-granule min/max of subtree_end (keys past N count as 0)
// and the zero-padded copy (with key_lo, the same of key_lo, keys past N as INT_MAX), on every
// layout case and lengths around the granule and pad sizes; the storage is poisoned first.
TEST(GpuTreeTiles, MatchesHost) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<attn_test::TreeLayout> layouts;
  for (const auto& lc : attn_test::layout_cases()) layouts.push_back(lc.make(rng));
  for (int n : {1, 63, 64, 65, 127, 128, 129, 4097}) {
    layouts.emplace_back();
    attn_test::append_tree(layouts.back(), {-1}, {n});
  }
  for (const auto& L : layouts) {
    const int N = L.n, ng = (N + kTileGranule - 1) / kTileGranule, np = (N + kTilePad - 1) / kTilePad * kTilePad;
    SCOPED_TRACE("N=" + std::to_string(N));
    DeviceBuffer<int32_t> subtree_end(N), key_lo(N);
    subtree_end.copy_from_host(L.subtree_end);
    const std::vector<int32_t> host_lo = L.key_lo();
    key_lo.copy_from_host(host_lo);
    DeviceBuffer<char> storage(tree_tiles_bytes(N));
    storage.fill_bytes(0xAB);
    const TreeTiles t =
        build_tree_tiles(subtree_end.data(), N, Workspace{storage.data(), storage.size()}, nullptr, key_lo.data());
    ASSERT_EQ(t.n, N);
    ASSERT_EQ(t.num_granules, ng);
    std::vector<int32_t> lo(ng), hi(ng), padded(np);
    TT_CUDA_CHECK(cudaMemcpy(lo.data(), t.hi_min, ng * sizeof(int32_t), cudaMemcpyDeviceToHost));
    TT_CUDA_CHECK(cudaMemcpy(hi.data(), t.hi_max, ng * sizeof(int32_t), cudaMemcpyDeviceToHost));
    TT_CUDA_CHECK(cudaMemcpy(padded.data(), t.subtree_end_pad, np * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int gi = 0; gi < ng; gi++) {
      int want_lo = INT_MAX, want_hi = 0;
      for (int j = gi * kTileGranule; j < (gi + 1) * kTileGranule; j++) {
        const int v = j < N ? L.subtree_end[j] : 0;
        want_lo = std::min(want_lo, v);
        want_hi = std::max(want_hi, v);
      }
      ASSERT_EQ(lo[gi], want_lo) << "granule " << gi;
      ASSERT_EQ(hi[gi], want_hi) << "granule " << gi;
    }
    for (int j = 0; j < np; j++) ASSERT_EQ(padded[j], j < N ? L.subtree_end[j] : 0) << "key " << j;
    TT_CUDA_CHECK(cudaMemcpy(lo.data(), t.lo_min, ng * sizeof(int32_t), cudaMemcpyDeviceToHost));
    TT_CUDA_CHECK(cudaMemcpy(hi.data(), t.lo_max, ng * sizeof(int32_t), cudaMemcpyDeviceToHost));
    TT_CUDA_CHECK(cudaMemcpy(padded.data(), t.key_lo_pad, np * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int gi = 0; gi < ng; gi++) {
      int want_lo = INT_MAX, want_hi = INT_MIN;
      for (int j = gi * kTileGranule; j < (gi + 1) * kTileGranule; j++) {
        const int v = j < N ? host_lo[j] : INT_MAX;
        want_lo = std::min(want_lo, v);
        want_hi = std::max(want_hi, v);
      }
      ASSERT_EQ(lo[gi], want_lo) << "key_lo granule " << gi;
      ASSERT_EQ(hi[gi], want_hi) << "key_lo granule " << gi;
    }
    for (int j = 0; j < np; j++) ASSERT_EQ(padded[j], j < N ? host_lo[j] : INT_MAX) << "key_lo key " << j;
  }
}

// Shapes are checked before anything runs on the device.
TEST(GpuAttentionChecks, RejectsBadShapes) {
  TreeTiles tiles;
  tiles.n = 64;
  tiles.num_granules = 1;
  alignas(16) static int32_t fake[64];
  tiles.subtree_end = tiles.hi_min = tiles.hi_max = tiles.subtree_end_pad = fake;
  alignas(16) static bf16 t[64 * 4 * 128];
  static float lse[64 * 4];
  EXPECT_THROW(attention_forward(t, lse, t, t, t, tiles, nullptr, 0, 64, 4, 2, 96, nullptr), Error);  // HS
  EXPECT_THROW(attention_forward(t, lse, t, t, t, tiles, nullptr, 0, 64, 4, 3, 64, nullptr), Error);  // NH % NKV
  EXPECT_THROW(attention_forward(t, lse, t, t, t, tiles, nullptr, 0, 65, 4, 2, 64, nullptr), Error);  // tiles.n
  ExternalKV bad{t, t, nullptr, nullptr, 4, 10, 70};  // q_end > N
  EXPECT_THROW(attention_forward(t, lse, t, t, t, tiles, &bad, 1, 64, 4, 2, 64, nullptr), Error);
  EXPECT_THROW(attention_backward(t, t, t, t, t, lse, t, t, t, tiles, nullptr, 0, 64, 4, 2, 64, Workspace{}, nullptr),
               Error);  // no workspace
}

}  // namespace
}  // namespace tt::cuda
