// Tile metadata of a DFS-packed batch for the CUDA tree attention, built on the GPU in O(N).
//
// Key j of the packed batch is visible from query i exactly when lo_j <= i < subtree_end[j]
// (data/packing.h), lo_j = j in the causal tree (a node's tokens see their ancestors and
// themselves) and, in the bidirectional mode (key_lo given: an image's tokens in a vision tower),
// lo_j = key_lo[j], the first token of j's node (every token of a node sees all of it). For each
// granule of kTileGranule consecutive keys the metadata keeps the minimum and maximum of
// subtree_end (and of key_lo); keys past N count as subtree_end = 0 and key_lo = INT_MAX (visible
// from no query). A kernel's key tile [k0, k0 + BN) is a whole number of granules, and against a
// query tile [q0, q1) it is, in O(1), with lo_min / lo_max the tile's extremes of lo_j:
//   skipped  when lo_min > q1 - 1 or max subtree_end <= q0 (no pair visible),
//   full     when lo_max <= q0 and min subtree_end > q1 - 1 (every pair visible, no mask),
//   partial  otherwise (masked per element with lo_j <= i < subtree_end[j]).
// A key tile is seen by exactly the queries [lo_min, max subtree_end), so the backward kernel
// walks that range only. Copies of subtree_end (and key_lo) padded to whole key tiles (kTilePad
// keys) let a kernel copy a partial tile's ranges into shared memory in one bulk copy. Storage:
// int32 per granule plus the padded copies, never an N x N mask. The metadata is built once per
// batch and shared by every layer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/workspace.h"

namespace tt::cuda {

constexpr int kTileGranule = 64;
constexpr int kTilePad = 128;  // subtree_end_pad holds a multiple of this many keys

// Device pointers, passed by value into the attention kernels.
struct TreeTiles {
  const int32_t* subtree_end = nullptr;  // (N) device
  const int32_t* hi_min = nullptr;       // (num_granules) min subtree_end per granule
  const int32_t* hi_max = nullptr;       // (num_granules) max subtree_end per granule
  const int32_t* subtree_end_pad = nullptr;  // (N rounded up to kTilePad) subtree_end, then zeros
  // Bidirectional mode only (null: lo_j = j).
  const int32_t* key_lo = nullptr;      // (N) device: the first query that sees key j
  const int32_t* lo_min = nullptr;      // (num_granules) min key_lo per granule
  const int32_t* lo_max = nullptr;      // (num_granules) max key_lo per granule (INT_MAX past N)
  const int32_t* key_lo_pad = nullptr;  // (N rounded up to kTilePad) key_lo, then INT_MAX
  int n = 0;                             // N, packed tokens
  int num_granules = 0;                  // ceil(N / kTileGranule)
};

// Device bytes build_tree_tiles needs for a batch of N tokens.
size_t tree_tiles_bytes(int N);

// Builds the metadata of subtree_end (device, (N), checked only for its pointer) into storage
// (at least tree_tiles_bytes(N) device bytes), enqueued on stream; with key_lo (device, (N),
// key_lo[j] <= j for every key, 16-byte aligned) the bidirectional mode. subtree_end, key_lo and
// storage must stay valid while attention uses the result.
TreeTiles build_tree_tiles(const int32_t* subtree_end, int N, Workspace storage, cudaStream_t stream,
                           const int32_t* key_lo = nullptr);

}  // namespace tt::cuda
