// Token embedding lookup and its scatter-add gradient, CPU reference.
// The backward groups the packed rows by token (a counting sort in packed order) so each
// embedding row has one writer and sums its rows in fp64 in a fixed order: deterministic for any
// thread count.
#include "ops/cpu/embedding.h"

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) {
  TT_CHECK(N >= 0 && C > 0, "embedding_forward: expected N >= 0 and C > 0, got N=", N, " C=", C);
  for (int n = 0; n < N; n++) {
    TT_CHECK(tokens[n] >= 0, "embedding_forward: token id ", tokens[n], " at packed row ", n,
             " is negative");
  }
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)N * C))
  for (int n = 0; n < N; n++) {
    const T* row = wte + (int64_t)tokens[n] * C;  // (C)
    T* o = out + (int64_t)n * C;                  // (C)
    for (int c = 0; c < C; c++) o[c] = row[c];
  }
}

template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C) {
  TT_CHECK(N >= 0 && C > 0, "embedding_backward: expected N >= 0 and C > 0, got N=", N, " C=", C);
  int V = 0;
  for (int n = 0; n < N; n++) {
    TT_CHECK(tokens[n] >= 0, "embedding_backward: token id ", tokens[n], " at packed row ", n,
             " is negative");
    V = std::max(V, tokens[n] + 1);
  }
  // Rows grouped by token, in packed order: rows_of[first[v] .. first[v + 1]).
  std::vector<int> first(V + 1, 0), rows_of(N);
  for (int n = 0; n < N; n++) first[tokens[n] + 1]++;
  for (int v = 0; v < V; v++) first[v + 1] += first[v];
  {
    std::vector<int> fill(first.begin(), first.end() - 1);
    for (int n = 0; n < N; n++) rows_of[fill[tokens[n]]++] = n;
  }
  OmpErrors errors;  // an allocation failing in the region, rethrown after it
#pragma omp parallel if (omp_worth((int64_t)N * C))
  {
    std::vector<double> acc;  // (C)
    errors.run([&] { acc.resize(C); });
#pragma omp for schedule(dynamic, 8)
    for (int v = 0; v < V; v++) {
      if (first[v] == first[v + 1]) continue;
      errors.run([&] {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int r = first[v]; r < first[v + 1]; r++) {
          const T* g = dout + (int64_t)rows_of[r] * C;  // (C)
          for (int c = 0; c < C; c++) acc[c] += (double)g[c];
        }
        T* d = dwte + (int64_t)v * C;  // (C)
        for (int c = 0; c < C; c++) d[c] = (T)((double)d[c] + acc[c]);
      });
    }
  }
  errors.rethrow();
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int, int);
template void embedding_forward<double>(double*, const int32_t*, const double*, int, int);
template void embedding_backward<float>(float*, const float*, const int32_t*, int, int);
template void embedding_backward<double>(double*, const double*, const int32_t*, int, int);

}  // namespace tt::cpu
