// Sampling from logits rows on the GPU: the op of ops/cpu/sampling.h (greedy argmax or the
// Gumbel-max draw at a temperature, and the token's log-probability at temperature 1) on bf16
// logits, so a decode step copies a token and a logprob per row to the host instead of its logits.
// The Gumbel noise and the draw are computed in fp64 from the same counter-based uniforms as the
// CPU reference; max, argmax (ties to the lower id) and the log-sum-exp in fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/bf16.h"

namespace tt::cuda {

// token (R) int32, logprob (R) fp64, overwritten; logits (R, V) bf16; keys (R). Device pointers.
void sample_rows(int32_t* token, double* logprob, const bf16* logits, int R, int V, double temperature,
                 const uint64_t* keys, cudaStream_t stream);

}  // namespace tt::cuda
