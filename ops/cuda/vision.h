// The SigLIP vision tower's elementwise, norm and row ops on the GPU (issue 16): the twins of
// ops/cpu/vision.h, bf16 activations with fp32 math, fp32 statistics and parameter gradients.
// Gradient contract as there: parameter gradients (dw, db) accumulate (+=) and are reduced in two
// fixed stages (row chunks, then the chunks in order), so they are bitwise reproducible; dx and
// the GELU input gradient accumulate or overwrite as the `accumulate` flags say. Every entry point
// checks its arguments (tt::Error naming the op) and enqueues on `stream`; empty sizes do nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// LayerNorm over the last dim (nn.LayerNorm, biased variance): out = (x - mean) rstd w + b;
// mean, rstd (rows) fp32.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w, const bf16* b, int rows,
                       int C, double eps, cudaStream_t stream);
size_t layernorm_backward_workspace_bytes(int rows, int C);
// dx (rows, C): accumulate_dx ? dx += : dx = ; dw, db (C) fp32 += (either may be null).
void layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x, const bf16* w,
                        const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                        cudaStream_t stream);

// GELU: tanh (HF gelu_pytorch_tanh) or exact (erf, HF gelu); n elements.
void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh, cudaStream_t stream);
// dx (+)= gelu'(x) dy.
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh, bool accumulate,
                   cudaStream_t stream);

// out (rows, C) += b (C).
void bias_add(bf16* out, const bf16* b, int rows, int C, cudaStream_t stream);
void bias_add(float* out, const bf16* b, int rows, int C, cudaStream_t stream);
size_t bias_backward_workspace_bytes(int rows, int C);
// db (C) += the column sums of dout (rows, C).
void bias_backward(float* db, const bf16* dout, int rows, int C, Workspace ws, cudaStream_t stream);

// Row moves (index arrays on the device): dst[dst_rows[i]] = src[src_rows[i]]; dst[rows[i]] = 0;
// sum_rows: dst[d] = the sum (fp32, k in order) of src[src_rows[k]], k in [offsets[d], offsets[d+1]).
void copy_rows(bf16* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int n, int C,
               cudaStream_t stream);
void sum_rows(bf16* dst, const bf16* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C,
              cudaStream_t stream);
void zero_rows(bf16* dst, const int32_t* rows, int n, int C, cudaStream_t stream);

// F frames of pixels (F, 3, S, S) fp32 -> patches (F (S / patch)^2, 3 patch patch) bf16 in
// cpu::patchify's order (row-major patches, each row (channel, dy, dx)).
void patchify(bf16* out, const float* pixels, int F, int S, int patch, cudaStream_t stream);

}  // namespace tt::cuda
