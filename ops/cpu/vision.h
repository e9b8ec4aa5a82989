// The SigLIP vision tower's elementwise and norm ops (issue 16), CPU reference: plain loops, fp64
// accumulation, templated on float and double. Gradient contract as elsewhere in ops/cpu: dx and
// parameter gradients are accumulated (+=).
#pragma once

#include <cstdint>

namespace tt::cpu {

// LayerNorm over the last dimension (nn.LayerNorm): out = (x - mean) rstd w + b,
// rstd = (var + eps)^-1/2 with the biased variance; mean and rstd (rows) saved.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int rows, int C, double eps);
// dx (rows, C) +=, dw, db (C) += (any may be null).
template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int rows, int C);

// GELU, tanh approximation (HF "gelu_pytorch_tanh", SigLIP's hidden_act):
//   y = x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); n elements.
template <class T>
void gelu_tanh_forward(T* y, const T* x, int64_t n);
template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, int64_t n);  // dx +=

// GELU, exact (HF "gelu", LLaVA's projector_hidden_act): y = x Phi(x) = x / 2 (1 + erf(x / sqrt 2)).
template <class T>
void gelu_erf_forward(T* y, const T* x, int64_t n);
template <class T>
void gelu_erf_backward(T* dx, const T* dy, const T* x, int64_t n);  // dx +=

// A Linear's bias: out (rows, C) += b (C); db (C) += sum over rows of dout (fp64, rows in order).
template <class T>
void bias_add(T* out, const T* b, int rows, int C);
template <class T>
void bias_backward(T* db, const T* dout, int rows, int C);

// Row moves between two row spaces (a tower's frame tokens and a decoder's packed rows):
// copy_rows: dst[dst_rows[i]] = src[src_rows[i]]; sum_rows (a CSR gather-sum): dst[d] = the sum,
// k in order, of src[src_rows[k]] for k in [offsets[d], offsets[d + 1]) (a frame token's gradient
// over the slots that show it, in slot order; an empty range writes zeros). zero_rows:
// dst[rows[i]] = 0. Rows are C elements.
template <class T>
void copy_rows(T* dst, const int32_t* dst_rows, const T* src, const int32_t* src_rows, int n, int C);
template <class T>
void sum_rows(T* dst, const T* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C);
template <class T>
void zero_rows(T* dst, const int32_t* rows, int n, int C);

// The patch embedding's input (SigLIP's Conv2d with stride = kernel = patch, as a GEMM):
// pixels (3, H, W) channel first -> out (P, 3 patch patch), P = (H / patch) (W / patch) patches in
// row-major order, each row laid out (channel, dy, dx) like a Conv2d weight's (out, 3, patch,
// patch) rows, so out @ weight^T is the convolution. H and W must be multiples of patch.
template <class T>
void patchify(T* out, const T* pixels, int H, int W, int patch);
// The reverse, accumulated: dpixels (3, H, W) += the rows of dout (P, 3 patch patch).
template <class T>
void unpatchify_add(T* dpixels, const T* dout, int H, int W, int patch);

}  // namespace tt::cpu
