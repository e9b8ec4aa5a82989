// Tile metadata of a packed batch (see tree_tiles.h): one warp per granule of kTileGranule keys
// reduces min and max of subtree_end (and of key_lo) and writes the granule's part of the padded
// copies; O(N) work, coalesced reads and writes.
#include "ops/cuda/tree_tiles.h"

#include <climits>

#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
static_assert(kTileGranule == 64, "two keys per lane");
static_assert(kTilePad % kTileGranule == 0, "the padded copy is whole granules");

int granules(int N) { return (N + kTileGranule - 1) / kTileGranule; }
int pad_granules(int N) { return (N + kTilePad - 1) / kTilePad * (kTilePad / kTileGranule); }

// One granule's min and max of x (past N: `past`) into mn[gi], mx[gi], and its padded copy.
__device__ void granule_minmax(const int32_t* __restrict__ x, int past, int n, int gi, int num_granules,
                               int32_t* __restrict__ mn, int32_t* __restrict__ mx, int32_t* __restrict__ padded) {
  const int lane = threadIdx.x % 32;
  const int j0 = gi * kTileGranule + lane, j1 = j0 + 32;
  const int a = j0 < n ? x[j0] : past;  // keys past N: visible from nowhere
  const int b = j1 < n ? x[j1] : past;
  padded[j0] = a;
  padded[j1] = b;
  if (gi >= num_granules) return;
  int lo = min(a, b), hi = max(a, b);
#pragma unroll
  for (int s = 16; s > 0; s /= 2) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, s));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, s));
  }
  if (lane == 0) {
    mn[gi] = lo;
    mx[gi] = hi;
  }
}

__global__ void tree_tiles_kernel(const int32_t* __restrict__ subtree_end, const int32_t* __restrict__ key_lo, int n,
                                  int num_granules, int pad_granules, int32_t* __restrict__ hi_min,
                                  int32_t* __restrict__ hi_max, int32_t* __restrict__ padded,
                                  int32_t* __restrict__ lo_min, int32_t* __restrict__ lo_max,
                                  int32_t* __restrict__ lo_padded) {
  const int gi = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (gi >= pad_granules) return;
  granule_minmax(subtree_end, 0, n, gi, num_granules, hi_min, hi_max, padded);
  if (key_lo) granule_minmax(key_lo, INT_MAX, n, gi, num_granules, lo_min, lo_max, lo_padded);
}

// Bytes of a min/max pair of arrays, rounded to 16 so what follows is aligned for bulk copies.
size_t minmax_bytes(int N) { return (2 * (size_t)granules(N) * sizeof(int32_t) + 15) / 16 * 16; }
size_t padded_bytes(int N) { return (size_t)pad_granules(N) * kTileGranule * sizeof(int32_t); }

}  // namespace

size_t tree_tiles_bytes(int N) { return N <= 0 ? 0 : 2 * (minmax_bytes(N) + padded_bytes(N)); }

TreeTiles build_tree_tiles(const int32_t* subtree_end, int N, Workspace storage, cudaStream_t stream,
                           const int32_t* key_lo) {
  TT_CHECK(N >= 0, "build_tree_tiles: N=", N, ", expected >= 0");
  TreeTiles t;
  t.n = N;
  t.num_granules = granules(N);
  if (N == 0) return t;
  TT_CHECK(subtree_end != nullptr, "build_tree_tiles: subtree_end is null");
  TT_CHECK(storage.ptr != nullptr && storage.bytes >= tree_tiles_bytes(N), "build_tree_tiles: storage of ",
           storage.bytes, " bytes, expected at least tree_tiles_bytes(", N, ") = ", tree_tiles_bytes(N));
  TT_CHECK(reinterpret_cast<uintptr_t>(storage.ptr) % 16 == 0, "build_tree_tiles: storage not 16-byte aligned");
  TT_CHECK(reinterpret_cast<uintptr_t>(key_lo) % 16 == 0, "build_tree_tiles: key_lo not 16-byte aligned");
  char* base = static_cast<char*>(storage.ptr);
  int32_t* hi_min = reinterpret_cast<int32_t*>(base);
  int32_t* hi_max = hi_min + t.num_granules;
  int32_t* padded = reinterpret_cast<int32_t*>(base + minmax_bytes(N));
  base += minmax_bytes(N) + padded_bytes(N);
  int32_t* lo_min = reinterpret_cast<int32_t*>(base);
  int32_t* lo_max = lo_min + t.num_granules;
  int32_t* lo_padded = reinterpret_cast<int32_t*>(base + minmax_bytes(N));
  const int pg = pad_granules(N);
  const int blocks = (pg + kWarpsPerBlock - 1) / kWarpsPerBlock;
  tree_tiles_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(subtree_end, key_lo, N, t.num_granules, pg, hi_min,
                                                                hi_max, padded, lo_min, lo_max, lo_padded);
  TT_CUDA_CHECK_LAUNCH();
  t.subtree_end = subtree_end;
  t.hi_min = hi_min;
  t.hi_max = hi_max;
  t.subtree_end_pad = padded;
  if (key_lo) {
    t.key_lo = key_lo;
    t.lo_min = lo_min;
    t.lo_max = lo_max;
    t.key_lo_pad = lo_padded;
  }
  return t;
}

}  // namespace tt::cuda
