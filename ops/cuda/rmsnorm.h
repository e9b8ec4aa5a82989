// RMSNorm over the last dimension, CUDA: out = x * rsqrt(mean(x^2) + eps) * w, bf16 in and out,
// fp32 math, rstd saved in fp32. Also Qwen3's per-head q/k norm with rows = N * heads, C = HS.
// Gradient contract (as ops/cpu/rmsnorm.h): forward overwrites out and rstd; backward accumulates
// (+=) into dx (bf16) and dw (fp32, the master-gradient buffer); with accumulate_dx false it
// overwrites dx instead (bitwise the sum into a zeroed dx, without the zeroing and the read).
// dw is reduced in two fixed stages (row chunks, then chunks in order), so it is deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// out (rows, C), rstd (rows) fp32; x (rows, C), w (C). The scale is w + w_offset (w_offset 1:
// Qwen3.5's zero-centred weights, as ops/cpu/rmsnorm.h); likewise for every op below.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int rows, int C, double eps,
                     cudaStream_t stream, double w_offset = 0);

// Workspace bytes rmsnorm_backward needs (0 when dw is not wanted).
size_t rmsnorm_backward_workspace_bytes(int rows, int C);

// dx (rows, C) bf16 +=, dw (C) fp32 +=; either may be null to skip it. dout, x (rows, C), w (C),
// rstd (rows) from the forward. dout in bf16, or in fp32 (a GEMM's fp32 sum of several products,
// read without rounding it to bf16 first).
void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx = true,
                      double w_offset = 0);
void rmsnorm_backward(bf16* dx, float* dw, const float* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx = true,
                      double w_offset = 0);

// Qwen3's q/k norm followed by the rotary embedding (ops/cuda/rope.h), one pass each way; the
// reference is ops/cpu rmsnorm then rope. x (N, H, HS) the projection's output, w (HS) the norm
// weight, rope_cs (N, HS/2) from rope_table; HS 64, 128 or 256, rows 16-byte aligned.
// Forward: out (N, H, HS) = rope(rmsnorm(x) w), rounded to bf16 once; rstd (N H) as
// rmsnorm_forward. Backward: dout is the gradient of the rotated output; dx (N, H, HS) and dw (HS)
// as rmsnorm_backward of the rotated-back gradient (kept in fp32), workspace
// rmsnorm_backward_workspace_bytes(N H, HS).
// Whether the fused op takes head dim HS (64, 128 or 256); other head dims run rmsnorm and rope.
bool qk_norm_rope_supported(int HS);
// The q and k heads of N positions in one launch (qk_norm_rope_forward of each, the same
// results); with store_k, position n's k rows and its v rows (N, NKV, HS) also go to row
// store_rows[n] of store_k and store_v ((rows, NKV, HS): the KV cache).
void qk_norm_rope_pair(bf16* q, float* q_rstd, const bf16* q_pre, const bf16* q_w, int NH, bf16* k, float* k_rstd,
                       const bf16* k_pre, const bf16* k_w, int NKV, const float2* rope_cs, int N, int HS, double eps,
                       double w_offset, const bf16* v, bf16* store_k, bf16* store_v, const int32_t* store_rows,
                       cudaStream_t stream);
void qk_norm_rope_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, const float2* rope_cs, int N, int H,
                          int HS, double eps, cudaStream_t stream, double w_offset = 0);
void qk_norm_rope_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                           const float2* rope_cs, int N, int H, int HS, Workspace ws, cudaStream_t stream,
                           bool accumulate_dx = true, double w_offset = 0);

}  // namespace tt::cuda
