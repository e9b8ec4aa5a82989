// Cases for the CUDA tree attention tests: DFS-packed tree layouts that break tiling assumptions,
// fresh random bf16 inputs, and the fp64 CPU reference (ops/cpu/attention.h) on the same
// bf16-rounded values. Shared by the GPU test and the CPU emulation of the kernels.
//
// Tolerance rule (bf16 outputs): relative L2 error ||x - ref|| / ||ref|| <= kRelL2Bf16 = sqrt(3) u
// = 6.8e-3 against the fp64 reference on the same bf16 inputs, u = 2^-8 the unit roundoff of bf16
// (8 significant bits, round to nearest). lse is fp32 from exact bf16 products:
// |x - ref| <= 1e-4 max(1, |ref|). The derivation of kRelL2Bf16 is beside it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/attention.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/bf16.h"

namespace tt::cuda::attn_test {

// kRelL2Bf16, from the bf16 roundings on each output's path:
//  - The fp32 steps are negligible: bf16 x bf16 products are exact in fp32, and sums of at most a
//    few thousand terms (HS per S and dP element, the keys or queries of a tile, dq's key tiles)
//    and exp2 / log err by about terms x 2^-24 << u.
//  - A rounding to bf16 scales a value by (1 + d), |d| <= u, d of either sign. Every output here
//    is a sum of terms with independent random factors (q, k, v, dout are fresh N(0, 1)), and a
//    rounding perturbs each term independently, so the errors add like a random walk: relative
//    perturbations of at most u per term leave the sum's relative L2 error at most u, whatever
//    the reduction length (error and sum both grow as its square root). Independent roundings on
//    one path add in quadrature: sqrt(k) u for k roundings.
//  - Roundings per path: out: P before P V, then out (k = 2). dv: P before P^T dO, then dv (2).
//    dk, dq: dS before dS^T Q and dS K, then dk / dq, plus out itself (P and out roundings) through
//    D = dout . out, which here weighs at most one rounding more (|D| < |dP - D| where a row sees
//    more than a few keys) (k <= 3). dq's fp32 sum over key tiles adds no bf16 rounding; the
//    prefixes' dk / dv are added in fp32, without the last one (k <= 2). Hence sqrt(3) u.
//  - Without the random walk (every rounding error of a sum aligned) the bound would be u x
//    sum |terms| / |sum|, about u sqrt(visible keys): ~0.1 at a thousand keys, looser than any
//    error random inputs make, so the random-walk value stands.
//  - Check of the model: one rounding's RMS relative error is ~0.42 u for log-uniform mantissas
//    (the "bf16 rounding alone" figure the tests print, ~1.65e-3), so the expected errors are
//    0.42 sqrt(k) u = 2.3e-3 (k = 2) to 2.8e-3 (k = 3); the emulated kernels measure 1.9e-3 (out)
//    to 2.7e-3 (dq, dk). The bound takes |d| <= u instead of 0.42 u: 2.4x over the expectation.
constexpr double kBf16Roundoff = 1.0 / 256;                         // u = 2^-8
constexpr double kRelL2Bf16 = 1.7320508075688772 * kBf16Roundoff;  // sqrt(3) u = 6.77e-3
constexpr double kLseRel = 1e-4;

// A DFS-packed batch: node ranges in DFS order and subtree_end per token; bidirectional: every
// token of a node sees all of it (key_lo, the first token of each key's node; cpu::AttnLayout's
// bidirectional mode), else the causal tree.
struct TreeLayout {
  std::vector<int32_t> node_start, node_len, node_parent, subtree_end;
  int n = 0;
  bool bidirectional = false;
  std::vector<int32_t> key_lo() const {
    std::vector<int32_t> lo(n);
    for (size_t q = 0; q < node_start.size(); q++)
      for (int j = 0; j < node_len[q]; j++) lo[node_start[q] + j] = node_start[q];
    return lo;
  }
};

// Appends one tree given as (parent, len) per node, parent[0] = -1 and parent[i] < i (children
// in index order), laid out in DFS preorder.
inline void append_tree(TreeLayout& L, const std::vector<int>& parent, const std::vector<int>& len) {
  const int nn = (int)parent.size();
  std::vector<std::vector<int>> children(nn);
  for (int i = 1; i < nn; i++) children[parent[i]].push_back(i);
  std::vector<int> order, stack = {0};
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    order.push_back(v);
    for (auto c = children[v].rbegin(); c != children[v].rend(); ++c) stack.push_back(*c);
  }
  const int base = (int)L.node_start.size();
  std::vector<int> packed(nn);
  for (int k = 0; k < nn; k++) {
    const int v = order[k];
    packed[v] = base + k;
    L.node_start.push_back(L.n);
    L.node_len.push_back(len[v]);
    L.node_parent.push_back(parent[v] < 0 ? -1 : packed[parent[v]]);
    L.n += len[v];
  }
  L.subtree_end.resize(L.n);
  std::vector<int> end(nn);
  for (int k = nn - 1; k >= 0; k--) {
    const int v = order[k], q = base + k;
    end[v] = std::max(end[v], L.node_start[q] + L.node_len[q]);
    if (parent[v] >= 0) end[parent[v]] = std::max(end[parent[v]], end[v]);
  }
  for (int k = 0; k < nn; k++) {
    const int q = base + k;
    for (int j = 0; j < L.node_len[q]; j++) L.subtree_end[L.node_start[q] + j] = end[order[k]];
  }
}

inline int uniform(std::mt19937_64& rng, int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// A random tree of nn nodes with lengths in [lo, hi]; parents random among earlier nodes, biased
// to recent ones (deep trees).
inline void append_random_tree(TreeLayout& L, std::mt19937_64& rng, int nn, int lo, int hi) {
  std::vector<int> parent(nn, -1), len(nn);
  for (int i = 0; i < nn; i++) {
    len[i] = uniform(rng, lo, hi);
    if (i > 0) parent[i] = uniform(rng, 0, 3) == 0 ? uniform(rng, 0, i - 1) : uniform(rng, std::max(0, i - 3), i - 1);
  }
  append_tree(L, parent, len);
}

struct LayoutCase {
  std::string name;
  std::function<TreeLayout(std::mt19937_64&)> make;
};

inline std::vector<LayoutCase> layout_cases() {
  return {
      {"chain97", [](std::mt19937_64&) { TreeLayout L; append_tree(L, {-1}, {97}); return L; }},
      {"chain1025", [](std::mt19937_64&) { TreeLayout L; append_tree(L, {-1}, {1025}); return L; }},
      {"one_token_nodes",
       [](std::mt19937_64& rng) { TreeLayout L; append_random_tree(L, rng, 301, 1, 1); return L; }},
      {"deep_chain",
       [](std::mt19937_64& rng) {
         // a trunk of 250 nodes of 1-3 tokens, each with a one-token side leaf
         std::vector<int> parent = {-1}, len = {2};
         int trunk = 0;
         for (int s = 0; s < 250; s++) {
           parent.push_back(trunk);
           len.push_back(1);
           parent.push_back(trunk);
           len.push_back(uniform(rng, 1, 3));
           trunk = (int)parent.size() - 1;
         }
         TreeLayout L;
         append_tree(L, parent, len);
         return L;
       }},
      {"wide_fan",
       [](std::mt19937_64& rng) {
         std::vector<int> parent = {-1}, len = {37};
         for (int c = 0; c < 90; c++) {
           parent.push_back(0);
           len.push_back(uniform(rng, 1, 20));
         }
         TreeLayout L;
         append_tree(L, parent, len);
         return L;
       }},
      {"several_trees",
       [](std::mt19937_64& rng) {
         TreeLayout L;
         append_tree(L, {-1}, {1});
         append_random_tree(L, rng, 40, 1, 9);
         append_tree(L, {-1}, {130});
         append_random_tree(L, rng, 25, 3, 30);
         append_tree(L, {-1, 0, 0}, {5, 64, 63});
         return L;
       }},
      {"random_tree",
       [](std::mt19937_64& rng) {
         TreeLayout L;
         while (L.n < 1000) append_random_tree(L, rng, 60, 1, 40);
         return L;
       }},
      // Bidirectional: a vision tower's frames (one-node trees of 196 and 16 tokens: tiles that
      // straddle frames) and a random tree whose nodes are bidirectional inside.
      {"frames196",
       [](std::mt19937_64&) {
         TreeLayout L;
         for (int f = 0; f < 5; f++) append_tree(L, {-1}, {196});
         L.bidirectional = true;
         return L;
       }},
      {"frames16",
       [](std::mt19937_64&) {
         TreeLayout L;
         for (int f = 0; f < 37; f++) append_tree(L, {-1}, {16});
         L.bidirectional = true;
         return L;
       }},
      {"bidirectional_tree",
       [](std::mt19937_64& rng) {
         TreeLayout L;
         while (L.n < 700) append_random_tree(L, rng, 30, 1, 90);
         L.bidirectional = true;
         return L;
       }},
      {"comb",
       [](std::mt19937_64&) {
         // navigation episode: a prefix, then steps of a history node on the trunk and a leaf
         std::vector<int> parent = {-1}, len = {70};
         int trunk = 0;
         for (int s = 0; s < 6; s++) {
           parent.push_back(trunk);
           len.push_back(33);
           trunk = (int)parent.size() - 1;
           parent.push_back(trunk);
           len.push_back(50);
         }
         TreeLayout L;
         append_tree(L, parent, len);
         return L;
       }},
  };
}

// An external prefix of a case: its keys and values, the query range, and whether it takes
// gradients.
struct ExtCase {
  int len = 0, q_begin = 0, q_end = 0;
  bool grad = false;
  uint64_t heads = ~uint64_t(0);  // the KV heads that read it
  std::vector<float> k, v;        // (len, NKV, HS) bf16-representable
  std::vector<float> dk0, dv0;    // (len, NKV, HS) initial gradient buffers, bf16-representable
};

struct Inputs {
  TreeLayout layout;
  int NH = 0, NKV = 0, HS = 0;
  std::vector<float> q, k, v, dout;  // bf16-representable
  std::vector<ExtCase> ext;
};

// Host conversions of a whole tensor (round to nearest even / exact widening).
inline std::vector<cuda::bf16> to_bf16(const std::vector<float>& x) {
  std::vector<cuda::bf16> r(x.size());
  cuda::floats_to_bf16(r.data(), x.data(), x.size());
  return r;
}

inline std::vector<float> to_float(const std::vector<cuda::bf16>& x) {
  std::vector<float> r(x.size());
  cuda::bf16_to_floats(r.data(), x.data(), x.size());
  return r;
}

inline std::vector<float> random_bf16(std::mt19937_64& rng, size_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> x(n);
  for (auto& e : x) e = round_to_bf16(d(rng));
  return x;
}

// ext_mode: 0 none; 1 a prefix with gradients seen by all queries and one without gradients seen
// by a middle range; 2 head sets, as a segment's: a carried tail with gradients read by the even
// KV heads (the local ones) and a retrieval prefix without gradients read by the odd ones, both
// seen by all queries, and a prefix with gradients read by no head (it must stay untouched);
// 3 as many prefixes as a call takes (cuda::kMaxExternalKV), as a deep partition gateway's
// ancestor ranges: lengths 1 to 130 (one-row ranges, partial and whole key tiles), every third
// without gradients, every fourth seen by the queries from N / 4 on.
inline Inputs make_inputs(const LayoutCase& lc, int NH, int NKV, int HS, int ext_mode, std::mt19937_64& rng) {
  Inputs in;
  in.layout = lc.make(rng);
  in.NH = NH;
  in.NKV = NKV;
  in.HS = HS;
  const int N = in.layout.n;
  in.q = random_bf16(rng, (size_t)N * NH * HS, 1.f);
  in.k = random_bf16(rng, (size_t)N * NKV * HS, 1.f);
  in.v = random_bf16(rng, (size_t)N * NKV * HS, 1.f);
  in.dout = random_bf16(rng, (size_t)N * NH * HS, 1.f);
  if (ext_mode == 1) {
    ExtCase a;
    a.len = 77;
    a.q_begin = 0;
    a.q_end = N;
    a.grad = true;
    ExtCase b;
    b.len = 40;
    b.q_begin = N / 3;
    b.q_end = N - N / 5;
    b.grad = false;
    for (ExtCase* x : {&a, &b}) {
      const size_t sz = (size_t)x->len * NKV * HS;
      x->k = random_bf16(rng, sz, 1.f);
      x->v = random_bf16(rng, sz, 1.f);
      x->dk0 = random_bf16(rng, sz, 0.05f);
      x->dv0 = random_bf16(rng, sz, 0.05f);
      in.ext.push_back(*x);
    }
  }
  if (ext_mode == 2) {
    uint64_t even = 0;
    for (int g = 0; g < NKV; g += 2) even |= uint64_t(1) << g;
    ExtCase tail, ret, none;
    tail.len = 130;  // past one 128-key tile
    tail.grad = true;
    tail.heads = even;
    ret.len = 64;
    ret.heads = ~even & cuda::all_kv_heads(NKV);
    none.len = 50;
    none.grad = true;
    none.heads = 0;
    for (ExtCase* x : {&tail, &ret, &none}) {
      x->q_begin = 0;
      x->q_end = N;
      const size_t sz = (size_t)x->len * NKV * HS;
      x->k = random_bf16(rng, sz, 1.f);
      x->v = random_bf16(rng, sz, 1.f);
      x->dk0 = random_bf16(rng, sz, 0.05f);
      x->dv0 = random_bf16(rng, sz, 0.05f);
      in.ext.push_back(*x);
    }
  }
  if (ext_mode == 3) {
    for (int e = 0; e < cuda::kMaxExternalKV; e++) {
      ExtCase x;
      x.len = e % 8 == 7 ? 130 : 1 + (e * 37) % 50;
      x.q_begin = e % 4 == 1 ? N / 4 : 0;
      x.q_end = N;
      x.grad = e % 3 != 2;
      const size_t sz = (size_t)x.len * NKV * HS;
      x.k = random_bf16(rng, sz, 1.f);
      x.v = random_bf16(rng, sz, 1.f);
      x.dk0 = random_bf16(rng, sz, 0.05f);
      x.dv0 = random_bf16(rng, sz, 0.05f);
      in.ext.push_back(x);
    }
  }
  return in;
}

// Whether some KV head of NKV reads prefix x, and the elements of a gradient buffer of x (got,
// (len, NKV, HS)) in the heads that do not read it that differ from the initial buffer `init`
// (they must stay untouched).
inline bool read_by_some_head(const ExtCase& x, int NKV) {
  return (x.heads & cuda::all_kv_heads(NKV)) != 0;
}
inline int64_t unread_heads_changed(const std::vector<float>& got, const std::vector<float>& init, const ExtCase& x,
                                    int NKV, int HS) {
  int64_t changed = 0;
  for (int j = 0; j < x.len; j++)
    for (int g = 0; g < NKV; g++)
      for (int d = 0; d < HS; d++) {
        const size_t i = ((size_t)j * NKV + g) * HS + d;
        changed += !((x.heads >> g) & 1) && got[i] != init[i];
      }
  return changed;
}

// fp64 reference outputs on the same (bf16-representable) inputs.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<std::vector<double>> ext_dk, ext_dv;  // final values (initial + gradient)
};

inline Reference reference(const Inputs& in) {
  const int N = in.layout.n, NH = in.NH, NKV = in.NKV, HS = in.HS;
  auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const std::vector<double> q = d(in.q), k = d(in.k), v = d(in.v), dout = d(in.dout);
  cpu::AttnLayout L;
  L.num_nodes = (int)in.layout.node_start.size();
  L.node_start = in.layout.node_start.data();
  L.node_len = in.layout.node_len.data();
  L.node_parent = in.layout.node_parent.data();
  L.bidirectional = in.layout.bidirectional;
  Reference r;
  std::vector<std::vector<double>> ek, ev;
  r.ext_dk.resize(in.ext.size());
  r.ext_dv.resize(in.ext.size());
  std::vector<cpu::ExternalKV<double>> ext(in.ext.size());
  for (size_t e = 0; e < in.ext.size(); e++) {
    ek.push_back(d(in.ext[e].k));
    ev.push_back(d(in.ext[e].v));
  }
  for (size_t e = 0; e < in.ext.size(); e++) {
    const ExtCase& x = in.ext[e];
    r.ext_dk[e] = d(x.dk0);
    r.ext_dv[e] = d(x.dv0);
    ext[e].k = ek[e].data();
    ext[e].v = ev[e].data();
    ext[e].dk = x.grad ? r.ext_dk[e].data() : nullptr;
    ext[e].dv = x.grad ? r.ext_dv[e].data() : nullptr;
    ext[e].len = x.len;
    ext[e].q_begin = x.q_begin;
    ext[e].q_end = x.q_end;
    ext[e].heads = x.heads;
  }
  r.out.resize((size_t)N * NH * HS);
  r.lse.resize((size_t)N * NH);
  cpu::attention_forward<double>(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), L, ext.data(),
                                 (int)ext.size(), N, NH, NKV, HS);
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  cpu::attention_backward<double>(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), r.out.data(),
                                  r.lse.data(), q.data(), k.data(), v.data(), L, ext.data(), (int)ext.size(), N,
                                  NH, NKV, HS);
  return r;
}

// ||x - ref|| / ||ref||; NaN when x has a non-finite element (an unwritten poisoned output).
inline double rel_l2(const std::vector<float>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); i++) {
    if (!std::isfinite(x[i])) return NAN;
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The same for the error that rounding ref to bf16 alone makes: the scale of the bound.
inline double bf16_floor(const std::vector<double>& ref) {
  std::vector<float> r(ref.size());
  for (size_t i = 0; i < r.size(); i++) r[i] = round_to_bf16((float)ref[i]);
  return rel_l2(r, ref);
}

// Largest |x - ref| / max(1, |ref|); NaN on a non-finite element.
inline double max_rel(const std::vector<float>& x, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < x.size(); i++) {
    if (!std::isfinite(x[i])) return NAN;
    m = std::max(m, std::abs(x[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
  }
  return m;
}

inline std::vector<double> minus(const std::vector<double>& a, const std::vector<float>& b) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); i++) r[i] = a[i] - b[i];
  return r;
}

inline std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); i++) r[i] = a[i] - b[i];
  return r;
}

}  // namespace tt::cuda::attn_test
