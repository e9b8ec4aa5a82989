// The tree attention kernels run on the CPU through the emulators (warp_emulator.h: threads as
// fibers, warp collectives, cp.async; wgmma_emulator.h on top of it: warpgroup MMAs from
// shared-memory descriptors, mbarriers, TMA, named barriers): the same kernel source as the GPU
// build, on small cases, against the fp64 CPU reference with the tolerance rule of
// attention_cases.h. No GPU needed: this keeps the kernels' indexing, layouts, tile
// classification, pipelining and barrier protocol under CI. Timing races and asynchronous
// hazards are out of its reach (see the GPU test and compute-sanitizer in
// scripts/device/attention_check.sh).
#include "tests/ops_cuda_attention/warp_emulator.h"
#include "tests/ops_cuda_attention/wgmma_emulator.h"
// The kernels, compiled for the host against the emulators' primitives.
#include "ops/cuda/attention_sm90.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/ops_cuda_attention/attention_cases.h"

namespace tt::cuda {
namespace {

using attn_test::Inputs;
using attn_test::Reference;
using attn_test::to_bf16;
using attn_test::to_float;

// Tile metadata as tree_tiles.cu builds it, on the host: per-granule min/max of subtree_end
// (keys past N count as 0) and the zero-padded copy; with key_lo (bidirectional) the same of
// key_lo (keys past N count as INT_MAX). view() points a TreeTiles at them.
struct HostTiles {
  std::vector<int32_t> subtree_end, hi_min, hi_max, padded;
  std::vector<int32_t> key_lo, lo_min, lo_max, lo_padded;

  static void minmax(const std::vector<int32_t>& x, int past, std::vector<int32_t>& mn, std::vector<int32_t>& mx,
                     std::vector<int32_t>& pad) {
    const int N = (int)x.size(), ng = (N + kTileGranule - 1) / kTileGranule;
    mn.assign(ng, INT_MAX);
    mx.assign(ng, INT_MIN);
    for (int j = 0; j < ng * kTileGranule; j++) {
      const int v = j < N ? x[j] : past;
      mn[j / kTileGranule] = std::min(mn[j / kTileGranule], v);
      mx[j / kTileGranule] = std::max(mx[j / kTileGranule], v);
    }
    pad.assign((N + kTilePad - 1) / kTilePad * kTilePad, past);
    std::copy(x.begin(), x.end(), pad.begin());
  }
  explicit HostTiles(const std::vector<int32_t>& se, std::vector<int32_t> lo = {}) : subtree_end(se), key_lo(std::move(lo)) {
    minmax(se, 0, hi_min, hi_max, padded);
    if (!key_lo.empty()) minmax(key_lo, INT_MAX, lo_min, lo_max, lo_padded);
  }
  explicit HostTiles(const attn_test::TreeLayout& L)
      : HostTiles(L.subtree_end, L.bidirectional ? L.key_lo() : std::vector<int32_t>{}) {}
  TreeTiles view() const {
    TreeTiles t;
    t.subtree_end = subtree_end.data();
    t.subtree_end_pad = padded.data();
    t.hi_min = hi_min.data();
    t.hi_max = hi_max.data();
    t.n = (int)subtree_end.size();
    t.num_granules = (int)hi_min.size();
    if (!key_lo.empty()) {
      t.key_lo = key_lo.data();
      t.lo_min = lo_min.data();
      t.lo_max = lo_max.data();
      t.key_lo_pad = lo_padded.data();
    }
    return t;
  }
};

struct EmuOutputs {
  std::vector<float> out, lse, dq, dk, dv;
  std::vector<std::vector<float>> ext_dk, ext_dv;
};

// The launch sequence of attention_launch.cuh, with this emulator's tensor maps.
template <int HS>
EmuOutputs run_emulated(const Inputs& in, int fwd_items) {
  const int N = in.layout.n, NH = in.NH, NKV = in.NKV;
  std::vector<bf16> q = to_bf16(in.q), k = to_bf16(in.k), v = to_bf16(in.v), dout = to_bf16(in.dout);
  const bf16 nan = host_float_to_bf16(NAN);
  std::vector<bf16> out(q.size(), nan), dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
  std::vector<float> lse((size_t)N * NH, NAN);

  const HostTiles host_tiles(in.layout);
  const TreeTiles tiles = host_tiles.view();

  std::vector<std::vector<bf16>> ek, ev;
  std::vector<std::vector<float>> edk, edv;  // fp32 prefix gradients
  for (const auto& x : in.ext) {
    ek.push_back(to_bf16(x.k));
    ev.push_back(to_bf16(x.v));
    edk.push_back(x.dk0);
    edv.push_back(x.dv0);
  }
  std::vector<ExternalKV> ext(in.ext.size());
  for (size_t e = 0; e < ext.size(); e++) {
    ext[e] = ExternalKV{ek[e].data(), ev[e].data(), in.ext[e].grad ? edk[e].data() : nullptr,
                        in.ext[e].grad ? edv[e].data() : nullptr, in.ext[e].len, in.ext[e].q_begin,
                        in.ext[e].q_end, in.ext[e].heads};
  }

  AttnFwdParams pf = make_fwd_params(out.data(), lse.data(), q.data(), k.data(), v.data(), tiles, ext.data(),
                                     (int)ext.size(), N, NH, NKV, HS);
  using F = attn::sm90::FwdConfig<HS>;
  set_fwd_tensor_maps(pf, HS, emu::tensor_map);
  pf.fwd_items = fwd_items;
  emu::launch(attn::sm90::attention_fwd_kernel<HS>, dim3(fwd_blocks(pf)), dim3(F::kThreads), F::kSmemBytes, pf);

  std::vector<float> ws(bwd_workspace_bytes(N, NH, HS) / sizeof(float) + 64, NAN);
  void* ws_ptr = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) / 256 * 256);
  AttnBwdParams pb = make_bwd_params(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                                     k.data(), v.data(), tiles, ext.data(), (int)ext.size(), N, NH, NKV, HS, ws_ptr);
  emu::launch(attn::attention_bwd_preprocess_kernel<HS>, dim3((pb.n_pad * NH * 32 + 255) / 256), dim3(256), 0, pb);
  using B = attn::sm90::BwdConfig<HS>;
  set_bwd_schedule(pb, B::BN);
  set_bwd_tensor_maps(pb, HS, emu::tensor_map);
  pb.dq_blocked = 1;
  emu::launch(attn::sm90::bwd_kernel<HS>(), dim3((unsigned)pb.key_tiles * NKV), dim3(B::kThreads),
              B::kSmemBytes, pb);
  const unsigned convert_blocks = (unsigned)((dq_convert_threads(pb, HS) + 255) / 256);
  emu::launch(attn::attention_dq_convert_kernel<HS>, dim3(convert_blocks), dim3(256), 0, pb);

  EmuOutputs r;
  r.out = to_float(out);
  r.lse = lse;
  r.dq = to_float(dq);
  r.dk = to_float(dk);
  r.dv = to_float(dv);
  for (size_t e = 0; e < ext.size(); e++) {
    r.ext_dk.push_back(edk[e]);
    r.ext_dv.push_back(edv[e]);
  }
  return r;
}

struct EmuCase {
  std::string layout;
  int NH, NKV, HS, ext_mode;
  int fwd_items = kFwdItemsPerBlock;  // forward: items per block (1: one each; 3: Q buffers reused)
  bool at_issue = false;  // TMA copies land when issued (a refill of a buffer still read shows)
};

void PrintTo(const EmuCase& c, std::ostream* os) {
  *os << c.layout << " NH=" << c.NH << " NKV=" << c.NKV << " HS=" << c.HS
      << " ext=" << c.ext_mode << " fwd_items=" << c.fwd_items << (c.at_issue ? " copies at issue" : "");
}

class EmulatedAttention : public ::testing::TestWithParam<EmuCase> {};

TEST_P(EmulatedAttention, MatchesCpuReference) {
  const EmuCase c = GetParam();
  attn_test::LayoutCase lc;
  for (const auto& x : attn_test::layout_cases())
    if (x.name == c.layout) lc = x;
  ASSERT_TRUE(lc.make) << c.layout;
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Inputs in = attn_test::make_inputs(lc, c.NH, c.NKV, c.HS, c.ext_mode, rng);
  const Reference ref = attn_test::reference(in);
  const EmuOutputs got = [&] {
    const emu::CopiesLanding landing(c.at_issue);
    return c.HS == 64 ? run_emulated<64>(in, c.fwd_items)
                      : c.HS == 128 ? run_emulated<128>(in, c.fwd_items) : run_emulated<256>(in, c.fwd_items);
  }();

  using attn_test::kRelL2Bf16;
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
      EXPECT_LE(attn_test::rel_l2(attn_test::minus(got.ext_dk[e], in.ext[e].dk0), attn_test::minus(ref.ext_dk[e], in.ext[e].dk0)),
                kRelL2Bf16)
          << "ext " << e << " dk";
      EXPECT_LE(attn_test::rel_l2(attn_test::minus(got.ext_dv[e], in.ext[e].dv0), attn_test::minus(ref.ext_dv[e], in.ext[e].dv0)),
                kRelL2Bf16)
          << "ext " << e << " dv";
    } else {
      EXPECT_EQ(got.ext_dk[e], in.ext[e].dk0) << "ext " << e << " dk must stay untouched (no gradient, or no head)";
      EXPECT_EQ(got.ext_dv[e], in.ext[e].dv0) << "ext " << e << " dv must stay untouched (no gradient, or no head)";
    }
  }
  std::printf("%s: out %.2e (bf16 rounding alone %.2e) dq %.2e dk %.2e dv %.2e lse %.2e\n", c.layout.c_str(),
              attn_test::rel_l2(got.out, ref.out), attn_test::bf16_floor(ref.out), attn_test::rel_l2(got.dq, ref.dq),
              attn_test::rel_l2(got.dk, ref.dk), attn_test::rel_l2(got.dv, ref.dv),
              attn_test::max_rel(got.lse, ref.lse));
}

INSTANTIATE_TEST_SUITE_P(SmallTrees, EmulatedAttention,
                         ::testing::Values(EmuCase{"chain97", 2, 1, 64, 1, 1}, EmuCase{"comb", 2, 2, 128, 1, 3},
                                           EmuCase{"wide_fan", 4, 2, 64, 0},
                                           EmuCase{"one_token_nodes", 4, 2, 64, 0, 5},
                                           EmuCase{"deep_chain", 2, 2, 128, 1},
                                           EmuCase{"several_trees", 4, 1, 128, 0, 3},
                                           EmuCase{"frames196", 2, 2, 64, 0},
                                           EmuCase{"frames16", 2, 1, 128, 0, 3},
                                           EmuCase{"bidirectional_tree", 4, 2, 64, 1},
                                           EmuCase{"random_tree", 4, 2, 128, 1},
                                           EmuCase{"chain1025", 4, 2, 64, 2},
                                           EmuCase{"comb", 8, 4, 128, 2, 3},
                                           // Head dim 256: 64-key forward tiles, one Q buffer
                                           // (items reuse it), the split backward.
                                           EmuCase{"one_token_nodes", 4, 2, 256, 1, 3},
                                           EmuCase{"random_tree", 2, 1, 256, 2},
                                           EmuCase{"bidirectional_tree", 2, 2, 256, 0, 1},
                                           // Copies landing when issued: no buffer refilled while read.
                                           EmuCase{"comb", 2, 2, 128, 1, 3, true},
                                           EmuCase{"one_token_nodes", 4, 2, 256, 1, 3, true},
                                           // A deep gateway: kMaxExternalKV prefixes.
                                           EmuCase{"chain97", 2, 1, 64, 3, 1},
                                           EmuCase{"random_tree", 4, 2, 128, 3, 3}),
                         [](const ::testing::TestParamInfo<EmuCase>& i) {
                           return i.param.layout + "_hs" + std::to_string(i.param.HS) + "_gqa" +
                                  std::to_string(i.param.NH / i.param.NKV) +
                                  (i.param.ext_mode == 1   ? "_ext"
                                   : i.param.ext_mode == 2 ? "_headsets"
                                   : i.param.ext_mode == 3 ? "_gateway"
                                                           : "") +
                                  "_items" + std::to_string(i.param.fwd_items) + (i.param.at_issue ? "_at_issue" : "");
                         });

// The forward's key-tile walk (next_key_tile: ballots over 32 tiles, jumps over sibling subtrees)
// against classifying every tile one by one, on layouts long enough that whole windows of 32
// tiles are invisible: a long first child followed by short siblings, several trees, random
// trees, with and without an external prefix, causal and bidirectional (a tower's frames).
struct WalkParams {
  AttnFwdParams p;
  int* out;    // (query tiles, stride): 2 + 2 x tiles, then -1
  int stride;
};

constexpr int kWalkBN = 128, kWalkBM = 128;

__global__ void walk_kernel(const WalkParams w) {
  const AttnFwdParams& p = w.p;
  const int q0 = blockIdx.x * kWalkBM, q_last = q0 + kWalkBM - 1;  // as the forward kernel
  const int v_end = attn::walk_end<kWalkBN>(p, q_last);
  attn::TileScan scan;
  bool full = false;
  int* out = w.out + (int64_t)blockIdx.x * w.stride;
  int k = 0;
  for (int v = attn::next_key_tile<kWalkBN>(p, scan, 0, v_end, 0, q0, q_last, full); v < v_end;
       v = attn::next_key_tile<kWalkBN>(p, scan, v + 1, v_end, 0, q0, q_last, full)) {
    if (threadIdx.x == 0 && k + 3 < w.stride) {
      out[k++] = v;
      out[k++] = full;
    }
  }
  if (threadIdx.x == 0) out[k] = -1;
}

TEST(EmulatedWalk, MatchesTileByTileClassification) {
  std::mt19937_64 rng(std::random_device{}());
  auto long_sibling = [&] {  // the last children's queries skip a 9000-token subtree
    attn_test::TreeLayout L;
    std::vector<int> parent = {-1, 0, 0, 0, 1, 1}, len = {100, 5000, 300, 200, 2000, 2000};
    attn_test::append_tree(L, parent, len);
    return L;
  };
  auto many_trees = [&] {
    attn_test::TreeLayout L;
    for (int t = 0; t < 6; t++) attn_test::append_random_tree(L, rng, 30, 1, 400);
    return L;
  };
  auto random_big = [&] {
    attn_test::TreeLayout L;
    attn_test::append_random_tree(L, rng, 120, 1, 600);
    return L;
  };
  auto frames = [&] {  // a tower's frames, bidirectional: later keys of a query's frame are visible
    attn_test::TreeLayout L;
    for (int f = 0; f < 60; f++) attn_test::append_tree(L, {-1}, {196});
    L.bidirectional = true;
    return L;
  };
  int checked = 0, jumps_possible = 0;
  for (int trial = 0; trial < 9; trial++) {
    attn_test::TreeLayout L = trial % 3 == 0 ? long_sibling() : trial % 3 == 1 ? many_trees() : random_big();
    if (trial == 6) L = frames();
    if (trial >= 7) L.bidirectional = true;
    const int N = L.n;
    const HostTiles host_tiles(L);
    const TreeTiles tiles = host_tiles.view();
    static bf16 dummy[16];
    ExternalKV ext{dummy, dummy, nullptr, nullptr, 300, N / 3, N / 2};  // visible to a middle range
    AttnFwdParams p = make_fwd_params(nullptr, nullptr, dummy, dummy, dummy, tiles, &ext, trial % 2, N, 1, 1, 64);
    const int n_qt = (N + kWalkBM - 1) / kWalkBM, n_kt = (N + kWalkBN - 1) / kWalkBN;
    const int stride = 2 * (n_kt + 8) + 4;
    std::vector<int> walked((size_t)n_qt * stride, -2);
    emu::launch(walk_kernel, dim3(n_qt), dim3(32), 0, WalkParams{p, walked.data(), stride});
    for (int qt = 0; qt < n_qt; qt++) {
      const int q0 = qt * kWalkBM, q_last = q0 + kWalkBM - 1;
      const int ext_tiles = trial % 2 ? (ext.len + kWalkBN - 1) / kWalkBN : 0;
      const int v_end = ext_tiles + (L.bidirectional ? n_kt : std::min(n_kt, q_last / kWalkBN + 1));
      std::vector<int> want;
      for (int v = 0; v < v_end; v++) {
        int skip_to;
        const int kind = attn::classify_key_tile<kWalkBN>(p, v, 0, q0, q_last, skip_to);
        if (kind != attn::kSkip) {
          want.push_back(v);
          want.push_back(kind == attn::kFull);
        } else if (skip_to > v + 32) {
          jumps_possible++;
        }
      }
      want.push_back(-1);
      const std::vector<int> got(walked.begin() + (int64_t)qt * stride,
                                 walked.begin() + (int64_t)qt * stride + want.size());
      ASSERT_EQ(got, want) << "layout " << trial << " (N=" << N << "), query tile " << qt;
      checked++;
    }
  }
  EXPECT_GT(jumps_possible, 0) << "no layout had a jump over a whole window";
  std::printf("%d query tiles walked, %d skipped tiles with a jump past their window\n", checked, jumps_possible);
}

// The backward's per-step visibility masks against the range test they replace: bit c of
// query_bits(lo, hi, q0) is set exactly when lo <= q0 + c < hi, for ranges before, across, inside
// and past the step's 64 columns, empty ones, and a prefix key past its end (INT_MAX, 0).
TEST(QueryBits, MatchesTheRangeTest) {
  int64_t checked = 0;
  for (const int q0 : {0, 64, 4096}) {
    std::vector<std::pair<int, int>> ranges = {{INT_MAX, 0}, {0, INT_MAX}, {q0, q0}};
    for (int lo = q0 - 70; lo <= q0 + 134; lo += 3)
      for (int hi = lo - 2; hi <= q0 + 140; hi += 5) ranges.push_back({std::max(lo, 0), std::max(hi, 0)});
    for (const auto& [lo, hi] : ranges) {
      const uint64_t bits = attn::sm90::query_bits<64>(lo, hi, q0);
      for (int c = 0; c < 64; ++c) {
        const bool want = lo <= q0 + c && q0 + c < hi;
        ASSERT_EQ((bits >> c) & 1, (uint64_t)want) << "lo=" << lo << " hi=" << hi << " q0=" << q0 << " c=" << c;
      }
      checked++;
    }
  }
  EXPECT_GT(checked, 3000);
}

}  // namespace
}  // namespace tt::cuda
