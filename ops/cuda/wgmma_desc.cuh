// Shared-memory matrix descriptors of wgmma operands (ops/cuda/wgmma.cuh) in 128-byte-swizzled
// tiles, and the tiles' element offsets: the tree attention's (attention_sm90.cuh, whose file
// comment describes the layout) and the Gated DeltaNet walk's (gdn_rule.cuh). A (ROWS x HS) bf16
// tile is HS / 64 atoms of ROWS rows x 128 bytes, 1024-byte aligned; in an atom, the 16-byte unit c
// of row r sits at unit c ^ (r % 8), as TMA's CU_TENSOR_MAP_SWIZZLE_128B writes it.
// Written against smem_addr (attention_device.cuh) and opaque (attention_sm90_device.cuh), which
// the includer brings in first (or tests/ops_cuda_attention's emulators).
#pragma once

#include <cstdint>

#include "ops/cuda/bf16.h"

namespace tt::cuda::attn::sm90 {

// Shared-memory matrix descriptor of a 128-byte-swizzled operand (see the file comment).
__device__ __forceinline__ uint64_t desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = smem_addr(smem);
  uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= (uint64_t)1 << 62;  // layout type 1: 128-byte swizzle
  return d;
}

constexpr uint32_t kSbo = 1024;  // 8 rows x 128 bytes

// The descriptor `d` moved by `bytes` (the start address field, in 16-byte units).
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

// Base descriptor of a K-major operand of a (ROWS, HS) tile from row `row0` (a multiple of 8);
// kmajor_step gives the offset of the 16 columns at `kk`.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_kmajor(const bf16* tile, int row0) {
  return opaque(desc_sw128(reinterpret_cast<const char*>(tile) + row0 * 128, 16, kSbo));
}
template <int ROWS>
__device__ __forceinline__ constexpr uint32_t kmajor_step(int kk) {
  return (kk / 4) * ROWS * 128 + (kk % 4) * 32;
}

// Base descriptor of an MN-major operand of a (ROWS, HS) tile from column `col0` (a multiple of
// 64, or 32 for a half-atom 32-column operand); the 16 rows at `kk` are kk * 2048 bytes on.
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mnmajor(const bf16* tile, int col0) {
  return opaque(desc_sw128(reinterpret_cast<const char*>(tile) + (col0 / 64) * ROWS * 128 + (col0 % 64) * 2,
                           ROWS * 128, kSbo));
}
constexpr uint32_t kMnStep = 2048;  // 16 rows x 128 bytes

// Element offset of (row r, column c) in a swizzled (ROWS, HS) tile.
template <int ROWS>
__device__ __forceinline__ int sw_offset(int r, int c) {
  return (c / 64) * ROWS * 64 + r * 64 + ((((c % 64) / 8) ^ (r % 8)) * 8) + (c % 8);
}

}  // namespace tt::cuda::attn::sm90
