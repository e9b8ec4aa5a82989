// Tree attention CPU reference: forward against a dense brute-force reference (explicit
// ancestor check per (query, key) pair) on random trees, finite-difference gradient checks of
// dq/dk/dv and external-prefix dk/dv, branch isolation (no leakage between siblings or trees),
// determinism across thread counts, and layout validation.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/parallel.h"
#include "base/check.h"
#include "ops/cpu/attention.h"
#include "tests/ops/test_util.h"

namespace tt::cpu {
namespace {

using test::randn;

enum class Shape { kRandom, kChain, kFan, kSingleToken };

struct Layout {
  int N = 0;
  std::vector<int32_t> start, len, parent;
  bool bidirectional = false;
  AttnLayout view() const {
    return AttnLayout{(int)start.size(), start.data(), len.data(), parent.data(), bidirectional};
  }
};

// Appends one random tree of n_nodes nodes, renumbered into DFS preorder.
void add_tree(std::mt19937_64& rng, Shape shape, int n_nodes, int max_len, Layout* L) {
  std::vector<int> par(n_nodes, -1);
  for (int n = 1; n < n_nodes; n++) {
    if (shape == Shape::kChain) par[n] = n - 1;
    else if (shape == Shape::kFan) par[n] = 0;
    else par[n] = std::uniform_int_distribution<int>(0, n - 1)(rng);
  }
  std::vector<std::vector<int>> children(n_nodes);
  for (int n = 1; n < n_nodes; n++) children[par[n]].push_back(n);
  std::vector<int> order, stack = {0}, new_id(n_nodes);
  while (!stack.empty()) {
    const int n = stack.back();
    stack.pop_back();
    new_id[n] = (int)order.size();
    order.push_back(n);
    for (auto it = children[n].rbegin(); it != children[n].rend(); ++it) stack.push_back(*it);
  }
  const int base = (int)L->start.size();
  std::uniform_int_distribution<int> len_dist(1, max_len);
  for (int n : order) {
    const int len = shape == Shape::kSingleToken ? 1 : len_dist(rng);
    L->start.push_back(L->N);
    L->len.push_back(len);
    L->parent.push_back(par[n] < 0 ? -1 : base + new_id[par[n]]);
    L->N += len;
  }
}

// An external prefix owned by the test: its tensors and the view handed to the op.
struct Prefix {
  std::vector<double> k, v, dk, dv;
  int len = 0, q_begin = 0, q_end = 0;
  bool grad = true;
  uint64_t heads = ~uint64_t(0);  // the KV heads that read it
};

template <class T>
std::vector<ExternalKV<T>> views(std::vector<Prefix>& ps, std::vector<std::vector<T>>* store) {
  store->clear();
  for (auto& p : ps) {
    store->push_back(test::cast<T>(p.k));
    store->push_back(test::cast<T>(p.v));
    store->push_back(test::cast<T>(p.dk));
    store->push_back(test::cast<T>(p.dv));
  }
  std::vector<ExternalKV<T>> ext;
  for (size_t e = 0; e < ps.size(); e++) {
    ExternalKV<T> x;
    x.k = (*store)[4 * e].data();
    x.v = (*store)[4 * e + 1].data();
    x.dk = ps[e].grad ? (*store)[4 * e + 2].data() : nullptr;
    x.dv = ps[e].grad ? (*store)[4 * e + 3].data() : nullptr;
    x.len = ps[e].len;
    x.q_begin = ps[e].q_begin;
    x.q_end = ps[e].q_end;
    x.heads = ps[e].heads;
    ext.push_back(x);
  }
  return ext;
}

// Dense reference in fp64: key j of the batch is visible from query i exactly when j's node is
// i's node or one of its ancestors, and j <= i (bidirectional layouts: or j is in i's node).
void reference_forward(std::vector<double>* out, std::vector<double>* lse, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v, const Layout& L,
                       const std::vector<Prefix>& ext, int NH, int NKV, int HS) {
  const int N = L.N;
  std::vector<int> node_of(N);
  for (size_t n = 0; n < L.start.size(); n++) {
    for (int i = L.start[n]; i < L.start[n] + L.len[n]; i++) node_of[i] = (int)n;
  }
  auto ancestor_or_self = [&](int a, int n) {
    for (; n >= 0; n = L.parent[n]) {
      if (n == a) return true;
    }
    return false;
  };
  out->assign((size_t)N * NH * HS, 0.0);
  lse->assign((size_t)N * NH, 0.0);
  const double scale = 1.0 / std::sqrt((double)HS);
  for (int i = 0; i < N; i++) {
    for (int h = 0; h < NH; h++) {
      const int g = h / (NH / NKV);
      const double* qi = q.data() + ((size_t)i * NH + h) * HS;
      std::vector<double> s;
      std::vector<const double*> vs;
      auto add = [&](const double* kj, const double* vj) {
        double d = 0;
        for (int x = 0; x < HS; x++) d += qi[x] * kj[x];
        s.push_back(scale * d);
        vs.push_back(vj);
      };
      for (const Prefix& p : ext) {
        if (i < p.q_begin || i >= p.q_end || !((p.heads >> g) & 1)) continue;
        for (int j = 0; j < p.len; j++) {
          add(p.k.data() + ((size_t)j * NKV + g) * HS, p.v.data() + ((size_t)j * NKV + g) * HS);
        }
      }
      for (int j = 0; j < N; j++) {
        if (!ancestor_or_self(node_of[j], node_of[i])) continue;
        if (j > i && !(L.bidirectional && node_of[j] == node_of[i])) continue;
        add(k.data() + ((size_t)j * NKV + g) * HS, v.data() + ((size_t)j * NKV + g) * HS);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double x : s) sum += std::exp(x - mx);
      double* o = out->data() + ((size_t)i * NH + h) * HS;
      for (size_t t = 0; t < s.size(); t++) {
        for (int x = 0; x < HS; x++) o[x] += std::exp(s[t] - mx) / sum * vs[t][x];
      }
      (*lse)[(size_t)i * NH + h] = mx + std::log(sum);
    }
  }
}

// Random q, k, v and prefixes for a layout; prefix query ranges are random sub-ranges that may
// cut through nodes.
struct Problem {
  Layout L;
  int NH, NKV, HS;
  std::vector<double> q, k, v;
  std::vector<Prefix> ext;
};

// head_sets: each prefix is read by a random non-empty subset of the KV heads (a segment's tail
// by the local heads, its retrieval prefix by the long-range ones).
Problem make_problem(std::mt19937_64& rng, Layout L, int NH, int NKV, int HS, int n_ext, bool ext_grad,
                     bool head_sets = false) {
  Problem p{std::move(L), NH, NKV, HS, {}, {}, {}, {}};
  const int N = p.L.N;
  p.q = randn(rng, (size_t)N * NH * HS);
  p.k = randn(rng, (size_t)N * NKV * HS);
  p.v = randn(rng, (size_t)N * NKV * HS);
  for (int e = 0; e < n_ext; e++) {
    Prefix x;
    x.len = std::uniform_int_distribution<int>(1, 5)(rng);
    x.k = randn(rng, (size_t)x.len * NKV * HS);
    x.v = randn(rng, (size_t)x.len * NKV * HS);
    x.dk = randn(rng, x.k.size());
    x.dv = randn(rng, x.v.size());
    int a = std::uniform_int_distribution<int>(0, N)(rng), b = std::uniform_int_distribution<int>(0, N)(rng);
    if (e == 0) a = 0, b = N;  // one prefix seen by the whole batch
    x.q_begin = std::min(a, b);
    x.q_end = std::max(a, b);
    x.grad = ext_grad;
    if (head_sets) x.heads = std::uniform_int_distribution<uint64_t>(1, (uint64_t(1) << NKV) - 1)(rng);
    p.ext.push_back(x);
  }
  return p;
}

template <class T>
void run_forward(const Problem& p, std::vector<double>* out, std::vector<double>* lse) {
  std::vector<Prefix> ext = p.ext;
  std::vector<std::vector<T>> store;
  const std::vector<ExternalKV<T>> xv = views<T>(ext, &store);
  const int N = p.L.N;
  const std::vector<T> q = test::cast<T>(p.q), k = test::cast<T>(p.k), v = test::cast<T>(p.v);
  std::vector<T> o((size_t)N * p.NH * p.HS), l((size_t)N * p.NH);
  attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), p.L.view(), xv.data(), (int)xv.size(), N,
                    p.NH, p.NKV, p.HS);
  out->assign(o.begin(), o.end());
  lse->assign(l.begin(), l.end());
}

struct AttnCase {
  const char* name;
  Shape shape;
  int n_trees, nodes_per_tree, max_len;
  int NH, NKV, HS;
  int n_ext;
  bool head_sets = false;  // prefixes read by subsets of the KV heads
};

Layout make_layout(std::mt19937_64& rng, const AttnCase& c) {
  Layout L;
  for (int t = 0; t < c.n_trees; t++) add_tree(rng, c.shape, c.nodes_per_tree, c.max_len, &L);
  return L;
}

// Small cases run both checks; large ones only the forward check (finite differences take two
// forward calls per input element).
const AttnCase kSmallCases[] = {
    {"random_mha_hs8", Shape::kRandom, 1, 6, 4, 2, 2, 8, 0},
    {"random_gqa2_hs8_prefixes", Shape::kRandom, 1, 6, 4, 4, 2, 8, 2},
    {"forest_gqa4_hs16_prefixes", Shape::kRandom, 3, 4, 3, 4, 1, 16, 2},
    {"single_token_nodes_gqa2", Shape::kSingleToken, 2, 12, 1, 4, 2, 8, 1},
    {"deep_chain_gqa4", Shape::kChain, 1, 12, 3, 4, 1, 8, 1},
    {"wide_fan_hs16", Shape::kFan, 1, 12, 3, 2, 1, 16, 1},
    {"one_long_node", Shape::kChain, 1, 1, 40, 2, 2, 8, 1},
    {"long_nodes_gqa4_partial_prefixes", Shape::kRandom, 1, 4, 20, 4, 1, 8, 3},
    {"prefix_head_sets_gqa2", Shape::kRandom, 1, 6, 4, 8, 4, 8, 3, true},
    {"prefix_head_sets_mha", Shape::kChain, 1, 5, 3, 3, 3, 8, 2, true},
};
const AttnCase kLargeCases[] = {
    {"large_random_forest_gqa2_hs16", Shape::kRandom, 5, 30, 8, 8, 4, 16, 3},
    {"large_deep_chain_gqa4", Shape::kSingleToken, 1, 150, 1, 4, 1, 16, 2},
    {"large_wide_fan_mha_hs8", Shape::kFan, 2, 60, 5, 2, 2, 8, 2},
};

std::string case_name(const ::testing::TestParamInfo<AttnCase>& info) { return info.param.name; }

class AttentionForward : public ::testing::TestWithParam<AttnCase> {};
class AttentionGradient : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionForward, MatchesDenseReference) {
  const AttnCase c = GetParam();
  std::mt19937_64 rng(100);
  const Problem p = make_problem(rng, make_layout(rng, c), c.NH, c.NKV, c.HS, c.n_ext, true, c.head_sets);
  std::vector<double> ref_out, ref_lse;
  reference_forward(&ref_out, &ref_lse, p.q, p.k, p.v, p.L, p.ext, c.NH, c.NKV, c.HS);
  std::vector<double> out, lse;
  run_forward<double>(p, &out, &lse);
  // fp64 against fp64 with another summation order: each output is a convex combination of
  // O(1) values over at most a few hundred keys, so rounding stays below ~1e-13.
  EXPECT_LE(test::rel_error(out, ref_out), 1e-12);
  EXPECT_LE(test::rel_error(lse, ref_lse), 1e-12);

  // float: the reference runs in fp64 on the float-rounded inputs; the op accumulates in fp64 and
  // rounds once on output (2^-24 ~ 6e-8), so 1e-5 leaves two orders of magnitude of margin.
  Problem pf = p;
  auto round_f = [](std::vector<double>* x) {
    for (double& e : *x) e = (double)(float)e;
  };
  round_f(&pf.q), round_f(&pf.k), round_f(&pf.v);
  for (Prefix& x : pf.ext) round_f(&x.k), round_f(&x.v);
  reference_forward(&ref_out, &ref_lse, pf.q, pf.k, pf.v, pf.L, pf.ext, c.NH, c.NKV, c.HS);
  run_forward<float>(pf, &out, &lse);
  EXPECT_LE(test::rel_error(out, ref_out), 1e-5);
  EXPECT_LE(test::rel_error(lse, ref_lse), 1e-5);
}

// L = sum(out * R): checks dq, dk, dv and every prefix's dk, dv (which must accumulate onto
// their previous contents) by central differences.
TEST_P(AttentionGradient, MatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  std::mt19937_64 rng(200);
  Problem p = make_problem(rng, make_layout(rng, c), c.NH, c.NKV, c.HS, c.n_ext, true, c.head_sets);
  const int N = p.L.N;
  const std::vector<double> R = randn(rng, (size_t)N * c.NH * c.HS);
  auto objective = [&] {
    std::vector<double> out, lse;
    run_forward<double>(p, &out, &lse);
    return test::dot_objective(out, R);
  };
  std::vector<double> out, lse;
  run_forward<double>(p, &out, &lse);
  std::vector<Prefix> ext = p.ext;
  std::vector<std::vector<double>> store;
  const std::vector<ExternalKV<double>> xv = views<double>(ext, &store);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> dq(p.q.size(), nan), dk(p.k.size(), nan), dv(p.v.size(), nan);  // overwritten
  attention_backward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(), p.q.data(), p.k.data(),
                     p.v.data(), p.L.view(), xv.data(), (int)xv.size(), N, c.NH, c.NKV, c.HS);
  test::check_gradient("dq", &p.q, dq, objective);
  test::check_gradient("dk", &p.k, dk, objective);
  test::check_gradient("dv", &p.v, dv, objective);
  for (size_t e = 0; e < ext.size(); e++) {
    std::vector<double> dke = store[4 * e + 2], dve = store[4 * e + 3];
    for (size_t x = 0; x < dke.size(); x++) dke[x] -= p.ext[e].dk[x];
    for (size_t x = 0; x < dve.size(); x++) dve[x] -= p.ext[e].dv[x];
    if (p.ext[e].q_begin == p.ext[e].q_end) continue;  // seen by no query: gradient zero
    test::check_gradient("ext dk " + std::to_string(e), &p.ext[e].k, dke, objective);
    test::check_gradient("ext dv " + std::to_string(e), &p.ext[e].v, dve, objective);
  }
}

INSTANTIATE_TEST_SUITE_P(Small, AttentionForward, ::testing::ValuesIn(kSmallCases), case_name);
INSTANTIATE_TEST_SUITE_P(Large, AttentionForward, ::testing::ValuesIn(kLargeCases), case_name);
INSTANTIATE_TEST_SUITE_P(Small, AttentionGradient, ::testing::ValuesIn(kSmallCases), case_name);

// float gradients against fp64 gradients of the same float-rounded inputs. The op sums in fp64;
// the float path differs by the rounding of its inputs out and lse and of its results (~6e-8
// relative each), which p = exp(scale s - lse) and D = dout . out carry into the gradients with
// O(1) factors, so 1e-5 relative leaves two orders of magnitude of margin.
// The bidirectional visibility mode (a vision tower's images: every query of a node sees all of
// it; ancestors and prefixes as usual): forward against the dense reference, gradients by finite
// differences, on a forest of random trees with prefixes.
TEST(Attention, BidirectionalNodesMatchReferenceAndFiniteDifferences) {
  std::mt19937_64 rng(240);
  Layout L;
  for (int t = 0; t < 3; t++) add_tree(rng, Shape::kRandom, 3, 5, &L);
  add_tree(rng, Shape::kChain, 1, 9, &L);  // one image: a one-node tree
  L.bidirectional = true;
  const int NH = 4, NKV = 2, HS = 8;
  Problem p = make_problem(rng, L, NH, NKV, HS, 2, true);
  std::vector<double> out, lse, ref_out, ref_lse;
  run_forward<double>(p, &out, &lse);
  reference_forward(&ref_out, &ref_lse, p.q, p.k, p.v, p.L, p.ext, NH, NKV, HS);
  for (size_t x = 0; x < out.size(); x++) ASSERT_NEAR(out[x], ref_out[x], 1e-12) << "out " << x;
  for (size_t x = 0; x < lse.size(); x++) ASSERT_NEAR(lse[x], ref_lse[x], 1e-12) << "lse " << x;
  // The mode changes the result (the 9-token image's early queries see later keys).
  Problem causal = p;
  causal.L.bidirectional = false;
  std::vector<double> cout_, clse;
  run_forward<double>(causal, &cout_, &clse);
  EXPECT_NE(out, cout_);
  const std::vector<double> R = randn(rng, out.size());
  auto objective = [&] {
    std::vector<double> o, l;
    run_forward<double>(p, &o, &l);
    return test::dot_objective(o, R);
  };
  std::vector<Prefix> ext = p.ext;
  std::vector<std::vector<double>> store;
  const std::vector<ExternalKV<double>> xv = views<double>(ext, &store);
  std::vector<double> dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
  attention_backward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(), p.q.data(), p.k.data(),
                     p.v.data(), p.L.view(), xv.data(), (int)xv.size(), p.L.N, NH, NKV, HS);
  test::check_gradient("dq", &p.q, dq, objective);
  test::check_gradient("dk", &p.k, dk, objective);
  test::check_gradient("dv", &p.v, dv, objective);
}

TEST(Attention, FloatBackwardMatchesDouble) {
  std::mt19937_64 rng(250);
  Layout L;
  for (int t = 0; t < 2; t++) add_tree(rng, Shape::kRandom, 8, 12, &L);
  Problem p = make_problem(rng, L, 4, 2, 16, 2, true);
  const int N = p.L.N;
  auto round_f = [](std::vector<double>* x) {
    for (double& e : *x) e = (double)(float)e;
  };
  round_f(&p.q), round_f(&p.k), round_f(&p.v);
  for (Prefix& x : p.ext) round_f(&x.k), round_f(&x.v), round_f(&x.dk), round_f(&x.dv);
  std::vector<double> dout = randn(rng, p.q.size());
  round_f(&dout);
  auto grads = [&](auto zero) {
    using T = decltype(zero);
    std::vector<Prefix> ext = p.ext;
    std::vector<std::vector<T>> store;
    const std::vector<ExternalKV<T>> xv = views<T>(ext, &store);
    const std::vector<T> q = test::cast<T>(p.q), k = test::cast<T>(p.k), v = test::cast<T>(p.v);
    const std::vector<T> g = test::cast<T>(dout);
    std::vector<T> out(q.size()), lse((size_t)N * p.NH), dq(q.size()), dk(k.size()), dv(v.size());
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.L.view(), xv.data(), 2, N, p.NH,
                      p.NKV, p.HS);
    attention_backward(dq.data(), dk.data(), dv.data(), g.data(), out.data(), lse.data(), q.data(), k.data(),
                       v.data(), p.L.view(), xv.data(), 2, N, p.NH, p.NKV, p.HS);
    std::vector<std::vector<double>> r;
    for (auto* t : {&dq, &dk, &dv, &store[2], &store[3], &store[6], &store[7]}) r.emplace_back(t->begin(), t->end());
    return r;
  };
  const auto g64 = grads(0.0);
  const auto g32 = grads(0.0f);
  const char* names[] = {"dq", "dk", "dv", "ext0 dk", "ext0 dv", "ext1 dk", "ext1 dv"};
  for (size_t t = 0; t < g64.size(); t++) EXPECT_LE(test::rel_error(g32[t], g64[t]), 1e-5) << names[t];
}

// A null prefix gradient is skipped and changes nothing else; a non-null one accumulates.
TEST(Attention, NullPrefixGradientsAreSkipped) {
  std::mt19937_64 rng(300);
  Layout L;
  add_tree(rng, Shape::kRandom, 5, 3, &L);
  Problem p = make_problem(rng, L, 4, 2, 8, 2, true);
  const int N = p.L.N;
  p.ext[1].q_begin = 1;
  p.ext[1].q_end = N - 1;
  std::vector<double> out, lse;
  run_forward<double>(p, &out, &lse);
  const std::vector<double> dout = randn(rng, out.size());
  auto backward = [&](bool grad1, std::vector<std::vector<double>>* store) {
    std::vector<Prefix> ext = p.ext;
    ext[1].grad = grad1;
    const std::vector<ExternalKV<double>> xv = views<double>(ext, store);
    std::vector<double> dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), p.q.data(),
                       p.k.data(), p.v.data(), p.L.view(), xv.data(), (int)xv.size(), N, 4, 2, 8);
    dq.insert(dq.end(), dk.begin(), dk.end());
    dq.insert(dq.end(), dv.begin(), dv.end());
    return dq;
  };
  std::vector<std::vector<double>> with, without;
  const std::vector<double> g_with = backward(true, &with), g_without = backward(false, &without);
  EXPECT_EQ(g_with, g_without);
  EXPECT_EQ(with[2], without[2]);  // prefix 0 dk: identical either way
  EXPECT_EQ(with[3], without[3]);
  EXPECT_EQ(without[6], p.ext[1].dk);  // prefix 1 buffers untouched when not handed over
  EXPECT_EQ(without[7], p.ext[1].dv);
  EXPECT_NE(with[6], p.ext[1].dk);  // and accumulated into when handed over
}

// Two trees. Tree 0: node 0 (root) with children 1 and 3; 2 is a child of 1, 4 a child of 3.
// Tree 1: node 5 (root) with child 6.
Layout branchy_layout() {
  Layout L;
  L.start = {0, 3, 5, 7, 10, 11, 13};
  L.len = {3, 2, 2, 3, 1, 2, 2};
  L.parent = {-1, 0, 1, 0, 3, -1, 5};
  L.N = 15;
  return L;
}

// Queries of each node (nodes listed), as packed index ranges.
std::vector<int> tokens_of(const Layout& L, std::vector<int> nodes) {
  std::vector<int> t;
  for (int n : nodes) {
    for (int i = L.start[n]; i < L.start[n] + L.len[n]; i++) t.push_back(i);
  }
  return t;
}

void perturb_kv(Problem* p, const std::vector<int>& tokens) {
  for (int j : tokens) {
    for (int x = 0; x < p->NKV * p->HS; x++) {
      p->k[(size_t)j * p->NKV * p->HS + x] += 0.5;
      p->v[(size_t)j * p->NKV * p->HS + x] -= 0.5;
    }
  }
}

// Compares the rows of `tokens` of two (N, NH, HS) outputs: bitwise equal or all different.
void expect_rows(const std::vector<double>& a, const std::vector<double>& b, const std::vector<int>& tokens,
                 int row, bool equal, const char* what) {
  for (int i : tokens) {
    const bool same = std::equal(a.begin() + (size_t)i * row, a.begin() + (size_t)(i + 1) * row,
                                 b.begin() + (size_t)i * row);
    EXPECT_EQ(same, equal) << what << ": query " << i;
  }
}

TEST(Attention, SiblingBranchesAndTreesDoNotLeak) {
  std::mt19937_64 rng(400);
  const Problem base = make_problem(rng, branchy_layout(), 4, 2, 8, 0, false);
  const int row = base.NH * base.HS;
  std::vector<double> out0, lse0, out1, lse1;
  run_forward<double>(base, &out0, &lse0);

  // Perturbing the subtree {1, 2} changes exactly its own queries.
  Problem p = base;
  perturb_kv(&p, tokens_of(p.L, {1, 2}));
  run_forward<double>(p, &out1, &lse1);
  expect_rows(out0, out1, tokens_of(p.L, {0, 3, 4, 5, 6}), row, true, "sibling subtree {1,2}");
  expect_rows(out0, out1, tokens_of(p.L, {1, 2}), row, false, "subtree {1,2} itself");

  // Perturbing the root's first token changes every query of tree 0 and none of tree 1.
  p = base;
  perturb_kv(&p, {0});
  run_forward<double>(p, &out1, &lse1);
  expect_rows(out0, out1, tokens_of(p.L, {0, 1, 2, 3, 4}), row, false, "ancestor token 0");
  expect_rows(out0, out1, tokens_of(p.L, {5, 6}), row, true, "other tree");

  // Perturbing tree 1 leaves tree 0 alone.
  p = base;
  perturb_kv(&p, tokens_of(p.L, {5, 6}));
  run_forward<double>(p, &out1, &lse1);
  expect_rows(out0, out1, tokens_of(p.L, {0, 1, 2, 3, 4}), row, true, "tree 1 perturbed");

  // Backward: a gradient only on branch {3, 4} reaches no key of {1, 2} or of tree 1.
  std::vector<double> dout(out0.size(), 0.0);
  for (int i : tokens_of(base.L, {3, 4})) {
    for (int x = 0; x < row; x++) dout[(size_t)i * row + x] = 1.0 + x;
  }
  std::vector<double> dq(base.q.size()), dk(base.k.size()), dv(base.v.size());
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out0.data(), lse0.data(), base.q.data(),
                     base.k.data(), base.v.data(), base.L.view(), (const ExternalKV<double>*)nullptr, 0, base.L.N,
                     base.NH, base.NKV, base.HS);
  const int kv_row = base.NKV * base.HS;
  for (int j : tokens_of(base.L, {1, 2, 5, 6})) {
    for (int x = 0; x < kv_row; x++) {
      EXPECT_EQ(dk[(size_t)j * kv_row + x], 0.0) << "key " << j;
      EXPECT_EQ(dv[(size_t)j * kv_row + x], 0.0) << "key " << j;
    }
  }
  for (int j : tokens_of(base.L, {0, 3, 4})) EXPECT_NE(dv[(size_t)j * kv_row], 0.0) << "key " << j;
}

TEST(Attention, SameResultForAnyThreadCount) {
  std::mt19937_64 rng(500);
  Layout L;
  for (int t = 0; t < 3; t++) add_tree(rng, Shape::kRandom, 20, 6, &L);
  Problem p = make_problem(rng, L, 4, 2, 16, 2, true);
  const int N = p.L.N;
  const std::vector<float> q = test::cast<float>(p.q), k = test::cast<float>(p.k), v = test::cast<float>(p.v);
  const std::vector<float> dout = test::cast<float>(randn(rng, p.q.size()));
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> store;
    std::vector<Prefix> ext = p.ext;
    const std::vector<ExternalKV<float>> xv = views<float>(ext, &store);
    std::vector<float> out(q.size()), lse((size_t)N * 4), dq(q.size()), dk(k.size()), dv(v.size());
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.L.view(), xv.data(), 2, N, 4, 2, 16);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                       v.data(), p.L.view(), xv.data(), 2, N, 4, 2, 16);
    for (auto* t : {&lse, &dq, &dk, &dv, &store[2], &store[3], &store[6], &store[7]}) {
      out.insert(out.end(), t->begin(), t->end());
    }
    return out;
  };
  const int max_threads = omp_get_max_threads();
  const int64_t min_work = omp_min_work().exchange(0);  // every region on its team, however small
  const std::vector<float> one = run(1), many = run(3);
  omp_set_num_threads(max_threads);
  omp_min_work().store(min_work);
  EXPECT_EQ(one, many);
}

TEST(Attention, RejectsBadLayouts) {
  std::vector<double> buf(64), lse(8);
  auto forward = [&](std::vector<int32_t> start, std::vector<int32_t> len, std::vector<int32_t> parent, int N,
                     int NH = 2, int NKV = 1) {
    const AttnLayout L{(int)start.size(), start.data(), len.data(), parent.data()};
    attention_forward(buf.data(), lse.data(), buf.data(), buf.data(), buf.data(), L,
                      (const ExternalKV<double>*)nullptr, 0, N, NH, NKV, 4);
  };
  EXPECT_NO_THROW(forward({0, 2}, {2, 1}, {-1, 0}, 3));
  EXPECT_THROW(forward({0, 3}, {2, 1}, {-1, 0}, 4), tt::Error);   // gap between nodes
  EXPECT_THROW(forward({0, 2}, {2, 1}, {-1, 0}, 4), tt::Error);   // does not cover N
  EXPECT_THROW(forward({0, 2}, {2, 1}, {-1, 1}, 3), tt::Error);   // parent not before the node
  EXPECT_THROW(forward({0, 2}, {2, 1}, {-1, -2}, 3), tt::Error);  // bad parent
  EXPECT_THROW(forward({0, 2}, {2, 1}, {-1, 0}, 3, 3, 2), tt::Error);  // NH not a multiple of NKV
  std::vector<int32_t> start = {0}, len = {2}, parent = {-1};
  const AttnLayout L{1, start.data(), len.data(), parent.data()};
  ExternalKV<double> x;
  x.k = x.v = buf.data();
  x.len = 1;
  x.q_begin = 1;
  x.q_end = 3;  // past N = 2
  EXPECT_THROW(attention_forward(buf.data(), lse.data(), buf.data(), buf.data(), buf.data(), L, &x, 1, 2, 1, 1, 4),
               tt::Error);
}

}  // namespace
}  // namespace tt::cpu
