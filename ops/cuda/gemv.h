// The Linear forward of a few rows (a decode step's batch), CUDA: out (N, OC) = x (N, IC) @ w
// (OC, IC)^T for N <= kGemvMaxRows, bf16 operands, fp32 accumulation, bf16 or fp32 out
// (overwritten). The same product as cuda::matmul_forward (gemm.h), which routes such shapes
// here; the weights are read once, with 16-byte streaming loads, at close to the copy bandwidth
// where cuBLASLt's kernels for one row reach about a third of it (docs/BENCHMARKS.md).
//
// A group of S warps computes two output columns for all N rows: each lane accumulates a strided
// share of the IC products in fp32, a butterfly over the warp sums the lanes, and the S warps'
// sums are added in a fixed order (deterministic). S grows (up to 8) while the columns are too
// few to fill the GPU (a 1024-column K projection). Needs IC % 8 == 0 and 16-byte aligned x and
// w (gemv_supported).
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/bf16.h"

namespace tt::cuda {

constexpr int kGemvMaxRows = 8;

// Whether gemv_forward takes this shape and these pointers.
bool gemv_supported(const void* x, const void* w, int N, int IC);

void gemv_forward(bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream);
void gemv_forward(float* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream);

}  // namespace tt::cuda
