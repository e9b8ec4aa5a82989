// Weighted cross-entropy over an explicit target list, CPU reference; softmax math in fp64.
// lse(row) = max + log(sum exp(logit - max)). Backward per row r with targets t (src[t] = r):
//   dlogits[r] = dloss * (c_r softmax(r) - sum_t w_t onehot(tok_t)),   c_r = sum_t w_t,
// so a branch-point row (several targets) gets the sum of its targets' gradients and a row with
// no targets gets zeros. Targets are grouped by row in list order, so sums are deterministic.
#include "ops/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {
namespace {

void check_targets(const int32_t* tgt_src, const int32_t* tgt_tok, int n_tgt, int N, int V,
                   const char* op) {
  TT_CHECK(N >= 0 && V > 0 && n_tgt >= 0, op, ": expected N >= 0, V > 0 and n_tgt >= 0, got N=", N,
           " V=", V, " n_tgt=", n_tgt);
  for (int t = 0; t < n_tgt; t++) {
    TT_CHECK(tgt_src[t] >= 0 && tgt_src[t] < N, op, ": target ", t, " has source row ", tgt_src[t],
             ", expected a row in [0, ", N, ")");
    TT_CHECK(tgt_tok[t] >= 0 && tgt_tok[t] < V, op, ": target ", t, " has token ", tgt_tok[t],
             ", expected a token in [0, ", V, ")");
  }
}

// log(sum exp(row)) of a row (V), max-subtracted.
template <class T>
double row_lse(const T* row, int V) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int v = 0; v < V; v++) mx = std::max(mx, (double)row[v]);
  double s = 0.0;
  for (int v = 0; v < V; v++) s += std::exp((double)row[v] - mx);
  return mx + std::log(s);
}

}  // namespace

template <class T>
double cross_entropy_forward(T* lse, const T* logits, const int32_t* tgt_src, const int32_t* tgt_tok,
                             const double* tgt_w, int n_tgt, int N, int V, const double* tgt_c, double* c_loss) {
  check_targets(tgt_src, tgt_tok, n_tgt, N, V, "cross_entropy_forward");
  std::vector<double> lse64(N);  // (N)
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)N * V))
  for (int r = 0; r < N; r++) {
    lse64[r] = row_lse(logits + (int64_t)r * V, V);
    lse[r] = (T)lse64[r];
  }
  double loss = 0.0, c = 0.0;
  for (int t = 0; t < n_tgt; t++) {
    const int r = tgt_src[t];
    const double ce = lse64[r] - (double)logits[(int64_t)r * V + tgt_tok[t]];
    loss += tgt_w[t] * ce;
    if (tgt_c) c += tgt_c[t] * ce;
  }
  if (tgt_c && c_loss) *c_loss += c;
  return loss;
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* tgt_src,
                            const int32_t* tgt_tok, const double* tgt_w, int n_tgt, int N, int V,
                            double dloss) {
  check_targets(tgt_src, tgt_tok, n_tgt, N, V, "cross_entropy_backward");
  // Targets grouped by source row, in list order: by_row[first[r] .. first[r + 1]).
  std::vector<int> first(N + 1, 0), by_row(n_tgt);
  for (int t = 0; t < n_tgt; t++) first[tgt_src[t] + 1]++;
  for (int r = 0; r < N; r++) first[r + 1] += first[r];
  {
    std::vector<int> fill(first.begin(), first.end() - 1);
    for (int t = 0; t < n_tgt; t++) by_row[fill[tgt_src[t]]++] = t;
  }
  OmpErrors errors;  // an allocation failing in the region, rethrown after it
#pragma omp parallel if (omp_worth((int64_t)N * V))
  {
    std::vector<double> g;  // (V)
    errors.run([&] { g.resize(V); });
#pragma omp for schedule(static)
    for (int r = 0; r < N; r++) {
      errors.run([&] {
        T* d = dlogits + (int64_t)r * V;  // (V)
        if (first[r] == first[r + 1]) {
          std::fill(d, d + V, T(0));
          return;
        }
        double c = 0.0;
        for (int k = first[r]; k < first[r + 1]; k++) c += tgt_w[by_row[k]];
        const T* row = logits + (int64_t)r * V;
        const double l = lse[r];
        for (int v = 0; v < V; v++) g[v] = c * std::exp((double)row[v] - l);
        for (int k = first[r]; k < first[r + 1]; k++) g[tgt_tok[by_row[k]]] -= tgt_w[by_row[k]];
        for (int v = 0; v < V; v++) d[v] = (T)(dloss * g[v]);
      });
    }
  }
  errors.rethrow();
}

template double cross_entropy_forward<float>(float*, const float*, const int32_t*, const int32_t*,
                                             const double*, int, int, int, const double*, double*);
template double cross_entropy_forward<double>(double*, const double*, const int32_t*, const int32_t*,
                                              const double*, int, int, int, const double*, double*);
template void cross_entropy_backward<float>(float*, const float*, const float*, const int32_t*,
                                            const int32_t*, const double*, int, int, int, double);
template void cross_entropy_backward<double>(double*, const double*, const double*, const int32_t*,
                                             const int32_t*, const double*, int, int, int, double);

}  // namespace tt::cpu
