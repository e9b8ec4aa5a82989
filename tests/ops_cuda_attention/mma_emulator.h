// The warp-level tensor-core primitives of ops/cuda/mma_sm80.cuh on the CPU, on top of the warp
// emulator (warp_emulator.h, included first): ldmatrix (x4, x4.trans, x2.trans) and
// mma.sync.m16n8k16 bf16 -> fp32, each a warp collective computed once all 32 lanes have arrived,
// with the fragment layouts of the PTX ISA. ldmatrix reads shared memory at that moment and checks
// that every row address is a 16-byte-aligned row inside the block's shared memory; the MMA sums
// in fp64 and rounds once to fp32 (the GPU accumulates in fp32: the difference is within the fp32
// rounding of the products' sums).
#pragma once

#include <cstdint>
#include <cstring>

#include "tests/ops_cuda_attention/warp_emulator.h"

namespace tt::cuda::emu {

// Lane l's row address for ldmatrix: 16 bytes (8 bf16) of one matrix row in shared memory.
inline const unsigned char* ldsm_row(const Fiber* lane, int l) {
  const BlockState& b = *block();
  const auto* p = static_cast<const unsigned char*>(lane[l].ptr);
  if (p < b.base || p + 16 > b.base + b.smem_size) fail("ldmatrix row outside the block's shared memory");
  if ((p - b.base) % 16) fail("ldmatrix row not 16-byte aligned");
  return p;
}

inline uint32_t ldsm_pair(const unsigned char* lo_row, int lo_col, const unsigned char* hi_row, int hi_col) {
  uint16_t lo, hi;
  std::memcpy(&lo, lo_row + 2 * lo_col, 2);
  std::memcpy(&hi, hi_row + 2 * hi_col, 2);
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// Matrices m < kMats, rows from lanes 8 m .. 8 m + 7. Plain: lane l gets row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1. Transposed: column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1.
template <int kMats, bool kTrans>
void ldsm_fn(Fiber* lane) {
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int m = 0; m < kMats; m++) {
      if (!kTrans) {
        const unsigned char* row = ldsm_row(lane, 8 * m + g);
        lane[l].regs[m] = ldsm_pair(row, 2 * t, row, 2 * t + 1);
      } else {
        lane[l].regs[m] = ldsm_pair(ldsm_row(lane, 8 * m + 2 * t), g, ldsm_row(lane, 8 * m + 2 * t + 1), g);
      }
    }
  }
}

template <int kMats, bool kTrans>
void ldsm(uint32_t* r, const void* p) {
  Fiber& f = self();
  f.ptr = p;
  warp_call(ldsm_fn<kMats, kTrans>);
  for (int m = 0; m < kMats; m++) r[m] = self().regs[m];
}

// D = A B + C, A 16 x 16 (regs 0-3), B 16 x 8 (regs 4-5), C and D 16 x 8 (acc), fragments as
// mma_sm80.cuh's mma_16816: g = lane / 4, t = lane % 4; A's registers (g, 2t), (g + 8, 2t),
// (g, 2t + 8), (g + 8, 2t + 8), each two columns; B's (k 2t, n g) and (k 2t + 8, n g), each two
// rows of k; C's c0, c1 at (g, 2t), (g, 2t + 1) and c2, c3 at (g + 8, 2t), (g + 8, 2t + 1).
inline void mma_fn(Fiber* lane) {
  double A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    const uint32_t* r = lane[l].regs;
    const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; i++) {
      A[ar[i]][ac[i]] = bf16_lo(r[i]);
      A[ar[i]][ac[i] + 1] = bf16_hi(r[i]);
    }
    B[2 * t][g] = bf16_lo(r[4]);
    B[2 * t + 1][g] = bf16_hi(r[4]);
    B[2 * t + 8][g] = bf16_lo(r[5]);
    B[2 * t + 9][g] = bf16_hi(r[5]);
    const float* c = lane[l].acc;
    C[g][2 * t] = c[0], C[g][2 * t + 1] = c[1], C[g + 8][2 * t] = c[2], C[g + 8][2 * t + 1] = c[3];
  }
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    const int dr[4] = {g, g, g + 8, g + 8}, dc[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; i++) {
      double s = C[dr[i]][dc[i]];
      for (int k = 0; k < 16; k++) s += A[dr[i]][k] * B[k][dc[i]];
      lane[l].acc[i] = (float)s;
    }
  }
}

}  // namespace tt::cuda::emu

namespace tt::cuda::mma {

inline void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* p) { ::tt::cuda::emu::ldsm<4, false>(r, p); }
inline void ldsm_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) { ::tt::cuda::emu::ldsm<4, true>(r, p); }
inline void ldsm_x2_trans(uint32_t (&r)[2], const __nv_bfloat16* p) { ::tt::cuda::emu::ldsm<2, true>(r, p); }

inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::tt::cuda::emu::Fiber& f = ::tt::cuda::emu::self();
  for (int i = 0; i < 4; i++) f.regs[i] = a[i];
  f.regs[4] = b0, f.regs[5] = b1;
  f.acc = c;
  ::tt::cuda::emu::warp_call(::tt::cuda::emu::mma_fn);
}

}  // namespace tt::cuda::mma
