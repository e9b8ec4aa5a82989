// Tree attention over DFS node ranges, CPU reference (see attention.h for the visibility rules).
//
// Keys of a query i in node n, in this order: the external prefixes e with i in [q_begin, q_end)
// (in index order), the tokens of every strict ancestor of n (root first, whole nodes), then the
// tokens of n from node_start[n] to i. No N x N mask exists: the queries of a node are taken in
// blocks, and a block's key list is built once from the node's ancestor chain as a few spans of
// consecutive rows; a query's invisible keys in that list (the rest of its own node, prefixes
// whose query range it is outside of) get probability exactly 0. scale = 1/sqrt(HS).
//
// Forward, per block and KV head: scores S = scale q.k of all rows (query, head of the group)
// against the block's keys, then per row p = exp(s - max), out = sum p v / sum p and
// lse = max + log(sum p).
// Backward, with D_i = dout_i . out_i, p_ij = exp(scale q_i.k_j - lse_i), ds_ij = p_ij (dout_i.v_j - D_i):
//   dq_i = scale sum_j ds_ij k_j,   dk_j = scale sum_i ds_ij q_i,   dv_j = sum_i p_ij dout_i.
// Work units are (KV head g, tree): a tree's queries only see its own tokens and the external
// prefixes, so each unit owns dk/dv of its tree's tokens for head g and dq of the query heads of
// group g. External prefix dk/dv are reduced afterwards per (prefix, KV head, key) over the
// prefix's queries.
//
// Precision and determinism: every dot product, softmax sum and gradient sum is fp64 and runs
// in a fixed order (over d, over keys in list order, over queries in packed order), whatever the
// blocking; every output element has one writer. Results are deterministic and do not depend on
// the thread count.
//
// Layout for speed: K (and V in the backward) are also kept transposed in fp64, (NKV, HS, ld), so
// scores are computed in 4 x 4 register blocks (4 rows x 4 keys) that vectorize and reuse each
// load; the weighted sums over keys take four keys per pass. Timings: tests/ops/attention_bench.cc.
#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {
namespace {

// Score rows (query, head) per block: a block's queries share one key list, so each K/V load
// serves all its rows; long nodes split into several blocks, which also balances threads.
constexpr int kBlockRows = 32;

template <class T>
void check_layout(const AttnLayout& layout, const ExternalKV<T>* ext, int n_ext, int N, int NH, int NKV,
                  int HS, const char* op) {
  TT_CHECK(N >= 0 && NH > 0 && NKV > 0 && HS > 0, op,
           ": expected N >= 0 and positive NH, NKV, HS, got N=", N, " NH=", NH, " NKV=", NKV, " HS=", HS);
  TT_CHECK(NH % NKV == 0, op, ": query heads NH=", NH, " must be a multiple of KV heads NKV=", NKV);
  TT_CHECK(NKV <= 64 || n_ext == 0, op, ": external prefixes take head sets of at most 64 KV heads, got NKV=", NKV);
  TT_CHECK(layout.num_nodes >= 0, op, ": negative num_nodes ", layout.num_nodes);
  TT_CHECK(layout.num_nodes == 0 || (layout.node_start && layout.node_len && layout.node_parent), op,
           ": layout has ", layout.num_nodes, " nodes but a null node_start/node_len/node_parent");
  int next = 0;
  for (int n = 0; n < layout.num_nodes; n++) {
    TT_CHECK(layout.node_start[n] == next, op, ": node ", n, " starts at ", layout.node_start[n],
             ", expected ", next, " (node ranges must be contiguous in DFS order)");
    TT_CHECK(layout.node_len[n] >= 0, op, ": node ", n, " has negative length ", layout.node_len[n]);
    TT_CHECK(layout.node_parent[n] >= -1 && layout.node_parent[n] < n, op, ": node ", n, " has parent ",
             layout.node_parent[n], ", expected -1 or a node index < ", n);
    next += layout.node_len[n];
  }
  TT_CHECK(next == N, op, ": node ranges cover ", next, " tokens, expected N=", N);
  TT_CHECK(n_ext >= 0 && (n_ext == 0 || ext != nullptr), op, ": n_ext=", n_ext,
           " with a null external prefix list");
  for (int e = 0; e < n_ext; e++) {
    const ExternalKV<T>& x = ext[e];
    TT_CHECK(x.len >= 0, op, ": external prefix ", e, " has negative length ", x.len);
    TT_CHECK(x.len == 0 || (x.k && x.v), op, ": external prefix ", e, " has len ", x.len, " but a null k or v");
    TT_CHECK(0 <= x.q_begin && x.q_begin <= x.q_end && x.q_end <= N, op, ": external prefix ", e,
             " has query range [", x.q_begin, ", ", x.q_end, "), expected 0 <= q_begin <= q_end <= N=", N);
    TT_CHECK(NKV >= 64 || (x.heads >> NKV) == 0 || x.heads == ~uint64_t(0), op, ": external prefix ", e,
             " names KV heads past NKV=", NKV, " in its head set");
  }
}

// One key/value tensor (an external prefix or the packed batch) in the fp64 forms the loops read.
struct KvSource {
  std::vector<double> k, v;    // (len, NKV, HS)
  std::vector<double> kt, vt;  // (NKV, HS, ld); vt only for the backward
  int len = 0;
  // Row stride of kt, vt: len rounded up to 8 plus 8, so that the HS rows one score reads do not
  // all map to the same L1 cache set (len = 4096 gives a 32 KiB stride otherwise).
  int64_t ld = 0;
};

// Sources 0 .. n_ext - 1 are the external prefixes, source n_ext the packed batch.
template <class T>
std::vector<KvSource> make_sources(const T* k, const T* v, const ExternalKV<T>* ext, int n_ext, int N, int NKV,
                                   int HS, bool with_vt) {
  std::vector<KvSource> src(n_ext + 1);
  for (int e = 0; e <= n_ext; e++) {
    KvSource& s = src[e];
    const T* ks = e < n_ext ? ext[e].k : k;
    const T* vs = e < n_ext ? ext[e].v : v;
    s.len = e < n_ext ? ext[e].len : N;
    s.ld = (s.len + 7) / 8 * 8 + 8;
    const int64_t n = (int64_t)s.len * NKV * HS;
    s.k.assign(ks, ks + n);
    s.v.assign(vs, vs + n);
    s.kt.resize(NKV * HS * s.ld);
    if (with_vt) s.vt.resize(s.kt.size());
    for (int g = 0; g < NKV; g++) {
      for (int j = 0; j < s.len; j++) {
        for (int d = 0; d < HS; d++) {
          const int64_t from = ((int64_t)j * NKV + g) * HS + d, to = ((int64_t)g * HS + d) * s.ld + j;
          s.kt[to] = s.k[from];
          if (with_vt) s.vt[to] = s.v[from];
        }
      }
    }
  }
  return src;
}

// The token ranges of a node's strict ancestors as (begin, end) pairs, root first.
void ancestor_ranges(const AttnLayout& layout, int node, std::vector<int>* ranges) {
  ranges->clear();
  for (int a = layout.node_parent[node]; a >= 0; a = layout.node_parent[a]) {
    ranges->push_back(layout.node_start[a] + layout.node_len[a]);
    ranges->push_back(layout.node_start[a]);
  }
  std::reverse(ranges->begin(), ranges->end());
}

// A span of keys of a query block: rows [j0, j1) of source src, at column off of the block's
// score rows. kind says which queries of the block see it.
struct Span {
  enum Kind { kPrefix, kAncestor, kOwn };
  Kind kind;
  int src, j0, j1, off;
};

// The keys of queries [i0, i1) of node `node` for KV head g, in the documented order: the external
// prefixes any of them sees, the ancestors' tokens, and the node's tokens up to i1 - 1. Returns the count.
template <class T>
int block_spans(const AttnLayout& layout, int node, int i0, int i1, int g, const std::vector<int>& anc,
                const ExternalKV<T>* ext, int n_ext, std::vector<Span>* spans) {
  spans->clear();
  int off = 0;
  auto add = [&](Span::Kind kind, int src, int j0, int j1) {
    if (j0 >= j1) return;
    spans->push_back(Span{kind, src, j0, j1, off});
    off += j1 - j0;
  };
  for (int e = 0; e < n_ext; e++) {
    if (ext[e].q_begin < i1 && i0 < ext[e].q_end && ext[e].read_by(g)) add(Span::kPrefix, e, 0, ext[e].len);
  }
  for (size_t r = 0; r < anc.size(); r += 2) add(Span::kAncestor, n_ext, anc[r], anc[r + 1]);
  // Bidirectional nodes: every query sees the whole node (an image inside a vision tower).
  add(Span::kOwn, n_ext, layout.node_start[node],
      layout.bidirectional ? layout.node_start[node] + layout.node_len[node] : i1);
  return off;
}

// Keys [a, b) of a span that query i sees (a == b: none).
template <class T>
inline void visible(const Span& s, int i, const ExternalKV<T>* ext, bool bidirectional, int* a, int* b) {
  *a = 0;
  *b = s.j1 - s.j0;
  if (s.kind == Span::kPrefix && (i < ext[s.src].q_begin || i >= ext[s.src].q_end)) *b = 0;
  if (s.kind == Span::kOwn && !bidirectional) *b = i + 1 - s.j0;
}

constexpr int kQuad = 4;  // register block: 4 rows x 4 keys of fp64 sums

// Packs R rows (R, HS) into quads of rows, d-major: packed[(r / 4) * HS + d][r % 4], zero padded.
inline void pack_rows(std::vector<double>* packed, const double* rows, int R, int HS) {
  const int nb = (R + kQuad - 1) / kQuad;
  packed->assign((int64_t)nb * HS * kQuad, 0.0);
  for (int r = 0; r < R; r++) {
    for (int d = 0; d < HS; d++) (*packed)[((int64_t)(r / kQuad) * HS + d) * kQuad + r % kQuad] = rows[r * HS + d];
  }
}

// S[r][t] = a_r . x_{j0 + t} for R rows a_r (packed by pack_rows) and keys t < n of one KV head
// given transposed, xt = (HS, ld). Each sum runs over d in order, exactly a plain dot product;
// 4 x 4 blocks of sums live in registers and reuse every load four times.
inline void block_dots(double* S, int64_t lds, const std::vector<double>& packed, int R, const double* xt,
                       int64_t ld, int j0, int n, int HS) {
  const int nb = (R + kQuad - 1) / kQuad;
  int t0 = 0;
  for (; t0 + kQuad <= n; t0 += kQuad) {
    const double* x = xt + j0 + t0;
    for (int b = 0; b < nb; b++) {
      const double* a = packed.data() + (int64_t)b * HS * kQuad;  // (HS, 4)
      double acc[kQuad][kQuad] = {};
      for (int d = 0; d < HS; d++) {
        const double* xd = x + d * ld;
        for (int i = 0; i < kQuad; i++) {
          const double av = a[d * kQuad + i];
          for (int j = 0; j < kQuad; j++) acc[i][j] += av * xd[j];
        }
      }
      for (int i = 0; i < kQuad && b * kQuad + i < R; i++) {
        for (int j = 0; j < kQuad; j++) S[(b * kQuad + i) * lds + t0 + j] = acc[i][j];
      }
    }
  }
  for (; t0 < n; t0++) {
    for (int r = 0; r < R; r++) {
      const double* a = packed.data() + (int64_t)(r / kQuad) * HS * kQuad + r % kQuad;
      double s = 0.0;
      for (int d = 0; d < HS; d++) s += a[d * kQuad] * xt[d * ld + j0 + t0];
      S[r * lds + t0] = s;
    }
  }
}

// acc[r] (HS) += sum over keys t < n of W[r][t] * x_{j0 + t}, keys in order, for R rows; x rows
// (HS) are stride apart. Four keys per pass keep acc in registers; the order of the sum is kept.
inline void block_axpys(double* acc, const double* W, int64_t ldw, int R, const double* x, int64_t stride, int j0,
                        int n, int HS) {
  int t = 0;
  for (; t + kQuad <= n; t += kQuad) {
    const double* x0 = x + (int64_t)(j0 + t) * stride;
    const double* x1 = x0 + stride;
    const double* x2 = x1 + stride;
    const double* x3 = x2 + stride;
    for (int r = 0; r < R; r++) {
      const double* w = W + r * ldw + t;
      const double w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
      double* a = acc + r * HS;
      for (int d = 0; d < HS; d++) {
        double s = a[d];
        s += w0 * x0[d];
        s += w1 * x1[d];
        s += w2 * x2[d];
        s += w3 * x3[d];
        a[d] = s;
      }
    }
  }
  for (; t < n; t++) {
    const double* xt = x + (int64_t)(j0 + t) * stride;
    for (int r = 0; r < R; r++) {
      const double w = W[r * ldw + t];
      double* a = acc + r * HS;
      for (int d = 0; d < HS; d++) a[d] += w * xt[d];
    }
  }
}

// y (HS) += sum over rows r < R of w[r * ldw] * a_r, rows (HS, row-major) in order, four per pass.
inline void rows_axpy(double* y, const double* w, int64_t ldw, const double* a, int R, int HS) {
  int r = 0;
  for (; r + kQuad <= R; r += kQuad) {
    const double w0 = w[r * ldw], w1 = w[(r + 1) * ldw], w2 = w[(r + 2) * ldw], w3 = w[(r + 3) * ldw];
    const double* a0 = a + (int64_t)r * HS;
    for (int d = 0; d < HS; d++) {
      double s = y[d];
      s += w0 * a0[d];
      s += w1 * a0[HS + d];
      s += w2 * a0[2 * HS + d];
      s += w3 * a0[3 * HS + d];
      y[d] = s;
    }
  }
  for (; r < R; r++) {
    const double wr = w[r * ldw];
    for (int d = 0; d < HS; d++) y[d] += wr * a[(int64_t)r * HS + d];
  }
}

// out[t] = a . b_t for the n rows b_t = b + t * stride, each summed over d in order; four rows
// at a time so four independent sums keep the FP adders busy.
template <class T>
inline void strided_dots(double* out, const double* a, const T* b, int64_t stride, int n, int HS) {
  int t = 0;
  for (; t + 4 <= n; t += 4) {
    const T* b0 = b + t * stride;
    const T* b1 = b0 + stride;
    const T* b2 = b1 + stride;
    const T* b3 = b2 + stride;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int d = 0; d < HS; d++) {
      s0 += a[d] * (double)b0[d];
      s1 += a[d] * (double)b1[d];
      s2 += a[d] * (double)b2[d];
      s3 += a[d] * (double)b3[d];
    }
    out[t] = s0, out[t + 1] = s1, out[t + 2] = s2, out[t + 3] = s3;
  }
  for (; t < n; t++) {
    const T* bt = b + t * stride;
    double s0 = 0.0;
    for (int d = 0; d < HS; d++) s0 += a[d] * (double)bt[d];
    out[t] = s0;
  }
}

// The nodes of each tree (root with parent -1 and its descendants), in layout order:
// tree t has nodes tree_nodes[tree_first[t] .. tree_first[t + 1]).
void group_by_tree(const AttnLayout& layout, std::vector<int>* tree_first, std::vector<int>* tree_nodes) {
  const int nn = layout.num_nodes;
  std::vector<int> tree_of(nn);
  int n_trees = 0;
  for (int n = 0; n < nn; n++) {
    const int p = layout.node_parent[n];
    tree_of[n] = p < 0 ? n_trees++ : tree_of[p];
  }
  tree_first->assign(n_trees + 1, 0);
  for (int n = 0; n < nn; n++) (*tree_first)[tree_of[n] + 1]++;
  for (int t = 0; t < n_trees; t++) (*tree_first)[t + 1] += (*tree_first)[t];
  tree_nodes->resize(nn);
  std::vector<int> fill(tree_first->begin(), tree_first->end() - 1);
  for (int n = 0; n < nn; n++) (*tree_nodes)[fill[tree_of[n]]++] = n;
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnLayout& layout,
                       const ExternalKV<T>* ext, int n_ext, int N, int NH, int NKV, int HS) {
  check_layout(layout, ext, n_ext, N, NH, NKV, HS, "attention_forward");
  const double scale = 1.0 / std::sqrt((double)HS);
  const int group = NH / NKV;
  const int qblock = std::max(1, kBlockRows / group);
  const std::vector<KvSource> src = make_sources(k, v, ext, n_ext, N, NKV, HS, /*with_vt=*/false);
  int max_keys = N;
  for (int e = 0; e < n_ext; e++) max_keys += ext[e].len;

  // Work items (node, first query, end query), each run once per KV head.
  std::vector<int> items;
  for (int n = 0; n < layout.num_nodes; n++) {
    const int s = layout.node_start[n], e = s + layout.node_len[n];
    for (int b = s; b < e; b += qblock) items.insert(items.end(), {n, b, std::min(e, b + qblock)});
  }
  const int n_units = (int)items.size() / 3 * NKV;

  OmpErrors errors;  // an allocation failing in the region, rethrown after it
#pragma omp parallel if (omp_worth((int64_t)N * max_keys * NH * HS))
  {
    std::vector<int> anc;
    std::vector<Span> spans;
    std::vector<double> packed, rows, acc, S, row_sum;
    errors.run([&] {
      rows.resize((int64_t)qblock * group * HS);     // (R, HS)
      acc.resize(rows.size());                       // (R, HS)
      S.resize((int64_t)qblock * group * max_keys);  // (R, keys)
      row_sum.resize(qblock * group);                // (R)
    });
#pragma omp for schedule(dynamic, 1)
    for (int unit = 0; unit < n_units; unit++) {
      errors.run([&] {
        const int it = unit / NKV, g = unit % NKV;
        const int node = items[3 * it], i0 = items[3 * it + 1], i1 = items[3 * it + 2];
        // Row r of the block: query i0 + r / group, head g * group + r % group.
        const int R = (i1 - i0) * group;
        auto row_index = [&](int r) { return ((int64_t)i0 + r / group) * NH + g * group + r % group; };
        ancestor_ranges(layout, node, &anc);
        const int nk = block_spans(layout, node, i0, i1, g, anc, ext, n_ext, &spans);
        for (int r = 0; r < R; r++) {
          for (int d = 0; d < HS; d++) rows[r * HS + d] = (double)q[row_index(r) * HS + d];
        }
        pack_rows(&packed, rows.data(), R, HS);
        for (const Span& sp : spans) {
          const KvSource& x = src[sp.src];
          block_dots(S.data() + sp.off, nk, packed, R, x.kt.data() + g * HS * x.ld, x.ld, sp.j0, sp.j1 - sp.j0, HS);
        }
        // Softmax of each row over its visible keys; the others get probability 0.
        for (int r = 0; r < R; r++) {
          const int i = i0 + r / group;
          double* Sr = S.data() + (int64_t)r * nk;
          double mx = -std::numeric_limits<double>::infinity();
          for (const Span& sp : spans) {
            int a, b;
            visible(sp, i, ext, layout.bidirectional, &a, &b);
            for (int t = a; t < b; t++) {
              Sr[sp.off + t] *= scale;
              mx = std::max(mx, Sr[sp.off + t]);
            }
          }
          double sum = 0.0;
          for (const Span& sp : spans) {
            int a, b;
            visible(sp, i, ext, layout.bidirectional, &a, &b);
            for (int t = 0; t < sp.j1 - sp.j0; t++) {
              const double p = t >= a && t < b ? std::exp(Sr[sp.off + t] - mx) : 0.0;
              Sr[sp.off + t] = p;
              sum += p;
            }
          }
          row_sum[r] = sum;
          lse[row_index(r)] = (T)(mx + std::log(sum));
        }
        std::fill(acc.begin(), acc.begin() + (int64_t)R * HS, 0.0);
        for (const Span& sp : spans) {
          block_axpys(acc.data(), S.data() + sp.off, nk, R, src[sp.src].v.data() + (int64_t)g * HS,
                      (int64_t)NKV * HS, sp.j0, sp.j1 - sp.j0, HS);
        }
        for (int r = 0; r < R; r++) {
          for (int d = 0; d < HS; d++) out[row_index(r) * HS + d] = (T)(acc[r * HS + d] / row_sum[r]);
        }
      });
    }
  }
  errors.rethrow();
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const AttnLayout& layout, const ExternalKV<T>* ext,
                        int n_ext, int N, int NH, int NKV, int HS) {
  check_layout(layout, ext, n_ext, N, NH, NKV, HS, "attention_backward");
  const double scale = 1.0 / std::sqrt((double)HS);
  const int group = NH / NKV;
  const int qblock = std::max(1, kBlockRows / group);
  const std::vector<KvSource> src = make_sources(k, v, ext, n_ext, N, NKV, HS, /*with_vt=*/true);
  int max_keys = N;
  for (int e = 0; e < n_ext; e++) max_keys += ext[e].len;

  std::vector<double> D((int64_t)N * NH);  // (N, NH) rowwise dout . out
  int max_nq = 0;
  for (int e = 0; e < n_ext; e++) max_nq = std::max(max_nq, ext[e].q_end - ext[e].q_begin);

  std::vector<int> tree_first, tree_nodes;
  group_by_tree(layout, &tree_first, &tree_nodes);
  const int n_trees = (int)tree_first.size() - 1;

  // fp64 sums of the batch's dk, dv: (N, NKV, HS).
  std::vector<double> dk64((int64_t)N * NKV * HS, 0.0), dv64((int64_t)N * NKV * HS, 0.0);

  OmpErrors errors;  // an allocation failing in the region, rethrown after it
#pragma omp parallel if (omp_worth((int64_t)N * max_keys * NH * HS))
  {
    std::vector<int> anc;
    std::vector<Span> spans;
    std::vector<double> qpack, opack, qrows, orows, dqacc, P, DS, sc, dp, kd, vd, dkd, dvd;
    errors.run([&] {
      for (auto* x : {&qrows, &orows, &dqacc}) x->resize((int64_t)qblock * group * HS);  // (R, HS)
      for (auto* x : {&P, &DS}) x->resize((int64_t)qblock * group * max_keys);          // (R, keys)
      for (auto* x : {&sc, &dp}) x->resize(max_nq);                                     // (queries) k.q, v.dout
      for (auto* x : {&kd, &vd, &dkd, &dvd}) x->resize(HS);                             // (HS)
    });

    // One parallel region, its steps separated by the barriers of the worksharing loops.
#pragma omp for schedule(static)
    for (int64_t r = 0; r < (int64_t)N * NH; r++) {
      double s = 0.0;
      for (int d = 0; d < HS; d++) s += (double)dout[r * HS + d] * (double)out[r * HS + d];
      D[r] = s;
    }

#pragma omp for schedule(dynamic, 1)
    for (int unit = 0; unit < NKV * n_trees; unit++) {
      errors.run([&] {
        const int g = unit % NKV, tree = unit / NKV;
        for (int t = tree_first[tree]; t < tree_first[tree + 1]; t++) {
          const int node = tree_nodes[t];
          const int start = layout.node_start[node], end = start + layout.node_len[node];
          ancestor_ranges(layout, node, &anc);
          for (int i0 = start; i0 < end; i0 += qblock) {
            const int i1 = std::min(end, i0 + qblock);
            // Row r of the block: query i0 + r / group, head g * group + r % group.
            const int R = (i1 - i0) * group;
            auto row_index = [&](int r) { return ((int64_t)i0 + r / group) * NH + g * group + r % group; };
            const int nk = block_spans(layout, node, i0, i1, g, anc, ext, n_ext, &spans);
            for (int r = 0; r < R; r++) {
              for (int d = 0; d < HS; d++) {
                qrows[r * HS + d] = (double)q[row_index(r) * HS + d];
                orows[r * HS + d] = (double)dout[row_index(r) * HS + d];
              }
            }
            pack_rows(&qpack, qrows.data(), R, HS);
            pack_rows(&opack, orows.data(), R, HS);
            for (const Span& sp : spans) {
              const KvSource& x = src[sp.src];
              const int64_t head = g * HS * x.ld;
              block_dots(P.data() + sp.off, nk, qpack, R, x.kt.data() + head, x.ld, sp.j0, sp.j1 - sp.j0, HS);
              block_dots(DS.data() + sp.off, nk, opack, R, x.vt.data() + head, x.ld, sp.j0, sp.j1 - sp.j0, HS);
            }
            // P = exp(scale q.k - lse), DS = P (dout.v - D); zero where a key is not visible.
            for (int r = 0; r < R; r++) {
              const int i = i0 + r / group;
              const double l = lse[row_index(r)], Di = D[row_index(r)];
              double* Pr = P.data() + (int64_t)r * nk;
              double* DSr = DS.data() + (int64_t)r * nk;
              for (const Span& sp : spans) {
                int a, b;
                visible(sp, i, ext, layout.bidirectional, &a, &b);
                for (int c = sp.off; c < sp.off + sp.j1 - sp.j0; c++) {
                  const bool seen = c >= sp.off + a && c < sp.off + b;
                  const double p = seen ? std::exp(scale * Pr[c] - l) : 0.0;
                  DSr[c] = seen ? p * (DSr[c] - Di) : 0.0;
                  Pr[c] = p;
                }
              }
            }
            std::fill(dqacc.begin(), dqacc.begin() + (int64_t)R * HS, 0.0);
            for (const Span& sp : spans) {
              block_axpys(dqacc.data(), DS.data() + sp.off, nk, R, src[sp.src].k.data() + (int64_t)g * HS,
                          (int64_t)NKV * HS, sp.j0, sp.j1 - sp.j0, HS);
            }
            for (int r = 0; r < R; r++) {
              for (int d = 0; d < HS; d++) dq[row_index(r) * HS + d] = (T)(scale * dqacc[r * HS + d]);
            }
            // dk_j += sum_r DS[r][j] q_r and dv_j += sum_r P[r][j] dout_r over the block's rows, in
            // order; external prefix gradients are reduced below.
            for (const Span& sp : spans) {
              if (sp.src != n_ext) continue;
              for (int c = 0; c < sp.j1 - sp.j0; c++) {
                const int64_t jg = ((int64_t)(sp.j0 + c) * NKV + g) * HS;
                rows_axpy(dk64.data() + jg, DS.data() + sp.off + c, nk, qrows.data(), R, HS);
                rows_axpy(dv64.data() + jg, P.data() + sp.off + c, nk, orows.data(), R, HS);
              }
            }
          }
        }
      });
    }

#pragma omp for schedule(static) nowait
    for (int64_t x = 0; x < (int64_t)N * NKV * HS; x++) {
      dk[x] = (T)(scale * dk64[x]);
      dv[x] = (T)dv64[x];
    }

    // External prefixes, one after another (two may share a gradient buffer): each (KV head, key)
    // sums over the query heads of its group and, per head, over the prefix's queries in order.
    for (int e = 0; e < n_ext; e++) {
      const ExternalKV<T>& x = ext[e];
      const int nq = x.q_end - x.q_begin;
      if ((x.dk == nullptr && x.dv == nullptr) || x.len == 0 || nq == 0) continue;
#pragma omp for schedule(dynamic, 4)
      for (int64_t jg = 0; jg < (int64_t)x.len * NKV; jg++) {
        const int g = (int)(jg % NKV);
        if (!x.read_by(g)) continue;  // heads outside the prefix's set neither read it nor add to it
        errors.run([&] {
          for (int d = 0; d < HS; d++) {
            kd[d] = (double)x.k[jg * HS + d];
            vd[d] = (double)x.v[jg * HS + d];
          }
          std::fill(dkd.begin(), dkd.end(), 0.0);
          std::fill(dvd.begin(), dvd.end(), 0.0);
          for (int h = g * group; h < (g + 1) * group; h++) {
            const int64_t base = ((int64_t)x.q_begin * NH + h) * HS, stride = (int64_t)NH * HS;
            strided_dots(sc.data(), kd.data(), q + base, stride, nq, HS);
            strided_dots(dp.data(), vd.data(), dout + base, stride, nq, HS);
            for (int t = 0; t < nq; t++) {
              const int64_t ih = (int64_t)(x.q_begin + t) * NH + h;
              const double p = std::exp(scale * sc[t] - (double)lse[ih]);
              const double ds = p * (dp[t] - D[ih]);
              for (int d = 0; d < HS; d++) {
                dkd[d] += ds * (double)q[ih * HS + d];
                dvd[d] += p * (double)dout[ih * HS + d];
              }
            }
          }
          if (x.dk) {
            for (int d = 0; d < HS; d++) x.dk[jg * HS + d] = (T)((double)x.dk[jg * HS + d] + scale * dkd[d]);
          }
          if (x.dv) {
            for (int d = 0; d < HS; d++) x.dv[jg * HS + d] = (T)((double)x.dv[jg * HS + d] + dvd[d]);
          }
        });
      }
    }
  }
  errors.rethrow();
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttnLayout&, const ExternalKV<float>*, int, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttnLayout&, const ExternalKV<double>*, int, int, int, int, int);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttnLayout&,
                                        const ExternalKV<float>*, int, int, int, int, int);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, const double*,
                                         const AttnLayout&, const ExternalKV<double>*, int, int, int, int,
                                         int);

}  // namespace tt::cpu
