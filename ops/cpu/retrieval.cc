// Segment retrieval, CPU reference (see retrieval.h).
#include "ops/cpu/retrieval.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "base/check.h"

namespace tt::cpu {

template <class T>
void retrieval_select(int32_t* idx, const T* q, const T* pool_k, int P, int NH, int NKV, int HS, uint64_t heads,
                      int R) {
  TT_CHECK(P >= 0 && NH > 0 && NKV > 0 && NH % NKV == 0 && HS > 0 && NKV <= 64, "retrieval_select: P=", P,
           " NH=", NH, " NKV=", NKV, " HS=", HS, ", expected NH a multiple of NKV <= 64");
  TT_CHECK(R >= 0 && R <= P, "retrieval_select: R=", R, " rows of a pool of ", P);
  const int G = NH / NKV, NL = __builtin_popcountll(heads);
  std::vector<double> score(P);
  std::vector<int32_t> order(P);
  for (int g = 0; g < NKV; g++) {
    int32_t* out = idx + (int64_t)g * R;
    if (!((heads >> g) & 1)) {
      std::fill(out, out + R, -1);
      continue;
    }
    for (int j = 0; j < P; j++) {
      double s = 0;
      for (int h = g * G; h < (g + 1) * G; h++) {
        const T* qh = q + (int64_t)h * HS;
        const T* kj = pool_k + ((int64_t)j * NL + pool_slot(heads, g)) * HS;
        for (int d = 0; d < HS; d++) s += (double)qh[d] * (double)kj[d];
      }
      score[j] = s;
    }
    std::iota(order.begin(), order.end(), 0);
    // Highest score first, the lower row on ties: a strict weak order, so the R kept are unique.
    std::partial_sort(order.begin(), order.begin() + R, order.end(), [&](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + R, out);
    std::sort(out, out + R);
  }
}

template <class T>
void retrieval_gather(T* out, const T* pool, const int32_t* idx, int R, int NKV, int HS, uint64_t heads) {
  const int NL = __builtin_popcountll(heads);
  for (int r = 0; r < R; r++) {
    for (int g = 0; g < NKV; g++) {
      T* o = out + ((int64_t)r * NKV + g) * HS;
      if (!((heads >> g) & 1)) {
        std::fill(o, o + HS, T(0));
        continue;
      }
      const T* p = pool + ((int64_t)idx[(int64_t)g * R + r] * NL + pool_slot(heads, g)) * HS;
      std::copy(p, p + HS, o);
    }
  }
}

template void retrieval_select<float>(int32_t*, const float*, const float*, int, int, int, int, uint64_t, int);
template void retrieval_select<double>(int32_t*, const double*, const double*, int, int, int, int, uint64_t, int);
template void retrieval_gather<float>(float*, const float*, const int32_t*, int, int, int, uint64_t);
template void retrieval_gather<double>(double*, const double*, const int32_t*, int, int, int, uint64_t);

}  // namespace tt::cpu
