// The delta rule's test cases, shared by gdn_test (on the GPU) and gdn_emulated_test (the same
// kernels on the CPU through the emulators): DFS-packed forests, a case's inputs drawn and
// rounded to bf16 with their fp64 reference tree (ops/cpu/gdn.h) and plan, and the bf16 bound of
// gdn_test.cc's header.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/gdn.h"
#include "ops/cuda/gdn.h"
#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {

// A DFS-packed forest with its per-row positions (depths) and subtree ends (data/packing.h).
struct Forest {
  std::vector<int32_t> start, len, parent, pos, subtree_end;
  int N = 0;
  int nodes() const { return (int)start.size(); }
  void add(int p, int l) {
    start.push_back(N);
    len.push_back(l);
    parent.push_back(p);
    const int d0 = p < 0 ? 0 : pos[start[p] + len[p] - 1] + 1;
    for (int j = 0; j < l; ++j) pos.push_back(d0 + j);
    N += l;
  }
  void finish() {
    std::vector<int32_t> end(nodes());
    for (int n = nodes() - 1; n >= 0; --n) {
      end[n] = std::max(end[n], start[n] + len[n]);
      if (parent[n] >= 0) end[parent[n]] = std::max(end[parent[n]], end[n]);
    }
    subtree_end.assign(N, 0);
    for (int n = 0; n < nodes(); ++n)
      for (int j = 0; j < len[n]; ++j) subtree_end[start[n] + j] = end[n];
  }
};

// Random subtree in preorder: nodes of 1 token with probability 0.4, else 2..max_len.
inline void grow(Forest& f, std::mt19937_64& rng, int parent, int depth, int max_len, int& budget) {
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> len(2, max_len), kids(0, 3);
  f.add(parent, u(rng) < 0.4 ? 1 : len(rng));
  const int me = f.nodes() - 1;
  const int k = depth < 6 ? kids(rng) : 0;
  for (int c = 0; c < k && --budget > 0; ++c) grow(f, rng, me, depth + 1, max_len, budget);
}

inline ::testing::AssertionResult close_bf16(const std::string& name, const std::vector<double>& got,
                                             const std::vector<double>& ref) {
  double mx = 0;
  for (double r : ref) mx = std::max(mx, std::fabs(r));
  ::testing::AssertionResult a = all_within(name, got, ref, kBf16U, {mx / 1024});
  if (!a) return a;
  const double e = rel_l2(got, ref);
  if (e > kBf16U) return ::testing::AssertionFailure() << name << ": normwise relative error " << e;
  return ::testing::AssertionSuccess() << name << ": normwise " << e;
}

// The row ops' forest (one row whose conv input gradient gathers from many branches).
inline Forest awkward_forest(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Forest f;
  // A deep chain of one-token nodes ending in a fan of 9 short leaves.
  f.add(-1, 3);
  for (int i = 0; i < 12; ++i) f.add(f.nodes() - 1, 1);
  const int hub = f.nodes() - 1;
  for (int i = 0; i < 9; ++i) f.add(hub, 1 + i % 3);
  // Random trees.
  for (int t = 0; t < 3; ++t) {
    int budget = 25;
    grow(f, rng, -1, 0, 70, budget);
  }
  f.finish();
  return f;
}

// fp32 sums over rows (dw, dA_log, ddt_bias): normwise relative L2 <= 1e-4 (gdn_test.cc's header).
inline ::testing::AssertionResult close_f32_sum(const std::string& name, const std::vector<double>& got,
                                                const std::vector<double>& ref) {
  const double e = rel_l2(got, ref);
  if (e > 1e-4) return ::testing::AssertionFailure() << name << ": normwise relative error " << e;
  return ::testing::AssertionSuccess() << name << ": normwise " << e;
}

// A delta-rule case: a forest of nodes of 1 to 150 rows (several chunks, a chunk ending exactly
// at 64, one-token nodes) plus a random subtree of `budget` nodes up to `max_len` rows, grouped key
// heads (nk 2, nv 4 unless the shape says otherwise), head dims 128; q and k L2-normalised per
// head, decays in [-0.62, -0.02] (or as the shape says), beta in [0.05, 0.95], all rounded to bf16
// (drawn from `rng` in that order); the fp64 reference's tree and the plan (not uploaded). A shape
// with a forest of its own replaces the forest above (seed, budget, max_len and extra_root then
// play no part).
struct RuleShape {
  int nk = 2, nv = 4, dk = 128, dv = 128;
  double decay_span = 0.6;  // decays in [-0.02 - decay_span, -0.02]
  std::vector<std::pair<int, int>> forest;  // (parent, rows) of every node in packed order; empty: the above
};

struct RuleInputs {
  int nk, nv, dk, dv;
  Forest f;
  int N = 0, roots = 0;
  double scale;
  std::vector<double> q, k, v, g, beta;
  cpu::GdnTree t;  // points into f
  cuda::GdnPlan plan;

  RuleInputs(uint64_t seed, int budget, int max_len, bool extra_root, std::mt19937_64& rng, RuleShape shape = {})
      : nk(shape.nk), nv(shape.nv), dk(shape.dk), dv(shape.dv), scale(1.0 / std::sqrt((double)shape.dk)) {
    const double decay_span = shape.decay_span;
    if (!shape.forest.empty()) {
      for (const auto& [parent, rows] : shape.forest) f.add(parent, rows);
    } else {
      f.add(-1, 150);
      f.add(0, 64);
      f.add(1, 1);
      f.add(0, 1);
      f.add(3, 70);
      std::mt19937_64 grow_rng(seed);
      grow(f, grow_rng, -1, 0, max_len, budget);
      if (extra_root) f.add(-1, 2);
    }
    f.finish();
    N = f.N;
    roots = (int)std::count(f.parent.begin(), f.parent.end(), -1);
    auto normed = [&](int heads, int d) {  // L2-normalised per head, then rounded to bf16
      std::vector<double> x = randn_bf16(rng, (size_t)N * heads * d);
      for (size_t r = 0; r < (size_t)N * heads; ++r) {
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; ++i) x[r * d + i] = tt::cuda::round_to_bf16((float)(x[r * d + i] / std::sqrt(ss)));
      }
      return x;
    };
    q = normed(nk, dk);
    k = normed(nk, dk);
    v = randn_bf16(rng, (size_t)N * nv * dv);
    std::uniform_real_distribution<double> u(0, 1);
    g.resize((size_t)N * nv);
    beta.resize((size_t)N * nv);
    for (double& x : g) x = tt::cuda::round_to_bf16((float)(-0.02 - decay_span * u(rng)));
    for (double& x : beta) x = tt::cuda::round_to_bf16((float)(0.05 + 0.9 * u(rng)));
    t.node_start = f.start.data();
    t.node_len = f.len.data();
    t.node_parent = f.parent.data();
    t.num_nodes = f.nodes();
    t.N = N;
    t.nk = nk, t.nv = nv, t.dk = dk, t.dv = dv;
    t.scale = scale;
    plan.make(f.start.data(), f.len.data(), f.parent.data(), f.nodes());
  }
  RuleInputs(const RuleInputs&) = delete;  // t points into f
  RuleInputs& operator=(const RuleInputs&) = delete;
  size_t state_elems() const { return (size_t)nv * dk * dv; }
};

// How many of the first n elements of a and b differ in their bits.
template <class T>
size_t bits_differ(const std::vector<T>& a, const std::vector<T>& b, size_t n) {
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return differ;
}

// The next-node check (gdn_test's and gdn_emulated_test's NodesDoNotReadTheNextNodesRows): a
// first node of 100 rows (two chunks, so the reverse walk's leak would reach its first chunk's
// gradients) and a second root of 30, value head dim 64.
inline RuleShape next_node_shape(int dk) { return RuleShape{1, 2, dk, 64, 0.6, {{-1, 100}, {-1, 30}}}; }

// Outputs of the first `first` rows of two runs (a forward with end states, a backward; structs
// with o, dq, dk, dv, dg, db and end), the first node's end state, bit for bit.
template <class Out>
void expect_first_node_equal(const Out& a, const Out& b, int first, int nk, int nv, int dk, int dv,
                             size_t state_elems) {
  const std::string at = " of the first node, dk " + std::to_string(dk);
  EXPECT_EQ(bits_differ(a.o, b.o, (size_t)first * nv * dv), 0u) << "o" << at;
  EXPECT_EQ(bits_differ(a.dq, b.dq, (size_t)first * nk * dk), 0u) << "dq" << at;
  EXPECT_EQ(bits_differ(a.dk, b.dk, (size_t)first * nk * dk), 0u) << "dk" << at;
  EXPECT_EQ(bits_differ(a.dv, b.dv, (size_t)first * nv * dv), 0u) << "dv" << at;
  EXPECT_EQ(bits_differ(a.dg, b.dg, (size_t)first * nv), 0u) << "dg" << at;
  EXPECT_EQ(bits_differ(a.db, b.db, (size_t)first * nv), 0u) << "dbeta" << at;
  EXPECT_EQ(bits_differ(a.end, b.end, state_elems), 0u) << "end state" << at;
}

}  // namespace tt::cuda_test
