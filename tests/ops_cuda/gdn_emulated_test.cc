// The Gated DeltaNet's CUDA kernels (ops/cuda/gdn_rule.cuh, the delta rule, and gdn_rows.cuh, the
// row ops: the same source and the same launch sequences as the GPU build) on the CPU through the
// emulators of tests/ops_cuda_attention (threads as fibers, warp collectives, ldmatrix and
// mma.sync, cp.async, mbarriers and TMA), against the fp64 references (ops/cpu/gdn.h: the
// recurrent oracle, the row ops) on small gdn_cases.h trees, with gdn_test.cc's bounds.
// No GPU needed: this keeps the kernels' indexing, fragment layouts, chunk and node walks, stages
// and barrier protocol under CI, for every path (the TMA walks at dk 128, the mma walks, the
// CUDA-core walks at dk not a multiple of 16, the 128 x 128 instantiations). The emulated shared
// memory starts as NaN and a copy lands only at its wait, so a read of rows a kernel never loaded
// or read too early shows; run with copies landing at issue instead, a refill of a stage still
// being read shows, also across the blocks of a cluster (which the emulator runs as far apart as
// their barriers allow). Timing races are out of its reach (scripts/device/gdn_variants.sh runs
// compute-sanitizer on the GPU).
#include "tests/ops_cuda_attention/warp_emulator.h"
#include "tests/ops_cuda_attention/wgmma_emulator.h"
#include "tests/ops_cuda_attention/mma_emulator.h"
// The kernels, compiled for the host against the emulators' primitives.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/gdn_rows.cuh"
#include "ops/cuda/gdn_rule.cuh"

#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/gdn.h"
#include "tests/ops_cuda/gdn_cases.h"

namespace tt::cuda_test {
namespace {

// Runs gdn_rows.cuh's and gdn_rule.cuh's sequences on the emulator; host memory stands for
// device memory.
struct EmuRunner {
  int launches = 0;
  std::vector<dim3> grids;  // each launch's (the walks' lanes and columns: bf16_walk_grid)
  template <class... P, class... A>
  void launch(void (*kernel)(P...), dim3 grid, int block, size_t smem, const A&... args) {
    // The dynamic shared memory 16 bytes past a 1024-byte boundary, as the walks' static mbarriers
    // (16 bytes) put it on the GPU: their TMA tiles must align themselves.
    cuda::emu::dynamic_smem_offset() = 16;
    EXPECT_LE(cuda::emu::dynamic_smem_offset() + smem, 227u * 1024)
        << "shared memory past the H200's 227 KiB a block";
    cuda::emu::launch(kernel, grid, dim3(block), smem, args...);
    ++launches;
    grids.push_back(grid);
  }
  void zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
  template <class T>
  CUtensorMap map(const T* base, int64_t rows, int heads, int cols, int box_cols, int box_rows) {
    return cuda::emu::tensor_map_3d(base, (int)sizeof(T), rows, heads, cols, box_cols, box_rows);
  }
};

std::vector<bf16> bf16s(const std::vector<double>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16_rn((float)x[i]);
  return y;
}
std::vector<float> floats(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }
template <class T>
std::vector<double> doubles(const std::vector<T>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (double)(float)x[i];
  return y;
}

// Host memory standing for a device workspace, 256-byte aligned as the allocator's blocks are,
// every byte 0xff (a NaN in fp32 and in bf16): scratch a kernel reads before any kernel wrote it
// (e.g. -W's low plane, which the bf16 prep leaves unwritten) would reach the outputs.
struct HostWorkspace {
  std::vector<char> raw;
  cuda::Workspace ws;
  explicit HostWorkspace(size_t bytes) : raw(bytes + 256, (char)0xff) {
    ws = cuda::Workspace{raw.data() + (256 - reinterpret_cast<uintptr_t>(raw.data()) % 256) % 256, bytes};
  }
};

// A case's inputs in host memory as the kernels read them, and the plan referring to its tables.
struct EmuCase : RuleInputs {
  std::vector<int32_t> tables;
  std::vector<bf16> bq, bk, bv, bb;
  std::vector<float> fg;
  EmuCase(uint64_t seed, std::mt19937_64& rng, RuleShape shape)
      : RuleInputs(seed, /*budget=*/3, /*max_len=*/20, /*extra_root=*/true, rng, shape), tables(plan.host_tables()) {
    plan.refer_to(tables.data());
    bq = bf16s(q), bk = bf16s(k), bv = bf16s(v), bb = bf16s(beta), fg = floats(g);
  }
};

// One forward (end states kept) and one backward (not accumulating) of a case on the emulator;
// init and dE may be empty (zeros, none). Outputs start as NaN, d_init as zeros (it is added to).
// dq, dk and dv are written `offset` elements into their buffers (1: two bytes off alignment).
struct EmuOut {
  std::vector<bf16> o, dq, dk, dv;
  std::vector<float> end, dg, db, di;
  int forward_launches = 0, backward_launches = 0;
  std::vector<dim3> forward_grids, backward_grids;
};
EmuOut emulate(const EmuCase& c, const std::vector<float>& init, const std::vector<bf16>& dO,
               const std::vector<float>& dE, size_t offset = 0,
               cuda::GdnProducts products = cuda::GdnProducts::kExact) {
  const int nk = c.nk, nv = c.nv, dk = c.dk, dv = c.dv, N = c.N;
  const bf16 nan16 = __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto or_null = [](const std::vector<float>& x) { return x.empty() ? nullptr : x.data(); };
  EmuOut r;
  r.o.assign((size_t)N * nv * dv, nan16);
  r.end.assign((size_t)c.f.nodes() * c.state_elems(), nan);
  {
    HostWorkspace ws(cuda::gdn_forward_workspace_bytes(c.plan, nv, dk, dv, /*end_given=*/true, products));
    EmuRunner run;
    cuda::rule_forward(run, r.o.data(), r.end.data(), c.bq.data(), c.bk.data(), c.bv.data(), c.fg.data(), c.bb.data(),
                       or_null(init), c.plan, nk, nv, dk, dv, c.scale, ws.ws, products);
    r.forward_launches = run.launches;
    r.forward_grids = run.grids;
  }
  r.dq.assign(offset + c.q.size(), nan16), r.dk.assign(offset + c.k.size(), nan16),
      r.dv.assign(offset + c.v.size(), nan16);
  r.dg.assign(c.g.size(), nan), r.db.assign(c.beta.size(), nan), r.di.assign(init.size(), 0.f);
  HostWorkspace ws(cuda::gdn_backward_workspace_bytes(c.plan, nv, dk, dv, products));
  EmuRunner run;
  cuda::rule_backward(run, r.dq.data() + offset, r.dk.data() + offset, r.dv.data() + offset, r.dg.data(), r.db.data(),
                      init.empty() ? nullptr : r.di.data(), dO.data(), or_null(dE), c.bq.data(), c.bk.data(),
                      c.bv.data(), c.fg.data(), c.bb.data(), or_null(init), c.plan, nk, nv, dk, dv, c.scale, ws.ws,
                      /*accumulate=*/false, products);
  r.backward_launches = run.launches;
  r.backward_grids = run.grids;
  for (std::vector<bf16>* x : {&r.dq, &r.dk, &r.dv}) x->erase(x->begin(), x->begin() + offset);
  return r;
}

// check_shape's case and inputs from its seed: the case (EmuCase, from a generator seeded seed x
// 41), then from the same generator the roots' initial states, dO and the end states' gradients.
struct ShapeInputs {
  std::mt19937_64 rng;
  const EmuCase c;
  std::vector<double> init, dO, dE;
  ShapeInputs(uint64_t seed, const RuleShape& shape) : rng(seed * 41), c(seed, rng, shape) {
    init = randn_f32(rng, (size_t)c.roots * c.state_elems(), 0.1);
    dO = randn_bf16(rng, (size_t)c.N * c.nv * c.dv);
    dE = randn_f32(rng, (size_t)c.f.nodes() * c.state_elems(), 0.05);
  }
};

// Forward and backward of one shape against the oracle, with gdn_test.cc's bounds: o within
// close_bf16, end states (fp32) normwise 1e-4; the bf16 gradients normwise 2 x 2^-8, the fp32 ones
// (dg, dbeta, d_init) 1e-3; with GdnProducts::kBf16, gdn_test.cc's kBf16Products bound for every
// output. Each pass launches a fixed number of kernels whatever the tree.
// copies_at_issue: TMA and cp.async copies land when issued (a refill of a stage, or a prefetch
// into shared memory, that a block still reads would show) instead of at the wait (a read before
// it would).
EmuOut check_shape(uint64_t seed, RuleShape shape, bool copies_at_issue = false,
                   cuda::GdnProducts products = cuda::GdnProducts::kExact) {
  const cuda::emu::CopiesLanding landing(copies_at_issue);
  const ShapeInputs in(seed, shape);
  const EmuCase& c = in.c;
  const std::vector<double> &init = in.init, &dO = in.dO, &dE = in.dE;
  const int nv = c.nv, dk = c.dk, dv = c.dv, N = c.N;
  const bool b16 = products == cuda::GdnProducts::kBf16;
  const std::string at = " (dk " + std::to_string(dk) + ", dv " + std::to_string(dv) + (b16 ? ", bf16 products)" : ")");
  const EmuOut got = emulate(c, floats(init), bf16s(dO), floats(dE), 0, products);

  std::vector<double> o((size_t)N * nv * dv), end((size_t)c.f.nodes() * c.state_elems());
  cpu::gdn_tree_forward<double>(o.data(), end.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(),
                                init.data(), c.t);
  // The walk writes o itself at dk a multiple of 16 (no output kernel); the bf16 walks on warpgroup
  // MMA (dk 128; the forward's where dv is a multiple of 64) launch once a level of paths.
  const int levels = (int)c.plan.levels().size(), walks = b16 && dk == 128 && dv % 64 == 0 ? levels : 1,
            reverse_walks = b16 && dk == 128 ? levels : 1;
  EXPECT_EQ(got.forward_launches, 1 + walks + (dk % 16 == 0 ? 0 : 1)) << "forward launches" << at;
  const double e = rel_l2(doubles(got.end), end), e_o = rel_l2(doubles(got.o), o);
  if (b16) {
    EXPECT_LE(e_o, kBf16Products) << "o" << at;
    EXPECT_LE(e, kBf16Products) << "end states" << at;
  } else {
    EXPECT_TRUE(close_bf16("emulated delta rule o" + at, doubles(got.o), o));
    EXPECT_LE(e, 1e-4) << "end states" << at;
  }
  std::printf("[ errors   ] emulated delta rule forward%s: o rel L2 %.2e, end states rel L2 %.2e\n", at.c_str(), e_o, e);

  std::vector<double> dq(c.q.size(), 0.0), dk_(c.k.size(), 0.0), dv_(c.v.size(), 0.0), dg(c.g.size(), 0.0),
      db(c.beta.size(), 0.0), di(init.size(), 0.0);
  cpu::gdn_tree_backward<double>(dq.data(), dk_.data(), dv_.data(), dg.data(), db.data(), di.data(), dO.data(),
                                 dE.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), init.data(),
                                 c.t);
  // prep, walk, reverse walk, state products, input gradients (with the key heads' sums); the
  // reverse walk takes the dO terms itself at dk a multiple of 16 (else a local kernel).
  EXPECT_EQ(got.backward_launches, 3 + walks + reverse_walks + (dk % 16 == 0 ? 0 : 1)) << "backward launches" << at;
  const double e_dq = rel_l2(doubles(got.dq), dq), e_dk = rel_l2(doubles(got.dk), dk_),
               e_dv = rel_l2(doubles(got.dv), dv_), e_dg = rel_l2(doubles(got.dg), dg),
               e_db = rel_l2(doubles(got.db), db), e_di = rel_l2(doubles(got.di), di);
  expect_rule_grads(b16, e_dq, e_dk, e_dv, e_dg, e_db, at);
  EXPECT_LE(e_di, b16 ? kBf16Products : 1e-3) << "d_init" << at;
  std::printf("[ errors   ] emulated delta rule backward%s: rel L2 dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e "
              "d_init %.2e\n",
              at.c_str(), e_dq, e_dk, e_dv, e_dg, e_db, e_di);
  return got;
}

// dk = dv = 128: the walks' stages by TMA, the 128 x 128 output and grad kernels; two key heads of
// two value heads each.
TEST(GdnEmulated, DeltaRuleAtHeadDim128) { check_shape(1, RuleShape{2, 4, 128, 128}); }

// GdnProducts::kBf16: the walks' one-mma products (the TMA walks at dk 128, the cp.async ones at
// dk 64), within kBf16Products of the oracle; and not kExact's bits, forward and backward (the
// option reaches both); at dk 72 (CUDA-core walks) kExact's bits.
TEST(GdnEmulated, DeltaRuleWithBf16Products) {
  for (const auto& [seed, shape] : {std::pair<uint64_t, RuleShape>{1, RuleShape{2, 4, 128, 128}},
                                    {2, RuleShape{1, 2, 64, 64}}}) {
    const EmuOut b16 = check_shape(seed, shape, false, cuda::GdnProducts::kBf16);
    const EmuOut exact = check_shape(seed, shape);
    const std::string at = ", dk " + std::to_string(shape.dk);
    EXPECT_GT(bits_differ(b16.o, exact.o, b16.o.size()), 0u) << "o" << at;
    EXPECT_GT(bits_differ(b16.end, exact.end, b16.end.size()), 0u) << "end states" << at;
    EXPECT_GT(bits_differ(b16.dq, exact.dq, b16.dq.size()), 0u) << "dq" << at;
    EXPECT_GT(bits_differ(b16.dk, exact.dk, b16.dk.size()), 0u) << "dk" << at;
    EXPECT_GT(bits_differ(b16.dv, exact.dv, b16.dv.size()), 0u) << "dv" << at;
    EXPECT_GT(bits_differ(b16.dg, exact.dg, b16.dg.size()), 0u) << "dg" << at;
  }
  check_shape(6, RuleShape{1, 2, 128, 128, 6.0}, false, cuda::GdnProducts::kBf16);
  // Groups of four and of one value heads a key head: the grad kernel's running sums in rows of
  // their own, indexed by key head (RuleBwdParams::run_heads), over four heads and over none.
  check_shape(9, RuleShape{2, 8, 128, 128}, false, cuda::GdnProducts::kBf16);
  check_shape(10, RuleShape{2, 2, 64, 64}, false, cuda::GdnProducts::kBf16);
  // dv 96 at dk 128: the prep computes U and the walks run on mma.sync (no 64-column box of v), the
  // reverse walk on warpgroup MMA over the plan's paths at 32 columns (three column blocks).
  check_shape(11, RuleShape{2, 4, 128, 96}, false, cuda::GdnProducts::kBf16);
  // At dk not a multiple of 16 the walks and the state products run exactly either way.
  const EmuOut b16 = check_shape(3, RuleShape{1, 2, 72, 32}, false, cuda::GdnProducts::kBf16),
               exact = check_shape(3, RuleShape{1, 2, 72, 32});
  EXPECT_EQ(bits_differ(b16.dq, exact.dq, b16.dq.size()), 0u) << "dq, dk 72";
  EXPECT_EQ(bits_differ(b16.dg, exact.dg, b16.dg.size()), 0u) << "dg, dk 72";
}
// The same with every copy landing when issued: the walks must not refill a stage still read (both
// product modes: the bf16 walks at dk 128 are rule_walk_wgmma_kernel).
TEST(GdnEmulated, DeltaRuleAtHeadDim128WithCopiesLandingAtIssue) {
  check_shape(1, RuleShape{2, 4, 128, 128}, /*copies_at_issue=*/true);
  check_shape(1, RuleShape{2, 4, 128, 128}, /*copies_at_issue=*/true, cuda::GdnProducts::kBf16);
}

// Decays down to -6 a row (gdn_test's backward seed 10): a chunk's summed decay passes -88, where
// e^88 overflows fp32, so the kernels' decay factors must stay inside their masks (0 x inf = NaN).
TEST(GdnEmulated, DeltaRuleWithDecaysPastTheFp32Range) { check_shape(6, RuleShape{1, 2, 128, 128, 6.0}); }

// dk 64, dv 64: the walks' stages by cp.async, the general output and grad kernels.
TEST(GdnEmulated, DeltaRuleAtHeadDim64) { check_shape(2, RuleShape{1, 2, 64, 64}); }

// dk 112: the forward walk's cp.async stage at its largest (rows dk + 8 apart, q and the scores
// staged: 219,648 bytes of shared memory); dk 32: two warps hold state rows, six only v_new's.
TEST(GdnEmulated, DeltaRuleAtKeyDim112) { check_shape(7, RuleShape{1, 2, 112, 64}); }
TEST(GdnEmulated, DeltaRuleAtKeyDim32) { check_shape(8, RuleShape{2, 4, 32, 32}); }

// dk 72 (not a multiple of the products' depth 16): the walks on CUDA cores; dv 32, one walk column block.
TEST(GdnEmulated, DeltaRuleAtKeyDim72) { check_shape(3, RuleShape{1, 2, 72, 32}); }

// dk 128 with dv 64: TMA stages whose boxes of U and dv_new cover half of a 128-column block.
TEST(GdnEmulated, DeltaRuleAtKeyDim128ValueDim64) { check_shape(4, RuleShape{2, 4, 128, 64}); }

// A pack of five trees (separate sequences, branching trees, a fan of five answers) through the
// bf16 walks' paths (GdnPlan::levels): the heaviest path of each tree side by side in the first
// level's launch, the light subtrees in the second's, each at 64 state columns (bf16_walk_grid),
// at dv 128 and 64, within the oracle's bounds; and the trees holding a path that skips a lighter
// first child (tree 2) and a node whose state gradient sums five children's (tree 4) give bit for
// bit the outputs, end states and gradients of the same tree packed alone (its paths then one a
// level at 32 columns, but tree 4's answers): no lane reads or writes another's rows, states or
// gradients.
TEST(GdnEmulated, PathsWalkSideBySide) {
  const std::vector<std::pair<int, int>> trees[] = {
      {{-1, 70}, {0, 64}, {1, 1}, {0, 30}},           // paths 0 1 2 (4 chunks), 3 (1)
      {{-1, 100}, {0, 3}},                            // 0 1 (3)
      {{-1, 1}, {0, 64}, {0, 5}, {2, 40}},            // 0 2 3 (3), 1 (1)
      {{-1, 130}},                                    // 0 (3)
      {{-1, 64}, {0, 64}, {0, 40}, {0, 64}, {0, 30}, {0, 64}},  // 0 1 (2), 2, 3, 4, 5 (1 each)
  };
  std::vector<std::pair<int, int>> forest;
  std::vector<int> first_node, first_row;
  int rows = 0;
  for (const auto& t : trees) {
    first_node.push_back((int)forest.size()), first_row.push_back(rows);
    for (const auto& [parent, len] : t) {
      forest.emplace_back(parent < 0 ? -1 : first_node.back() + parent, len);
      rows += len;
    }
  }
  first_node.push_back((int)forest.size()), first_row.push_back(rows);
  for (const int dv : {128, 64}) {
    const RuleShape shape{2, 4, 128, dv, 0.6, forest};
    const ShapeInputs in(21, shape);  // check_shape's case and inputs
    const EmuCase& c = in.c;
    ASSERT_EQ(c.plan.levels().size(), 2u);
    const cuda::GdnPlan::Level l0 = c.plan.levels()[0], l1 = c.plan.levels()[1];
    EXPECT_EQ(l0.paths, 5);
    EXPECT_EQ(l0.chunks, 15);
    EXPECT_EQ(l0.max_path_chunks, 4);
    EXPECT_EQ(l1.paths, 6);
    EXPECT_EQ(l1.chunks, 6);
    const EmuOut all = check_shape(21, shape, /*copies_at_issue=*/true, cuda::GdnProducts::kBf16);
    const std::string at = ", dv " + std::to_string(dv);
    // The walks' launches (z > 1): the forward walk's two levels, 5 and 6 lanes; in the backward
    // the walk again's and the reverse walk's; each at 64 columns (nv 4 heads x dv / 64 blocks a lane).
    for (const auto* grids : {&all.forward_grids, &all.backward_grids}) {
      std::vector<unsigned> lanes;
      for (const dim3& g : *grids)
        if (g.z > 1) {
          lanes.push_back(g.z);
          EXPECT_TRUE(g.x == 4u && g.y == (unsigned)dv / 64) << g.x << " x " << g.y << at;
        }
      const std::vector<unsigned> want =
          grids == &all.forward_grids ? std::vector<unsigned>{5, 6} : std::vector<unsigned>{5, 6, 6, 5};
      EXPECT_EQ(lanes, want) << at;
    }
    // The same inputs, each tree's rows alone.
    const std::vector<double> &init = in.init, &dO = in.dO, &dE = in.dE;
    for (const int t : {2, 4}) {
      const int n0 = first_node[t], n1 = first_node[t + 1], r0 = first_row[t], r1 = first_row[t + 1];
      std::vector<std::pair<int, int>> alone;
      for (int n = n0; n < n1; ++n)
        alone.emplace_back(forest[n].first < 0 ? -1 : forest[n].first - n0, forest[n].second);
      std::mt19937_64 rng2(0);
      EmuCase a(21, rng2, RuleShape{2, 4, 128, dv, 0.6, alone});
      const size_t nv = c.nv, nk = c.nk, dk = c.dk, SS = c.state_elems();
      auto rows_of = [&](const auto& x, size_t width) {
        return std::remove_cv_t<std::remove_reference_t<decltype(x)>>(x.begin() + r0 * width, x.begin() + r1 * width);
      };
      a.q = rows_of(c.q, nk * dk), a.k = rows_of(c.k, nk * dk), a.v = rows_of(c.v, nv * dv);
      a.g = rows_of(c.g, nv), a.beta = rows_of(c.beta, nv);
      a.bq = rows_of(c.bq, nk * dk), a.bk = rows_of(c.bk, nk * dk), a.bv = rows_of(c.bv, nv * dv);
      a.bb = rows_of(c.bb, nv), a.fg = rows_of(c.fg, nv);
      const std::vector<double> init_t(init.begin() + t * SS, init.begin() + (t + 1) * SS);
      const std::vector<double> dE_t(dE.begin() + n0 * SS, dE.begin() + n1 * SS);
      const EmuOut one = emulate(a, floats(init_t), rows_of(bf16s(dO), nv * dv), floats(dE_t), 0,
                                 cuda::GdnProducts::kBf16);
      const std::string tree = at + ", tree " + std::to_string(t);
      for (const auto* grids : {&one.forward_grids, &one.backward_grids}) {
        unsigned most = 0;
        for (const dim3& g : *grids) most = std::max(most, g.z);
        EXPECT_EQ(most, t == 4 ? 4u : 1u) << tree;  // tree 4's four light answers side by side
      }
      auto same = [&](const auto& batch, const auto& alone_x, size_t from, const char* name) {
        EXPECT_EQ(bits_differ(std::vector(batch.begin() + from, batch.begin() + from + alone_x.size()), alone_x,
                              alone_x.size()),
                  0u)
            << name << tree;
      };
      same(all.o, one.o, r0 * nv * dv, "o");
      same(all.end, one.end, n0 * SS, "end states");
      same(all.dq, one.dq, r0 * nk * dk, "dq");
      same(all.dk, one.dk, r0 * nk * dk, "dk");
      same(all.dv, one.dv, r0 * nv * dv, "dv");
      same(all.dg, one.dg, r0 * nv, "dg");
      same(all.db, one.db, r0 * nv, "dbeta");
      same(all.di, one.di, t * SS, "d_init");
    }
  }
}

// The plan's paths (GdnPlan::levels, Device path_chunk0, node_child0, node_child): each node's
// path goes on to its child with the most chunks below it (the first of equals), whatever its place
// among the children; the chunks numbered path by path, a level's paths longest first, ties in
// packed order; an empty batch has no tables.
TEST(GdnEmulated, PlanPathsFollowTheHeaviestChild) {
  auto plan_of = [](const std::vector<std::pair<int, int>>& nodes) {
    std::vector<int32_t> start, len, parent;
    int32_t row = 0;
    for (const auto& [p, l] : nodes) start.push_back(row), len.push_back(l), parent.push_back(p), row += l;
    cuda::GdnPlan plan;
    plan.make(start.data(), len.data(), parent.data(), (int)nodes.size());
    return plan;
  };
  // Node 0 (rows 0-64, two chunks), 1 (65-74), 2 (75-79: a light first child), 3 (80-179: the
  // heavy one, two chunks), 4 (180), root 5 (181-183), 6 (184-313, three chunks).
  const cuda::GdnPlan plan = plan_of({{-1, 65}, {0, 10}, {1, 5}, {1, 100}, {0, 1}, {-1, 3}, {5, 130}});
  const std::vector<int32_t>& t = plan.host_tables();
  const int chunks = plan.num_chunks(), nodes = plan.num_nodes();
  ASSERT_EQ(chunks, 11);
  auto table = [&](int at, int n) { return std::vector<int32_t>(t.begin() + at, t.begin() + at + n); };
  // Paths: 0 1 3 (5 chunks), 5 6 (4), then 2 and 4 (1 each, packed order).
  EXPECT_EQ(table(0, chunks), (std::vector<int32_t>{0, 64, 65, 80, 144, 181, 184, 248, 312, 75, 180})) << "chunk_row0";
  EXPECT_EQ(table(2 * chunks, chunks), (std::vector<int32_t>{0, 0, 1, 3, 3, 5, 6, 6, 6, 2, 4})) << "chunk_node";
  EXPECT_EQ(table(3 * chunks, chunks), (std::vector<int32_t>{1, 2, 3, 1, 2, 3, 1, 0, 2, 3, 3})) << "chunk_flags";
  const int after = 4 * chunks + 2 * nodes;
  EXPECT_EQ(table(after, 5), (std::vector<int32_t>{0, 5, 9, 10, 11})) << "path_chunk0";
  EXPECT_EQ(table(after + 5, nodes + 1), (std::vector<int32_t>{0, 2, 4, 4, 4, 4, 5, 5})) << "node_child0";
  EXPECT_EQ(table(after + 5 + nodes + 1, 5), (std::vector<int32_t>{1, 4, 2, 3, 6})) << "node_child";
  ASSERT_EQ(plan.levels().size(), 2u);
  EXPECT_EQ(plan.levels()[0].path0, 0);
  EXPECT_EQ(plan.levels()[0].paths, 2);
  EXPECT_EQ(plan.levels()[0].chunks, 9);
  EXPECT_EQ(plan.levels()[0].max_path_chunks, 5);
  EXPECT_EQ(plan.levels()[1].path0, 2);
  EXPECT_EQ(plan.levels()[1].paths, 2);
  // One-row nodes, every node a chunk and all but one answer a path of its own: make's table bound
  // (max_table_bytes, which the model sizes its plan storage by) holds, or make throws.
  std::vector<std::pair<int, int>> fan = {{-1, 1}};
  for (int i = 0; i < 50; ++i) fan.emplace_back(0, 1);
  const cuda::GdnPlan wide = plan_of(fan);
  ASSERT_EQ(wide.levels().size(), 2u);
  EXPECT_EQ(wide.levels()[1].paths, 49);  // the first answer continues the root's path
  const cuda::GdnPlan empty = plan_of({});
  EXPECT_EQ(empty.table_bytes(), 0u);
  EXPECT_TRUE(empty.levels().empty());
}

// A level of more than 65,535 paths (gridDim.z's bound) launches in pieces: for_each_walk_launch
// on a fan of 140,000 one-row answers (level 1: 139,999 paths) and 70,000 one-row sequences
// beside it (level 0: 70,001 paths) hands out each level's paths once, in order, at most 65,535
// a launch, the levels first to last (last to first in reverse).
TEST(GdnEmulated, WalkLaunchesSplitLevelsPastTheGridBound) {
  std::vector<int32_t> start, len, parent;
  auto node = [&](int32_t p) { start.push_back((int32_t)start.size()), len.push_back(1), parent.push_back(p); };
  node(-1);
  for (int i = 0; i < 140000; ++i) node(0);
  for (int i = 0; i < 70000; ++i) node(-1);
  cuda::GdnPlan plan;
  plan.make(start.data(), len.data(), parent.data(), (int)start.size());
  ASSERT_EQ(plan.levels().size(), 2u);
  ASSERT_EQ(plan.levels()[0].paths, 70001);
  ASSERT_EQ(plan.levels()[1].paths, 139999);
  for (const bool reverse : {false, true}) {
    std::vector<std::pair<int, int>> got;  // (path0, lanes)
    cuda::for_each_walk_launch(plan, reverse, [&](const cuda::GdnPlan::Level& l, int path0, int lanes) {
      EXPECT_TRUE(path0 >= l.path0 && path0 + lanes <= l.path0 + l.paths) << path0 << " + " << lanes;
      got.emplace_back(path0, lanes);
    });
    std::vector<std::pair<int, int>> want;
    const int l1 = 70001, end = 70001 + 139999;
    auto level = [&](int from, int to) {
      for (int p = from; p < to; p += 65535) want.emplace_back(p, std::min(65535, to - p));
    };
    if (reverse) level(l1, end), level(0, l1);
    else level(0, l1), level(l1, end);
    EXPECT_EQ(got, want) << (reverse ? "reverse" : "forward");
  }
}

// The same on a batch of 36 rows: every TMA box runs past the tensors' end (zeros there).
TEST(GdnEmulated, DeltaRuleOnABatchShorterThanAChunk) {
  check_shape(5, RuleShape{1, 2, 128, 64, 0.6, {{-1, 20}, {0, 7}, {-1, 9}}});
}

// gdn_test's DeltaRuleNodesDoNotReadTheNextNodesRows on the CPU: with the second node's q, k and v
// NaN, the first node's outputs, end state and input gradients are bit for bit those of the
// all-finite batch. The emulated TMA stages, like the GPU's, hold the next node's rows past a
// chunk's end; dk 64 loads by cp.async (rows past the end zero-filled). Both product modes (the
// bf16 kernels stage their own layouts).
TEST(GdnEmulated, NodesDoNotReadTheNextNodesRows) {
  for (const cuda::GdnProducts products : {cuda::GdnProducts::kExact, cuda::GdnProducts::kBf16})
    for (const int dk : {128, 64}) {
      SCOPED_TRACE(std::string(products == cuda::GdnProducts::kBf16 ? "bf16" : "exact") + " products, dk " +
                   std::to_string(dk));
      std::mt19937_64 rng(dk);
      EmuCase c(0, rng, next_node_shape(dk));
      const int nk = c.nk, nv = c.nv, dv = c.dv, first = c.f.len[0];
      ASSERT_EQ(c.f.start[1], first);
      const std::vector<bf16> dO = bf16s(randn_bf16(rng, (size_t)c.N * nv * dv));
      const EmuOut finite = emulate(c, {}, dO, {}, 0, products);
      const bf16 nan16 = __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN());
      std::fill(c.bq.begin() + (size_t)first * nk * dk, c.bq.end(), nan16);
      std::fill(c.bk.begin() + (size_t)first * nk * dk, c.bk.end(), nan16);
      std::fill(c.bv.begin() + (size_t)first * nv * dv, c.bv.end(), nan16);
      const EmuOut poisoned = emulate(c, {}, dO, {}, 0, products);
      expect_first_node_equal(finite, poisoned, first, nk, nv, dk, dv, c.state_elems());
    }
}

// dq, dk and dv two bytes past a 16-byte boundary: the grad kernel's group sums store dq and dk a
// bf16 at a time (the pair stores take 4 bytes; the build's UBSan alignment check would stop a
// misaligned access), with the same sums in the same order, so the same bits as the aligned call's
// (gdn_test checks dq and dk on the GPU); it writes dv a bf16 at a time too.
TEST(GdnEmulated, OddGradientAddressesGiveTheSameBits) {
  std::mt19937_64 rng(7);
  const EmuCase c(7, rng, RuleShape{2, 4, 64, 64, 0.6, {{-1, 70}, {0, 9}, {0, 1}, {-1, 30}}});
  const std::vector<bf16> dO = bf16s(randn_bf16(rng, (size_t)c.N * c.nv * c.dv));
  const EmuOut aligned = emulate(c, {}, dO, {}), odd = emulate(c, {}, dO, {}, /*offset=*/1);
  EXPECT_EQ(bits_differ(aligned.dq, odd.dq, aligned.dq.size()), 0u) << "dq";
  EXPECT_EQ(bits_differ(aligned.dk, odd.dk, aligned.dk.size()), 0u) << "dk";
  EXPECT_EQ(bits_differ(aligned.dv, odd.dv, aligned.dv.size()), 0u) << "dv";
  EXPECT_EQ(bits_differ(aligned.dg, odd.dg, aligned.dg.size()), 0u) << "dg";
}

// The bf16 kernels' workspaces: no U where the walks take U = T diag(beta) v themselves (dk 128, dv
// a multiple of 64), and the backward's buffers they hand each other in bf16 (v_new, the entering
// states, dvn, their gradients, dW, S dO, dS v_new) half size, the grad kernel's fp32 running sums
// then in rows of their own ((N, nk, dk), carved for nk up to nv / 2); exact sizes otherwise (dk
// not a multiple of 16). The workspace carves each buffer at a 256-byte boundary.
TEST(GdnEmulated, Bf16WorkspacesHoldOnlyWhatTheBf16KernelsUse) {
  std::mt19937_64 rng(11);
  const EmuCase c(11, rng, RuleShape{2, 4, 128, 128});
  const auto kB = cuda::GdnProducts::kBf16;
  const auto carved = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t rows = (size_t)c.N * c.nv, chunks = (size_t)c.plan.num_chunks() * c.nv;
  for (const auto& [dk, dv] : {std::pair{128, 128}, {128, 64}, {128, 96}, {64, 64}, {72, 32}}) {
    const bool b16 = dk % 16 == 0, takes_u = b16 && dk == 128 && dv % 64 == 0;
    const size_t u = takes_u ? carved(rows * dv * 4) : 0;
    size_t halved = 0;  // v_new, sin, dvn, dsout, db2, gq, gk: fp32 -> bf16
    for (const size_t bytes : {rows * dv * 4, chunks * dk * dv * 4, rows * dv * 4, chunks * dk * dv * 4, rows * dk * 4,
                               rows * dk * 4, rows * dk * 4})
      halved += b16 ? carved(bytes) - carved(bytes / 2) : 0;
    const size_t sums = b16 ? 2 * carved(rows * dk * 2) : 0;  // the running sums: (N, nv / 2, dk) fp32 each
    const std::string at = ", dk " + std::to_string(dk) + " dv " + std::to_string(dv);
    EXPECT_EQ(cuda::gdn_forward_workspace_bytes(c.plan, c.nv, dk, dv, true) -
                  cuda::gdn_forward_workspace_bytes(c.plan, c.nv, dk, dv, true, kB),
              u)
        << "forward" << at;
    EXPECT_EQ(cuda::gdn_backward_workspace_bytes(c.plan, c.nv, dk, dv) -
                  cuda::gdn_backward_workspace_bytes(c.plan, c.nv, dk, dv, kB),
              u + halved - sums)
        << "backward" << at;
  }
}

// ---- The row ops ----

// gdn_test's PathPrevAndConvMatchTheCpuOnAwkwardTrees: path_prev exact; the conv's forward, its
// input gradient added to and overwritten, its weight gradient (kernel widths 4, 6 and 20: the
// weight gradient's 4, 8 and 64-tap register variants) on the chain-and-fan forest.
TEST(GdnEmulated, PathPrevAndConvOnAwkwardTrees) {
  for (uint64_t seed : {1, 2, 3}) {
    const ConvCase c(seed);
    const Forest& f = c.f;
    const int N = c.N, C = c.C, K = c.K;
    std::vector<int32_t> got_prev(N, -7);
    EmuRunner run;
    cuda::path_prev_on(run, got_prev.data(), f.start.data(), f.len.data(), f.parent.data(), f.nodes());
    ASSERT_EQ(got_prev, c.prev) << "seed " << seed;

    const std::vector<bf16> bx = bf16s(c.x), bw = bf16s(c.w);
    std::vector<bf16> got_out((size_t)N * C);
    cuda::conv_forward_on(run, got_out.data(), bx.data(), bw.data(), c.prev.data(), N, C, K);
    EXPECT_TRUE(close_bf16("conv forward", doubles(got_out), c.out));

    const std::vector<bf16> bdout = bf16s(c.dout);
    std::vector<bf16> got_dx = bf16s(c.dx0);
    std::vector<float> got_dw = floats(c.dw0);
    HostWorkspace ws(cuda::conv1d_silu_backward_workspace_bytes(N, C, K));
    cuda::conv_backward_on(run, got_dx.data(), got_dw.data(), bdout.data(), bx.data(), bw.data(), c.prev.data(),
                           f.pos.data(), f.subtree_end.data(), N, C, K, ws.ws, /*accumulate=*/true);
    EXPECT_TRUE(close_bf16("conv dx (accumulated)", doubles(got_dx), c.dx));
    EXPECT_TRUE(close_f32_sum("conv dw", doubles(got_dw), c.dw));

    std::vector<float> got_dx32((size_t)N * C, std::numeric_limits<float>::quiet_NaN());  // the fp32 instantiation
    cuda::conv_backward_on(run, got_dx32.data(), (float*)nullptr, bdout.data(), bx.data(), bw.data(), c.prev.data(),
                           f.pos.data(), f.subtree_end.data(), N, C, K, ws.ws, /*accumulate=*/false);
    // An fp32 output (no bf16 rounding): normwise 1e-4, as the fp32 sums (at most K terms a row).
    EXPECT_TRUE(close_f32_sum("conv dx (overwritten, fp32)", doubles(got_dx32), c.dx_only));
  }
}

// gdn_test's NormsMatchTheCpu: the L2 norm and the gated RMSNorm, forward (rstd within 1e-6) and
// backward (dx added to; the gated norm's dz, and dw by partial sums).
TEST(GdnEmulated, Norms) {
  const NormsCase c;
  const int rows = c.rows, D = c.D;
  const std::vector<bf16> bx = bf16s(c.x), bz = bf16s(c.z), bw = bf16s(c.w), bdy = bf16s(c.dy);
  std::vector<bf16> got_y((size_t)rows * D);
  std::vector<float> got_rstd(rows);
  EmuRunner run;

  cuda::l2norm_forward_on(run, got_y.data(), got_rstd.data(), bx.data(), rows, D, c.eps);
  EXPECT_TRUE(close_bf16("l2norm forward", doubles(got_y), c.l2_y));
  EXPECT_TRUE(all_within("l2norm rstd", doubles(got_rstd), c.l2_rstd, 1e-6, {}));
  std::vector<bf16> got_dx = bf16s(c.dx0);
  cuda::l2norm_backward_on(run, got_dx.data(), bdy.data(), bx.data(), got_rstd.data(), rows, D, /*accumulate=*/true);
  EXPECT_TRUE(close_bf16("l2norm dx", doubles(got_dx), c.l2_dx));

  cuda::gated_rmsnorm_forward_on(run, got_y.data(), got_rstd.data(), bx.data(), bz.data(), bw.data(), rows, D, c.eps);
  EXPECT_TRUE(close_bf16("gated rmsnorm forward", doubles(got_y), c.gated_y));
  EXPECT_TRUE(all_within("gated rmsnorm rstd", doubles(got_rstd), c.gated_rstd, 1e-6, {}));
  got_dx = bf16s(c.dx0);
  std::vector<bf16> got_dz = bf16s(c.dz0);
  std::vector<float> got_dw = floats(c.dw0);
  HostWorkspace ws(cuda::gated_rmsnorm_backward_workspace_bytes(rows, D));
  cuda::gated_rmsnorm_backward_on(run, got_dx.data(), got_dz.data(), got_dw.data(), bdy.data(), bx.data(), bz.data(),
                                  bw.data(), got_rstd.data(), rows, D, ws.ws, /*accumulate=*/true);
  EXPECT_TRUE(close_bf16("gated rmsnorm dx", doubles(got_dx), c.gated_dx));
  EXPECT_TRUE(close_bf16("gated rmsnorm dz", doubles(got_dz), c.gated_dz));
  EXPECT_TRUE(close_f32_sum("gated rmsnorm dw", doubles(got_dw), c.gated_dw));
}

// gdn_test's GatesMatchTheCpu: g (fp32) and beta; da, db and the partial sums of dA_log and
// ddt_bias. g's bound is gdn_test's 64 fp32 ulps (the emulator's __expf is the host's expf).
TEST(GdnEmulated, Gates) {
  const GatesCase c;
  const int N = c.N, H = c.H;
  const std::vector<bf16> ba = bf16s(c.a), bb = bf16s(c.b), bA = bf16s(c.A_log), bdt = bf16s(c.dt_bias);
  std::vector<float> got_g((size_t)N * H);
  std::vector<bf16> got_beta((size_t)N * H);
  EmuRunner run;
  cuda::gates_forward_on(run, got_g.data(), got_beta.data(), ba.data(), bb.data(), bA.data(), bdt.data(), N, H);
  EXPECT_TRUE(all_within("gates g", doubles(got_g), c.g, 64 * kF32U, {}));
  EXPECT_TRUE(close_bf16("gates beta", doubles(got_beta), c.beta));

  const std::vector<float> fdg = floats(c.dg), fdbeta = floats(c.dbeta);
  std::vector<bf16> got_da((size_t)N * H), got_db((size_t)N * H);
  std::vector<float> got_dA = floats(c.dA0), got_ddt = floats(c.ddt0);
  HostWorkspace ws(cuda::gdn_gates_backward_workspace_bytes(N, H));
  cuda::gates_backward_on(run, got_da.data(), got_db.data(), got_dA.data(), got_ddt.data(), fdg.data(), fdbeta.data(),
                          ba.data(), bb.data(), bA.data(), bdt.data(), N, H, ws.ws);
  EXPECT_TRUE(close_bf16("gates da", doubles(got_da), c.da));
  EXPECT_TRUE(close_bf16("gates db", doubles(got_db), c.db));
  EXPECT_TRUE(close_f32_sum("gates dA_log", doubles(got_dA), c.dA));
  EXPECT_TRUE(close_f32_sum("gates ddt_bias", doubles(got_ddt), c.ddt));
}

// The two cluster kernels' start: their mbarrier (the first 16 bytes of dynamic shared memory)
// initialised, and a cluster barrier so that no peer's multicast completes on it before.
__device__ uint64_t* cluster_test_mbarrier(unsigned char* smem) {
  namespace sm90 = cuda::attn::sm90;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  if (threadIdx.x == 0) {
    sm90::mbar_init(bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  sm90::cluster_arrive();
  sm90::cluster_wait();
  return bar;
}

// The emulator's cluster checks on a kernel of its own: block 0 of a two-block cluster multicasts
// round k's box (rows 64 k ..) into both blocks, which copy what they find to out. With a cluster
// barrier between a round's reads and the next round's copy, every block sees every round's rows;
// without it block 0 runs ahead and its second copy reaches block 1 before block 1 has read the
// first, whichever way copies land: block 1 finds round 1's rows in round 0.
template <bool kBarrier>
__global__ void multicast_rounds_kernel(const __grid_constant__ CUtensorMap map, float* out) {
  namespace sm90 = cuda::attn::sm90;
  TT_EXTERN_SMEM_16(smem);
  uint64_t* bar = cluster_test_mbarrier(smem);
  const float* tile = reinterpret_cast<const float*>(cuda::align_up_1024(smem + 16));
  const int rank = (int)sm90::cluster_ctarank();
  constexpr uint32_t kBox = 64 * 32 * sizeof(float);
  for (int k = 0; k < 2; ++k) {
    if (threadIdx.x == 0) {
      sm90::mbar_expect_tx(bar, kBox);
      if (rank == 0) sm90::tma_load_3d_multicast(const_cast<float*>(tile), &map, 0, 0, 64 * k, bar, 3);
    }
    sm90::mbar_wait(bar, k & 1);
    out[(rank * 2 + k) * 32 + threadIdx.x] = tile[32 * 5 + threadIdx.x];  // row 5 of the box (unswizzled: 5 % 8)
    __syncthreads();
    if (kBarrier) {
      sm90::cluster_arrive();
      sm90::cluster_wait();
    }
  }
}

std::vector<float> run_multicast_rounds(bool barrier, bool at_issue) {
  std::vector<float> rows(128 * 32);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = (float)i;
  std::vector<float> out(4 * 32, -1.f);
  const cuda::emu::CopiesLanding landing(at_issue);
  cuda::emu::dynamic_smem_offset() = 0;
  const CUtensorMap map = cuda::emu::tensor_map_3d(rows.data(), 4, 128, 1, 32, 32, 64);
  cuda::emu::launch_cluster(barrier ? multicast_rounds_kernel<true> : multicast_rounds_kernel<false>, dim3(2),
                            dim3(2), dim3(32), 1024 + 16 + 64 * 32 * 4, map, out.data());
  return out;
}

TEST(GdnEmulated, TheEmulatorShowsAMulticastRefillBeforeAPeerRead) {
  // Row 5 of round k's box: tensor row 64 k + 5, its 16-byte units swizzled by 5 (the row % 8).
  auto expected = [](int k, int j) { return (float)((64 * k + 5) * 32 + 4 * (j / 4 ^ 5) + j % 4); };
  for (const bool at_issue : {false, true}) {
    const std::string how = at_issue ? " (copies landing at issue)" : " (copies landing at the wait)";
    std::vector<float> out = run_multicast_rounds(/*barrier=*/true, at_issue);
    for (int rank = 0; rank < 2; ++rank)
      for (int k = 0; k < 2; ++k)
        for (int j = 0; j < 32; ++j)
          ASSERT_EQ(out[(rank * 2 + k) * 32 + j], expected(k, j)) << "block " << rank << " round " << k << how;
    out = run_multicast_rounds(/*barrier=*/false, at_issue);
    for (int j = 0; j < 32; ++j) {
      ASSERT_EQ(out[j], expected(0, j)) << "block 0 reads its round 0 before its own refill" << how;
      ASSERT_EQ(out[2 * 32 + j], expected(1, j)) << "block 1's round 0 overwritten by round 1" << how;
    }
  }
}

// A peer's multicast into a block that has exited is an error the emulator names (on hardware it
// writes into whatever block took the SM): block 1 leaves right after the cluster barrier that
// makes block 0's mbarrier visible, block 0 then multicasts into both. Staying until its own copy
// has landed, block 1 reads it.
template <bool kExitEarly>
__global__ void multicast_exit_kernel(const __grid_constant__ CUtensorMap map, float* out) {
  namespace sm90 = cuda::attn::sm90;
  TT_EXTERN_SMEM_16(smem);
  uint64_t* bar = cluster_test_mbarrier(smem);
  float* tile = reinterpret_cast<float*>(cuda::align_up_1024(smem + 16));
  const int rank = (int)sm90::cluster_ctarank();
  if (kExitEarly && rank == 1) return;
  if (threadIdx.x == 0) {
    sm90::mbar_expect_tx(bar, 64 * 32 * sizeof(float));
    if (rank == 0) sm90::tma_load_3d_multicast(tile, &map, 0, 0, 0, bar, 3);
  }
  sm90::mbar_wait(bar, 0);
  out[rank * 32 + threadIdx.x] = tile[threadIdx.x];  // row 0 of the box (unswizzled)
}

void run_multicast_exit(bool exit_early, float* out) {
  std::vector<float> rows(64 * 32);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = (float)i;
  cuda::emu::dynamic_smem_offset() = 0;
  const CUtensorMap map = cuda::emu::tensor_map_3d(rows.data(), 4, 64, 1, 32, 32, 64);
  cuda::emu::launch_cluster(exit_early ? multicast_exit_kernel<true> : multicast_exit_kernel<false>, dim3(2), dim3(2),
                            dim3(32), 1024 + 16 + 64 * 32 * 4, map, out);
}

TEST(GdnEmulatedDeathTest, AMulticastIntoAnExitedBlockIsAnError) {
  std::vector<float> out(2 * 32, -1.f);
  run_multicast_exit(/*exit_early=*/false, out.data());
  for (int j = 0; j < 64; ++j) ASSERT_EQ(out[j], (float)(j % 32)) << "block " << j / 32 << " column " << j % 32;
  EXPECT_DEATH(run_multicast_exit(/*exit_early=*/true, out.data()), "multicast into a block that has exited");
}

}  // namespace
}  // namespace tt::cuda_test
