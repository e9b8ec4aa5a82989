// The key-tile walks of the CUDA tree attention kernels: which key tiles a query tile sees and
// how (skip / full / partial; tree_tiles.h has the rules), the forward's walk over them (32 tiles
// per warp ballot, jumping over whole sibling subtrees), and the backward's schedule of a key tile
// (its block in launch order, the query tiles of every head that see it, the no-mask test). Only
// CUDA built-ins (ballots, shuffles, __ldg), which tests/ops_cuda_attention/warp_emulator.h also
// provides.
//
// Visibility, one rule for every key: key j (of the tree or of an external prefix) carries a query
// range [lo_j, hi_j): tree key j has [j, subtree_end[j]) ([key_lo[j], subtree_end[j]) in the
// bidirectional mode, tree_tiles.h), a prefix key [q_begin, q_end), a key past the end of its
// source [lo, 0) (visible from nowhere); a prefix not in KV head hk's head set is invisible to
// its queries. Virtual key tiles number the external prefixes' tiles first, then the tree's.
#pragma once

#include <climits>
#include <cstdint>

#include "ops/cuda/attention_params.h"

namespace tt::cuda::attn {
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

enum TileKind : int { kSkip = 0, kPartial = 1, kFull = 2 };

// Key tiles of BN keys of external prefix e.
template <int BN>
__device__ __forceinline__ int ext_tile_count(const AttnFwdParams& p, int e) {
  return (p.ext[e].len + BN - 1) / BN;
}

template <int BN>
__device__ __forceinline__ int ext_tile_total(const AttnFwdParams& p) {
  int total = 0;
  for (int e = 0; e < p.n_ext; ++e) total += ext_tile_count<BN>(p, e);
  return total;
}

// Maps a virtual key tile (prefix tiles first, then tree tiles) to its prefix (or n_ext for the
// tree) and its first key.
template <int BN>
__device__ __forceinline__ void resolve_key_tile(const AttnFwdParams& p, int v, int& e, int& k0) {
  for (e = 0; e < p.n_ext; ++e) {
    const int nt = ext_tile_count<BN>(p, e);
    if (v < nt) break;
    v -= nt;
  }
  k0 = v * BN;
}

// min and max over tree keys [k0, k0 + BN) of a per-key value kept per granule (gmin, gmax);
// keys past N count as `past`.
template <int BN>
__device__ __forceinline__ void tree_tile_min_max(const int32_t* gmin, const int32_t* gmax, int num_granules, int k0,
                                                  int past, int& mn, int& mx) {
  static_assert(BN % kTileGranule == 0, "key tiles are whole granules");
  mn = INT_MAX;
  mx = INT_MIN;
#pragma unroll
  for (int s = 0; s < BN / kTileGranule; ++s) {
    const int gi = k0 / kTileGranule + s;
    const bool in = gi < num_granules;
    mn = imin(mn, in ? gmin[gi] : past);
    mx = imax(mx, in ? gmax[gi] : past);
  }
}

// min and max of subtree_end over tree keys [k0, k0 + BN) (keys past N count as 0).
template <int BN>
__device__ __forceinline__ void tree_tile_hi(const TreeTiles& t, int k0, int& hmin, int& hmax) {
  tree_tile_min_max<BN>(t.hi_min, t.hi_max, t.num_granules, k0, 0, hmin, hmax);
}

// min and max of lo_j over tree keys [k0, k0 + BN): k0 and k0 + BN - 1 in the causal tree, from the
// granules of key_lo in the bidirectional mode (keys past N count as INT_MAX).
template <int BN>
__device__ __forceinline__ void tree_tile_lo(const TreeTiles& t, int k0, int& lmin, int& lmax) {
  if (t.key_lo == nullptr) {
    lmin = k0;
    lmax = k0 + BN - 1;
    return;
  }
  tree_tile_min_max<BN>(t.lo_min, t.lo_max, t.num_granules, k0, INT_MAX, lmin, lmax);
}

// Key tile v against query rows [q0, q_last] of KV head hk: skip, partial or full (tree_tiles.h
// has the rules; a prefix outside hk's head set is skipped).
// A tree tile skipped because every key's subtree ends at or before q0 also sets skip_to: every
// key from the tile's first to its largest subtree end lies in one of those subtrees (DFS order),
// so no tile before skip_to is visible either. A walk thus steps over whole sibling subtrees.
template <int BN>
__device__ int classify_key_tile(const AttnFwdParams& p, int v, int hk, int q0, int q_last, int& skip_to) {
  int e, k0;
  resolve_key_tile<BN>(p, v, e, k0);
  skip_to = v + 1;
  if (e < p.n_ext) {
    const AttnExtParams& x = p.ext[e];
    if (x.q_end <= q0 || x.q_begin > q_last || !((x.heads >> hk) & 1)) return kSkip;
    return (x.q_begin <= q0 && x.q_end > q_last && k0 + BN <= x.len) ? kFull : kPartial;
  }
  int lmin, lmax;
  tree_tile_lo<BN>(p.tiles, k0, lmin, lmax);
  if (lmin > q_last) return kSkip;
  int hmin, hmax;
  tree_tile_hi<BN>(p.tiles, k0, hmin, hmax);
  if (hmax <= q0) {
    skip_to = imax(v + 1, v + hmax / BN - k0 / BN);
    return kSkip;
  }
  return (lmax <= q0 && hmin > q_last) ? kFull : kPartial;
}

// The backward block's virtual key tile v and KV head hk. Launch order: KV heads in groups of
// p.head_group, a group's key tiles in order (prefixes and the first tree tiles, which the most
// queries see, first), the group's heads fastest; the last group may be smaller.
__device__ __forceinline__ void bwd_block_work(const AttnBwdParams& p, int& v, int& hk) {
  const int per_group = p.head_group * p.key_tiles;
  const int g = (int)blockIdx.x / per_group, r = (int)blockIdx.x % per_group;
  const int heads = imin(p.head_group, p.nkv - g * p.head_group);
  v = r / heads;
  hk = g * p.head_group + r % heads;
}

// The backward block's view of its virtual key tile v for its KV head hk (bwd_block_work): its
// prefix (or n_ext for the tree) and first key, its K/V rows (this head), the keys of its source,
// the bounds of the full-tile test (every key's range starts at or before lo_max and ends after
// hi_min - 1), whether its dK/dV are wanted (tree keys always; a prefix when it takes gradients
// and hk is in its head set; outside it the tile has no step),
// and its schedule: n_steps steps of BM queries, the query tiles that see it ([q_lo, q_hi) rounded
// out to BM) for each query head of the GQA group in turn.
template <int BM>
struct KeyTileQueries {
  int hk, e, k0, n_keys, lo_max, hi_min;
  bool ext, want_dkv;
  const bf16* k;  // (keys, NKV, HS) at this head: row j at k + j * k_row_stride
  const bf16* v;
  int head0, qt_begin, n_qt, n_steps;

  // The steps in order (head h, query tile qt), walked without a division per step.
  struct Cursor {
    int h, qt;
  };
  __device__ __forceinline__ Cursor first_step() const { return {head0, qt_begin}; }
  __device__ __forceinline__ void next_step(Cursor& c) const {
    const bool wrap = c.qt + 1 == qt_begin + n_qt;
    c.qt = wrap ? qt_begin : c.qt + 1;
    c.h += wrap;
  }
  // Every (query, key) pair of the step's query tile q0 is visible: no mask.
  __device__ __forceinline__ bool step_full(int q0) const { return lo_max <= q0 && hi_min > q0 + BM - 1; }
};

template <int BN, int BM>
__device__ __forceinline__ KeyTileQueries<BM> key_tile_queries(const AttnBwdParams& p) {
  KeyTileQueries<BM> r;
  int v;
  bwd_block_work(p, v, r.hk);
  const int hk = r.hk;
  resolve_key_tile<BN>(p, v, r.e, r.k0);
  r.ext = r.e < p.n_ext;
  int q_lo, q_hi;
  if (r.ext) {
    const AttnExtParams& x = p.ext[r.e];
    const bool read = (x.heads >> hk) & 1;  // outside the head set: no step, no gradient
    q_lo = x.q_begin;
    q_hi = read ? x.q_end : x.q_begin;
    r.lo_max = x.q_begin;
    r.hi_min = r.k0 + BN <= x.len ? x.q_end : 0;
    r.n_keys = x.len;
    r.want_dkv = read && (x.dk != nullptr || x.dv != nullptr);
    r.k = x.k;
    r.v = x.v;
  } else {
    int hmax;
    tree_tile_hi<BN>(p.tiles, r.k0, r.hi_min, hmax);
    tree_tile_lo<BN>(p.tiles, r.k0, q_lo, r.lo_max);
    q_hi = hmax;
    r.n_keys = p.n;
    r.want_dkv = true;
    r.k = p.k;
    r.v = p.v;
  }
  r.k += hk * p.k_head_stride;
  r.v += hk * p.k_head_stride;
  r.head0 = hk * p.group;
  r.qt_begin = q_lo / BM;
  r.n_qt = q_hi > q_lo ? (q_hi + BM - 1) / BM - r.qt_begin : 0;
  r.n_steps = p.group * r.n_qt;
  return r;
}

// Query range [lo, hi) of key `key` of external prefix x; keys past its end see no query.
__device__ __forceinline__ void ext_key_range(const AttnExtParams& x, int key, int& lo, int& hi) {
  const bool ok = key < x.len;
  lo = ok ? x.q_begin : INT_MAX;
  hi = ok ? x.q_end : 0;
}

// Query range [lo, hi) of key `key` of source e (an external prefix when e < n_ext, else the
// tree; tree keys past N see no query), from global memory.
__device__ __forceinline__ void key_query_range(const AttnFwdParams& p, int e, int key, int& lo, int& hi) {
  if (e < p.n_ext) {
    ext_key_range(p.ext[e], key, lo, hi);
  } else {
    const bool ok = key < p.n;
    lo = !p.tiles.key_lo ? key : ok ? __ldg(p.tiles.key_lo + key) : INT_MAX;
    hi = ok ? __ldg(p.tiles.subtree_end + key) : 0;
  }
}

// The end of a query tile's walk: every prefix tile, then the tree tiles up to the one holding
// its last row q_last (rows past N included: keys past N are visible from nowhere); in the
// bidirectional mode every tree tile (a node's later keys are visible too; the walk's ballots
// skip the invisible ones 32 at a time).
template <int BN>
__device__ __forceinline__ int walk_end(const AttnFwdParams& p, int q_last) {
  const int tree_tiles = (p.n + BN - 1) / BN;
  return ext_tile_total<BN>(p) + (p.tiles.key_lo ? tree_tiles : imin(tree_tiles, q_last / BN + 1));
}

// A warp's view of 32 consecutive virtual key tiles from `base`: which are visible, which full,
// and the largest skip_to among them (classify_key_tile).
struct TileScan {
  int base = -64;
  uint32_t visible = 0;
  uint32_t full = 0;
  int skip_to = 0;
};

// The first key tile v >= from visible to KV head hk's rows [q0, q_last] (v_end if none), and
// whether it is full. Warp-uniform:
// every lane of the warp must call it with the same arguments. When no tile from `from` to the
// end of the window is visible, the walk resumes at the window's largest skip_to if that is
// further (each skipped tile's skip_to bounds invisible keys; together with the invisible window
// they leave no gap).
template <int BN>
__device__ __forceinline__ int next_key_tile(const AttnFwdParams& p, TileScan& scan, int from, int v_end, int hk,
                                             int q0, int q_last, bool& full) {
  const int lane = threadIdx.x % 32;
  while (from < v_end) {
    if (from < scan.base || from >= scan.base + 32) {
      scan.base = from;
      const int v = from + lane;
      int skip_to = v + 1;
      const int kind = v < v_end ? classify_key_tile<BN>(p, v, hk, q0, q_last, skip_to) : kSkip;
      scan.visible = __ballot_sync(0xffffffffu, kind != kSkip);
      scan.full = __ballot_sync(0xffffffffu, kind == kFull);
#pragma unroll
      for (int s = 16; s > 0; s /= 2) skip_to = imax(skip_to, __shfl_xor_sync(0xffffffffu, skip_to, s));
      scan.skip_to = skip_to;
    }
    const uint32_t rest = scan.visible >> (from - scan.base);
    if (rest != 0) {
      const int v = from + __ffs(rest) - 1;
      full = ((scan.full >> (v - scan.base)) & 1u) != 0;
      return v;
    }
    from = imax(scan.base + 32, scan.skip_to);
  }
  return v_end;
}

}  // namespace tt::cuda::attn
