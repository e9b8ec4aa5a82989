// Dense projection out = x W^T (W in Hugging Face (OC, IC) layout) and its gradients, CPU reference.
//
// All three products run through one register-blocked kernel, C[r, c] (+)= sum_k A[r, k] B[c, k]:
//   forward  out = x  @ w^T:    A = x (N, IC),        B = w (OC, IC),    K = IC
//   backward dx += dout @ w:    A = dout (N, OC),     B = w^T (IC, OC),  K = OC
//   backward dw += dout^T @ x:  A = dout^T (OC, N),   B = x^T (IC, N),   K = N
// B is first packed, converted to fp64, into panels of kCols columns stored k-major; A is
// converted per tile and k chunk the same way. The inner loop then reads contiguous doubles and
// the compiler vectorizes the kRows x kCols block of fp64 accumulators (SSE2 at x86-64-v2; a
// float A read in place instead made GCC spill accumulators and ran 2x slower). Each output
// element is summed over k in increasing order in fp64, exactly the plain fp64 dot product, and
// has one writer: results are deterministic and do not depend on the thread count. Threads split
// the rows of C. Timings: tests/ops/matmul_bench.cc.
#include "ops/cpu/matmul.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {
namespace {

constexpr int kRows = 4;  // rows of C per register block
constexpr int kCols = 4;  // columns of C per register block (one packed panel)
// Rows of C per thread tile and k values per chunk: the fp64 A chunk (kTileRows x kChunk, 64 KiB)
// stays in L2 while every panel streams past it.
constexpr int kTileRows = 32;
constexpr int kChunk = 256;

// A strided matrix view: element (r, k) at p[r * rs + k * ks].
template <class T>
struct View {
  const T* p;
  int64_t rs, ks;
};

// Packs B (cols x K) into fp64 panels: panel[cb][k][j] = B[cb * kCols + j, k], zero past cols.
template <class T>
std::vector<double> pack_panels(View<T> b, int cols, int K) {
  const int n_panels = (cols + kCols - 1) / kCols;
  std::vector<double> packed((int64_t)n_panels * K * kCols, 0.0);  // (n_panels, K, kCols)
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)cols * K))
  for (int cb = 0; cb < n_panels; cb++) {
    double* panel = packed.data() + (int64_t)cb * K * kCols;
    for (int j = 0; j < kCols && cb * kCols + j < cols; j++) {
      const T* src = b.p + (int64_t)(cb * kCols + j) * b.rs;
      for (int k = 0; k < K; k++) panel[(int64_t)k * kCols + j] = (double)src[k * b.ks];
    }
  }
  return packed;
}

// C (rows, cols) row-major with row stride ldc: C = A B^T (accumulate = false) or C += A B^T.
// Each thread takes tiles of kTileRows rows; per chunk of kChunk k values it converts the A tile
// to fp64 (k-major per 4-row block) and runs every panel over it, carrying the fp64 sums of the
// whole tile row in `sums` between chunks.
template <class T>
void gemm_nt(T* c, int64_t ldc, View<T> a, const std::vector<double>& packed, int rows, int cols,
             int K, bool accumulate) {
  const int n_panels = (cols + kCols - 1) / kCols;
  const int n_tiles = (rows + kTileRows - 1) / kTileRows;
  const int ldsum = n_panels * kCols;
  OmpErrors errors;  // an allocation failing in the region, rethrown after it
#pragma omp parallel if (omp_worth((int64_t)rows * cols * K))
  {
    std::vector<double> apack, sums;
    errors.run([&] {
      apack.resize((int64_t)kTileRows * kChunk);  // (kTileRows / kRows, kChunk, kRows)
      sums.resize((int64_t)kTileRows * ldsum);    // (kTileRows, n_panels * kCols)
    });
#pragma omp for schedule(dynamic, 1)
    for (int tile = 0; tile < n_tiles; tile++) {
      errors.run([&] {
        const int r_begin = tile * kTileRows;
        const int nrows = std::min(kTileRows, rows - r_begin);
        const int n_blocks = (nrows + kRows - 1) / kRows;
        std::fill(sums.begin(), sums.end(), 0.0);
        for (int k0 = 0; k0 < K; k0 += kChunk) {
          const int kn = std::min(kChunk, K - k0);
          // Rows past the end repeat the last row; their sums are never written out.
          for (int b = 0; b < n_blocks; b++) {
            double* ab = apack.data() + (int64_t)b * kChunk * kRows;
            for (int i = 0; i < kRows; i++) {
              const T* ar = a.p + (int64_t)(r_begin + std::min(b * kRows + i, nrows - 1)) * a.rs;
              for (int k = 0; k < kn; k++) ab[k * kRows + i] = (double)ar[(int64_t)(k0 + k) * a.ks];
            }
          }
          for (int cb = 0; cb < n_panels; cb++) {
            const double* bp = packed.data() + ((int64_t)cb * K + k0) * kCols;  // (kn, kCols)
            for (int b = 0; b < n_blocks; b++) {
              const double* ab = apack.data() + (int64_t)b * kChunk * kRows;  // (kn, kRows)
              double* sb = sums.data() + (int64_t)b * kRows * ldsum + cb * kCols;
              double acc[kRows][kCols];
              for (int i = 0; i < kRows; i++) {
                for (int j = 0; j < kCols; j++) acc[i][j] = sb[i * ldsum + j];
              }
              for (int k = 0; k < kn; k++) {
                for (int i = 0; i < kRows; i++) {
                  const double av = ab[k * kRows + i];
                  for (int j = 0; j < kCols; j++) acc[i][j] += av * bp[k * kCols + j];
                }
              }
              for (int i = 0; i < kRows; i++) {
                for (int j = 0; j < kCols; j++) sb[i * ldsum + j] = acc[i][j];
              }
            }
          }
        }
        for (int i = 0; i < nrows; i++) {
          T* ci = c + (int64_t)(r_begin + i) * ldc;
          const double* si = sums.data() + (int64_t)i * ldsum;
          for (int j = 0; j < cols; j++) ci[j] = (T)(accumulate ? (double)ci[j] + si[j] : si[j]);
        }
      });
    }
  }
  errors.rethrow();
}

void check_dims(int N, int IC, int OC, const char* op) {
  TT_CHECK(N >= 0 && IC > 0 && OC > 0, op, ": expected N >= 0, IC > 0, OC > 0, got N=", N,
           " IC=", IC, " OC=", OC);
}

}  // namespace

template <class T>
void matmul_forward(T* out, const T* x, const T* w, int N, int IC, int OC) {
  check_dims(N, IC, OC, "matmul_forward");
  // B = w (OC, IC): B[c, k] = w[c * IC + k].
  const std::vector<double> packed = pack_panels(View<T>{w, IC, 1}, OC, IC);
  gemm_nt(out, OC, View<T>{x, IC, 1}, packed, N, OC, IC, /*accumulate=*/false);
}

template <class T>
void matmul_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, int N, int IC, int OC) {
  check_dims(N, IC, OC, "matmul_backward");
  if (dx != nullptr && N > 0) {
    // dx (N, IC) += dout (N, OC) @ w: B[c, k] = w[k * IC + c], K = OC.
    const std::vector<double> packed = pack_panels(View<T>{w, 1, IC}, IC, OC);
    gemm_nt(dx, IC, View<T>{dout, OC, 1}, packed, N, IC, OC, /*accumulate=*/true);
  }
  if (dw != nullptr && N > 0) {
    // dw (OC, IC) += dout^T (OC, N) @ x (N, IC): A[r, k] = dout[k * OC + r], B[c, k] = x[k * IC + c].
    const std::vector<double> packed = pack_panels(View<T>{x, 1, IC}, IC, N);
    gemm_nt(dw, IC, View<T>{dout, 1, OC}, packed, OC, IC, N, /*accumulate=*/true);
  }
}

template void matmul_forward<float>(float*, const float*, const float*, int, int, int);
template void matmul_forward<double>(double*, const double*, const double*, int, int, int);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*, int,
                                     int, int);
template void matmul_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int, int, int);

}  // namespace tt::cpu
