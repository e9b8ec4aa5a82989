// Gated DeltaNet CPU ops on trees (ops/cpu/gdn.h): finite-difference gradient checks in fp64 for
// every op (the bound rule of tests/ops/test_util.h), the tree against each root-to-leaf path run
// as its own sequence (the exactness contract: no sibling's state or conv window leaks in), and
// the chunked (WY) form against the recurrent oracle on awkward trees (one-token nodes, nodes
// shorter than the conv window, deep chains, wide fans, lengths not a multiple of the chunk).
//
// Equality bounds: the tree and a path compute the same sums in the same order (bitwise equal
// expected, 0 asserted); the chunked form reorders O(L) fp64 sums of O(1) terms through a
// triangular solve, so its outputs agree to 1e-12 relative (normwise; ~1e3 x 1.1e-16 of headroom).
#include "ops/cpu/gdn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/check.h"
#include "ops/cpu/gated_attention.h"
#include "tests/ops/test_util.h"

namespace tt::cpu {
namespace {

using test::check_gradient;
using test::dot_objective;
using test::randn;
using test::rel_error;

// A DFS-packed tree: node lengths in [1, max_len], each node a child of a node on the current
// root path (or a new root with probability p_root).
struct Layout {
  std::vector<int32_t> start, len, parent;
  int N = 0;
  int nodes() const { return (int)start.size(); }
};

Layout random_layout(std::mt19937_64& rng, int num_nodes, int max_len, double p_root = 0.1) {
  Layout l;
  std::vector<int> stack;
  for (int n = 0; n < num_nodes; n++) {
    int parent = -1;
    if (!stack.empty() && std::uniform_real_distribution<double>(0, 1)(rng) >= p_root) {
      const int depth = (int)(rng() % stack.size());
      parent = stack[depth];
      stack.resize(depth + 1);
    } else {
      stack.clear();
    }
    const int len = 1 + (int)(rng() % max_len);
    l.start.push_back(l.N);
    l.len.push_back(len);
    l.parent.push_back(parent);
    l.N += len;
    stack.push_back(n);
  }
  return l;
}

// The rows of each root-to-leaf path (a leaf: a node no other node names as parent), root first.
std::vector<std::vector<int>> leaf_paths(const Layout& l) {
  std::vector<bool> has_child(l.nodes(), false);
  for (int p : l.parent)
    if (p >= 0) has_child[p] = true;
  std::vector<std::vector<int>> out;
  for (int n = 0; n < l.nodes(); n++) {
    if (has_child[n]) continue;
    std::vector<int> chain;
    for (int c = n; c >= 0; c = l.parent[c]) chain.push_back(c);
    std::vector<int> rows;
    for (auto c = chain.rbegin(); c != chain.rend(); ++c)
      for (int j = 0; j < l.len[*c]; j++) rows.push_back(l.start[*c] + j);
    out.push_back(rows);
  }
  return out;
}

// The root each node descends from, as an index among the roots.
std::vector<int> root_of(const Layout& l) {
  std::vector<int> r(l.nodes());
  int k = 0;
  for (int n = 0; n < l.nodes(); n++) r[n] = l.parent[n] < 0 ? k++ : r[l.parent[n]];
  return r;
}

std::vector<double> gather(const std::vector<double>& x, const std::vector<int>& rows, int width) {
  std::vector<double> out;
  for (int r : rows) out.insert(out.end(), x.begin() + (size_t)r * width, x.begin() + (size_t)(r + 1) * width);
  return out;
}

TEST(Gdn, PathPrevFollowsParentsNotPackedOrder) {
  // Root [0, 2), child A [2, 3) (one token), A's child [3, 5), a second child of the root [5, 7).
  const Layout l{{0, 2, 3, 5}, {2, 1, 2, 2}, {-1, 0, 1, 0}, 7};
  std::vector<int32_t> prev(7);
  path_prev(prev.data(), l.start.data(), l.len.data(), l.parent.data(), 4, 7);
  EXPECT_EQ(prev, (std::vector<int32_t>{-1, 0, 1, 2, 3, 1, 5}));
  const std::vector<int32_t> bad_parent = {-1, 0, 3, 0};
  try {
    path_prev(prev.data(), l.start.data(), l.len.data(), bad_parent.data(), 4, 7);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("path_prev: node 2 has parent 3 (expected -1 or an earlier node)", 0), 0u)
        << e.what();
  }
}

TEST(Gdn, Conv1dSiluGradientByFiniteDifferences) {
  std::mt19937_64 rng(3);
  const Layout l = random_layout(rng, 7, 3);  // nodes of 1-3 tokens: windows cross several ancestors
  const int N = l.N, C = 3, K = 4;
  std::vector<int32_t> prev(N);
  path_prev(prev.data(), l.start.data(), l.len.data(), l.parent.data(), l.nodes(), N);
  std::vector<double> x = randn(rng, (size_t)N * C), w = randn(rng, (size_t)C * K, 0.5), R = randn(rng, (size_t)N * C);
  std::vector<double> out((size_t)N * C);
  auto objective = [&] {
    conv1d_silu_forward(out.data(), x.data(), w.data(), prev.data(), N, C, K);
    return dot_objective(out, R);
  };
  objective();
  std::vector<double> dx((size_t)N * C, 0.0), dw((size_t)C * K, 0.0);
  conv1d_silu_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), prev.data(), N, C, K);
  check_gradient("dx", &x, dx, objective);
  check_gradient("dw", &w, dw, objective);
}

TEST(Gdn, Conv1dOnATreeIsConv1dOnEachPath) {
  std::mt19937_64 rng(4);
  for (int iter = 0; iter < 20; iter++) {
    const Layout l = random_layout(rng, 2 + (int)(rng() % 10), 1 + (int)(rng() % 5));
    const int N = l.N, C = 2, K = 4;
    std::vector<int32_t> prev(N);
    path_prev(prev.data(), l.start.data(), l.len.data(), l.parent.data(), l.nodes(), N);
    const std::vector<double> x = randn(rng, (size_t)N * C), w = randn(rng, (size_t)C * K);
    std::vector<double> out((size_t)N * C);
    conv1d_silu_forward(out.data(), x.data(), w.data(), prev.data(), N, C, K);
    for (const std::vector<int>& rows : leaf_paths(l)) {
      const int L = (int)rows.size();
      const std::vector<int32_t> s{0}, n{L}, p{-1};
      std::vector<int32_t> chain_prev(L);
      path_prev(chain_prev.data(), s.data(), n.data(), p.data(), 1, L);
      std::vector<double> po((size_t)L * C);
      conv1d_silu_forward(po.data(), gather(x, rows, C).data(), w.data(), chain_prev.data(), L, C, K);
      EXPECT_EQ(po, gather(out, rows, C)) << "iteration " << iter;
    }
  }
}

TEST(Gdn, L2NormGradientByFiniteDifferences) {
  std::mt19937_64 rng(5);
  const int rows = 5, D = 6;
  std::vector<double> x = randn(rng, rows * D), R = randn(rng, rows * D), y(rows * D), rstd(rows);
  auto objective = [&] {
    l2norm_forward(y.data(), rstd.data(), x.data(), rows, D, 1e-6);
    return dot_objective(y, R);
  };
  objective();
  for (int r = 0; r < rows; r++) {  // |y|^2 = |x|^2 / (|x|^2 + eps)
    double ss = 0, xx = 0;
    for (int c = 0; c < D; c++) ss += y[r * D + c] * y[r * D + c], xx += x[r * D + c] * x[r * D + c];
    EXPECT_NEAR(ss, xx / (xx + 1e-6), 1e-14);
  }
  std::vector<double> dx(rows * D, 0.0);
  l2norm_backward(dx.data(), R.data(), x.data(), rstd.data(), rows, D);
  check_gradient("dx", &x, dx, objective);
}

TEST(Gdn, GatedRmsNormGradientByFiniteDifferences) {
  std::mt19937_64 rng(6);
  const int rows = 5, D = 6;
  std::vector<double> x = randn(rng, rows * D), z = randn(rng, rows * D), w = randn(rng, D), R = randn(rng, rows * D);
  std::vector<double> y(rows * D), rstd(rows);
  auto objective = [&] {
    gated_rmsnorm_forward(y.data(), rstd.data(), x.data(), z.data(), w.data(), rows, D, 1e-6);
    return dot_objective(y, R);
  };
  objective();
  // The formula at one element: w x rsqrt(mean x^2 + eps) silu(z).
  double ss = 0;
  for (int c = 0; c < D; c++) ss += x[c] * x[c];
  EXPECT_NEAR(y[2], w[2] * x[2] / std::sqrt(ss / D + 1e-6) * z[2] / (1 + std::exp(-z[2])), 1e-14);
  std::vector<double> dx(rows * D, 0.0), dz(rows * D, 0.0), dw(D, 0.0);
  gated_rmsnorm_backward(dx.data(), dz.data(), dw.data(), R.data(), x.data(), z.data(), w.data(), rstd.data(), rows, D);
  check_gradient("dx", &x, dx, objective);
  check_gradient("dz", &z, dz, objective);
  check_gradient("dw", &w, dw, objective);
}

TEST(Gdn, GatesGradientByFiniteDifferences) {
  std::mt19937_64 rng(11);
  const int N = 4, H = 3;
  std::vector<double> a = randn(rng, N * H), b = randn(rng, N * H), A_log = randn(rng, H, 0.5),
                      dt = randn(rng, H, 0.5), Rg = randn(rng, N * H), Rb = randn(rng, N * H);
  std::vector<double> g(N * H), beta(N * H);
  auto objective = [&] {
    gdn_gates_forward(g.data(), beta.data(), a.data(), b.data(), A_log.data(), dt.data(), N, H);
    return dot_objective(g, Rg) + dot_objective(beta, Rb);
  };
  objective();
  const double x = a[4] + dt[1];
  EXPECT_NEAR(g[4], -std::exp(A_log[1]) * std::log1p(std::exp(x)), 1e-14);
  EXPECT_NEAR(beta[4], 1 / (1 + std::exp(-b[4])), 1e-15);
  std::vector<double> da(N * H), db(N * H), dA(H, 0.0), ddt(H, 0.0);
  gdn_gates_backward(da.data(), db.data(), dA.data(), ddt.data(), Rg.data(), Rb.data(), a.data(), b.data(),
                     A_log.data(), dt.data(), N, H);
  check_gradient("da", &a, da, objective);
  check_gradient("db", &b, db, objective);
  check_gradient("dA_log", &A_log, dA, objective);
  check_gradient("ddt_bias", &dt, ddt, objective);
}

TEST(GatedAttention, GateGradientAndHeadSplit) {
  std::mt19937_64 rng(12);
  const int n = 10;
  std::vector<double> x = randn(rng, n), gate = randn(rng, n), R = randn(rng, n), y(n);
  auto objective = [&] {
    sigmoid_gate_forward(y.data(), x.data(), gate.data(), n);
    return dot_objective(y, R);
  };
  objective();
  std::vector<double> dx(n), dgate(n);
  sigmoid_gate_backward(dx.data(), dgate.data(), R.data(), x.data(), gate.data(), n);
  check_gradient("dx", &x, dx, objective);
  check_gradient("dgate", &gate, dgate, objective);
  // (N, H, 2D) per head [a | b]: split then merge is the identity.
  const std::vector<double> ab = randn(rng, 2 * 3 * 2 * 4);
  std::vector<double> a(2 * 3 * 4), b(2 * 3 * 4), back(ab.size());
  split_heads(a.data(), b.data(), ab.data(), 2, 3, 4);
  EXPECT_EQ(a[4], ab[8]) << "head 1's first a element";
  EXPECT_EQ(b[4], ab[12]) << "head 1's first b element";
  merge_heads(back.data(), a.data(), b.data(), 2, 3, 4);
  EXPECT_EQ(back, ab);
}

// Inputs of one gated delta rule call on a layout.
struct GdnInputs {
  GdnTree t;
  std::vector<double> q, k, v, g, beta, init;
};

GdnInputs random_inputs(std::mt19937_64& rng, const Layout& l, int nk, int nv, int dk, int dv, bool with_init) {
  GdnInputs in;
  in.t.node_start = l.start.data();
  in.t.node_len = l.len.data();
  in.t.node_parent = l.parent.data();
  in.t.num_nodes = l.nodes();
  in.t.N = l.N;
  in.t.nk = nk, in.t.nv = nv, in.t.dk = dk, in.t.dv = dv;
  in.t.scale = 1.0 / std::sqrt((double)dk);
  in.q = randn(rng, (size_t)l.N * nk * dk, 1.0 / std::sqrt((double)dk));
  in.k = randn(rng, (size_t)l.N * nk * dk, 1.0 / std::sqrt((double)dk));
  in.v = randn(rng, (size_t)l.N * nv * dv);
  std::uniform_real_distribution<double> decay(-1.0, -0.05), write(0.1, 0.9);
  in.g.resize((size_t)l.N * nv);
  in.beta.resize((size_t)l.N * nv);
  for (auto& x : in.g) x = decay(rng);
  for (auto& x : in.beta) x = write(rng);
  if (with_init) in.init = randn(rng, (size_t)in.t.num_roots() * nv * dk * dv, 0.5);
  return in;
}

TEST(Gdn, TreeIsEachPathRunAlone) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 20; iter++) {
    const Layout l = random_layout(rng, 2 + (int)(rng() % 10), 1 + (int)(rng() % 6), 0.2);
    const int nk = 1 + (int)(rng() % 2), nv = nk * (1 + (int)(rng() % 2)), dk = 3, dv = 2;
    const bool with_init = iter % 2 == 1;
    GdnInputs in = random_inputs(rng, l, nk, nv, dk, dv, with_init);
    std::vector<double> o((size_t)l.N * nv * dv), end((size_t)l.nodes() * nv * dk * dv);
    gdn_tree_forward(o.data(), end.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                     with_init ? in.init.data() : nullptr, in.t);
    const std::vector<int> roots = root_of(l);
    std::vector<bool> has_child(l.nodes(), false);
    for (int p : l.parent)
      if (p >= 0) has_child[p] = true;
    int leaf = 0;
    for (const std::vector<int>& rows : leaf_paths(l)) {
      while (has_child[leaf]) leaf++;  // leaf_paths lists leaves in node order
      const int L = (int)rows.size();
      const std::vector<int32_t> s{0}, n{L}, p{-1};
      GdnTree pt = in.t;
      pt.node_start = s.data(), pt.node_len = n.data(), pt.node_parent = p.data(), pt.num_nodes = 1, pt.N = L;
      const size_t SS = (size_t)nv * dk * dv;
      const std::vector<double> init(with_init ? in.init.begin() + roots[leaf] * SS : in.init.end(),
                                     with_init ? in.init.begin() + (roots[leaf] + 1) * SS : in.init.end());
      std::vector<double> po((size_t)L * nv * dv), pend(SS);
      gdn_tree_forward(po.data(), pend.data(), gather(in.q, rows, nk * dk).data(), gather(in.k, rows, nk * dk).data(),
                       gather(in.v, rows, nv * dv).data(), gather(in.g, rows, nv).data(),
                       gather(in.beta, rows, nv).data(), with_init ? init.data() : nullptr, pt);
      EXPECT_EQ(po, gather(o, rows, nv * dv)) << "iteration " << iter << " leaf " << leaf;
      EXPECT_EQ(pend, std::vector<double>(end.begin() + leaf * SS, end.begin() + (leaf + 1) * SS))
          << "the leaf's end state is the path's final state";
      leaf++;
    }
  }
}

TEST(Gdn, ChunkedFormEqualsRecurrentOnAwkwardTrees) {
  std::mt19937_64 rng(8);
  struct Case {
    int nodes, max_len, chunk;
    double p_root;
  };
  // One-token nodes and a chunk of 4 (many chunks, many partial); wide fans; a long chain with
  // nodes longer than a 64-row chunk.
  for (const Case& c : {Case{12, 1, 4, 0.1}, Case{10, 9, 4, 0.3}, Case{6, 150, 64, 0.0}, Case{20, 3, 2, 0.5}}) {
    const Layout l = random_layout(rng, c.nodes, c.max_len, c.p_root);
    GdnInputs in = random_inputs(rng, l, 2, 4, 4, 3, true);
    const size_t no = (size_t)l.N * 4 * 3, ne = (size_t)l.nodes() * 4 * 4 * 3;
    std::vector<double> o1(no), o2(no), e1(ne), e2(ne);
    gdn_tree_forward(o1.data(), e1.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                     in.init.data(), in.t);
    gdn_tree_forward_chunked(o2.data(), e2.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                             in.beta.data(), in.init.data(), in.t, c.chunk);
    EXPECT_LE(rel_error(o2, o1), 1e-12) << "outputs, chunk " << c.chunk << ", " << l.N << " rows";
    EXPECT_LE(rel_error(e2, e1), 1e-12) << "end states, chunk " << c.chunk;
  }
}

// The chunked backward (the algorithm of a GPU kernel) equals the recurrent one on the same
// awkward trees, with initial states and end-state gradients, chunks of 2 to 64 rows: 1e-10
// relative normwise (the chunked form reorders fp64 sums through two triangular solves).
TEST(Gdn, ChunkedBackwardEqualsRecurrentOnAwkwardTrees) {
  std::mt19937_64 rng(18);
  struct Case {
    int nodes, max_len, chunk;
    double p_root;
  };
  for (const Case& c : {Case{12, 1, 4, 0.1}, Case{10, 9, 4, 0.3}, Case{6, 150, 64, 0.0}, Case{20, 3, 2, 0.5},
                        Case{8, 30, 7, 0.2}}) {
    const Layout l = random_layout(rng, c.nodes, c.max_len, c.p_root);
    GdnInputs in = random_inputs(rng, l, 2, 4, 4, 3, true);
    const int N = l.N, nv = 4, dv = 3;
    const std::vector<double> dO = randn(rng, (size_t)N * nv * dv);
    const std::vector<double> dE = randn(rng, (size_t)l.nodes() * nv * 4 * 3, 0.3);
    auto run = [&](bool chunked) {
      std::vector<std::vector<double>> out = {std::vector<double>(in.q.size(), 0.0), std::vector<double>(in.k.size(), 0.0),
                                              std::vector<double>(in.v.size(), 0.0), std::vector<double>(in.g.size(), 0.0),
                                              std::vector<double>(in.beta.size(), 0.0),
                                              std::vector<double>(in.init.size(), 0.0)};
      if (chunked)
        gdn_tree_backward_chunked(out[0].data(), out[1].data(), out[2].data(), out[3].data(), out[4].data(),
                                  out[5].data(), dO.data(), dE.data(), in.q.data(), in.k.data(), in.v.data(),
                                  in.g.data(), in.beta.data(), in.init.data(), in.t, c.chunk);
      else
        gdn_tree_backward(out[0].data(), out[1].data(), out[2].data(), out[3].data(), out[4].data(), out[5].data(),
                          dO.data(), dE.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                          in.init.data(), in.t);
      return out;
    };
    const auto want = run(false), got = run(true);
    const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dinit"};
    for (int i = 0; i < 6; ++i)
      EXPECT_LE(rel_error(got[i], want[i]), 1e-10) << names[i] << ", chunk " << c.chunk << ", " << N << " rows";
  }
}

TEST(Gdn, DeltaRuleGradientByFiniteDifferences) {
  std::mt19937_64 rng(9);
  for (const bool with_init : {false, true}) {
    const Layout l = random_layout(rng, 6, 3, 0.2);
    GdnInputs in = random_inputs(rng, l, 1, 2, 3, 2, with_init);
    const int N = l.N, nv = 2, dk = 3, dv = 2;
    const size_t SS = (size_t)nv * dk * dv;
    const std::vector<double> R = randn(rng, (size_t)N * nv * dv);
    // The objective also weighs every node's end state (the gradient a gateway or cache feeds back).
    const std::vector<double> Re = randn(rng, (size_t)l.nodes() * SS, 0.3);
    std::vector<double> o((size_t)N * nv * dv), end((size_t)l.nodes() * SS);
    auto objective = [&] {
      gdn_tree_forward(o.data(), end.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                       with_init ? in.init.data() : nullptr, in.t);
      return dot_objective(o, R) + dot_objective(end, Re);
    };
    objective();
    std::vector<double> dq(in.q.size(), 0.0), dk_(in.k.size(), 0.0), dv_(in.v.size(), 0.0), dg(in.g.size(), 0.0),
        db(in.beta.size(), 0.0), dinit(in.init.size(), 0.0);
    gdn_tree_backward(dq.data(), dk_.data(), dv_.data(), dg.data(), db.data(), with_init ? dinit.data() : nullptr,
                      R.data(), Re.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                      with_init ? in.init.data() : nullptr, in.t);
    const std::string what = with_init ? " (with initial state)" : "";
    check_gradient("dq" + what, &in.q, dq, objective);
    check_gradient("dk" + what, &in.k, dk_, objective);
    check_gradient("dv" + what, &in.v, dv_, objective);
    check_gradient("dg" + what, &in.g, dg, objective);
    check_gradient("dbeta" + what, &in.beta, db, objective);
    if (with_init) check_gradient("dinit", &in.init, dinit, objective);
  }
}

TEST(Gdn, GroupedHeadsShareKeysAndRejectBadShapes) {
  std::mt19937_64 rng(10);
  const Layout l = random_layout(rng, 5, 3);
  // Two value heads on one key head: their q/k gradients sum into it (checked by differences).
  GdnInputs in = random_inputs(rng, l, 1, 2, 2, 2, false);
  const std::vector<double> R = randn(rng, (size_t)l.N * 2 * 2);
  std::vector<double> o((size_t)l.N * 4);
  auto objective = [&] {
    gdn_tree_forward(o.data(), nullptr, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), nullptr,
                     in.t);
    return dot_objective(o, R);
  };
  objective();
  std::vector<double> dq(in.q.size(), 0.0), dk_(in.k.size(), 0.0), dv_(in.v.size(), 0.0), dg(in.g.size(), 0.0),
      db(in.beta.size(), 0.0);
  gdn_tree_backward(dq.data(), dk_.data(), dv_.data(), dg.data(), db.data(), nullptr, R.data(), nullptr, in.q.data(),
                    in.k.data(), in.v.data(), in.g.data(), in.beta.data(), nullptr, in.t);
  check_gradient("dq", &in.q, dq, objective);
  check_gradient("dk", &in.k, dk_, objective);
  // Value head h reads key head h / (nv / nk) (HF's repeat_interleave): nk = 2, nv = 4 equals
  // nk = 4 with each key head written twice in a row.
  {
    const Layout l2 = random_layout(rng, 6, 3);
    GdnInputs g2 = random_inputs(rng, l2, 2, 4, 3, 2, false);
    std::vector<double> o2((size_t)l2.N * 4 * 2), o4(o2.size()), q4, k4;
    for (int i = 0; i < l2.N; i++)
      for (int h = 0; h < 4; h++)
        for (int a = 0; a < 3; a++) {
          q4.push_back(g2.q[((size_t)i * 2 + h / 2) * 3 + a]);
          k4.push_back(g2.k[((size_t)i * 2 + h / 2) * 3 + a]);
        }
    gdn_tree_forward(o2.data(), nullptr, g2.q.data(), g2.k.data(), g2.v.data(), g2.g.data(), g2.beta.data(), nullptr,
                     g2.t);
    GdnTree t4 = g2.t;
    t4.nk = 4;
    gdn_tree_forward(o4.data(), nullptr, q4.data(), k4.data(), g2.v.data(), g2.g.data(), g2.beta.data(), nullptr, t4);
    EXPECT_EQ(o2, o4);
  }
  GdnTree bad = in.t;
  bad.nv = 3;  // not a multiple of nk = 2
  bad.nk = 2;
  try {
    gdn_tree_forward(o.data(), nullptr, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), nullptr,
                     bad);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("gdn_tree_forward: expected nv a positive multiple of nk, got nk=2 nv=3", 0),
              0u)
        << e.what();
  }
}

}  // namespace
}  // namespace tt::cpu
