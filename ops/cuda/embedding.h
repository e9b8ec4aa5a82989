// Token embedding lookup and its gradient, CUDA (bf16 table and activations, fp32 gradient).
// Gradient contract (as ops/cpu/embedding.h): embedding_forward overwrites out;
// embedding_backward accumulates (+=) into dwte.
//
// The backward is deterministic: tokens are stably sorted (radix sort), so each vocabulary row is
// summed by one block over its packed rows in packed order, in fp32, then added to dwte once.
// Token ids are checked on the device: an id outside [0, V) makes its output row NaN in the
// forward, and contributes nothing in the backward.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// out (N, C) = wte[tokens[n]] with wte (V, C); tokens (N) on the device.
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, int V,
                       cudaStream_t stream);

// Workspace bytes embedding_backward needs for N tokens.
size_t embedding_backward_workspace_bytes(int N);

// dwte (V, C) fp32 += scatter of dout (N, C) by tokens (N).
void embedding_backward(float* dwte, const bf16* dout, const int32_t* tokens, int N, int C, int V,
                        Workspace ws, cudaStream_t stream);

}  // namespace tt::cuda
