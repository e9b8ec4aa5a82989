// The delta rule's CUDA kernels (ops/cuda/gdn_rule.cuh: the same source and the same launch
// sequences as the GPU build) on the CPU through the emulators of tests/ops_cuda_attention (threads
// as fibers, warp collectives, ldmatrix and mma.sync, cp.async, mbarriers and TMA), against the
// fp64 recurrent oracle (ops/cpu/gdn.h) on small gdn_cases.h trees, with gdn_test.cc's bounds.
// No GPU needed: this keeps the kernels' indexing, fragment layouts, chunk and node walks, stages
// and barrier protocol under CI, for every path (the TMA walks at dk 128, the mma walks, the
// CUDA-core walks at dk not a multiple of 16, the 128 x 128 instantiations). The emulated shared
// memory starts as NaN and a copy lands only at its wait, so a read of rows a kernel never loaded
// or read too early shows. Timing races are out of its reach (scripts/device/gdn_variants.sh runs
// compute-sanitizer on the GPU).
#include "tests/ops_cuda_attention/warp_emulator.h"
#include "tests/ops_cuda_attention/wgmma_emulator.h"
#include "tests/ops_cuda_attention/mma_emulator.h"
// The kernels, compiled for the host against the emulators' primitives.
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/gdn_rule.cuh"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/gdn.h"
#include "tests/ops_cuda/gdn_cases.h"

namespace tt::cuda_test {
namespace {

// Runs gdn_rule.cuh's sequences on the emulator; host memory stands for device memory.
struct EmuRunner {
  int launches = 0;
  template <class... P, class... A>
  void launch(void (*kernel)(P...), dim3 grid, size_t smem, const A&... args) {
    cuda::emu::launch(kernel, grid, dim3(cuda::kRuleThreads), smem, args...);
    ++launches;
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

// Host memory standing for a device workspace, 256-byte aligned as the allocator's blocks are.
struct HostWorkspace {
  std::vector<char> raw;
  cuda::Workspace ws;
  explicit HostWorkspace(size_t bytes) : raw(bytes + 256) {
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

// Forward and backward of one shape against the oracle, with gdn_test.cc's bounds: o within
// close_bf16, end states (fp32) normwise 1e-4; the bf16 gradients normwise 2 x 2^-8, the fp32 ones
// (dg, dbeta, d_init) 1e-3. Each pass launches a fixed number of kernels whatever the tree.
void check_shape(uint64_t seed, RuleShape shape) {
  std::mt19937_64 rng(seed * 41);
  EmuCase c(seed, rng, shape);
  const int nk = c.nk, nv = c.nv, dk = c.dk, dv = c.dv, N = c.N;
  const std::string at = " (dk " + std::to_string(dk) + ", dv " + std::to_string(dv) + ")";
  const std::vector<double> init = randn_f32(rng, (size_t)c.roots * c.state_elems(), 0.1);
  const std::vector<double> dO = randn_bf16(rng, (size_t)N * nv * dv),
                            dE = randn_f32(rng, (size_t)c.f.nodes() * c.state_elems(), 0.05);

  std::vector<double> o((size_t)N * nv * dv), end((size_t)c.f.nodes() * c.state_elems());
  cpu::gdn_tree_forward<double>(o.data(), end.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(),
                                init.data(), c.t);
  const std::vector<float> f_init = floats(init), f_dE = floats(dE);
  const std::vector<bf16> b_dO = bf16s(dO);
  {
    HostWorkspace ws(cuda::gdn_forward_workspace_bytes(c.plan, nv, dk, dv, /*end_given=*/true));
    std::vector<bf16> got_o(o.size(), __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> got_end(end.size(), std::numeric_limits<float>::quiet_NaN());
    EmuRunner run;
    cuda::rule_forward(run, got_o.data(), got_end.data(), c.bq.data(), c.bk.data(), c.bv.data(), c.fg.data(),
                       c.bb.data(), f_init.data(), c.plan, nk, nv, dk, dv, c.scale, ws.ws);
    EXPECT_EQ(run.launches, 3) << "forward launches" << at;
    EXPECT_TRUE(close_bf16("emulated delta rule o" + at, doubles(got_o), o));
    const double e = rel_l2(doubles(got_end), end);
    EXPECT_LE(e, 1e-4) << "end states" << at;
    std::printf("[ errors   ] emulated delta rule forward%s: end states rel L2 %.2e\n", at.c_str(), e);
  }

  std::vector<double> dq(c.q.size(), 0.0), dk_(c.k.size(), 0.0), dv_(c.v.size(), 0.0), dg(c.g.size(), 0.0),
      db(c.beta.size(), 0.0), di(init.size(), 0.0);
  cpu::gdn_tree_backward<double>(dq.data(), dk_.data(), dv_.data(), dg.data(), db.data(), di.data(), dO.data(),
                                 dE.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), init.data(),
                                 c.t);
  HostWorkspace ws(cuda::gdn_backward_workspace_bytes(c.plan, nv, dk, dv));
  const bf16 nan16 = __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<bf16> g_q(dq.size(), nan16), g_k(dk_.size(), nan16), g_v(dv_.size(), nan16);
  std::vector<float> g_g(dg.size(), nan), g_b(db.size(), nan), g_i(di.size(), 0.f);  // d_init: +=
  EmuRunner run;
  cuda::rule_backward(run, g_q.data(), g_k.data(), g_v.data(), g_g.data(), g_b.data(), g_i.data(), b_dO.data(),
                      f_dE.data(), c.bq.data(), c.bk.data(), c.bv.data(), c.fg.data(), c.bb.data(), f_init.data(),
                      c.plan, nk, nv, dk, dv, c.scale, ws.ws, /*accumulate=*/false);
  EXPECT_EQ(run.launches, 7) << "backward launches" << at;
  EXPECT_LE(rel_l2(doubles(g_q), dq), 2 * kBf16U) << "dq" << at;
  EXPECT_LE(rel_l2(doubles(g_k), dk_), 2 * kBf16U) << "dk" << at;
  EXPECT_LE(rel_l2(doubles(g_v), dv_), 2 * kBf16U) << "dv" << at;
  EXPECT_LE(rel_l2(doubles(g_g), dg), 1e-3) << "dg" << at;
  EXPECT_LE(rel_l2(doubles(g_b), db), 1e-3) << "dbeta" << at;
  EXPECT_LE(rel_l2(doubles(g_i), di), 1e-3) << "d_init" << at;
  std::printf("[ errors   ] emulated delta rule backward%s: rel L2 dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e "
              "d_init %.2e\n",
              at.c_str(), rel_l2(doubles(g_q), dq), rel_l2(doubles(g_k), dk_), rel_l2(doubles(g_v), dv_),
              rel_l2(doubles(g_g), dg), rel_l2(doubles(g_b), db), rel_l2(doubles(g_i), di));
}

// dk = dv = 128: the walks' stages by TMA, the 128 x 128 output and grad kernels.
TEST(GdnEmulated, DeltaRuleAtHeadDim128) { check_shape(1, RuleShape{1, 2, 128, 128}); }

// dk 64, dv 64: the walks' stages by cp.async, the general output and grad kernels.
TEST(GdnEmulated, DeltaRuleAtHeadDim64) { check_shape(2, RuleShape{1, 2, 64, 64}); }

// dk 72 (not a multiple of the products' depth 16): the walks on CUDA cores; dv 32, one walk column block.
TEST(GdnEmulated, DeltaRuleAtKeyDim72) { check_shape(3, RuleShape{1, 2, 72, 32}); }

// dk 128 with dv 64: TMA stages whose boxes of U and dv_new cover half of a 128-column block.
TEST(GdnEmulated, DeltaRuleAtKeyDim128ValueDim64) { check_shape(4, RuleShape{2, 4, 128, 64}); }

}  // namespace
}  // namespace tt::cuda_test
