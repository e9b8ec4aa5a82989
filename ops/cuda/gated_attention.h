// Qwen3.5's gated attention, CUDA: the same meaning as ops/cpu/gated_attention.h on bf16 tensors
// (fp32 math). q_proj gives, per head, the query and an output gate; the attention output is
// multiplied by sigmoid(gate) before o_proj. The head split and merge are strided copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/bf16.h"

namespace tt::cuda {

// ab (N, H, 2D) per head [a_h (D) | b_h (D)] -> a, b (N, H, D); merge_heads the reverse.
void split_heads(bf16* a, bf16* b, const bf16* ab, int N, int H, int D, cudaStream_t stream);
void merge_heads(bf16* ab, const bf16* a, const bf16* b, int N, int H, int D, cudaStream_t stream);

// y = x sigmoid(gate) (n elements); backward: dx = dy sigmoid(gate), dgate = dy x s (1 - s), both
// overwritten (dx may alias dy).
void sigmoid_gate_forward(bf16* y, const bf16* x, const bf16* gate, int64_t n, cudaStream_t stream);
void sigmoid_gate_backward(bf16* dx, bf16* dgate, const bf16* dy, const bf16* x, const bf16* gate, int64_t n,
                           cudaStream_t stream);

}  // namespace tt::cuda
