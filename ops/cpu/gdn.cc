// Gated DeltaNet ops on DFS-packed trees, CPU reference (see gdn.h).
//
// Derivatives used below (per value head; S (dk, dv), k, q (dk), v, delta (dv)):
//   conv:   out = silu(a), a = sum_j w_j x_j  =>  da = dout silu'(a), dx_j += w_j da, dw_j += x_j da,
//           silu'(a) = s (1 + a (1 - s)), s = sigmoid(a).
//   l2norm: y = x r, r = (|x|^2 + eps)^-1/2  =>  dx = r (dy - y (y . dy)).
//   gated rmsnorm: y = w n silu(z), n = x r, r = (mean x^2 + eps)^-1/2  =>  dz = dy w n silu'(z),
//           dw = dy n silu(z), dn = dy w silu(z), dx = r (dn - n mean(dn n)).
//   delta rule, one token backwards, dS the gradient of S_t (from o_t and the later tokens):
//           dS += scale q do^T, dq += scale S_t do; d delta = dS^T k, dk += dS delta;
//           dv += beta d delta, dbeta += (v - pred) . d delta, dpred = -beta d delta (pred = S'^T k);
//           dS' = dS + k dpred^T, dk += S' dpred; dg += exp(g) sum(S_{t-1} o dS'), dS_{t-1} = exp(g) dS'.
// Nodes are in DFS order with parents first, so a forward pass in node order has every parent's
// end state ready, and a backward pass in reverse node order has every child's initial-state
// gradient summed into its parent's end-state gradient before the parent runs.
#include "ops/cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }
// softplus(x) = log(1 + e^x), computed without overflow; its derivative is sigmoid(x).
double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double dsilu(double x) {
  const double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

void check_tree(const GdnTree& t, const char* op) {
  TT_CHECK(t.num_nodes >= 0 && t.N >= 0, op, ": expected num_nodes, N >= 0, got ", t.num_nodes, ", ", t.N);
  TT_CHECK(t.nk > 0 && t.nv > 0 && t.nv % t.nk == 0, op, ": expected nv a positive multiple of nk, got nk=", t.nk,
           " nv=", t.nv);
  TT_CHECK(t.dk > 0 && t.dv > 0, op, ": expected positive head dims, got dk=", t.dk, " dv=", t.dv);
  int32_t next = 0;
  for (int n = 0; n < t.num_nodes; n++) {
    TT_CHECK(t.node_start[n] == next && t.node_len[n] > 0, op, ": node ", n, " must start at ", next,
             " with a positive length, got start ", t.node_start[n], " len ", t.node_len[n]);
    TT_CHECK(t.node_parent[n] >= -1 && t.node_parent[n] < n, op, ": node ", n, " has parent ", t.node_parent[n],
             " (expected -1 or an earlier node)");
    next += t.node_len[n];
  }
  TT_CHECK(next == t.N, op, ": nodes cover ", next, " rows, expected N = ", t.N);
}

// rows[j] (K): the token of conv tap j of row i (j = K - 1 is i itself), walking prev; -1 before
// the root.
void conv_taps(int32_t* rows, int i, const int32_t* prev, int K) {
  int32_t r = i;
  for (int j = K - 1; j >= 0; j--) {
    rows[j] = r;
    if (r >= 0) r = prev[r];
  }
}

// The conv's pre-activation of channel c over the taps.
template <class T>
double conv_pre(const int32_t* rows, const T* x, const T* w, int c, int C, int K) {
  double a = 0;
  for (int j = 0; j < K; j++)
    if (rows[j] >= 0) a += (double)w[(size_t)c * K + j] * (double)x[(size_t)rows[j] * C + c];
  return a;
}

// S (dk, dv) = value head h's state entering node n: its parent's end state (ends: (num_nodes,
// nv, dk, dv)), or its root's init (null: zero).
void initial_state(double* S, const double* ends, const double* init, const std::vector<int>& roots,
                   const GdnTree& t, int n, int h) {
  const size_t SS = (size_t)t.dk * t.dv;
  const int p = t.node_parent[n];
  if (p >= 0) std::copy_n(ends + ((size_t)p * t.nv + h) * SS, SS, S);
  else if (init) std::copy_n(init + ((size_t)roots[n] * t.nv + h) * SS, SS, S);
  else std::fill_n(S, SS, 0.0);
}

// (num_nodes) index of each root among the roots, -1 for other nodes.
std::vector<int> root_index(const GdnTree& t) {
  std::vector<int> r(t.num_nodes, -1);
  int k = 0;
  for (int n = 0; n < t.num_nodes; n++)
    if (t.node_parent[n] < 0) r[n] = k++;
  return r;
}

// S <- state after token t for value head h: the recurrence step of gdn.h. pred (dv) and delta
// (dv) are left for the caller.
template <class T>
void step(double* S, double* pred, double* delta, const T* kt, const T* vt, double alpha, double b, int dk, int dv) {
  for (int i = 0; i < dk * dv; i++) S[i] *= alpha;
  for (int c = 0; c < dv; c++) {
    double p = 0;
    for (int i = 0; i < dk; i++) p += S[(size_t)i * dv + c] * (double)kt[i];
    pred[c] = p;
    delta[c] = b * ((double)vt[c] - p);
  }
  for (int i = 0; i < dk; i++)
    for (int c = 0; c < dv; c++) S[(size_t)i * dv + c] += (double)kt[i] * delta[c];
}

// One chunk of value head h in the WY form (rows c0 .. c0 + L - 1, key head kh): gam, the in-chunk
// cumulative log decay; A = strictly_lower(beta_a k_a . k_b exp(gam_a - gam_b)) (stride C);
// U = (I + A)^-1 (beta v) and W = (I + A)^-1 (beta exp(gam) k) by forward substitution; v_new =
// U - W S for the entering state S. The forward and the backward of the chunked form share it.
struct ChunkWY {
  int C, dk, dv, L = 0;
  std::vector<double> gam, A, U, W, vn;
  ChunkWY(int chunk, int dk_, int dv_)
      : C(chunk), dk(dk_), dv(dv_), gam(chunk), A((size_t)chunk * chunk), U((size_t)chunk * dv_),
        W((size_t)chunk * dk_), vn((size_t)chunk * dv_) {}

  template <class T>
  void compute(const T* k, const T* v, const T* g, const T* beta, const GdnTree& t, int h, int c0, int len,
               const double* S) {
    L = len;
    const int kh = h / (t.nv / t.nk);
    auto K_ = [&](int row, int a) { return (double)k[((size_t)(c0 + row) * t.nk + kh) * dk + a]; };
    auto B_ = [&](int row) { return (double)beta[(size_t)(c0 + row) * t.nv + h]; };
    double acc = 0;
    for (int a = 0; a < L; a++) gam[a] = acc += (double)g[(size_t)(c0 + a) * t.nv + h];
    for (int a = 0; a < L; a++)
      for (int b = 0; b < L; b++) {
        double x = 0;
        if (b < a) {
          double kk = 0;
          for (int e = 0; e < dk; e++) kk += K_(a, e) * K_(b, e);
          x = B_(a) * kk * std::exp(gam[a] - gam[b]);
        }
        A[(size_t)a * C + b] = x;
      }
    for (int a = 0; a < L; a++) {
      for (int c = 0; c < dv; c++) {
        double x = B_(a) * (double)v[((size_t)(c0 + a) * t.nv + h) * dv + c];
        for (int b = 0; b < a; b++) x -= A[(size_t)a * C + b] * U[(size_t)b * dv + c];
        U[(size_t)a * dv + c] = x;
      }
      for (int e = 0; e < dk; e++) {
        double x = B_(a) * std::exp(gam[a]) * K_(a, e);
        for (int b = 0; b < a; b++) x -= A[(size_t)a * C + b] * W[(size_t)b * dk + e];
        W[(size_t)a * dk + e] = x;
      }
    }
    for (int a = 0; a < L; a++)
      for (int c = 0; c < dv; c++) {
        double x = U[(size_t)a * dv + c];
        for (int e = 0; e < dk; e++) x -= W[(size_t)a * dk + e] * S[(size_t)e * dv + c];
        vn[(size_t)a * dv + c] = x;
      }
  }

  // S2 = exp(gam_L) S + sum_b exp(gam_L - gam_b) k_b v_new_b^T (after compute).
  template <class T>
  void end_state(double* S2, const double* S, const T* k, const GdnTree& t, int h, int c0) const {
    const int kh = h / (t.nv / t.nk);
    const double gl = gam[L - 1];
    for (int e = 0; e < dk; e++)
      for (int c = 0; c < dv; c++) {
        double x = std::exp(gl) * S[(size_t)e * dv + c];
        for (int b = 0; b < L; b++)
          x += std::exp(gl - gam[b]) * (double)k[((size_t)(c0 + b) * t.nk + kh) * dk + e] * vn[(size_t)b * dv + c];
        S2[(size_t)e * dv + c] = x;
      }
  }
};

// A node's initial-state gradient dS (value head h) to its parent's end-state gradient, or to its
// root's d_init.
void pass_initial_gradient(const double* dS, std::vector<double>& dend, double* d_init, const std::vector<int>& roots,
                           const GdnTree& t, int n, int h) {
  const size_t SS = (size_t)t.dk * t.dv;
  const int p = t.node_parent[n];
  double* dst = p >= 0 ? dend.data() + ((size_t)p * t.nv + h) * SS
                       : (d_init ? d_init + ((size_t)roots[n] * t.nv + h) * SS : nullptr);
  if (dst)
    for (size_t e = 0; e < SS; e++) dst[e] += dS[e];
}

// dq, dk (N, nk, dk) += the per-value-head gradients gq, gk (N, nv, dk) summed over each key head's
// value heads, in head order.
template <class T>
void add_group_gradients(T* dq, T* dk, const std::vector<double>& gq, const std::vector<double>& gk,
                         const GdnTree& t) {
  const int DK = t.dk, nv = t.nv, nk = t.nk, r = nv / nk;
  for (int i = 0; i < t.N; i++)
    for (int kh = 0; kh < nk; kh++)
      for (int a = 0; a < DK; a++) {
        double xq = 0, xk = 0;
        for (int h = kh * r; h < (kh + 1) * r; h++) {
          xq += gq[((size_t)i * nv + h) * DK + a];
          xk += gk[((size_t)i * nv + h) * DK + a];
        }
        const size_t e = ((size_t)i * nk + kh) * DK + a;
        dq[e] = (T)((double)dq[e] + xq);
        dk[e] = (T)((double)dk[e] + xk);
      }
}

}  // namespace

int GdnTree::num_roots() const {
  int r = 0;
  for (int n = 0; n < num_nodes; n++) r += node_parent[n] < 0;
  return r;
}

void path_prev(int32_t* prev, const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent,
               int num_nodes, int N) {
  int32_t next = 0;
  for (int n = 0; n < num_nodes; n++) {
    TT_CHECK(node_start[n] == next && node_len[n] > 0, "path_prev: node ", n, " must start at ", next,
             " with a positive length, got start ", node_start[n], " len ", node_len[n]);
    TT_CHECK(node_parent[n] >= -1 && node_parent[n] < n, "path_prev: node ", n, " has parent ", node_parent[n],
             " (expected -1 or an earlier node)");
    const int p = node_parent[n];
    prev[next] = p < 0 ? -1 : node_start[p] + node_len[p] - 1;
    for (int j = 1; j < node_len[n]; j++) prev[next + j] = next + j - 1;
    next += node_len[n];
  }
  TT_CHECK(next == N, "path_prev: nodes cover ", next, " rows, expected N = ", N);
}

template <class T>
void conv1d_silu_forward(T* out, const T* x, const T* w, const int32_t* prev, int N, int C, int K) {
  TT_CHECK(N >= 0 && C > 0 && K > 0 && K <= 64, "conv1d_silu_forward: expected N >= 0, C > 0, 0 < K <= 64, got ", N,
           ", ", C, ", ", K);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)N * C * K))
  for (int i = 0; i < N; i++) {
    int32_t rows[64];
    conv_taps(rows, i, prev, K);
    for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (T)silu(conv_pre(rows, x, w, c, C, K));
  }
}

template <class T>
void conv1d_silu_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const int32_t* prev, int N, int C,
                          int K) {
  TT_CHECK(N >= 0 && C > 0 && K > 0 && K <= 64, "conv1d_silu_backward: expected N >= 0, C > 0, 0 < K <= 64, got ", N,
           ", ", C, ", ", K);
  // Serial over tokens (a token's taps reach its ancestors: scatter); fp64 accumulators.
  std::vector<double> gx(dx ? (size_t)N * C : 0, 0.0), gw(dw ? (size_t)C * K : 0, 0.0);
  for (int i = 0; i < N; i++) {
    int32_t rows[64];
    conv_taps(rows, i, prev, K);
    for (int c = 0; c < C; c++) {
      const double da = (double)dout[(size_t)i * C + c] * dsilu(conv_pre(rows, x, w, c, C, K));
      for (int j = 0; j < K; j++) {
        if (rows[j] < 0) continue;
        if (dx) gx[(size_t)rows[j] * C + c] += (double)w[(size_t)c * K + j] * da;
        if (dw) gw[(size_t)c * K + j] += (double)x[(size_t)rows[j] * C + c] * da;
      }
    }
  }
  if (dx)
    for (size_t e = 0; e < gx.size(); e++) dx[e] = (T)((double)dx[e] + gx[e]);
  if (dw)
    for (size_t e = 0; e < gw.size(); e++) dw[e] = (T)((double)dw[e] + gw[e]);
}

template <class T>
void l2norm_forward(T* y, T* rstd, const T* x, int rows, int D, double eps) {
  TT_CHECK(rows >= 0 && D > 0 && eps >= 0, "l2norm_forward: expected rows >= 0, D > 0, eps >= 0, got ", rows, ", ", D,
           ", ", eps);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * D))
  for (int r = 0; r < rows; r++) {
    const T* xr = x + (size_t)r * D;
    double ss = 0;
    for (int c = 0; c < D; c++) ss += (double)xr[c] * (double)xr[c];
    const double rs = 1.0 / std::sqrt(ss + eps);
    for (int c = 0; c < D; c++) y[(size_t)r * D + c] = (T)((double)xr[c] * rs);
    rstd[r] = (T)rs;
  }
}

template <class T>
void l2norm_backward(T* dx, const T* dy, const T* x, const T* rstd, int rows, int D) {
  TT_CHECK(rows >= 0 && D > 0, "l2norm_backward: expected rows >= 0, D > 0, got ", rows, ", ", D);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * D))
  for (int r = 0; r < rows; r++) {
    const T* xr = x + (size_t)r * D;
    const T* dr = dy + (size_t)r * D;
    const double rs = rstd[r];
    double dot = 0;  // y . dy
    for (int c = 0; c < D; c++) dot += (double)xr[c] * rs * (double)dr[c];
    for (int c = 0; c < D; c++)
      dx[(size_t)r * D + c] = (T)((double)dx[(size_t)r * D + c] + rs * ((double)dr[c] - (double)xr[c] * rs * dot));
  }
}

template <class T>
void gated_rmsnorm_forward(T* y, T* rstd, const T* x, const T* z, const T* w, int rows, int D, double eps) {
  TT_CHECK(rows >= 0 && D > 0 && eps >= 0, "gated_rmsnorm_forward: expected rows >= 0, D > 0, eps >= 0, got ", rows,
           ", ", D, ", ", eps);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * D))
  for (int r = 0; r < rows; r++) {
    const T* xr = x + (size_t)r * D;
    double ss = 0;
    for (int c = 0; c < D; c++) ss += (double)xr[c] * (double)xr[c];
    const double rs = 1.0 / std::sqrt(ss / D + eps);
    for (int c = 0; c < D; c++)
      y[(size_t)r * D + c] = (T)((double)w[c] * (double)xr[c] * rs * silu((double)z[(size_t)r * D + c]));
    rstd[r] = (T)rs;
  }
}

template <class T>
void gated_rmsnorm_backward(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w, const T* rstd,
                            int rows, int D) {
  TT_CHECK(rows >= 0 && D > 0, "gated_rmsnorm_backward: expected rows >= 0, D > 0, got ", rows, ", ", D);
  std::vector<double> gw(dw ? D : 0, 0.0);
  for (int r = 0; r < rows; r++) {  // serial: dw sums over rows in a fixed order
    const size_t o = (size_t)r * D;
    const double rs = rstd[r];
    double dot = 0;  // sum_c dn_c n_c
    for (int c = 0; c < D; c++) {
      const double n = (double)x[o + c] * rs;
      const double dn = (double)dy[o + c] * (double)w[c] * silu((double)z[o + c]);
      dot += dn * n;
    }
    for (int c = 0; c < D; c++) {
      const double n = (double)x[o + c] * rs, zc = (double)z[o + c], d = (double)dy[o + c];
      if (dz) dz[o + c] = (T)((double)dz[o + c] + d * (double)w[c] * n * dsilu(zc));
      if (dw) gw[c] += d * n * silu(zc);
      if (dx) {
        const double dn = d * (double)w[c] * silu(zc);
        dx[o + c] = (T)((double)dx[o + c] + rs * (dn - n * dot / D));
      }
    }
  }
  if (dw)
    for (int c = 0; c < D; c++) dw[c] = (T)((double)dw[c] + gw[c]);
}

template <class T>
void gdn_gates_forward(T* g, T* beta, const T* a, const T* b, const T* A_log, const T* dt_bias, int N, int H) {
  TT_CHECK(N >= 0 && H > 0, "gdn_gates_forward: expected N >= 0, H > 0, got ", N, ", ", H);
  for (int i = 0; i < N; i++)
    for (int h = 0; h < H; h++) {
      const size_t e = (size_t)i * H + h;
      beta[e] = (T)sigmoid((double)b[e]);
      g[e] = (T)(-std::exp((double)A_log[h]) * softplus((double)a[e] + (double)dt_bias[h]));
    }
}

template <class T>
void gdn_gates_backward(T* da, T* db, T* dA_log, T* ddt_bias, const T* dg, const T* dbeta, const T* a, const T* b,
                        const T* A_log, const T* dt_bias, int N, int H) {
  TT_CHECK(N >= 0 && H > 0, "gdn_gates_backward: expected N >= 0, H > 0, got ", N, ", ", H);
  std::vector<double> gA(H, 0.0), gdt(H, 0.0);
  for (int i = 0; i < N; i++)
    for (int h = 0; h < H; h++) {
      const size_t e = (size_t)i * H + h;
      const double sb = sigmoid((double)b[e]);
      db[e] = (T)((double)dbeta[e] * sb * (1.0 - sb));
      const double x = (double)a[e] + (double)dt_bias[h], A = std::exp((double)A_log[h]);
      const double dx = -(double)dg[e] * A * sigmoid(x);  // d g / d x = -A sigmoid(x)
      da[e] = (T)dx;
      gdt[h] += dx;
      gA[h] += (double)dg[e] * (-A * softplus(x));  // d g / d A_log = g
    }
  for (int h = 0; h < H; h++) {
    if (dA_log) dA_log[h] = (T)((double)dA_log[h] + gA[h]);
    if (ddt_bias) ddt_bias[h] = (T)((double)ddt_bias[h] + gdt[h]);
  }
}

template <class T>
void gdn_tree_forward(T* o, double* end, const T* q, const T* k, const T* v, const T* g, const T* beta,
                      const double* init, const GdnTree& t) {
  check_tree(t, "gdn_tree_forward");
  const int dk = t.dk, dv = t.dv, nv = t.nv, nk = t.nk, r = nv / nk;
  const size_t SS = (size_t)dk * dv;
  const std::vector<int> roots = root_index(t);
  // Every node's end state (the children's initial states), kept here when end is null.
  std::vector<double> own(end ? 0 : (size_t)t.num_nodes * nv * SS);
  double* ends = end ? end : own.data();
  OmpErrors errors;  // an allocation failing in the loop, rethrown after it
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)t.N * t.nv * t.dk * t.dv))
  for (int h = 0; h < nv; h++) {
    errors.run([&] {
      const int kh = h / r;
      std::vector<double> pred(dv), delta(dv);
      for (int n = 0; n < t.num_nodes; n++) {
        double* S = ends + ((size_t)n * nv + h) * SS;
        initial_state(S, ends, init, roots, t, n, h);
        for (int i = t.node_start[n]; i < t.node_start[n] + t.node_len[n]; i++) {
          const T* kt = k + ((size_t)i * nk + kh) * dk;
          const T* qt = q + ((size_t)i * nk + kh) * dk;
          step(S, pred.data(), delta.data(), kt, v + ((size_t)i * nv + h) * dv,
               std::exp((double)g[(size_t)i * nv + h]), (double)beta[(size_t)i * nv + h], dk, dv);
          for (int c = 0; c < dv; c++) {
            double acc = 0;
            for (int a = 0; a < dk; a++) acc += S[(size_t)a * dv + c] * (double)qt[a];
            o[((size_t)i * nv + h) * dv + c] = (T)(t.scale * acc);
          }
        }
      }
    });
  }
  errors.rethrow();
}

template <class T>
void gdn_tree_forward_chunked(T* o, double* end, const T* q, const T* k, const T* v, const T* g, const T* beta,
                              const double* init, const GdnTree& t, int chunk) {
  check_tree(t, "gdn_tree_forward_chunked");
  TT_CHECK(chunk > 0, "gdn_tree_forward_chunked: chunk = ", chunk, ", expected > 0");
  const int dk = t.dk, dv = t.dv, nv = t.nv, nk = t.nk, r = nv / nk;
  const size_t SS = (size_t)dk * dv;
  const std::vector<int> roots = root_index(t);
  std::vector<double> own(end ? 0 : (size_t)t.num_nodes * nv * SS);
  double* ends = end ? end : own.data();
  OmpErrors errors;  // an allocation failing in the loop, rethrown after it
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)t.N * t.nv * t.dk * t.dv))
  for (int h = 0; h < nv; h++) {
    errors.run([&] {
      const int kh = h / r;
      ChunkWY wy(chunk, dk, dv);
      std::vector<double> S2(SS);
      for (int n = 0; n < t.num_nodes; n++) {
        double* S = ends + ((size_t)n * nv + h) * SS;
        initial_state(S, ends, init, roots, t, n, h);
        const int begin = t.node_start[n], stop = begin + t.node_len[n];
        for (int c0 = begin; c0 < stop; c0 += chunk) {
          const int L = std::min(chunk, stop - c0);
          wy.compute(k, v, g, beta, t, h, c0, L, S);
          const std::vector<double>& gam = wy.gam;
          auto K_ = [&](int row, int a) { return (double)k[((size_t)(c0 + row) * nk + kh) * dk + a]; };
          auto Q_ = [&](int row, int a) { return (double)q[((size_t)(c0 + row) * nk + kh) * dk + a]; };
          // Outputs: the state entering the chunk, decayed, plus the chunk's own writes.
          for (int a = 0; a < L; a++) {
            std::vector<double> qk(a + 1);
            for (int b = 0; b <= a; b++) {
              double s = 0;
              for (int e = 0; e < dk; e++) s += Q_(a, e) * K_(b, e);
              qk[b] = s * std::exp(gam[a] - gam[b]);
            }
            for (int c = 0; c < dv; c++) {
              double x = 0;
              for (int e = 0; e < dk; e++) x += Q_(a, e) * S[(size_t)e * dv + c];
              x *= std::exp(gam[a]);
              for (int b = 0; b <= a; b++) x += qk[b] * wy.vn[(size_t)b * dv + c];
              o[((size_t)(c0 + a) * nv + h) * dv + c] = (T)(t.scale * x);
            }
          }
          wy.end_state(S2.data(), S, k, t, h, c0);
          std::copy(S2.begin(), S2.end(), S);
        }
      }
    });
  }
  errors.rethrow();
}

template <class T>
void gdn_tree_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, double* d_init, const T* d_o, const double* d_end,
                       const T* q, const T* k, const T* v, const T* g, const T* beta, const double* init,
                       const GdnTree& t) {
  check_tree(t, "gdn_tree_backward");
  const int DK = t.dk, DV = t.dv, nv = t.nv, nk = t.nk, r = nv / nk;
  const size_t SS = (size_t)DK * DV;
  const std::vector<int> roots = root_index(t);
  // Forward again for every node's end state (each node's initial state is its parent's).
  std::vector<double> ends((size_t)t.num_nodes * nv * SS);
  {
    std::vector<T> o_scratch((size_t)t.N * nv * DV);
    gdn_tree_forward(o_scratch.data(), ends.data(), q, k, v, g, beta, init, t);
  }
  // Gradients in fp64, per value head; q and k gradients of a key head sum over its value heads,
  // added in head order after the parallel loop so the result does not depend on threads.
  std::vector<double> gq((size_t)t.N * nv * DK, 0.0), gk((size_t)t.N * nv * DK, 0.0);
  std::vector<double> dend((size_t)t.num_nodes * nv * SS, 0.0);
  if (d_end) std::copy_n(d_end, dend.size(), dend.data());
  OmpErrors errors;  // an allocation failing in the loop, rethrown after it
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)t.N * t.nv * t.dk * t.dv))
  for (int h = 0; h < nv; h++) {
    errors.run([&] {
      const int kh = h / r;
      std::vector<double> states, pred(DV), delta(DV), dS(SS), Sp(SS), ddelta(DV), dpred(DV);
      for (int n = t.num_nodes - 1; n >= 0; n--) {
        const int begin = t.node_start[n], len = t.node_len[n];
        // The node's states: states[j] is the state before token begin + j (j = 0: the initial one).
        states.assign((size_t)(len + 1) * SS, 0.0);
        initial_state(states.data(), ends.data(), init, roots, t, n, h);
        for (int j = 0; j < len; j++) {
          const int i = begin + j;
          double* S = states.data() + (size_t)(j + 1) * SS;
          std::copy_n(states.data() + (size_t)j * SS, SS, S);
          step(S, pred.data(), delta.data(), k + ((size_t)i * nk + kh) * DK,
               v + ((size_t)i * nv + h) * DV, std::exp((double)g[(size_t)i * nv + h]), (double)beta[(size_t)i * nv + h],
               DK, DV);
        }
        std::copy_n(dend.data() + ((size_t)n * nv + h) * SS, SS, dS.data());
        for (int j = len - 1; j >= 0; j--) {
          const int i = begin + j;
          const T* kt = k + ((size_t)i * nk + kh) * DK;
          const T* qt = q + ((size_t)i * nk + kh) * DK;
          const T* vt = v + ((size_t)i * nv + h) * DV;
          const T* dot = d_o + ((size_t)i * nv + h) * DV;
          const double alpha = std::exp((double)g[(size_t)i * nv + h]), b = (double)beta[(size_t)i * nv + h];
          const double* Sprev = states.data() + (size_t)j * SS;
          const double* St = states.data() + (size_t)(j + 1) * SS;
          for (size_t e = 0; e < SS; e++) Sp[e] = alpha * Sprev[e];
          for (int c = 0; c < DV; c++) {
            double pr = 0;
            for (int a = 0; a < DK; a++) pr += Sp[(size_t)a * DV + c] * (double)kt[a];
            pred[c] = pr;
            delta[c] = b * ((double)vt[c] - pr);
          }
          // o_t = scale S_t^T q_t.
          for (int a = 0; a < DK; a++) {
            double x = 0;
            for (int c = 0; c < DV; c++) {
              dS[(size_t)a * DV + c] += t.scale * (double)qt[a] * (double)dot[c];
              x += St[(size_t)a * DV + c] * (double)dot[c];
            }
            gq[((size_t)i * nv + h) * DK + a] += t.scale * x;
          }
          // S_t = S' + k delta^T.
          for (int c = 0; c < DV; c++) {
            double x = 0;
            for (int a = 0; a < DK; a++) x += dS[(size_t)a * DV + c] * (double)kt[a];
            ddelta[c] = x;
          }
          for (int a = 0; a < DK; a++) {
            double x = 0;
            for (int c = 0; c < DV; c++) x += dS[(size_t)a * DV + c] * delta[c];
            gk[((size_t)i * nv + h) * DK + a] += x;
          }
          // delta = beta (v - S'^T k).
          double db = 0;
          for (int c = 0; c < DV; c++) {
            dv[((size_t)i * nv + h) * DV + c] = (T)((double)dv[((size_t)i * nv + h) * DV + c] + b * ddelta[c]);
            db += ((double)vt[c] - pred[c]) * ddelta[c];
            dpred[c] = -b * ddelta[c];
          }
          dbeta[(size_t)i * nv + h] = (T)((double)dbeta[(size_t)i * nv + h] + db);
          for (int a = 0; a < DK; a++) {
            double x = 0;
            for (int c = 0; c < DV; c++) {
              dS[(size_t)a * DV + c] += (double)kt[a] * dpred[c];
              x += Sp[(size_t)a * DV + c] * dpred[c];
            }
            gk[((size_t)i * nv + h) * DK + a] += x;
          }
          // S' = alpha S_{t-1}.
          double da = 0;
          for (size_t e = 0; e < SS; e++) {
            da += Sprev[e] * dS[e];
            dS[e] *= alpha;
          }
          dg[(size_t)i * nv + h] = (T)((double)dg[(size_t)i * nv + h] + alpha * da);
        }
        // dS is the gradient of the node's initial state: its parent's end state, or the root's init.
        pass_initial_gradient(dS.data(), dend, d_init, roots, t, n, h);
      }
    });
  }
  errors.rethrow();
  add_group_gradients(dq, dk, gq, gk, t);
}

template <class T>
void gdn_tree_backward_chunked(T* dq, T* dk, T* dv, T* dg, T* dbeta, double* d_init, const T* d_o,
                               const double* d_end, const T* q, const T* k, const T* v, const T* g, const T* beta,
                               const double* init, const GdnTree& t, int chunk) {
  check_tree(t, "gdn_tree_backward_chunked");
  TT_CHECK(chunk > 0, "gdn_tree_backward_chunked: chunk = ", chunk, ", expected > 0");
  const int DK = t.dk, DV = t.dv, nv = t.nv, nk = t.nk, r = nv / nk;
  const size_t SS = (size_t)DK * DV;
  const std::vector<int> roots = root_index(t);
  std::vector<double> ends((size_t)t.num_nodes * nv * SS);
  {
    std::vector<T> o_scratch((size_t)t.N * nv * DV);
    gdn_tree_forward_chunked(o_scratch.data(), ends.data(), q, k, v, g, beta, init, t, chunk);
  }
  std::vector<double> gq((size_t)t.N * nv * DK, 0.0), gk((size_t)t.N * nv * DK, 0.0);
  std::vector<double> dend((size_t)t.num_nodes * nv * SS, 0.0);
  if (d_end) std::copy_n(d_end, dend.size(), dend.data());
  OmpErrors errors;  // an allocation failing in the loop, rethrown after it
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)t.N * t.nv * t.dk * t.dv))
  for (int h = 0; h < nv; h++) {
    errors.run([&] {
      const int kh = h / r;
      const int C = chunk;
      ChunkWY wy(C, DK, DV);
      const std::vector<double>&gam = wy.gam, &A = wy.A, &U = wy.U, &W = wy.W, &vn = wy.vn;
      std::vector<double> dvn((size_t)C * DV), dB1((size_t)C * DV), dB2((size_t)C * DK), dgam(C), dS(SS), dSin(SS),
          states;
      for (int n = t.num_nodes - 1; n >= 0; n--) {
        const int begin = t.node_start[n], stop = begin + t.node_len[n];
        const int nc = (t.node_len[n] + C - 1) / C;
        // The state entering each chunk of the node (the chunked recurrence from its initial state).
        states.assign((size_t)(nc + 1) * SS, 0.0);
        initial_state(states.data(), ends.data(), init, roots, t, n, h);
        auto chunk_forward = [&](int c0, const double* S) {
          const int L = std::min(C, stop - c0);
          wy.compute(k, v, g, beta, t, h, c0, L, S);
          return L;
        };
        for (int ci = 0; ci < nc; ci++) {
          const int c0 = begin + ci * C;
          const double* S = states.data() + (size_t)ci * SS;
          double* S2 = states.data() + (size_t)(ci + 1) * SS;
          chunk_forward(c0, S);
          wy.end_state(S2, S, k, t, h, c0);
        }
        // Backward through the chunks, last first; dS is the gradient of the chunk's end state.
        std::copy_n(dend.data() + ((size_t)n * nv + h) * SS, SS, dS.data());
        for (int ci = nc - 1; ci >= 0; ci--) {
          const int c0 = begin + ci * C;
          const double* S = states.data() + (size_t)ci * SS;
          const int L = chunk_forward(c0, S);
          const double gl = gam[L - 1], sc = t.scale;
          auto K_ = [&](int a, int e) { return (double)k[((size_t)(c0 + a) * nk + kh) * DK + e]; };
          auto Q_ = [&](int a, int e) { return sc * (double)q[((size_t)(c0 + a) * nk + kh) * DK + e]; };  // q~
          auto DO = [&](int a, int c) { return (double)d_o[((size_t)(c0 + a) * nv + h) * DV + c]; };
          auto B_ = [&](int a) { return (double)beta[(size_t)(c0 + a) * nv + h]; };
          std::fill(dgam.begin(), dgam.end(), 0.0);
          // qk[a][b] = q~_a . k_b, dov[a][b] = dO_a . v_new_b, SdO[a] (DK) = S dO_a.
          std::vector<double> qk((size_t)L * L), dov((size_t)L * L), kdS((size_t)L * DV), SdO((size_t)L * DK);
          for (int a = 0; a < L; a++)
            for (int b = 0; b < L; b++) {
              double x = 0, y = 0;
              for (int e = 0; e < DK; e++) x += Q_(a, e) * K_(b, e);
              for (int c = 0; c < DV; c++) y += DO(a, c) * vn[(size_t)b * DV + c];
              qk[(size_t)a * L + b] = x;
              dov[(size_t)a * L + b] = y;
            }
          for (int b = 0; b < L; b++)
            for (int c = 0; c < DV; c++) {
              double x = 0;
              for (int e = 0; e < DK; e++) x += K_(b, e) * dS[(size_t)e * DV + c];
              kdS[(size_t)b * DV + c] = x;
            }
          for (int a = 0; a < L; a++)
            for (int e = 0; e < DK; e++) {
              double x = 0;
              for (int c = 0; c < DV; c++) x += S[(size_t)e * DV + c] * DO(a, c);
              SdO[(size_t)a * DK + e] = x;
            }
          // dv_new_b = sum_{a >= b} (q~_a . k_b) e^(gam_a - gam_b) dO_a + e^(gam_L - gam_b) k_b^T dS.
          for (int b = 0; b < L; b++)
            for (int c = 0; c < DV; c++) {
              double x = std::exp(gl - gam[b]) * kdS[(size_t)b * DV + c];
              for (int a = b; a < L; a++) x += qk[(size_t)a * L + b] * std::exp(gam[a] - gam[b]) * DO(a, c);
              dvn[(size_t)b * DV + c] = x;
            }
          // The outputs: o_a = e^(gam_a) q~_a^T S + sum_{b <= a} (q~_a . k_b) e^(gam_a - gam_b) v_new_b.
          for (int a = 0; a < L; a++) {
            const size_t row = (size_t)(c0 + a) * nv + h;
            double qSdO = 0;
            for (int e = 0; e < DK; e++) qSdO += Q_(a, e) * SdO[(size_t)a * DK + e];
            dgam[a] += std::exp(gam[a]) * qSdO;
            for (int e = 0; e < DK; e++) {
              double x = std::exp(gam[a]) * SdO[(size_t)a * DK + e];
              for (int b = 0; b <= a; b++) x += std::exp(gam[a] - gam[b]) * dov[(size_t)a * L + b] * K_(b, e);
              gq[row * DK + e] += sc * x;
            }
            for (int b = 0; b <= a; b++) {
              const double tt = qk[(size_t)a * L + b] * std::exp(gam[a] - gam[b]) * dov[(size_t)a * L + b];
              dgam[a] += tt;
              dgam[b] -= tt;
            }
          }
          for (int b = 0; b < L; b++) {
            const size_t row = (size_t)(c0 + b) * nv + h;
            for (int e = 0; e < DK; e++) {
              double x = 0;
              for (int a = b; a < L; a++) x += std::exp(gam[a] - gam[b]) * dov[(size_t)a * L + b] * Q_(a, e);
              double y = 0;  // (dS v_new_b)_e
              for (int c = 0; c < DV; c++) y += dS[(size_t)e * DV + c] * vn[(size_t)b * DV + c];
              gk[row * DK + e] += x + std::exp(gl - gam[b]) * y;
            }
          }
          // The end state: S' = e^(gam_L) S + sum_b e^(gam_L - gam_b) k_b v_new_b^T.
          {
            double sds = 0;
            for (size_t e = 0; e < SS; e++) sds += S[e] * dS[e];
            dgam[L - 1] += std::exp(gl) * sds;
            for (int b = 0; b < L; b++) {
              double x = 0;
              for (int c = 0; c < DV; c++) x += kdS[(size_t)b * DV + c] * vn[(size_t)b * DV + c];
              const double tt = std::exp(gl - gam[b]) * x;
              dgam[L - 1] += tt;
              dgam[b] -= tt;
            }
          }
          // The entering state's gradient.
          for (int e = 0; e < DK; e++)
            for (int c = 0; c < DV; c++) {
              double x = std::exp(gl) * dS[(size_t)e * DV + c];
              for (int a = 0; a < L; a++) x += std::exp(gam[a]) * Q_(a, e) * DO(a, c);
              for (int b = 0; b < L; b++) x -= W[(size_t)b * DK + e] * dvn[(size_t)b * DV + c];
              dSin[(size_t)e * DV + c] = x;
            }
          // Through v_new = U - W S, U = M^-1 B1, W = M^-1 B2 (M = I + A): dB = M^-T dU, dM = -dB U^T.
          for (int a = L - 1; a >= 0; a--) {
            for (int c = 0; c < DV; c++) {
              double x = dvn[(size_t)a * DV + c];
              for (int b = a + 1; b < L; b++) x -= A[(size_t)b * C + a] * dB1[(size_t)b * DV + c];
              dB1[(size_t)a * DV + c] = x;
            }
            for (int e = 0; e < DK; e++) {
              double dw = 0;  // dW_a = -dv_new_a S^T
              for (int c = 0; c < DV; c++) dw -= dvn[(size_t)a * DV + c] * S[(size_t)e * DV + c];
              for (int b = a + 1; b < L; b++) dw -= A[(size_t)b * C + a] * dB2[(size_t)b * DK + e];
              dB2[(size_t)a * DK + e] = dw;
            }
          }
          for (int a = 0; a < L; a++) {
            const size_t row = (size_t)(c0 + a) * nv + h;
            const double ba = B_(a), ea = std::exp(gam[a]);
            double db = 0, b2k = 0;
            for (int c = 0; c < DV; c++) {
              const double d1 = dB1[(size_t)a * DV + c];
              dv[row * DV + c] = (T)((double)dv[row * DV + c] + ba * d1);
              db += d1 * (double)v[row * DV + c];
            }
            for (int e = 0; e < DK; e++) {
              b2k += dB2[(size_t)a * DK + e] * K_(a, e);
              gk[row * DK + e] += ba * ea * dB2[(size_t)a * DK + e];
            }
            db += ea * b2k;
            dgam[a] += ba * ea * b2k;
            for (int b = 0; b < a; b++) {
              double dAab = 0;
              for (int c = 0; c < DV; c++) dAab -= dB1[(size_t)a * DV + c] * U[(size_t)b * DV + c];
              for (int e = 0; e < DK; e++) dAab -= dB2[(size_t)a * DK + e] * W[(size_t)b * DK + e];
              const double dec = std::exp(gam[a] - gam[b]);
              double kk = 0;
              for (int e = 0; e < DK; e++) kk += K_(a, e) * K_(b, e);
              db += dAab * dec * kk;
              const double tt = dAab * A[(size_t)a * C + b];
              dgam[a] += tt;
              dgam[b] -= tt;
              const size_t rowb = (size_t)(c0 + b) * nv + h;
              for (int e = 0; e < DK; e++) {
                gk[row * DK + e] += dAab * ba * dec * K_(b, e);
                gk[rowb * DK + e] += dAab * ba * dec * K_(a, e);
              }
            }
            dbeta[row] = (T)((double)dbeta[row] + db);
          }
          // gam_a = sum_{b <= a} g_b: dg_b = sum_{a >= b} dgam_a.
          double acc = 0;
          for (int a = L - 1; a >= 0; a--) {
            acc += dgam[a];
            const size_t row = (size_t)(c0 + a) * nv + h;
            dg[row] = (T)((double)dg[row] + acc);
          }
          std::copy(dSin.begin(), dSin.end(), dS.begin());
        }
        pass_initial_gradient(dS.data(), dend, d_init, roots, t, n, h);
      }
    });
  }
  errors.rethrow();
  add_group_gradients(dq, dk, gq, gk, t);
}

#define TT_GDN_INSTANTIATE(T)                                                                                     \
  template void conv1d_silu_forward<T>(T*, const T*, const T*, const int32_t*, int, int, int);                  \
  template void conv1d_silu_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, int, int, int);   \
  template void l2norm_forward<T>(T*, T*, const T*, int, int, double);                                          \
  template void l2norm_backward<T>(T*, const T*, const T*, const T*, int, int);                                 \
  template void gated_rmsnorm_forward<T>(T*, T*, const T*, const T*, const T*, int, int, double);               \
  template void gated_rmsnorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, int); \
  template void gdn_gates_forward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);                 \
  template void gdn_gates_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                      int, int);                                                                 \
  template void gdn_tree_forward<T>(T*, double*, const T*, const T*, const T*, const T*, const T*, const double*, \
                                    const GdnTree&);                                                            \
  template void gdn_tree_forward_chunked<T>(T*, double*, const T*, const T*, const T*, const T*, const T*,      \
                                            const double*, const GdnTree&, int);                                \
  template void gdn_tree_backward<T>(T*, T*, T*, T*, T*, double*, const T*, const double*, const T*, const T*,  \
                                     const T*, const T*, const T*, const double*, const GdnTree&);                 \
  template void gdn_tree_backward_chunked<T>(T*, T*, T*, T*, T*, double*, const T*, const double*, const T*,   \
                                             const T*, const T*, const T*, const T*, const double*,             \
                                             const GdnTree&, int);
TT_GDN_INSTANTIATE(float)
TT_GDN_INSTANTIATE(double)
#undef TT_GDN_INSTANTIATE

}  // namespace tt::cpu
