// Allocation failures inside the OpenMP regions of the CPU reference ops: every op that allocates
// in a region (per-thread scratch, per-item vectors) is run with its first, second, third, ...
// allocation failing, on 4 threads. Each faulted call must throw std::bad_alloc to the caller (an
// exception escaping a region would end the process in std::terminate instead), and the first
// call that no fault reaches must give the outputs of an unfaulted call bit for bit. And
// base/parallel.h's OmpErrors, which carries them out, with other exceptions.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <new>
#include <random>
#include <stdexcept>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/embedding.h"
#include "ops/cpu/gdn.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/rope.h"
#include "tests/ops/test_util.h"

#include "tests/base/alloc_faults.h"

using tt::testing::fail_allocation;  // allocation failures on demand, counted on every thread
using tt::testing::failed_in_region;

namespace tt::cpu {
namespace {

using test::randn;

// Enough threads that every region runs several, whatever the machine (and .bazelrc's
// OMP_NUM_THREADS=1).
constexpr int kThreads = 4;

class OmpFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_threads_ = omp_get_max_threads();
    omp_set_num_threads(kThreads);
    saved_min_work_ = omp_min_work().exchange(0);  // every region on its team, however small
  }
  void TearDown() override {
    omp_set_num_threads(saved_threads_);
    omp_min_work().store(saved_min_work_);
  }

 private:
  int saved_threads_ = 1;
  int64_t saved_min_work_ = 0;
};

// Runs call() with allocation n + 1 failing, for n = 0, 1, ... until a call makes at most n
// allocations; some of the failures must fall inside a region. reset() restores what the op writes
// or accumulates into; outputs() gathers it.
void sweep(const char* op, const std::function<void()>& reset, const std::function<void()>& call,
           const std::function<std::vector<double>()>& outputs) {
  reset();
  call();
  const std::vector<double> want = outputs();
  failed_in_region.store(0);
  for (int64_t n = 0;; n++) {
    ASSERT_LT(n, 100000) << op << ": still allocating after 100000 allocations";
    reset();
    const auto [threw, faulted] = fail_allocation(n, call);
    ASSERT_EQ(threw, faulted) << op << " with allocation " << n + 1 << " failing: "
                              << (faulted ? "the failure was swallowed" : "threw without a failure");
    if (!faulted) {
      const std::vector<double> got = outputs();
      ASSERT_EQ(got.size(), want.size()) << op;
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)), 0)
          << op << ": outputs differ from an unfaulted run";
      EXPECT_GT(failed_in_region.load(), 0) << op << ": none of " << n << " failures fell inside an OpenMP region";
      return;
    }
  }
}

std::vector<double> concat(std::initializer_list<const std::vector<double>*> parts) {
  std::vector<double> all;
  for (const std::vector<double>* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

TEST_F(OmpFaults, Matmul) {
  // 5 row tiles of 32 and two k chunks of 256 in the forward; dw's K is N.
  const int N = 150, IC = 300, OC = 9;
  std::mt19937_64 rng(1);
  const std::vector<double> x = randn(rng, (size_t)N * IC), w = randn(rng, (size_t)OC * IC),
                            dout = randn(rng, (size_t)N * OC);
  std::vector<double> out((size_t)N * OC), dx(x.size()), dw(w.size());
  sweep(
      "matmul_forward", [&] { std::fill(out.begin(), out.end(), 0.0); },
      [&] { matmul_forward(out.data(), x.data(), w.data(), N, IC, OC); }, [&] { return out; });
  sweep(
      "matmul_backward",
      [&] {
        std::fill(dx.begin(), dx.end(), 0.5);
        std::fill(dw.begin(), dw.end(), -0.5);
      },
      [&] { matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), N, IC, OC); },
      [&] { return concat({&dx, &dw}); });
}

TEST_F(OmpFaults, Attention) {
  // Two trees (the first branching twice), an external prefix read by every query: 10 work units
  // of (node, KV head) in the forward, 4 of (tree, KV head) in the backward.
  const std::vector<int32_t> start = {0, 5, 8, 10, 14}, len = {5, 3, 2, 4, 6}, parent = {-1, 0, 1, 0, -1};
  const AttnLayout layout{(int)start.size(), start.data(), len.data(), parent.data()};
  const int N = 20, NH = 4, NKV = 2, HS = 8, P = 3;
  std::mt19937_64 rng(2);
  const std::vector<double> q = randn(rng, (size_t)N * NH * HS), k = randn(rng, (size_t)N * NKV * HS),
                            v = randn(rng, k.size()), dout = randn(rng, q.size()),
                            pk = randn(rng, (size_t)P * NKV * HS), pv = randn(rng, pk.size());
  std::vector<double> out(q.size()), lse((size_t)N * NH), dq(q.size()), dk(k.size()), dv(v.size()),
      pdk(pk.size()), pdv(pv.size());
  ExternalKV<double> ext;
  ext.k = pk.data(), ext.v = pv.data(), ext.dk = pdk.data(), ext.dv = pdv.data();
  ext.len = P, ext.q_begin = 0, ext.q_end = N;
  auto forward = [&] {
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), layout, &ext, 1, N, NH, NKV, HS);
  };
  sweep(
      "attention_forward",
      [&] {
        std::fill(out.begin(), out.end(), 0.0);
        std::fill(lse.begin(), lse.end(), 0.0);
      },
      forward, [&] { return concat({&out, &lse}); });
  forward();
  sweep(
      "attention_backward",
      [&] {
        for (std::vector<double>* g : {&dq, &dk, &dv, &pdk, &pdv}) std::fill(g->begin(), g->end(), 0.0);
      },
      [&] {
        attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                           v.data(), layout, &ext, 1, N, NH, NKV, HS);
      },
      [&] { return concat({&dq, &dk, &dv, &pdk, &pdv}); });
}

// The forward allocates outside its region only.
TEST_F(OmpFaults, CrossEntropyBackward) {
  const int N = 12, V = 50;
  std::mt19937_64 rng(3);
  const std::vector<double> logits = randn(rng, (size_t)N * V);
  // Row 3 a branch point (two targets), row 7 without targets.
  std::vector<int32_t> src, tok;
  std::vector<double> w;
  for (int r = 0; r < N; r++) {
    if (r == 7) continue;
    src.push_back(r), tok.push_back((r * 7) % V), w.push_back(1.0 + 0.25 * r);
    if (r == 3) src.push_back(r), tok.push_back(11), w.push_back(0.5);
  }
  const int n_tgt = (int)src.size();
  std::vector<double> lse(N), dlogits(logits.size());
  cross_entropy_forward(lse.data(), logits.data(), src.data(), tok.data(), w.data(), n_tgt, N, V);
  sweep(
      "cross_entropy_backward", [&] { std::fill(dlogits.begin(), dlogits.end(), 0.0); },
      [&] {
        cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), src.data(), tok.data(), w.data(), n_tgt, N,
                               V, 0.75);
      },
      [&] { return dlogits; });
}

// The forward allocates nothing.
TEST_F(OmpFaults, EmbeddingBackward) {
  const int N = 40, C = 16, V = 20;
  std::mt19937_64 rng(4);
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; n++) tokens[n] = (int32_t)(rng() % V);
  const std::vector<double> wte = randn(rng, (size_t)V * C), dout = randn(rng, (size_t)N * C);
  std::vector<double> dwte(wte.size());
  sweep(
      "embedding_backward", [&] { std::fill(dwte.begin(), dwte.end(), 0.25); },
      [&] { embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C); }, [&] { return dwte; });
}

TEST_F(OmpFaults, Rope) {
  const int N = 24, H = 3, HS = 8;
  std::mt19937_64 rng(5);
  std::vector<int32_t> pos(N);
  for (int n = 0; n < N; n++) pos[n] = n % 7;
  const std::vector<double> x0 = randn(rng, (size_t)N * H * HS);
  std::vector<double> x(x0.size());
  sweep(
      "rope_forward", [&] { x = x0; }, [&] { rope_forward(x.data(), pos.data(), N, H, HS, 10000.0); },
      [&] { return x; });
  sweep(
      "rope_backward", [&] { x = x0; }, [&] { rope_backward(x.data(), pos.data(), N, H, HS, 10000.0, 4); },
      [&] { return x; });
}

TEST_F(OmpFaults, GatedDeltaRule) {
  // One tree of four nodes and a single-node tree; 4 value heads (the parallel loops run over
  // them), chunks of 3 rows.
  const std::vector<int32_t> start = {0, 5, 9, 11, 13}, len = {5, 4, 2, 2, 6}, parent = {-1, 0, 0, 2, -1};
  const int N = 19, nk = 2, nv = 4, dk = 4, dv = 3, chunk = 3;
  GdnTree t;
  t.node_start = start.data(), t.node_len = len.data(), t.node_parent = parent.data();
  t.num_nodes = (int)start.size(), t.N = N, t.nk = nk, t.nv = nv, t.dk = dk, t.dv = dv;
  t.scale = 1.0 / std::sqrt((double)dk);
  std::mt19937_64 rng(6);
  const std::vector<double> q = randn(rng, (size_t)N * nk * dk, 0.5), k = randn(rng, q.size(), 0.5),
                            v = randn(rng, (size_t)N * nv * dv), d_o = randn(rng, v.size());
  std::vector<double> g((size_t)N * nv), beta(g.size());
  std::uniform_real_distribution<double> decay(-1.0, -0.05), write(0.1, 0.9);
  for (double& x : g) x = decay(rng);
  for (double& x : beta) x = write(rng);
  std::vector<double> o(v.size()), end((size_t)t.num_nodes * nv * dk * dv), dq(q.size()), dkk(k.size()),
      dvv(v.size()), dg(g.size()), dbeta(beta.size());
  auto reset_forward = [&] {
    std::fill(o.begin(), o.end(), 0.0);
    std::fill(end.begin(), end.end(), 0.0);
  };
  auto reset_backward = [&] {
    for (std::vector<double>* x : {&dq, &dkk, &dvv, &dg, &dbeta}) std::fill(x->begin(), x->end(), 0.0);
  };
  auto forward_out = [&] { return concat({&o, &end}); };
  auto backward_out = [&] { return concat({&dq, &dkk, &dvv, &dg, &dbeta}); };
  sweep(
      "gdn_tree_forward", reset_forward,
      [&] { gdn_tree_forward(o.data(), end.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, t); },
      forward_out);
  sweep(
      "gdn_tree_forward_chunked", reset_forward,
      [&] {
        gdn_tree_forward_chunked(o.data(), end.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr,
                                 t, chunk);
      },
      forward_out);
  sweep(
      "gdn_tree_backward", reset_backward,
      [&] {
        gdn_tree_backward(dq.data(), dkk.data(), dvv.data(), dg.data(), dbeta.data(), nullptr, d_o.data(), nullptr,
                          q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, t);
      },
      backward_out);
  sweep(
      "gdn_tree_backward_chunked", reset_backward,
      [&] {
        gdn_tree_backward_chunked(dq.data(), dkk.data(), dvv.data(), dg.data(), dbeta.data(), nullptr, d_o.data(),
                                  nullptr, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, t, chunk);
      },
      backward_out);
}

// Any exception, thrown by one thread's setup or in an iteration of any of a region's loops,
// reaches the caller; the threads still meet at every loop's barrier.
TEST_F(OmpFaults, OmpErrorsCarriesAnyExceptionOutOfARegion) {
  for (int where = 0; where < 4; where++) {
    OmpErrors errors;
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
      team = omp_get_num_threads();
      errors.run([&] {
        if (where == 1 && omp_get_thread_num() == kThreads - 1) throw Error("setup");
      });
#pragma omp for schedule(dynamic, 1)
      for (int i = 0; i < 100; i++) {
        errors.run([&] {
          if (where == 2 && i == 37) throw Error("first loop");
        });
      }
#pragma omp for schedule(static)
      for (int i = 0; i < 100; i++) {
        errors.run([&] {
          if (where == 3 && i == 99) throw std::runtime_error("second loop");
        });
      }
    }
    ASSERT_EQ(team, kThreads);
    const char* want[] = {nullptr, "setup", "first loop", "second loop"};
    try {
      errors.rethrow();
      EXPECT_EQ(want[where], nullptr) << "nothing thrown";
    } catch (const std::exception& e) {
      EXPECT_STREQ(e.what(), want[where]);
    }
  }
}

}  // namespace
}  // namespace tt::cpu
