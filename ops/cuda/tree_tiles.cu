// Tile metadata of a packed batch (see tree_tiles.h): one warp per granule of kTileGranule keys
// reduces min and max of subtree_end and writes the granule's part of the padded copy; O(N) work,
// coalesced reads and writes.
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

__global__ void tree_tiles_kernel(const int32_t* __restrict__ subtree_end, int n, int num_granules,
                                  int pad_granules, int32_t* __restrict__ hi_min, int32_t* __restrict__ hi_max,
                                  int32_t* __restrict__ padded) {
  const int gi = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (gi >= pad_granules) return;
  const int j0 = gi * kTileGranule + lane, j1 = j0 + 32;
  const int a = j0 < n ? subtree_end[j0] : 0;  // keys past N: visible from nowhere
  const int b = j1 < n ? subtree_end[j1] : 0;
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
    hi_min[gi] = lo;
    hi_max[gi] = hi;
  }
}

// Bytes of the min/max arrays, rounded to 16 so the padded copy is aligned for bulk copies.
size_t minmax_bytes(int N) { return (2 * (size_t)granules(N) * sizeof(int32_t) + 15) / 16 * 16; }

}  // namespace

size_t tree_tiles_bytes(int N) {
  return N <= 0 ? 0 : minmax_bytes(N) + (size_t)pad_granules(N) * kTileGranule * sizeof(int32_t);
}

TreeTiles build_tree_tiles(const int32_t* subtree_end, int N, Workspace storage, cudaStream_t stream) {
  TT_CHECK(N >= 0, "build_tree_tiles: N=", N, ", expected >= 0");
  TreeTiles t;
  t.n = N;
  t.num_granules = granules(N);
  if (N == 0) return t;
  TT_CHECK(subtree_end != nullptr, "build_tree_tiles: subtree_end is null");
  TT_CHECK(storage.ptr != nullptr && storage.bytes >= tree_tiles_bytes(N), "build_tree_tiles: storage of ",
           storage.bytes, " bytes, expected at least tree_tiles_bytes(", N, ") = ", tree_tiles_bytes(N));
  TT_CHECK(reinterpret_cast<uintptr_t>(storage.ptr) % 16 == 0, "build_tree_tiles: storage not 16-byte aligned");
  int32_t* hi_min = static_cast<int32_t*>(storage.ptr);
  int32_t* hi_max = hi_min + t.num_granules;
  int32_t* padded = reinterpret_cast<int32_t*>(static_cast<char*>(storage.ptr) + minmax_bytes(N));
  const int pg = pad_granules(N);
  const int blocks = (pg + kWarpsPerBlock - 1) / kWarpsPerBlock;
  tree_tiles_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(subtree_end, N, t.num_granules, pg, hi_min, hi_max,
                                                                padded);
  TT_CUDA_CHECK_LAUNCH();
  t.subtree_end = subtree_end;
  t.hi_min = hi_min;
  t.hi_max = hi_max;
  t.subtree_end_pad = padded;
  return t;
}

}  // namespace tt::cuda
