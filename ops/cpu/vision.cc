// LayerNorm and GELU (tanh), CPU reference (see vision.h).
//   LayerNorm: n = (x - m) r, out = n w + b  =>  g = dout w, dx = r (g - mean(g) - n mean(g n)),
//              dw = sum_rows dout n, db = sum_rows dout.
//   GELU exact: y = x Phi(x)  =>  y' = Phi(x) + x phi(x).
//   GELU tanh: u = k (x + a x^3), y = x (1 + tanh u) / 2
//              =>  y' = (1 + tanh u) / 2 + x (1 - tanh^2 u) k (1 + 3 a x^2) / 2.
#include "ops/cpu/vision.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt::cpu {
namespace {

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;   // 1 / sqrt(2 pi)

}  // namespace

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int rows, int C, double eps) {
  TT_CHECK(rows >= 0 && C > 0 && eps >= 0, "layernorm_forward: expected rows >= 0, C > 0, eps >= 0, got ", rows, ", ",
           C, ", ", eps);
#pragma omp parallel for schedule(static) if (omp_worth((int64_t)rows * C))
  for (int r = 0; r < rows; r++) {
    const T* xr = x + (size_t)r * C;
    double m = 0;
    for (int c = 0; c < C; c++) m += (double)xr[c];
    m /= C;
    double v = 0;
    for (int c = 0; c < C; c++) v += ((double)xr[c] - m) * ((double)xr[c] - m);
    const double rs = 1.0 / std::sqrt(v / C + eps);
    for (int c = 0; c < C; c++)
      out[(size_t)r * C + c] = (T)(((double)xr[c] - m) * rs * (double)w[c] + (b ? (double)b[c] : 0.0));
    mean[r] = (T)m;
    rstd[r] = (T)rs;
  }
}

template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int rows, int C) {
  TT_CHECK(rows >= 0 && C > 0, "layernorm_backward: expected rows >= 0, C > 0, got ", rows, ", ", C);
  std::vector<double> gw(dw ? C : 0, 0.0), gb(db ? C : 0, 0.0);
  for (int r = 0; r < rows; r++) {  // serial: dw, db sum over rows in a fixed order
    const size_t o = (size_t)r * C;
    const double m = mean[r], rs = rstd[r];
    double sg = 0, sgn = 0;
    for (int c = 0; c < C; c++) {
      const double n = ((double)x[o + c] - m) * rs, g = (double)dout[o + c] * (double)w[c];
      sg += g;
      sgn += g * n;
      if (dw) gw[c] += (double)dout[o + c] * n;
      if (db) gb[c] += (double)dout[o + c];
    }
    if (dx)
      for (int c = 0; c < C; c++) {
        const double n = ((double)x[o + c] - m) * rs, g = (double)dout[o + c] * (double)w[c];
        dx[o + c] = (T)((double)dx[o + c] + rs * (g - sg / C - n * sgn / C));
      }
  }
  for (int c = 0; dw && c < C; c++) dw[c] = (T)((double)dw[c] + gw[c]);
  for (int c = 0; db && c < C; c++) db[c] = (T)((double)db[c] + gb[c]);
}

// Both GELU forms in a shape without cancellation, so the oracle keeps its relative accuracy in
// the tails (1 + tanh(u) and 1 + erf(z) round to 0 in fp64 for large negative arguments, where the
// values are tiny but not 0): x (1 + tanh u) / 2 = x sigmoid(2u), with sigmoid and 1 - sigmoid
// each from the exponential of a non-positive argument, and 1 + erf(z) = erfc(-z).
namespace {
inline void sigmoid_pair(double z, double* s, double* oms) {
  const double e = std::exp(-std::fabs(z));  // <= 1
  const double big = 1.0 / (1.0 + e), small = e / (1.0 + e);
  *s = z >= 0 ? big : small;
  *oms = z >= 0 ? small : big;
}
}  // namespace

template <class T>
void gelu_tanh_forward(T* y, const T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (omp_worth(n * 16))
  for (int64_t i = 0; i < n; i++) {
    const double v = (double)x[i];
    double s, oms;
    sigmoid_pair(2.0 * kGeluK * (v + kGeluA * v * v * v), &s, &oms);
    y[i] = (T)(v * s);
  }
}

template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (omp_worth(n * 16))
  for (int64_t i = 0; i < n; i++) {  // y' = s + x s (1 - s) 2 u', s = sigmoid(2u)
    const double v = (double)x[i];
    double s, oms;
    sigmoid_pair(2.0 * kGeluK * (v + kGeluA * v * v * v), &s, &oms);
    const double d = s + v * s * oms * 2.0 * kGeluK * (1.0 + 3.0 * kGeluA * v * v);
    dx[i] = (T)((double)dx[i] + (double)dy[i] * d);
  }
}

namespace {

// Calls f(row element index, pixel index) for every element of the patch matrix.
template <class F>
void for_patch_elements(int H, int W, int patch, F&& f) {
  TT_CHECK(patch > 0 && H > 0 && W > 0 && H % patch == 0 && W % patch == 0, "patchify: a ", H, " x ", W,
           " image does not split into ", patch, " x ", patch, " patches");
  const int pw = W / patch, row = 3 * patch * patch;
  for (int py = 0; py < H / patch; py++)
    for (int px = 0; px < pw; px++)
      for (int c = 0; c < 3; c++)
        for (int dy = 0; dy < patch; dy++)
          for (int dx = 0; dx < patch; dx++)
            f(((size_t)py * pw + px) * row + ((size_t)c * patch + dy) * patch + dx,
              ((size_t)c * H + py * patch + dy) * W + px * patch + dx);
}

}  // namespace

template <class T>
void gelu_erf_forward(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const double v = (double)x[i];
    y[i] = (T)(0.5 * v * std::erfc(-v * kSqrtHalf));
  }
}

template <class T>
void gelu_erf_backward(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {  // y' = Phi(x) + x phi(x)
    const double v = (double)x[i];
    const double d = 0.5 * std::erfc(-v * kSqrtHalf) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v);
    dx[i] = (T)((double)dx[i] + (double)dy[i] * d);
  }
}

template <class T>
void bias_add(T* out, const T* b, int rows, int C) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) out[(size_t)r * C + c] = (T)((double)out[(size_t)r * C + c] + (double)b[c]);
}

template <class T>
void bias_backward(T* db, const T* dout, int rows, int C) {
  std::vector<double> s(C, 0.0);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) s[c] += (double)dout[(size_t)r * C + c];
  for (int c = 0; c < C; c++) db[c] = (T)((double)db[c] + s[c]);
}

template <class T>
void copy_rows(T* dst, const int32_t* dst_rows, const T* src, const int32_t* src_rows, int n, int C) {
  for (int i = 0; i < n; i++)
    std::copy(src + (size_t)src_rows[i] * C, src + (size_t)(src_rows[i] + 1) * C, dst + (size_t)dst_rows[i] * C);
}

template <class T>
void sum_rows(T* dst, const T* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C) {
  std::vector<double> acc((size_t)C);
  for (int d = 0; d < n_dst; d++) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int k = offsets[d]; k < offsets[d + 1]; k++) {
      const T* s = src + (size_t)src_rows[k] * C;
      for (int c = 0; c < C; c++) acc[c] += (double)s[c];
    }
    T* o = dst + (size_t)d * C;
    for (int c = 0; c < C; c++) o[c] = (T)acc[c];
  }
}

template <class T>
void zero_rows(T* dst, const int32_t* rows, int n, int C) {
  for (int i = 0; i < n; i++) std::fill(dst + (size_t)rows[i] * C, dst + (size_t)(rows[i] + 1) * C, T(0));
}

template <class T>
void patchify(T* out, const T* pixels, int H, int W, int patch) {
  for_patch_elements(H, W, patch, [&](size_t o, size_t p) { out[o] = pixels[p]; });
}

template <class T>
void unpatchify_add(T* dpixels, const T* dout, int H, int W, int patch) {
  for_patch_elements(H, W, patch, [&](size_t o, size_t p) { dpixels[p] += dout[o]; });
}

#define TT_VISION_INSTANTIATE(T)                                                                        \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, double);       \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, \
                                      int);                                                             \
  template void gelu_tanh_forward<T>(T*, const T*, int64_t);                                            \
  template void gelu_tanh_backward<T>(T*, const T*, const T*, int64_t);                                 \
  template void gelu_erf_forward<T>(T*, const T*, int64_t);                                             \
  template void gelu_erf_backward<T>(T*, const T*, const T*, int64_t);                                  \
  template void bias_add<T>(T*, const T*, int, int);                                                    \
  template void bias_backward<T>(T*, const T*, int, int);                                               \
  template void copy_rows<T>(T*, const int32_t*, const T*, const int32_t*, int, int);                   \
  template void sum_rows<T>(T*, const T*, const int32_t*, const int32_t*, int, int);                    \
  template void zero_rows<T>(T*, const int32_t*, int, int);                                             \
  template void patchify<T>(T*, const T*, int, int, int);                                               \
  template void unpatchify_add<T>(T*, const T*, int, int, int);
TT_VISION_INSTANTIATE(float)
TT_VISION_INSTANTIATE(double)
#undef TT_VISION_INSTANTIATE

}  // namespace tt::cpu
