// One row of Qwen3's q/k norm followed by RoPE, in registers: the row function shared by the
// q/k norm kernel (rmsnorm.cu) and the decode attention that normalizes its own query and key rows
// (attention_decode.cu), so both round the same values the same way.
#pragma once

#include <cuda_bf16.h>

#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda::detail {

// Sum over the LANES lanes of a row (aligned lane groups of the warp); every lane calls it.
template <int LANES>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = LANES / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// RoPE on a row held by LANES lanes of 8 columns (C = 8 LANES): the lanes of the first half hold
// elements d, their partners (lane ^ LANES/2) elements d + C/2. Forward (sign +1): o_d = v_d c -
// v_{d+C/2} s, o_{d+C/2} = v_{d+C/2} c + v_d s; backward (sign -1) the inverse rotation. t: the
// lane's 8 (cos, sin) pairs from the rope table (load_cos_sin, issued early: the kernels do one
// row per thread, so a load after the row's reduction would add a memory round trip). Every lane
// of the warp calls rotate_row.
template <int LANES>
__device__ __forceinline__ void load_cos_sin(float2 (&t)[8], const float2* table_row, int sub) {
  // Angle d = 8 g + k at slot k (C / 16) + g (rope_table_slot; C / 16 = LANES / 2).
  const int g = sub % (LANES / 2);
#pragma unroll
  for (int k = 0; k < 8; k++) t[k] = table_row[k * (LANES / 2) + g];
}

template <int LANES>
__device__ __forceinline__ void rotate_row(float (&v)[8], const float2 (&t)[8], int sub, float sign) {
  const bool first = sub < LANES / 2;
  float other[8];
#pragma unroll
  for (int k = 0; k < 8; k++) other[k] = __shfl_xor_sync(0xffffffffu, v[k], LANES / 2);
  const float so = first ? -sign : sign;
#pragma unroll
  for (int k = 0; k < 8; k++) v[k] = v[k] * t[k].x + so * other[k] * t[k].y;
}

// The q/k norm's forward on a row of C = 8 LANES columns held by LANES lanes (sub = lane % LANES
// owns columns 8 sub .. 8 sub + 7): v holds the row's x on entry and rope(x rstd (w + w_offset))
// on return (rmsnorm.h's order: x rstd first, rotated before any rounding); returns rstd. cs: the
// lane's (cos, sin) pairs (load_cos_sin). Every lane of the warp calls it (rows past the end on
// zeros).
template <int LANES>
__device__ __forceinline__ float qk_norm_rope_row(float (&v)[8], const float2 (&cs)[8], const __nv_bfloat16* w,
                                                  float w_offset, float eps, int sub) {
  constexpr int C = 8 * LANES;
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < 8; k++) ss += v[k] * v[k];
  ss = row_sum<LANES>(ss);
  const float rs = rsqrtf(ss / (float)C + eps);
  float wk[8];
  load_bf16<8>(wk, w + 8 * sub);
#pragma unroll
  for (int k = 0; k < 8; k++) v[k] = v[k] * rs * (wk[k] + w_offset);
  rotate_row<LANES>(v, cs, sub, 1.f);
  return rs;
}

}  // namespace tt::cuda::detail
