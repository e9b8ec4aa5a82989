// The vision tower's ops on the GPU (see vision.h).
//
// LayerNorm, with xhat = (x - mean) rstd and g = dout w:
//   out = xhat w + b;  dx = rstd (g - mean_c(g) - xhat mean_c(g xhat));
//   dw = sum_rows dout xhat;  db = sum_rows dout.
// Rows (forward and dx): one warp per row while the row fits in registers (C <= kWarp VEC kMaxIt,
// 2048 at VEC 8; lane l owns columns (it kWarp + l) VEC + k, it < IT), the statistics in two passes
// over the registers (the mean, then the squared deviations: no cancellation). Longer rows take a
// block per row with the same two passes re-reading the row (16 KB at C = 8192: it stays in L1).
// Column sums (dw, db, bias_backward), two fixed stages: stage 1, grid (column tiles, G row
// chunks), block (bx, by): thread (tx, ty) sums rows r0 + ty + j by of its VEC columns in order and
// the by sums of a column are added in ty order into partial[g]; stage 2 (block kReduceCols x
// kReduceLanes) adds a column's G partials, lane y every kReduceLanes-th chunk from y, then the
// lanes in order, into the gradient. G, the chunk rows and by depend on (rows, C) only, never on
// the vector width: a column's operations are the same in the same order whatever the buffers'
// alignment, so the sums are bitwise reproducible.
// dx runs after the column sums, in its own kernel: dw alone, db alone or dx alone are bitwise
// what the full call gives.
// Elementwise ops (GELU, bias_add): one VEC group per thread over the flat index, so rows x C of
// any shape (few rows of 150528 columns, 10^5 rows of 768) keep every thread busy. Row moves: one
// warp per row. patchify: one block per patch row.
#include "ops/cuda/vision.h"

#include <algorithm>
#include <climits>
#include <type_traits>

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

using detail::block_sum;
using detail::fill;
using detail::kWarp;
using detail::load_bf16;
using detail::load_bf16_or_zero;
using detail::load_f32;
using detail::load_row;
using detail::store_bf16;
using detail::store_f32;
using detail::store_row;
using detail::warp_sum;

constexpr int kThreads = 256;                      // elementwise blocks and warp-per-row blocks
constexpr int kWarpsPerBlock = kThreads / kWarp;   // rows per warp-per-row block
constexpr int kMaxIt = 8;                          // column steps per lane held in registers
constexpr int kRowBlockThreads = 256;              // block of a block-per-row kernel
constexpr int kPartialThreads = 256;               // stage-1 block (bx by)
constexpr int kMaxChunks = 1024;                   // G, the number of row chunks
constexpr int kMinRowsPerChunk = 32;
constexpr int kReduceCols = 32, kReduceLanes = 8;  // stage-2 block
static_assert(kRowBlockThreads % kWarp == 0 && kRowBlockThreads / kWarp <= kWarp,
              "block_sum takes whole warps, at most kWarp of them");

struct LayernormFwdParams {
  bf16* out;      // (rows, C)
  float* mean;    // (rows)
  float* rstd;    // (rows)
  const bf16* x;  // (rows, C)
  const bf16* w;  // (C)
  const bf16* b;  // (C), or null
  int rows, C;
  float eps;
};

struct LayernormDxParams {
  bf16* dx;           // (rows, C)
  const void* dout;   // (rows, C), bf16 or fp32 (the kernels' Dout)
  const bf16* x;      // (rows, C)
  const bf16* w;      // (C)
  const float* mean;  // (rows)
  const float* rstd;  // (rows)
  int rows, C;
  bool accumulate;    // dx += (true) or dx = (false: dx is not read)
};

// The two-stage column sums of dout (db, bias_backward) and of dout xhat (dw).
struct ColumnSumParams {
  float* dw;           // (C) +=, or null
  float* db;           // (C) +=, or null
  float* partial_w;    // (G, C) stage-1 sums of dout xhat, null when dw is
  float* partial_b;    // (G, C) stage-1 sums of dout, null when db is
  const void* dout;    // (rows, C), bf16 or fp32 (the kernels' Dout)
  const bf16* x;       // (rows, C), null when dw is
  const float* mean;   // (rows), null when dw is
  const float* rstd;   // (rows), null when dw is
  int rows, C;
  int chunks, rows_per_chunk;  // G and the rows of each chunk
};

struct GeluFwdParams {
  bf16* y;        // (n)
  const bf16* x;  // (n)
  int64_t n;
  bool tanh;
};

struct GeluBwdParams : GeluFwdParams {
  bf16* dx;        // (n)
  const bf16* dy;  // (n)
  bool accumulate;
};

template <class T>
struct BiasAddParams {
  T* out;         // (rows, C) as n = rows C elements
  const bf16* b;  // (C)
  int64_t n;
  int C;
};

struct RowMoveParams {
  bf16* dst;                // rows of C
  const bf16* src;          // rows of C
  const int32_t* dst_rows;  // (n): copy_rows' destinations, zero_rows' rows
  const int32_t* src_rows;  // copy_rows (n), sum_rows (offsets[n])
  const int32_t* offsets;   // sum_rows (n + 1)
  int n, C;
};

struct PatchifyParams {
  bf16* out;            // (rows, 3 patch patch)
  const float* pixels;  // (F, 3, S, S)
  int S, patch, grid;   // grid = S / patch patches per side
};

// ---- LayerNorm forward ----

// One warp per row, the row in registers (IT VEC-wide steps per lane).
template <int VEC, int IT>
__global__ void layernorm_forward_warp_kernel(LayernormFwdParams p) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= p.rows) return;  // warp-uniform: the shuffles below see whole warps
  const bf16* x = p.x + row * p.C;
  float v[IT][VEC];
  float s = 0.f;
#pragma unroll
  for (int it = 0; it < IT; it++) {
    const int c = (it * kWarp + lane) * VEC;
    if (c < p.C) {
      load_bf16<VEC>(v[it], x + c);
    } else {
      fill<VEC>(v[it], 0.f);
    }
#pragma unroll
    for (int k = 0; k < VEC; k++) s += v[it][k];
  }
  const float mu = warp_sum(s) / (float)p.C;
  float q = 0.f;
#pragma unroll
  for (int it = 0; it < IT; it++) {
    if ((it * kWarp + lane) * VEC >= p.C) continue;
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float d = v[it][k] - mu;
      q += d * d;
    }
  }
  const float rs = rsqrtf(warp_sum(q) / (float)p.C + p.eps);
  bf16* o = p.out + row * p.C;
#pragma unroll
  for (int it = 0; it < IT; it++) {
    const int c = (it * kWarp + lane) * VEC;
    if (c >= p.C) continue;
    float wv[VEC], bv[VEC];
    load_bf16<VEC>(wv, p.w + c);
    load_bf16_or_zero<VEC>(bv, p.b ? p.b + c : nullptr, p.b != nullptr);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[it][k] = (v[it][k] - mu) * rs * wv[k] + bv[k];
    store_bf16<VEC>(o + c, v[it]);
  }
  if (lane == 0) {
    p.mean[row] = mu;
    p.rstd[row] = rs;
  }
}

// One block per row (rows longer than kWarp VEC kMaxIt), the row re-read for each pass.
template <int VEC>
__global__ void layernorm_forward_block_kernel(LayernormFwdParams p) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const bf16* x = p.x + row * p.C;
  float s = 0.f;
  for (int c = threadIdx.x * VEC; c < p.C; c += kRowBlockThreads * VEC) {
    float v[VEC];
    load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) s += v[k];
  }
  const float mu = block_sum(s, scratch) / (float)p.C;
  float q = 0.f;
  for (int c = threadIdx.x * VEC; c < p.C; c += kRowBlockThreads * VEC) {
    float v[VEC];
    load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float d = v[k] - mu;
      q += d * d;
    }
  }
  const float rs = rsqrtf(block_sum(q, scratch) / (float)p.C + p.eps);
  bf16* o = p.out + row * p.C;
  for (int c = threadIdx.x * VEC; c < p.C; c += kRowBlockThreads * VEC) {
    float v[VEC], wv[VEC], bv[VEC];
    load_bf16<VEC>(v, x + c);
    load_bf16<VEC>(wv, p.w + c);
    load_bf16_or_zero<VEC>(bv, p.b ? p.b + c : nullptr, p.b != nullptr);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = (v[k] - mu) * rs * wv[k] + bv[k];
    store_bf16<VEC>(o + c, v);
  }
  if (threadIdx.x == 0) {
    p.mean[row] = mu;
    p.rstd[row] = rs;
  }
}

// ---- LayerNorm dx ----

template <int VEC, int IT, class Dout>
__global__ void layernorm_dx_warp_kernel(LayernormDxParams p) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= p.rows) return;  // warp-uniform
  const int64_t off = row * p.C;
  const Dout* dout = static_cast<const Dout*>(p.dout) + off;
  const float mu = p.mean[row], rs = p.rstd[row];
  float xh[IT][VEC], g[IT][VEC];
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int it = 0; it < IT; it++) {
    const int c = (it * kWarp + lane) * VEC;
    if (c < p.C) {
      float dv[VEC], wv[VEC];
      load_bf16<VEC>(xh[it], p.x + off + c);
      load_row<VEC>(dv, dout + c);
      load_bf16<VEC>(wv, p.w + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        xh[it][k] = (xh[it][k] - mu) * rs;
        g[it][k] = dv[k] * wv[k];
        sg += g[it][k];
        sgx += g[it][k] * xh[it][k];
      }
    } else {
      fill<VEC>(xh[it], 0.f);
      fill<VEC>(g[it], 0.f);
    }
  }
  const float mg = warp_sum(sg) / (float)p.C, mgx = warp_sum(sgx) / (float)p.C;
  bf16* dx = p.dx + off;
#pragma unroll
  for (int it = 0; it < IT; it++) {
    const int c = (it * kWarp + lane) * VEC;
    if (c >= p.C) continue;
    float acc[VEC];
    load_bf16_or_zero<VEC>(acc, dx + c, p.accumulate);
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += rs * (g[it][k] - mg - xh[it][k] * mgx);
    store_bf16<VEC>(dx + c, acc);
  }
}

template <int VEC, class Dout>
__global__ void layernorm_dx_block_kernel(LayernormDxParams p) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x, off = row * p.C;
  const Dout* dout = static_cast<const Dout*>(p.dout) + off;
  const bf16* x = p.x + off;
  const float mu = p.mean[row], rs = p.rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (int c = threadIdx.x * VEC; c < p.C; c += kRowBlockThreads * VEC) {
    float xv[VEC], dv[VEC], wv[VEC];
    load_bf16<VEC>(xv, x + c);
    load_row<VEC>(dv, dout + c);
    load_bf16<VEC>(wv, p.w + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float g = dv[k] * wv[k];
      sg += g;
      sgx += g * ((xv[k] - mu) * rs);
    }
  }
  const float mg = block_sum(sg, scratch) / (float)p.C;
  const float mgx = block_sum(sgx, scratch) / (float)p.C;
  bf16* dx = p.dx + off;
  for (int c = threadIdx.x * VEC; c < p.C; c += kRowBlockThreads * VEC) {
    float xv[VEC], dv[VEC], wv[VEC], acc[VEC];
    load_bf16<VEC>(xv, x + c);
    load_row<VEC>(dv, dout + c);
    load_bf16<VEC>(wv, p.w + c);
    load_bf16_or_zero<VEC>(acc, dx + c, p.accumulate);
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += rs * (dv[k] * wv[k] - mg - (xv[k] - mu) * rs * mgx);
    store_bf16<VEC>(dx + c, acc);
  }
}

// ---- column sums ----

// Stage 1. Grid (column tiles, G), block (bx, by).
template <int VEC, class Dout>
__global__ void column_partials_kernel(ColumnSumParams p) {
  __shared__ float sums_w[kPartialThreads * VEC], sums_b[kPartialThreads * VEC];
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t c = ((int64_t)blockIdx.x * bx + tx) * VEC;
  const int g = blockIdx.y;
  const int r0 = g * p.rows_per_chunk, r1 = min(p.rows, r0 + p.rows_per_chunk);
  const Dout* dout = static_cast<const Dout*>(p.dout);
  const bool want_w = p.partial_w != nullptr;
  float aw[VEC], ab[VEC];
  fill<VEC>(aw, 0.f);
  fill<VEC>(ab, 0.f);
  if (c < p.C) {
    for (int r = r0 + ty; r < r1; r += by) {
      const int64_t off = (int64_t)r * p.C + c;
      float dv[VEC];
      load_row<VEC>(dv, dout + off);
#pragma unroll
      for (int k = 0; k < VEC; k++) ab[k] += dv[k];
      if (want_w) {
        float xv[VEC];
        load_bf16<VEC>(xv, p.x + off);
        const float mu = p.mean[r], rs = p.rstd[r];
#pragma unroll
        for (int k = 0; k < VEC; k++) aw[k] += dv[k] * ((xv[k] - mu) * rs);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    sums_w[(ty * bx + tx) * VEC + k] = aw[k];
    sums_b[(ty * bx + tx) * VEC + k] = ab[k];
  }
  __syncthreads();
  if (ty != 0 || c >= p.C) return;
  for (int y = 1; y < by; y++) {
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      aw[k] += sums_w[(y * bx + tx) * VEC + k];
      ab[k] += sums_b[(y * bx + tx) * VEC + k];
    }
  }
  if (want_w) store_f32<VEC>(p.partial_w + (int64_t)g * p.C + c, aw);
  if (p.partial_b) store_f32<VEC>(p.partial_b + (int64_t)g * p.C + c, ab);
}

// Stage 2. Grid (column tiles, 2): blockIdx.y 0 reduces into dw, 1 into db.
__global__ void column_reduce_kernel(ColumnSumParams p) {
  __shared__ float sums[kReduceLanes][kReduceCols + 1];
  const float* partial = blockIdx.y == 0 ? p.partial_w : p.partial_b;
  float* grad = blockIdx.y == 0 ? p.dw : p.db;
  if (!grad) return;  // block-uniform, before the barrier
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = (int64_t)blockIdx.x * kReduceCols + tx;
  float s = 0.f;
  if (c < p.C)
    for (int g = ty; g < p.chunks; g += kReduceLanes) s += partial[(int64_t)g * p.C + c];
  sums[ty][tx] = s;
  __syncthreads();
  if (ty != 0 || c >= p.C) return;
  for (int y = 1; y < kReduceLanes; y++) s += sums[y][tx];
  grad[c] += s;
}

// ---- GELU ----

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// tanh form: x (1 + tanh u) / 2 = x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3), with the
// sigmoid s and 1 - s each from one __expf of a non-positive argument (no cancellation, no
// overflow; under --use_fast_math tanhf would be the hardware approximation, 2^-11 relative).
// Exact form: x erfc(-x / sqrt 2) / 2 (no cancellation for negative x).
__device__ __forceinline__ void sigmoid_pair(float z, float& s, float& one_minus_s) {
  const float e = __expf(-fabsf(z));  // <= 1
  const float big = 1.f / (1.f + e), small = e / (1.f + e);
  s = z >= 0.f ? big : small;
  one_minus_s = z >= 0.f ? small : big;
}

__device__ __forceinline__ float gelu(float x, bool tanh_form) {
  if (tanh_form) {
    float s, oms;
    sigmoid_pair(2.f * kSqrt2OverPi * (x + kGeluA * x * x * x), s, oms);
    return x * s;
  }
  return 0.5f * x * erfcf(-x * kInvSqrt2);
}

// d/dx: tanh form s + x s (1 - s) 2 u'; exact form Phi(x) + x phi(x).
__device__ __forceinline__ float gelu_grad(float x, bool tanh_form) {
  if (tanh_form) {
    float s, oms;
    sigmoid_pair(2.f * kSqrt2OverPi * (x + kGeluA * x * x * x), s, oms);
    return s + x * s * oms * 2.f * kSqrt2OverPi * (1.f + 3.f * kGeluA * x * x);
  }
  return 0.5f * erfcf(-x * kInvSqrt2) + x * kInvSqrt2Pi * __expf(-0.5f * x * x);
}

template <int VEC>
__global__ void gelu_forward_kernel(GeluFwdParams p) {
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= p.n) return;
  float v[VEC];
  load_bf16<VEC>(v, p.x + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) v[k] = gelu(v[k], p.tanh);
  store_bf16<VEC>(p.y + i, v);
}

template <int VEC>
__global__ void gelu_backward_kernel(GeluBwdParams p) {
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= p.n) return;
  float v[VEC], d[VEC], acc[VEC];
  load_bf16<VEC>(v, p.x + i);
  load_bf16<VEC>(d, p.dy + i);
  load_bf16_or_zero<VEC>(acc, p.dx + i, p.accumulate);
#pragma unroll
  for (int k = 0; k < VEC; k++) acc[k] += gelu_grad(v[k], p.tanh) * d[k];
  store_bf16<VEC>(p.dx + i, acc);
}

// ---- biases ----

// The column of flat index i: a 32-bit remainder when the index fits (the common case).
__device__ __forceinline__ int column_of(int64_t i, int64_t n, int C) {
  return n <= (int64_t)UINT_MAX ? (int)((uint32_t)i % (uint32_t)C) : (int)(i % C);
}

// VEC 8 needs C % 8 == 0: a group then lies in one row.
template <int VEC, class T>
__global__ void bias_add_kernel(BiasAddParams<T> p) {
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= p.n) return;
  float o[VEC], bv[VEC];
  load_row<VEC>(o, p.out + i);
  load_bf16<VEC>(bv, p.b + column_of(i, p.n, p.C));
#pragma unroll
  for (int k = 0; k < VEC; k++) o[k] += bv[k];
  store_row<VEC>(p.out + i, o);
}

// ---- row moves: one warp per row, lanes over its VEC-wide column groups ----

template <int VEC>
__device__ __forceinline__ void copy_group(bf16* d, const bf16* s) {
  if constexpr (VEC == 8) {
    *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(s);
  } else {
    *d = *s;
  }
}

template <int VEC>
__global__ void copy_rows_kernel(RowMoveParams p) {
  const int64_t i = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (i >= p.n) return;
  bf16* d = p.dst + (int64_t)p.dst_rows[i] * p.C;
  const bf16* s = p.src + (int64_t)p.src_rows[i] * p.C;
  for (int c = threadIdx.x % kWarp * VEC; c < p.C; c += kWarp * VEC) copy_group<VEC>(d + c, s + c);
}

template <int VEC>
__global__ void zero_rows_kernel(RowMoveParams p) {
  const int64_t i = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (i >= p.n) return;
  bf16* d = p.dst + (int64_t)p.dst_rows[i] * p.C;
  float z[VEC];
  fill<VEC>(z, 0.f);
  for (int c = threadIdx.x % kWarp * VEC; c < p.C; c += kWarp * VEC) store_bf16<VEC>(d + c, z);
}

template <int VEC>
__global__ void sum_rows_kernel(RowMoveParams p) {
  const int64_t d = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (d >= p.n) return;
  const int k0 = p.offsets[d], k1 = p.offsets[d + 1];
  bf16* o = p.dst + d * p.C;
  for (int c = threadIdx.x % kWarp * VEC; c < p.C; c += kWarp * VEC) {
    float acc[VEC];
    fill<VEC>(acc, 0.f);
    for (int k = k0; k < k1; k++) {
      float v[VEC];
      load_bf16<VEC>(v, p.src + (int64_t)p.src_rows[k] * p.C + c);
#pragma unroll
      for (int j = 0; j < VEC; j++) acc[j] += v[j];
    }
    store_bf16<VEC>(o + c, acc);
  }
}

// ---- patchify: grid (F grid^2 patch rows), threads over the row's (channel, dy, dx) ----

__global__ void patchify_kernel(PatchifyParams p) {
  const int64_t row = blockIdx.x;
  const int pp = p.patch * p.patch, K = 3 * pp, per_frame = p.grid * p.grid;
  const int64_t f = row / per_frame;
  const int in_frame = (int)(row % per_frame), py = in_frame / p.grid, px = in_frame % p.grid;
  const float* frame = p.pixels + f * 3 * (int64_t)p.S * p.S;
  bf16* o = p.out + row * K;
  for (int e = threadIdx.x; e < K; e += blockDim.x) {
    const int ch = e / pp, dy = e % pp / p.patch, dx = e % p.patch;
    o[e] = __float2bfloat16_rn(frame[((int64_t)ch * p.S + py * p.patch + dy) * p.S + px * p.patch + dx]);
  }
}

// ---- launchers ----

using detail::aligned16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Column steps per lane of a row held in registers by one warp, or 0 for a row longer than
// kWarp VEC kMaxIt (a block per row). VEC 8 takes every step count (C = 768: 3, 1152: 5); VEC 1
// (odd or unaligned rows) powers of two.
int row_steps(int C, int vec) {
  const int64_t steps = ceil_div(ceil_div(C, vec), kWarp);
  if (steps > kMaxIt) return 0;
  if (vec == 8) return (int)steps;
  int it = 1;
  while (it < steps) it *= 2;
  return it;
}

// The one switch from a step count (as row_steps gives it) to the template parameter IT:
// f(std::integral_constant<int, IT>).
template <int VEC, class F>
void steps_switch(int it, F&& f) {
  using std::integral_constant;
  if constexpr (VEC == 8) {
    switch (it) {
      case 3: return f(integral_constant<int, 3>{});
      case 5: return f(integral_constant<int, 5>{});
      case 6: return f(integral_constant<int, 6>{});
      case 7: return f(integral_constant<int, 7>{});
      default: break;
    }
  }
  switch (it) {
    case 1: return f(integral_constant<int, 1>{});
    case 2: return f(integral_constant<int, 2>{});
    case 4: return f(integral_constant<int, 4>{});
    default: return f(integral_constant<int, kMaxIt>{});
  }
}

unsigned warp_row_blocks(int rows) { return (unsigned)ceil_div(rows, kWarpsPerBlock); }

void launch_layernorm_forward(const LayernormFwdParams& p, cudaStream_t stream) {
  const bool vec8 = p.C % 8 == 0 && aligned16(p.out) && aligned16(p.x) && aligned16(p.w) && (!p.b || aligned16(p.b));
  TT_VEC_SWITCH(vec8, VEC, [&] {
    const int it = row_steps(p.C, VEC);
    if (it == 0) {
      layernorm_forward_block_kernel<VEC><<<(unsigned)p.rows, kRowBlockThreads, 0, stream>>>(p);
      return;
    }
    steps_switch<VEC>(it, [&](auto steps) {
      layernorm_forward_warp_kernel<VEC, decltype(steps)::value><<<warp_row_blocks(p.rows), kThreads, 0, stream>>>(p);
    });
  });
  TT_CUDA_CHECK_LAUNCH();
}

template <class Dout>
void launch_layernorm_dx(const LayernormDxParams& p, cudaStream_t stream) {
  const bool vec8 = p.C % 8 == 0 && aligned16(p.dx) && aligned16(p.dout) && aligned16(p.x) && aligned16(p.w);
  TT_VEC_SWITCH(vec8, VEC, [&] {
    const int it = row_steps(p.C, VEC);
    if (it == 0) {
      layernorm_dx_block_kernel<VEC, Dout><<<(unsigned)p.rows, kRowBlockThreads, 0, stream>>>(p);
      return;
    }
    steps_switch<VEC>(it, [&](auto steps) {
      layernorm_dx_warp_kernel<VEC, decltype(steps)::value, Dout><<<warp_row_blocks(p.rows), kThreads, 0, stream>>>(p);
    });
  });
  TT_CUDA_CHECK_LAUNCH();
}

int num_chunks(int rows) {
  return (int)std::max<int64_t>(1, std::min<int64_t>(kMaxChunks, ceil_div(rows, kMinRowsPerChunk)));
}

// The row stride by of a stage-1 block, from C alone (as if VEC were 8: bx the power of two that
// covers C / 8 column groups, up to the block), so a column's order of additions is the same at
// either vector width.
int partial_by(int C) {
  const int64_t groups8 = ceil_div(C, 8);
  int bx = 1;
  while (bx < groups8 && bx < kPartialThreads) bx *= 2;
  return kPartialThreads / bx;
}

// The stage-1 partials' layout (both arrays always, so the byte count is one formula).
struct PartialLayout {
  float* w;
  float* b;
};

PartialLayout carve_partials(void* base, int rows, int C) {
  detail::WorkspaceCarver carve(base);
  const size_t n = (size_t)num_chunks(rows) * C;
  PartialLayout l;
  l.w = carve.take<float>(n);
  l.b = carve.take<float>(n);
  return l;
}

size_t partials_bytes(int rows, int C, int arrays) {
  if (rows <= 0 || C <= 0) return 0;
  detail::WorkspaceCarver w;
  for (int i = 0; i < arrays; i++) w.take<float>((size_t)num_chunks(rows) * C);
  return w.bytes();
}

template <class Dout>
void launch_column_sums(const ColumnSumParams& p, cudaStream_t stream) {
  const bool vec8 = p.C % 8 == 0 && aligned16(p.dout) && (!p.x || aligned16(p.x));
  const int by = partial_by(p.C), bx = kPartialThreads / by;
  TT_VEC_SWITCH(vec8, VEC, [&] {
    const dim3 grid((unsigned)ceil_div(ceil_div(p.C, VEC), bx), (unsigned)p.chunks);
    column_partials_kernel<VEC, Dout><<<grid, dim3(bx, by), 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
  column_reduce_kernel<<<dim3((unsigned)ceil_div(p.C, kReduceCols), 2), dim3(kReduceCols, kReduceLanes), 0,
                         stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();
}

ColumnSumParams column_sum_params(int rows, int C) {
  ColumnSumParams p{};
  p.rows = rows;
  p.C = C;
  p.chunks = num_chunks(rows);
  p.rows_per_chunk = (int)ceil_div(rows, p.chunks);
  return p;
}

template <class Dout>
void layernorm_backward_impl(bf16* dx, float* dw, float* db, const Dout* dout, const bf16* x, const bf16* w,
                             const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                             cudaStream_t stream) {
  TT_CHECK(rows >= 0 && C > 0, "cuda::layernorm_backward: expected rows >= 0 and C > 0, got rows=", rows, " C=", C);
  if (rows == 0 || (!dx && !dw && !db)) return;
  TT_CHECK(dout && x && w && mean && rstd, "cuda::layernorm_backward: null pointer (dout, x, w, mean or rstd)");
  if (dw || db) {
    detail::check_workspace(ws, layernorm_backward_workspace_bytes(rows, C), "cuda::layernorm_backward");
    const PartialLayout l = carve_partials(ws.ptr, rows, C);
    ColumnSumParams p = column_sum_params(rows, C);
    p.dw = dw;
    p.db = db;
    p.partial_w = dw ? l.w : nullptr;
    p.partial_b = db ? l.b : nullptr;
    p.dout = dout;
    if (dw) {
      p.x = x;
      p.mean = mean;
      p.rstd = rstd;
    }
    launch_column_sums<Dout>(p, stream);
  }
  if (dx) launch_layernorm_dx<Dout>(LayernormDxParams{dx, dout, x, w, mean, rstd, rows, C, accumulate_dx}, stream);
}

void check_rows(const char* op, int rows, int C) {
  TT_CHECK(rows >= 0 && C >= 0, op, ": expected rows >= 0 and C >= 0, got rows=", rows, " C=", C);
}

// n elements at one per thread (VEC 1) must fit the grid.
void check_elements(const char* op, int64_t n) {
  TT_CHECK(n >= 0, op, ": expected n >= 0, got ", n);
  TT_CHECK(n / kThreads < (int64_t)INT_MAX, op, ": n=", n, " exceeds the grid limit");
}

template <class T>
void bias_add_impl(T* out, const bf16* b, int rows, int C, cudaStream_t stream) {
  check_rows("cuda::bias_add", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(out && b, "cuda::bias_add: null pointer (out or b)");
  const BiasAddParams<T> p{out, b, (int64_t)rows * C, C};
  check_elements("cuda::bias_add", p.n);
  const bool vec8 = C % 8 == 0 && aligned16(out) && aligned16(b);
  TT_VEC_SWITCH(vec8, VEC, [&] {
    bias_add_kernel<VEC, T><<<(unsigned)ceil_div(p.n, (int64_t)kThreads * VEC), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w, const bf16* b, int rows,
                       int C, double eps, cudaStream_t stream) {
  TT_CHECK(rows >= 0 && C > 0, "cuda::layernorm_forward: expected rows >= 0 and C > 0, got rows=", rows, " C=", C);
  TT_CHECK(eps >= 0, "cuda::layernorm_forward: expected eps >= 0, got ", eps);
  if (rows == 0) return;
  TT_CHECK(out && mean && rstd && x && w, "cuda::layernorm_forward: null pointer (out, mean, rstd, x or w)");
  launch_layernorm_forward(LayernormFwdParams{out, mean, rstd, x, w, b, rows, C, (float)eps}, stream);
}

size_t layernorm_backward_workspace_bytes(int rows, int C) { return partials_bytes(rows, C, 2); }

void layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x, const bf16* w,
                        const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                        cudaStream_t stream) {
  layernorm_backward_impl(dx, dw, db, dout, x, w, mean, rstd, rows, C, accumulate_dx, ws, stream);
}

void layernorm_backward(bf16* dx, float* dw, float* db, const float* dout, const bf16* x, const bf16* w,
                        const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                        cudaStream_t stream) {
  layernorm_backward_impl(dx, dw, db, dout, x, w, mean, rstd, rows, C, accumulate_dx, ws, stream);
}

void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh, cudaStream_t stream) {
  check_elements("cuda::gelu_forward", n);
  if (n == 0) return;
  TT_CHECK(y && x, "cuda::gelu_forward: null pointer (y or x)");
  const GeluFwdParams p{y, x, n, tanh};
  const bool vec8 = n % 8 == 0 && aligned16(y) && aligned16(x);
  TT_VEC_SWITCH(vec8, VEC, [&] {
    gelu_forward_kernel<VEC><<<(unsigned)ceil_div(n, (int64_t)kThreads * VEC), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh, bool accumulate,
                   cudaStream_t stream) {
  check_elements("cuda::gelu_backward", n);
  if (n == 0) return;
  TT_CHECK(dx && dy && x, "cuda::gelu_backward: null pointer (dx, dy or x)");
  GeluBwdParams p;
  static_cast<GeluFwdParams&>(p) = GeluFwdParams{nullptr, x, n, tanh};
  p.dx = dx;
  p.dy = dy;
  p.accumulate = accumulate;
  const bool vec8 = n % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x);
  TT_VEC_SWITCH(vec8, VEC, [&] {
    gelu_backward_kernel<VEC><<<(unsigned)ceil_div(n, (int64_t)kThreads * VEC), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void bias_add(bf16* out, const bf16* b, int rows, int C, cudaStream_t stream) {
  bias_add_impl(out, b, rows, C, stream);
}

void bias_add(float* out, const bf16* b, int rows, int C, cudaStream_t stream) {
  bias_add_impl(out, b, rows, C, stream);
}

size_t bias_backward_workspace_bytes(int rows, int C) { return partials_bytes(rows, C, 1); }

void bias_backward(float* db, const bf16* dout, int rows, int C, Workspace ws, cudaStream_t stream) {
  check_rows("cuda::bias_backward", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(db && dout, "cuda::bias_backward: null pointer (db or dout)");
  detail::check_workspace(ws, bias_backward_workspace_bytes(rows, C), "cuda::bias_backward");
  ColumnSumParams p = column_sum_params(rows, C);
  p.db = db;
  p.partial_b = carve_partials(ws.ptr, rows, C).w;  // the first array: the only one this workspace holds
  p.dout = dout;
  launch_column_sums<bf16>(p, stream);
}

void copy_rows(bf16* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int n, int C,
               cudaStream_t stream) {
  check_rows("cuda::copy_rows", n, C);
  if (n == 0 || C == 0) return;
  TT_CHECK(dst && dst_rows && src && src_rows, "cuda::copy_rows: null pointer (dst, dst_rows, src or src_rows)");
  const RowMoveParams p{dst, src, dst_rows, src_rows, nullptr, n, C};
  TT_VEC_SWITCH(C % 8 == 0 && aligned16(dst) && aligned16(src), VEC, [&] {
    copy_rows_kernel<VEC><<<warp_row_blocks(n), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void sum_rows(bf16* dst, const bf16* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C,
              cudaStream_t stream) {
  check_rows("cuda::sum_rows", n_dst, C);
  if (n_dst == 0 || C == 0) return;
  TT_CHECK(dst && offsets, "cuda::sum_rows: null pointer (dst or offsets)");
  const RowMoveParams p{dst, src, nullptr, src_rows, offsets, n_dst, C};
  // src may be null when every range is empty; it is then never read, at either width.
  TT_VEC_SWITCH(C % 8 == 0 && aligned16(dst) && aligned16(src), VEC, [&] {
    sum_rows_kernel<VEC><<<warp_row_blocks(n_dst), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void zero_rows(bf16* dst, const int32_t* rows, int n, int C, cudaStream_t stream) {
  check_rows("cuda::zero_rows", n, C);
  if (n == 0 || C == 0) return;
  TT_CHECK(dst && rows, "cuda::zero_rows: null pointer (dst or rows)");
  const RowMoveParams p{dst, nullptr, rows, nullptr, nullptr, n, C};
  TT_VEC_SWITCH(C % 8 == 0 && aligned16(dst), VEC, [&] {
    zero_rows_kernel<VEC><<<warp_row_blocks(n), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void patchify(bf16* out, const float* pixels, int F, int S, int patch, cudaStream_t stream) {
  TT_CHECK(F >= 0 && S > 0 && patch > 0, "cuda::patchify: expected F >= 0, S > 0 and patch > 0, got F=", F,
           " S=", S, " patch=", patch);
  TT_CHECK(S % patch == 0, "cuda::patchify: a ", S, " x ", S, " image does not split into ", patch, " x ", patch,
           " patches");
  const int64_t grid = S / patch, rows = (int64_t)F * grid * grid, K = (int64_t)3 * patch * patch;
  TT_CHECK(rows <= INT_MAX && K <= INT_MAX, "cuda::patchify: ", rows, " patches of ", K,
           " elements exceed the grid limit");
  if (F == 0) return;
  TT_CHECK(out && pixels, "cuda::patchify: null pointer (out or pixels)");
  const int threads = (int)std::min<int64_t>(kThreads, ceil_div(K, kWarp) * kWarp);
  patchify_kernel<<<(unsigned)rows, threads, 0, stream>>>(PatchifyParams{out, pixels, S, patch, (int)grid});
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
