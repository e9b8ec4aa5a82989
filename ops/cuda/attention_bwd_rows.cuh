// The tree attention backward's passes over rows, around its key-tile kernel: the preprocess
// (D = dout . out, lse in base 2, dq_accum zeroed), the dq conversion (fp32 dq_accum -> bf16 dq,
// scaled) and the store of a key tile's dK and dV (store_dkv, called at the end of the key-tile
// kernel). Written against the primitives of attention_device.cuh (which the includer brings in
// first; tests/ops_cuda_attention/warp_emulator.h provides the same names).
#pragma once

#include <cstdint>

#include "ops/cuda/attention_params.h"

namespace tt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;

// D = dout . out per (row, head) and lse in base 2, into (NH, n_pad) buffers (0 on padding rows),
// and dq_accum zeroed; one warp per (row, head).
template <int HS>
__global__ void attention_bwd_preprocess_kernel(const AttnBwdParams p) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= (int64_t)p.n_pad * p.nh) return;
  const int i = (int)(w / p.nh), h = (int)(w % p.nh);
  // dq_accum (n_pad * NH * HS floats, either layout) zeroed, HS floats per warp.
  for (int c = 4 * lane; c < HS; c += 128)
    *reinterpret_cast<float4*>(p.dq_accum + w * HS + c) = make_float4(0.f, 0.f, 0.f, 0.f);
  float d = 0.f;
  if (i < p.n) {
    const bf16* o = p.out + i * p.o_row_stride + h * p.o_head_stride;
    const bf16* dout = p.dout + i * p.o_row_stride + h * p.o_head_stride;
    for (int c = 2 * lane; c < HS; c += 64) d += dot_bf16x2(o + c, dout + c);
  }
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
  d += __shfl_xor_sync(0xffffffffu, d, 4);
  d += __shfl_xor_sync(0xffffffffu, d, 8);
  d += __shfl_xor_sync(0xffffffffu, d, 16);
  if (lane == 0) {
    p.dsum[(int64_t)h * p.n_pad + i] = d;
    p.lse_log2[(int64_t)h * p.n_pad + i] = i < p.n ? p.lse[(int64_t)i * p.nh + h] * kLog2e : 0.f;
  }
}

// dq (N, NH, HS) = scale * dq_accum; dq_convert_threads(p, HS) threads.
// Row-major dq_accum: 8 elements per thread. Blocked (AttnBwdParams::dq_blocked): a thread takes
// the four float4s of lanes 4g..4g+3 for column group j of one warp's 16 rows (64 contiguous
// bytes: rows g and g + 8, 8 columns each), so reads use whole sectors and the threads of a
// row's column groups write it contiguously.
template <int HS>
__global__ void attention_dq_convert_kernel(const AttnBwdParams p) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (p.dq_blocked) {
    constexpr int kGroups = HS / 16;  // column groups of 8 in a half of the head dim
    const int64_t unit = c / (8 * kGroups);  // ((h, query block of 64), half, warp)
    if (unit >= (int64_t)p.nh * (p.n_pad / 64) * 8) return;
    const int w = (int)(c % (8 * kGroups)), g = w / kGroups, j = w % kGroups;
    const int warp = (int)(unit % 4), half = (int)(unit / 4 % 2);
    const int64_t hb = unit / 8;  // h * (n_pad / 64) + query block
    const int h = (int)(hb / (p.n_pad / 64));
    const int64_t row = (hb % (p.n_pad / 64)) * 64 + warp * 16 + g;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + unit * (8 * HS)) + j * 32 + 4 * g;
    float4 f[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) f[t] = src[t];
    const int col = half * (HS / 2) + 8 * j;
#pragma unroll
    for (int r8 = 0; r8 < 2; ++r8) {
      const int64_t i = row + 8 * r8;
      if (i >= p.n) continue;
      bf16* dst = p.dq + i * p.o_row_stride + h * p.o_head_stride + col;
#pragma unroll
      for (int t = 0; t < 4; ++t)
        store_bf16x2(dst + 2 * t, (r8 ? f[t].z : f[t].x) * p.scale, (r8 ? f[t].w : f[t].y) * p.scale);
    }
    return;
  }
  const int64_t per_row = (int64_t)p.nh * HS / 8;  // chunks of 8
  if (c >= (int64_t)p.n * per_row) return;
  const int64_t i = c / per_row;
  const int rem = (int)(c % per_row) * 8;
  const int h = rem / HS, d = rem % HS;
  bf16* dst = p.dq + i * p.o_row_stride + h * p.o_head_stride + d;
  const float* src = p.dq_accum + ((int64_t)i * p.nh + h) * HS + d;
#pragma unroll
  for (int u = 0; u < 8; u += 2) store_bf16x2(dst + u, src[u] * p.scale, src[u + 1] * p.scale);
}

// One thread's share of a key tile's dK and dV: keys j0 and j0 + 8, of COLS columns from col0,
// columns col0 + 8 nd + 2t and col0 + 8 nd + 2t + 1, read as dk_at(nd, c) / dv_at(nd, c) with
// c = 2 half + 0 / 1 (the wgmma accumulator layout, ops/cuda/wgmma.cuh). Tree keys store bf16 (dK
// scaled); source e < n_ext adds into the external prefix's fp32 gradients where it has them. Keys
// at or past n_keys are skipped.
template <int COLS, class DK, class DV>
__device__ __forceinline__ void store_dkv(const AttnBwdParams& p, int e, int j0, int n_keys, int hk, int t, int col0,
                                          DK dk_at, DV dv_at) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = j0 + 8 * half;
    if (j >= n_keys) continue;
    const int64_t off = j * p.k_row_stride + hk * p.k_head_stride + col0 + 2 * t;
    if (e >= p.n_ext) {
#pragma unroll
      for (int nd = 0; nd < COLS / 8; ++nd) {
        store_bf16x2(p.dk + off + nd * 8, dk_at(nd, 2 * half) * p.scale, dk_at(nd, 2 * half + 1) * p.scale);
        store_bf16x2(p.dv + off + nd * 8, dv_at(nd, 2 * half), dv_at(nd, 2 * half + 1));
      }
    } else {
      const AttnExtParams& x = p.ext[e];
#pragma unroll
      for (int nd = 0; nd < COLS / 8; ++nd) {
        if (x.dk) add_f32x2(x.dk + off + nd * 8, dk_at(nd, 2 * half) * p.scale, dk_at(nd, 2 * half + 1) * p.scale);
        if (x.dv) add_f32x2(x.dv + off + nd * 8, dv_at(nd, 2 * half), dv_at(nd, 2 * half + 1));
      }
    }
  }
}

}  // namespace tt::cuda::attn
