// Rotary position embedding, Hugging Face rotate_half convention, CUDA, in place on bf16 (or on
// fp32: gradients kept in fp32 accumulators, such as a segment's carried-tail key gradients).
// Element d < HS/2 pairs with d + HS/2; angle = pos * theta^(-2d/HS). Angles, cos and sin are
// computed in fp64 (as ops/cpu/rope.h) and rounded to fp32 once; the rotation is fp32 math.
// Gradient contract: rope_backward applies the inverse rotation to the gradient in place (the
// gradient w.r.t. the rotated output in, the gradient w.r.t. the input out).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/bf16.h"

namespace tt::cuda {

// x (N, H, HS) rotated in place by pos (N), on the device. rotary_dim > 0: only the first
// rotary_dim dims of each head rotate, d pairing with d + rotary_dim / 2 at theta^(-2d/rotary_dim)
// (Qwen3.5's partial RoPE, as ops/cpu/rope.h).
void rope_forward(bf16* x, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                  int rotary_dim = 0);

// dx (N, H, HS) in place.
void rope_backward(bf16* dx, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                   int rotary_dim = 0);

// The same on fp32 rows (no rounding between the rotation and the store).
void rope_forward(float* x, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                  int rotary_dim = 0);
void rope_backward(float* dx, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                   int rotary_dim = 0);

// cs (N, HS/2): (cos, sin) of each position's angles, the values rope_forward uses (fp64, rounded
// once to fp32); for the fused q/k norm + rotation of rmsnorm.h, built once per batch. HS is a
// multiple of 16; angle d of a position sits at slot rope_table_slot(d, HS) of its row, so that
// lanes holding 8 consecutive d each read the table coalesced.
void rope_table(float2* cs, const int32_t* pos, int N, int HS, double theta, cudaStream_t stream);

__host__ __device__ inline int rope_table_slot(int d, int HS) { return (d % 8) * (HS / 16) + d / 8; }

}  // namespace tt::cuda
