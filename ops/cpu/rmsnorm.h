// RMSNorm over the last dimension, CPU reference (Llama/Qwen3: out = x * rsqrt(mean(x^2) + eps) * w).
// Also serves Qwen3's per-head q/k norm with rows = N * heads and C = head_dim.
// Forward saves rstd (rows). Gradient contract: dx and dw are accumulated (+=).
#pragma once

namespace tt::cpu {

// out (rows, C), rstd (rows), x (rows, C), w (C). The scale is w + w_offset (w_offset 1: Qwen3.5's
// zero-centred weights, applied as 1 + w).
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int rows, int C, double eps, double w_offset = 0);

// dx (rows, C) +=, dw (C) +=.
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int rows, int C,
                      double w_offset = 0);

}  // namespace tt::cpu
