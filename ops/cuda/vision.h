// The SigLIP vision tower's elementwise, norm and row ops on the GPU (issue 16): the twins of
// ops/cpu/vision.h, bf16 activations with fp32 math, fp32 statistics and parameter gradients.
// Gradient contract: forwards overwrite their outputs; parameter gradients (dw, db) accumulate (+=)
// and are reduced in two fixed stages (row chunks, then the chunks in order) through the caller's
// Workspace, so they are bitwise reproducible and their summation order depends on (rows, C) only;
// dx and the GELU input gradient accumulate or overwrite as the `accumulate` flags say. Every entry
// point checks its arguments (tt::Error naming the op, "cuda::<op>: ...") and enqueues on
// `stream`; empty sizes (rows or n == 0, and C == 0 outside LayerNorm, which needs C > 0) do
// nothing. Device index arrays are not range-checked.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// LayerNorm over the last dim (nn.LayerNorm, biased variance): out (rows, C) = (x - mean) rstd w + b,
// rstd = (var + eps)^-1/2; mean, rstd (rows) fp32 saved for the backward. b may be null (no bias).
// C > 0.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w, const bf16* b, int rows,
                       int C, double eps, cudaStream_t stream);

// Workspace bytes layernorm_backward needs when dw or db is wanted.
size_t layernorm_backward_workspace_bytes(int rows, int C);

// dx (rows, C) bf16: accumulate_dx ? dx += : dx = ; dw, db (C) fp32 +=; any of the three may be
// null to skip it. dout (rows, C) in bf16, or in fp32 (a residual-stream gradient kept in fp32).
void layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x, const bf16* w,
                        const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                        cudaStream_t stream);
void layernorm_backward(bf16* dx, float* dw, float* db, const float* dout, const bf16* x, const bf16* w,
                        const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                        cudaStream_t stream);

// GELU of n elements: tanh = true the tanh approximation (HF gelu_pytorch_tanh, SigLIP's), false
// the exact erf form (HF gelu, LLaVA's projector). y = gelu(x).
void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh, cudaStream_t stream);
// accumulate ? dx += gelu'(x) dy : dx = gelu'(x) dy.
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh, bool accumulate,
                   cudaStream_t stream);

// A Linear's bias (rows = tokens) or the position embedding (rows = frames, C = tokens x width):
// out (rows, C) += b (C) broadcast over rows.
void bias_add(bf16* out, const bf16* b, int rows, int C, cudaStream_t stream);
void bias_add(float* out, const bf16* b, int rows, int C, cudaStream_t stream);

// Workspace bytes bias_backward needs.
size_t bias_backward_workspace_bytes(int rows, int C);
// db (C) fp32 += the column sums of dout (rows, C).
void bias_backward(float* db, const bf16* dout, int rows, int C, Workspace ws, cudaStream_t stream);

// Row moves between two row spaces (index arrays int32 on the device, rows of C elements):
// copy_rows: dst[dst_rows[i]] = src[src_rows[i]], i < n (bitwise copies);
// sum_rows (CSR gather-sum): dst[d] = the fp32 sum, k in order, of src[src_rows[k]] for k in
//   [offsets[d], offsets[d + 1]), rounded to bf16 once (an empty range writes zeros), d < n_dst;
//   offsets (n_dst + 1); src and src_rows are read only through non-empty ranges;
// zero_rows: dst[rows[i]] = 0, i < n.
void copy_rows(bf16* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int n, int C,
               cudaStream_t stream);
void sum_rows(bf16* dst, const bf16* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C,
              cudaStream_t stream);
void zero_rows(bf16* dst, const int32_t* rows, int n, int C, cudaStream_t stream);

// The patch embedding's input: F frames of pixels (F, 3, S, S) fp32 channel first -> out
// (F (S / patch)^2, 3 patch patch) bf16, frame by frame in cpu::patchify's order (row-major
// patches, each row (channel, dy, dx)). S % patch == 0.
void patchify(bf16* out, const float* pixels, int F, int S, int patch, cudaStream_t stream);

}  // namespace tt::cuda
