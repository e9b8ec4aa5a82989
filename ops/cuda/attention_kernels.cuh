// Kernels of the CUDA tree attention: FlashAttention-2 style forward and backward on bf16 tensor
// cores (mma.sync m16n8k16, ldmatrix, cp.async double buffering), with the tree visibility of
// ops/cuda/tree_tiles.h applied per tile (skip / full / partial) and per element on partial tiles.
//
// Written against the primitives of attention_device.cuh (which the includer brings in first;
// tests/ops_cuda_attention/warp_emulator.h provides the same names to run these kernels on the
// CPU); the key-tile walks are attention_walk.cuh's, the backward's row passes
// attention_bwd_rows.cuh's. Launchers live in attention_launch.cuh.
//
// Visibility, one rule for every key: key j (of the tree or of an external prefix) carries a query
// range [lo_j, hi_j): tree key j has [j, subtree_end[j]), a prefix key [q_begin, q_end), a key past
// the end of its source [lo, 0) (visible from nowhere). Rows and keys past the ends are zero-filled
// in shared memory, so masked elements never multiply garbage.
//
// Forward, per (query tile of BM rows, head): walk the key tiles (external prefixes first, then
// tree tiles up to the diagonal) in order, skipping invisible ones 32 at a time with a warp ballot
// (every warp runs the same walk), online softmax in fp32, O and lse written once.
// Backward, per (key tile of BN keys, KV head): K and V stay in shared memory; walk the query heads
// of the GQA group and the query tiles that see the tile (queries [k0, max subtree_end), or the
// prefix's [q_begin, q_end)); dK and dV accumulate in registers and are written once (+= for a
// prefix); dQ partials go to an fp32 buffer through atomics (converted by a final kernel).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_bwd_rows.cuh"
#include "ops/cuda/attention_params.h"
#include "ops/cuda/attention_walk.cuh"

namespace tt::cuda::attn {

// Rows [row0, row0 + ROWS) of a (rows, HS) bf16 slab (row stride `stride` elements) into shared
// memory rows of HS + 8 elements; rows at or past n_rows are zero-filled. 16-byte cp.async,
// consecutive threads on consecutive chunks of a row.
template <int ROWS, int HS, int THREADS>
__device__ __forceinline__ void load_rows(bf16* s, const bf16* g, int64_t stride, int row0, int n_rows, int tid) {
  constexpr int kChunksPerRow = HS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % THREADS == 0, "whole chunks per thread");
#pragma unroll
  for (int it = 0; it < kChunks / THREADS; ++it) {
    const int c = tid + it * THREADS;
    const int r = c / kChunksPerRow, c8 = c % kChunksPerRow;
    const int row = row0 + r;
    const bool ok = row < n_rows;
    const bf16* src = g + (ok ? (int64_t)row * stride + c8 * 8 : 0);
    cp_async_16(s + r * (HS + 8) + c8 * 8, src, ok ? 16 : 0);
  }
}

// Query ranges [lo, hi) of keys k0 .. k0 + BN - 1 of a tile into shared memory (threads 0..BN-1).
// Tree keys: lo = j, hi = subtree_end[j] by cp.async (zero past N); prefix keys: its query range.
template <int BN>
__device__ __forceinline__ void load_key_ranges(const AttnFwdParams& p, int e, int k0, int* s_lo, int* s_hi,
                                                int tid) {
  if (e < p.n_ext) {
    if (tid < BN) ext_key_range(p.ext[e], k0 + tid, s_lo[tid], s_hi[tid]);
  } else {
    if (tid < BN) s_lo[tid] = k0 + tid;
    if (tid < BN / 4) {
      const int j = k0 + 4 * tid;
      const int valid = imax(0, imin(4, p.n - j));
      if (valid == 4 || valid == 0) {
        cp_async_16(s_hi + 4 * tid, p.tiles.subtree_end + (valid > 0 ? j : 0), 4 * valid);
      } else {  // the last keys: no read past the end of subtree_end
        for (int u = 0; u < 4; ++u) cp_async_4(s_hi + 4 * tid + u, p.tiles.subtree_end + (u < valid ? j + u : 0), u < valid ? 4 : 0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

template <int HS>
struct FwdConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMT = 2;                   // 16-row m-tiles per warp: B fragments serve two
  static constexpr int BM = 16 * kMT * kWarps;    // 128 queries per block
  static constexpr int BN = 64;                   // keys per tile: one granule, fine-grained skips
  static constexpr int kStride = HS + 8;          // smem row: 16 B pad, ldmatrix rows on distinct banks
  static constexpr int kQElems = BM * kStride;
  static constexpr int kKVElems = BN * kStride;
  static constexpr size_t kSmemBytes = (size_t)(kQElems + 4 * kKVElems) * sizeof(bf16) + 4 * BN * sizeof(int);
  static_assert(HS % 16 == 0 && BN % 16 == 0, "mma tiles");
};

template <int HS>
__global__ void __launch_bounds__(FwdConfig<HS>::kThreads, 2) attention_fwd_kernel(const AttnFwdParams p) {
  using C = FwdConfig<HS>;
  constexpr int BM = C::BM, BN = C::BN, kMT = C::kMT, kStride = C::kStride;
  bf16* sQ = reinterpret_cast<bf16*>(dynamic_smem());  // (BM, kStride)
  bf16* sK = sQ + C::kQElems;                           // (2, BN, kStride)
  bf16* sV = sK + 2 * C::kKVElems;                      // (2, BN, kStride)
  int* sLo = reinterpret_cast<int*>(sV + 2 * C::kKVElems);  // (2, BN)
  int* sHi = sLo + 2 * BN;                                  // (2, BN)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Heads vary fastest over the launch order and query tiles run backwards, so the tiles with the
  // most keys (the latest ones) of every head start first.
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int h = blockIdx.x, hk = h / p.group;
  const int q0 = qt * BM, q_last = q0 + BM - 1;
  const int row_base = q0 + warp * 16 * kMT;

  load_rows<BM, HS, C::kThreads>(sQ, p.q + h * p.q_head_stride, p.q_row_stride, q0, p.n, tid);
  cp_async_commit();

  auto load_kv = [&](int v, int buf) {
    int e, k0;
    resolve_key_tile<BN>(p, v, e, k0);
    const bool ext = e < p.n_ext;
    const bf16* kb = (ext ? p.ext[e].k : p.k) + hk * p.k_head_stride;
    const bf16* vb = (ext ? p.ext[e].v : p.v) + hk * p.k_head_stride;
    const int n_keys = ext ? p.ext[e].len : p.n;
    load_rows<BN, HS, C::kThreads>(sK + buf * C::kKVElems, kb, p.k_row_stride, k0, n_keys, tid);
    load_rows<BN, HS, C::kThreads>(sV + buf * C::kKVElems, vb, p.k_row_stride, k0, n_keys, tid);
    load_key_ranges<BN>(p, e, k0, sLo + buf * BN, sHi + buf * BN, tid);
  };

  const int v_end = walk_end<BN>(p, q_last);
  TileScan scan;
  bool full = false;
  int v = next_key_tile<BN>(p, scan, 0, v_end, q0, q_last, full);
  if (v < v_end) load_kv(v, 0);
  cp_async_commit();

  float o[kMT][HS / 8][4];
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) o[mt][nd][0] = o[mt][nd][1] = o[mt][nd][2] = o[mt][nd][3] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }

  int buf = 0;
  while (v < v_end) {
    const bool tile_full = full;
    const int v_next = next_key_tile<BN>(p, scan, v + 1, v_end, q0, q_last, full);
    if (v_next < v_end) {
      load_kv(v_next, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* k_s = sK + buf * C::kKVElems;
    const bf16* v_s = sV + buf * C::kKVElems;

    // S (this warp's 16 kMT rows x BN keys) = Q K^T
    float s[kMT][BN / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb) s[mt][nb][0] = s[mt][nb][1] = s[mt][nb][2] = s[mt][nb][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldmatrix_x4(a[mt], sQ + (warp * 16 * kMT + mt * 16 + (lane & 15)) * kStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, k_s + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kStride + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (!tile_full) {
      const int* lo_s = sLo + buf * BN;
      const int* hi_s = sHi + buf * BN;
#pragma unroll
      for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int col = nb * 8 + 2 * t + cc;
          const int lo = lo_s[col], hi = hi_s[col];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int row = row_base + mt * 16 + g + 8 * half;
              if (!(lo <= row && row < hi)) s[mt][nb][2 * half + cc] = -INFINITY;
            }
        }
    }

    // Online softmax: rows g and g + 8 of each m-tile live on the 4 lanes of a quad.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = m[mt][half];
#pragma unroll
        for (int nb = 0; nb < BN / 8; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * half], s[mt][nb][2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx * p.scale_log2;  // a row with no key yet stays 0
        const float corr = exp2f(m[mt][half] * p.scale_log2 - base);
        m[mt][half] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nb = 0; nb < BN / 8; ++nb)
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const float e = exp2f(fmaf(s[mt][nb][2 * half + cc], p.scale_log2, -base));
            s[mt][nb][2 * half + cc] = e;
            sum += e;
          }
        l[mt][half] = l[mt][half] * corr + sum;  // per-lane partial sums; reduced at the end
#pragma unroll
        for (int nd = 0; nd < HS / 8; ++nd) {
          o[mt][nd][2 * half] *= corr;
          o[mt][nd][2 * half + 1] *= corr;
        }
      }

    // O += P V: P's accumulator layout is the A layout of the next mma, keys as k.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < HS / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + np * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816(o[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816(o[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled next iteration
    v = v_next;
    buf ^= 1;
  }

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = l[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row_base + mt * 16 + g + 8 * half;
      if (row < p.n) {  // every row in range sees itself, so sum > 0
        const float inv = 1.f / sum;
        bf16* dst = p.out + row * p.o_row_stride + h * p.o_head_stride;
#pragma unroll
        for (int nd = 0; nd < HS / 8; ++nd)
          store_bf16x2(dst + nd * 8 + 2 * t, o[mt][nd][2 * half] * inv, o[mt][nd][2 * half + 1] * inv);
        if (t == 0) p.lse[(int64_t)row * p.nh + h] = m[mt][half] * p.scale + logf(sum);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Backward

template <int HS>
struct BwdConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BN = 16 * kWarps;  // 128 keys per block, 16 per warp
  static constexpr int BM = 64;           // queries per step
  static constexpr int kStride = HS + 8;
  static constexpr int kDsStride = BM + 8;
  static constexpr int kKVElems = BN * kStride;
  static constexpr int kQElems = BM * kStride;
  static constexpr int kDsElems = BN * kDsStride;
  static constexpr size_t kSmemBytes =
      (size_t)(2 * kKVElems + 4 * kQElems + kDsElems) * sizeof(bf16) + 4 * BM * sizeof(float) + 2 * BN * sizeof(int);
  static constexpr int kMinBlocks = 1;  // 2 blocks would cap registers at 128: spills
  static_assert(kWarps == 8 && BM == 64, "the dQ step maps 8 warps onto 4 row tiles x 2 column halves");
};

template <int HS>
__global__ void __launch_bounds__(BwdConfig<HS>::kThreads, BwdConfig<HS>::kMinBlocks)
    attention_bwd_kernel(const AttnBwdParams p) {
  using C = BwdConfig<HS>;
  constexpr int BM = C::BM, BN = C::BN, kStride = C::kStride, kDsStride = C::kDsStride;
  bf16* sK = reinterpret_cast<bf16*>(dynamic_smem());  // (BN, kStride)
  bf16* sV = sK + C::kKVElems;                           // (BN, kStride)
  bf16* sQ = sV + C::kKVElems;                           // (2, BM, kStride)
  bf16* sdO = sQ + 2 * C::kQElems;                       // (2, BM, kStride)
  bf16* sdS = sdO + 2 * C::kQElems;                      // (BN, kDsStride) dS^T
  float* sLse = reinterpret_cast<float*>(sdS + C::kDsElems);  // (2, BM)
  float* sD = sLse + 2 * BM;                                  // (2, BM)
  int* sLo = reinterpret_cast<int*>(sD + 2 * BM);             // (BN)
  int* sHi = sLo + BN;                                        // (BN)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const KeyTileQueries<BM> kt = key_tile_queries<BN, BM>(p);
  const int hk = kt.hk, e = kt.e, k0 = kt.k0, n_keys = kt.n_keys, n_iter = kt.n_steps;
  const bool want_dkv = kt.want_dkv;
  load_rows<BN, HS, C::kThreads>(sK, kt.k, p.k_row_stride, k0, n_keys, tid);
  load_rows<BN, HS, C::kThreads>(sV, kt.v, p.k_row_stride, k0, n_keys, tid);
  load_key_ranges<BN>(p, e, k0, sLo, sHi, tid);
  cp_async_commit();

  // The next unloaded step's Q, dO, lse and D into buffer buf (every thread: cp.async).
  auto pf = kt.first_step();
  auto prefetch = [&](int buf) {
    const int h = pf.h, q0 = pf.qt * BM;
    kt.next_step(pf);
    load_rows<BM, HS, C::kThreads>(sQ + buf * C::kQElems, p.q + h * p.q_head_stride, p.q_row_stride, q0, p.n, tid);
    load_rows<BM, HS, C::kThreads>(sdO + buf * C::kQElems, p.dout + h * p.o_head_stride, p.o_row_stride, q0, p.n,
                                   tid);
    if (tid < BM / 4) {
      cp_async_16(sLse + buf * BM + 4 * tid, p.lse_log2 + (int64_t)h * p.n_pad + q0 + 4 * tid, 16);
    } else if (tid < BM / 2) {
      const int u = tid - BM / 4;
      cp_async_16(sD + buf * BM + 4 * u, p.dsum + (int64_t)h * p.n_pad + q0 + 4 * u, 16);
    }
  };
  if (n_iter > 0) prefetch(0);
  cp_async_commit();

  float dv[HS / 8][4], dk[HS / 8][4];  // this warp's 16 keys x HS
#pragma unroll
  for (int nd = 0; nd < HS / 8; ++nd)
#pragma unroll
    for (int r = 0; r < 4; ++r) dv[nd][r] = dk[nd][r] = 0.f;
  const int jl = warp * 16 + g;  // local key rows jl and jl + 8 of this thread

  auto cur = kt.first_step();
  for (int it = 0; it < n_iter; ++it, kt.next_step(cur)) {
    const int buf = it & 1;
    if (it + 1 < n_iter) {
      prefetch(buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int h = cur.h, q0 = cur.qt * BM;
    const bool full = kt.step_full(q0);
    const bf16* q_s = sQ + buf * C::kQElems;
    const bf16* do_s = sdO + buf * C::kQElems;
    const float* lse_s = sLse + buf * BM;
    const float* d_s = sD + buf * BM;

    // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys x BM queries.
    float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
    for (int nb = 0; nb < BM / 8; ++nb)
#pragma unroll
      for (int r = 0; r < 4; ++r) st[nb][r] = dpt[nb][r] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t ak[4], av[4];
      ldmatrix_x4(ak, sK + (warp * 16 + (lane & 15)) * kStride + kk * 16 + (lane >> 4) * 8);
      ldmatrix_x4(av, sV + (warp * 16 + (lane & 15)) * kStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < BM / 16; ++np) {
        const int off = (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kStride + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, q_s + off);
        ldmatrix_x4(bo, do_s + off);
        mma_16816(st[2 * np], ak, bq[0], bq[1]);
        mma_16816(st[2 * np + 1], ak, bq[2], bq[3]);
        mma_16816(dpt[2 * np], av, bo[0], bo[1]);
        mma_16816(dpt[2 * np + 1], av, bo[2], bo[3]);
      }
    }

    // P^T = exp(S^T scale - lse) (0 where masked), dS^T = P^T (dP^T - D); in place.
    const int lo0 = sLo[jl], hi0 = sHi[jl], lo1 = sLo[jl + 8], hi1 = sHi[jl + 8];
#pragma unroll
    for (int nb = 0; nb < BM / 8; ++nb)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int c = nb * 8 + 2 * t + cc;
        const int i = q0 + c;
        const float lse2 = lse_s[c], dd = d_s[c];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int lo = half ? lo1 : lo0, hi = half ? hi1 : hi0;
          float pv = exp2f(fmaf(st[nb][2 * half + cc], p.scale_log2, -lse2));
          if (!full && !(lo <= i && i < hi)) pv = 0.f;
          st[nb][2 * half + cc] = pv;
          dpt[nb][2 * half + cc] = pv * (dpt[nb][2 * half + cc] - dd);
        }
      }

    // dV += P^T dO, dK += dS^T Q: queries as k; dO and Q through transposed ldmatrix.
    if (want_dkv) {
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t ap[4], ads[4];
        ap[0] = pack_bf16x2(st[2 * kk][0], st[2 * kk][1]);
        ap[1] = pack_bf16x2(st[2 * kk][2], st[2 * kk][3]);
        ap[2] = pack_bf16x2(st[2 * kk + 1][0], st[2 * kk + 1][1]);
        ap[3] = pack_bf16x2(st[2 * kk + 1][2], st[2 * kk + 1][3]);
        ads[0] = pack_bf16x2(dpt[2 * kk][0], dpt[2 * kk][1]);
        ads[1] = pack_bf16x2(dpt[2 * kk][2], dpt[2 * kk][3]);
        ads[2] = pack_bf16x2(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
        ads[3] = pack_bf16x2(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < HS / 16; ++np) {
          const int off = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + np * 16 + (lane >> 4) * 8;
          uint32_t bo[4], bq[4];
          ldmatrix_x4_trans(bo, do_s + off);
          ldmatrix_x4_trans(bq, q_s + off);
          mma_16816(dv[2 * np], ap, bo[0], bo[1]);
          mma_16816(dv[2 * np + 1], ap, bo[2], bo[3]);
          mma_16816(dk[2 * np], ads, bq[0], bq[1]);
          mma_16816(dk[2 * np + 1], ads, bq[2], bq[3]);
        }
      }
    }

    // dS^T to shared memory for the dQ step.
#pragma unroll
    for (int nb = 0; nb < BM / 8; ++nb)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        store_bf16x2(sdS + (jl + 8 * half) * kDsStride + nb * 8 + 2 * t, dpt[nb][2 * half], dpt[nb][2 * half + 1]);
    __syncthreads();

    // dQ (BM x HS) += dS K: warp (wm, wn) takes rows 16 wm.. and columns (HS / 2) wn..; dS through
    // transposed ldmatrix of dS^T, K through transposed ldmatrix (keys as k).
    const int wm = warp & 3, wn = warp >> 2;
    float dq[HS / 16][4];
#pragma unroll
    for (int nb = 0; nb < HS / 16; ++nb)
#pragma unroll
      for (int r = 0; r < 4; ++r) dq[nb][r] = 0.f;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, sdS + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * kDsStride + wm * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int np = 0; np < HS / 32; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + wn * (HS / 2) + np * 16 +
                                 (lane >> 4) * 8);
        mma_16816(dq[2 * np], a, b[0], b[1]);
        mma_16816(dq[2 * np + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = q0 + wm * 16 + g + 8 * half;
      if (i < p.n) {
        float* dst = p.dq_accum + ((int64_t)i * p.nh + h) * HS + wn * (HS / 2) + 2 * t;
#pragma unroll
        for (int nb = 0; nb < HS / 16; ++nb) atomic_add_f32x2(dst + nb * 8, dq[nb][2 * half], dq[nb][2 * half + 1]);
      }
    }
    // No barrier here: the next writes to sdS and to this Q/dO buffer follow the next
    // iteration's first barrier, which every warp reaches only after this dQ step.
  }
  cp_async_wait<0>();  // a block with no query step still has its K/V copies in flight


  if (!want_dkv) return;
  store_dkv<HS>(p, e, k0 + jl, n_keys, hk, t, [&](int nd, int c) { return dk[nd][c]; },
                [&](int nd, int c) { return dv[nd][c]; });
}

}  // namespace tt::cuda::attn
