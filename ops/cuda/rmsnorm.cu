// RMSNorm forward and backward (see rmsnorm.h).
// Gradient contract: forward overwrites out (rows, C) and rstd (rows); backward accumulates (+=)
// into dx (rows, C) bf16 (or overwrites it, accumulate_dx false) and dw (C) fp32.
//
// With r = rstd and n = x r:  dx_c += r (dout_c w_c - x_c r^2 mean_k(dout_k w_k x_k)),
// dw_c += sum_rows dout_c n_c.
// Rows are short (C = 128 for the q/k norm, a few thousand for the hidden size), so a row belongs
// to LANES lanes of a warp (32, or 16 / 8 when C / VEC is that small: several rows per warp, no
// idle lanes); each lane owns the columns (it LANES + lane) VEC + k, it < IT.
// Backward, C <= 32 VEC 8 (fused): block g takes a fixed chunk of rows and computes dx row by row;
// its dw column sums are added over the rows of each warp, then over the warps in warp order, and
// written as the chunk's row of the (G, C) workspace; a second kernel adds the G chunk sums of
// each column in a fixed order. x and dout are read once. Rows of 2-8 steps per lane at VEC 8
// (the hidden norms) load a row's x, dout, old dx and rstd before the first use and keep each
// warp's column sums in shared memory; shorter rows keep them in registers (a butterfly over the
// row groups of a warp). Wider rows (C > 32 VEC 8): dx by one warp per row, and a separate
// stage-1 pass over x and dout for the chunk sums. Either way the result does not depend on
// scheduling, and dw alone or dx alone are bitwise what the pair gives.
#include "ops/cuda/rmsnorm.h"

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/qk_norm_rope_row.cuh"

namespace tt::cuda {
namespace {

using detail::load_bf16;
using detail::load_bf16_or_zero;
using detail::load_cos_sin;
using detail::load_f32;
using detail::load_row;
using detail::qk_norm_rope_row;
using detail::rotate_row;
using detail::row_sum;
using detail::store_bf16;
using detail::store_f32;
using detail::warp_sum;

constexpr int kRowThreads = 256;                       // 8 rows (warps) per block
constexpr int kRowsPerWarpBlock = kRowThreads / detail::kWarp;
constexpr int kPartialThreads = 256;                   // stage-1 block (bx * by)
constexpr int kMaxChunks = 1024;                       // G, the number of row chunks
constexpr int kMinRowsPerChunk = 32;
constexpr int kReduceCols = 32, kReduceLanes = 8;      // stage-2 block
constexpr int kMaxIt = 8;                              // column steps per lane held in registers

// w[k] += offset (the weights as the norm scales by them).
template <int VEC>
__device__ __forceinline__ void add_offset(float (&w)[VEC], float offset) {
#pragma unroll
  for (int k = 0; k < VEC; k++) w[k] += offset;
}

struct RmsnormFwdParams {
  bf16* out;        // (rows, C)
  float* rstd;      // (rows)
  const bf16* x;    // (rows, C)
  const bf16* w;    // (C)
  int rows, C;
  float eps;
  const float2* rope_cs;  // (rows / heads, C / 2) for the q/k norm + rotation, else null
  int heads;              // rows per position (rope)
  float w_offset = 0.f;   // the scale is w + w_offset (1: Qwen3.5's zero-centred weights)
  // The rotating kernel only (qk_norm_rope_pair): blocks from `blocks0` on normalize a second set
  // of rows (the k heads beside the q heads) with its own out2 / rstd2 / x2 / w2, rows2 rows of
  // heads2 a position; with store_rows, position n's rows of the second set also go to row
  // store_rows[n] of store, and the same rows of v to store_v (the KV cache).
  int blocks0 = INT_MAX;
  bf16* out2 = nullptr;
  float* rstd2 = nullptr;
  const bf16* x2 = nullptr;
  const bf16* w2 = nullptr;
  int rows2 = 0, heads2 = 0;
  bf16* store = nullptr;
  bf16* store_v = nullptr;
  const bf16* v = nullptr;
  const int32_t* store_rows = nullptr;
};

struct RmsnormBwdParams {
  bf16* dx;            // (rows, C) +=, or null
  float* dw;           // (C) +=, or null
  float* partial;      // (G, C) stage-1 column sums
  const void* dout;    // (rows, C), bf16 or fp32 (the kernels' Dout)
  const bf16* x;       // (rows, C)
  const bf16* w;       // (C)
  const float* rstd;   // (rows)
  int rows, C;
  int chunks, rows_per_chunk;  // G and the rows of each chunk
  bool dx_accumulate;          // dx += (true) or dx = (false: dx is not read)
  const float2* rope_cs;       // (rows / heads, C / 2): dout is the rotated output's gradient
  int heads;
  float w_offset = 0.f;        // the scale is w + w_offset
};

// Blocks of kRowThreads; a warp holds kWarp / LANES rows at a time. ROPE: the normalized row is
// rotated before its one rounding to bf16 (VEC 8, IT 1, C = 8 LANES).
template <int VEC, int LANES, int IT, bool ROPE = false>
__global__ void rmsnorm_forward_kernel(RmsnormFwdParams p) {
  static_assert(!ROPE || (VEC == 8 && IT == 1), "the rotation takes rows of 8 LANES columns");
  detail::pdl_wait();  // launched by launch_pdl: x is the previous kernel's output
  detail::pdl_trigger();
  constexpr int kGroups = detail::kWarp / LANES;
  const int lane = threadIdx.x % detail::kWarp;
  // The rows this block normalizes: the first set, or (rotating kernel) the second from blocks0 on.
  const bool second = ROPE && (int)blockIdx.x >= p.blocks0;
  const int block = second ? (int)blockIdx.x - p.blocks0 : (int)blockIdx.x;
  bf16* const out = second ? p.out2 : p.out;
  float* const rstd = second ? p.rstd2 : p.rstd;
  const bf16* const xs = second ? p.x2 : p.x;
  const bf16* const ws = second ? p.w2 : p.w;
  const int rows = second ? p.rows2 : p.rows, heads = second ? p.heads2 : p.heads;
  const int64_t row = ((int64_t)block * kRowsPerWarpBlock + threadIdx.x / detail::kWarp) * kGroups + lane / LANES;
  const int sub = lane % LANES;
  const bool valid = row < rows;  // the shuffles need every lane: invalid rows compute on nothing
  const bf16* x = xs + (valid ? row : 0) * p.C;
  float2 cs[ROPE ? 8 : 1];
  if constexpr (ROPE) {
    const int pos_row = valid ? (int)row / heads : 0;  // rows < 2^31: a 32-bit division
    load_cos_sin<LANES>(cs, p.rope_cs + (int64_t)pos_row * (p.C / 2), sub);
  }
  float v[IT][VEC];
#pragma unroll
  for (int it = 0; it < IT; it++) {
    const int c = (it * LANES + sub) * VEC;
    if (valid && c < p.C) {
      load_bf16<VEC>(v[it], x + c);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; k++) v[it][k] = 0.f;
    }
  }
  float rs;
  if constexpr (ROPE) {
    rs = qk_norm_rope_row<LANES>(v[0], cs, ws, p.w_offset, p.eps, sub);
  } else {
    float ss = 0.f;
#pragma unroll
    for (int it = 0; it < IT; it++)
#pragma unroll
      for (int k = 0; k < VEC; k++) ss += v[it][k] * v[it][k];
    ss = row_sum<LANES>(ss);
    rs = rsqrtf(ss / (float)p.C + p.eps);
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * LANES + sub) * VEC;
      if (c >= p.C) continue;
      float w[VEC];
      load_bf16<VEC>(w, ws + c);
      add_offset<VEC>(w, p.w_offset);
#pragma unroll
      for (int k = 0; k < VEC; k++) v[it][k] = v[it][k] * rs * w[k];
    }
  }
  if (!valid) return;
  if (sub == 0) rstd[row] = rs;
  bf16* o = out + row * p.C;
#pragma unroll
  for (int it = 0; it < IT; it++) {
    const int c = (it * LANES + sub) * VEC;
    if (c < p.C) store_bf16<VEC>(o + c, v[it]);
  }
  if constexpr (ROPE) {
    if (second && p.store) {  // the cache rows of this position (IT 1, VEC 8: c < C)
      const int64_t n = row / heads, h = row % heads;
      const int64_t dst = ((int64_t)p.store_rows[n] * heads + h) * p.C + sub * VEC;
      store_bf16<VEC>(p.store + dst, v[0]);
      *reinterpret_cast<uint4*>(p.store_v + dst) = *reinterpret_cast<const uint4*>(p.v + row * p.C + sub * VEC);
    }
  }
}

// Forward for rows longer than kWarp * VEC * kMaxIt: one warp per row, columns in a loop.
template <int VEC>
__global__ void rmsnorm_forward_wide_kernel(RmsnormFwdParams p) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int lane = threadIdx.x % detail::kWarp;
  const int64_t row = (int64_t)blockIdx.x * kRowsPerWarpBlock + threadIdx.x / detail::kWarp;
  if (row >= p.rows) return;
  const bf16* x = p.x + row * p.C;
  float ss = 0.f;
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float v[VEC];
    load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) ss += v[k] * v[k];
  }
  ss = warp_sum(ss);
  const float rs = rsqrtf(ss / (float)p.C + p.eps);
  if (lane == 0) p.rstd[row] = rs;
  bf16* o = p.out + row * p.C;
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float v[VEC], w[VEC];
    load_bf16<VEC>(v, x + c);
    load_bf16<VEC>(w, p.w + c);
    add_offset<VEC>(w, p.w_offset);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = v[k] * rs * w[k];
    store_bf16<VEC>(o + c, v);
  }
}

// Fused backward: grid (G), block kRowThreads. Block g walks rows [g rpc, (g + 1) rpc) in steps of
// the block's kRowsPerWarpBlock * kGroups rows; dx per row as in the wide kernel, dw column sums in
// registers, then the fixed-order block reduction into partial[g]. A row's dout stays in registers
// (IT VEC <= 8 here). ROPE: dout is the gradient of the rotated output; it is rotated back first.
template <int VEC, int LANES, int IT, class Dout, bool ROPE = false>
__global__ void rmsnorm_backward_fused_kernel(RmsnormBwdParams p) {
  static_assert(IT * VEC <= 8, "wider rows take the shared-memory kernel");
  static_assert(!ROPE || (VEC == 8 && IT == 1), "the rotation takes rows of 8 LANES columns");
  constexpr int kGroups = detail::kWarp / LANES;
  constexpr int kCols = LANES * IT * VEC;  // >= C
  __shared__ float colsum[kCols];
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int sub = lane % LANES;
  const int g = blockIdx.x;
  const int r0 = g * p.rows_per_chunk, r1 = min(p.rows, r0 + p.rows_per_chunk);
  const Dout* dout_all = static_cast<const Dout*>(p.dout);
  float acc[IT][VEC];
#pragma unroll
  for (int it = 0; it < IT; it++)
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[it][k] = 0.f;

  for (int base = r0 + warp * kGroups; base < r1; base += kRowsPerWarpBlock * kGroups) {
    const int64_t row = base + lane / LANES;
    const bool valid = row < r1;  // warp-uniform loop; the shuffles need every lane
    const bf16* x = p.x + (valid ? row : 0) * p.C;
    const Dout* dout = dout_all + (valid ? row : 0) * p.C;
    float2 cs[ROPE ? 8 : 1];
    if constexpr (ROPE) {
      const int pos_row = valid ? (int)row / p.heads : 0;  // rows < 2^31: a 32-bit division
      load_cos_sin<LANES>(cs, p.rope_cs + (int64_t)pos_row * (p.C / 2), sub);
    }
    float dy[IT][VEC];
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * LANES + sub) * VEC;
      if (valid && c < p.C) {
        load_row<VEC>(dy[it], dout + c);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) dy[it][k] = 0.f;
      }
    }
    if constexpr (ROPE) rotate_row<LANES>(dy[0], cs, sub, -1.f);
    float dot = 0.f;  // sum_k dout_k w_k x_k
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * LANES + sub) * VEC;
      if (!valid || c >= p.C) continue;
      float xv[VEC], wv[VEC];
      load_bf16<VEC>(xv, x + c);
      load_bf16<VEC>(wv, p.w + c);
      add_offset<VEC>(wv, p.w_offset);
#pragma unroll
      for (int k = 0; k < VEC; k++) dot += dy[it][k] * wv[k] * xv[k];
    }
    dot = row_sum<LANES>(dot);
    if (!valid) continue;
    const float rs = p.rstd[row];
    const float kcoef = rs * rs * dot / (float)p.C;
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * LANES + sub) * VEC;
      if (c >= p.C) continue;
      float xv[VEC];
      load_bf16<VEC>(xv, x + c);
      if (p.dw) {
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[it][k] += dy[it][k] * (xv[k] * rs);
      }
      if (p.dx) {
        float wv[VEC], dx[VEC];
        load_bf16<VEC>(wv, p.w + c);
        add_offset<VEC>(wv, p.w_offset);
        bf16* dxp = p.dx + row * p.C + c;
        load_bf16_or_zero<VEC>(dx, dxp, p.dx_accumulate);
#pragma unroll
        for (int k = 0; k < VEC; k++) dx[k] += rs * (dy[it][k] * wv[k] - xv[k] * kcoef);
        store_bf16<VEC>(dxp, dx);
      }
    }
  }
  if (!p.dw) return;
  // Row groups of the warp (butterfly: every lane ends with the same sum, in the same order).
#pragma unroll
  for (int o = LANES; o < detail::kWarp; o *= 2)
#pragma unroll
    for (int it = 0; it < IT; it++)
#pragma unroll
      for (int k = 0; k < VEC; k++) acc[it][k] += __shfl_xor_sync(0xffffffffu, acc[it][k], o);
  // Warps in order.
  for (int w = 0; w < kRowsPerWarpBlock; w++) {
    if (warp == w && lane < LANES) {
#pragma unroll
      for (int it = 0; it < IT; it++)
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          const int c = (it * LANES + sub) * VEC + k;
          colsum[c] = w == 0 ? acc[it][k] : colsum[c] + acc[it][k];
        }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < p.C; c += kRowThreads) p.partial[(int64_t)g * p.C + c] = colsum[c];
}

// Eight elements of a bf16 or fp32 row held as loaded (16 or 32 bytes), converted on use.
template <class T>
struct Raw8;
template <>
struct Raw8<bf16> {
  uint4 v;
  __device__ __forceinline__ void load(const bf16* p) { v = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void get(float (&o)[8]) const {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float2 f = __bfloat1622float2(h[i]);
      o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
  }
};
template <>
struct Raw8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = reinterpret_cast<const float4*>(p)[0];
    b = reinterpret_cast<const float4*>(p)[1];
  }
  __device__ __forceinline__ void get(float (&o)[8]) const {
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
  }
};

// Fused backward for rows of 32 lanes x IT x 8 (256 < C <= 2048, VEC = 8): one row per warp at a
// time with x, dout, the old dx and rstd all loaded before the first use (one memory round trip
// per row), and each warp's dw column sums in its own slice of shared memory (IT * 1 KB per warp),
// added over the warps in warp order at the end.
template <int IT, class Dout>
__global__ void __launch_bounds__(kRowThreads, sizeof(Dout) == 2 ? 2 : 1)
    rmsnorm_backward_rows_kernel(RmsnormBwdParams p) {
  constexpr int kCols = detail::kWarp * IT * 8;
  extern __shared__ float colsum_warp[];  // (kRowsPerWarpBlock, kCols) when dw is wanted
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int g = blockIdx.x;
  const int r0 = g * p.rows_per_chunk, r1 = min(p.rows, r0 + p.rows_per_chunk);
  float* mine = colsum_warp + warp * kCols;
  if (p.dw) {
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * detail::kWarp + lane) * 8;
      reinterpret_cast<float4*>(mine + c)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      reinterpret_cast<float4*>(mine + c)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  const bool read_dx = p.dx && p.dx_accumulate;
  for (int row = r0 + warp; row < r1; row += kRowsPerWarpBlock) {
    const int64_t off = (int64_t)row * p.C;
    Raw8<bf16> xr[IT], dxr[IT];
    Raw8<Dout> dr[IT];
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * detail::kWarp + lane) * 8;
      if (c >= p.C) continue;
      xr[it].load(p.x + off + c);
      dr[it].load(static_cast<const Dout*>(p.dout) + off + c);
      if (read_dx) dxr[it].load(p.dx + off + c);
    }
    const float rs = p.rstd[row];
    float dot = 0.f;  // sum_k dout_k w_k x_k
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * detail::kWarp + lane) * 8;
      if (c >= p.C) continue;
      float xv[8], dv[8], wv[8];
      xr[it].get(xv);
      dr[it].get(dv);
      load_bf16<8>(wv, p.w + c);
      add_offset<8>(wv, p.w_offset);
#pragma unroll
      for (int k = 0; k < 8; k++) dot += dv[k] * wv[k] * xv[k];
    }
    dot = warp_sum(dot);
    const float kcoef = rs * rs * dot / (float)p.C;
#pragma unroll
    for (int it = 0; it < IT; it++) {
      const int c = (it * detail::kWarp + lane) * 8;
      if (c >= p.C) continue;
      float xv[8], dv[8];
      xr[it].get(xv);
      dr[it].get(dv);
      if (p.dw) {
        float4* m4 = reinterpret_cast<float4*>(mine + c);
        float4 a = m4[0], b = m4[1];
        a.x += dv[0] * (xv[0] * rs), a.y += dv[1] * (xv[1] * rs), a.z += dv[2] * (xv[2] * rs);
        a.w += dv[3] * (xv[3] * rs), b.x += dv[4] * (xv[4] * rs), b.y += dv[5] * (xv[5] * rs);
        b.z += dv[6] * (xv[6] * rs), b.w += dv[7] * (xv[7] * rs);
        m4[0] = a, m4[1] = b;
      }
      if (p.dx) {
        float wv[8], dx[8];
        load_bf16<8>(wv, p.w + c);
        add_offset<8>(wv, p.w_offset);
        if (read_dx) {
          dxr[it].get(dx);
        } else {
#pragma unroll
          for (int k = 0; k < 8; k++) dx[k] = 0.f;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) dx[k] += rs * (dv[k] * wv[k] - xv[k] * kcoef);
        store_bf16<8>(p.dx + off + c, dx);
      }
    }
  }
  if (!p.dw) return;
  __syncthreads();
  for (int c = threadIdx.x; c < p.C; c += kRowThreads) {
    float sum = colsum_warp[c];
    for (int w = 1; w < kRowsPerWarpBlock; w++) sum += colsum_warp[w * kCols + c];
    p.partial[(int64_t)g * p.C + c] = sum;
  }
}

// dx of rows longer than kWarp * VEC * kMaxIt: one warp per row.
template <int VEC, class Dout>
__global__ void rmsnorm_backward_dx_kernel(RmsnormBwdParams p) {
  const int lane = threadIdx.x % detail::kWarp;
  const int64_t row = (int64_t)blockIdx.x * kRowsPerWarpBlock + threadIdx.x / detail::kWarp;
  if (row >= p.rows) return;
  const bf16* x = p.x + row * p.C;
  const Dout* dout = static_cast<const Dout*>(p.dout) + row * p.C;
  float dot = 0.f;  // sum_k dout_k w_k x_k
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float xv[VEC], dv[VEC], wv[VEC];
    load_bf16<VEC>(xv, x + c);
    load_row<VEC>(dv, dout + c);
    load_bf16<VEC>(wv, p.w + c);
    add_offset<VEC>(wv, p.w_offset);
#pragma unroll
    for (int k = 0; k < VEC; k++) dot += dv[k] * wv[k] * xv[k];
  }
  dot = warp_sum(dot);
  const float rs = p.rstd[row];
  const float kcoef = rs * rs * dot / (float)p.C;
  bf16* dx = p.dx + row * p.C;
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float xv[VEC], dv[VEC], wv[VEC], acc[VEC];
    load_bf16<VEC>(xv, x + c);
    load_row<VEC>(dv, dout + c);
    load_bf16<VEC>(wv, p.w + c);
    add_offset<VEC>(wv, p.w_offset);
    load_bf16_or_zero<VEC>(acc, dx + c, p.dx_accumulate);
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += rs * (dv[k] * wv[k] - xv[k] * kcoef);
    store_bf16<VEC>(dx + c, acc);
  }
}

// Stage 1 of dw for rows longer than kWarp * VEC * kMaxIt. Grid (column tiles, G); block (bx, by):
// tx picks a VEC-wide column group, ty strides the chunk's rows. The by partial sums of a column
// are added in ty order.
template <int VEC, class Dout>
__global__ void rmsnorm_dw_partial_kernel(RmsnormBwdParams p) {
  __shared__ float sums[kPartialThreads * VEC];
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int c = (blockIdx.x * bx + tx) * VEC;
  const int g = blockIdx.y;
  const int r0 = g * p.rows_per_chunk, r1 = min(p.rows, r0 + p.rows_per_chunk);
  const Dout* dout = static_cast<const Dout*>(p.dout);
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; k++) acc[k] = 0.f;
  if (c < p.C) {
    for (int r = r0 + ty; r < r1; r += by) {
      float xv[VEC], dv[VEC];
      load_bf16<VEC>(xv, p.x + (int64_t)r * p.C + c);
      load_row<VEC>(dv, dout + (int64_t)r * p.C + c);
      const float rs = p.rstd[r];
#pragma unroll
      for (int k = 0; k < VEC; k++) acc[k] += dv[k] * (xv[k] * rs);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; k++) sums[(ty * bx + tx) * VEC + k] = acc[k];
  __syncthreads();
  if (ty != 0 || c >= p.C) return;
  for (int y = 1; y < by; y++) {
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += sums[(y * bx + tx) * VEC + k];
  }
  store_f32<VEC>(p.partial + (int64_t)g * p.C + c, acc);
}

// Block (kReduceCols, kReduceLanes): each lane sums every kReduceLanes-th chunk of its column, then
// lane sums are added in lane order and the total added to dw.
__global__ void rmsnorm_dw_reduce_kernel(RmsnormBwdParams p) {
  __shared__ float sums[kReduceLanes][kReduceCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kReduceCols + tx;
  float s = 0.f;
  if (c < p.C)
    for (int g = ty; g < p.chunks; g += kReduceLanes) s += p.partial[(int64_t)g * p.C + c];
  sums[ty][tx] = s;
  __syncthreads();
  if (ty != 0 || c >= p.C) return;
  for (int y = 1; y < kReduceLanes; y++) s += sums[y][tx];
  p.dw[c] += s;
}

int num_chunks(int rows) {
  return std::max(1, std::min(kMaxChunks, (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk));
}

// The row layout of C: LANES lanes per row and IT column steps per lane, or LANES = 0 when the row
// is wider than kWarp * VEC * kMaxIt (the wide kernels).
struct RowShape {
  int lanes, it;
};

RowShape row_shape(int C, int vec) {
  const int groups = (C + vec - 1) / vec;  // VEC-wide column groups
  if (groups <= 8) return {8, 1};
  if (groups <= 16) return {16, 1};
  for (int it = 1; it <= kMaxIt; it *= 2)
    if (groups <= detail::kWarp * it) return {detail::kWarp, it};
  return {0, 0};
}

// Blocks of the forward kernel for `rows` rows of a row shape (lanes > 0).
int forward_blocks(RowShape s, int rows) {
  const int rows_per_block = kRowsPerWarpBlock * (detail::kWarp / s.lanes);
  return (rows + rows_per_block - 1) / rows_per_block;
}

// The kernel for a row shape (lanes > 0): one switch per kernel template.
template <int VEC>
void launch_forward_rows(RowShape s, const RmsnormFwdParams& p, int blocks, cudaStream_t stream) {
  auto go = [&](auto kernel) { detail::launch_pdl(kernel, dim3(blocks), dim3(kRowThreads), 0, stream, p); };
  if (s.lanes == 8) return go(rmsnorm_forward_kernel<VEC, 8, 1>);
  if (s.lanes == 16) return go(rmsnorm_forward_kernel<VEC, 16, 1>);
  switch (s.it) {
    case 1: return go(rmsnorm_forward_kernel<VEC, 32, 1>);
    case 2: return go(rmsnorm_forward_kernel<VEC, 32, 2>);
    case 4: return go(rmsnorm_forward_kernel<VEC, 32, 4>);
    default: return go(rmsnorm_forward_kernel<VEC, 32, 8>);
  }
}

template <int IT, class Dout>
void launch_backward_rows_smem(const RmsnormBwdParams& p, cudaStream_t stream) {
  const size_t smem = p.dw ? sizeof(float) * kRowsPerWarpBlock * detail::kWarp * IT * 8 : 0;
  if (smem > 48 * 1024)  // the opt-in, per launch as the other kernels (it holds per device)
    TT_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_rows_kernel<IT, Dout>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  rmsnorm_backward_rows_kernel<IT, Dout><<<p.chunks, kRowThreads, smem, stream>>>(p);
}

template <int VEC, class Dout>
void launch_backward_rows(RowShape s, const RmsnormBwdParams& p, cudaStream_t stream) {
  const int blocks = p.chunks;
  if (s.lanes == 8) return rmsnorm_backward_fused_kernel<VEC, 8, 1, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
  if (s.lanes == 16) return rmsnorm_backward_fused_kernel<VEC, 16, 1, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
  if (s.it == 1) return rmsnorm_backward_fused_kernel<VEC, 32, 1, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
  if constexpr (VEC == 8) {  // rows of 2-8 steps per lane: the one-round-trip kernel
    switch (s.it) {
      case 2: return launch_backward_rows_smem<2, Dout>(p, stream);
      case 4: return launch_backward_rows_smem<4, Dout>(p, stream);
      default: return launch_backward_rows_smem<8, Dout>(p, stream);
    }
  } else {
    switch (s.it) {
      case 2: return rmsnorm_backward_fused_kernel<VEC, 32, 2, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
      case 4: return rmsnorm_backward_fused_kernel<VEC, 32, 4, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
      default: return rmsnorm_backward_fused_kernel<VEC, 32, 8, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
    }
  }
}

// The rotating kernels (rope_cs set): C = 8 LANES, LANES in {8, 16, 32}, VEC 8 and bf16 dout, as
// the entry points check (qk_norm_rope_supported, 16-byte alignment).
template <int VEC>
void launch_forward_rope(RowShape s, const RmsnormFwdParams& p, int blocks, cudaStream_t stream) {
  auto go = [&](auto kernel) { detail::launch_pdl(kernel, dim3(blocks), dim3(kRowThreads), 0, stream, p); };
  if constexpr (VEC == 8) {
    if (s.lanes == 8) return go(rmsnorm_forward_kernel<8, 8, 1, true>);
    if (s.lanes == 16) return go(rmsnorm_forward_kernel<8, 16, 1, true>);
    if (s.lanes == 32 && s.it == 1)
      return go(rmsnorm_forward_kernel<8, 32, 1, true>);
  }
  TT_CHECK(false, "cuda::rmsnorm: no rotating kernel for C=", p.C);
}

template <int VEC, class Dout>
void launch_backward_rope(RowShape s, const RmsnormBwdParams& p, cudaStream_t stream) {
  if constexpr (VEC == 8 && std::is_same_v<Dout, bf16>) {
    const int blocks = p.chunks;
    if (s.lanes == 8) return rmsnorm_backward_fused_kernel<8, 8, 1, Dout, true><<<blocks, kRowThreads, 0, stream>>>(p);
    if (s.lanes == 16)
      return rmsnorm_backward_fused_kernel<8, 16, 1, Dout, true><<<blocks, kRowThreads, 0, stream>>>(p);
    if (s.lanes == 32 && s.it == 1)
      return rmsnorm_backward_fused_kernel<8, 32, 1, Dout, true><<<blocks, kRowThreads, 0, stream>>>(p);
  }
  TT_CHECK(false, "cuda::rmsnorm: no rotating backward kernel for C=", p.C);
}

void launch_rmsnorm_forward(const RmsnormFwdParams& p, cudaStream_t stream) {
  const bool wide = p.C % 8 == 0 && detail::aligned16(p.x) && detail::aligned16(p.w) && detail::aligned16(p.out);
  TT_VEC_SWITCH(wide, VEC, [&] {
    const RowShape s = row_shape(p.C, VEC);
    if (s.lanes == 0) {
      const int blocks = (p.rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
      detail::launch_pdl(rmsnorm_forward_wide_kernel<VEC>, dim3(blocks), dim3(kRowThreads), 0, stream, p);
      return;
    }
    const int blocks = forward_blocks(s, p.rows);
    if (p.rope_cs) {
      launch_forward_rope<VEC>(s, p, blocks, stream);
    } else {
      launch_forward_rows<VEC>(s, p, blocks, stream);
    }
  });
  TT_CUDA_CHECK_LAUNCH();
}

template <class Dout>
void launch_rmsnorm_backward(const RmsnormBwdParams& p, cudaStream_t stream) {
  const bool wide = p.C % 8 == 0 && detail::aligned16(p.x) && detail::aligned16(p.w) &&
                    detail::aligned16(p.dout) && (!p.dx || detail::aligned16(p.dx));
  TT_VEC_SWITCH(wide, VEC, [&] {
    const RowShape s = row_shape(p.C, VEC);
    if (p.rope_cs) {
      launch_backward_rope<VEC, Dout>(s, p, stream);
      TT_CUDA_CHECK_LAUNCH();
    } else if (s.lanes > 0) {
      launch_backward_rows<VEC, Dout>(s, p, stream);
      TT_CUDA_CHECK_LAUNCH();
    } else {
      if (p.dx) {
        const int blocks = (p.rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
        rmsnorm_backward_dx_kernel<VEC, Dout><<<blocks, kRowThreads, 0, stream>>>(p);
        TT_CUDA_CHECK_LAUNCH();
      }
      if (p.dw) {
        const int groups = (p.C + VEC - 1) / VEC;
        int bx = 1;
        while (bx < groups && bx < kPartialThreads) bx *= 2;
        const dim3 block(bx, kPartialThreads / bx);
        const dim3 grid((groups + bx - 1) / bx, p.chunks);
        rmsnorm_dw_partial_kernel<VEC, Dout><<<grid, block, 0, stream>>>(p);
        TT_CUDA_CHECK_LAUNCH();
      }
    }
    if (p.dw) {
      rmsnorm_dw_reduce_kernel<<<(p.C + kReduceCols - 1) / kReduceCols, dim3(kReduceCols, kReduceLanes), 0,
                                 stream>>>(p);
      TT_CUDA_CHECK_LAUNCH();
    }
  });
}

template <class Dout>
void rmsnorm_backward_impl(bf16* dx, float* dw, const Dout* dout, const bf16* x, const bf16* w, const float* rstd,
                           int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx, double w_offset,
                           const float2* rope_cs = nullptr, int heads = 0) {
  TT_CHECK(rows >= 0 && C > 0, "cuda::rmsnorm_backward: expected rows >= 0 and C > 0, got rows=", rows,
           " C=", C);
  if (rows == 0 || (!dx && !dw)) return;
  TT_CHECK(dout && x && w && rstd, "cuda::rmsnorm_backward: null pointer (dout, x, w or rstd)");
  RmsnormBwdParams p{dx, dw, nullptr, dout, x, w, rstd, rows, C, 0, 0, accumulate_dx, rope_cs, heads, (float)w_offset};
  p.chunks = num_chunks(rows);  // the fused kernel's grid also when dw is not wanted
  p.rows_per_chunk = (rows + p.chunks - 1) / p.chunks;
  if (dw) {
    detail::check_workspace(ws, rmsnorm_backward_workspace_bytes(rows, C), "cuda::rmsnorm_backward");
    detail::WorkspaceCarver carve(ws.ptr);
    p.partial = carve.take<float>((size_t)p.chunks * C);
  }
  launch_rmsnorm_backward<Dout>(p, stream);
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int rows, int C, double eps,
                     cudaStream_t stream, double w_offset) {
  TT_CHECK(rows >= 0 && C > 0, "cuda::rmsnorm_forward: expected rows >= 0 and C > 0, got rows=", rows,
           " C=", C);
  TT_CHECK(eps >= 0, "cuda::rmsnorm_forward: expected eps >= 0, got ", eps);
  if (rows == 0) return;
  TT_CHECK(out && rstd && x && w, "cuda::rmsnorm_forward: null pointer (out, rstd, x or w)");
  launch_rmsnorm_forward(RmsnormFwdParams{out, rstd, x, w, rows, C, (float)eps, nullptr, 0, (float)w_offset}, stream);
}

size_t rmsnorm_backward_workspace_bytes(int rows, int C) {
  if (rows <= 0 || C <= 0) return 0;
  detail::WorkspaceCarver w;
  w.take<float>((size_t)num_chunks(rows) * C);
  return w.bytes();
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx, double w_offset) {
  rmsnorm_backward_impl(dx, dw, dout, x, w, rstd, rows, C, ws, stream, accumulate_dx, w_offset);
}

void rmsnorm_backward(bf16* dx, float* dw, const float* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream, bool accumulate_dx, double w_offset) {
  rmsnorm_backward_impl(dx, dw, dout, x, w, rstd, rows, C, ws, stream, accumulate_dx, w_offset);
}

// C = 8 LANES with LANES in {8, 16, 32}: the rows the rotation's lane pairing takes.
bool qk_norm_rope_supported(int HS) { return HS == 64 || HS == 128 || HS == 256; }

namespace {

void check_qk_rope(const char* op, int N, int H, int HS, const float2* rope_cs,
                   std::initializer_list<const void*> vectors) {
  TT_CHECK(N >= 0 && H > 0, op, ": expected N >= 0 and H > 0, got N=", N, " H=", H);
  TT_CHECK(qk_norm_rope_supported(HS), op, ": head dim ", HS,
           " not supported, expected 64, 128 or 256 (other head dims: rmsnorm and rope one after the other)");
  if (N == 0) return;
  TT_CHECK(rope_cs, op, ": null rope table");
  for (const void* v : vectors)
    TT_CHECK(v == nullptr || detail::aligned16(v), op, ": rows must be 16-byte aligned (allocator blocks are)");
}

}  // namespace

void qk_norm_rope_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, const float2* rope_cs, int N, int H,
                          int HS, double eps, cudaStream_t stream, double w_offset) {
  check_qk_rope("cuda::qk_norm_rope_forward", N, H, HS, rope_cs, {out, x, w});
  TT_CHECK(eps >= 0, "cuda::qk_norm_rope_forward: expected eps >= 0, got ", eps);
  if (N == 0) return;
  TT_CHECK(out && rstd && x && w, "cuda::qk_norm_rope_forward: null pointer (out, rstd, x or w)");
  launch_rmsnorm_forward(RmsnormFwdParams{out, rstd, x, w, N * H, HS, (float)eps, rope_cs, H, (float)w_offset},
                         stream);
}

void qk_norm_rope_pair(bf16* q, float* q_rstd, const bf16* q_pre, const bf16* q_w, int NH, bf16* k, float* k_rstd,
                       const bf16* k_pre, const bf16* k_w, int NKV, const float2* rope_cs, int N, int HS, double eps,
                       double w_offset, const bf16* v, bf16* store_k, bf16* store_v, const int32_t* store_rows,
                       cudaStream_t stream) {
  const char* op = "cuda::qk_norm_rope_pair";
  check_qk_rope(op, N, NH, HS, rope_cs, {q, q_pre, q_w, k, k_pre, k_w, v, store_k, store_v});
  TT_CHECK(NKV > 0 && eps >= 0, op, ": expected NKV > 0 and eps >= 0, got NKV=", NKV, " eps=", eps);
  if (N == 0) return;
  TT_CHECK(q && q_rstd && q_pre && q_w && k && k_rstd && k_pre && k_w, op, ": null pointer (q or k side)");
  TT_CHECK(!store_k || (v && store_v && store_rows), op, ": a cache store needs v, store_v and store_rows");
  RmsnormFwdParams p{q, q_rstd, q_pre, q_w, N * NH, HS, (float)eps, rope_cs, NH, (float)w_offset};
  const RowShape s = row_shape(HS, 8);
  p.blocks0 = forward_blocks(s, p.rows);
  p.out2 = k;
  p.rstd2 = k_rstd;
  p.x2 = k_pre;
  p.w2 = k_w;
  p.rows2 = N * NKV;
  p.heads2 = NKV;
  p.store = store_k;
  p.store_v = store_v;
  p.v = v;
  p.store_rows = store_rows;
  launch_forward_rope<8>(s, p, p.blocks0 + forward_blocks(s, p.rows2), stream);
  TT_CUDA_CHECK_LAUNCH();
}

void qk_norm_rope_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                           const float2* rope_cs, int N, int H, int HS, Workspace ws, cudaStream_t stream,
                           bool accumulate_dx, double w_offset) {
  check_qk_rope("cuda::qk_norm_rope_backward", N, H, HS, rope_cs, {dx, dout, x, w});
  rmsnorm_backward_impl(dx, dw, dout, x, w, rstd, N * H, HS, ws, stream, accumulate_dx, w_offset, rope_cs, H);
}

}  // namespace tt::cuda
