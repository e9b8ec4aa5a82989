// The gated delta rule's kernels, chunked (ops/cuda/gdn.h gdn_forward / gdn_backward), and the
// sequences that launch them. Written against the primitives of attention_device.cuh,
// attention_sm90_device.cuh (mbarriers, TMA), mma_sm80.cuh (ldmatrix, mma.sync) and
// kernel_util.cuh, which the includer brings in first: gdn.cu for the GPU, and
// tests/ops_cuda/gdn_emulated_test.cc for the CPU, where tests/ops_cuda_attention's warp and
// wgmma emulators and mma_emulator.h provide the same names.
//
// The sequences (rule_forward, rule_backward) take a Runner, how a kernel runs:
//   run.launch(kernel, grid, block, smem_bytes, args...)
//                                                  kernel(args...) on grid x block threads (1-D)
//                                                  with smem_bytes of dynamic shared memory, in
//                                                  order after the previous launch
//   run.zero(p, bytes)                             bytes at p set to zero, in the same order
//   run.map(base, rows, heads, cols, box_cols, box_rows)
//                                                  the TMA map of a (rows, heads, cols) fp32 or
//                                                  bf16 tensor, boxes of box_cols x 1 x box_rows,
//                                                  128-byte swizzle (rows past the end read zero)
// gdn.cu's CudaRunner launches on a stream; the emulation test's runs the kernels on the CPU.
// Everything here has internal linkage: each program has its own copy, compiled for the GPU or
// for the emulator, and none clashes with the other's.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "base/check.h"
#include "ops/cuda/gdn.h"
#include "ops/cuda/wgmma_desc.cuh"
#include "ops/cuda/workspace.h"

namespace tt::cuda {
namespace {

constexpr int kRuleThreads = 256;  // every rule_* kernel's block

using detail::ld;

// ---- The gated delta rule, chunked ----
//
// Shared-memory tiles of a chunk: bf16 rows of q, k or v at a stride of kRowStride elements (272
// bytes: eight consecutive rows read at one column land in distinct banks), fp32 64 x 64 matrices
// at a stride of kPairStride (16-byte aligned rows). Loads are cp.async copies issued at once
// (rows past the chunk's end zero-filled), so a block waits for its loads once, not once per row;
// the walks' stages at dk 128 come by TMA instead, with the tensors' next rows past a chunk's end
// (WalkTmaStage).

constexpr int kRowStride = 136;
constexpr int kPairStride = kGdnChunk + 4;

// A per-chunk kernel's block (parts = 1 where a block takes the whole chunk and value head), or
// one of `parts` blocks a chunk and value head (column or row blocks): block
// x = c parts + z, y = h, so the parts of one chunk and head run side by side and all but the
// first read the chunk's shared rows (q, k, dO, v_new, ...) from L2. With the parts on grid z, a
// chunk's two parts ran chunks x heads blocks apart and read them from DRAM twice.
struct ChunkPart {
  int c, h, z;
};
__device__ __forceinline__ ChunkPart chunk_part(int parts) {
  return {(int)blockIdx.x / parts, (int)blockIdx.y, (int)blockIdx.x % parts};
}
inline dim3 chunk_parts_grid(int chunks, int nv, int parts) { return dim3((unsigned)(chunks * parts), (unsigned)nv); }

struct RuleParams {
  GdnPlan::Device plan;
  const bf16 *q, *k, *v, *beta;
  const float* g;  // (N, nv) fp32 log decays
  const float* init;
  float *U, *W, *gam, *vnew, *sin, *node_end;  // W: as w_as_halves says; vnew and sin: fp32, or bf16
                                               // (p_bf16) in the bf16 kernels (bf16_kernels)
  float* T;  // (chunks, nv, 64, 64) T = (I + A)^-1 per chunk, for the backward (rule_bwd_grad_kernel); or null
             // (fp32, or bf16 (p_bf16) with GdnProducts::kBf16)
  float* P;   // (chunks, nv, 64, 64) the masked scores (chunk_scores) for the walk that writes o; or null
  float* PT;  // (chunks, nv, 64, 64) scale P^T for the tensor-core reverse walk's dO terms; or null
              // (P and PT: fp32, or with GdnProducts::kBf16 bf16 in the buffer's first half, p_bf16)
  float* Tb;  // (chunks, nv, 64, 64) T diag(beta) in bf16 (p_bf16) for the walks, which then take
              // U = T diag(beta) v themselves and U is null (walk_computes_u); or null
  bf16* o;
  int nk, nv, dk, dv;
  float scale;
  int num_chunks;
  int rows;  // packed rows N
  int path0;  // the walk launch's first path (a level's, GdnPlan::Level; the wgmma walks)
};

// A buffer the bf16 kernels (bf16_kernels) hand each other in bf16: the same element layout as its
// fp32 one, in the fp32 buffer's first half (P, PT, T, sin, vnew; dsout, dvn, db2, gq, gk).
__host__ __device__ inline bf16* p_bf16(float* P) { return reinterpret_cast<bf16*>(P); }
__host__ __device__ inline const bf16* p_bf16(const float* P) { return reinterpret_cast<const bf16*>(P); }

// dst (R rows, default 64, of `cols` elements of T at a stride of `stride`) <- rows r0 .. r0 + L of src, row r
// at src + (r0 + r) * row_pitch; rows >= L zero-filled. cols * sizeof(T) a multiple of 16. The
// block's kRuleThreads threads all call it (every rule_* kernel launches with kRuleThreads).
// kDivide: a division per element instead of the stepping below (two registers fewer live:
// rule_bwd_state_kernel, at its 128-register cap, spills with the stepping).
template <bool kDivide = false, class T>
__device__ __forceinline__ void load_chunk_rows(T* dst, int stride, const T* src, int64_t row_pitch, int r0, int L,
                                                int cols, int R = kGdnChunk) {
  constexpr int kPer = 16 / sizeof(T);
  const int pieces = cols / kPer;
  if constexpr (kDivide) {
    for (int e = threadIdx.x; e < R * pieces; e += kRuleThreads) {
      const int r = e / pieces, c = (e % pieces) * kPer;
      const bool in = r < L;
      attn::cp_async_16(dst + r * stride + c, src + (int64_t)(r0 + (in ? r : 0)) * row_pitch + c, in ? 16 : 0);
    }
    return;
  }
  // Element e = threadIdx.x + i kRuleThreads is row e / pieces, piece e % pieces: stepped by kRuleThreads
  // without a division per element (the walks issue these every chunk step).
  const int step_r = kRuleThreads / pieces, step_c = kRuleThreads % pieces;
  int r = threadIdx.x / pieces, c = threadIdx.x % pieces;
  while (r < R) {
    const bool in = r < L;
    attn::cp_async_16(dst + r * stride + c * kPer, src + (int64_t)(r0 + (in ? r : 0)) * row_pitch + c * kPer,
                      in ? 16 : 0);
    r += step_r, c += step_c;
    if (c >= pieces) c -= pieces, ++r;
  }
}

// load_chunk_rows for a width known at compile time: each thread's copies sit at constant offsets,
// the loop unrolled. The walks' cp.async stages issue these every chunk step (U's and dvn's
// columns); with a runtime width their index arithmetic was about ten instructions a 16-byte copy
// (ncu's source view, H200).
template <int kCols, class T>
__device__ __forceinline__ void load_chunk_rows_fixed(T* dst, int stride, const T* src, int64_t row_pitch, int r0,
                                                      int L) {
  constexpr int kPer = 16 / sizeof(T), kPieces = kCols / kPer, kStepR = kRuleThreads / kPieces;
  static_assert(kCols % kPer == 0 && kRuleThreads % kPieces == 0 && kGdnChunk % kStepR == 0, "whole rows a pass");
  const int c = threadIdx.x % kPieces * kPer, r1 = threadIdx.x / kPieces;
#pragma unroll
  for (int i = 0; i < kGdnChunk / kStepR; ++i) {
    const int r = r1 + i * kStepR;
    const bool in = r < L;
    attn::cp_async_16(dst + r * stride + c, src + (int64_t)(r0 + (in ? r : 0)) * row_pitch + c, in ? 16 : 0);
  }
}

// A chunk's row range, node and flags (the plan's tables). The walks read chunk c + 2's while
// chunk c computes, so a step's prefetch need not wait for the plan's loads.
struct ChunkInfo {
  int r0, L, node, flags, c;  // c: the chunk's index
};
__device__ __forceinline__ ChunkInfo chunk_info(const GdnPlan::Device& plan, int c) {
  return {plan.chunk_row0[c], plan.chunk_len[c], plan.chunk_node[c], plan.chunk_flags[c], c};
}

// The state a node's first chunk links to: forward, where its state comes from (its parent's end
// state in per_node, else its root's initial state in per_root, else null: zeros); backward, where
// its state gradient goes (the parent's acc, else the root's d_init, else nowhere). Both (nodes or
// roots, nv, dk, dv), SS = dk dv elements a head.
template <class T>
__device__ __forceinline__ T* node_link(const GdnPlan::Device& plan, int n, int h, int nv, int64_t SS, T* per_node,
                                        T* per_root) {
  const int parent = plan.node_parent[n], root = plan.node_root[n];
  return parent >= 0 ? per_node + ((int64_t)parent * nv + h) * SS
                     : (per_root && root >= 0 ? per_root + ((int64_t)root * nv + h) * SS : nullptr);
}

// A walk's chunks in its order (first to last, or with kReverse last to first) with the next
// chunk's ChunkInfo read a step ahead, for the stage prefetch that runs one chunk ahead of the
// products: cur is the first chunk until take(c) hands out chunk c, nxt the one after cur.
// The walk's chunks are c0 .. c0 + nc (every chunk of the batch, or a path's: walk_path); take(c)
// and c are positions in them, 0 .. nc, and a ChunkInfo's c the chunk's index in the batch.
template <bool kReverse>
struct ChunkCursor {
  const GdnPlan::Device& plan;
  int nc, c0;
  ChunkInfo cur, nxt;
  __device__ ChunkCursor(const GdnPlan::Device& plan, int nc, int c0 = 0) : plan(plan), nc(nc), c0(c0) {
    cur = nc > 0 ? at(kReverse ? nc - 1 : 0) : ChunkInfo{};
    nxt = nc > 1 ? at(kReverse ? nc - 2 : 1) : cur;
  }
  __device__ ChunkInfo at(int i) const { return chunk_info(plan, c0 + i); }
  __device__ ChunkInfo take(int c) {
    const ChunkInfo ci = cur;
    cur = nxt;
    const int after = kReverse ? c - 2 : c + 2;
    if (after >= 0 && after < nc) nxt = at(after);
    return ci;
  }
};

// The path a block of the wgmma walks takes: path0 + blockIdx.z (a lane; GdnPlan::Level), its
// chunks c0 .. c0 + nc. No other lane of the launch touches its nodes' states.
struct WalkRun {
  int c0, nc;
};
__device__ __forceinline__ WalkRun walk_path(const GdnPlan::Device& plan, int path0) {
  const int i = path0 + (int)blockIdx.z, c0 = plan.path_chunk0[i];
  return {c0, plan.path_chunk0[i + 1] - c0};
}

// The two stage barriers of a walk whose stages come by TMA, initialised by thread 0 (a block
// barrier must follow before any thread waits on them).
__device__ __forceinline__ void init_stage_barriers(uint64_t* bars) {
  if (threadIdx.x == 0) {
    attn::sm90::mbar_init(&bars[0], 1);
    attn::sm90::mbar_init(&bars[1], 1);
    attn::sm90::fence_barrier_init();
  }
}

// The chunk's per-row value-head scalars (gam or beta, (rows, nv) fp32 or bf16) -> dst[64], zeros past L.
__device__ __forceinline__ void load_chunk_gam(float* dst, const float* gam, int nv, int h, int r0, int L) {
  for (int r = threadIdx.x; r < kGdnChunk; r += blockDim.x)
    attn::cp_async_4(dst + r, gam + (int64_t)(r0 + (r < L ? r : 0)) * nv + h, r < L ? 4 : 0);
}

// x[0..64) <- inclusive prefix sums, by warp 0 (two values a lane).
__device__ __forceinline__ void chunk_cumsum(float* x) {
  if (threadIdx.x >= detail::kWarp) return;
  const int lane = threadIdx.x;
  float a = x[lane], b = x[lane + 32];
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float ua = __shfl_up_sync(0xffffffffu, a, o), ub = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) a += ua, b += ub;
  }
  b += __shfl_sync(0xffffffffu, a, 31);
  x[lane] = a;
  x[lane + 32] = b;
}

// acc[u][v] = X_(ta + 16u) . Y_(tb + 16v) over d columns (u, v < 4) for bf16 rows at kRowStride:
// with ta = threadIdx.x / 16 and tb = threadIdx.x % 16, the block's 256 threads cover all 64 x 64
// pairs. d a multiple of 8.
__device__ __forceinline__ void chunk_dots(float (&acc)[4][4], const bf16* X, const bf16* Y, int d) {
  const int ta = threadIdx.x / 16, tb = threadIdx.x % 16;
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[u][v] = 0.f;
  for (int i = 0; i < d; i += 8) {
    float x[4][8], y[4][8];
#pragma unroll
    for (int u = 0; u < 4; ++u) detail::load_bf16<8>(x[u], X + (ta + 16 * u) * kRowStride + i);
#pragma unroll
    for (int v = 0; v < 4; ++v) detail::load_bf16<8>(y[v], Y + (tb + 16 * v) * kRowStride + i);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][v] = fmaf(x[u][e], y[v][e], acc[u][v]);
  }
}

// A warp's 16 x 32 tile of the 64 x 64 Gram products X_a . Y_b (bf16 rows, exact in fp32 products,
// fp32 sums) on tensor cores (mma m16n8k16), over d columns (a multiple of 16): rows m0 =
// 16 (w % 4), columns n0 = 32 (w / 4) for warp w; c[n]: rows m0 + gq ([0], [1]) and + 8 ([2], [3]),
// columns n0 + 8 n + 2 tq (+1). X and Y: rows at kRowStride.
__device__ __forceinline__ void gram_tile_mma(float (&c)[4][4], const bf16* X, const bf16* Y, int m0, int n0, int d) {
  const int lane = threadIdx.x % detail::kWarp;
  for (int k0 = 0; k0 < d; k0 += 16) {
    uint32_t a[4], b0[4], b1[4];
    mma::ldsm_x4(a, X + (m0 + lane % 8 + 8 * (lane / 8 % 2)) * kRowStride + k0 + 8 * (lane / 16));
    mma::ldsm_x4(b0, Y + (n0 + lane % 8 + 8 * (lane / 16)) * kRowStride + k0 + 8 * (lane / 8 % 2));
    mma::ldsm_x4(b1, Y + (n0 + 16 + lane % 8 + 8 * (lane / 16)) * kRowStride + k0 + 8 * (lane / 8 % 2));
    mma::mma_16816(c[0], a, b0[0], b0[1]);
    mma::mma_16816(c[1], a, b0[2], b0[3]);
    mma::mma_16816(c[2], a, b1[0], b1[1]);
    mma::mma_16816(c[3], a, b1[2], b1[3]);
  }
}

// put(a, b, X_a . Y_b) for the 64 x 64 pairs of bf16 rows at kRowStride, fp32, each pair by one
// thread of the block's 256 (all call it), no barrier. On tensor cores (mma m16n8k16: the bf16
// products are exact in fp32, summed in another order than chunk_dots) when d is a multiple of 16,
// else by chunk_dots. Each warp takes 16 rows x 32 columns.
template <class Put>
__device__ __forceinline__ void chunk_gram_each(const bf16* X, const bf16* Y, int d, Put&& put) {
  if (d % 16 != 0) {
    float acc[4][4];
    chunk_dots(acc, X, Y, d);
    const int ta = threadIdx.x / 16, tb = threadIdx.x % 16;
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) put(ta + 16 * u, tb + 16 * v, acc[u][v]);
    return;
  }
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
  float c[4][4] = {};
  gram_tile_mma(c, X, Y, m0, n0, d);
  const int gq = lane / 4, tq = lane % 4;  // c[n]: rows gq ([0], [1]) and gq + 8, columns 2 tq (+1) of n8 tile n
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int col = n0 + 8 * n + 2 * tq;
    put(m0 + gq, col, c[n][0]);
    put(m0 + gq, col + 1, c[n][1]);
    put(m0 + gq + 8, col, c[n][2]);
    put(m0 + gq + 8, col + 1, c[n][3]);
  }
}

// dst[a][b] (transpose: dst[b][a]) = X_a . Y_b (chunk_gram_each) at a row stride of `stride`; then
// a block barrier.
__device__ __forceinline__ void chunk_gram(float* dst, int stride, bool transpose, const bf16* X, const bf16* Y,
                                           int d) {
  chunk_gram_each(X, Y, d, [&](int a, int b, float x) { dst[transpose ? b * stride + a : a * stride + b] = x; });
  __syncthreads();
}

__device__ __forceinline__ float bf(const bf16& x) { return __bfloat162float(x); }

// The two fp32 values of a packed bf16 pair (low half first): exact, a shift and a mask.
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
// Element e (0 .. 7) of eight packed bf16 (a 16-byte load), as fp32 (unpack_bf16x2's halves).
__device__ __forceinline__ float bf16_at(const uint4& x, int e) {
  const float2 f = unpack_bf16x2(e < 2 ? x.x : e < 4 ? x.y : e < 6 ? x.z : x.w);
  return e % 2 ? f.y : f.x;
}

// (x0, x1) as two packed bf16 pairs, hi = bf16(x) and lo = bf16(x - hi): x = hi + lo to a relative
// 2^-18, so a product with a bf16 operand is two mma (hi, lo) in fp32. Both halves by the packed
// conversion (F2FP, round to nearest even; one instruction a pair): converting each value alone
// (F2F) ran on a slower pipe and was a sixth of the grad kernel's stall samples (ncu, H200).
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = attn::pack_bf16x2(x0, x1);
  const float2 h = unpack_bf16x2(hi);
  lo = attn::pack_bf16x2(x0 - h.x, x1 - h.y);
}

// (x0, x1) as a product's operand parts: bf16 high and low halves (split_bf16x2), or with kBf16
// (GdnProducts::kBf16) the high half alone, x rounded to bf16 (lo left as it was, never read).
template <bool kBf16>
__device__ __forceinline__ void bf16_parts(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kBf16)
    hi = attn::pack_bf16x2(x0, x1);
  else
    split_bf16x2(x0, x1, hi, lo);
}

// Element at of a buffer the bf16 kernels hand each other (p_bf16) and its neighbour, (x0, x1):
// fp32, or with kBf16 the packed bf16 pair, x rounded as the reading kernel's products would.
template <bool kBf16>
__device__ __forceinline__ void store_pair(float* buf, int64_t at, float x0, float x1) {
  if constexpr (kBf16)
    *reinterpret_cast<uint32_t*>(p_bf16(buf) + at) = attn::pack_bf16x2(x0, x1);
  else
    *reinterpret_cast<float2*>(buf + at) = make_float2(x0, x1);
}

// (x0, x1) as three packed bf16 pairs, hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid): x
// = hi + mid + lo to fp32's 24 bits (each difference exact).
__device__ __forceinline__ void split3_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  hi = attn::pack_bf16x2(x0, x1);
  const float2 h = unpack_bf16x2(hi);
  const float r0 = x0 - h.x, r1 = x1 - h.y;
  mid = attn::pack_bf16x2(r0, r1);
  const float2 m = unpack_bf16x2(mid);
  lo = attn::pack_bf16x2(r0 - m.x, r1 - m.y);
}

// An m16n8k16 A fragment (rows m0 + gq (+8), columns k0 + 2 tq (+1, +8, +9), the PTX ISA's
// layout) of an fp32 matrix given element-wise by at(row, col), as bf16 high and low halves
// (split_bf16x2: two mma give the fp32 product), or with kBf16 (GdnProducts::kBf16) the high half
// alone (bf16_parts).
template <bool kBf16, class At>
__device__ __forceinline__ void a_fragment_parts(uint32_t (&hi)[4], uint32_t (&lo)[4], int m0, int k0, At&& at) {
  const int lane = threadIdx.x % detail::kWarp, gq = lane / 4, tq = lane % 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = m0 + gq + 8 * (j % 2), c = k0 + 2 * tq + 8 * (j / 2);
    bf16_parts<kBf16>(at(r, c), at(r, c + 1), hi[j], lo[j]);
  }
}

// The same fragment as three bf16 parts (split3_bf16x2: fp32's 24 bits), the fp32 matrix given
// pairwise by pair(row, col) = (at(row, col), at(row, col + 1)).
template <class Pair>
__device__ __forceinline__ void split3_a_fragment(uint32_t (&hi)[4], uint32_t (&mid)[4], uint32_t (&lo)[4], int m0,
                                                  int k0, Pair&& pair) {
  const int lane = threadIdx.x % detail::kWarp, gq = lane / 4, tq = lane % 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = pair(m0 + gq + 8 * (j % 2), k0 + 2 * tq + 8 * (j / 2));
    split3_bf16x2(x.x, x.y, hi[j], mid[j], lo[j]);
  }
}

// c += (hi + mid + lo) B for a B exact in bf16: the small parts first.
__device__ __forceinline__ void mma_split3(float (&c)[4], const uint32_t (&hi)[4], const uint32_t (&mid)[4],
                                           const uint32_t (&lo)[4], uint32_t b0, uint32_t b1) {
  mma::mma_16816(c, lo, b0, b1);
  mma::mma_16816(c, mid, b0, b1);
  mma::mma_16816(c, hi, b0, b1);
}

// A (three bf16 parts, split3_a_fragment) times B of fp32 v (k rows, n8 columns) in three bf16
// parts too: fp32's products to 2^-23 of a term (the six of order 2^-16 and above). B's fragment
// from v = &V[k0 + 2 tq][col0 + gq] at a row stride of `stride`. small += the three products of
// order 2^-16 (first), c += the three larger ones; small may be c (one chain, the same order).
__device__ __forceinline__ void mma_split3_both(float (&small)[4], float (&c)[4], const uint32_t (&ah)[4],
                                                const uint32_t (&am)[4], const uint32_t (&al)[4], const float* v,
                                                int stride) {
  uint32_t bh[2], bm[2], bl[2];  // rows k0 + 2 tq (+1) and + 8 (+9)
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) split3_bf16x2(v[8 * jj * stride], v[(8 * jj + 1) * stride], bh[jj], bm[jj], bl[jj]);
  mma::mma_16816(small, am, bm[0], bm[1]);
  mma::mma_16816(small, ah, bl[0], bl[1]);
  mma::mma_16816(small, al, bh[0], bh[1]);
  mma::mma_16816(c, ah, bm[0], bm[1]);
  mma::mma_16816(c, am, bh[0], bh[1]);
  mma::mma_16816(c, ah, bh[0], bh[1]);
}

// T = (I + diag(rs) A)^-1 for a strictly lower triangular 64 x 64 A (fp32 at kPairStride, zero in
// rows past the chunk; only its strictly lower part is read, its upper triangle may hold other
// values, rule_prep_kernel's kept products): T is unit lower triangular. In 16 x 16
// blocks: the four diagonal blocks by substitution (a column a thread, 64 threads), then the blocks
// below them by their distance d from the diagonal, T_ij = -T_ii P_ij with P_ij = diag(rs) sum_{k=j}^{i-1}
// A_ik T_kj (i = j + d), P staged in T's unused upper block (j, i). So T's diagonal blocks hold
// their zeros above the diagonal and its upper off-diagonal blocks hold those stages (readers skip
// them). About 400 FMAs a thread where a substitution over all 64 rows of a 256-column right-hand
// side took 2016. All threads call it; it ends with a barrier.
__device__ __forceinline__ void chunk_unit_lower_inverse(float* T, const float* A, const float* rs) {
  constexpr int B = 16, PS = kPairStride;
  if (threadIdx.x < 4 * B) {  // T_bb, column j: x_r = -rs_r sum_{t < r} A_rt x_t (x_t = 0 for t < j, x_j = 1)
    const int o = B * (threadIdx.x / B), j = threadIdx.x % B;
    float x[B];
#pragma unroll
    for (int r = 0; r < B; ++r) {
      float s0 = 0.f, s1 = 0.f;  // two chains
#pragma unroll
      for (int t = 0; t < r; ++t) {
        const float a = A[(o + r) * PS + o + t];
        if (t % 2) s1 = fmaf(a, x[t], s1);
        else s0 = fmaf(a, x[t], s0);
      }
      x[r] = r < j ? 0.f : r == j ? 1.f : -rs[o + r] * (s0 + s1);
    }
#pragma unroll
    for (int r = 0; r < B; ++r) T[(o + r) * PS + o + j] = x[r];
  }
  __syncthreads();
  auto axpy4 = [](float4& acc, float a, const float4& x) {
    acc.x = fmaf(a, x.x, acc.x), acc.y = fmaf(a, x.y, acc.y), acc.z = fmaf(a, x.z, acc.z), acc.w = fmaf(a, x.w, acc.w);
  };
  for (int d = 1; d < 4; ++d) {
    // A thread per (block i = j + d, row r, four columns c .. c + 3): (4 - d) 64 items.
    const int e = threadIdx.x, j = e / (4 * B), i = j + d, r = e / 4 % B, c = 4 * (e % 4);
    const bool on = e < (4 - d) * 4 * B;
    if (on) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k = j; k < i; ++k)
#pragma unroll
        for (int t = 0; t < B; ++t)
          axpy4(acc, A[(B * i + r) * PS + B * k + t],
                *reinterpret_cast<const float4*>(T + (B * k + t) * PS + B * j + c));
      const float s = rs[B * i + r];
      *reinterpret_cast<float4*>(T + (B * j + r) * PS + B * i + c) =
          make_float4(s * acc.x, s * acc.y, s * acc.z, s * acc.w);
    }
    __syncthreads();
    if (on) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int t = 0; t < B; ++t)  // T_ii's row r (zero past r)
        axpy4(acc, T[(B * i + r) * PS + B * i + t], *reinterpret_cast<const float4*>(T + (B * j + t) * PS + B * i + c));
      *reinterpret_cast<float4*>(T + (B * i + r) * PS + B * j + c) = make_float4(-acc.x, -acc.y, -acc.z, -acc.w);
    }
    __syncthreads();
  }
}

// The rows r < L of T diag(sc) Y for T from chunk_unit_lower_inverse and bf16 rows Y (64, d) at
// kRowStride (d a multiple of 8, at most 128), on tensor cores: T diag(sc) split into bf16 halves
// (split_bf16x2; Y exact), two mma a tile, fp32 sums; only T's lower blocks are read. Each pair of
// the result (row r, columns col, col + 1) goes to put(r, col, x0, x1). A warp takes 16 rows (m0)
// and every column, 8 kTiles columns a pass. kBf16 (GdnProducts::kBf16): T diag(sc) rounded to
// bf16, one mma a tile.
template <int kTiles, bool kBf16 = false, class Put>  // n8 tiles a pass (accumulators: 4 kTiles registers)
__device__ __forceinline__ void chunk_lower_apply(Put&& put, const float* T, const float* sc, const bf16* Y, int d,
                                                  int m0, int L) {
  constexpr int PS = kPairStride;
  const int lane = threadIdx.x % detail::kWarp, gq = lane / 4, tq = lane % 4;
  for (int n0 = 0; n0 < d; n0 += 8 * kTiles) {
    float c[kTiles][4] = {};  // [n8 tile][fragment]
    for (int k0 = 0; k0 <= m0; k0 += 16) {
      uint32_t ah[4], al[4];
      a_fragment_parts<kBf16>(ah, al, m0, k0, [&](int r, int s) { return T[r * PS + s] * sc[s]; });
      const bf16* src = Y + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * kRowStride + n0 + 8 * (lane / 16);
#pragma unroll
      for (int n = 0; n < kTiles; n += 2) {
        if (n0 + 8 * n >= d) break;
        if (n0 + 8 * n + 8 < d) {
          uint32_t b[4];
          mma::ldsm_x4_trans(b, src + 8 * n);
          if constexpr (!kBf16) mma::mma_16816(c[n], al, b[0], b[1]);
          mma::mma_16816(c[n], ah, b[0], b[1]);
          if constexpr (!kBf16) mma::mma_16816(c[n + 1], al, b[2], b[3]);
          mma::mma_16816(c[n + 1], ah, b[2], b[3]);
        } else {  // the last n8 tile alone (d = 8 mod 16)
          uint32_t b[2];
          mma::ldsm_x2_trans(b, src + 8 * n);
          if constexpr (!kBf16) mma::mma_16816(c[n], al, b[0], b[1]);
          mma::mma_16816(c[n], ah, b[0], b[1]);
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + gq + 8 * half;
      if (r >= L) continue;
#pragma unroll
      for (int n = 0; n < kTiles; ++n)
        if (n0 + 8 * n < d) put(r, n0 + 8 * n + 2 * tq, c[n][2 * half], c[n][2 * half + 1]);
    }
  }
}

// The chunk's masked scores P_rs = (q_r . k_s) e^(gam_r - gam_s) for s <= r < L, else 0, for the
// forward walk that writes o (RuleParams::P): the products and the mask of rule_out_kernel's
// (chunk_gram's tiling, gram_tile_mma), each pair of a row (r, s, s + 1; s even) to
// put(r, s, x0, x1), all 64 x 64, q and k rows of bf16 at kRowStride. The two warp tiles wholly
// above the diagonal are zeros. Rows past L meet only the mask's select.
// keep (or null): the raw products q_r . k_s stored there too (rows of kPairStride, the tiles on
// and below the diagonal); from (or null): the raw products taken from there instead (Q unread).
template <class Put>
__device__ __forceinline__ void chunk_scores(const bf16* Q, const bf16* K, const float* gam, int dk, int L, Put&& put,
                                             float* keep = nullptr, const float* from = nullptr) {
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
  float c[4][4] = {};
  if (n0 < m0 + 16) {
    auto at = [&](int n, int e) { return (m0 + gq + 8 * (e / 2)) * kPairStride + n0 + 8 * n + 2 * tq + e % 2; };
    if (from) {
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[n][e] = from[at(n, e)];
    } else {
      gram_tile_mma(c, Q, K, m0, n0, dk);
    }
    if (keep)
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) keep[at(n, e)] = c[n][e];
  }
  auto masked = [&](int r, int s, float x) { return s <= r && r < L ? __expf(gam[r] - gam[s]) * x : 0.f; };
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + gq + 8 * half, s = n0 + 8 * n + 2 * tq;
      put(r, s, masked(r, s, c[n][2 * half]), masked(r, s + 1, c[n][2 * half + 1]));
    }
}

// W's layout (RuleParams::W): when dk is a multiple of 16 (the tensor-core walks), the bf16 halves
// of -W (split_bf16x2), a high plane (N, nv, dk) then a low plane, in W's fp32 bytes: the walks
// take their A fragments by ldmatrix as they are (both use -W: v_new = U + (-W) S, dS += (-W)^T dvn).
// Otherwise fp32 rows (the scalar walks).
__host__ __device__ constexpr bool w_as_halves(int dk) { return dk % 16 == 0; }

// Which 16-row block of a chunk warp w takes when the 8 warps split two column halves of a product
// with a lower triangular T: w, w + 4 (one scheduler's pair) get blocks summing to 3, so every
// scheduler carries the same count of T's nonzero k-blocks.
__device__ __forceinline__ int balanced_row_block(int warp) { return (0x32230110 >> (4 * warp)) & 3; }

// Per (chunk, value head): gamma (the in-chunk cumulative log decay), KKd = strictly_lower(k_r .
// k_s exp(gamma_r - gamma_s)) (A = diag(beta) KKd), T = (I + A)^-1 (chunk_unit_lower_inverse),
// then U = T diag(beta) v and W = T diag(beta exp(gamma)) k on tensor cores (chunk_lower_apply):
// even warps U, odd warps W, 16 rows each (balanced_row_block), 64 columns a pass so three blocks
// fit a multiprocessor (80 registers; 16 columns a pass and two blocks: 0.87 ms against 0.77 here).
// kHalves: w_as_halves(p.dk) (one instantiation each: both W paths in one kernel spill at its
// 80-register cap). kBf16 (GdnProducts::kBf16, with kHalves: the walks that read these take one
// bf16 mma a product): -W's high plane only, and the scores P or PT as bf16 (p_bf16), each value
// the bits the walk would round it to (both round to nearest even); -W's low plane is left
// unwritten; the backward's T likewise in bf16; U and W from T diag(beta) and T diag(beta e^gamma)
// rounded to bf16 (one mma a tile, as the walks take their operands). About a quarter to a third
// of the prep's output bytes fewer, and the walks stage half the scores' bytes. Without U (p.U
// null, walk_computes_u): every warp takes W, a column half each, and the prep stores T diag(beta)
// in bf16 (p.Tb) for the walks, which compute U from it, and a block takes a key head's value
// heads in turn (prep_heads), forming the key head's Gram products once (H100: prep 669 -> 626
// us, forward 0.97x).
constexpr int kPrepTiles = 8, kPrepBlocks = 3;
// The value heads a prep block takes in turn: a key head's group where the walks take U
// themselves (no v rows in the prep: their bytes keep q . k), else one.
__host__ __device__ inline int prep_heads(const RuleParams& p) {
  return p.U == nullptr && p.nv > p.nk ? p.nv / p.nk : 1;
}
template <bool kHalves, bool kBf16 = false>
__global__ void __launch_bounds__(kRuleThreads, kPrepBlocks) rule_prep_kernel(RuleParams p) {
  static_assert(kHalves || !kBf16, "bf16 products only where W is stored as halves");
  TT_EXTERN_SMEM_16(smem);
  // Block c (nv / heads) + j: value heads h0 = j heads .. h0 + heads - 1 (prep_heads), in turn.
  // With one head a block, a key head's value heads side by side, so all but the first read the
  // chunk's q and k rows from L2; with a key head's group a block, its first head forms the key
  // head's Gram products k . k and q . k and keeps them (raw, fp32) for the others: k . k in A's
  // upper triangle (the inverse reads A's lower one only), q . k in v's bytes (no v rows there).
  const int heads = prep_heads(p), c = (int)blockIdx.x / (p.nv / heads), h0 = (int)blockIdx.x % (p.nv / heads) * heads;
  const int kh = h0 / (p.nv / p.nk);
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c], dk = p.dk, dv = p.dv;
  constexpr int PS = kPairStride;
  bf16* Kb = reinterpret_cast<bf16*>(smem);                          // (64, kRowStride)
  bf16* Vb = Kb + kGdnChunk * kRowStride;                            // (64, kRowStride)
  float* A = reinterpret_cast<float*>(Vb + kGdnChunk * kRowStride);  // (64, PS) KKd
  float* T = A + kGdnChunk * PS;                                     // (64, PS)
  float* gam = T + kGdnChunk * PS;                                   // (64)
  float* bet = gam + kGdnChunk;                                      // (64)
  float* sw = bet + kGdnChunk;                                       // (64) beta e^gamma
  bf16* Qb = reinterpret_cast<bf16*>(T);  // with p.P or p.PT: q's rows (64, kRowStride), in T's bytes until the scores are out
  static_assert(sizeof(bf16) * kRowStride == sizeof(float) * kPairStride, "q's rows fill T's bytes");
  float* QKraw = reinterpret_cast<float*>(Vb);  // heads > 1: q . k (64, PS), kept by the first head
  for (int hh = 0; hh < heads; ++hh) {
    const int h = h0 + hh;
    if (hh > 0) __syncthreads();  // the head before is done with beta, gam, A and T
    if (hh == 0) {
      load_chunk_rows(Kb, kRowStride, p.k + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
      if (p.U) load_chunk_rows(Vb, kRowStride, p.v + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);  // U's only
      if (p.P || p.PT) load_chunk_rows(Qb, kRowStride, p.q + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
      attn::cp_async_commit();
    }
    for (int r = threadIdx.x; r < kGdnChunk; r += blockDim.x) {
      const bool in = r < L;
      bet[r] = in ? ld(p.beta + (int64_t)(r0 + r) * p.nv + h) : 0.f;
      gam[r] = in ? ld(p.g + (int64_t)(r0 + r) * p.nv + h) : 0.f;
    }
    __syncthreads();
    chunk_cumsum(gam);
    attn::cp_async_wait<0>();
    __syncthreads();
    if (hh == 0) {
      chunk_gram_each(Kb, Kb, dk, [&](int r, int s, float x) {  // masked as stored (the barrier below)
        if (s < r) {
          A[r * PS + s] = r < L ? __expf(gam[r] - gam[s]) * x : 0.f;
          if (heads > 1) A[s * PS + r] = x;  // kept for the later heads
        } else if (s == r || heads == 1) {
          A[r * PS + s] = 0.f;
        }
      });
    } else {  // the lower triangle from the kept products (A's upper one)
      for (int e = threadIdx.x; e < kGdnChunk * kGdnChunk; e += blockDim.x) {
        const int r = e / kGdnChunk, s = e % kGdnChunk;
        if (s < r) A[r * PS + s] = r < L ? __expf(gam[r] - gam[s]) * A[s * PS + r] : 0.f;
      }
    }
    float* keep = heads > 1 && hh == 0 ? QKraw : nullptr;  // the raw scores, for the later heads
    const float* from = hh > 0 ? QKraw : nullptr;
    for (int r = threadIdx.x; r < kGdnChunk; r += blockDim.x) sw[r] = bet[r] * __expf(gam[r]);
    if (p.P) {  // the scores (dk a multiple of 16, walk_writes_outputs)
      const int64_t at = ((int64_t)c * p.nv + h) * kGdnChunk * kGdnChunk;
      chunk_scores(Qb, Kb, gam, dk, L,
                   [&](int r, int s, float x0, float x1) { store_pair<kBf16>(p.P, at + r * kGdnChunk + s, x0, x1); },
                   keep, from);
    } else if (p.PT) {  // the backward's: transposed and scaled
      const int64_t at = ((int64_t)c * p.nv + h) * kGdnChunk * kGdnChunk;
      chunk_scores(Qb, Kb, gam, dk, L, [&](int r, int s, float x0, float x1) {
        if constexpr (kBf16) {
          bf16* dst = p_bf16(p.PT) + at;
          dst[s * kGdnChunk + r] = __float2bfloat16_rn(p.scale * x0);
          dst[(s + 1) * kGdnChunk + r] = __float2bfloat16_rn(p.scale * x1);
        } else {
          p.PT[at + s * kGdnChunk + r] = p.scale * x0;
          p.PT[at + (s + 1) * kGdnChunk + r] = p.scale * x1;
        }
      }, keep, from);
    }
    __syncthreads();  // A is masked; q's rows are read (T's bytes are free)
    chunk_unit_lower_inverse(T, A, bet);
    // T's lower blocks, 0 above them (chunk_unit_lower_inverse's scratch), columns times col_scale
    // (or 1), to the chunk's (64, 64) of buf: fp32, or with kBf16 in bf16 (p_bf16), as the kernels
    // that read it round it.
    auto copy_t = [&](float* buf, const float* col_scale) {
      const int64_t at = ((int64_t)c * p.nv + h) * kGdnChunk * kGdnChunk;
      for (int e = threadIdx.x; e < kGdnChunk * kGdnChunk / 4; e += kRuleThreads) {
        const int r = e / (kGdnChunk / 4), s = 4 * (e % (kGdnChunk / 4));
        float4 t = s / 16 > r / 16 ? make_float4(0.f, 0.f, 0.f, 0.f) : *reinterpret_cast<const float4*>(T + r * PS + s);
        if (col_scale) t.x *= col_scale[s], t.y *= col_scale[s + 1], t.z *= col_scale[s + 2], t.w *= col_scale[s + 3];
        if constexpr (kBf16)
          *reinterpret_cast<uint2*>(p_bf16(buf) + at + r * kGdnChunk + s) =
              make_uint2(attn::pack_bf16x2(t.x, t.y), attn::pack_bf16x2(t.z, t.w));
        else
          *reinterpret_cast<float4*>(buf + at + r * kGdnChunk + s) = t;
      }
    };
    if (p.T) copy_t(p.T, nullptr);  // the backward's, for the grad kernel
    if (kBf16 && p.Tb) copy_t(p.Tb, bet);  // T diag(beta) for the walks (walk_computes_u); 0 past L (beta is)
    {
      const int warp = threadIdx.x / detail::kWarp, m0 = 16 * balanced_row_block(warp);
      const int64_t row0 = (int64_t)r0 * p.nv + h;  // the chunk's first row of (N, nv, d) tensors
      auto put_w = [&](int r, int col, float x0, float x1) {  // fp32 rows, or (w_as_halves) -W's bf16 halves
        const int64_t at = (row0 + (int64_t)r * p.nv) * dk + col;
        if constexpr (kBf16) {
          *reinterpret_cast<uint32_t*>(reinterpret_cast<bf16*>(p.W) + at) = attn::pack_bf16x2(-x0, -x1);
        } else if constexpr (kHalves) {
          bf16* Wh = reinterpret_cast<bf16*>(p.W);
          split_bf16x2(-x0, -x1, *reinterpret_cast<uint32_t*>(Wh + at),
                       *reinterpret_cast<uint32_t*>(Wh + (int64_t)p.rows * p.nv * dk + at));
        } else {
          *reinterpret_cast<float2*>(p.W + at) = make_float2(x0, x1);
        }
      };
      if (p.U) {  // even warps U, odd warps W
        if (warp % 2 == 0) {
          chunk_lower_apply<kPrepTiles, kBf16>([&](int r, int col, float x0, float x1) {
            *reinterpret_cast<float2*>(p.U + (row0 + (int64_t)r * p.nv) * dv + col) = make_float2(x0, x1);
          }, T, bet, Vb, dv, m0, L);
        } else {
          chunk_lower_apply<kPrepTiles, kBf16>(put_w, T, sw, Kb, dk, m0, L);
        }
      } else {  // W alone (walk_computes_u, dk 128): a column half a warp, each row block twice (balanced_row_block)
        const int half = (warp >> 1) & 1, d = dk / 2;
        chunk_lower_apply<kPrepTiles, kBf16>(
            [&](int r, int col, float x0, float x1) { put_w(r, col + half * d, x0, x1); }, T, sw, Kb + half * d, d, m0, L);
      }
    }
    for (int r = threadIdx.x; r < L; r += blockDim.x) p.gam[(int64_t)(r0 + r) * p.nv + h] = gam[r];
  }
}

size_t prep_smem_bytes() {  // k, v rows, KKd, T, gam, beta, beta e^gam: the same for every head shape
  return 2 * sizeof(bf16) * kGdnChunk * kRowStride +
         sizeof(float) * (2 * (size_t)kGdnChunk * kPairStride + 3 * kGdnChunk);
}

constexpr int kWalkCols = 32;                     // state columns per walking block (a lane each)
constexpr int kWalkWarps = kRuleThreads / kWalkCols;  // 8
constexpr int kWalkRowsV = kGdnChunk / kWalkWarps;  // v_new rows per thread: 8
constexpr int kWalkRowsS = 128 / kWalkWarps;        // state rows per thread: 16 (dk <= 128)

// One stage of a walking block's chunk operands: W rows (64, dk) fp32, keys (64, 128) bf16, the
// block's U columns (64, 32) fp32, gam (64).
struct WalkStage {
  float* W;
  bf16* K;
  float* U;
  float* gam;
  __device__ WalkStage(float* base, int dk) {
    W = base;
    K = reinterpret_cast<bf16*>(W + kGdnChunk * dk);
    U = reinterpret_cast<float*>(K + kGdnChunk * 128);
    gam = U + kGdnChunk * kWalkCols;
  }
  __host__ __device__ static constexpr size_t floats(int dk) {
    return (size_t)kGdnChunk * dk + kGdnChunk * 128 / 2 + kGdnChunk * kWalkCols + kGdnChunk;
  }
};

__device__ __forceinline__ void walk_prefetch(const WalkStage& st, const RuleParams& p, const ChunkInfo& ci, int h, int kh,
                                              int j0) {
  const int r0 = ci.r0, L = ci.L;
  load_chunk_rows(st.W, p.dk, p.W + (int64_t)h * p.dk, (int64_t)p.nv * p.dk, r0, L, p.dk);
  load_chunk_rows(st.K, 128, p.k + (int64_t)kh * p.dk, (int64_t)p.nk * p.dk, r0, L, p.dk);
  load_chunk_rows(st.U, kWalkCols, p.U + (int64_t)h * p.dv + j0, (int64_t)p.nv * p.dv, r0, L, kWalkCols);
  load_chunk_gam(st.gam, p.gam, p.nv, h, r0, L);
}

// S (dk, 32) <-> global rows of dv floats at columns j0 .. j0 + 32 (float4s).
__device__ __forceinline__ void state_to_global(float* dst, const float* S, int dk, int dv, int j0) {
  for (int e = threadIdx.x; e < dk * kWalkCols / 4; e += blockDim.x) {
    const int i = e / (kWalkCols / 4), j = (e % (kWalkCols / 4)) * 4;
    *reinterpret_cast<float4*>(dst + (int64_t)i * dv + j0 + j) = *reinterpret_cast<const float4*>(S + i * kWalkCols + j);
  }
}
__device__ __forceinline__ void state_from_global(float* S, const float* src, int dk, int dv, int j0) {
  for (int e = threadIdx.x; e < dk * kWalkCols / 4; e += blockDim.x) {
    const int i = e / (kWalkCols / 4), j = (e % (kWalkCols / 4)) * 4;
    *reinterpret_cast<float4*>(S + i * kWalkCols + j) =
        src ? *reinterpret_cast<const float4*>(src + (int64_t)i * dv + j0 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Per (value head, 32 state columns): the chunks in the plan's order, the next chunk's operands in
// flight (cp.async, two stages) while this one computes. A node's first chunk starts from its
// parent's end state (node_end, written earlier by this block: parents' chunks come first), or its root's
// init; each chunk stores the state it starts from (sin) and v_new = U - W S, then
// S <- exp(gamma_L) S + sum_s exp(gamma_L - gamma_s) k_s v_new_s^T; a node's last chunk stores
// its end state.
__global__ void __launch_bounds__(kRuleThreads) rule_walk_kernel(RuleParams p) {
  TT_EXTERN_SMEM_16(smem);
  const int h = blockIdx.x, j0 = blockIdx.y * kWalkCols, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv;
  float* S = reinterpret_cast<float*>(smem);  // (dk, 32)
  float* Vn = S + 128 * kWalkCols;            // (64, 32)
  float* dec = Vn + kGdnChunk * kWalkCols;    // (64) exp(gamma_L - gamma_s)
  float* stages = dec + kGdnChunk;            // two WalkStages
  const size_t stage_floats = WalkStage::floats(dk);
  const int64_t SS = (int64_t)dk * dv;
  const int w = threadIdx.x / kWalkCols, jj = threadIdx.x % kWalkCols;
  const int nc = p.num_chunks;
  ChunkCursor<false> chunks(p.plan, nc);
  if (nc > 0) walk_prefetch(WalkStage(stages, dk), p, chunks.cur, h, kh, j0);
  attn::cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    if (c + 1 < nc) walk_prefetch(WalkStage(stages + ((c + 1) & 1) * stage_floats, dk), p, chunks.nxt, h, kh, j0);
    attn::cp_async_commit();
    attn::cp_async_wait<1>();
    const WalkStage st(stages + (c & 1) * stage_floats, dk);
    const ChunkInfo ci = chunks.take(c);
    const int n = ci.node, flags = ci.flags, r0 = ci.r0, L = ci.L;
    if (flags & 1) {
      const float* src = node_link<const float>(p.plan, n, h, p.nv, SS, p.node_end, p.init);
      state_from_global(S, src, dk, dv, j0);
    }
    __syncthreads();
    state_to_global(p.sin + ((int64_t)c * p.nv + h) * SS, S, dk, dv, j0);
    const float gl = st.gam[L - 1];
    if (threadIdx.x < kGdnChunk) dec[threadIdx.x] = threadIdx.x < L ? __expf(gl - st.gam[threadIdx.x]) : 0.f;
    {  // v_new rows w * 8 + t = U - W S
      float acc[kWalkRowsV];
#pragma unroll
      for (int t = 0; t < kWalkRowsV; ++t) acc[t] = st.U[(w * kWalkRowsV + t) * kWalkCols + jj];
      for (int i = 0; i < dk; i += 4) {
        const float s0 = S[i * kWalkCols + jj], s1 = S[(i + 1) * kWalkCols + jj], s2 = S[(i + 2) * kWalkCols + jj],
                    s3 = S[(i + 3) * kWalkCols + jj];
#pragma unroll
        for (int t = 0; t < kWalkRowsV; ++t) {
          const float4 wv = *reinterpret_cast<const float4*>(st.W + (w * kWalkRowsV + t) * dk + i);
          acc[t] = fmaf(-wv.x, s0, acc[t]);
          acc[t] = fmaf(-wv.y, s1, acc[t]);
          acc[t] = fmaf(-wv.z, s2, acc[t]);
          acc[t] = fmaf(-wv.w, s3, acc[t]);
        }
      }
#pragma unroll
      for (int t = 0; t < kWalkRowsV; ++t) {
        const int r = w * kWalkRowsV + t;
        Vn[r * kWalkCols + jj] = acc[t];  // 0 past L (W and U rows are zero-filled)
        if (r < L) p.vnew[((int64_t)(r0 + r) * p.nv + h) * dv + j0 + jj] = acc[t];
      }
    }
    __syncthreads();
    {  // state rows w * 16 + t
      float acc[kWalkRowsS];
      const float el = __expf(gl);
#pragma unroll
      for (int t = 0; t < kWalkRowsS; ++t) {
        const int i = w * kWalkRowsS + t;
        acc[t] = i < dk ? el * S[i * kWalkCols + jj] : 0.f;
      }
      if (w * kWalkRowsS < dk)
        for (int s = 0; s < kGdnChunk; ++s) {
          const float v = dec[s] * Vn[s * kWalkCols + jj];
          float kv[kWalkRowsS];
          detail::load_bf16<8>(*reinterpret_cast<float(*)[8]>(kv), st.K + s * 128 + w * kWalkRowsS);
          detail::load_bf16<8>(*reinterpret_cast<float(*)[8]>(kv + 8), st.K + s * 128 + w * kWalkRowsS + 8);
#pragma unroll
          for (int t = 0; t < kWalkRowsS; ++t) acc[t] = fmaf(kv[t], v, acc[t]);
        }
#pragma unroll
      for (int t = 0; t < kWalkRowsS; ++t) {
        const int i = w * kWalkRowsS + t;
        if (i < dk) S[i * kWalkCols + jj] = acc[t];
      }
    }
    __syncthreads();
    if (flags & 2) state_to_global(p.node_end + ((int64_t)n * p.nv + h) * SS, S, dk, dv, j0);
  }
  attn::cp_async_wait<0>();
}

size_t walk_smem_bytes(int dk) {
  return sizeof(float) * (128 * kWalkCols + kGdnChunk * kWalkCols + kGdnChunk + 2 * WalkStage::floats(dk));
}

// The walk on tensor cores (dk a multiple of 16; rule_walk_kernel otherwise), the same chunk
// order, loads and outputs. The block's state S (dk, 32) lives in registers as the accumulators of
// the update's products (warp w: rows 16 w .. 16 w + 16, all 32 columns), fp32 throughout. Per
// chunk: S to sin (the backward's walk; the forward's writes o instead, kOut below) and, as bf16
// high and low halves, to shared memory; v_new = U - W S (W and S in halves: W_hi S_hi + W_hi S_lo
// + W_lo S_hi, a relative error ~2^-16 against fp32's 2^-24; -W's halves as the prep stored them,
// w_as_halves; warp w: a 16 x 16 tile), its rows scaled by exp(gamma_L - gamma_s) and split into
// halves in shared memory; then S <- exp(gamma_L) S + K^T (dec v_new) (k exact in bf16, two mma a
// tile).
constexpr int kWalkHalfStride = kWalkCols + 8;  // bf16 row stride of S's and v_new's halves (ldmatrix: no conflicts)
constexpr int kWalkUStride = kWalkCols + 8;     // fp32 row stride of the U stage (8 floats of padding)

// A walk's state tile in registers (the mma accumulators of rows row0 + gq (+8), columns 8 n + 2 tq
// (+1), n < 4) to shared memory as bf16 high and low halves (kWalkHalfStride), the B operand of the
// next products; with kBf16 (GdnProducts::kBf16) the high half only, S rounded to bf16.
template <bool kBf16 = false>
__device__ __forceinline__ void walk_state_to_halves(bf16* hi, bf16* lo, const float (&S)[4][4], int row0) {
  const int lane = threadIdx.x % detail::kWarp, gq = lane / 4, tq = lane % 4;
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int off = (row0 + gq + 8 * half) * kWalkHalfStride + 8 * n + 2 * tq;
      bf16_parts<kBf16>(S[n][2 * half], S[n][2 * half + 1], *reinterpret_cast<uint32_t*>(hi + off),
                        *reinterpret_cast<uint32_t*>(lo + off));
    }
}

// f(n, half, at) for each pair of a walk's state tile this thread holds (rows row0 + gq + 8 half,
// columns 8 n + 2 tq, +1: S[n][2 half] and S[n][2 half + 1], n < kCols / 8), at the pair's offset
// in a global (dk, dv) state from column j0.
template <int kCols = kWalkCols, class F>
__device__ __forceinline__ void walk_state_pairs(int row0, int dv, int j0, F&& f) {
  const int lane = threadIdx.x % detail::kWarp, gq = lane / 4, tq = lane % 4;
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) f(n, half, (int64_t)(row0 + gq + 8 * half) * dv + j0 + 8 * n + 2 * tq);
}

// One stage of the tensor-core walk, loaded by cp.async: -W's halves (two (64, dk + 8) bf16
// tiles, w_as_halves), keys (64, dk + 8) bf16, with kQ (the forward's walk that writes o) the
// queries (64, dk + 8) bf16 and the scores P (64, kPairStride) fp32, U columns (64, kWalkUStride)
// fp32, gam (64); rows past L zero. Padded strides: the fragment reads hit distinct banks (rows
// dk + 8 elements apart: an odd count of 16-byte units, dk a multiple of 16).
template <bool kQ>
struct WalkMmaStage {
  static constexpr int kTiles = kQ ? 4 : 3;  // bf16 row tiles: -W_hi, -W_lo, K (, Q)
  int rs;                                     // their row stride, dk + 8
  bf16 *Wh, *Wl, *K, *Q;
  float *P, *U;
  float* gam;
  __device__ WalkMmaStage(unsigned char* base, int dk) : rs(dk + 8) {
    Wh = reinterpret_cast<bf16*>(base);
    Wl = Wh + kGdnChunk * rs;
    K = Wl + kGdnChunk * rs;
    Q = K + kGdnChunk * rs;  // kQ only
    P = reinterpret_cast<float*>(Wh + kTiles * kGdnChunk * rs);
    U = P + (kQ ? kGdnChunk * kPairStride : 0);
    gam = U + kGdnChunk * kWalkUStride;
  }
  __host__ __device__ static constexpr size_t bytes(int dk) {
    return sizeof(bf16) * kTiles * kGdnChunk * (dk + 8) +
           sizeof(float) * ((kQ ? kGdnChunk * kPairStride : 0) + kGdnChunk * kWalkUStride + kGdnChunk);
  }
  __device__ const bf16* wh8(int r, int i) const { return Wh + r * rs + i; }  // 8 of -W_hi from (r, i)
  __device__ const bf16* wl8(int r, int i) const { return Wl + r * rs + i; }
  __device__ const bf16* k8(int s, int i) const { return K + s * rs + i; }  // 8 keys from (s, i)
  __device__ const bf16* q8(int s, int i) const { return Q + s * rs + i; }  // 8 queries from (s, i)
  __device__ float2 p2(int r, int s) const { return *reinterpret_cast<const float2*>(P + r * kPairStride + s); }
  // 8 of P_rs .. in bf16 from (r, s), s % 8 = 0, an ldmatrix row (GdnProducts::kBf16: P's tile
  // holds bf16 rows at kRowStride, the same bytes as fp32 rows at kPairStride)
  __device__ const bf16* pb8(int r, int s) const { return reinterpret_cast<const bf16*>(P) + r * kRowStride + s; }
  __device__ float u(int r, int c) const { return U[r * kWalkUStride + c]; }
};

// The offset (in elements of E bytes) of element c of row r in a tile of 128-byte rows written by
// TMA with the 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B): 16-byte unit u of row r sits at
// unit u ^ (r % 8), so eight rows' same unit fall on distinct banks.
template <int E>
__device__ __forceinline__ int swizzle128(int r, int c) {
  constexpr int kPer = 16 / E;
  return r * (128 / E) + (c / kPer ^ (r & 7)) * kPer + c % kPer;
}

// A packed bf16 pair of chunk rows s and s + 1 (low half first) with the halves of rows >= L zeroed.
// The TMA stages hold the tensors' next rows past a chunk's end: a product over the chunk's rows
// must not multiply them even by zero (a NaN or inf there, from another node, would leak in).
__device__ __forceinline__ uint32_t keep_rows_below(uint32_t x, int s, int L) {
  return s + 1 < L ? x : s < L ? (x & 0xffffu) : 0u;
}

// keep_rows_below on each register of an A fragment loaded by a transposing ldmatrix whose k runs
// along the chunk's rows from k0 (registers 2 and 3 eight rows on).
__device__ __forceinline__ void keep_fragment_rows_below(uint32_t (&x)[4], int k0, int L) {
  const int s = k0 + 2 * (threadIdx.x % 4);  // 2 tq
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = keep_rows_below(x[j], s + 8 * (j / 2), L);
}

// p rounded up to a 1024-byte shared-memory address (the 128-byte swizzle's alignment).
__device__ __forceinline__ unsigned char* align_up_1024(unsigned char* p) {
  return p + ((1024u - (attn::smem_addr(p) & 1023u)) & 1023u);
}

// The TMA descriptors of the walk's stage (dk = 128): -W's halves (two (N, nv, 128) bf16 planes),
// k and q (N, nk, 128) bf16 in boxes of 64 columns, U (N, nv, dv) fp32 in boxes of kWalkCols, 64
// rows a box; the scores P ((chunks nv 64, 1, 64) fp32, RuleParams::P) in boxes of 32 columns, or
// (GdnProducts::kBf16) bf16 in one box of 64.
struct WalkMaps {
  CUtensorMap Wh, Wl, K, Q, P, U, Tb, V;  // Tb, V: walk_computes_u (no U)
};

// A (64, 128) bf16 tile of rows r0 .. of a (N, heads, 128) tensor as two (64, 64) boxes, each
// 128-byte box row swizzled (swizzle128), onto bar (thread 0; the caller announces the bytes); and
// the place of 8 values (s, i .. i + 8) in it (i % 8 = 0). The walks' -W halves and keys.
__device__ __forceinline__ void tma_load_rows128(bf16* dst, const CUtensorMap* map, int head, int r0, uint64_t* bar) {
#pragma unroll
  for (int a = 0; a < 2; ++a) attn::sm90::tma_load_3d(dst + a * (kGdnChunk * 64), map, 64 * a, head, r0, bar);
}
__device__ __forceinline__ const bf16* tma_k8(const bf16* K, int s, int i) {
  return K + i / 64 * (kGdnChunk * 64) + swizzle128<2>(s, i % 64);
}

// One stage of the walk at dk = 128, loaded by TMA (one thread issues seven boxes, 56 KB; eleven,
// 88 KB, with kQ): -W's halves as two (64, 128) bf16 tiles, K as one and with kQ Q as one
// (tma_load_rows128) and the scores P as two (64, 32) fp32 boxes, U one (64, kWalkCols) fp32 box,
// each row 128 bytes, swizzled (swizzle128); gam (64) by cp.async, zero past L. Rows past L hold the
// rows that follow in the tensors (zeros past their end): the walk's products mask them. The bf16
// kernels load less into the same layout: no low half of -W, P as one (64, 64) bf16 box (five
// boxes, 40 KB; eight, 64 KB, with kQ).
template <bool kQ>
struct WalkTmaStage {
  static constexpr uint32_t kT = kGdnChunk * 128 * sizeof(bf16), kU = kGdnChunk * kWalkCols * sizeof(float),
                            kP = kQ ? kGdnChunk * kGdnChunk * sizeof(float) : 0, kTiles = kQ ? 4 : 3,
                            kTx = kTiles * kT + kP + kU;
  static constexpr size_t kBytes = kTx + 1024;  // + gam; stages stay 1024-byte aligned (the swizzle's)
  bf16 *Wh, *Wl, *K, *Q;
  float *P, *U;
  float* gam;
  __device__ WalkTmaStage(unsigned char* base, int /*dk: 128*/)
      : Wh(reinterpret_cast<bf16*>(base)), Wl(reinterpret_cast<bf16*>(base + kT)),
        K(reinterpret_cast<bf16*>(base + 2 * kT)), Q(reinterpret_cast<bf16*>(base + 3 * kT)),
        P(reinterpret_cast<float*>(base + kTiles * kT)), U(reinterpret_cast<float*>(base + kTiles * kT + kP)),
        gam(reinterpret_cast<float*>(base + kTx)) {}
  __host__ __device__ static constexpr size_t bytes(int) { return kBytes; }
  __device__ const bf16* wh8(int r, int i) const { return tma_k8(Wh, r, i); }
  __device__ const bf16* wl8(int r, int i) const { return tma_k8(Wl, r, i); }
  __device__ const bf16* k8(int s, int i) const { return tma_k8(K, s, i); }
  __device__ const bf16* q8(int s, int i) const { return tma_k8(Q, s, i); }
  __device__ float2 p2(int r, int s) const {  // (P_rs, P_r,s+1), s even: one 8-byte read in a 16-byte unit
    return *reinterpret_cast<const float2*>(P + s / 32 * (kGdnChunk * 32) + swizzle128<4>(r, s % 32));
  }
  // 8 of P_rs .. in bf16 from (r, s), s % 8 = 0, an ldmatrix row (GdnProducts::kBf16: one (64, 64) box)
  __device__ const bf16* pb8(int r, int s) const { return reinterpret_cast<const bf16*>(P) + swizzle128<2>(r, s); }
  __device__ float u(int r, int c) const { return U[swizzle128<4>(r, c)]; }
  // The bf16 kernels (walk_computes_u: U is not staged): T diag(beta) as one (64, 64) bf16 box in
  // the second half of P's tile (kQ) or in U's bytes, and 64 columns of v (the block's 32 among
  // them) as one box in -W's low half's tile.
  __device__ bf16* tb() const {
    return kQ ? reinterpret_cast<bf16*>(P) + kGdnChunk * kGdnChunk : reinterpret_cast<bf16*>(U);
  }
};

// Issues the stage of chunk ci (all threads: gam's cp.async; thread 0: the TMA boxes onto bar).
// kBf16 (GdnProducts::kBf16, walk_computes_u at dk 128): -W's high half only, the scores in bf16
// (half their fp32 tile), and T diag(beta) and v's columns instead of U (WalkTmaStage::tb, Wl).
template <bool kBf16, bool kQ, bool kUT>
__device__ __forceinline__ void walk_mma_prefetch(const WalkTmaStage<kQ>& st, uint64_t* bar, const RuleParams& p,
                                                  const WalkMaps& maps, const ChunkInfo& ci, int h, int kh, int j0) {
  namespace sm90 = attn::sm90;
  if (threadIdx.x == 0) {
    constexpr uint32_t kBox64 = kGdnChunk * 64 * sizeof(bf16);  // a (64, 64) bf16 box: Tb, v
    sm90::mbar_expect_tx(bar, WalkTmaStage<kQ>::kTx - (kBf16 ? WalkTmaStage<kQ>::kT + WalkTmaStage<kQ>::kP / 2 : 0) -
                                  (kUT ? WalkTmaStage<kQ>::kU - 2 * kBox64 : 0));
    tma_load_rows128(st.Wh, &maps.Wh, h, ci.r0, bar);
    if constexpr (!kBf16) tma_load_rows128(st.Wl, &maps.Wl, h, ci.r0, bar);
    tma_load_rows128(st.K, &maps.K, kh, ci.r0, bar);
    if constexpr (kQ) {
      tma_load_rows128(st.Q, &maps.Q, kh, ci.r0, bar);
      const int row = (ci.c * p.nv + h) * kGdnChunk;  // the chunk's scores: rows of (chunks nv 64, 64)
      if constexpr (kBf16) {
        sm90::tma_load_3d(st.P, &maps.P, 0, 0, row, bar);
      } else {
#pragma unroll
        for (int a = 0; a < 2; ++a) sm90::tma_load_3d(st.P + a * (kGdnChunk * 32), &maps.P, 32 * a, 0, row, bar);
      }
    }
    if constexpr (kUT) {
      sm90::tma_load_3d(st.tb(), &maps.Tb, 0, 0, (ci.c * p.nv + h) * kGdnChunk, bar);
      sm90::tma_load_3d(st.Wl, &maps.V, j0 & ~63, h, ci.r0, bar);
    } else {
      sm90::tma_load_3d(st.U, &maps.U, j0, h, ci.r0, bar);
    }
  }
  load_chunk_gam(st.gam, p.gam, p.nv, h, ci.r0, ci.L);
}
template <bool kBf16, bool kQ, bool kUT>
__device__ __forceinline__ void walk_mma_prefetch(const WalkMmaStage<kQ>& st, uint64_t*, const RuleParams& p,
                                                  const WalkMaps&, const ChunkInfo& ci, int h, int kh, int j0) {
  const int r0 = ci.r0, L = ci.L;
  const bf16* Wh = reinterpret_cast<const bf16*>(p.W) + (int64_t)h * p.dk;
  const int64_t plane = (int64_t)p.rows * p.nv * p.dk;
  load_chunk_rows(st.Wh, st.rs, Wh, (int64_t)p.nv * p.dk, r0, L, p.dk);
  if constexpr (!kBf16) load_chunk_rows(st.Wl, st.rs, Wh + plane, (int64_t)p.nv * p.dk, r0, L, p.dk);
  load_chunk_rows(st.K, st.rs, p.k + (int64_t)kh * p.dk, (int64_t)p.nk * p.dk, r0, L, p.dk);
  if constexpr (kQ) {
    load_chunk_rows(st.Q, st.rs, p.q + (int64_t)kh * p.dk, (int64_t)p.nk * p.dk, r0, L, p.dk);
    const int64_t at = ((int64_t)ci.c * p.nv + h) * kGdnChunk * kGdnChunk;
    if constexpr (kBf16)
      load_chunk_rows(reinterpret_cast<bf16*>(st.P), kRowStride, p_bf16(p.P) + at, kGdnChunk, 0, kGdnChunk, kGdnChunk);
    else
      load_chunk_rows(st.P, kPairStride, p.P + at, kGdnChunk, 0, kGdnChunk, kGdnChunk);
  }
  load_chunk_rows_fixed<kWalkCols>(st.U, kWalkUStride, p.U + (int64_t)h * p.dv + j0, (int64_t)p.nv * p.dv, r0, L);
  load_chunk_gam(st.gam, p.gam, p.nv, h, r0, L);
}

constexpr int kWalkVsStride = kWalkCols + 4;  // fp32 row stride of the forward walk's v_new (B fragments on distinct banks)

// kDk: the key head dim when known at compile time (128, Qwen3-Next's and Qwen3.5's: the
// products' k-loops unroll and the stages arrive by TMA, WalkTmaStage), else 0 (p.dk; WalkMmaStage).
// kOut: the forward's walk, which writes o itself and neither sin nor v_new (rule_out_kernel's
// products on the tiles the walk holds: o_r = scale (e^(gam_r) q_r^T S_in + sum_{s <= r} P_rs
// v_new_s), q S_in from S's halves as v_new's W S is, P v_new with the prep's scores P
// (chunk_scores, staged with the chunk) and v_new split into three bf16 parts: the same products,
// P v_new's smallest three summed apart; warp w the rows and columns of its v_new tile).
// Without it, the backward's walk: sin and v_new to global memory for the kernels after it.
// Shared memory: two stages, then S's and dec v_new's halves, then (kOut) v_new.
// kBf16 (GdnProducts::kBf16): every product one mma of bf16 operands, as FLA's and FlashQLA's
// kernels: -W's high half, S, dec v_new, P and v_new rounded to bf16 (q and k are bf16 already);
// fp32 accumulators and state. The low halves are neither loaded nor stored.
// Where the walks take U themselves (walk_computes_u) they run on warpgroup MMA instead
// (rule_walk_wgmma_kernel).
template <int kDk, bool kOut, bool kBf16 = false>
__global__ void __launch_bounds__(kRuleThreads) rule_walk_mma_kernel(RuleParams p, const __grid_constant__ WalkMaps maps) {
  TT_EXTERN_SMEM_16(smem_raw);
  __shared__ uint64_t bars[2];  // the stages' TMA barriers (kDk = 128)
  using Stage = std::conditional_t<kDk == 128, WalkTmaStage<kOut>, WalkMmaStage<kOut>>;
  constexpr int HS = kWalkHalfStride, kUnroll = kDk > 0 ? kDk / 16 : 2;
  const int h = blockIdx.x, j0 = blockIdx.y * kWalkCols, kh = h / (p.nv / p.nk), dk = kDk > 0 ? kDk : p.dk,
            dv = p.dv;
  unsigned char* stages = align_up_1024(smem_raw);  // two Stages
  const size_t stage_bytes = Stage::bytes(dk);
  auto stage = [&](int i) { return Stage(stages + i * stage_bytes, dk); };
  bf16* Sh = reinterpret_cast<bf16*>(stages + 2 * stage_bytes);  // (128, HS) S's halves
  bf16* Sl = Sh + 128 * HS;
  bf16* Vh = Sl + 128 * HS;                  // (64, HS) dec v_new's halves
  bf16* Vl = Vh + kGdnChunk * HS;
  float* Vs = reinterpret_cast<float*>(Vl + kGdnChunk * HS);  // kOut: (64, kWalkVsStride) v_new, zero past L
  bf16* Vb = reinterpret_cast<bf16*>(Vs);  // kOut with kBf16: v_new in bf16 (64, HS) in Vs's bytes
  const int64_t SS = (int64_t)dk * dv;
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
  const int si = 16 * warp;           // this warp's state rows si .. si + 16 (none when si >= dk)
  const bool has_rows = si < dk;
  // This warp's v_new (and o) tile: rows vm, columns vn. With kOut the rows of warps w and w + 4
  // (one scheduler's pair) are blocks summing to 3, so each scheduler carries the same count of P's
  // nonzero blocks in P v_new.
  const int vm = 16 * (kOut ? (warp < 4 ? warp : 7 - warp) : warp % 4), vn = 16 * (warp / 4);
  // S[n][e]: rows si + gq (e 0, 1) and si + gq + 8 (e 2, 3), columns 8 n + 2 tq (+1).
  float S[4][4] = {};
  auto state_io = [&](float* dst, const float* src) {  // S -> dst or src -> S (global rows of dv floats)
    if (!has_rows) return;
    walk_state_pairs(si, dv, j0, [&](int n, int half, int64_t at) {
      if (dst) {
        *reinterpret_cast<float2*>(dst + at) = make_float2(S[n][2 * half], S[n][2 * half + 1]);
      } else {
        const float2 x = src ? *reinterpret_cast<const float2*>(src + at) : make_float2(0.f, 0.f);
        S[n][2 * half] = x.x, S[n][2 * half + 1] = x.y;
      }
    });
  };
  if (kDk == 128) init_stage_barriers(bars);
  __syncthreads();
  const int nc = p.num_chunks;
  ChunkCursor<false> chunks(p.plan, nc);
  if (nc > 0) walk_mma_prefetch<kBf16, kOut, false>(stage(0), &bars[0], p, maps, chunks.cur, h, kh, j0);
  attn::cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    if (c + 1 < nc)
      walk_mma_prefetch<kBf16, kOut, false>(stage((c + 1) & 1), &bars[(c + 1) & 1], p, maps, chunks.nxt, h, kh, j0);
    attn::cp_async_commit();
    const Stage st = stage(c & 1);
    const ChunkInfo ci = chunks.take(c);
    const int n = ci.node, flags = ci.flags, r0 = ci.r0, L = ci.L;
    if (flags & 1) {
      const float* src = node_link<const float>(p.plan, n, h, p.nv, SS, p.node_end, p.init);
      state_io(nullptr, src);
    }
    if constexpr (!kOut)  // the entering state (with kBf16 as the bf16 state products round it)
      if (has_rows)
        walk_state_pairs(si, dv, j0, [&](int n, int half, int64_t at) {
          store_pair<kBf16>(p.sin, ((int64_t)c * p.nv + h) * SS + at, S[n][2 * half], S[n][2 * half + 1]);
        });
    if (has_rows) walk_state_to_halves<kBf16>(Sh, Sl, S, si);
    if constexpr (kDk == 128) attn::sm90::mbar_wait(&bars[c & 1], (c >> 1) & 1);
    attn::cp_async_wait<1>();
    __syncthreads();  // the stage has landed; S's halves are stored
    const float gl = st.gam[L - 1];
    // q S_in (kOut): rows vm .., columns vn .., from the same S halves as W S, q exact in bf16.
    float qs[2][4] = {};
    {  // v_new (rows vm .., columns vn ..) = U - W S, then dec v_new's halves
      // acc: U plus the small products (W_hi S_lo, W_lo S_hi); big: W_hi S_hi. Two accumulators a
      // tile: two dependent mma a k-step instead of three.
      float acc[2][4], big[2][4] = {};
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nn][e] = st.u(vm + gq + 8 * (e / 2), vn + 8 * nn + 2 * tq + e % 2);
#pragma unroll kUnroll
      for (int k0 = 0; k0 < dk; k0 += 16) {
        uint32_t wh[4], wl[4], bh[4], bl[4];  // A = -W: the prep's halves
        mma::ldsm_x4(wh, st.wh8(vm + lane % 8 + 8 * (lane / 8 % 2), k0 + 8 * (lane / 16)));
        if constexpr (!kBf16) mma::ldsm_x4(wl, st.wl8(vm + lane % 8 + 8 * (lane / 8 % 2), k0 + 8 * (lane / 16)));
        const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * HS + vn + 8 * (lane / 16);
        mma::ldsm_x4_trans(bh, Sh + off);
        if constexpr (!kBf16) mma::ldsm_x4_trans(bl, Sl + off);
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          mma::mma_16816(big[nn], wh, bh[2 * nn], bh[2 * nn + 1]);
          if constexpr (!kBf16) {
            mma::mma_16816(acc[nn], wh, bl[2 * nn], bl[2 * nn + 1]);
            mma::mma_16816(acc[nn], wl, bh[2 * nn], bh[2 * nn + 1]);
          }
        }
        if constexpr (kOut) {
          uint32_t qa[4];
          mma::ldsm_x4(qa, st.q8(vm + lane % 8 + 8 * (lane / 8 % 2), k0 + 8 * (lane / 16)));
#pragma unroll
          for (int nn = 0; nn < 2; ++nn) {
            mma::mma_16816(qs[nn], qa, bh[2 * nn], bh[2 * nn + 1]);
            if constexpr (!kBf16) mma::mma_16816(qs[nn], qa, bl[2 * nn], bl[2 * nn + 1]);
          }
        }
      }
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nn][e] += big[nn][e];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = vm + gq + 8 * half;
        const float d = r < L ? __expf(gl - st.gam[r]) : 0.f;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          const int col = vn + 8 * nn + 2 * tq;
          const float v0 = acc[nn][2 * half], v1 = acc[nn][2 * half + 1];  // rows past L: not this chunk's
          if constexpr (kOut && kBf16)  // v_new as P v_new's bf16 operand rounds it
            *reinterpret_cast<uint32_t*>(Vb + r * HS + col) = r < L ? attn::pack_bf16x2(v0, v1) : 0u;
          else if constexpr (kOut)
            *reinterpret_cast<float2*>(Vs + r * kWalkVsStride + col) = r < L ? make_float2(v0, v1) : make_float2(0.f, 0.f);
          else if (r < L)  // with kBf16 as the bf16 state and gradient products round it
            store_pair<kBf16>(p.vnew, ((int64_t)(r0 + r) * p.nv + h) * dv + j0 + col, v0, v1);
          bf16_parts<kBf16>(r < L ? d * v0 : 0.f, r < L ? d * v1 : 0.f, *reinterpret_cast<uint32_t*>(Vh + r * HS + col),
                            *reinterpret_cast<uint32_t*>(Vl + r * HS + col));
        }
      }
    }
    __syncthreads();  // dec v_new's halves are stored (and with kOut, v_new)
    if (has_rows) {  // S <- exp(gamma_L) S + K^T (dec v_new): rows si .., all 32 columns
      const float el = __expf(gl);
#pragma unroll
      for (int nn = 0; nn < 4; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nn][e] *= el;
#pragma unroll
      for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {
        uint32_t a[4];  // A (i, s) = K (s, i): transposing loads of the key rows
        mma::ldsm_x4_trans(a, st.k8(k0 + lane % 8 + 8 * (lane / 16), si + 8 * (lane / 8 % 2)));
        if (kDk == 128 && k0 + 16 > L)  // keys past L: the next rows of k under TMA; 0 x NaN must not reach S
          keep_fragment_rows_below(a, k0, L);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * HS + 16 * np + 8 * (lane / 16);
          uint32_t bh[4], bl[4];
          mma::ldsm_x4_trans(bh, Vh + off);
          if constexpr (!kBf16) mma::ldsm_x4_trans(bl, Vl + off);
          mma::mma_16816(S[2 * np], a, bh[0], bh[1]);
          mma::mma_16816(S[2 * np + 1], a, bh[2], bh[3]);
          if constexpr (!kBf16) {
            mma::mma_16816(S[2 * np], a, bl[0], bl[1]);
            mma::mma_16816(S[2 * np + 1], a, bl[2], bl[3]);
          }
        }
      }
    }
    if constexpr (kOut) {  // o (rows vm .., columns vn ..) = scale (e^(gam) q S_in + P v_new), as rule_out_kernel
      const float e0 = __expf(st.gam[vm + gq]), e1 = __expf(st.gam[vm + gq + 8]);
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) qs[nn][0] *= e0, qs[nn][1] *= e0, qs[nn][2] *= e1, qs[nn][3] *= e1;
      float small[2][4] = {};  // the three products of order 2^-16 of a term: a second chain, half as deep
      for (int k0 = 0; k0 <= vm; k0 += 16) {  // P is zero right of the diagonal block
        if constexpr (kBf16) {
          uint32_t pa[4], vb[4];  // A (r, s) = P_rs as the prep rounded it; B (s, j) = v_new[s][j] in bf16
          mma::ldsm_x4(pa, st.pb8(vm + lane % 8 + 8 * (lane / 8 % 2), k0 + 8 * (lane / 16)));
          mma::ldsm_x4_trans(vb, Vb + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * HS + vn + 8 * (lane / 16));
          mma::mma_16816(qs[0], pa, vb[0], vb[1]);
          mma::mma_16816(qs[1], pa, vb[2], vb[3]);
        } else {
          uint32_t ph[4], pm[4], pl[4];
          split3_a_fragment(ph, pm, pl, vm, k0, [&](int r, int s) { return st.p2(r, s); });
#pragma unroll
          for (int nn = 0; nn < 2; ++nn)  // B (s, j) = v_new[s][j], columns vn + 8 nn ..
            mma_split3_both(small[nn], qs[nn], ph, pm, pl, Vs + (k0 + 2 * tq) * kWalkVsStride + vn + 8 * nn + gq,
                            kWalkVsStride);
        }
      }
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) qs[nn][e] += small[nn][e];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = vm + gq + 8 * half;
        if (r >= L) continue;
        bf16* orow = p.o + ((int64_t)(r0 + r) * p.nv + h) * dv + j0 + vn;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
          *reinterpret_cast<__nv_bfloat162*>(orow + 8 * nn + 2 * tq) =
              __floats2bfloat162_rn(p.scale * qs[nn][2 * half], p.scale * qs[nn][2 * half + 1]);
      }
    }
    if (flags & 2) state_io(p.node_end + ((int64_t)n * p.nv + h) * SS, nullptr);
    __syncthreads();  // every warp is done with this stage (the next prefetch refills it), the halves and v_new
  }
  attn::cp_async_wait<0>();
}

size_t walk_mma_smem_bytes(int dk, bool out) {
  const size_t stage = dk == 128 ? (out ? WalkTmaStage<true>::kBytes : WalkTmaStage<false>::kBytes)
                                 : (out ? WalkMmaStage<true>::bytes(dk) : WalkMmaStage<false>::bytes(dk));
  return 1024 + 2 * stage + sizeof(bf16) * (2 * 128 + 2 * kGdnChunk) * kWalkHalfStride +  // + the alignment's slack
         (out ? sizeof(float) * kGdnChunk * kWalkVsStride : 0);
}

// rule_walk_wgmma_kernel's v_new = T diag(beta) v + (-W) S for N columns (a warpgroup, m64nNk16),
// in two groups: walk_tv_wgmma issues the T diag(beta) v part (v's columns from v_col of the
// stage's 64-column box; it does not depend on S) and commits it, walk_ws_wgmma adds (-W) S (S's
// columns from the MN-major descriptor s), commits and waits for both.
template <int N, bool kQ>
__device__ __forceinline__ void walk_tv_wgmma(float (&acc)[N / 2], const WalkTmaStage<kQ>& st, int v_col) {
  namespace sm90 = attn::sm90;
  sm90::wgmma_fence();
  const uint64_t tb = sm90::desc_kmajor<kGdnChunk>(st.tb(), 0), vv = sm90::desc_mnmajor<kGdnChunk>(st.Wl, v_col);
#pragma unroll
  for (int kk = 0; kk < kGdnChunk / 16; ++kk)
    sm90::Wgmma<N>::template ss<0, 1>(acc, sm90::desc_add(tb, sm90::kmajor_step<kGdnChunk>(kk)),
                                      sm90::desc_add(vv, kk * sm90::kMnStep), true);
  sm90::wgmma_commit();
}
template <int N, bool kQ>
__device__ __forceinline__ void walk_ws_wgmma(float (&acc)[N / 2], const WalkTmaStage<kQ>& st, uint64_t s) {
  namespace sm90 = attn::sm90;
  sm90::wgmma_fence();
  const uint64_t w = sm90::desc_kmajor<kGdnChunk>(st.Wh, 0);
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk)
    sm90::Wgmma<N>::template ss<0, 1>(acc, sm90::desc_add(w, sm90::kmajor_step<kGdnChunk>(kk)),
                                      sm90::desc_add(s, kk * sm90::kMnStep), true);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_regs(acc);
}

// Zeroes rows L .. of `boxes` consecutive (64, 64) bf16 TMA boxes from `box`, 16-byte units by
// thread t of n: rows past a chunk's end hold the next node's rows, and 0 x NaN must not reach a
// product.
__device__ __forceinline__ void zero_box_rows(bf16* box, int boxes, int L, int t, int n) {
  const int units = 8 * boxes;
  for (int e = t; e < (kGdnChunk - L) * units; e += n) {
    const int r = L + e / units, u = e % units;
    *reinterpret_cast<uint4*>(box + u / 8 * (kGdnChunk * 64) + r * 64 + u % 8 * 8) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// f(r, col, d, v0, v1) for this thread's pairs of a warpgroup's v_new accumulator of N columns
// (rows row, row + 8; columns col0 + 8 nn + 2 tq, + 1), d = exp(gamma_L - gamma_r) (gl = gamma_L),
// 0 past L, where v0 and v1 are not the chunk's.
template <int N, class F>
__device__ __forceinline__ void vnew_pairs(const float (&acc)[N / 2], int row, int col0, const float* gam, float gl,
                                           int L, F&& f) {
  const int tq = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    const float d = r < L ? __expf(gl - gam[r]) : 0.f;
#pragma unroll
    for (int nn = 0; nn < N / 8; ++nn) f(r, col0 + 8 * nn + 2 * tq, d, acc[4 * nn + 2 * half], acc[4 * nn + 2 * half + 1]);
  }
}

// The bf16 walk at dk 128 where it takes U itself (walk_computes_u), on warpgroup MMA
// (wgmma.mma_async m64nNk16, N = kCols, fp32 accumulators in registers, operands in 128-byte-swizzled
// shared memory: ops/cuda/wgmma_desc.cuh). The same products and roundings as
// rule_walk_mma_kernel<128, true, true> (S, dec v_new and v_new rounded to bf16; -W, T diag(beta),
// P, q, k and v bf16 as stored), each a handful of warpgroup MMAs instead of a warp's dozens of
// mma.sync with their fragment loads. Two warpgroups, one block per (value head, kCols = 32 or 64
// state columns, path: a lane of the launch's level of paths, walk_path, bf16_walk_grid), the same
// TMA stages (WalkTmaStage<true>, walk_mma_prefetch; v's box is 64 columns wide either way). The
// path's chunks in order, a node's first chunk loading its parent's end state (node_link: on this
// path, or on a path of a lower level, walked by an earlier launch). A chunk, with kOut (the
// forward's walk, which writes o):
//   0. S's tile (128 x kCols bf16, MN-major: the B operand of W S and q S) holds the entering state:
//      written at the end of the chunk before, or here where the chunk loads its node's state.
//      Once the stage lands, warpgroup 0 zeroes v's rows past L and issues T diag(beta) v (4 MMAs,
//      independent of S; its own named barrier first), warpgroup 1 zeroes k's rows past L (they
//      hold the next node's rows, and 0 x NaN must not reach U or S). Barrier A.
//   1. warpgroup 0: v_new += (-W) S (8); v_new and its rows scaled by exp(gamma_L - gamma_s) to two
//      bf16 tiles (B operands; zero past L). Warpgroup 1: q S (8), and while it runs, the chunk
//      before's o to global memory. Barrier B.
//   2. warpgroup g: S rows 64 g .. <- exp(gamma_L) S + (K^T)[64 g ..] (dec v_new) (4 MMAs, A
//      MN-major from k's tile), then its rows of the next chunk's S tile; warpgroup 1 also P v_new
//      (4, a second group) into o, stored in the next chunk's step 1.
// The next chunk's stage is issued at the chunk's start, and a block barrier ends the chunk (issued
// after barrier A instead, with no barrier at the end, the forward measured 2% slower).
// S stays in registers (kCols / 2 floats a thread, a warpgroup's accumulator layout, which is the
// mma.sync walk's: walk_state_pairs at row 16 warp).
// Without kOut, the backward's walk again: no q, P or o; the entering state to S's tile and sin
// (bf16) at the chunk's start, the next stage issued; once it lands, the rows past L zeroed, a block
// barrier, and warpgroup g forms v_new's columns kCols / 2 g .. (m64n(kCols / 2)k16: both warpgroups on the chain;
// with one warpgroup's it measured 12% slower than the mma.sync walk, with both 13% faster), to
// v_new (bf16) and dec v_new's tile; barrier; the state update as step 2; a block barrier at the end.
// (The forward's order, with the stage issued after the first barrier and no barrier at the end,
// measured 24% slower here; T diag(beta) v issued before the first barrier, 11% slower again.)
template <bool kOut = true, int kCols = kWalkCols>
__global__ void __launch_bounds__(kRuleThreads, 1) rule_walk_wgmma_kernel(RuleParams p,
                                                                         const __grid_constant__ WalkMaps maps) {
  namespace sm90 = attn::sm90;
  using Stage = WalkTmaStage<kOut>;
  using Mma = sm90::Wgmma<kCols>;
  static_assert(kCols == 32 || kCols == 64, "a walking block takes 32 or 64 state columns");
  constexpr int kAcc = kCols / 2;  // a warpgroup accumulator of kCols columns: floats a thread
  TT_EXTERN_SMEM_16(smem_raw);
  __shared__ uint64_t bars[2];  // the stages' TMA barriers
  const int h = blockIdx.x, j0 = blockIdx.y * kCols, kh = h / (p.nv / p.nk), dv = p.dv;
  unsigned char* stages = align_up_1024(smem_raw);  // two Stages, then the operand tiles (1024-byte multiples)
  auto stage = [&](int i) { return Stage(stages + i * Stage::kBytes, 128); };
  bf16* Ss = reinterpret_cast<bf16*>(stages + 2 * Stage::kBytes);  // (128, 64) bf16(S) in columns 0 .. kCols
  bf16* Vd = Ss + 128 * 64;                                        // (64, 64) dec v_new in columns 0 .. kCols
  bf16* Vb = Vd + kGdnChunk * 64;                                  // (64, 64) v_new in columns 0 .. kCols
  const int64_t SS = (int64_t)128 * dv;
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, wg = warp / 4, gq = lane / 4,
            tq = lane % 4;
  const int row = 16 * (warp % 4) + gq;  // this thread's accumulator rows of a 64-row product: row, row + 8
  const uint64_t s_desc = sm90::desc_mnmajor<128>(Ss, 0), vd_desc = sm90::desc_mnmajor<kGdnChunk>(Vd, 0),
                 vb_desc = kOut ? sm90::desc_mnmajor<kGdnChunk>(Vb, 0) : 0;
  // S[4 n + 2 half + e]: state row 16 warp + gq + 8 half, column 8 n + 2 tq + e.
  float S[kAcc] = {};
  auto state_io = [&](float* dst, const float* src) {  // S -> dst or src -> S (global rows of dv floats)
    walk_state_pairs<kCols>(16 * warp, dv, j0, [&](int n, int half, int64_t at) {
      float* x = S + 4 * n + 2 * half;
      if (dst) {
        *reinterpret_cast<float2*>(dst + at) = make_float2(x[0], x[1]);
      } else {
        const float2 y = src ? *reinterpret_cast<const float2*>(src + at) : make_float2(0.f, 0.f);
        x[0] = y.x, x[1] = y.y;
      }
    });
  };
  auto state_tile = [&](int c) {  // S -> its rows of S's tile (bf16); without kOut, also chunk c's sin
    walk_state_pairs<kCols>(16 * warp, dv, j0, [&](int nn, int half, int64_t at) {
      const float* x = S + 4 * nn + 2 * half;
      if constexpr (!kOut)  // the entering state, as the bf16 state products round it
        store_pair<true>(p.sin, ((int64_t)c * p.nv + h) * SS + at, x[0], x[1]);
      *reinterpret_cast<uint32_t*>(Ss + sm90::sw_offset<128>(16 * warp + gq + 8 * half, 8 * nn + 2 * tq)) =
          attn::pack_bf16x2(x[0], x[1]);
    });
  };
  // kOut, warpgroup 1: the chunk before's o (rows row, row + 8 of o_r0 ..), stored in the next step
  float o[kAcc] = {};
  int o_r0 = 0, o_L = 0;
  auto store_o = [&]() {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row + 8 * half;
      if (r >= o_L) continue;
      bf16* orow = p.o + ((int64_t)(o_r0 + r) * p.nv + h) * dv + j0;
#pragma unroll
      for (int nn = 0; nn < kCols / 8; ++nn)
        *reinterpret_cast<__nv_bfloat162*>(orow + 8 * nn + 2 * tq) =
            __floats2bfloat162_rn(p.scale * o[4 * nn + 2 * half], p.scale * o[4 * nn + 2 * half + 1]);
    }
  };
  init_stage_barriers(bars);
  __syncthreads();
  const WalkRun mine = walk_path(p.plan, p.path0);
  const int nc = mine.nc;  // c below: a position in this block's path, ci.c the chunk's index
  ChunkCursor<false> chunks(p.plan, nc, mine.c0);
  if (nc > 0) walk_mma_prefetch<true, kOut, true>(stage(0), &bars[0], p, maps, chunks.cur, h, kh, j0);
  attn::cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    if (c + 1 < nc)
      walk_mma_prefetch<true, kOut, true>(stage((c + 1) & 1), &bars[(c + 1) & 1], p, maps, chunks.nxt, h, kh, j0);
    attn::cp_async_commit();
    const Stage st = stage(c & 1);
    const ChunkInfo ci = chunks.take(c);  // chunks.cur: chunk c + 1's
    const int n = ci.node, flags = ci.flags, r0 = ci.r0, L = ci.L;
    if (flags & 1) {
      const float* src = node_link<const float>(p.plan, n, h, p.nv, SS, p.node_end, p.init);
      state_io(nullptr, src);
    }
    // S's tile: with kOut written at the end of chunk c - 1 unless chunk c loads its node's state
    if (!kOut || c == 0 || (flags & 1)) state_tile(ci.c);
    sm90::mbar_wait(&bars[c & 1], (c >> 1) & 1);
    attn::cp_async_wait<1>();
    float gl, qs[kAcc] = {};  // qs, warpgroup 1: q S (rows row, row + 8), then o
    if constexpr (kOut) {
      if (wg == 0) {
        float acc[kAcc] = {};  // v_new (rows row, row + 8); v's box: the block's kCols of 64 columns
        if (L < kGdnChunk) zero_box_rows(st.Wl, 1, L, threadIdx.x, 128);  // v's rows past L
        sm90::fence_async_smem();
        sm90::named_barrier(1, 128);  // warpgroup 0's rows of v are zeroed
        walk_tv_wgmma<kCols>(acc, st, j0 & 63);
        sm90::named_barrier(2, kRuleThreads);  // A: S's tile, k's rows
        gl = st.gam[L - 1];
        walk_ws_wgmma<kCols>(acc, st, s_desc);
        vnew_pairs<kCols>(acc, row, 0, st.gam, gl, L, [&](int r, int col, float d, float v0, float v1) {
          // v_new as P v_new's bf16 operand rounds it
          *reinterpret_cast<uint32_t*>(Vb + sm90::sw_offset<kGdnChunk>(r, col)) =
              r < L ? attn::pack_bf16x2(v0, v1) : 0u;
          *reinterpret_cast<uint32_t*>(Vd + sm90::sw_offset<kGdnChunk>(r, col)) =
              r < L ? attn::pack_bf16x2(d * v0, d * v1) : 0u;
        });
      } else {
        if (L < kGdnChunk) zero_box_rows(st.K, 2, L, threadIdx.x - 128, 128);  // k's rows past L
        sm90::fence_async_smem();
        sm90::named_barrier(2, kRuleThreads);  // A
        gl = st.gam[L - 1];
        sm90::wgmma_fence();
        const uint64_t q = sm90::desc_kmajor<kGdnChunk>(st.Q, 0);
#pragma unroll
        for (int kk = 0; kk < 128 / 16; ++kk)
          Mma::template ss<0, 1>(qs, sm90::desc_add(q, sm90::kmajor_step<kGdnChunk>(kk)),
                                 sm90::desc_add(s_desc, kk * sm90::kMnStep), kk > 0);
        sm90::wgmma_commit();
        if (c > 0) store_o();  // the chunk before's, while q S runs
        sm90::wgmma_wait<0>();
        sm90::fence_regs(qs);
      }
    } else {  // warpgroup g: v_new's columns kCols / 2 g .., to global memory and dec v_new's tile
      if (L < kGdnChunk) {  // k's and v's rows past L
        zero_box_rows(st.K, 2, L, threadIdx.x, kRuleThreads);
        zero_box_rows(st.Wl, 1, L, threadIdx.x, kRuleThreads);
      }
      sm90::fence_async_smem();  // S's tile and the zeroed rows, before the MMAs read them
      __syncthreads();
      gl = st.gam[L - 1];
      constexpr int kHalf = kCols / 2;
      float acc[kHalf / 2] = {};
      walk_tv_wgmma<kHalf>(acc, st, (j0 & 63) + kHalf * wg);
      walk_ws_wgmma<kHalf>(acc, st, sm90::desc_mnmajor<128>(Ss, kHalf * wg));
      vnew_pairs<kHalf>(acc, row, kHalf * wg, st.gam, gl, L, [&](int r, int col, float d, float v0, float v1) {
        if (r < L)  // as the bf16 state and gradient products round it
          store_pair<true>(p.vnew, ((int64_t)(r0 + r) * p.nv + h) * dv + j0 + col, v0, v1);
        *reinterpret_cast<uint32_t*>(Vd + sm90::sw_offset<kGdnChunk>(r, col)) =
            r < L ? attn::pack_bf16x2(d * v0, d * v1) : 0u;
      });
    }
    sm90::fence_async_smem();  // v_new's tiles
    __syncthreads();           // B: ... are stored; every read of S's tile is done
    const float el = __expf(gl);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) S[i] *= el;
    const uint64_t kt = sm90::desc_mnmajor<kGdnChunk>(st.K, 64 * wg);  // A (i, s) = k (s, i), rows 64 wg ..
    auto update = [&]() {
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kGdnChunk / 16; ++kk)
        Mma::template ss<1, 1>(S, sm90::desc_add(kt, kk * sm90::kMnStep),
                               sm90::desc_add(vd_desc, kk * sm90::kMnStep), true);
      sm90::wgmma_commit();
    };
    if (kOut && wg == 1) {  // o = scale (e^(gam) q S + P v_new), a second group, stored in the next chunk's step
      update();
      const float e0 = __expf(st.gam[row]), e1 = __expf(st.gam[row + 8]);
#pragma unroll
      for (int nn = 0; nn < kCols / 8; ++nn)
        qs[4 * nn] *= e0, qs[4 * nn + 1] *= e0, qs[4 * nn + 2] *= e1, qs[4 * nn + 3] *= e1;
      sm90::wgmma_fence();
      const uint64_t pd = sm90::desc_kmajor<kGdnChunk>(reinterpret_cast<const bf16*>(st.P), 0);
#pragma unroll
      for (int kk = 0; kk < kGdnChunk / 16; ++kk)
        Mma::template ss<0, 1>(qs, sm90::desc_add(pd, sm90::kmajor_step<kGdnChunk>(kk)),
                               sm90::desc_add(vb_desc, kk * sm90::kMnStep), true);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    } else {
      update();
      sm90::wgmma_wait<0>();
    }
    sm90::fence_regs(S);
    if constexpr (kOut) {  // every read of S's tile was before barrier B
      if (c + 1 < nc && !(chunks.cur.flags & 1)) state_tile(chunks.cur.c);
    }
    if (flags & 2) state_io(p.node_end + ((int64_t)n * p.nv + h) * SS, nullptr);
    if (kOut && wg == 1) {
      sm90::fence_regs(qs);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) o[i] = qs[i];
      o_r0 = r0, o_L = L;
    }
    __syncthreads();  // every warpgroup is done with this stage (the next prefetch refills it)
  }
  if (kOut && wg == 1 && nc > 0) store_o();
  attn::cp_async_wait<0>();
}

size_t walk_wgmma_smem_bytes(bool out) {
  const size_t stage = out ? WalkTmaStage<true>::kBytes : WalkTmaStage<false>::kBytes;
  return 1024 + 2 * stage + sizeof(bf16) * (128 * 64 + kGdnChunk * 64 * (out ? 2 : 1));  // + the alignment's slack
}

constexpr int kOutCols = 64;  // output columns per block
constexpr int kStateStride = kOutCols + 8;  // bf16 row stride of the state's halves (ldmatrix rows apart in banks)
constexpr int kVsStride = kOutCols + 4;     // fp32 row stride of v_new's columns (B fragment reads on distinct banks)

// Per (chunk, value head, 64 output columns): o_r = scale (exp(gamma_r) q_r^T S_in + sum_{s <= r}
// (q_r . k_s) exp(gamma_r - gamma_s) v_new_s). q S_in on tensor cores: the fp32 state split into
// bf16 halves, S = S_hi + S_lo (S_hi = bf16(S), S_lo = bf16(S - S_hi): 16 significant bits, a
// relative error under 2^-16 against fp32's 2^-24, far below o's bf16 rounding), q exact in bf16,
// so q S = q S_hi + q S_lo, two mma a tile in fp32.
// The forward's outputs where its walk does not write them (!walk_writes_outputs(dk): dk not a
// multiple of 16, the CUDA-core walk, which stores sin and v_new for this kernel).
__global__ void __launch_bounds__(kRuleThreads, 2) rule_out_kernel(RuleParams p) {
  TT_EXTERN_SMEM_16(smem);
  const ChunkPart cp = chunk_part((p.dv + kOutCols - 1) / kOutCols);
  const int c = cp.c, h = cp.h, j0 = cp.z * kOutCols, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c], cols = min(kOutCols, dv - j0);
  const int dk16 = (dk + 15) / 16 * 16;  // the products' depth: q's columns and S's rows past dk are zero
  bf16* Qb = reinterpret_cast<bf16*>(smem);                          // (64, kRowStride)
  bf16* Kb = Qb + kGdnChunk * kRowStride;                            // (64, kRowStride); then q S (64, 64) fp32
  float* P = reinterpret_cast<float*>(Kb + kGdnChunk * kRowStride);  // (64, kPairStride)
  float* gam = P + kGdnChunk * kPairStride;                          // (64)
  bf16* Sh = reinterpret_cast<bf16*>(gam + kGdnChunk);               // (dk16, kStateStride) S_in's columns, high
  bf16* Sl = Sh + 128 * kStateStride;                                // (dk16, kStateStride) and low halves
  float* Vs = reinterpret_cast<float*>(Sl + 128 * kStateStride);     // (64, kVsStride) v_new's columns
  load_chunk_rows(Qb, kRowStride, p.q + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
  load_chunk_rows(Kb, kRowStride, p.k + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
  load_chunk_gam(gam, p.gam, p.nv, h, r0, L);
  load_chunk_rows(Vs, kVsStride, p.vnew + (int64_t)h * dv + j0, (int64_t)p.nv * dv, r0, L, cols);
  attn::cp_async_commit();
  {  // S_in's columns j0 .. j0 + cols as bf16 halves (zero past dk and cols), q's columns dk .. dk16 zero
    // Every thread's loads (eight float4, rows up to 128 = the largest dk, kRuleThreads threads)
    // issued before any is used: one round trip to memory, not one per row group.
    const float* src = p.sin + ((int64_t)c * p.nv + h) * dk * dv + j0;
    constexpr int kQuads = kOutCols / 4, kPer = 128 * kQuads / kRuleThreads;
    const int r_first = threadIdx.x / kQuads, c4 = 4 * (threadIdx.x % kQuads);
    float4 x[kPer];
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int r = r_first + t * (kRuleThreads / kQuads);
      x[t] = r < dk && c4 < cols ? *reinterpret_cast<const float4*>(src + (int64_t)r * dv + c4)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int r = r_first + t * (kRuleThreads / kQuads);
      if (r >= dk16) break;
      uint32_t hi[2], lo[2];
      split_bf16x2(x[t].x, x[t].y, hi[0], lo[0]);
      split_bf16x2(x[t].z, x[t].w, hi[1], lo[1]);
      *reinterpret_cast<uint2*>(Sh + r * kStateStride + c4) = make_uint2(hi[0], hi[1]);
      *reinterpret_cast<uint2*>(Sl + r * kStateStride + c4) = make_uint2(lo[0], lo[1]);
    }
    if (dk < dk16)
      for (int r = threadIdx.x; r < kGdnChunk; r += blockDim.x)
        *reinterpret_cast<uint4*>(Qb + r * kRowStride + dk) = make_uint4(0, 0, 0, 0);
  }
  attn::cp_async_wait<0>();
  __syncthreads();
  {
    chunk_gram(P, kPairStride, false, Qb, Kb, dk);
    const int ta = threadIdx.x / 16, tb = threadIdx.x % 16;
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int a = ta + 16 * u, b = tb + 16 * v;
        float& x = P[a * kPairStride + b];
        x = b <= a && a < L ? __expf(gam[a] - gam[b]) * x : 0.f;
      }
  }
  __syncthreads();  // P is masked (each thread its own elements; the products read every warp's)
  {  // o = scale (e^(gam) q S_in + P V) on tensor cores, a warp 16 rows x 32 columns: q S_in with
     // S's halves (q exact), each row scaled by e^(gam_r), then P V with P's and V's fp32 split
     // into three bf16 parts each (split3_bf16x2: 24 significant bits, fp32's), six mma a tile
     // (the products of order 2^-16 and above; the dropped ones are under 2^-23 of a term): o sums
     // terms that cancel, so two halves' 2^-16 would reach its bf16 rounding. P is 0 past the
     // diagonal and past L, V past L
     // (v_new's columns past cols are never loaded: they reach only columns that are not stored).
    const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    float acc[4][4] = {};
    for (int k0 = 0; k0 < dk16; k0 += 16) {
      uint32_t a[4];
      mma::ldsm_x4(a, Qb + (m0 + lane % 8 + 8 * (lane / 8 % 2)) * kRowStride + k0 + 8 * (lane / 16));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * kStateStride + n0 + 16 * np + 8 * (lane / 16);
        uint32_t bh[4], bl[4];
        mma::ldsm_x4_trans(bh, Sh + off);
        mma::ldsm_x4_trans(bl, Sl + off);
        mma::mma_16816(acc[2 * np], a, bh[0], bh[1]);
        mma::mma_16816(acc[2 * np + 1], a, bh[2], bh[3]);
        mma::mma_16816(acc[2 * np], a, bl[0], bl[1]);
        mma::mma_16816(acc[2 * np + 1], a, bl[2], bl[3]);
      }
    }
    const float e0 = __expf(gam[m0 + gq]), e1 = __expf(gam[m0 + gq + 8]);
#pragma unroll
    for (int n = 0; n < 4; ++n) acc[n][0] *= e0, acc[n][1] *= e0, acc[n][2] *= e1, acc[n][3] *= e1;
#pragma unroll
    for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {
      uint32_t ph[4], pm[4], pl[4];
      split3_a_fragment(ph, pm, pl, m0, k0,
                        [&](int r, int s) { return *reinterpret_cast<const float2*>(P + r * kPairStride + s); });
#pragma unroll
      for (int n = 0; n < 4; ++n)  // B (s, j) = V[s][j], columns n0 + 8 n ..: one chain
        mma_split3_both(acc[n], acc[n], ph, pm, pl, Vs + (k0 + 2 * tq) * kVsStride + n0 + 8 * n + gq, kVsStride);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + gq + 8 * half;
      if (r >= L) continue;
      bf16* orow = p.o + ((int64_t)(r0 + r) * p.nv + h) * dv + j0;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int j = n0 + 8 * n + 2 * tq;  // cols is a multiple of 32: j and j + 1 are both in or both out
        if (j < cols)
          *reinterpret_cast<__nv_bfloat162*>(orow + j) =
              __floats2bfloat162_rn(p.scale * acc[n][2 * half], p.scale * acc[n][2 * half + 1]);
      }
    }
  }
}

size_t out_smem_bytes() {
  return 2 * sizeof(bf16) * kGdnChunk * kRowStride + 2 * sizeof(bf16) * 128 * kStateStride +
         sizeof(float) * ((size_t)kGdnChunk * kPairStride + kGdnChunk + kGdnChunk * kVsStride);
}

// ---- The gated delta rule's backward (ops/cpu/gdn.h gdn_tree_backward_chunked) ----

struct RuleBwdParams {
  RuleParams f;                 // the forward's tensors and recomputed intermediates (U, W, gam, vnew, sin)
  const bf16* d_o;              // (N, nv, dv)
  const float* d_end;           // (num_nodes, nv, dk, dv) or null
  float* d_init;                // (num_roots, nv, dk, dv) or null, +=
  float *dvn, *qo, *dsout, *acc;  // (N nv dv), (chunks nv dk dv; null at dk 16 k), (chunks nv dk dv), (nodes nv dk dv)
                                  // (dvn, dsout: fp32, or bf16 (p_bf16) in the bf16 kernels, as sin)
                                  // acc: node n's row the sum of its children's initial-state gradients;
                                  // in rule_bwd_walk_wgmma_kernel instead n's own (non-root n), which
                                  // its parent's last chunk sums (its paths' lanes run side by side)
  float* db2;                   // (N, nv, dk): dW = -dvn S^T (rule_bwd_state_kernel; bf16 likewise)
  float *gq, *gk;               // (N, nv, dk) per value head: S dO and dS v_new (rule_bwd_state_kernel;
                                // bf16 likewise)
  float *rq, *rk;               // rule_bwd_grad_kernel's running sums of q~'s and k's gradients over a key
  int run_heads;                // head's group (fp32): in gq's and gk's rows of the group's first head
                                // (run_heads = nv), or with the bf16 kernels their own (N, nk, dk) rows
                                // (run_heads = nk); run_row
  bf16 *dq_out, *dk_out;        // (N, nk, dk) q's and k's gradients (+= with accumulate)
  float* sds;                   // (chunks, nv, ceil(dk / kStateRows)) partial <S, dS>
  bf16* dv;                     // outputs
  float *dg, *dbeta;
  bool accumulate;
};

// Per (chunk, value head, 64 columns j): dvn_b = sum_{a >= b} (q~_a . k_b) e^(gam_a - gam_b) dO_a
// (the walk adds the end-state term) and qo = sum_a e^(gam_a) q~_a dO_a^T (dk, dv), q~ = scale q.
// Only where the reverse walk does not compute them itself (!walk_writes_outputs(dk): the CUDA-core
// walk at dk not a multiple of 16).
__global__ void __launch_bounds__(kRuleThreads, 2) rule_bwd_local_kernel(RuleBwdParams b) {
  TT_EXTERN_SMEM_16(smem);
  const RuleParams& p = b.f;
  const ChunkPart cp = chunk_part((p.dv + kOutCols - 1) / kOutCols);
  const int c = cp.c, h = cp.h, j0 = cp.z * kOutCols, kh = h / (p.nv / p.nk), dk = p.dk,
            dv = p.dv;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c], cols = min(kOutCols, dv - j0);
  constexpr int kDoStride = kOutCols + 8;
  bf16* Qb = reinterpret_cast<bf16*>(smem);                           // (64, kRowStride)
  bf16* Kb = Qb + kGdnChunk * kRowStride;                             // (64, kRowStride)
  bf16* Db = Kb + kGdnChunk * kRowStride;                             // (64, kDoStride) dO's columns
  float* PT = reinterpret_cast<float*>(Db + kGdnChunk * kDoStride);   // (64, kPairStride): PT[b][a] = P[a][b]
  float* gam = PT + kGdnChunk * kPairStride;                          // (64)
  float* eg = gam + kGdnChunk;                                        // (64) scale e^(gam_a)
  load_chunk_rows(Qb, kRowStride, p.q + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
  load_chunk_rows(Kb, kRowStride, p.k + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
  load_chunk_rows(Db, kDoStride, b.d_o + (int64_t)h * dv + j0, (int64_t)p.nv * dv, r0, L, cols);
  load_chunk_gam(gam, p.gam, p.nv, h, r0, L);
  attn::cp_async_commit();
  attn::cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x < kGdnChunk) eg[threadIdx.x] = threadIdx.x < L ? p.scale * __expf(gam[threadIdx.x]) : 0.f;
  {
    chunk_gram(PT, kPairStride, true, Qb, Kb, dk);
    const int ta = threadIdx.x / 16, tb = threadIdx.x % 16;
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int a = ta + 16 * u, bb = tb + 16 * v;
        float& x = PT[bb * kPairStride + a];
        x = bb <= a && a < L ? p.scale * __expf(gam[a] - gam[bb]) * x : 0.f;
      }
  }
  __syncthreads();
  // Both products on tensor cores: the fp32 operand split into three bf16 parts (split3_bf16x2:
  // fp32's 24 bits), three mma a tile against dO, exact in bf16 and read by transposing ldmatrix.
  // dO's columns past cols are never loaded: they reach only outputs that are not stored.
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
  {  // dvn (64 rows b x 64 columns j) = PT dO; a warp 16 rows x 32 columns. PT is 0 where a < b or a >= L.
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    float acc[4][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {
      uint32_t ah[4], am[4], al[4];
      split3_a_fragment(ah, am, al, m0, k0,
                        [&](int r, int a) { return *reinterpret_cast<const float2*>(PT + r * kPairStride + a); });
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t d[4];  // B (a, j) = dO[a][j]: n8 tiles n0 + 16 np and + 8
        mma::ldsm_x4_trans(d, Db + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * kDoStride + n0 + 16 * np + 8 * (lane / 16));
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) mma_split3(acc[2 * np + h2], ah, am, al, d[2 * h2], d[2 * h2 + 1]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int bb = m0 + gq + 8 * half;
      if (bb >= L) continue;
      float* row = b.dvn + ((int64_t)(r0 + bb) * p.nv + h) * dv + j0;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int j = n0 + 8 * n + 2 * tq;  // cols is a multiple of 32: j and j + 1 both in or both out
        if (j < cols) *reinterpret_cast<float2*>(row + j) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
      }
    }
  }
  {  // qo (dk rows i x 64 columns j) = sum_a (eg_a q_a)^T dO_a; a warp 16 rows (i) x 64 columns. eg is
     // 0 past L; q's columns past dk reach only rows that are not stored.
    const int m0 = 16 * warp;
    if (m0 >= dk) return;
    float acc[8][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {
      uint32_t ah[4], am[4], al[4];  // A (i, a) = eg_a q_a[i]
      split3_a_fragment(ah, am, al, m0, k0, [&](int i, int a) {
        return make_float2(eg[a] * bf(Qb[a * kRowStride + i]), eg[a + 1] * bf(Qb[(a + 1) * kRowStride + i]));
      });
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t d[4];
        mma::ldsm_x4_trans(d, Db + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * kDoStride + 16 * np + 8 * (lane / 16));
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) mma_split3(acc[2 * np + h2], ah, am, al, d[2 * h2], d[2 * h2 + 1]);
      }
    }
    float* qo = b.qo + ((int64_t)c * p.nv + h) * dk * dv + j0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = m0 + gq + 8 * half;
      if (i >= dk) continue;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int j = 8 * n + 2 * tq;
        if (j < cols) *reinterpret_cast<float2*>(qo + (int64_t)i * dv + j) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
      }
    }
  }
}

size_t bwd_local_smem_bytes() {
  return sizeof(bf16) * ((size_t)2 * kGdnChunk * kRowStride + kGdnChunk * (kOutCols + 8)) +
         sizeof(float) * ((size_t)kGdnChunk * kPairStride + 2 * kGdnChunk);
}

// One stage of the reverse walk's chunk operands: W rows (64, dk) fp32, keys (64, 128) bf16, the
// block's dvn columns (64, 32), qo's columns (dk, 32), gam (64).
struct BwdWalkStage {
  float* W;
  bf16* K;
  float* dvn;
  float* qo;
  float* gam;
  __device__ BwdWalkStage(float* base, int dk) {
    W = base;
    K = reinterpret_cast<bf16*>(W + kGdnChunk * dk);
    dvn = reinterpret_cast<float*>(K + kGdnChunk * 128);
    qo = dvn + kGdnChunk * kWalkCols;
    gam = qo + 128 * kWalkCols;
  }
  __host__ __device__ static constexpr size_t floats(int dk) {
    return (size_t)kGdnChunk * dk + kGdnChunk * 128 / 2 + kGdnChunk * kWalkCols + 128 * kWalkCols + kGdnChunk;
  }
};

__device__ __forceinline__ void bwd_walk_prefetch(const BwdWalkStage& st, const RuleBwdParams& b,
                                                  const ChunkInfo& ci, int h, int kh, int j0) {
  const RuleParams& p = b.f;
  const int r0 = ci.r0, L = ci.L;
  load_chunk_rows(st.W, p.dk, p.W + (int64_t)h * p.dk, (int64_t)p.nv * p.dk, r0, L, p.dk);
  load_chunk_rows(st.K, 128, p.k + (int64_t)kh * p.dk, (int64_t)p.nk * p.dk, r0, L, p.dk);
  load_chunk_rows(st.dvn, kWalkCols, b.dvn + (int64_t)h * p.dv + j0, (int64_t)p.nv * p.dv, r0, L, kWalkCols);
  load_chunk_rows(st.qo, kWalkCols, b.qo + ((int64_t)ci.c * p.nv + h) * p.dk * p.dv + j0, p.dv, 0, p.dk, kWalkCols,
                  p.dk);
  load_chunk_gam(st.gam, p.gam, p.nv, h, r0, L);
}

// Per (value head, 32 state columns): the chunks in the plan's order reversed, carrying dS, the
// gradient of the chunk's end state (the previous chunk's operands in flight meanwhile). A node's
// last chunk starts from d_end plus its child nodes' initial-state gradients (acc, complete: the
// children's chunks come later in the plan's order); each chunk stores dS (dsout), adds
// e^(gam_L - gam_b) k_b^T dS to dvn, and passes dS_in = e^(gam_L) dS + qo - W^T dvn back; a node's
// first chunk adds dS_in to its parent's acc (or its root's d_init).
__global__ void __launch_bounds__(kRuleThreads) rule_bwd_walk_kernel(RuleBwdParams b) {
  TT_EXTERN_SMEM_16(smem);
  const RuleParams& p = b.f;
  const int h = blockIdx.x, j0 = blockIdx.y * kWalkCols, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv;
  float* dS = reinterpret_cast<float*>(smem);  // (128, 32)
  float* Dv = dS + 128 * kWalkCols;            // (64, 32) dvn
  float* dec = Dv + kGdnChunk * kWalkCols;     // (64)
  float* stages = dec + kGdnChunk;             // two BwdWalkStages
  const size_t stage_floats = BwdWalkStage::floats(dk);
  const int64_t SS = (int64_t)dk * dv;
  const int w = threadIdx.x / kWalkCols, jj = threadIdx.x % kWalkCols;
  const int last = p.num_chunks - 1;
  ChunkCursor<true> chunks(p.plan, p.num_chunks);
  if (last >= 0) bwd_walk_prefetch(BwdWalkStage(stages, dk), b, chunks.cur, h, kh, j0);
  attn::cp_async_commit();
  for (int c = last; c >= 0; --c) {
    if (c > 0)
      bwd_walk_prefetch(BwdWalkStage(stages + ((last - c + 1) & 1) * stage_floats, dk), b, chunks.nxt, h, kh, j0);
    attn::cp_async_commit();
    attn::cp_async_wait<1>();
    const BwdWalkStage st(stages + ((last - c) & 1) * stage_floats, dk);
    const ChunkInfo ci = chunks.take(c);
    const int n = ci.node, flags = ci.flags, r0 = ci.r0, L = ci.L;
    if (flags & 2) {  // (each thread its own elements, as the stores below: no hazard with them)
      const float* acc = b.acc + ((int64_t)n * p.nv + h) * SS;
      const float* de = b.d_end ? b.d_end + ((int64_t)n * p.nv + h) * SS : nullptr;
      for (int e = threadIdx.x; e < dk * kWalkCols / 4; e += blockDim.x) {
        const int i = e / (kWalkCols / 4), jq = (e % (kWalkCols / 4)) * 4;
        const int64_t at = (int64_t)i * dv + j0 + jq;
        float4 x = *reinterpret_cast<const float4*>(acc + at);
        if (de) {
          const float4 y = *reinterpret_cast<const float4*>(de + at);
          x.x += y.x, x.y += y.y, x.z += y.z, x.w += y.w;
        }
        *reinterpret_cast<float4*>(dS + i * kWalkCols + jq) = x;
      }
    }
    __syncthreads();
    state_to_global(b.dsout + ((int64_t)c * p.nv + h) * SS, dS, dk, dv, j0);
    const float gl = st.gam[L - 1];
    if (threadIdx.x < kGdnChunk) dec[threadIdx.x] = threadIdx.x < L ? __expf(gl - st.gam[threadIdx.x]) : 0.f;
    __syncthreads();
    {  // dvn rows w * 8 + t += e^(gam_L - gam_r) k_r . dS[:, jj]
      float acc[kWalkRowsV];
#pragma unroll
      for (int t = 0; t < kWalkRowsV; ++t) acc[t] = 0.f;
      for (int i = 0; i < dk; i += 8) {
        float ds[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) ds[e] = dS[(i + e) * kWalkCols + jj];
#pragma unroll
        for (int t = 0; t < kWalkRowsV; ++t) {
          float kv[8];
          detail::load_bf16<8>(kv, st.K + (w * kWalkRowsV + t) * 128 + i);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[t] = fmaf(kv[e], ds[e], acc[t]);
        }
      }
#pragma unroll
      for (int t = 0; t < kWalkRowsV; ++t) {
        const int r = w * kWalkRowsV + t;
        const float y = st.dvn[r * kWalkCols + jj] + dec[r] * acc[t];  // 0 past L
        Dv[r * kWalkCols + jj] = y;
        if (r < L) b.dvn[((int64_t)(r0 + r) * p.nv + h) * dv + j0 + jj] = y;
      }
    }
    __syncthreads();
    if (w * kWalkRowsS < dk) {  // dS rows w * 16 + t: e^(gam_L) dS + qo - W^T dvn
      float acc[kWalkRowsS];
      const float el = __expf(gl);
#pragma unroll
      for (int t = 0; t < kWalkRowsS; ++t) {
        const int i = min(w * kWalkRowsS + t, dk - 1);
        acc[t] = el * dS[i * kWalkCols + jj] + st.qo[i * kWalkCols + jj];
      }
      for (int s = 0; s < kGdnChunk; ++s) {
        const float d = Dv[s * kWalkCols + jj];
#pragma unroll
        for (int q4 = 0; q4 < kWalkRowsS / 4; ++q4) {
          const float4 wv = *reinterpret_cast<const float4*>(st.W + s * dk + w * kWalkRowsS + 4 * q4);
          acc[4 * q4] = fmaf(-wv.x, d, acc[4 * q4]);
          acc[4 * q4 + 1] = fmaf(-wv.y, d, acc[4 * q4 + 1]);
          acc[4 * q4 + 2] = fmaf(-wv.z, d, acc[4 * q4 + 2]);
          acc[4 * q4 + 3] = fmaf(-wv.w, d, acc[4 * q4 + 3]);
        }
      }
#pragma unroll
      for (int t = 0; t < kWalkRowsS; ++t) {
        const int i = w * kWalkRowsS + t;
        if (i < dk) dS[i * kWalkCols + jj] = acc[t];
      }
    }
    __syncthreads();
    if (flags & 1) {
      float* dst = node_link(p.plan, n, h, p.nv, SS, b.acc, b.d_init);
      if (dst)
        for (int e = threadIdx.x; e < dk * kWalkCols / 4; e += blockDim.x) {
          const int i = e / (kWalkCols / 4), jq = (e % (kWalkCols / 4)) * 4;
          float4* at = reinterpret_cast<float4*>(dst + (int64_t)i * dv + j0 + jq);
          const float4 x = *reinterpret_cast<const float4*>(dS + i * kWalkCols + jq);
          float4 y = *at;
          y.x += x.x, y.y += x.y, y.z += x.z, y.w += x.w;
          *at = y;
        }
    }
  }
  attn::cp_async_wait<0>();
}

size_t bwd_walk_smem_bytes(int dk) {
  return sizeof(float) * (128 * kWalkCols + kGdnChunk * kWalkCols + kGdnChunk + 2 * BwdWalkStage::floats(dk));
}

// The backward walk on tensor cores (dk a multiple of 16; rule_bwd_walk_kernel otherwise), the
// same order and outputs, laid out as rule_walk_mma_kernel: dS (dk, 32) in registers as the
// accumulators of dS_in = e^(gam_L) dS + qo - W^T dvn (warp w: rows 16 w .., all 32 columns), the
// fp32 operands split into bf16 halves (W^T's per element, dvn's in shared memory: three mma a
// tile); dvn = PT dO + e^(gam_L - gam_r) K dS (rows 16 (w < 4 ? w : 7 - w), columns 16 (w / 4))
// with k exact in bf16 and dS's halves in shared memory (two mma a tile). The dO terms are
// rule_bwd_local_kernel's, on the walk's own tiles: dvn's local part PT dO (PT = scale P^T, the
// prep's transposed scores; PT in three bf16 parts, dO exact) and qo's rows, accumulated straight
// into dS, q^T (scale e^(gam) dO) (q exact, the fp32 product in three bf16 parts stored once a
// chunk for all warps). Neither qo nor the local dvn is stored.
constexpr int kBwdDoStride = kWalkCols + 8;  // bf16 row stride of a stage's dO columns (ldmatrix: no conflicts)

// A stage by cp.async: -W's halves, K and q (64, kRowStride) bf16, PT (64, kPairStride) fp32, dO's
// columns (64, kBwdDoStride) bf16, gam (64).
struct BwdWalkMmaStage {
  bf16 *Wh, *Wl;  // (64, kRowStride) -W's halves, read transposed
  bf16 *K, *Q;    // (64, kRowStride)
  float* PT;
  bf16* dO;
  float* gam;
  __device__ BwdWalkMmaStage(unsigned char* base, int /*dk*/) {
    Wh = reinterpret_cast<bf16*>(base);
    Wl = Wh + kGdnChunk * kRowStride;
    K = Wl + kGdnChunk * kRowStride;
    Q = K + kGdnChunk * kRowStride;
    PT = reinterpret_cast<float*>(Q + kGdnChunk * kRowStride);
    dO = reinterpret_cast<bf16*>(PT + kGdnChunk * kPairStride);
    gam = reinterpret_cast<float*>(dO + kGdnChunk * kBwdDoStride);
  }
  __host__ __device__ static constexpr size_t bytes(int /*dk*/) {
    return sizeof(bf16) * (4 * kGdnChunk * kRowStride + kGdnChunk * kBwdDoStride) +
           sizeof(float) * (kGdnChunk * kPairStride + kGdnChunk);
  }
  __device__ const bf16* wh8(int s, int i) const { return Wh + s * kRowStride + i; }
  __device__ const bf16* wl8(int s, int i) const { return Wl + s * kRowStride + i; }
  __device__ const bf16* k8(int s, int i) const { return K + s * kRowStride + i; }
  __device__ const bf16* q8(int a, int i) const { return Q + a * kRowStride + i; }  // 8 of q_a from i
  __device__ float2 pt2(int r, int a) const { return *reinterpret_cast<const float2*>(PT + r * kPairStride + a); }
  // 8 of scale PT_ra .. in bf16 from (r, a), a % 8 = 0, an ldmatrix row (GdnProducts::kBf16: rows at kRowStride)
  __device__ const bf16* ptb8(int r, int a) const { return reinterpret_cast<const bf16*>(PT) + r * kRowStride + a; }
  __device__ const bf16* do8(int a, int j) const { return dO + a * kBwdDoStride + j; }
};

// The backward walk's TMA descriptors (dk = 128): -W's halves, K and Q as WalkMaps's; PT (chunks nv
// 64, 1, 64) fp32 in boxes of 32 x 64.
struct BwdWalkMaps {
  CUtensorMap Wh, Wl, K, Q, PT;
};

// The backward walk's stage at dk = 128, by TMA as WalkTmaStage (ten boxes, 80 KB): -W's halves, K
// and Q as (64, 128) bf16 tiles (tma_load_rows128), PT as two (64, 32) fp32 boxes; dO's columns
// (64, kBwdDoStride) bf16 and gam by cp.async. Rows past L hold the rows that follow (masked by
// the products; dO's are zero-filled). The bf16 kernels: no low half of -W, PT as one (64, 64)
// bf16 box (seven boxes, 56 KB); at 64 columns (rule_bwd_walk_wgmma_kernel<64>) dO's (64, kDo64Stride)
// bf16 in -W's low half's tile, which they leave free (16 KB; these rows take 9): do64, do8_64.
struct BwdWalkTmaStage {
  static constexpr uint32_t kT = kGdnChunk * 128 * sizeof(bf16), kPT = kGdnChunk * kGdnChunk * sizeof(float),
                            kTx = 4 * kT + kPT, kDo = kGdnChunk * kBwdDoStride * sizeof(bf16);
  static constexpr size_t kBytes = (kTx + kDo + kGdnChunk * sizeof(float) + 1023) / 1024 * 1024;  // 1024-aligned
  bf16 *Wh, *Wl, *K, *Q;
  float* PT;
  bf16* dO;
  float* gam;
  __device__ BwdWalkTmaStage(unsigned char* base, int /*dk: 128*/)
      : Wh(reinterpret_cast<bf16*>(base)), Wl(reinterpret_cast<bf16*>(base + kT)),
        K(reinterpret_cast<bf16*>(base + 2 * kT)), Q(reinterpret_cast<bf16*>(base + 3 * kT)),
        PT(reinterpret_cast<float*>(base + 4 * kT)), dO(reinterpret_cast<bf16*>(base + kTx)),
        gam(reinterpret_cast<float*>(base + kTx + kDo)) {}
  __host__ __device__ static constexpr size_t bytes(int) { return kBytes; }
  __device__ const bf16* wh8(int s, int i) const { return tma_k8(Wh, s, i); }
  __device__ const bf16* wl8(int s, int i) const { return tma_k8(Wl, s, i); }
  __device__ const bf16* k8(int s, int i) const { return tma_k8(K, s, i); }
  __device__ const bf16* q8(int a, int i) const { return tma_k8(Q, a, i); }
  __device__ float2 pt2(int r, int a) const {
    return *reinterpret_cast<const float2*>(PT + a / 32 * (kGdnChunk * 32) + swizzle128<4>(r, a % 32));
  }
  // 8 of scale PT_ra .. in bf16 from (r, a), a % 8 = 0, an ldmatrix row (GdnProducts::kBf16: one (64, 64) box)
  __device__ const bf16* ptb8(int r, int a) const { return reinterpret_cast<const bf16*>(PT) + swizzle128<2>(r, a); }
  __device__ const bf16* do8(int a, int j) const { return dO + a * kBwdDoStride + j; }
  static constexpr int kDo64Stride = 64 + 8;  // bf16 row stride of dO's 64 columns (16-byte aligned rows)
  static_assert(kGdnChunk * kDo64Stride * sizeof(bf16) <= kT, "dO's 64 columns fit -W's low half");
  __device__ bf16* do64() const { return Wl; }
  __device__ const bf16* do8_64(int a, int j) const { return Wl + a * kDo64Stride + j; }
};

// kBf16 (GdnProducts::kBf16): -W's high half only, PT in bf16; kCols (64: kBf16 only) dO's columns,
// at 64 in -W's low half's tile, which kBf16 leaves free (BwdWalkTmaStage::do64).
template <bool kBf16, int kCols = kWalkCols>
__device__ __forceinline__ void bwd_walk_mma_prefetch(const BwdWalkTmaStage& st, uint64_t* bar, const RuleBwdParams& b,
                                                      const BwdWalkMaps& maps, const ChunkInfo& ci, int h, int kh,
                                                      int j0) {
  namespace sm90 = attn::sm90;
  const RuleParams& p = b.f;
  if (threadIdx.x == 0) {
    sm90::mbar_expect_tx(bar, BwdWalkTmaStage::kTx - (kBf16 ? BwdWalkTmaStage::kT + BwdWalkTmaStage::kPT / 2 : 0));
    tma_load_rows128(st.Wh, &maps.Wh, h, ci.r0, bar);
    if constexpr (!kBf16) tma_load_rows128(st.Wl, &maps.Wl, h, ci.r0, bar);
    tma_load_rows128(st.K, &maps.K, kh, ci.r0, bar);
    tma_load_rows128(st.Q, &maps.Q, kh, ci.r0, bar);
    if constexpr (kBf16) {
      sm90::tma_load_3d(st.PT, &maps.PT, 0, 0, (ci.c * p.nv + h) * kGdnChunk, bar);
    } else {
#pragma unroll
      for (int a = 0; a < 2; ++a)
        sm90::tma_load_3d(st.PT + a * (kGdnChunk * 32), &maps.PT, 32 * a, 0, (ci.c * p.nv + h) * kGdnChunk, bar);
    }
  }
  static_assert(kCols == kWalkCols || (kCols == 64 && kBf16), "64 columns of dO only where -W's low half is free");
  if constexpr (kCols == 64)
    load_chunk_rows_fixed<64>(st.do64(), st.kDo64Stride, b.d_o + (int64_t)h * p.dv + j0, (int64_t)p.nv * p.dv, ci.r0,
                              ci.L);
  else
    load_chunk_rows_fixed<kWalkCols>(st.dO, kBwdDoStride, b.d_o + (int64_t)h * p.dv + j0, (int64_t)p.nv * p.dv, ci.r0,
                                     ci.L);
  load_chunk_gam(st.gam, p.gam, p.nv, h, ci.r0, ci.L);
}
template <bool kBf16>
__device__ __forceinline__ void bwd_walk_mma_prefetch(const BwdWalkMmaStage& st, uint64_t*, const RuleBwdParams& b,
                                                      const BwdWalkMaps&, const ChunkInfo& ci, int h, int kh,
                                                      int j0) {
  const RuleParams& p = b.f;
  const int r0 = ci.r0, L = ci.L;
  const bf16* Wh = reinterpret_cast<const bf16*>(p.W) + (int64_t)h * p.dk;
  const int64_t plane = (int64_t)p.rows * p.nv * p.dk;
  load_chunk_rows(st.Wh, kRowStride, Wh, (int64_t)p.nv * p.dk, r0, L, p.dk);
  if constexpr (!kBf16) load_chunk_rows(st.Wl, kRowStride, Wh + plane, (int64_t)p.nv * p.dk, r0, L, p.dk);
  load_chunk_rows(st.K, kRowStride, p.k + (int64_t)kh * p.dk, (int64_t)p.nk * p.dk, r0, L, p.dk);
  load_chunk_rows(st.Q, kRowStride, p.q + (int64_t)kh * p.dk, (int64_t)p.nk * p.dk, r0, L, p.dk);
  const int64_t at = ((int64_t)ci.c * p.nv + h) * kGdnChunk * kGdnChunk;
  if constexpr (kBf16)
    load_chunk_rows(reinterpret_cast<bf16*>(st.PT), kRowStride, p_bf16(p.PT) + at, kGdnChunk, 0, kGdnChunk, kGdnChunk);
  else
    load_chunk_rows(st.PT, kPairStride, p.PT + at, kGdnChunk, 0, kGdnChunk, kGdnChunk);
  load_chunk_rows_fixed<kWalkCols>(st.dO, kBwdDoStride, b.d_o + (int64_t)h * p.dv + j0, (int64_t)p.nv * p.dv, r0, L);
  load_chunk_gam(st.gam, p.gam, p.nv, h, r0, L);
}

// kDk as rule_walk_mma_kernel's (128: the stages by TMA, BwdWalkTmaStage); kBf16
// (GdnProducts::kBf16) as its: every product one mma of bf16 operands (dS, dvn, PT, -W's high half
// and scale e^(gam) dO rounded to bf16), fp32 accumulators and dS.
template <int kDk, bool kBf16 = false>
__global__ void __launch_bounds__(kRuleThreads) rule_bwd_walk_mma_kernel(RuleBwdParams b,
                                                                     const __grid_constant__ BwdWalkMaps maps) {
  TT_EXTERN_SMEM_16(smem_raw);
  __shared__ uint64_t bars[2];  // the stages' TMA barriers (kDk = 128)
  using Stage = std::conditional_t<kDk == 128, BwdWalkTmaStage, BwdWalkMmaStage>;
  constexpr int HS = kWalkHalfStride, kUnroll = kDk > 0 ? kDk / 16 : 2;
  const RuleParams& p = b.f;
  const int h = blockIdx.x, j0 = blockIdx.y * kWalkCols, kh = h / (p.nv / p.nk), dk = kDk > 0 ? kDk : p.dk,
            dv = p.dv;
  unsigned char* stages = align_up_1024(smem_raw);  // two Stages
  const size_t stage_bytes = Stage::bytes(dk);
  auto stage = [&](int i) { return Stage(stages + i * stage_bytes, dk); };
  bf16* Sh = reinterpret_cast<bf16*>(stages + 2 * stage_bytes);  // (128, HS) dS's halves
  bf16* Sl = Sh + 128 * HS;
  bf16* Vh = Sl + 128 * HS;                  // (64, HS) dvn's halves
  bf16* Vl = Vh + kGdnChunk * HS;
  // (64, kBwdDoStride) each: (scale e^(gam_a) dO_a) in three bf16 parts (split3_bf16x2), qo's B operand
  bf16* Eh = Vl + kGdnChunk * HS;
  bf16* Em = Eh + kGdnChunk * kBwdDoStride;
  bf16* El = Em + kGdnChunk * kBwdDoStride;
  const int64_t SS = (int64_t)dk * dv;
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
  const int si = 16 * warp;
  const bool has_rows = si < dk;
  // The dvn tile: warps w and w + 4 take row blocks summing to 3 (PT dO's nonzero blocks shared
  // evenly by the schedulers), as the forward walk's o tiles.
  const int vm = 16 * (warp < 4 ? warp : 7 - warp), vn = 16 * (warp / 4);
  float dS[4][4] = {};  // rows si + gq (e 0, 1) and + 8 (e 2, 3), columns 8 n + 2 tq (+1)
  // f(n, e, global offset of the element) for each of this thread's dS elements.
  auto each = [&](auto&& f) {
    if (!has_rows) return;
    walk_state_pairs(si, dv, j0, [&](int n, int half, int64_t at) {
      f(n, 2 * half, at);
      f(n, 2 * half + 1, at + 1);
    });
  };
  if (kDk == 128) init_stage_barriers(bars);
  __syncthreads();
  const int last = p.num_chunks - 1;
  ChunkCursor<true> chunks(p.plan, p.num_chunks);
  if (last >= 0) bwd_walk_mma_prefetch<kBf16>(stage(0), &bars[0], b, maps, chunks.cur, h, kh, j0);
  attn::cp_async_commit();
  for (int c = last; c >= 0; --c) {
    const int step = last - c;  // this step's stage: step & 1, its barrier's phase: (step >> 1) & 1
    if (c > 0) bwd_walk_mma_prefetch<kBf16>(stage((step + 1) & 1), &bars[(step + 1) & 1], b, maps, chunks.nxt, h, kh, j0);
    attn::cp_async_commit();
    const Stage st = stage(step & 1);
    const ChunkInfo ci = chunks.take(c);
    const int n = ci.node, flags = ci.flags, r0 = ci.r0, L = ci.L;
    if (flags & 2) {  // a node's last chunk: its children's initial-state gradients plus d_end
      const float* acc = b.acc + ((int64_t)n * p.nv + h) * SS;
      const float* de = b.d_end ? b.d_end + ((int64_t)n * p.nv + h) * SS : nullptr;
      each([&](int nn, int e, int64_t at) { dS[nn][e] = acc[at] + (de ? de[at] : 0.f); });
    }
    if (has_rows)  // dS (with kBf16 as the bf16 state products round it)
      walk_state_pairs(si, dv, j0, [&](int nn, int half, int64_t at) {
        store_pair<kBf16>(b.dsout, ((int64_t)c * p.nv + h) * SS + at, dS[nn][2 * half], dS[nn][2 * half + 1]);
      });
    if (has_rows) walk_state_to_halves<kBf16>(Sh, Sl, dS, si);
    if constexpr (kDk == 128) attn::sm90::mbar_wait(&bars[step & 1], (step >> 1) & 1);
    attn::cp_async_wait<1>();
    __syncthreads();  // the stage has landed; dS's halves are stored
    const float gl = st.gam[L - 1];
    {  // qo's B operand: row a, columns 8 t .. 8 t + 8 of scale e^(gam_a) dO_a (dO is zero past L)
      static_assert(kGdnChunk * kWalkCols / 8 == kRuleThreads, "eight elements a thread");
      const int a = threadIdx.x / 4, j = 8 * (threadIdx.x % 4);
      const float eg = a < L ? p.scale * __expf(st.gam[a]) : 0.f;
      float x[8];
      detail::load_bf16<8>(x, st.do8(a, j));
      uint32_t hi[4], mid[4], lo[4];
      const int at = a * kBwdDoStride + j;
      if constexpr (kBf16) {
#pragma unroll
        for (int e = 0; e < 4; ++e) hi[e] = attn::pack_bf16x2(eg * x[2 * e], eg * x[2 * e + 1]);
        *reinterpret_cast<uint4*>(Eh + at) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) split3_bf16x2(eg * x[2 * e], eg * x[2 * e + 1], hi[e], mid[e], lo[e]);
        *reinterpret_cast<uint4*>(Eh + at) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(Em + at) = make_uint4(mid[0], mid[1], mid[2], mid[3]);
        *reinterpret_cast<uint4*>(El + at) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      }
    }
    {  // dvn (rows vm .., columns vn ..) += e^(gam_L - gam_r) k_r . dS
      float acc[2][4] = {}, big[2][4] = {};  // k . dS_lo, k . dS_hi: two chains of dependent mma
      float loc[2][4] = {};                  // dvn's local part, PT dO (PT zero below the diagonal)
      for (int k0 = vm; k0 < kGdnChunk; k0 += 16) {
        uint32_t d[4];  // B (a, j) = dO[a][j]: n8 tiles vn and vn + 8
        mma::ldsm_x4_trans(d, st.do8(k0 + lane % 8 + 8 * (lane / 8 % 2), vn + 8 * (lane / 16)));
        if constexpr (kBf16) {
          uint32_t pa[4];  // A (r, a) = scale PT_ra, as the prep rounded it
          mma::ldsm_x4(pa, st.ptb8(vm + lane % 8 + 8 * (lane / 8 % 2), k0 + 8 * (lane / 16)));
#pragma unroll
          for (int nn = 0; nn < 2; ++nn) mma::mma_16816(loc[nn], pa, d[2 * nn], d[2 * nn + 1]);
        } else {
          uint32_t ah[4], am[4], al[4];
          split3_a_fragment(ah, am, al, vm, k0, [&](int r, int a) { return st.pt2(r, a); });
#pragma unroll
          for (int nn = 0; nn < 2; ++nn) mma_split3(loc[nn], ah, am, al, d[2 * nn], d[2 * nn + 1]);
        }
      }
#pragma unroll kUnroll
      for (int k0 = 0; k0 < dk; k0 += 16) {
        uint32_t a[4], bh[4], bl[4];
        mma::ldsm_x4(a, st.k8(vm + lane % 8 + 8 * (lane / 8 % 2), k0 + 8 * (lane / 16)));
        const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * HS + vn + 8 * (lane / 16);
        mma::ldsm_x4_trans(bh, Sh + off);
        if constexpr (!kBf16) mma::ldsm_x4_trans(bl, Sl + off);
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          mma::mma_16816(big[nn], a, bh[2 * nn], bh[2 * nn + 1]);
          if constexpr (!kBf16) mma::mma_16816(acc[nn], a, bl[2 * nn], bl[2 * nn + 1]);
        }
      }
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nn][e] += big[nn][e];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = vm + gq + 8 * half;
        const float d = r < L ? __expf(gl - st.gam[r]) : 0.f;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          const int col = vn + 8 * nn + 2 * tq;
          // The local part; rows past L: not this chunk's
          const float2 u = make_float2(loc[nn][2 * half], loc[nn][2 * half + 1]);
          const float y0 = r < L ? u.x + d * acc[nn][2 * half] : 0.f,
                      y1 = r < L ? u.y + d * acc[nn][2 * half + 1] : 0.f;
          if (r < L)  // with kBf16 as the bf16 state and gradient products round it
            store_pair<kBf16>(b.dvn, ((int64_t)(r0 + r) * p.nv + h) * dv + j0 + col, y0, y1);
          bf16_parts<kBf16>(y0, y1, *reinterpret_cast<uint32_t*>(Vh + r * HS + col),
                            *reinterpret_cast<uint32_t*>(Vl + r * HS + col));
        }
      }
    }
    __syncthreads();  // dvn's halves and e^(gam) dO's parts are stored
    if (has_rows) {  // dS <- e^(gam_L) dS + qo - W^T dvn
      const float el = __expf(gl);
#pragma unroll
      for (int nn = 0; nn < 4; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dS[nn][e] *= el;
#pragma unroll
      for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {  // + qo's rows si .. = sum_a q_a^T (scale e^(gam_a) dO_a)
        uint32_t a[4];  // A (i, a) = q_a[i], exact: transposing loads of q's rows
        mma::ldsm_x4_trans(a, st.q8(k0 + lane % 8 + 8 * (lane / 16), si + 8 * (lane / 8 % 2)));
        if (kDk == 128 && k0 + 16 > L)  // q past L: the next rows under TMA; 0 x NaN must not reach dS
          keep_fragment_rows_below(a, k0, L);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * kBwdDoStride + 16 * np + 8 * (lane / 16);
          uint32_t bh[4], bm[4], bl[4];
          mma::ldsm_x4_trans(bh, Eh + off);
          if constexpr (!kBf16) {
            mma::ldsm_x4_trans(bm, Em + off);
            mma::ldsm_x4_trans(bl, El + off);
          }
#pragma unroll
          for (int t = 0; t < 2; ++t) {  // the small parts first
            if constexpr (!kBf16) {
              mma::mma_16816(dS[2 * np + t], a, bl[2 * t], bl[2 * t + 1]);
              mma::mma_16816(dS[2 * np + t], a, bm[2 * t], bm[2 * t + 1]);
            }
            mma::mma_16816(dS[2 * np + t], a, bh[2 * t], bh[2 * t + 1]);
          }
        }
      }
#pragma unroll
      for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {
        uint32_t wh[4], wl[4];  // A (i, s) = -W_s[i]: transposing loads of the prep's halves
        mma::ldsm_x4_trans(wh, st.wh8(k0 + lane % 8 + 8 * (lane / 16), si + 8 * (lane / 8 % 2)));
        if constexpr (!kBf16) mma::ldsm_x4_trans(wl, st.wl8(k0 + lane % 8 + 8 * (lane / 16), si + 8 * (lane / 8 % 2)));
        if (kDk == 128 && k0 + 16 > L) {  // rows past L: the next rows of W under TMA, as the forward walk's keys
          keep_fragment_rows_below(wh, k0, L);
          if constexpr (!kBf16) keep_fragment_rows_below(wl, k0, L);
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * HS + 16 * np + 8 * (lane / 16);
          uint32_t bh[4], bl[4];
          mma::ldsm_x4_trans(bh, Vh + off);
          if constexpr (!kBf16) mma::ldsm_x4_trans(bl, Vl + off);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            mma::mma_16816(dS[2 * np + t], wh, bh[2 * t], bh[2 * t + 1]);
            if constexpr (!kBf16) {
              mma::mma_16816(dS[2 * np + t], wh, bl[2 * t], bl[2 * t + 1]);
              mma::mma_16816(dS[2 * np + t], wl, bh[2 * t], bh[2 * t + 1]);
            }
          }
        }
      }
    }
    if (flags & 1) {  // a node's first chunk: dS_in to its parent's acc (or its root's d_init)
      float* dst = node_link(p.plan, n, h, p.nv, SS, b.acc, b.d_init);
      if (dst) each([&](int nn, int e, int64_t at) { dst[at] += dS[nn][e]; });
    }
    __syncthreads();  // every warp is done with this stage and the halves
  }
  attn::cp_async_wait<0>();
}

size_t bwd_walk_mma_smem_bytes(int dk) {
  const size_t stage = dk == 128 ? BwdWalkTmaStage::kBytes : BwdWalkMmaStage::bytes(dk);
  return 1024 + 2 * stage + sizeof(bf16) * (2 * 128 + 2 * kGdnChunk) * kWalkHalfStride +  // + the alignment's slack
         sizeof(bf16) * 3 * kGdnChunk * kBwdDoStride;
}

// The bf16 reverse walk at dk 128 on warpgroup MMA (m64nNk16, N = kCols), as rule_walk_wgmma_kernel is the
// forward's: the same products and roundings as rule_bwd_walk_mma_kernel<128, true> (dS, dvn and
// scale e^(gam) dO rounded to bf16; k, q, -W, PT and dO bf16 as stored), the same stages
// (BwdWalkTmaStage; at 64 columns dO's in -W's low half's tile, do64). Two warpgroups, one
// block per (value head, kCols = 32 or 64 columns, path: as the forward's walk, the levels last to
// first), the path's chunks last to first. A node's last chunk starts from the sum of its
// children's initial-state gradients (each in the child's own row of acc, written by this path or
// by a path of a higher level, walked by an earlier launch; last child first, as a single chain
// would add them) and d_end; its first chunk stores its own in its row of acc (a root adds it to
// d_init). A chunk:
//   1. every warp writes its 16 rows of dS as bf16 into dS's tile (128 x kCols, MN-major) and to
//      dsout; once the stage lands, dO's rows (cp.async, unswizzled) go to two swizzled bf16 tiles,
//      dO and scale e^(gam_a) dO_a (zero past L), and rows past L of q and -W are zeroed (the next
//      node's rows; 0 x NaN must not reach dS).
//   2. warpgroup 0: dvn = PT dO + e^(gam_L - gam_r) (k dS) (12 MMAs) to dvn's global rows and a
//      bf16 tile (zero past L); warpgroup 1 meanwhile: its dS rows <- e^(gam_L) dS + (q^T)[64 ..]
//      (e^(gam) dO) (4).
//   3. warpgroup 0: its dS rows <- e^(gam_L) dS + (q^T)[0 ..] (e^(gam) dO) + (-W^T)[0 ..] dvn (8);
//      warpgroup 1: + (-W^T)[64 ..] dvn (4).
template <int kCols = kWalkCols>
__global__ void __launch_bounds__(kRuleThreads, 1) rule_bwd_walk_wgmma_kernel(RuleBwdParams b,
                                                                             const __grid_constant__ BwdWalkMaps maps) {
  namespace sm90 = attn::sm90;
  using Stage = BwdWalkTmaStage;
  using Mma = sm90::Wgmma<kCols>;
  static_assert(kCols == 32 || kCols == 64, "a walking block takes 32 or 64 state columns");
  constexpr int kAcc = kCols / 2;  // a warpgroup accumulator of kCols columns: floats a thread
  TT_EXTERN_SMEM_16(smem_raw);
  __shared__ uint64_t bars[2];  // the stages' TMA barriers
  const RuleParams& p = b.f;
  const int h = blockIdx.x, j0 = blockIdx.y * kCols, kh = h / (p.nv / p.nk), dv = p.dv;
  unsigned char* stages = align_up_1024(smem_raw);  // two Stages, then the operand tiles (1024-byte multiples)
  auto stage = [&](int i) { return Stage(stages + i * Stage::kBytes, 128); };
  bf16* Ss = reinterpret_cast<bf16*>(stages + 2 * Stage::kBytes);  // (128, 64) bf16(dS) in columns 0 .. kCols
  bf16* Ds = Ss + 128 * 64;                                        // (64, 64) dO in columns 0 .. kCols
  bf16* Es = Ds + kGdnChunk * 64;                                  // (64, 64) scale e^(gam_a) dO_a
  bf16* Vs = Es + kGdnChunk * 64;                                  // (64, 64) dvn
  const int64_t SS = (int64_t)128 * dv;
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, wg = warp / 4, gq = lane / 4,
            tq = lane % 4;
  const int row = 16 * (warp % 4) + gq;  // this thread's accumulator rows of a 64-row product: row, row + 8
  const uint64_t s_desc = sm90::desc_mnmajor<128>(Ss, 0), d_desc = sm90::desc_mnmajor<kGdnChunk>(Ds, 0),
                 e_desc = sm90::desc_mnmajor<kGdnChunk>(Es, 0), v_desc = sm90::desc_mnmajor<kGdnChunk>(Vs, 0);
  float dS[kAcc] = {};  // dS[4 n + 2 half + e]: row 16 warp + gq + 8 half, column 8 n + 2 tq + e
  init_stage_barriers(bars);
  __syncthreads();
  const WalkRun mine = walk_path(p.plan, p.path0);
  const int last = mine.nc - 1;  // c below: a position in this block's path, ci.c the chunk's index
  ChunkCursor<true> chunks(p.plan, mine.nc, mine.c0);
  if (last >= 0) bwd_walk_mma_prefetch<true, kCols>(stage(0), &bars[0], b, maps, chunks.cur, h, kh, j0);
  attn::cp_async_commit();
  for (int c = last; c >= 0; --c) {
    const int step = last - c;  // this step's stage: step & 1, its barrier's phase: (step >> 1) & 1
    if (c > 0)
      bwd_walk_mma_prefetch<true, kCols>(stage((step + 1) & 1), &bars[(step + 1) & 1], b, maps, chunks.nxt, h, kh, j0);
    attn::cp_async_commit();
    const Stage st = stage(step & 1);
    const ChunkInfo ci = chunks.take(c);
    const int n = ci.node, flags = ci.flags, r0 = ci.r0, L = ci.L;
    if (flags & 2) {  // a node's last chunk: its children's initial-state gradients (last child first), plus d_end
      const float* de = b.d_end ? b.d_end + ((int64_t)n * p.nv + h) * SS : nullptr;
      const int k0 = p.plan.node_child0[n], k1 = p.plan.node_child0[n + 1];
      walk_state_pairs<kCols>(16 * warp, dv, j0, [&](int nn, int half, int64_t at) {
        float s0 = 0.f, s1 = 0.f;
        for (int i = k1 - 1; i >= k0; --i) {
          const float* row = b.acc + ((int64_t)p.plan.node_child[i] * p.nv + h) * SS;
          const float2 y = *reinterpret_cast<const float2*>(row + at);
          s0 += y.x, s1 += y.y;
        }
        float* x = dS + 4 * nn + 2 * half;
        x[0] = s0 + (de ? de[at] : 0.f), x[1] = s1 + (de ? de[at + 1] : 0.f);
      });
    }
    // dS, as the bf16 state products round it
    walk_state_pairs<kCols>(16 * warp, dv, j0, [&](int nn, int half, int64_t at) {
      const float* x = dS + 4 * nn + 2 * half;
      store_pair<true>(b.dsout, ((int64_t)ci.c * p.nv + h) * SS + at, x[0], x[1]);
      *reinterpret_cast<uint32_t*>(Ss + sm90::sw_offset<128>(16 * warp + gq + 8 * half, 8 * nn + 2 * tq)) =
          attn::pack_bf16x2(x[0], x[1]);
    });
    sm90::mbar_wait(&bars[step & 1], (step >> 1) & 1);
    attn::cp_async_wait<1>();
    __syncthreads();  // the stage has landed (dO's and gam's cp.async from every thread)
#pragma unroll
    for (int u = threadIdx.x; u < kGdnChunk * kCols / 8; u += kRuleThreads) {
      // dO's row a, columns j .. j + 8, as it is and scaled by scale e^(gam_a) (zero past L: dO is)
      const int a = u / (kCols / 8), j = 8 * (u % (kCols / 8));
      const float eg = a < L ? p.scale * __expf(st.gam[a]) : 0.f;
      uint4 x = *reinterpret_cast<const uint4*>(kCols == 64 ? st.do8_64(a, j) : st.do8(a, j));
      *reinterpret_cast<uint4*>(Ds + sm90::sw_offset<kGdnChunk>(a, j)) = x;
      uint32_t* w = reinterpret_cast<uint32_t*>(&x);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = unpack_bf16x2(w[e]);
        w[e] = attn::pack_bf16x2(eg * f.x, eg * f.y);
      }
      *reinterpret_cast<uint4*>(Es + sm90::sw_offset<kGdnChunk>(a, j)) = x;
    }
    if (L < kGdnChunk) {  // q's and -W's rows past L
      zero_box_rows(st.Q, 2, L, threadIdx.x, kRuleThreads);
      zero_box_rows(st.Wh, 2, L, threadIdx.x, kRuleThreads);
    }
    sm90::fence_async_smem();  // dS's, dO's and e^(gam) dO's tiles and the zeroed rows, before the MMAs
    __syncthreads();
    const float gl = st.gam[L - 1], el = __expf(gl);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) dS[i] *= el;
    const uint64_t qt = sm90::desc_mnmajor<kGdnChunk>(st.Q, 64 * wg),  // A (i, a) = q (a, i), rows 64 wg ..
        wt = sm90::desc_mnmajor<kGdnChunk>(st.Wh, 64 * wg);             // A (i, s) = -W (s, i)
    if (wg == 0) {
      float kd[kAcc] = {}, loc[kAcc] = {};  // k dS and PT dO (rows row, row + 8)
      sm90::wgmma_fence();
      const uint64_t kx = sm90::desc_kmajor<kGdnChunk>(st.K, 0),
                     pt = sm90::desc_kmajor<kGdnChunk>(reinterpret_cast<const bf16*>(st.PT), 0);
#pragma unroll
      for (int kk = 0; kk < 128 / 16; ++kk)
        Mma::template ss<0, 1>(kd, sm90::desc_add(kx, sm90::kmajor_step<kGdnChunk>(kk)),
                               sm90::desc_add(s_desc, kk * sm90::kMnStep), true);
#pragma unroll
      for (int kk = 0; kk < kGdnChunk / 16; ++kk)
        Mma::template ss<0, 1>(loc, sm90::desc_add(pt, sm90::kmajor_step<kGdnChunk>(kk)),
                               sm90::desc_add(d_desc, kk * sm90::kMnStep), true);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(kd);
      sm90::fence_regs(loc);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row + 8 * half;
        const float d = r < L ? __expf(gl - st.gam[r]) : 0.f;
#pragma unroll
        for (int nn = 0; nn < kCols / 8; ++nn) {
          const int col = 8 * nn + 2 * tq, i = 4 * nn + 2 * half;
          const float y0 = r < L ? loc[i] + d * kd[i] : 0.f, y1 = r < L ? loc[i + 1] + d * kd[i + 1] : 0.f;
          if (r < L)  // as the bf16 state and gradient products round it
            store_pair<true>(b.dvn, ((int64_t)(r0 + r) * p.nv + h) * dv + j0 + col, y0, y1);
          *reinterpret_cast<uint32_t*>(Vs + sm90::sw_offset<kGdnChunk>(r, col)) = attn::pack_bf16x2(y0, y1);
        }
      }
    } else {
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kGdnChunk / 16; ++kk)
        Mma::template ss<1, 1>(dS, sm90::desc_add(qt, kk * sm90::kMnStep), sm90::desc_add(e_desc, kk * sm90::kMnStep),
                               true);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(dS);
    }
    sm90::fence_async_smem();  // dvn's tile
    __syncthreads();           // ... is stored; every read of dS's tile is done
    if (wg == 0) {
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kGdnChunk / 16; ++kk) {
        Mma::template ss<1, 1>(dS, sm90::desc_add(qt, kk * sm90::kMnStep), sm90::desc_add(e_desc, kk * sm90::kMnStep),
                               true);
        Mma::template ss<1, 1>(dS, sm90::desc_add(wt, kk * sm90::kMnStep), sm90::desc_add(v_desc, kk * sm90::kMnStep),
                               true);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    } else {
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kGdnChunk / 16; ++kk)
        Mma::template ss<1, 1>(dS, sm90::desc_add(wt, kk * sm90::kMnStep), sm90::desc_add(v_desc, kk * sm90::kMnStep),
                               true);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
    }
    sm90::fence_regs(dS);
    if (flags & 1) {  // a node's first chunk: dS_in to its own slot of acc (its parent sums them), or its root's d_init
      const int root = p.plan.node_root[n];
      float* dst = root >= 0 ? (b.d_init ? b.d_init + ((int64_t)root * p.nv + h) * SS : nullptr)
                             : b.acc + ((int64_t)n * p.nv + h) * SS;
      if (dst)
        walk_state_pairs<kCols>(16 * warp, dv, j0, [&](int nn, int half, int64_t at) {
          const float a0 = dS[4 * nn + 2 * half], a1 = dS[4 * nn + 2 * half + 1];
          if (root >= 0)
            dst[at] += a0, dst[at + 1] += a1;
          else
            *reinterpret_cast<float2*>(dst + at) = make_float2(a0, a1);
        });
    }
    __syncthreads();  // every warpgroup is done with this stage and the tiles
  }
  attn::cp_async_wait<0>();
}

size_t bwd_walk_wgmma_smem_bytes() {
  return 1024 + 2 * BwdWalkTmaStage::kBytes + sizeof(bf16) * (128 * 64 + 3 * kGdnChunk * 64);  // + the alignment's slack
}

// Per (chunk, value head, 64 state rows i0 + i): the products with the chunk's entering state S
// and end-state gradient dS that its input gradients need, over dv (on tensor cores):
//   SdO_a[i] = S[i] . dO_a -> gq,  dSv_a[i] = dS[i] . v_new_a -> gk,  dW_a[i] = -S[i] . dvn_a -> db2,
// and the rows' share of <S, dS> -> sds[(c nv + h) ceil(dk / 64) + z] (z: the block's part).
// The chunk's rows (v_new, dvn, dO) go through shared memory, once for 64 state rows (dk <= 128:
// at most two blocks a chunk and head); S and dS, each element used by two warps, are read as fragments
// from global memory (L1), which keeps the block to two a multiprocessor: one block's loads run
// under the other's products.
constexpr int kStateRows = 64;
// kBf16 (GdnProducts::kBf16): S, dS, v_new and dvn rounded to bf16, one mma a product; S and dS
// arrive so rounded (the bf16 walks store them in bf16, p_bf16's layout: half the bytes), and
// <S, dS> sums their bf16 values; gq, gk and db2 are stored in bf16 (half the bytes again, the
// input-gradient kernel's only reads of them).
template <bool kBf16 = false>
__global__ void __launch_bounds__(kRuleThreads, 2) rule_bwd_state_kernel(RuleBwdParams b) {
  TT_EXTERN_SMEM_16(smem);
  const RuleParams& p = b.f;
  const int parts = (p.dk + kStateRows - 1) / kStateRows;
  const ChunkPart cp = chunk_part(parts);
  const int c = cp.c, h = cp.h, i0 = cp.z * kStateRows, dk = p.dk, dv = p.dv, fs = dv + 4;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c], R = min(kStateRows, dk - i0);
  float* Dvn = reinterpret_cast<float*>(smem);  // (64, dv + 4)
  float* Vn = Dvn + kGdnChunk * fs;            // (64, dv + 4)
  bf16* Db = reinterpret_cast<bf16*>(Vn + kGdnChunk * fs);  // (64, kRowStride)
  const int64_t SS = (int64_t)dk * dv;
  const int64_t s0 = ((int64_t)c * p.nv + h) * SS + (int64_t)i0 * dv;  // the block's first state element
  // kBf16: dvn and v_new arrive as bf16 rows (the walks' p_bf16 stores) at a stride of fsb elements,
  // in the same tiles' bytes.
  const int fsb = dv + 8;
  if constexpr (kBf16) {
    load_chunk_rows<true>(reinterpret_cast<bf16*>(Dvn), fsb, p_bf16(b.dvn) + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L,
                          dv);
    load_chunk_rows<true>(reinterpret_cast<bf16*>(Vn), fsb, p_bf16(p.vnew) + (int64_t)h * dv, (int64_t)p.nv * dv, r0,
                          L, dv);
  } else {
    load_chunk_rows<true>(Dvn, fs, b.dvn + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
    load_chunk_rows<true>(Vn, fs, p.vnew + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
  }
  load_chunk_rows<true>(Db, kRowStride, b.d_o + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
  attn::cp_async_commit();
  // The three products on tensor cores: rows i (the block's state rows) x columns a (the chunk's
  // rows) over dv; S, dS, v_new and dvn split into bf16 halves (split_bf16x2; with kBf16 stored in
  // bf16 by the kernels before, one part), dO exact in bf16.
  // Warp w: rows 16 (w % 4) .., columns 32 (w / 4) .. (four n8 tiles). Warps 0 to 3 (columns 0 ..
  // 31) hold every S and dS element of the block once: they sum <S, dS>.
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
  const int m0 = 16 * (warp % 4), a0 = 32 * (warp / 4);
  // The A fragment pairs of S or dS (p.sin, b.dsout) for the k-step at k0 (rows m0 + gq (+8),
  // columns k0 + 2 tq (+1, +8, +9)) from global memory, a k-step ahead of their use: fp32 pairs, or
  // with kBf16 the packed bf16 pairs the walks stored, the mma operands as they are.
  using Pair = std::conditional_t<kBf16, uint32_t, float2>;
  auto load_state = [&](Pair(&x)[4], const float* buf, int k0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = m0 + gq + 8 * (j % 2), col = k0 + 2 * tq + 8 * (j / 2);
      const int64_t at = s0 + (int64_t)r * dv + col;
      if constexpr (kBf16)
        x[j] = r < R ? __ldg(reinterpret_cast<const uint32_t*>(p_bf16(buf) + at)) : 0u;
      else
        x[j] = r < R ? __ldg(reinterpret_cast<const float2*>(buf + at)) : make_float2(0.f, 0.f);
    }
  };
  float sdo[4][4] = {}, dsv[4][4] = {}, sdv[4][4] = {};  // sdv = S . dvn (dW = -sdv)
  float sds = 0.f;
  Pair sx[4], dx[4];
  load_state(sx, p.sin, 0);
  load_state(dx, b.dsout, 0);
  attn::cp_async_wait<0>();
  __syncthreads();
  for (int k0 = 0; k0 < dv; k0 += 16) {
    uint32_t sh[4], sl[4], dh[4], dl[4], o[2][4];  // dO: n8 tile n is o[n / 2][2 (n % 2)], [.. + 1]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 s2{}, d2{};  // the values <S, dS> sums
      if constexpr (kBf16) {
        sh[j] = sx[j], dh[j] = dx[j];
        if (warp < 4) s2 = unpack_bf16x2(sx[j]), d2 = unpack_bf16x2(dx[j]);
      } else {
        split_bf16x2(sx[j].x, sx[j].y, sh[j], sl[j]);
        split_bf16x2(dx[j].x, dx[j].y, dh[j], dl[j]);
        s2 = sx[j], d2 = dx[j];
      }
      if (warp < 4) sds = fmaf(s2.x, d2.x, fmaf(s2.y, d2.y, sds));  // 0 past R
    }
    if (k0 + 16 < dv) {
      load_state(sx, p.sin, k0 + 16);
      load_state(dx, b.dsout, k0 + 16);
    }
#pragma unroll
    for (int np = 0; np < 2; ++np)
      mma::ldsm_x4(o[np], Db + (a0 + 16 * np + lane % 8 + 8 * (lane / 16)) * kRowStride + k0 + 8 * (lane / 8 % 2));
    uint32_t vq[4], rq[4];  // kBf16: two n8 tiles' B fragments of v_new and dvn, as dO's
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      uint32_t vh[2], vl[2], rh[2], rl[2];  // B (j, a) = v_new_a[j], dvn_a[j]: rows a0 + 8 n + gq
      if constexpr (kBf16) {  // by ldmatrix from the bf16 rows, n8 tiles n, n + 1 at even n
        if (n % 2 == 0) {
          const int at = (a0 + 8 * n + lane % 8 + 8 * (lane / 16)) * fsb + k0 + 8 * (lane / 8 % 2);
          mma::ldsm_x4(vq, reinterpret_cast<const bf16*>(Vn) + at);
          mma::ldsm_x4(rq, reinterpret_cast<const bf16*>(Dvn) + at);
        }
        vh[0] = vq[2 * (n % 2)], vh[1] = vq[2 * (n % 2) + 1];
        rh[0] = rq[2 * (n % 2)], rh[1] = rq[2 * (n % 2) + 1];
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        if constexpr (!kBf16) {
          const int at = (a0 + 8 * n + gq) * fs + k0 + 2 * tq + 8 * jj;
          const float2 v = *reinterpret_cast<const float2*>(Vn + at), r = *reinterpret_cast<const float2*>(Dvn + at);
          split_bf16x2(v.x, v.y, vh[jj], vl[jj]);
          split_bf16x2(r.x, r.y, rh[jj], rl[jj]);
        }
      }
      mma::mma_16816(sdo[n], sh, o[n / 2][2 * (n % 2)], o[n / 2][2 * (n % 2) + 1]);
      mma::mma_16816(dsv[n], dh, vh[0], vh[1]);
      mma::mma_16816(sdv[n], sh, rh[0], rh[1]);
      if constexpr (!kBf16) {
        mma::mma_16816(sdo[n], sl, o[n / 2][2 * (n % 2)], o[n / 2][2 * (n % 2) + 1]);
        mma::mma_16816(dsv[n], dh, vl[0], vl[1]);
        mma::mma_16816(dsv[n], dl, vh[0], vh[1]);
        mma::mma_16816(sdv[n], sh, rl[0], rl[1]);
        mma::mma_16816(sdv[n], sl, rh[0], rh[1]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = m0 + gq + 8 * (e / 2), a = a0 + 8 * n + 2 * tq + e % 2;
      if (i >= R || a >= L) continue;
      const int64_t at = ((int64_t)(r0 + a) * p.nv + h) * dk + i0 + i;
      if constexpr (kBf16) {  // db2 as the grad kernel's bf16 products round it
        p_bf16(b.gq)[at] = __float2bfloat16_rn(sdo[n][e]);
        p_bf16(b.gk)[at] = __float2bfloat16_rn(dsv[n][e]);
        p_bf16(b.db2)[at] = __float2bfloat16_rn(-sdv[n][e]);
      } else {
        b.gq[at] = sdo[n][e];
        b.gk[at] = dsv[n][e];
        b.db2[at] = -sdv[n][e];
      }
    }
  // The rows' share of <S, dS>, in a fixed order (warps 4.. add zeros).
  __shared__ float red[detail::kWarp];
  sds = detail::block_sum(sds, red);
  if (threadIdx.x == 0) b.sds[((int64_t)c * p.nv + h) * parts + cp.z] = sds;
}

size_t bwd_state_smem_bytes(int dv) {
  return sizeof(float) * (size_t)(2 * kGdnChunk) * (dv + 4) + sizeof(bf16) * (size_t)kGdnChunk * kRowStride;
}

// rule_bwd_state_wgmma_kernel's TMA descriptors: dO, v_new and dvn as (N, nv, dv) bf16, the
// entering states and their gradients (sin, dsout) as (chunks nv dk, 1, dv) bf16; boxes of 64
// columns x 64 rows.
struct StateMaps {
  CUtensorMap dO, Vn, Dvn, S, dS;
};

// rule_bwd_state_kernel's products in the bf16 kernels at dk = dv = 128, on warpgroup MMA
// (m64n64k16, fp32 accumulators, operands by TMA into 128-byte-swizzled tiles): per (chunk, value
// head, 64 state rows i0 + i), with the chunk's rows a as the products' M (so the outputs' rows a
// are the accumulators' rows and rows past L, the next node's, reach only rows never stored):
//   warpgroup 0: gq[a][i] = dO_a . S[i] and db2[a][i] = -(dvn_a . S[i]) (16 MMAs, B = S's tile
//   for both), warpgroup 1: gk[a][i] = v_new_a . dS[i] (8) and the rows' share of <S, dS>.
// The same operands as the mma.sync kernel's bf16 mode (S, dS, v_new and dvn as the walks stored
// them in bf16, dO as given), fp32 sums, gq, gk and db2 stored in bf16 as it stores them; two
// blocks a multiprocessor (80 KB of tiles each).
__global__ void __launch_bounds__(kRuleThreads, 2) rule_bwd_state_wgmma_kernel(RuleBwdParams b,
                                                                              const __grid_constant__ StateMaps maps) {
  namespace sm90 = attn::sm90;
  using Mma = sm90::Wgmma<kStateRows>;
  TT_EXTERN_SMEM_16(smem_raw);
  __shared__ uint64_t bar;
  __shared__ float red[detail::kWarp];
  constexpr int kTile = kGdnChunk * 128;  // a (64, 128) bf16 tile: two 64-column boxes
  const RuleParams& p = b.f;
  const ChunkPart cp = chunk_part(128 / kStateRows);
  const int c = cp.c, h = cp.h, i0 = cp.z * kStateRows;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c];
  bf16* Do = reinterpret_cast<bf16*>(align_up_1024(smem_raw));  // (64, 128) tiles: dO, v_new, dvn, S, dS
  bf16* Vn = Do + kTile;
  bf16* Dv = Vn + kTile;
  bf16* Sx = Dv + kTile;
  bf16* Dx = Sx + kTile;
  if (threadIdx.x == 0) {
    sm90::mbar_init(&bar, 1);
    sm90::fence_barrier_init();
    sm90::mbar_expect_tx(&bar, 5 * kTile * sizeof(bf16));
    const int srow = (c * p.nv + h) * 128 + i0;  // the block's state rows in the (chunks nv dk, dv) view
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int off = a * (kGdnChunk * 64);
      sm90::tma_load_3d(Do + off, &maps.dO, 64 * a, h, r0, &bar);
      sm90::tma_load_3d(Vn + off, &maps.Vn, 64 * a, h, r0, &bar);
      sm90::tma_load_3d(Dv + off, &maps.Dvn, 64 * a, h, r0, &bar);
      sm90::tma_load_3d(Sx + off, &maps.S, 64 * a, 0, srow, &bar);
      sm90::tma_load_3d(Dx + off, &maps.dS, 64 * a, 0, srow, &bar);
    }
  }
  __syncthreads();  // the barrier is initialised
  sm90::mbar_wait(&bar, 0);
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, wg = warp / 4, gq = lane / 4,
            tq = lane % 4;
  const int row = 16 * (warp % 4) + gq;  // this thread's accumulator rows (chunk rows a): row, row + 8
  const uint64_t s_desc = sm90::desc_kmajor<kStateRows>(Sx, 0);
  float sds = 0.f;
  // f(a, i, x0, x1) for each pair of an accumulator (rows row, row + 8; columns 8 n + 2 tq, + 1) in
  // the chunk (a < L).
  auto each_pair = [&](const float(&d)[32], auto&& f) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int a = row + 8 * half;
      if (a >= L) continue;
#pragma unroll
      for (int n = 0; n < kStateRows / 8; ++n) f(a, 8 * n + 2 * tq, d[4 * n + 2 * half], d[4 * n + 2 * half + 1]);
    }
  };
  auto at = [&](int a, int i) { return ((int64_t)(r0 + a) * p.nv + h) * 128 + i0 + i; };
  if (wg == 0) {
    float gqa[32] = {}, sdv[32] = {};  // dO S^T and dvn S^T
    sm90::wgmma_fence();
    const uint64_t o = sm90::desc_kmajor<kGdnChunk>(Do, 0), r = sm90::desc_kmajor<kGdnChunk>(Dv, 0);
#pragma unroll
    for (int kk = 0; kk < 128 / 16; ++kk) {
      Mma::template ss<0, 0>(gqa, sm90::desc_add(o, sm90::kmajor_step<kGdnChunk>(kk)),
                             sm90::desc_add(s_desc, sm90::kmajor_step<kStateRows>(kk)), kk > 0);
      Mma::template ss<0, 0>(sdv, sm90::desc_add(r, sm90::kmajor_step<kGdnChunk>(kk)),
                             sm90::desc_add(s_desc, sm90::kmajor_step<kStateRows>(kk)), kk > 0);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(gqa);
    sm90::fence_regs(sdv);
    each_pair(gqa, [&](int a, int i, float x0, float x1) {
      *reinterpret_cast<uint32_t*>(p_bf16(b.gq) + at(a, i)) = attn::pack_bf16x2(x0, x1);
    });
    each_pair(sdv, [&](int a, int i, float x0, float x1) {  // as the grad kernel's bf16 products round it
      *reinterpret_cast<uint32_t*>(p_bf16(b.db2) + at(a, i)) = attn::pack_bf16x2(-x0, -x1);
    });
  } else {
    float dsv[32] = {};  // v_new dS^T
    sm90::wgmma_fence();
    const uint64_t v = sm90::desc_kmajor<kGdnChunk>(Vn, 0), d = sm90::desc_kmajor<kStateRows>(Dx, 0);
#pragma unroll
    for (int kk = 0; kk < 128 / 16; ++kk)
      Mma::template ss<0, 0>(dsv, sm90::desc_add(v, sm90::kmajor_step<kGdnChunk>(kk)),
                             sm90::desc_add(d, sm90::kmajor_step<kStateRows>(kk)), kk > 0);
    sm90::wgmma_commit();
    {  // <S, dS> over the block's rows while the products run: 64 of each a thread, in a fixed order
      const int t = threadIdx.x - 128;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int e = 8 * (t + 128 * u);  // 16-byte units: the same offset in both tiles
        const uint4 xs = *reinterpret_cast<const uint4*>(Sx + e), xd = *reinterpret_cast<const uint4*>(Dx + e);
        const uint32_t* ws = reinterpret_cast<const uint32_t*>(&xs);
        const uint32_t* wd = reinterpret_cast<const uint32_t*>(&xd);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 s2 = unpack_bf16x2(ws[w]), d2 = unpack_bf16x2(wd[w]);
          sds = fmaf(s2.x, d2.x, fmaf(s2.y, d2.y, sds));
        }
      }
    }
    sm90::wgmma_wait<0>();
    sm90::fence_regs(dsv);
    each_pair(dsv, [&](int a, int i, float x0, float x1) {
      *reinterpret_cast<uint32_t*>(p_bf16(b.gk) + at(a, i)) = attn::pack_bf16x2(x0, x1);
    });
  }
  sds = detail::block_sum(sds, red);  // warpgroup 0 adds zeros
  if (threadIdx.x == 0) b.sds[((int64_t)c * p.nv + h) * (128 / kStateRows) + cp.z] = sds;
}

size_t bwd_state_wgmma_smem_bytes() { return 1024 + 5 * sizeof(bf16) * kGdnChunk * 128; }  // + the alignment's slack

// Whether the state products run on warpgroup MMA (rule_bwd_state_wgmma_kernel): the bf16 kernels
// at dk = dv = 128.
constexpr bool state_on_wgmma(bool b16, int dk, int dv) { return b16 && dk == 128 && dv == 128; }

// dst[a][b] = X_a . Y_b for the 64 x 64 pairs of bf16 rows X (kRowStride) and fp32 rows Y (stride
// ys), d a multiple of 16, on tensor cores: Y split into bf16 halves (Y = Y_hi + Y_lo to a relative
// 2^-16, X exact), two mma a tile, summed in fp32; then a block barrier. A warp takes 16 rows x 32
// columns, as chunk_gram.
__device__ __forceinline__ void chunk_gram_split(float* dst, int stride, const bf16* X, const float* Y, int ys, int d) {
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4), gq = lane / 4, tq = lane % 4;
  float c[4][4] = {};
  for (int k0 = 0; k0 < d; k0 += 16) {
    uint32_t a[4];
    mma::ldsm_x4(a, X + (m0 + lane % 8 + 8 * (lane / 8 % 2)) * kRowStride + k0 + 8 * (lane / 16));
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      uint32_t bh[2], bl[2];  // B (k, n) = Y_n's columns k0 + 2 tq (+1) and k0 + 2 tq + 8 (+9)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 y = *reinterpret_cast<const float2*>(Y + (n0 + 8 * n + gq) * ys + k0 + 2 * tq + 8 * j);
        split_bf16x2(y.x, y.y, bh[j], bl[j]);
      }
      mma::mma_16816(c[n], a, bh[0], bh[1]);
      mma::mma_16816(c[n], a, bl[0], bl[1]);
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int col = n0 + 8 * n + 2 * tq;
    *reinterpret_cast<float2*>(dst + (m0 + gq) * stride + col) = make_float2(c[n][0], c[n][1]);
    *reinterpret_cast<float2*>(dst + (m0 + gq + 8) * stride + col) = make_float2(c[n][2], c[n][3]);
  }
  __syncthreads();
}

// The first of row `row`'s dk running sums (RuleBwdParams::rq, rk) of value head h, the hh-th of
// its key head's group (kh = h / (nv / nk), which every caller has at hand): the group's first
// head's row (run_heads nv: that head has read its gq and gk rows by then), or the key head's
// (run_heads nk).
__device__ __forceinline__ int64_t run_row(const RuleBwdParams& b, int row, int h, int hh, int kh) {
  return ((int64_t)row * b.run_heads + (b.run_heads == b.f.nv ? h - hh : kh)) * b.f.dk;
}

// Value head h's gradients of q~ and k, vq and vk, at packed row `row`, key dim i (h the hh-th of
// its key head's group, every head of which the same block takes in turn, the same thread the same
// elements): added to the group's running sums (run_row), or at the group's last head the key
// head's gradients dq = scale sum gq and dk = sum gk (+= the bf16 values there with accumulate),
// rounded to bf16 once. The sums run in head order from 0. The CUDA-core phase F's (dk not a
// multiple of 16); grad_qk_mma does the same a pair at a time, its loads ahead of the products.
__device__ __forceinline__ void group_sum_out(const RuleBwdParams& b, int row, int h, int hh, int i, float vq, float vk) {
  const RuleParams& p = b.f;
  const int group = p.nv / p.nk, dk = p.dk;
  const int64_t run = run_row(b, row, h, hh, h / group) + i;
  float q = (hh > 0 ? b.rq[run] : 0.f) + vq, k = (hh > 0 ? b.rk[run] : 0.f) + vk;
  if (hh + 1 < group) {
    b.rq[run] = q, b.rk[run] = k;
    return;
  }
  const int64_t out = ((int64_t)row * p.nk + h / group) * dk + i;
  q *= p.scale;
  if (b.accumulate) q += bf(b.dq_out[out]), k += bf(b.dk_out[out]);
  b.dq_out[out] = __float2bfloat16_rn(q), b.dk_out[out] = __float2bfloat16_rn(k);
}

// Phase F of rule_bwd_grad_kernel on tensor cores (dk a multiple of 16): over the chunk's rows x,
// aq_r = sum_x DOVd_rx k_x and ak_r = sum_x (scale DOVd_xr q~_x + (MK_xr + MK_rx) k_x), the fp32
// pair matrices split into bf16 halves (two mma each; q~ and k exact in bf16, read by transposing
// ldmatrix), then gq_r = Fq_r + aq_r and gk_r = Fk_r + ak_r with phase D's row terms Fq_r =
// e^(gam_r) S dO_r and Fk_r = e^(gam_L - gam_r) dS v_new_r + beta_r e^(gam_r) dB2_r, plus at hh >
// 0 the group's running sums (run_row's rows, group_sum_out's), in shared memory
// (rows of kGradFStride floats), so that F waits on no global load. A warp takes 16 rows (m0) and
// every other 16 columns (from n0); rows past L and the pair matrices' entries past L are zero.
// kBf16 (GdnProducts::kBf16): the pair matrices rounded to bf16, one mma a product.
constexpr int kGradFStride = 2 * kPairStride;  // Fq's and Fk's rows: two pair matrices' bytes each
template <bool kBf16>
__device__ __forceinline__ void grad_qk_mma(const RuleBwdParams& b, const bf16* Qb, const bf16* Kb, const float* DOVd,
                                            const float* MK, const float* Fq, const float* Fk, int r0, int L, int h,
                                            int hh) {
  const RuleParams& p = b.f;
  const int dk = p.dk, lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int m0 = 16 * (warp % 4), n0 = 16 * (warp / 4), n16 = dk / 16;
  constexpr int PS = kPairStride, FS = kGradFStride;
  float aq[4][2][4] = {}, ak[4][2][4] = {};  // [16-column tile t: columns n0 + 32 t][n8 half][fragment]
  const int gq = lane / 4, tq = lane % 4;
  const int group = p.nv / p.nk;
  for (int k0 = 0; k0 < kGdnChunk; k0 += 16) {
    uint32_t dh[4], dl[4], th[4], tl[4], mh[4], ml[4];
    a_fragment_parts<kBf16>(dh, dl, m0, k0, [&](int r, int x) { return DOVd[r * PS + x]; });
    a_fragment_parts<kBf16>(th, tl, m0, k0, [&](int r, int x) { return p.scale * DOVd[x * PS + r]; });
    a_fragment_parts<kBf16>(mh, ml, m0, k0, [&](int r, int x) { return MK[x * PS + r] + MK[r * PS + x]; });
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int col = n0 + 32 * t;
      if (col >= 16 * n16) break;
      const int off = (k0 + lane % 8 + 8 * (lane / 8 % 2)) * kRowStride + col + 8 * (lane / 16);
      uint32_t kb[4], qb[4];
      mma::ldsm_x4_trans(kb, Kb + off);
      mma::ldsm_x4_trans(qb, Qb + off);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        mma::mma_16816(aq[t][n], dh, kb[2 * n], kb[2 * n + 1]);
        if constexpr (!kBf16) mma::mma_16816(aq[t][n], dl, kb[2 * n], kb[2 * n + 1]);
        mma::mma_16816(ak[t][n], th, qb[2 * n], qb[2 * n + 1]);
        if constexpr (!kBf16) mma::mma_16816(ak[t][n], tl, qb[2 * n], qb[2 * n + 1]);
        mma::mma_16816(ak[t][n], mh, kb[2 * n], kb[2 * n + 1]);
        if constexpr (!kBf16) mma::mma_16816(ak[t][n], ml, kb[2 * n], kb[2 * n + 1]);
      }
    }
  }
  // The sums: the group's running sums (fp32, run_row's rows), or at its last head the key
  // head's gradients, scale sum gq and sum gk (+= the bf16 values there with accumulate, all of them
  // loaded before any store), in bf16 (as group_sum_out).
  const bool last = hh + 1 == group, add = last && b.accumulate;
  uint32_t oq[2][4][2] = {}, ok[2][4][2] = {};  // with `add`: the bf16 pairs there (any bf16 alignment)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = m0 + gq + 8 * half;
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        if (!add || r >= L || n0 + 32 * t >= 16 * n16) continue;
        const int64_t out = ((int64_t)(r0 + r) * p.nk + h / group) * dk + n0 + 32 * t + 8 * n + 2 * tq;
        const uint16_t *q = reinterpret_cast<const uint16_t*>(b.dq_out + out), *k = reinterpret_cast<const uint16_t*>(b.dk_out + out);
        oq[half][t][n] = q[0] | (uint32_t)q[1] << 16, ok[half][t][n] = k[0] | (uint32_t)k[1] << 16;
      }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = m0 + gq + 8 * half;
    if (r >= L) continue;
    const int64_t run = run_row(b, r0 + r, h, hh, h / group), out = ((int64_t)(r0 + r) * p.nk + h / group) * dk;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int col = n0 + 32 * t;
      if (col >= 16 * n16) break;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int i = col + 8 * n + 2 * tq;
        const float2 fq = *reinterpret_cast<const float2*>(Fq + r * FS + i),
                     fk = *reinterpret_cast<const float2*>(Fk + r * FS + i);
        float2 q = make_float2(fq.x + aq[t][n][2 * half], fq.y + aq[t][n][2 * half + 1]);
        float2 k = make_float2(fk.x + ak[t][n][2 * half], fk.y + ak[t][n][2 * half + 1]);
        if (!last) {
          *reinterpret_cast<float2*>(b.rq + run + i) = q;
          *reinterpret_cast<float2*>(b.rk + run + i) = k;
          continue;
        }
        q.x *= p.scale, q.y *= p.scale;
        if (add) {
          const float2 a = unpack_bf16x2(oq[half][t][n]), c = unpack_bf16x2(ok[half][t][n]);
          q.x += a.x, q.y += a.y, k.x += c.x, k.y += c.y;
        }
        bf16 *dq = b.dq_out + out + i, *dkp = b.dk_out + out + i;
        if ((reinterpret_cast<uintptr_t>(dq) & 3) == 0 && (reinterpret_cast<uintptr_t>(dkp) & 3) == 0) {
          *reinterpret_cast<__nv_bfloat162*>(dq) = __floats2bfloat162_rn(q.x, q.y);
          *reinterpret_cast<__nv_bfloat162*>(dkp) = __floats2bfloat162_rn(k.x, k.y);
        } else {  // two bytes past a 4-byte boundary (the outputs may sit at any bf16 address)
          dq[0] = __float2bfloat16_rn(q.x), dq[1] = __float2bfloat16_rn(q.y);
          dkp[0] = __float2bfloat16_rn(k.x), dkp[1] = __float2bfloat16_rn(k.y);
        }
      }
    }
  }
}

// Per (chunk, value head): the gradients of the chunk's inputs (ops/cpu/gdn.h
// gdn_tree_backward_chunked), with S dO_a, dS v_new_a and dW_a = -dvn_a S^T from
// rule_bwd_state_kernel (in gq, gk, db2). In phases, each from shared memory:
//   A: the chunk's pair matrices KKd = e^(gam_a - gam_b) k_a . k_b (b < a; A = beta_a KKd),
//      QK = q~_a . k_b and DOVd = e^(gam_a - gam_b) dO_a . v_new_b (b <= a);
//   B: [dB1 | dB2] = M^-T [dvn | dW] = T^T [dvn | dW], T = (I + A)^-1 kept by the prep, on tensor cores;
//   C: dA_ab = -(dB1_a . U_b + dB2_a . W_b) (b < a), on tensor cores as -(Z T^T)_ab with Z_ac =
//      beta_c (dB1_a . v_c + e^(gam_c) dB2_a . k_c) (U and W are T times those rows), MK = dA beta_a
//      e^(gam_a - gam_b), the pair terms QK DOVd + dA A and dA KKd;
//   D: four threads a row: dgam's row terms, dbeta, dv = beta dB1; with F on tensor cores also
//      F's row terms e^(gam) S dO and e^(gam_L - gam) dS v_new + beta e^(gam) dB2 (plus the
//      group's running sums) into shared memory, so that F reads no global memory;
//   E: dg, the reverse cumulative sum of dgam;
//   F: dq~ = e^(gam) S dO + DOVd K and dk = e^(gam_L - gam) dS v_new + beta e^(gam) dB2
//      + DOVd^T q~ + MK^T K + MK K: on tensor cores (grad_qk_mma) when dk is a multiple of 16,
//      else a 4 x 8 register tile a thread. q~'s and k's gradients are summed over the key
//      head's group as its value heads go (group_sum_out; rule_bwd_grad_kernel runs them in turn).
// kD: 128 when dk = dv = 128 (Qwen3-Next's and Qwen3.5's heads: the loops over them unroll), else
// 0 (p.dk, p.dv). (rule_bwd_local_kernel measured no faster so; rule_bwd_state_kernel spills at
// its 128-register cap.)
// kBf16 (GdnProducts::kBf16; dk a multiple of 16): the tensor-core products' fp32 operands (v_new,
// [dvn | dW], T, Z and the pair matrices) rounded to bf16, one mma a product, fp32 sums; S dO and
// dS v_new arrive in bf16 (the state kernel's stores), the group's running sums in fp32 rows of
// their own (RuleBwdParams::rq, rk); [dB1 | dB2] as two bf16 planes (split_bf16x2), the high one
// phase C's operand by ldmatrix, high + low D's row terms (within 2^-17 of fp32): phase C's
// products the same bits as from fp32 rows, the input-gradient kernel 3.6% faster (ncu, H100).
template <int kD, bool kBf16>
__device__ __forceinline__ void grad_head(const RuleBwdParams& b, int c, int h, int hh) {
  TT_EXTERN_SMEM_16(smem);
  const RuleParams& p = b.f;
  const int kh = h / (p.nv / p.nk), dk = kD ? kD : p.dk, dv = kD ? kD : p.dv, X = dv + dk;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c];
  constexpr int C = kGdnChunk, PS = kPairStride;
  constexpr int kFs = 128 + 4;  // v_new's fp32 row stride in phase A
  bf16* Qb = reinterpret_cast<bf16*>(smem);                         // (64, kRowStride) q
  bf16* Kb = Qb + C * kRowStride;                                   // (64, kRowStride) k
  float* KKd = reinterpret_cast<float*>(Kb + C * kRowStride);       // (64, PS), then dA KKd
  float* QK = KKd + C * PS;                                         // (64, PS), then the pair terms
  float* DOVd = QK + C * PS;                                        // (64, PS)
  float* MK = DOVd + C * PS;                                        // (64, PS)
  float* gam = MK + C * PS;                                         // (64)
  float* bet = gam + C;                                             // (64)
  float* dgam = bet + C;                                            // (64)
  float* te = dgam + C;                                             // (64) e^(gam_L - gam_a) k_a . dS v_new_a
  bf16* Vb = reinterpret_cast<bf16*>(te + C);                       // (64, kRowStride) v (phase C)
  float* Zs = reinterpret_cast<float*>(Vb + C * kRowStride);        // (64, PS) phase C's Z
  bf16* Z16 = reinterpret_cast<bf16*>(Zs);  // kBf16: Z in bf16 rows of kZ16Stride instead
  constexpr int kZ16Stride = C + 8;         // 144 bytes: ldmatrix on distinct banks
  // F on tensor cores: its row terms from D (grad_qk_mma), in KKd and QK's bytes and in v's and Z's
  float* Fq = KKd;
  float* Fk = reinterpret_cast<float*>(Vb);
  static_assert(sizeof(bf16) * kRowStride == sizeof(float) * kPairStride && kGradFStride == 2 * kPairStride,
                "Fq fills KKd and QK, Fk v's rows and Z");
  float* R = Zs + C * PS;  // phase A: dO, v_new (kBf16: and [dvn | dW]); then [dB1 | dB2] (64, X + 4)
  bf16* Db = reinterpret_cast<bf16*>(R);                            // (64, kRowStride) dO
  float* Vn = reinterpret_cast<float*>(Db + C * kRowStride);        // (64, kFs) v_new
  float* XB = R;
  const int XS = X + 4;  // XB's row stride: the tensor-core fragment reads on distinct banks
  // kBf16: [dB1 | dB2] as two bf16 planes instead (split_bf16x2: hi the value rounded to bf16, as
  // phase C's products take it, by ldmatrix; hi + lo for D's row terms, within 2^-17 of fp32)
  const int XSh = X + 8;
  bf16* XBh = reinterpret_cast<bf16*>(R);
  bf16* XBl = XBh + C * XSh;
  auto xb8 = [&](float (&x)[8], int a, int j) {  // [dB1 | dB2]'s row a, columns j .. j + 8
    if constexpr (kBf16) {
      float lo[8];
      detail::load_bf16<8>(x, XBh + a * XSh + j);
      detail::load_bf16<8>(lo, XBl + a * XSh + j);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] += lo[e];
    } else {
      detail::load_f32<8>(x, XB + a * XS + j);
    }
  };
  auto rowi = [&](int a) { return (int64_t)(r0 + a) * p.nv + h; };
  if (hh == 0) {  // the key head's rows: the group's later heads find them in place (nothing writes Qb, Kb)
    load_chunk_rows(Qb, kRowStride, p.q + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
    load_chunk_rows(Kb, kRowStride, p.k + (int64_t)kh * dk, (int64_t)p.nk * dk, r0, L, dk);
  }
  load_chunk_rows(Db, kRowStride, b.d_o + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
  bf16* Vnb = reinterpret_cast<bf16*>(Vn);  // kBf16: v_new's bf16 rows (p_bf16) at kRowStride
  if constexpr (kBf16)
    load_chunk_rows(Vnb, kRowStride, p_bf16(p.vnew) + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
  else
    load_chunk_rows(Vn, kFs, p.vnew + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
  load_chunk_gam(gam, p.gam, p.nv, h, r0, L);
  // T, for phases B and C (kBf16: bf16 rows at kRowStride, p_bf16, in MK's bytes)
  const bf16* Tb = reinterpret_cast<const bf16*>(MK);
  if constexpr (kBf16)
    load_chunk_rows(reinterpret_cast<bf16*>(MK), kRowStride, p_bf16(p.T) + ((int64_t)c * p.nv + h) * C * C, C, 0, C, C);
  else
    load_chunk_rows(MK, PS, p.T + ((int64_t)c * p.nv + h) * C * C, C, 0, C, C);
  if (dk % 16 == 0) load_chunk_rows(Vb, kRowStride, p.v + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);  // C
  // [dvn | dW] for phase B: kBf16, bf16 rows (the walks' and the state kernel's p_bf16 stores) at a
  // stride of XSb elements past dO's and v_new's rows, with the rest; else fp32 rows in XB after
  // phase A. Phase B reads them before it writes [dB1 | dB2] over them.
  const int XSb = X + 8;
  bf16* XBb = reinterpret_cast<bf16*>(R) + 2 * C * kRowStride;
  if constexpr (kBf16) {
    load_chunk_rows(XBb, XSb, p_bf16(b.dvn) + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
    load_chunk_rows(XBb + dv, XSb, p_bf16(b.db2) + (int64_t)h * dk, (int64_t)p.nv * dk, r0, L, dk);
  }
  attn::cp_async_commit();
  for (int r = threadIdx.x; r < C; r += blockDim.x) {
    bet[r] = r < L ? ld(p.beta + rowi(r)) : 0.f;
    dgam[r] = 0.f;
  }
  attn::cp_async_wait<0>();
  __syncthreads();
  const float gl = gam[L - 1];
  const int ta = threadIdx.x / 16, tb = threadIdx.x % 16;
  {  // A
    chunk_gram(KKd, PS, false, Kb, Kb, dk);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int a = ta + 16 * u, bb = tb + 16 * v;
        float& x = KKd[a * PS + bb];
        x = bb < a && a < L ? __expf(gam[a] - gam[bb]) * x : 0.f;
      }
    chunk_gram(QK, PS, false, Qb, Kb, dk);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int a = ta + 16 * u, bb = tb + 16 * v;
        float& x = QK[a * PS + bb];
        x = bb <= a && a < L ? p.scale * x : 0.f;
      }
    if constexpr (kBf16)
      chunk_gram(DOVd, PS, false, Db, Vnb, dv);  // both bf16 rows
    else
      chunk_gram_split(DOVd, PS, Db, Vn, kFs, dv);  // dv is a multiple of 32
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int a = ta + 16 * u, bb = tb + 16 * v;
        float& x = DOVd[a * PS + bb];
        x = bb <= a && a < L ? __expf(gam[a] - gam[bb]) * x : 0.f;
      }
  }
  __syncthreads();  // dO and v_new are read no more: R becomes [dB1 | dB2]
  if constexpr (!kBf16) {
    load_chunk_rows(XB, XS, b.dvn + (int64_t)h * dv, (int64_t)p.nv * dv, r0, L, dv);
    load_chunk_rows(XB + dv, XS, b.db2 + (int64_t)h * dk, (int64_t)p.nv * dk, r0, L, dk);
    attn::cp_async_commit();
    attn::cp_async_wait<0>();
    __syncthreads();
  }
  {  // B: [dB1 | dB2] = T^T [dvn | dW] on tensor cores (T from the prep, in MK; both split into bf16
     // halves, three mma a tile; with kBf16 both bf16 (p_bf16), one mma). Warp w takes the n8 column
     // tiles w, w + 8, .. of all 64 rows; T^T's row block m has nonzero k blocks >= m only (T is lower
     // triangular). Rows past L stay 0: their right-hand sides are 0 and T^T is upper triangular.
    constexpr int kTiles = 4;  // n8 tiles a warp: X <= 256
    const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, gq = lane / 4, tq = lane % 4;
    float acc[4][kTiles][4] = {};  // [row block][tile][fragment]
#pragma unroll
    for (int k0 = 0; k0 < C; k0 += 16) {
      uint32_t bh[kTiles][2], bl[kTiles][2];  // B (b, j) = XB_bj: rows k0 + 2 tq (+1, +8, +9), column n0 + gq
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        if constexpr (kBf16) {  // a transposing ldmatrix of the bf16 rows k0 .. k0 + 16
          if (8 * (warp + 8 * t) < X)
            mma::ldsm_x2_trans(bh[t], XBb + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * XSb + 8 * (warp + 8 * t));
        } else {
          const int col = 8 * (warp + 8 * t) + gq;
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int rb = k0 + 2 * tq + 8 * jj;
            if (col < X) split_bf16x2(XB[rb * XS + col], XB[(rb + 1) * XS + col], bh[t][jj], bl[t][jj]);
          }
        }
      }
#pragma unroll
      for (int m = 0; m <= k0 / 16; ++m) {
        uint32_t ah[4], al[4];  // A (a, b) = T_ba
        if constexpr (kBf16)  // T's bf16 rows b by a transposing ldmatrix
          mma::ldsm_x4_trans(ah, Tb + (k0 + lane % 8 + 8 * (lane / 16)) * kRowStride + 16 * m + 8 * (lane / 8 % 2));
        else
          a_fragment_parts<false>(ah, al, 16 * m, k0, [&](int a, int bb) { return MK[bb * PS + a]; });
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          if (8 * (warp + 8 * t) >= X) break;
          mma::mma_16816(acc[m][t], ah, bh[t][0], bh[t][1]);
          if constexpr (!kBf16) {
            mma::mma_16816(acc[m][t], ah, bl[t][0], bl[t][1]);
            mma::mma_16816(acc[m][t], al, bh[t][0], bh[t][1]);
          }
        }
      }
    }
    __syncthreads();  // every warp has read the right-hand sides
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const int col = 8 * (warp + 8 * t) + 2 * tq;
        if (col >= X) break;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = 16 * m + gq + 8 * half;
          if constexpr (kBf16) {
            split_bf16x2(acc[m][t][2 * half], acc[m][t][2 * half + 1], *reinterpret_cast<uint32_t*>(XBh + r * XSh + col),
                         *reinterpret_cast<uint32_t*>(XBl + r * XSh + col));
          } else {
            *reinterpret_cast<float2*>(XB + r * XS + col) = make_float2(acc[m][t][2 * half], acc[m][t][2 * half + 1]);
          }
        }
      }
  }
  __syncthreads();
  {  // C: dA from dB1 . U_b + dB2 . W_b (on tensor cores by way of T, below; else U, W rows from global memory)
    // The pair terms from dA, element by element: (a, bb) and its acc = dB1_a . U_bb + dB2_a . W_bb.
    auto pair_terms = [&](int a, int bb, float acc) {
      const int e = a * PS + bb;
      const float da = bb < a && a < L ? -acc : 0.f, kkd = KKd[e];
      QK[e] = QK[e] * DOVd[e] + da * bet[a] * kkd;  // the pair term (0 where b > a)
      // Zero outside b < a < L: rows past L hold gam = 0, where e^(0 - gam_b) can overflow.
      MK[e] = bb < a && a < L ? da * bet[a] * __expf(gam[a] - gam[bb]) : 0.f;
      KKd[e] = da * kkd;
    };
    if (kBf16 || dk % 16 == 0) {  // on tensor cores, without reading U and W: U_b = sum_c T_bc beta_c v_c and W_b =
      // sum_c T_bc beta_c e^(gam_c) k_c, so acc_ab = sum_c T_bc Z_ac with Z_ac = beta_c (dB1_a . v_c +
      // e^(gam_c) dB2_a . k_c): Z from [dB1 | dB2] in bf16 halves and the exact bf16 v and k rows (two
      // mma a tile), then Z T^T with both in halves (three mma a tile, T^T's zero blocks skipped);
      // with kBf16 (always here: dk % 16 == 0, XB bf16 planes) each operand rounded to bf16, one mma
      // a tile, [dB1 | dB2]'s by ldmatrix from the high plane.
      const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
      const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4), gq = lane / 4, tq = lane % 4;
      {
        float z[2][4][4] = {};  // [v part, k part][n8 tile][fragment]
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          const int d = part ? dk : dv, x0 = part ? dv : 0;
          const bf16* Y = part ? Kb : Vb;
          for (int k0 = 0; k0 < d; k0 += 16) {
            uint32_t ah[4], al[4], b0[4], b1[4];
            if constexpr (kBf16)  // the high plane: the values rounded to bf16
              mma::ldsm_x4(ah, XBh + (m0 + lane % 8 + 8 * (lane / 8 % 2)) * XSh + x0 + k0 + 8 * (lane / 16));
            else
              a_fragment_parts<kBf16>(ah, al, m0, k0, [&](int r, int j) { return XB[r * XS + x0 + j]; });
            mma::ldsm_x4(b0, Y + (n0 + lane % 8 + 8 * (lane / 16)) * kRowStride + k0 + 8 * (lane / 8 % 2));
            mma::ldsm_x4(b1, Y + (n0 + 16 + lane % 8 + 8 * (lane / 16)) * kRowStride + k0 + 8 * (lane / 8 % 2));
#pragma unroll
            for (int n = 0; n < 4; ++n) {
              const uint32_t* bn = n < 2 ? b0 + 2 * n : b1 + 2 * (n - 2);
              mma::mma_16816(z[part][n], ah, bn[0], bn[1]);
              if constexpr (!kBf16) mma::mma_16816(z[part][n], al, bn[0], bn[1]);
            }
          }
        }
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int a = m0 + gq + 8 * half, cc = n0 + 8 * n + 2 * tq;
            float zz[2];  // 0 past L (beta)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              zz[e] = bet[cc + e] * (z[0][n][2 * half + e] + __expf(gam[cc + e]) * z[1][n][2 * half + e]);
            if constexpr (kBf16)  // Z T^T's operand as it rounds it
              *reinterpret_cast<uint32_t*>(Z16 + a * kZ16Stride + cc) = attn::pack_bf16x2(zz[0], zz[1]);
            else
              Zs[a * PS + cc] = zz[0], Zs[a * PS + cc + 1] = zz[1];
          }
      }
      __syncthreads();  // Z is stored
      float c4[4][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 16) {
        if (k0 >= n0 + 32) break;  // T_bc = 0 for c > b
        uint32_t ah[4], al[4];
        if constexpr (kBf16)
          mma::ldsm_x4(ah, Z16 + (m0 + lane % 8 + 8 * (lane / 8 % 2)) * kZ16Stride + k0 + 8 * (lane / 16));
        else
          a_fragment_parts<kBf16>(ah, al, m0, k0, [&](int r, int j) { return Zs[r * PS + j]; });
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          uint32_t bh[2], bl[2];  // B (c, b) = T_bc: columns k0 + 2 tq (+1, +8, +9) of T's row b = n0 + 8 n + gq
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            if constexpr (kBf16) {
              bh[jj] = *reinterpret_cast<const uint32_t*>(Tb + (n0 + 8 * n + gq) * kRowStride + k0 + 2 * tq + 8 * jj);
            } else {
              const float2 t = *reinterpret_cast<const float2*>(MK + (n0 + 8 * n + gq) * PS + k0 + 2 * tq + 8 * jj);
              split_bf16x2(t.x, t.y, bh[jj], bl[jj]);
            }
          }
          mma::mma_16816(c4[n], ah, bh[0], bh[1]);
          if constexpr (!kBf16) {
            mma::mma_16816(c4[n], ah, bl[0], bl[1]);
            mma::mma_16816(c4[n], al, bh[0], bh[1]);
          }
        }
      }
      __syncthreads();  // every warp has read T (MK) before the pair terms overwrite it
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) pair_terms(m0 + gq + 8 * (e / 2), n0 + 8 * n + 2 * tq + e % 2, c4[n][e]);
    } else {
      float acc[4][4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[u][v] = 0.f;
      for (int part = 0; part < 2; ++part) {
        const int d = part ? dk : dv, x0 = part ? dv : 0;
        const float* Y = part ? p.W : p.U;
        for (int i = 0; i < d; i += 4) {
          float4 x[4], y[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) x[u] = *reinterpret_cast<const float4*>(XB + (ta + 16 * u) * XS + x0 + i);
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const int bb = tb + 16 * v;
            y[v] = bb < L ? *reinterpret_cast<const float4*>(Y + rowi(bb) * d + i) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int v = 0; v < 4; ++v)
              acc[u][v] =
                  fmaf(x[u].x, y[v].x, fmaf(x[u].y, y[v].y, fmaf(x[u].z, y[v].z, fmaf(x[u].w, y[v].w, acc[u][v]))));
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int v = 0; v < 4; ++v) pair_terms(ta + 16 * u, tb + 16 * v, acc[u][v]);
    }
  }
  __syncthreads();
  const bool f_tc = kBf16 || dk % 16 == 0;  // F on tensor cores (grad_qk_mma), its row terms from D (kBf16: dk % 16 == 0)
  {  // D: four threads a row (row threadIdx.x / 4, columns 8 part + 32 u): the row's global values
     // (S dO, dS v_new, with f_tc at hh > 0 the group's running sums, and dv, dbeta when
     // accumulating) issued first, the shared-memory terms computed while they arrive, then the
     // row's six sums across its four threads (two shuffles); with f_tc, then F's row terms (Fq,
     // Fk). Every thread takes part in the shuffles; rows past L add zeros and store nothing.
    constexpr int kU = 4;  // groups of 8 columns a thread: 128 / 32
    const int a = threadIdx.x / 4, part = threadIdx.x % 4;
    const bool on = a < L, dv16 = (reinterpret_cast<uintptr_t>(b.dv) & 15) == 0;  // dv: any bf16 alignment
    const int64_t ra = rowi(a);
    // The bf16 rows (kBf16's gq and gk, dv) stay packed as loaded (raw) and are unpacked where used
    // (bf16_at), so that no conversion waits on its load inside the loads' branches.
    float gq8[kU][8], gk8[kU][8], rq8[kU][8], rk8[kU][8];
    uint4 gqr[kU], gkr[kU], dvr[kU];
    auto gq_at = [&](int u, int e) { return kBf16 ? bf16_at(gqr[u], e) : gq8[u][e]; };
    auto gk_at = [&](int u, int e) { return kBf16 ? bf16_at(gkr[u], e) : gk8[u][e]; };
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = 8 * part + 32 * u;
#pragma unroll
      for (int e = 0; e < 8; ++e) gq8[u][e] = gk8[u][e] = rq8[u][e] = rk8[u][e] = 0.f;
      gqr[u] = gkr[u] = dvr[u] = make_uint4(0u, 0u, 0u, 0u);
      if (on && i < dk) {
        if constexpr (kBf16) {
          gqr[u] = *reinterpret_cast<const uint4*>(p_bf16(b.gq) + ra * dk + i);
          gkr[u] = *reinterpret_cast<const uint4*>(p_bf16(b.gk) + ra * dk + i);
        } else {
          detail::load_f32<8>(gq8[u], b.gq + ra * dk + i);
          detail::load_f32<8>(gk8[u], b.gk + ra * dk + i);
        }
        if (f_tc && hh > 0) {  // the group's running sums (run_row)
          detail::load_f32<8>(rq8[u], b.rq + run_row(b, r0 + a, h, hh, kh) + i);
          detail::load_f32<8>(rk8[u], b.rk + run_row(b, r0 + a, h, hh, kh) + i);
        }
      }
      if (on && b.accumulate && i < dv) {
        if (dv16) {
          dvr[u] = *reinterpret_cast<const uint4*>(b.dv + ra * dv + i);
        } else {
          uint16_t x[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) x[e] = reinterpret_cast<const uint16_t*>(b.dv + ra * dv + i)[e];
          dvr[u] = make_uint4(x[0] | (uint32_t)x[1] << 16, x[2] | (uint32_t)x[3] << 16, x[4] | (uint32_t)x[5] << 16,
                              x[6] | (uint32_t)x[7] << 16);
        }
      }
    }
    const float dbeta_in = on && b.accumulate && part == 0 ? b.dbeta[ra] : 0.f;
    float pair = 0.f, dak = 0.f, qsd = 0.f, kdsv = 0.f, b2k = 0.f, b1v = 0.f;
    if (on) {
      for (int bb = part; bb < C; bb += 4) {
        pair += QK[a * PS + bb] - QK[bb * PS + a];
        dak += KKd[a * PS + bb];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {  // dB1: b1v and dv = beta dB1
        const int j = 8 * part + 32 * u;
        if (j >= dv) break;
        float d1[8], v[8], g[8];
        xb8(d1, a, j);
        detail::load_bf16<8>(v, dk % 16 == 0 ? Vb + a * kRowStride + j : p.v + ra * dv + j);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          b1v = fmaf(d1[e], v[e], b1v);
          g[e] = bet[a] * d1[e] + bf16_at(dvr[u], e);
        }
        if (dv16) {
          detail::store_bf16<8>(b.dv + ra * dv + j, g);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) b.dv[ra * dv + j + e] = __float2bfloat16(g[e]);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {  // dB2, q, k: b2k, then the global rows' dots
        const int i = 8 * part + 32 * u;
        if (i >= dk) break;
        float d2[8], q[8], k[8];
        xb8(d2, a, dv + i);
        detail::load_bf16<8>(q, Qb + a * kRowStride + i);
        detail::load_bf16<8>(k, Kb + a * kRowStride + i);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          b2k = fmaf(d2[e], k[e], b2k);
          qsd = fmaf(q[e], gq_at(u, e), qsd);
          kdsv = fmaf(k[e], gk_at(u, e), kdsv);
        }
      }
    }
#pragma unroll
    for (int o = 1; o < 4; o *= 2) {
      pair += __shfl_xor_sync(0xffffffffu, pair, o), dak += __shfl_xor_sync(0xffffffffu, dak, o);
      qsd += __shfl_xor_sync(0xffffffffu, qsd, o), kdsv += __shfl_xor_sync(0xffffffffu, kdsv, o);
      b2k += __shfl_xor_sync(0xffffffffu, b2k, o), b1v += __shfl_xor_sync(0xffffffffu, b1v, o);
    }
    if (on && part == 0) {
      const float eg = __expf(gam[a]), t = __expf(gl - gam[a]) * kdsv;
      te[a] = t;
      dgam[a] = pair + eg * p.scale * qsd - t + bet[a] * eg * b2k;
      const float db = b1v + eg * b2k + dak;
      b.dbeta[ra] = dbeta_in + db;
    }
    if (f_tc) {
      __syncthreads();  // KKd, QK and v's rows are read: they take Fq and Fk
      if (on) {
        const float eg = __expf(gam[a]), el = __expf(gl - gam[a]), be = bet[a] * eg;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = 8 * part + 32 * u;
          if (i >= dk) break;
          float d2[8], fq[8], fk[8];
          xb8(d2, a, dv + i);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            fq[e] = eg * gq_at(u, e) + rq8[u][e];
            fk[e] = el * gk_at(u, e) + be * d2[e] + rk8[u][e];
          }
          detail::store_f32<8>(Fq + a * kGradFStride + i, fq);
          detail::store_f32<8>(Fk + a * kGradFStride + i, fk);
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < detail::kWarp) {  // E: dg_t = sum_{a >= t} dgam_a, by warp 0
    const int lane = threadIdx.x, parts = (dk + kStateRows - 1) / kStateRows;
    float s = 0.f;
    for (int z = 0; z < parts; ++z) s += b.sds[((int64_t)c * p.nv + h) * parts + z];
    const float tsum = detail::warp_sum((lane < L ? te[lane] : 0.f) + (lane + 32 < L ? te[lane + 32] : 0.f));
    if (lane == 0) dgam[L - 1] += __expf(gl) * s + tsum;
    __syncwarp();
    // Reverse inclusive scan of the 64 values: lane holds dgam[63 - lane] and dgam[31 - lane].
    float hi = dgam[C - 1 - lane], lo = dgam[C / 2 - 1 - lane];
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const float uh = __shfl_up_sync(0xffffffffu, hi, o), ul = __shfl_up_sync(0xffffffffu, lo, o);
      if (lane >= o) hi += uh, lo += ul;
    }
    lo += __shfl_sync(0xffffffffu, hi, 31);
    const int ah = C - 1 - lane, al = C / 2 - 1 - lane;
    if (ah < L) b.dg[rowi(ah)] = b.accumulate ? b.dg[rowi(ah)] + hi : hi;
    if (al < L) b.dg[rowi(al)] = b.accumulate ? b.dg[rowi(al)] + lo : lo;
  }
  if (f_tc) {  // F on tensor cores
    grad_qk_mma<kBf16>(b, Qb, Kb, DOVd, MK, Fq, Fk, r0, L, h, hh);
  } else {  // F: rows tr + 16u, columns 8 tc .. 8 tc + 8
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16, i0 = 8 * tc;
    if (i0 < dk) {
      float aq[4][8], ak[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) aq[u][e] = ak[u][e] = 0.f;
      for (int x = 0; x < L; ++x) {
        float qv[8], kv[8];
        detail::load_bf16<8>(qv, Qb + x * kRowStride + i0);
        detail::load_bf16<8>(kv, Kb + x * kRowStride + i0);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int r = tr + 16 * u;
          const float cq = DOVd[r * PS + x];                                   // dq~_r += DOVd_rx k_x
          const float kq = p.scale * DOVd[x * PS + r];                         // dk_r += DOVd_xr q~_x
          const float kk = MK[x * PS + r] + MK[r * PS + x];                    // dk_r += (MK_xr + MK_rx) k_x
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            aq[u][e] = fmaf(cq, kv[e], aq[u][e]);
            ak[u][e] = fmaf(kq, qv[e], fmaf(kk, kv[e], ak[u][e]));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = tr + 16 * u;
        if (r >= L) continue;
        const float eg = __expf(gam[r]), el = __expf(gl - gam[r]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int i = i0 + e;
          if (i >= dk) break;
          const int64_t at = rowi(r) * dk + i;  // gq holds S dO_r, gk dS v_new_r
          const float sdo = kBf16 ? bf(p_bf16(b.gq)[at]) : b.gq[at], dsv = kBf16 ? bf(p_bf16(b.gk)[at]) : b.gk[at];
          group_sum_out(b, r0 + r, h, hh, i, eg * sdo + aq[u][e],
                        el * dsv + bet[r] * eg * XB[r * XS + dv + i] + ak[u][e]);
        }
      }
    }
  }
}

// Per (chunk, key head): the gradients of the chunk's inputs, each value head of the key head's
// group in turn (grad_head), q's and k's summed over the group as they go (group_sum_out) and
// written once, in bf16.
template <int kD, bool kBf16 = false>
__global__ void __launch_bounds__(kRuleThreads) rule_bwd_grad_kernel(RuleBwdParams b) {
  const int group = b.f.nv / b.f.nk;
  for (int hh = 0; hh < group; ++hh) {
    if (hh > 0) __syncthreads();  // the last head's shared-memory reads are done
    grad_head<kD, kBf16>(b, blockIdx.x, blockIdx.y * group + hh, hh);
  }
}

size_t bwd_grad_smem_bytes(int dk, int dv, bool b16) {
  const size_t phase_a = sizeof(bf16) * kGdnChunk * kRowStride + sizeof(float) * kGdnChunk * (128 + 4);
  const size_t xb = sizeof(float) * (size_t)kGdnChunk * (dk + dv + 4);
  // kBf16: dO's, v_new's and [dvn | dW]'s bf16 rows together
  const size_t bf16_rows = b16 ? sizeof(bf16) * kGdnChunk * (2 * kRowStride + dk + dv + 8) : 0;
  const size_t planes = b16 ? sizeof(bf16) * 2 * kGdnChunk * (dk + dv + 8) : 0;  // kBf16's [dB1 | dB2] (XBh, XBl)
  return sizeof(bf16) * 3 * kGdnChunk * kRowStride + sizeof(float) * (5 * kGdnChunk * kPairStride + 4 * kGdnChunk) +
         std::max({phase_a, xb, bf16_rows, planes});  // q, k, v rows; KKd, QK, DOVd, MK, Z; gam, beta, dgam, te; R
}

// Whether the forward's walk writes o itself (rule_walk_mma_kernel<kDk, true>: dk a multiple of
// 16), so that neither sin nor v_new is stored, nor rule_out_kernel launched.
constexpr bool walk_writes_outputs(int dk) { return dk % 16 == 0; }

// Whether the kernels run their kBf16 instantiations: GdnProducts::kBf16 where the walks run on
// tensor cores (dk a multiple of 16, w_as_halves). Every kernel of a pass decides by this one
// predicate, since they hand each other bf16 buffers (p_bf16); at other dk every kernel is fp32
// (the CUDA-core walks and paths), whatever the option says.
constexpr bool bf16_kernels(GdnProducts products, int dk) {
  return products == GdnProducts::kBf16 && w_as_halves(dk);
}

// Whether the walks take U = T diag(beta) v themselves (one bf16 mma a product, from the prep's T
// diag(beta) in bf16, RuleParams::Tb) and the prep neither computes nor stores U: the bf16 kernels
// at dk 128 where dv is a multiple of 64, whose TMA stages hold T diag(beta) and a 64-column box of
// v in place of U's 32 fp32 columns (at other dv the prep computes U as the exact mode's).
constexpr bool walk_computes_u(GdnProducts products, int dk, int dv) {
  return bf16_kernels(products, dk) && dk == 128 && dv % 64 == 0;
}

// walk_saves: the walk stores sin and v_new (the backward's; the forward's when
// !walk_writes_outputs(dk)); else they take no space and the prep stores the scores P instead.
struct RuleScratch {
  float *U, *W, *gam, *vnew, *sin, *node_end, *P;
  size_t bytes;
  // With `products`, U only where the prep stores it (not where the walks take it themselves,
  // walk_computes_u), and the buffers the bf16 kernels hand each other in bf16 (p_bf16) half size.
  RuleScratch(const GdnPlan& plan, int nv, int dk, int dv, bool end_given, bool walk_saves, GdnProducts products,
              void* base) {
    detail::WorkspaceCarver w(base);
    const size_t rows = (size_t)plan.rows() * nv, SS = (size_t)dk * dv;
    const size_t half = bf16_kernels(products, dk) ? 2 : 1;  // floats a bf16 buffer's element count divides by
    U = walk_computes_u(products, dk, dv) ? nullptr : w.take<float>(rows * dv);
    W = w.take<float>(rows * dk);
    gam = w.take<float>(rows);
    vnew = walk_saves ? w.take<float>(rows * dv / half) : nullptr;
    sin = walk_saves ? w.take<float>((size_t)plan.num_chunks() * nv * SS / half) : nullptr;
    node_end = w.take<float>(end_given ? 0 : (size_t)plan.num_nodes() * nv * SS);
    P = walk_saves ? nullptr : w.take<float>((size_t)plan.num_chunks() * nv * kGdnChunk * kGdnChunk);
    bytes = w.bytes();
  }
};

// Without rule_bwd_local_kernel (walk_writes_outputs(dk): the reverse walk takes the dO terms) qo
// takes no space and the prep stores PT instead.
struct RuleBwdScratch {
  RuleScratch f;
  float *dvn, *qo, *dsout, *acc, *db2, *gq, *gk, *rq, *rk, *sds, *T, *PT;
  size_t bytes;
  RuleBwdScratch(const GdnPlan& plan, int nv, int dk, int dv, GdnProducts products, void* base)
      : f(plan, nv, dk, dv, /*end_given=*/false, /*walk_saves=*/true, products, base) {
    detail::WorkspaceCarver w(base ? static_cast<char*>(base) + f.bytes : nullptr);
    const size_t rows = (size_t)plan.rows() * nv, SS = (size_t)dk * dv, per_chunk = (size_t)plan.num_chunks() * nv * SS;
    const size_t half = bf16_kernels(products, dk) ? 2 : 1;  // as RuleScratch's
    dvn = w.take<float>(rows * dv / half);
    const bool local = walk_writes_outputs(dk);
    qo = local ? nullptr : w.take<float>(per_chunk);
    dsout = w.take<float>(per_chunk / half);
    acc = w.take<float>((size_t)plan.num_nodes() * nv * SS);
    db2 = w.take<float>(rows * dk / half);
    gq = w.take<float>(rows * dk / half);
    gk = w.take<float>(rows * dk / half);
    // The grad kernel's running sums (RuleBwdParams::rq, rk): with the bf16 kernels their own (N,
    // nk, dk) rows, sized for any group of two or more value heads (nk <= nv / 2; a group of one
    // has none); else in gq's and gk's rows.
    rq = half == 2 ? w.take<float>(rows * dk / 2) : gq;
    rk = half == 2 ? w.take<float>(rows * dk / 2) : gk;
    sds = w.take<float>((size_t)plan.num_chunks() * nv * ((dk + kStateRows - 1) / kStateRows));
    T = w.take<float>((size_t)plan.num_chunks() * nv * kGdnChunk * kGdnChunk);
    PT = local ? w.take<float>((size_t)plan.num_chunks() * nv * kGdnChunk * kGdnChunk) : nullptr;
    bytes = f.bytes + w.bytes();
  }
};

void check_rule_shape(int nk, int nv, int dk, int dv, const char* op) {
  TT_CHECK(nk > 0 && nv > 0 && nv % nk == 0 && dk > 0 && dk <= 128 && dk % 8 == 0 && dv > 0 && dv <= 128 &&
               dv % kWalkCols == 0,
           op, ": expected nv a positive multiple of nk, dk a multiple of 8 in [8, 128], dv a multiple of ", kWalkCols,
           " in [32, 128], got nk=", nk, " nv=", nv, " dk=", dk, " dv=", dv);
}

// q, k, v, d_o and the states are read 16 bytes at a time (cp.async, vector loads), o written in
// bf16 pairs: a tensor not aligned so is an error naming it (null tensors pass).
struct Aligned {
  const char* name;
  const void* p;
  unsigned bytes;
};
void check_rule_aligned(const char* op, std::initializer_list<Aligned> tensors) {
  for (const Aligned& t : tensors)
    TT_CHECK((reinterpret_cast<uintptr_t>(t.p) & (t.bytes - 1)) == 0, op, ": ", t.name, " must be ", t.bytes,
             "-byte aligned (got address ", t.p, ")");
}

RuleParams rule_params(const bf16* q, const bf16* k, const bf16* v, const float* g, const bf16* beta, const float* init,
                       const GdnPlan& plan, int nk, int nv, int dk, int dv, double scale, const RuleScratch& s,
                       float* end) {
  RuleParams p;
  p.plan = plan.device();
  p.q = q, p.k = k, p.v = v, p.g = g, p.beta = beta;
  p.init = init;
  p.U = s.U, p.W = s.W, p.gam = s.gam, p.vnew = s.vnew, p.sin = s.sin;
  p.node_end = end ? end : s.node_end;
  p.T = nullptr;
  p.Tb = nullptr;
  p.P = s.P;
  p.PT = nullptr;
  p.o = nullptr;
  p.nk = nk, p.nv = nv, p.dk = dk, p.dv = dv;
  p.scale = (float)scale;
  p.num_chunks = plan.num_chunks();
  p.rows = plan.rows();
  p.path0 = 0;
  return p;
}

// The blocks of a level's launch of the bf16 walks on warpgroup MMA (rule_walk_wgmma_kernel,
// rule_bwd_walk_wgmma_kernel): a lane (blockIdx.z) a path of the level (GdnPlan::Level), at 64
// state columns a block where the level has two or more paths, none with more than half its
// chunks, and dv is a multiple of 64 (the paths walk side by side, each a chain as long as its own
// chunks, at half the blocks a lane and a wider step); else 32 columns a block, so that one long
// path (one sequence, a GRPO group's prompt and first answer) keeps twice the blocks on the SMs.
// `lanes` of the level's paths from its first, at most 65,535 a launch (gridDim.z).
struct WalkGrid {
  dim3 grid;
  int cols;
};
WalkGrid bf16_walk_grid(const RuleParams& p, const GdnPlan::Level& l, int lanes) {
  const bool wide = l.paths > 1 && 2 * l.max_path_chunks <= l.chunks && p.dv % 64 == 0;
  const int cols = wide ? 64 : kWalkCols;
  return WalkGrid{dim3(p.nv, p.dv / cols, lanes), cols};
}

// f(level, path0, lanes) for each launch of the levels' paths: every level once, first to last (or last to
// first with reverse), its paths in launches of at most 65,535 lanes.
template <class F>
void for_each_walk_launch(const GdnPlan& plan, bool reverse, F&& f) {
  constexpr int kMaxLanes = 65535;
  const std::vector<GdnPlan::Level>& levels = plan.levels();
  for (size_t i = 0; i < levels.size(); ++i) {
    const GdnPlan::Level& l = levels[reverse ? levels.size() - 1 - i : i];
    for (int done = 0; done < l.paths; done += kMaxLanes) f(l, l.path0 + done, std::min(kMaxLanes, l.paths - done));
  }
}

// The TMA descriptors of rule_walk_mma_kernel<128>'s stages (WalkTmaStage).
template <class Runner>
WalkMaps walk_maps(const RuleParams& p, Runner& run, bool bf16_scores) {
  WalkMaps m{};
  const bf16* Wh = reinterpret_cast<const bf16*>(p.W);  // w_as_halves: two bf16 planes
  m.Wh = run.map(Wh, p.rows, p.nv, 128, 64, kGdnChunk);
  m.Wl = run.map(Wh + (int64_t)p.rows * p.nv * 128, p.rows, p.nv, 128, 64, kGdnChunk);
  m.K = run.map(p.k, p.rows, p.nk, 128, 64, kGdnChunk);
  if (p.P) {  // the walk that writes o (kOut)
    m.Q = run.map(p.q, p.rows, p.nk, 128, 64, kGdnChunk);
    const int64_t rows = (int64_t)p.num_chunks * p.nv * kGdnChunk;
    m.P = bf16_scores ? run.map(p_bf16(p.P), rows, 1, kGdnChunk, kGdnChunk, kGdnChunk)
                      : run.map(p.P, rows, 1, kGdnChunk, 32, kGdnChunk);
  }
  if (p.Tb) {  // walk_computes_u
    m.Tb = run.map(p_bf16(p.Tb), (int64_t)p.num_chunks * p.nv * kGdnChunk, 1, kGdnChunk, kGdnChunk, kGdnChunk);
    m.V = run.map(p.v, p.rows, p.nv, p.dv, 64, kGdnChunk);
  } else {
    m.U = run.map(p.U, p.rows, p.nv, p.dv, kWalkCols, kGdnChunk);
  }
  return m;
}

// The TMA descriptors of rule_bwd_walk_mma_kernel<128>'s stages (BwdWalkTmaStage).
template <class Runner>
BwdWalkMaps bwd_walk_maps(const RuleBwdParams& b, Runner& run, bool bf16_scores) {
  const RuleParams& p = b.f;
  BwdWalkMaps m{};
  const bf16* Wh = reinterpret_cast<const bf16*>(p.W);  // as walk_maps
  m.Wh = run.map(Wh, p.rows, p.nv, 128, 64, kGdnChunk);
  m.Wl = run.map(Wh + (int64_t)p.rows * p.nv * 128, p.rows, p.nv, 128, 64, kGdnChunk);
  m.K = run.map(p.k, p.rows, p.nk, 128, 64, kGdnChunk);
  m.Q = run.map(p.q, p.rows, p.nk, 128, 64, kGdnChunk);
  const int64_t rows = (int64_t)p.num_chunks * p.nv * kGdnChunk;
  m.PT = bf16_scores ? run.map(p_bf16(p.PT), rows, 1, kGdnChunk, kGdnChunk, kGdnChunk)
                     : run.map(p.PT, rows, 1, kGdnChunk, 32, kGdnChunk);
  return m;
}

// rule_bwd_state_wgmma_kernel's TMA descriptors (StateMaps).
template <class Runner>
StateMaps state_maps(const RuleBwdParams& b, Runner& run) {
  const RuleParams& p = b.f;
  const int64_t state_rows = (int64_t)p.num_chunks * p.nv * p.dk;
  StateMaps m{};
  m.dO = run.map(b.d_o, p.rows, p.nv, p.dv, 64, kGdnChunk);
  m.Vn = run.map(p_bf16(p.vnew), p.rows, p.nv, p.dv, 64, kGdnChunk);
  m.Dvn = run.map(p_bf16(b.dvn), p.rows, p.nv, p.dv, 64, kGdnChunk);
  m.S = run.map(p_bf16(p.sin), state_rows, 1, p.dv, 64, kStateRows);
  m.dS = run.map(p_bf16(b.dsout), state_rows, 1, p.dv, 64, kStateRows);
  return m;
}

// Sets p up for walk_computes_u: no U; T diag(beta) in `spare`, a (chunks, nv, 64, 64) fp32
// buffer whose first half holds a bf16 tensor of that shape already (the bf16 scores P, or T).
void use_walk_u(RuleParams& p, float* spare) {
  p.U = nullptr;
  p.Tb = reinterpret_cast<float*>(p_bf16(spare) + (int64_t)p.num_chunks * p.nv * kGdnChunk * kGdnChunk);
}

// The forward's first two kernels: U, W and gam per chunk, then the walk (node ends, and sin and
// v_new, or with `out` (walk_writes_outputs) o instead), with bf16 products when b16
// (bf16_kernels).
template <int kDk>
auto walk_mma_instance(bool out, bool b16) {
  return out ? (b16 ? rule_walk_mma_kernel<kDk, true, true> : rule_walk_mma_kernel<kDk, true, false>)
             : (b16 ? rule_walk_mma_kernel<kDk, false, true> : rule_walk_mma_kernel<kDk, false, false>);
}

template <class Runner>
void rule_prep_and_walk(const RuleParams& p, const GdnPlan& plan, Runner& run, bool out, GdnProducts products) {
  const bool b16 = bf16_kernels(products, p.dk);
  run.launch(b16 ? rule_prep_kernel<true, true> : w_as_halves(p.dk) ? rule_prep_kernel<true> : rule_prep_kernel<false>,
             dim3((unsigned)(p.num_chunks * (p.nv / prep_heads(p)))), kRuleThreads, prep_smem_bytes(), p);
  const dim3 grid(p.nv, p.dv / kWalkCols);
  TT_CHECK(!out || walk_writes_outputs(p.dk), "gdn: the walk writes o only at dk a multiple of 16, got ", p.dk);
  if (p.dk % 16 != 0)
    run.launch(rule_walk_kernel, grid, kRuleThreads, walk_smem_bytes(p.dk), p);
  else if (p.Tb) {  // walk_computes_u: the paths side by side, level by level
    const WalkMaps maps = walk_maps(p, run, b16);
    for_each_walk_launch(plan, /*reverse=*/false, [&](const GdnPlan::Level& l, int path0, int lanes) {
      RuleParams q = p;
      q.path0 = path0;
      const WalkGrid g = bf16_walk_grid(p, l, lanes);
      run.launch(g.cols == 64 ? (out ? rule_walk_wgmma_kernel<true, 64> : rule_walk_wgmma_kernel<false, 64>)
                              : (out ? rule_walk_wgmma_kernel<true> : rule_walk_wgmma_kernel<false>),
                 g.grid, kRuleThreads, walk_wgmma_smem_bytes(out), q, maps);
    });
  }
  else if (p.dk == 128)
    run.launch(walk_mma_instance<128>(out, b16), grid, kRuleThreads, walk_mma_smem_bytes(p.dk, out), p,
               walk_maps(p, run, b16));
  else
    run.launch(walk_mma_instance<0>(out, b16), grid, kRuleThreads, walk_mma_smem_bytes(p.dk, out), p, WalkMaps{});
}

// gdn_forward (gdn.h) on `run`.
template <class Runner>
void rule_forward(Runner& run, bf16* o, float* end, const bf16* q, const bf16* k, const bf16* v, const float* g,
                  const bf16* beta, const float* init, const GdnPlan& plan, int nk, int nv, int dk, int dv,
                  double scale, Workspace ws, GdnProducts products = GdnProducts::kExact) {
  check_rule_shape(nk, nv, dk, dv, "gdn_forward");
  if (plan.num_chunks() == 0) return;
  check_rule_aligned("gdn_forward",
                     {{"q", q, 16}, {"k", k, 16}, {"v", v, 16}, {"init", init, 16}, {"end", end, 16}, {"o", o, 4}});
  TT_CHECK(plan.device().chunk_row0, "gdn_forward: the plan's tables are not uploaded");
  const bool fused = walk_writes_outputs(dk);
  const RuleScratch s(plan, nv, dk, dv, end != nullptr, /*walk_saves=*/!fused, products, ws.ptr);
  detail::check_workspace(ws, s.bytes, "gdn_forward");
  RuleParams p = rule_params(q, k, v, g, beta, init, plan, nk, nv, dk, dv, scale, s, end);
  p.o = o;
  if (walk_computes_u(products, dk, dv)) use_walk_u(p, s.P);  // P: bf16 scores in its first half
  rule_prep_and_walk(p, plan, run, fused, products);
  if (!fused)
    run.launch(rule_out_kernel, chunk_parts_grid(plan.num_chunks(), nv, (dv + kOutCols - 1) / kOutCols), kRuleThreads,
               out_smem_bytes(), p);
}

// gdn_backward (gdn.h) on `run`.
template <class Runner>
void rule_backward(Runner& run, bf16* dq, bf16* dk, bf16* dv, float* dg, float* dbeta, float* d_init, const bf16* d_o,
                   const float* d_end, const bf16* q, const bf16* k, const bf16* v, const float* g, const bf16* beta,
                   const float* init, const GdnPlan& plan, int nk, int nv, int dk_, int dv_, double scale,
                   Workspace ws, bool accumulate, GdnProducts products = GdnProducts::kExact) {
  check_rule_shape(nk, nv, dk_, dv_, "gdn_backward");
  if (plan.num_chunks() == 0) return;
  check_rule_aligned("gdn_backward", {{"q", q, 16}, {"k", k, 16}, {"v", v, 16}, {"d_o", d_o, 16},
                                      {"init", init, 16}, {"d_init", d_init, 16}, {"d_end", d_end, 16}});
  TT_CHECK(plan.device().chunk_row0, "gdn_backward: the plan's tables are not uploaded");
  const RuleBwdScratch s(plan, nv, dk_, dv_, products, ws.ptr);
  detail::check_workspace(ws, s.bytes, "gdn_backward");
  RuleBwdParams b;
  b.f = rule_params(q, k, v, g, beta, init, plan, nk, nv, dk_, dv_, scale, s.f, nullptr);
  b.f.T = s.T;  // the prep keeps each chunk's T for the grad kernel's phase B
  b.f.PT = s.PT;  // and (walk_writes_outputs) the scores for the reverse walk's dO terms
  const bool local = walk_writes_outputs(dk_);
  b.d_o = d_o;
  b.d_end = d_end;
  b.d_init = d_init;
  b.dvn = s.dvn, b.qo = s.qo, b.dsout = s.dsout, b.acc = s.acc, b.db2 = s.db2, b.gq = s.gq,
  b.gk = s.gk, b.sds = s.sds;
  b.rq = s.rq, b.rk = s.rk;
  b.dv = dv, b.dg = dg, b.dbeta = dbeta, b.dq_out = dq, b.dk_out = dk;
  b.accumulate = accumulate;
  if (walk_computes_u(products, dk_, dv_)) use_walk_u(b.f, s.T);  // T: bf16 T in its first half
  // The forward again: U, W, gam, v_new, the entering states.
  rule_prep_and_walk(b.f, plan, run, /*out=*/false, products);
  const bool b16 = bf16_kernels(products, dk_);  // as rule_prep_and_walk's
  b.run_heads = b16 ? nk : nv;  // as RuleBwdScratch lays out rq and rk
  run.zero(s.acc, sizeof(float) * (size_t)plan.num_nodes() * nv * dk_ * dv_);
  const int chunks = plan.num_chunks();
  if (!local)
    run.launch(rule_bwd_local_kernel, chunk_parts_grid(chunks, nv, (dv_ + kOutCols - 1) / kOutCols), kRuleThreads,
               bwd_local_smem_bytes(), b);
  const dim3 walk_grid(nv, dv_ / kWalkCols);
  if (dk_ % 16 != 0)
    run.launch(rule_bwd_walk_kernel, walk_grid, kRuleThreads, bwd_walk_smem_bytes(dk_), b);
  else if (dk_ == 128 && b16) {  // the paths side by side, last level first
    const BwdWalkMaps maps = bwd_walk_maps(b, run, b16);
    for_each_walk_launch(plan, /*reverse=*/true, [&](const GdnPlan::Level& l, int path0, int lanes) {
      RuleBwdParams c = b;
      c.f.path0 = path0;
      const WalkGrid g = bf16_walk_grid(b.f, l, lanes);
      run.launch(g.cols == 64 ? rule_bwd_walk_wgmma_kernel<64> : rule_bwd_walk_wgmma_kernel<>, g.grid, kRuleThreads,
                 bwd_walk_wgmma_smem_bytes(), c, maps);
    });
  }
  else if (dk_ == 128)
    run.launch(rule_bwd_walk_mma_kernel<128, false>, walk_grid, kRuleThreads, bwd_walk_mma_smem_bytes(dk_), b,
               bwd_walk_maps(b, run, b16));
  else
    run.launch(b16 ? rule_bwd_walk_mma_kernel<0, true> : rule_bwd_walk_mma_kernel<0, false>,
               walk_grid, kRuleThreads, bwd_walk_mma_smem_bytes(dk_), b, BwdWalkMaps{});
  if (state_on_wgmma(b16, dk_, dv_))
    run.launch(rule_bwd_state_wgmma_kernel, chunk_parts_grid(chunks, nv, 128 / kStateRows), kRuleThreads,
               bwd_state_wgmma_smem_bytes(), b, state_maps(b, run));
  else
    run.launch(b16 ? rule_bwd_state_kernel<true> : rule_bwd_state_kernel<false>,
               chunk_parts_grid(chunks, nv, (dk_ + kStateRows - 1) / kStateRows), kRuleThreads,
               bwd_state_smem_bytes(dv_), b);
  run.launch(dk_ == 128 && dv_ == 128 ? (b16 ? rule_bwd_grad_kernel<128, true> : rule_bwd_grad_kernel<128, false>)
                                      : (b16 ? rule_bwd_grad_kernel<0, true> : rule_bwd_grad_kernel<0, false>),
             dim3((unsigned)chunks, (unsigned)nk), kRuleThreads, bwd_grad_smem_bytes(dk_, dv_, b16), b);
}

}  // namespace
}  // namespace tt::cuda
