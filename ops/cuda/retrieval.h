// Segment retrieval, CUDA: the op of ops/cpu/retrieval.h on bf16 tensors. Scores in fp32 (bf16
// products are exact in fp32; sums over the KV head's query heads, then the head dim), the R
// rows of highest score per long-range KV head, ties to the lower row, listed ascending. The
// order of near-ties (scores within fp32 / bf16 rounding of each other) may differ from the fp64
// reference; which rows were retrieved is a model input, so the GPU tests compare the selection
// where the scores are separated and the gather on the indices the CPU chose.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// Device bytes of scratch retrieval_select needs for a pool of P rows.
size_t retrieval_select_workspace_bytes(int P, int R);

// idx (NKV, R) int32, overwritten: for each KV head g in `heads` (bit g) its R selected rows,
// ascending; -1 for the other heads. q (NH, HS); pool_k (P, NL, HS), the long-range heads only
// (NL = popcount(heads), slot s the s-th head of `heads`: ops/cpu/retrieval.h pool_slot);
// 0 <= R <= P, NKV <= 64.
// Device pointers; ws at least retrieval_select_workspace_bytes(P, R).
void retrieval_select(int32_t* idx, const bf16* q, const bf16* pool_k, int P, int NH, int NKV, int HS,
                      uint64_t heads, int R, Workspace ws, cudaStream_t stream);

// out (R, NKV, HS): head g's slice of row r is pool row idx[g][r]'s slot of g for g in `heads`,
// zero for the other heads. pool (P, NL, HS).
void retrieval_gather(bf16* out, const bf16* pool, const int32_t* idx, int R, int NKV, int HS, uint64_t heads,
                      cudaStream_t stream);

}  // namespace tt::cuda
