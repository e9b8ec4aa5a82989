// RMSNorm over the last dimension, CUDA: out = x * rsqrt(mean(x^2) + eps) * w, bf16 in and out,
// fp32 math, rstd saved in fp32. Also Qwen3's per-head q/k norm with rows = N * heads, C = HS.
// Gradient contract (as ops/cpu/rmsnorm.h): forward overwrites out and rstd; backward accumulates
// (+=) into dx (bf16) and dw (fp32, the master-gradient buffer); with accumulate_dx false it
// overwrites dx instead (bitwise the sum into a zeroed dx, without the zeroing and the read).
// dw is reduced in two fixed stages (row chunks, then chunks in order), so it is deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// out (rows, C), rstd (rows) fp32; x (rows, C), w (C).
void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int rows, int C, double eps,
                     cudaStream_t stream);

// Workspace bytes rmsnorm_backward needs (0 when dw is not wanted).
size_t rmsnorm_backward_workspace_bytes(int rows, int C);

// dx (rows, C) bf16 +=, dw (C) fp32 +=; either may be null to skip it. dout, x (rows, C), w (C),
// rstd (rows) from the forward. dout in bf16, or in fp32 (a GEMM's fp32 sum of several products,
// read without rounding it to bf16 first).
void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx = true);
void rmsnorm_backward(bf16* dx, float* dw, const float* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx = true);

}  // namespace tt::cuda
