// Hopper (sm_90a) kernels of the CUDA tree attention: forward and backward with the matrix
// products on warpgroup MMA (wgmma.mma_async, ops/cuda/wgmma.cuh) reading 128-byte-swizzled
// shared memory, the tree visibility of ops/cuda/tree_tiles.h applied per key tile (skip / full /
// partial, the walks of attention_walk.cuh) and per element on partial tiles.
//
// Shared-memory tiles. A (ROWS x HS) bf16 tile is stored as HS / 64 "atoms" of ROWS rows x 128
// bytes (64 columns); in an atom, the 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the
// hardware's 128-byte swizzle, applied to address bits [4:6] ^ [7:9], so every tile starts
// 1024-byte aligned). One stored tile serves both operand orders:
//   K-major (the tile's columns are the MMA's K): 16 columns kk at atom kk / 4, +32 bytes per
//     step inside the atom; 8-row groups 1024 bytes apart (SBO).
//   MN-major (the tile's rows are the MMA's K, its columns M or N): 16 rows kk at +2048 bytes;
//     8-row groups 1024 bytes apart (SBO), 64-column atoms ROWS * 128 bytes apart (LBO).
// Q, K, V and dO tiles arrive by TMA (cp.async.bulk.tensor with the same 128-byte swizzle,
// tensor maps in AttnTmaps, completion on mbarriers; rows past the end read as zeros); the
// backward's K/V tiles by cp.async, each thread fencing the async proxy after its copies land and
// before the barrier that precedes the MMAs.
//
// Forward, per block: kFwdItemsPerBlock consecutive (query tile of BM = 128 rows, head) items, back
// to back, warp-specialised. Warpgroup 0 loads, two consumer warpgroups of 64 rows each (232
// registers through setmaxnreg) walk the visible key tiles of BN = 128 keys (the walk of
// attention_walk.cuh): S = Q K^T (both K-major), mask on partial tiles (key ranges staged in
// shared memory with K), online softmax in fp32 in registers, O += P V (P from registers,
// V MN-major).
// Each consumer is software-pipelined one tile deep, and the two take turns issuing their MMAs,
// so one's softmax runs under the other's tensor-core work (FlashAttention-3's ping-pong).
// Backward, per (key tile of BN = 128 keys, KV head; launched in two groups of KV heads, see
// bwd_block_work), 2 warpgroups of 64 keys each: for each
// query tile of BM = 64 rows (of every head of the GQA group) that sees the tile (its Q, dO, lse
// and D loaded two steps ahead by thread 0 into one of three buffers; one CTA barrier per step),
// S^T = K Q^T and dP^T = V dO^T (K-major; P^T computed while dP^T is in flight), dS^T to shared
// memory, then dQ = dS K with each warpgroup taking half of the head dim (A and B MN-major),
// issued with dV += P^T dO and dK += dS^T Q (A from registers, B MN-major); while dV and dK are
// on the tensor cores, each thread adds its dQ into the fp32 dq_accum from registers with vector
// reductions (red.global.add.v4.f32; blocked layout, see AttnBwdParams::dq_blocked: a warp's
// reduction is 512 contiguous bytes). Each thread keeps the query ranges of its two keys in
// registers; which of its columns they see is a bit mask per step.
// No branch separates an MMA from its wait: ptxas would otherwise serialize the MMAs (C7514) or
// insert waits (C7517); build with -Xptxas -v to see either.
//
// Written against the primitives of attention_device.cuh and attention_sm90_device.cuh and the
// wrappers of wgmma.cuh (which the includer brings in first; tests/ops_cuda_attention's
// warp_emulator.h and wgmma_emulator.h provide the same names to run these kernels on the CPU).
// The backward's row passes around its key-tile kernel are attention_bwd_rows.cuh's.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_bwd_rows.cuh"
#include "ops/cuda/attention_params.h"
#include "ops/cuda/attention_walk.cuh"
#include "ops/cuda/wgmma_desc.cuh"

namespace tt::cuda::attn::sm90 {

// Rows [row0, row0 + ROWS) of a (rows, HS) bf16 slab into a swizzled tile; rows at or past n_rows
// are zero-filled.
template <int ROWS, int HS, int THREADS, bool kUnroll = true>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int64_t stride, int row0, int n_rows, int tid) {
  constexpr int kChunksPerRow = HS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % THREADS == 0, "whole chunks per thread");
#pragma unroll(kUnroll ? kChunks / THREADS : 2)
  for (int it = 0; it < kChunks / THREADS; ++it) {
    const int c = tid + it * THREADS;
    const int r = c / kChunksPerRow, c8 = c % kChunksPerRow;
    const int row = row0 + r;
    const bool ok = row < n_rows;
    const bf16* src = g + (ok ? (int64_t)row * stride + c8 * 8 : 0);
    cp_async_16(s + sw_offset<ROWS>(r, c8 * 8), src, ok ? 16 : 0);
  }
}

// Bit c set where query q0 + c (0 <= c < COLS <= 64) lies in [lo, hi).
template <int COLS>
__device__ __forceinline__ uint64_t query_bits(int lo, int hi, int q0) {
  static_assert(COLS <= 64, "one 64-bit word");
  const int a = imin(imax(lo - q0, 0), COLS), b = imin(imax(hi - q0, 0), COLS);
  const uint64_t below_b = b == 64 ? ~0ull : (1ull << b) - 1;
  const uint64_t below_a = a == 64 ? ~0ull : (1ull << a) - 1;
  return below_b & ~below_a;
}

// P (accumulator layout of a 64 x n tile) as the A fragment of keys [16 kk, 16 kk + 16): the PTX
// mma.m16n8k16 A layout of the warp's 16 rows, lane = 4 g + t holding a[0..3] = (g, 2t..2t+1),
// (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..).
template <int K>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&d)[K], int kk) {
  a[0] = pack_bf16x2(d[8 * kk + 0], d[8 * kk + 1]);
  a[1] = pack_bf16x2(d[8 * kk + 2], d[8 * kk + 3]);
  a[2] = pack_bf16x2(d[8 * kk + 4], d[8 * kk + 5]);
  a[3] = pack_bf16x2(d[8 * kk + 6], d[8 * kk + 7]);
}

// The dynamic shared memory, rounded up to 1024 bytes (the swizzle atom alignment).
// Offsetting the shared pointer (not rounding a generic address) keeps its address space known,
// so loads through it compile to LDS rather than generic loads.
__device__ __forceinline__ unsigned char* smem_1024() {
  unsigned char* base = dynamic_smem();
  return base + ((1024u - (smem_addr(base) & 1023u)) & 1023u);
}

// --- Forward ---------------------------------------------------------------------------------

// Warpgroup 0 loads (one thread issues the K boxes, another the V boxes, by TMA), warpgroups 1
// and 2 compute 64 query rows each, pipelined one tile deep (S of the next tile is issued with
// P V of this one; the next tile's softmax runs while P V is on the tensor cores), never
// meeting at a CTA barrier, and taking turns on the tensor cores (named barriers 2 and 3) so one
// warpgroup's softmax runs under the other's MMAs. K and V stages have "full" (TMA transactions)
// and "empty" (256 consumer arrivals) barriers; K is released once its S is masked, V once its
// P V is. Only the loaders walk the key tiles: the K loader writes each stage's tile (and whether
// it is full) next to it, then an end marker, and copies a partial tree tile's key ranges (its
// subtree ends) into the stage, so the consumers' critical path has no tile scan and no global
// load. Q is double-buffered (released once an item's last S is done; one buffer at head dim 256)
// and the K/V stages run on across items, so the next item's Q and first tiles load while the
// consumers finish an item and store its O: a block's prologue and epilogue are paid once per
// kFwdItemsPerBlock items.
// Head dim 256 (Qwen3-Next, Qwen3.5) takes key tiles of 64 and one Q buffer: its 128 x 256 O
// accumulator is 128 registers a consumer thread, and 2 Q buffers + 2 stages of 128-key K/V tiles
// would need 384 KB of shared memory (one Q tile + 2 stages of 64 keys: 192 KB).
template <int HS>
struct FwdConfig {
  static constexpr int kThreads = 384;
  static constexpr int kStages = 2;
  static constexpr int BM = 128;
  static constexpr int BN = HS > 128 ? 64 : 128;
  static constexpr int kQBufs = HS > 128 ? 1 : 2;  // Q tiles: the next item's loads while one runs
  static constexpr int kQElems = BM * HS;
  static constexpr int kKVElems = BN * HS;
  static constexpr int kProducerRegs = 32;
  static constexpr int kConsumerRegs = 232;  // 128 x 32 + 256 x 232 <= 384 x 168 (the launch allocation)
  static constexpr size_t kSmemBytes = 1024 +
                                       (size_t)(kQBufs * kQElems + 2 * kStages * kKVElems) * sizeof(bf16) +
                                       (size_t)2 * kStages * BN * sizeof(int32_t) + (4 + 4 * kStages) * sizeof(uint64_t) +
                                       kStages * sizeof(int32_t);
  static_assert(BN == tma_key_rows(HS) && BM == 2 * kTmaQueryRows, "tiles are whole TMA boxes");
  static_assert(kTilePad % BN == 0, "a partial tile's ranges are one bulk copy of the padded subtree_end");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block has");
  // setmaxnreg only moves registers within the block's launch allocation (__launch_bounds__(384, 1):
  // 168 per thread); asking for more hangs the consumers' setmaxnreg.inc.
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * (65536 / kThreads / 8 * 8),
                "warpgroup register budgets exceed the launch allocation");
};

// Work items [begin, end) of this block: p.fwd_items consecutive (query tile, head) items in launch
// order (fwd_blocks on the host).
__device__ __forceinline__ void fwd_work_range(const AttnFwdParams& p, int& begin, int& end) {
  begin = blockIdx.x * p.fwd_items;
  end = imin(begin + p.fwd_items, fwd_items_total(p));
}

// What the K loader tells the consumers about the tile of a K stage (the consumers never walk the
// tiles themselves): the virtual key tile, whether it is full, or the end of the walk.
constexpr int kTileInfoFull = 1 << 30;
constexpr int kTileInfoMask = kTileInfoFull - 1;
constexpr int kTileInfoEnd = -1;

template <int HS>
__global__ void __launch_bounds__(FwdConfig<HS>::kThreads, 1)
    attention_fwd_kernel(const __grid_constant__ AttnFwdParams p) {
  using C = FwdConfig<HS>;
  constexpr int BM = C::BM, BN = C::BN, kStages = C::kStages;
  constexpr int kQBufs = C::kQBufs;
  bf16* sQ = reinterpret_cast<bf16*>(smem_1024());  // (kQBufs, BM, HS)
  bf16* sK = sQ + kQBufs * C::kQElems;              // (kStages, BN, HS)
  bf16* sV = sK + kStages * C::kKVElems;            // (kStages, BN, HS)
  int32_t* sHi = reinterpret_cast<int32_t*>(sV + kStages * C::kKVElems);  // (kStages, BN) subtree_end
  int32_t* sLo = sHi + kStages * BN;  // (kStages, BN) key_lo (bidirectional mode only)
  uint64_t* q_full = reinterpret_cast<uint64_t*>(sLo + kStages * BN);    // (2) each
  uint64_t* q_empty = q_full + 2;
  uint64_t* k_full = q_empty + 2;  // (kStages) each
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;
  int32_t* sInfo = reinterpret_cast<int32_t*>(v_empty + kStages);  // (kStages) kTileInfo* of each K stage

  const int tid = threadIdx.x, wg = tid / 128;
  // This block's (query tile, head) work items: fwd_work_range, in launch order (latest query
  // tiles first, heads fastest), so consecutive items share their rows and walk.
  int w_begin, w_end;
  fwd_work_range(p, w_begin, w_end);
  const int n_qt = (p.n + BM - 1) / BM;
  auto item_qt = [&](int w) { return n_qt - 1 - w / p.nh; };

  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(q_full + b, 1);
      mbar_init(q_empty + b, 256);
    }
    for (int st = 0; st < kStages; ++st) {
      mbar_init(k_full + st, 1);
      mbar_init(v_full + st, 1);
      mbar_init(k_empty + st, 256);
      mbar_init(v_empty + st, 256);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- loader: warp 0 Q and K, warp 1 V (lane 0 issues; the walk is warp-collective)
    setmaxnreg_dec<C::kProducerRegs>();
    const int warp = tid / 32, lane = tid % 32;
    if (warp < 2) {
      const bool is_k = warp == 0;
      uint64_t* full = is_k ? k_full : v_full;
      uint64_t* empty = is_k ? k_empty : v_empty;
      bf16* dst = is_k ? sK : sV;
      int i = 0;  // position in this loader's stream of stages (the K stream has an end marker per item)
      for (int w = w_begin; w < w_end; ++w) {
        const int j = w - w_begin, qb = j % kQBufs;
        const int h = w % p.nh, hk = h / p.group;
        const int q0 = item_qt(w) * BM, q_last = q0 + BM - 1;
        const int v_end = walk_end<BN>(p, q_last);
        if (is_k && lane == 0) {
          if (j >= kQBufs) mbar_wait(q_empty + qb, ((j / kQBufs) - 1) & 1);
          mbar_expect_tx(q_full + qb, C::kQElems * sizeof(bf16));
#pragma unroll
          for (int r = 0; r < BM; r += kTmaQueryRows)  // rows r.. of every atom: boxes of 64 rows
            tma_load_tile<BM, HS>(sQ + qb * C::kQElems + r * 64, &p.tm.q, h, q0 + r, q_full + qb);
        }
        TileScan scan;
        bool tile_full = false;
        for (int v = next_key_tile<BN>(p, scan, 0, v_end, hk, q0, q_last, tile_full); v < v_end;
             v = next_key_tile<BN>(p, scan, v + 1, v_end, hk, q0, q_last, tile_full), ++i) {
          if (lane == 0) {
            const int st = i % kStages;
            if (i >= kStages) mbar_wait(empty + st, ((i / kStages) - 1) & 1);
            int e, k0;
            resolve_key_tile<BN>(p, v, e, k0);
            const CUtensorMap* map =
                e < p.n_ext ? (is_k ? &p.tm.ext_k[e] : &p.tm.ext_v[e]) : (is_k ? &p.tm.k : &p.tm.v);
            // A partial tree tile's key ranges come with its K (a prefix's are two scalars).
            const bool ranges = is_k && !tile_full && e == p.n_ext;
            if (is_k) sInfo[st] = v | (tile_full ? kTileInfoFull : 0);  // published by the arrival below
            const bool lows = ranges && p.tiles.key_lo;  // the bidirectional mode's range starts too
            mbar_expect_tx(full + st, C::kKVElems * sizeof(bf16) + (ranges ? BN * sizeof(int32_t) : 0) +
                                          (lows ? BN * sizeof(int32_t) : 0));
            if (ranges) bulk_load(sHi + st * BN, p.tiles.subtree_end_pad + k0, BN * sizeof(int32_t), full + st);
            if (lows) bulk_load(sLo + st * BN, p.tiles.key_lo_pad + k0, BN * sizeof(int32_t), full + st);
            tma_load_tile<BN, HS>(dst + st * C::kKVElems, map, hk, k0, full + st);
          }
          __syncwarp();
        }
        if (is_k) {  // the end of the item's walk, in the next K stage
          if (lane == 0) {
            const int st = i % kStages;
            if (i >= kStages) mbar_wait(empty + st, ((i / kStages) - 1) & 1);
            sInfo[st] = kTileInfoEnd;
            mbar_arrive(full + st);
          }
          __syncwarp();
          ++i;
        }
      }
    }
  } else {  // ---- compute: warpgroup cw = wg - 1 owns query rows q0 + 64 cw .. of each item
    setmaxnreg_inc<C::kConsumerRegs>();
    const int cw = wg - 1, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int my_turn = 2 + cw, other_turn = 3 - cw;  // named barriers of the MMA turns
    int qb = 0;                                        // the item's Q buffer

    float o[HS / 2];
    float m[2], l[2], corr[2];
    uint32_t pa[BN / 16][4];  // P of the tile whose P V is next, as A fragments
    float s[BN / 2];
    int row_base = 0;  // this thread's rows of the item: row_base, row_base + 8

    auto issue_s = [&](int st) {
      const uint64_t dq_base = desc_kmajor<BM>(sQ + qb * C::kQElems, cw * 64);
      const uint64_t dk_base = desc_kmajor<BN>(sK + st * C::kKVElems, 0);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk)
        Wgmma<BN>::template ss<0, 0>(s, desc_add(dq_base, kmajor_step<BM>(kk)),
                                     desc_add(dk_base, kmajor_step<BN>(kk)), kk > 0);
      wgmma_commit();
    };
    auto issue_pv = [&](int st) {
      const uint64_t dv_base = desc_mnmajor<BN>(sV + st * C::kKVElems, 0);
      fence_regs(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        Wgmma<HS>::template rs<1>(o, pa[kk], desc_add(dv_base, kk * kMnStep), true);
      wgmma_commit();
    };
    // Mask of a partial tile v in K stage st: a tree tile's key ranges are in sHi (their subtree
    // ends, the loader's bulk copy) and, in the bidirectional mode, sLo; a prefix's are its query
    // range.
    const bool bidirectional = p.tiles.key_lo != nullptr;
    auto mask = [&](int v, int st) {
      int e, k0;
      resolve_key_tile<BN>(p, v, e, k0);
      const bool ext = e < p.n_ext;
      const int32_t* hi_s = sHi + st * BN;
      const int32_t* lo_s = sLo + st * BN;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int key = k0 + 8 * j + 2 * t + cc;
          int lo = key, hi;
          if (ext) {
            ext_key_range(p.ext[e], key, lo, hi);
          } else {
            hi = hi_s[8 * j + 2 * t + cc];
            if (bidirectional) lo = lo_s[8 * j + 2 * t + cc];
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = row_base + 8 * half;
            if (!(lo <= row && row < hi)) s[4 * j + 2 * half + cc] = -INFINITY;
          }
        }
    };
    auto softmax = [&] {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = m[half];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx * p.scale_log2;  // a row with no key yet stays 0
        corr[half] = exp2f(m[half] * p.scale_log2 - base);
        m[half] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const float e = exp2f(fmaf(s[4 * j + 2 * half + cc], p.scale_log2, -base));
            s[4 * j + 2 * half + cc] = e;
            sum += e;
          }
        l[half] = l[half] * corr[half] + sum;  // per-lane partial sums; reduced at the end
      }
    };
    auto pack_rescale = [&] {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) acc_to_a(pa[kk], s, kk);
#pragma unroll
      for (int j = 0; j < HS / 8; ++j) {
        o[4 * j + 0] *= corr[0];
        o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1];
        o[4 * j + 3] *= corr[1];
      }
    };

    if (cw == 1) named_barrier_arrive(other_turn, 256);  // consumer 0 takes the first turn
    int kpos = 0, vpos = 0;  // K and V stream positions of the item's first key tile
    for (int w = w_begin; w < w_end; ++w) {
      const int j = w - w_begin, h = w % p.nh;
      qb = j % kQBufs;
      row_base = item_qt(w) * BM + cw * 64 + warp * 16 + g;
#pragma unroll
      for (int i = 0; i < HS / 2; ++i) o[i] = 0.f;
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.f;
      corr[0] = corr[1] = 1.f;
      mbar_wait(q_full + qb, (j / kQBufs) & 1);
      // Tile 0 (every walk has one: each query sees itself): S, softmax (O is zero: the rescale
      // is a no-op).
      {
        const int st = kpos % kStages;
        mbar_wait(k_full + st, (kpos / kStages) & 1);
        const int info0 = sInfo[st];
        named_barrier(my_turn, 256);
        issue_s(st);
        named_barrier_arrive(other_turn, 256);
        wgmma_wait<0>();
        fence_regs(s);
        if (!(info0 & kTileInfoFull)) mask(info0 & kTileInfoMask, st);
        mbar_arrive(k_empty + st);  // after the mask, which reads the stage's key ranges
      }
      softmax();
      pack_rescale();
      int n = 0;  // the walk's tile whose P V is next
      // Steps with a next tile: no branch between the MMAs and their waits (ptxas would serialize).
      for (;;) {
        const int k1 = kpos + n + 1, vi = vpos + n;
        const int st = vi % kStages, st1 = k1 % kStages;
        mbar_wait(k_full + st1, (k1 / kStages) & 1);
        const int info1 = sInfo[st1];
        if (info1 == kTileInfoEnd) break;
        mbar_wait(v_full + st, (vi / kStages) & 1);
        named_barrier(my_turn, 256);
        issue_s(st1);
        issue_pv(st);
        named_barrier_arrive(other_turn, 256);
        wgmma_wait<1>();  // S of tile n + 1 (committed first)
        fence_regs(s);
        if (!(info1 & kTileInfoFull)) mask(info1 & kTileInfoMask, st1);
        mbar_arrive(k_empty + st1);
        softmax();  // overlaps the P V in flight, which still reads pa
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(v_empty + st);
        pack_rescale();
        ++n;
      }
      mbar_arrive(k_empty + (kpos + n + 1) % kStages);  // the end marker's stage
      mbar_arrive(q_empty + qb);                        // every S of the item is done
      {  // the last tile's P V
        const int vi = vpos + n, st = vi % kStages;
        mbar_wait(v_full + st, (vi / kStages) & 1);
        named_barrier(my_turn, 256);
        issue_pv(st);
        named_barrier_arrive(other_turn, 256);
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(v_empty + st);
      }
      kpos += n + 2;  // n + 1 tiles and the end marker
      vpos += n + 1;

#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float sum = l[half];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int row = row_base + 8 * half;
        if (row < p.n) {  // every row in range sees itself, so sum > 0
          const float inv = 1.f / sum;
          bf16* dst = p.out + row * p.o_row_stride + h * p.o_head_stride;
#pragma unroll
          for (int jj = 0; jj < HS / 8; ++jj)
            store_bf16x2(dst + 8 * jj + 2 * t, o[4 * jj + 2 * half] * inv, o[4 * jj + 2 * half + 1] * inv);
          if (t == 0) p.lse[(int64_t)row * p.nh + h] = m[half] * p.scale + logf(sum);
        }
      }
    }
  }
}


// --- Backward --------------------------------------------------------------------------------

// Offset of the (BM, HS) block of query tile q0 / BM, head h, in the blocked dq_accum layout
// (AttnBwdParams::dq_blocked): per (head, query tile) two warpgroup halves of BM * HS / 2 floats,
// each four warps' 16 rows in accumulator order (see attention_dq_convert_kernel).
template <int BM, int HS>
__device__ __forceinline__ int64_t dq_block_offset(const AttnBwdParams& p, int h, int q0) {
  return ((int64_t)h * (p.n_pad / BM) + q0 / BM) * (BM * HS);
}

// Head dims 64 and 128: attention_bwd_kernel, each warpgroup owns 64 of the tile's 128 keys with
// their whole dK, dV rows. Head dim 256 (kSplitHeadDim): attention_bwd_split_kernel, 64 keys a
// tile whose dK, dV columns the two warpgroups split (a warpgroup's 64 x 256 dK and dV would be
// 256 registers a thread), P^T and dS^T exchanged through shared memory.
template <int HS>
struct BwdConfig {
  static constexpr bool kSplitHeadDim = HS > 128;
  static constexpr int kThreads = 256;  // 2 warpgroups
  static constexpr int BN = kSplitHeadDim ? 64 : 128;  // 64 keys per warpgroup, or 64 shared
  static constexpr int BM = 64;                        // queries per step
  static constexpr int kQBufs = kSplitHeadDim ? 2 : 3;  // Q/dO/lse/D stages: step it + kQBufs - 1 loads while it runs
  static constexpr int kKVElems = BN * HS;
  static constexpr int kQElems = BM * HS;
  static constexpr int kDsElems = BN * BM;  // dS^T (BN, BM): one 64-column atom, double-buffered
  static constexpr int kPElems = kSplitHeadDim ? BN * BM : 0;  // P^T (BN, BM) likewise (split only)
  static constexpr size_t kSmemBytes =
      1024 + (size_t)(2 * kKVElems + 2 * kQBufs * kQElems + 2 * kDsElems + 2 * kPElems) * sizeof(bf16) +
      2 * kQBufs * BM * sizeof(float) + kQBufs * sizeof(uint64_t);
  static_assert(BM == kTmaQueryRows, "Q/dO steps are single TMA boxes in rows");
  static_assert(BM == 64, "dS^T is one swizzle atom wide");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block has");
};

// A backward key-tile kernel's shared memory (both kernels): the tile's K and V, kQBufs buffers of
// a step's Q, dO (TMA) and lse, D (bulk copies) with their barriers, dS^T and (split kernel) P^T,
// double-buffered.
template <int HS>
struct BwdSmem {
  using C = BwdConfig<HS>;
  bf16* sK;      // (BN, HS)
  bf16* sV;      // (BN, HS)
  bf16* sQ;      // (kQBufs, BM, HS)
  bf16* sdO;     // (kQBufs, BM, HS)
  bf16* sdS;     // (2, BN, BM) dS^T
  bf16* sP;      // (2, BN, BM) P^T (split kernel only)
  float* sLse;   // (kQBufs, BM)
  float* sD;     // (kQBufs, BM)
  uint64_t* q_full;  // (kQBufs) a step's inputs landed
  __device__ __forceinline__ BwdSmem() {
    sK = reinterpret_cast<bf16*>(smem_1024());
    sV = sK + C::kKVElems;
    sQ = sV + C::kKVElems;
    sdO = sQ + C::kQBufs * C::kQElems;
    sdS = sdO + C::kQBufs * C::kQElems;
    sP = sdS + 2 * C::kDsElems;
    sLse = reinterpret_cast<float*>(sP + 2 * C::kPElems);
    sD = sLse + C::kQBufs * C::BM;
    q_full = reinterpret_cast<uint64_t*>(sD + C::kQBufs * C::BM);
  }
  // The block's key tile and its schedule (key_tile_queries): the step barriers initialised, the
  // tile's K and V on their way (cp.async, committed; the caller waits).
  __device__ __forceinline__ KeyTileQueries<C::BM> begin(const AttnBwdParams& p, int tid) const {
    if (tid == 0) {
      for (int b = 0; b < C::kQBufs; ++b) mbar_init(q_full + b, 1);
      fence_barrier_init();
    }
    __syncthreads();
    const KeyTileQueries<C::BM> kt = key_tile_queries<C::BN, C::BM>(p);
    load_tile<C::BN, HS, C::kThreads>(sK, kt.k, p.k_row_stride, kt.k0, kt.n_keys, tid);
    load_tile<C::BN, HS, C::kThreads>(sV, kt.v, p.k_row_stride, kt.k0, kt.n_keys, tid);
    cp_async_commit();
    return kt;
  }
  // The step at cursor c (its head's Q, dO, lse and D) into buffer b, then c moves to the next
  // step (one thread issues it). Steps load kQBufs - 1 ahead: step it + kQBufs - 1 goes into the
  // buffer step it - 1 used, once both warpgroups are past step it's barrier.
  __device__ __forceinline__ void load_next(const AttnBwdParams& p, const KeyTileQueries<C::BM>& kt,
                                            typename KeyTileQueries<C::BM>::Cursor& c, int b) const {
    constexpr int BM = C::BM;
    const int h = c.h, q0 = c.qt * BM;
    kt.next_step(c);
    mbar_expect_tx(q_full + b, 2 * C::kQElems * sizeof(bf16) + 2 * BM * sizeof(float));
    tma_load_tile<BM, HS>(sQ + b * C::kQElems, &p.tm.q, h, q0, q_full + b);  // rows past N read as zeros
    tma_load_tile<BM, HS>(sdO + b * C::kQElems, &p.tm.dout, h, q0, q_full + b);
    bulk_load(sLse + b * BM, p.lse_log2 + (int64_t)h * p.n_pad + q0, BM * sizeof(float), q_full + b);
    bulk_load(sD + b * BM, p.dsum + (int64_t)h * p.n_pad + q0, BM * sizeof(float), q_full + b);
  }
  // The first kQBufs - 1 steps on their way (thread 0; c then points past them), and the tile's K
  // and V landed for every thread.
  __device__ __forceinline__ void start(const AttnBwdParams& p, const KeyTileQueries<C::BM>& kt,
                                        typename KeyTileQueries<C::BM>::Cursor& c, int tid) const {
    if (tid == 0)
      for (int it = 0; it < imin(C::kQBufs - 1, kt.n_steps); ++it) load_next(p, kt, c, it);
    cp_async_wait<0>();  // K and V
    fence_async_smem();
    __syncthreads();
  }
  // Step it (at cursor c) once its Q, dO, lse and D have landed: where they are in shared memory.
  struct Step {
    int h, q0;
    bool full;  // every key of the tile sees every query of the step
    const bf16* q;
    const bf16* dout;
    const float* lse;
    const float* d;
  };
  __device__ __forceinline__ Step wait_step(const KeyTileQueries<C::BM>& kt,
                                            const typename KeyTileQueries<C::BM>::Cursor& c, int it) const {
    const int buf = it % C::kQBufs;
    mbar_wait(q_full + buf, (it / C::kQBufs) & 1);
    const int q0 = c.qt * C::BM;
    return Step{c.h, q0, kt.step_full(q0), sQ + buf * C::kQElems, sdO + buf * C::kQElems, sLse + buf * C::BM,
                sD + buf * C::BM};
  }
};

// S^T = K Q^T and dP^T = V dO^T of a warpgroup: the 64 keys from tile row key0 against the N
// queries from step row query0 (both K-major), committed as two groups (S^T first).
template <int N, int BN, int BM, int HS>
__device__ __forceinline__ void issue_scores(float (&st)[N / 2], float (&dpt)[N / 2], const bf16* sK, const bf16* sV,
                                             const bf16* q_s, const bf16* do_s, int key0, int query0) {
  const uint64_t k_base = desc_kmajor<BN>(sK, key0), q_base = desc_kmajor<BM>(q_s, query0);
  const uint64_t v_base = desc_kmajor<BN>(sV, key0), do_base = desc_kmajor<BM>(do_s, query0);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk)
    Wgmma<N>::template ss<0, 0>(st, desc_add(k_base, kmajor_step<BN>(kk)), desc_add(q_base, kmajor_step<BM>(kk)),
                                kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk)
    Wgmma<N>::template ss<0, 0>(dpt, desc_add(v_base, kmajor_step<BN>(kk)), desc_add(do_base, kmajor_step<BM>(kk)),
                                kk > 0);
  wgmma_commit();
}

// P^T = exp(S^T scale - lse) in place, 0 where masked: NJ groups of 8 query columns (a thread's
// columns 8 j + 2 t + cc; vis_a / vis_b: which of them its two keys see, bit 8 j + cc).
template <int NJ>
__device__ __forceinline__ void probs_t(float (&st)[4 * NJ], const float* lse_s, uint64_t vis_a, uint64_t vis_b, int t,
                                        float scale_log2) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const float lse2 = lse_s[8 * j + 2 * t + cc];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float pv = exp2f(fmaf(st[4 * j + 2 * half + cc], scale_log2, -lse2));
        if (!(((half ? vis_b : vis_a) >> (8 * j + cc)) & 1)) pv = 0.f;
        st[4 * j + 2 * half + cc] = pv;
      }
    }
}

// dS^T = P^T (dP^T - D), in place in dpt (columns as probs_t).
template <int NJ>
__device__ __forceinline__ void ds_t(float (&dpt)[4 * NJ], const float (&pt)[4 * NJ], const float* d_s, int t) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const float dd = d_s[8 * j + 2 * t + cc];
#pragma unroll
      for (int half = 0; half < 2; ++half)
        dpt[4 * j + 2 * half + cc] = pt[4 * j + 2 * half + cc] * (dpt[4 * j + 2 * half + cc] - dd);
    }
}

// A warpgroup's dQ (BM queries x HS / 2 columns, accumulator order) added into the blocked
// dq_accum (float4 j of lane l at (j * 32 + l) * 4 of its warp's 16 rows: each vector reduction of
// a warp is 512 contiguous bytes).
template <int BM, int HS>
__device__ __forceinline__ void add_dq(const AttnBwdParams& p, const float (&dq)[HS / 4], int h, int q0, int wg, int warp,
                                       int lane) {
  float* dst = p.dq_accum + dq_block_offset<BM, HS>(p, h, q0) + wg * (BM * HS / 2) + warp * (8 * HS);
#pragma unroll
  for (int j = 0; j < HS / 16; ++j)
    red_add_v4_f32(dst + (j * 32 + lane) * 4, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

template <int HS>
__global__ void __launch_bounds__(BwdConfig<HS>::kThreads, 1)
    attention_bwd_kernel(const __grid_constant__ AttnBwdParams p) {
  using C = BwdConfig<HS>;
  constexpr int BM = C::BM, BN = C::BN;
  constexpr int kQBufs = C::kQBufs;
  const BwdSmem<HS> sm;
  bf16 *const sK = sm.sK, *const sV = sm.sV, *const sdS = sm.sdS;

  // wg through a shuffle: warp-uniform to the compiler, so the MMAs' descriptors can live in uniform
  // registers.
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0), warp = (tid % 128) / 32, lane = tid % 32,
            g = lane / 4, t = lane % 4;
  const KeyTileQueries<BM> kt = sm.begin(p, tid);
  const int hk = kt.hk, e = kt.e, k0 = kt.k0, n_keys = kt.n_keys, n_iter = kt.n_steps;
  const bool want_dkv = kt.want_dkv;
  const int key_row = wg * 64 + warp * 16 + g;  // local key rows key_row, key_row + 8 of this thread
  int lo_a, hi_a, lo_b, hi_b;                   // their query ranges
  key_query_range(p, e, k0 + key_row, lo_a, hi_a);
  key_query_range(p, e, k0 + key_row + 8, lo_b, hi_b);

  // Steps' Q, dO (TMA boxes) and lse, D (bulk copies) go into their buffers by thread 0.
  auto pf = kt.first_step();  // the next step to load
  sm.start(p, kt, pf, tid);

  float dv[HS / 2], dk[HS / 2];  // this warpgroup's 64 keys x HS
#pragma unroll
  for (int i = 0; i < HS / 2; ++i) dv[i] = dk[i] = 0.f;

  // One CTA barrier per step (the dS^T exchange): past it both warpgroups are done with the step
  // before, so its Q/dO/lse/D buffer takes step it + kQBufs - 1 and its dS^T buffer is free again.
  auto cur = kt.first_step();
  for (int it = 0; it < n_iter; ++it, kt.next_step(cur)) {
    const auto step = sm.wait_step(kt, cur, it);  // this step's Q, dO, lse, D
    const int h = step.h, q0 = step.q0;
    const bool full = step.full;
    const bf16 *q_s = step.q, *do_s = step.dout;
    const float *lse_s = step.lse, *d_s = step.d;

    // S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 keys x BM queries.
    float st[BM / 2], dpt[BM / 2];
    issue_scores<BM, BN, BM, HS>(st, dpt, sK, sV, q_s, do_s, wg * 64, 0);

    // Which of this thread's columns 8 j + 2 t + cc its two keys see: bit 8 j + cc (a few
    // instructions per step; a compare per element, which ptxas hoisted above the MMAs' issue,
    // had held both warpgroups off the tensor cores for ~15% of the time).
    const uint64_t vis_a = full ? ~0ull : query_bits<BM>(lo_a, hi_a, q0) >> (2 * t);
    const uint64_t vis_b = full ? ~0ull : query_bits<BM>(lo_b, hi_b, q0) >> (2 * t);

    // P^T = exp(S^T scale - lse), 0 where masked, while dP^T is in flight.
    wgmma_wait<1>();
    fence_regs(st);
    probs_t<BM / 8>(st, lse_s, vis_a, vis_b, t, p.scale_log2);
    // dS^T = P^T (dP^T - D), in place.
    wgmma_wait<0>();
    fence_regs(dpt);
    ds_t<BM / 8>(dpt, st, d_s, t);

    // dS^T (bf16) to shared memory for the dQ step.
    bf16* ds_s = sdS + (it & 1) * C::kDsElems;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        store_bf16x2(ds_s + sw_offset<BN>(key_row + 8 * half, 8 * j + 2 * t), dpt[4 * j + 2 * half],
                     dpt[4 * j + 2 * half + 1]);

    // dQ (BM x HS / 2 of this warpgroup) = dS K over all BN keys (dS^T MN-major as A, K MN-major),
    // then dV += P^T dO and dK += dS^T Q (A from registers, queries as k; B MN-major). dQ goes
    // to dq_accum while dV and dK are on the tensor cores.
    uint32_t ap[BM / 16][4], ads[BM / 16][4];  // P^T and dS^T as A fragments (st, dpt die here)
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      acc_to_a(ap[kk], st, kk);
      acc_to_a(ads[kk], dpt, kk);
    }
    fence_async_smem();             // the dS^T stores, visible to the MMAs
    named_barrier(1, C::kThreads);  // both warpgroups' dS^T rows are in shared memory
    float dq[HS / 4];
    {
      const uint64_t ds_base = desc_mnmajor<BN>(ds_s, 0), kq_base = desc_mnmajor<BN>(sK, wg * (HS / 2));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        Wgmma<HS / 2>::template ss<1, 1>(dq, desc_add(ds_base, kk * kMnStep), desc_add(kq_base, kk * kMnStep), kk > 0);
      wgmma_commit();
    }
    {  // also for a prefix without gradients (rare): no branch between the MMAs and their waits
      const uint64_t do_base = desc_mnmajor<BM>(do_s, 0), q_base = desc_mnmajor<BM>(q_s, 0);
      fence_regs(dv);
      fence_regs(dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) Wgmma<HS>::template rs<1>(dv, ap[kk], desc_add(do_base, kk * kMnStep), true);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) Wgmma<HS>::template rs<1>(dk, ads[kk], desc_add(q_base, kk * kMnStep), true);
      wgmma_commit();
    }
    // Past the barrier both warpgroups are done with step it - 1: its buffer takes step it + kQBufs - 1.
    if (tid == 0 && it + kQBufs - 1 < n_iter) sm.load_next(p, kt, pf, (it + kQBufs - 1) % kQBufs);
    wgmma_wait<1>();  // dQ (committed first)
    fence_regs(dq);
    add_dq<BM, HS>(p, dq, h, q0, wg, warp, lane);  // while dV and dK finish
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(dk);
  }
  if (!want_dkv) return;
  store_dkv<HS>(p, e, k0 + key_row, n_keys, hk, t, 0, [&](int nd, int c) { return dk[4 * nd + c]; },
                [&](int nd, int c) { return dv[4 * nd + c]; });
}

// Backward at head dim 256, per (key tile of BN = 64 keys, KV head), 2 warpgroups on the same 64
// keys, the same schedule of query steps of BM = 64 as attention_bwd_kernel (Q, dO, lse and D one
// step ahead by thread 0, two buffers). Each step: warpgroup w takes queries 32 w .. 32 w + 31 for
// S^T = K Q^T and dP^T = V dO^T (64 keys x 32 queries, K-major), computes its P^T and dS^T in fp32
// and stores both as bf16 into shared memory; past the CTA barrier each warpgroup takes columns
// 128 w .. 128 w + 127 of the head dim for dQ = dS K (A and B MN-major), dV += P^T dO and
// dK += dS^T Q (A K-major from shared memory, B MN-major), so its dK and dV are 64 x 128 (64
// registers each). dQ goes into the blocked dq_accum (the halves are the warpgroups' columns, as
// in attention_bwd_kernel) while dV and dK are on the tensor cores. P^T and dS^T are
// double-buffered: past step it's barrier both warpgroups are done with step it - 1.
template <int HS>
__global__ void __launch_bounds__(BwdConfig<HS>::kThreads, 1)
    attention_bwd_split_kernel(const __grid_constant__ AttnBwdParams p) {
  using C = BwdConfig<HS>;
  static_assert(C::kSplitHeadDim, "attention_bwd_kernel takes this head dim");
  constexpr int BM = C::BM, BN = C::BN;
  constexpr int kQBufs = C::kQBufs;
  constexpr int HC = HS / 2;  // head-dim columns of a warpgroup's dQ, dK, dV
  constexpr int QW = BM / 2;  // query columns of a warpgroup's S^T, dP^T
  const BwdSmem<HS> sm;
  bf16 *const sK = sm.sK, *const sV = sm.sV, *const sdS = sm.sdS, *const sP = sm.sP;

  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0), warp = (tid % 128) / 32, lane = tid % 32,
            g = lane / 4, t = lane % 4;
  const KeyTileQueries<BM> kt = sm.begin(p, tid);
  const int hk = kt.hk, e = kt.e, k0 = kt.k0, n_keys = kt.n_keys, n_iter = kt.n_steps;
  const bool want_dkv = kt.want_dkv;
  const int key_row = warp * 16 + g;  // local key rows key_row, key_row + 8 of this thread (both warpgroups)
  int lo_a, hi_a, lo_b, hi_b;         // their query ranges
  key_query_range(p, e, k0 + key_row, lo_a, hi_a);
  key_query_range(p, e, k0 + key_row + 8, lo_b, hi_b);

  auto pf = kt.first_step();  // the next step to load
  sm.start(p, kt, pf, tid);

  float dv[HC / 2], dk[HC / 2];  // the 64 keys x this warpgroup's HC columns
#pragma unroll
  for (int i = 0; i < HC / 2; ++i) dv[i] = dk[i] = 0.f;

  auto cur = kt.first_step();
  for (int it = 0; it < n_iter; ++it, kt.next_step(cur)) {
    const auto step = sm.wait_step(kt, cur, it);  // this step's Q, dO, lse, D
    const int h = step.h, q0 = step.q0;
    const bool full = step.full;
    const bf16 *q_s = step.q, *do_s = step.dout;
    const float *lse_s = step.lse + wg * QW, *d_s = step.d + wg * QW;  // this warpgroup's queries

    // S^T = K Q^T and dP^T = V dO^T: the 64 keys x this warpgroup's QW queries.
    float st[QW / 2], dpt[QW / 2];
    issue_scores<QW, BN, BM, HS>(st, dpt, sK, sV, q_s, do_s, 0, wg * QW);
    const uint64_t vis_a = full ? ~0ull : query_bits<BM>(lo_a, hi_a, q0) >> (wg * QW + 2 * t);
    const uint64_t vis_b = full ? ~0ull : query_bits<BM>(lo_b, hi_b, q0) >> (wg * QW + 2 * t);

    wgmma_wait<1>();
    fence_regs(st);
    probs_t<QW / 8>(st, lse_s, vis_a, vis_b, t, p.scale_log2);
    wgmma_wait<0>();
    fence_regs(dpt);
    ds_t<QW / 8>(dpt, st, d_s, t);

    // P^T and dS^T (bf16) of this warpgroup's queries into shared memory.
    bf16* ds_s = sdS + (it & 1) * C::kDsElems;
    bf16* p_s = sP + (it & 1) * C::kPElems;
#pragma unroll
    for (int j = 0; j < QW / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int off = sw_offset<BN>(key_row + 8 * half, wg * QW + 8 * j + 2 * t);
        store_bf16x2(p_s + off, st[4 * j + 2 * half], st[4 * j + 2 * half + 1]);
        store_bf16x2(ds_s + off, dpt[4 * j + 2 * half], dpt[4 * j + 2 * half + 1]);
      }
    fence_async_smem();             // the stores, visible to the MMAs
    named_barrier(1, C::kThreads);  // both warpgroups' queries are in shared memory

    // dQ (BM x this warpgroup's HC columns) = dS K over the BN keys; then dV += P^T dO and
    // dK += dS^T Q over the BM queries.
    float dq[HC / 2];
    {
      const uint64_t ds_base = desc_mnmajor<BN>(ds_s, 0), kq_base = desc_mnmajor<BN>(sK, wg * HC);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        Wgmma<HC>::template ss<1, 1>(dq, desc_add(ds_base, kk * kMnStep), desc_add(kq_base, kk * kMnStep), kk > 0);
      wgmma_commit();
    }
    {
      const uint64_t pt_base = desc_kmajor<BN>(p_s, 0), dst_base = desc_kmajor<BN>(ds_s, 0);
      const uint64_t do_base = desc_mnmajor<BM>(do_s, wg * HC), q_base = desc_mnmajor<BM>(q_s, wg * HC);
      fence_regs(dv);
      fence_regs(dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        Wgmma<HC>::template ss<0, 1>(dv, desc_add(pt_base, kmajor_step<BN>(kk)), desc_add(do_base, kk * kMnStep), true);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        Wgmma<HC>::template ss<0, 1>(dk, desc_add(dst_base, kmajor_step<BN>(kk)), desc_add(q_base, kk * kMnStep), true);
      wgmma_commit();
    }
    // Past the barrier both warpgroups are done with step it - 1: its buffer takes step it + kQBufs - 1.
    if (tid == 0 && it + kQBufs - 1 < n_iter) sm.load_next(p, kt, pf, (it + kQBufs - 1) % kQBufs);
    wgmma_wait<1>();  // dQ (committed first)
    fence_regs(dq);
    add_dq<BM, HS>(p, dq, h, q0, wg, warp, lane);
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(dk);
  }
  if (!want_dkv) return;
  store_dkv<HC>(p, e, k0 + key_row, n_keys, hk, t, wg * HC, [&](int nd, int c) { return dk[4 * nd + c]; },
                [&](int nd, int c) { return dv[4 * nd + c]; });
}

// The backward's key-tile kernel of head dim HS.
template <int HS>
constexpr auto bwd_kernel() {
  if constexpr (BwdConfig<HS>::kSplitHeadDim)
    return &attention_bwd_split_kernel<HS>;
  else
    return &attention_bwd_kernel<HS>;
}

}  // namespace tt::cuda::attn::sm90
