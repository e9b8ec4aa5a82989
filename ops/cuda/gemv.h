// The Linear forward of a few rows (a decode step's batch), CUDA: out (N, OC) = x (N, IC) @ w
// (OC, IC)^T for N <= kGemvMaxRows, bf16 operands, fp32 accumulation, bf16 or fp32 out
// (overwritten). The same product as cuda::matmul_forward (gemm.h), which routes such shapes
// here; the weights are read once, with 16-byte streaming loads, at close to the copy bandwidth
// where cuBLASLt's kernels for one row reach about a third of it (docs/BENCHMARKS.md).
//
// A group of S warps computes two weight rows' products for all N rows: each lane accumulates a
// strided share of the IC products in fp32, a butterfly over the warp sums the lanes, and the S
// warps' sums are added in a fixed order (deterministic). S grows (up to 8) while the groups are
// too few to fill the GPU (a 1024-column K projection). Needs IC % 8 == 0 and 16-byte aligned x
// and w (gemv_supported).
//
// The fused forms serve a decode step's layers with fewer launches: the same function as the
// unfused ops they replace, one rounding where those have one; not bit for bit (the norm adds its
// squares in another order, a last-ulp difference in rstd; the gate/up products are summed over
// other slice counts than the unfused GEMV would pick):
//   gemv_split:    the RMSNorm of x's rows (GemvNorm, rmsnorm.h's formula) computed in every
//                  block into shared memory, then up to kGemvMaxSegments outputs of consecutive
//                  column ranges, each with its own weight matrix (the q, k and v projections).
//   gemv_swiglu:   RMSNorm, then gate = n wg^T and up = n wu^T (both rounded to bf16, as the
//                  unfused linears store them) and h = silu(gate) up (swiglu.h), one group per
//                  output column (its gate and up rows).
//   gemv_residual: out = res + x w^T, one rounding (the o_proj / down_proj with the residual add).
// Each block of a fused norm writes the normalized rows to shared memory; block 0 also stores them
// (n) and rstd for a training forward's saved activations.
//
// Launch: programmatic dependent launch (PDL): each lane loads its first step of weight vectors
// before the kernel waits for the previous one on the stream (griddepcontrol.wait), so the weight
// stream starts while that kernel drains, and the kernel lets the next one launch right away (it
// too waits before reading what this one writes). Measured on an H200 (a batch-1 step of the
// 1.7B shape): letting the next kernel launch only after the products 1.59 ms, right away 1.55;
// asking L2 for the whole weight rows up front (cp.async.bulk.prefetch) 1.90 vs 1.74 without.
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/bf16.h"

namespace tt::cuda {

constexpr int kGemvMaxRows = 8;
constexpr int kGemvMaxSegments = 3;
// Shared memory a fused norm may take (N rows of IC bf16).
constexpr int kGemvNormSmemBytes = 96 * 1024;

// Whether gemv_forward takes this shape and these pointers.
bool gemv_supported(const void* x, const void* w, int N, int IC);
// Whether the fused norm takes N rows of IC (x, norm_w and n (null: not stored) 16-byte aligned,
// IC % 8 == 0, N IC bf16 within kGemvNormSmemBytes).
bool gemv_norm_supported(const void* x, const void* norm_w, const void* n, int N, int IC);

void gemv_forward(bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream);
void gemv_forward(float* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream);

// RMSNorm of x's rows before the products: n = x rstd (w + w_offset), rstd = 1 / sqrt(mean(x^2)
// + eps); n (N, IC) and rstd (N) are stored when non-null.
struct GemvNorm {
  const bf16* w = nullptr;
  float eps = 0.f;
  float w_offset = 0.f;
  bf16* n = nullptr;
  float* rstd = nullptr;
};
struct GemvSegment {
  bf16* out = nullptr;      // (N, OC)
  const bf16* w = nullptr;  // (OC, IC), 16-byte aligned
  int OC = 0;
};

void gemv_split(const GemvSegment* segments, int n_segments, const bf16* x, const GemvNorm& norm, int N, int IC,
                cudaStream_t stream);
// gate / up (N, I) may be null (not stored); h (N, I).
void gemv_swiglu(bf16* h, bf16* gate, bf16* up, const bf16* x, const GemvNorm& norm, const bf16* wg,
                 const bf16* wu, int N, int IC, int I, cudaStream_t stream);
void gemv_residual(bf16* out, const bf16* res, const bf16* x, const bf16* w, int N, int IC, int OC,
                   cudaStream_t stream);

}  // namespace tt::cuda
