// Runs the Hopper attention kernels (ops/cuda/attention_sm90.cuh) on the CPU, on top of the warp
// emulator (warp_emulator.h, included first): the names of ops/cuda/attention_sm90_device.cuh and
// ops/cuda/wgmma.cuh, emulated.
//   wgmma: a warpgroup collective (all 128 threads arrive), computed at issue in fp64 from the
//     shared-memory descriptors (128-byte swizzle, K-major or MN-major, start / LBO / SBO) and the
//     register fragments, so fence / commit / wait are no-ops.
//   mbarriers: count, pending arrivals, transaction bytes and phase per barrier; a wait yields
//     until the phase of its parity has completed. Bytes may arrive before their expect_tx (a
//     cluster peer's multicast) while an arrival is pending.
//   TMA and bulk copies: recorded at issue and landed (swizzled like the hardware, zeros past the
//     tensor's rows) by the first wait on their barrier, their bytes then completing its phase:
//     shared memory read without that wait still holds the NaN fill or older data. With
//     land_copies_at_issue (warp_emulator.h) they land at issue instead, so a refill of a buffer
//     that is still being read shows. The tensor map is this file's own encoding (tensor_map
//     below) in the CUtensorMap bytes, not the driver's.
//   Clusters (warp_emulator.h's launch_cluster): cluster_ctarank, the cluster barrier, and
//     multicast TMA into every block of a mask at the same shared-memory offsets (into a block
//     that has exited: an error).
//   Named barriers: arrival counts per id; bar.sync yields until its generation completes.
// It checks indexing, layouts, walks and the barrier protocol where CI has no GPU; it does not see
// timing: an asynchronous hazard shows only where a landing order (at the wait, or at issue) or
// the drift of a cluster's blocks (as far apart as their barriers allow) exposes it. Include it
// before ops/cuda/attention_sm90.cuh, in one translation unit.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <functional>

#include "ops/cuda/bf16.h"
#include "tests/ops_cuda_attention/warp_emulator.h"

#undef __grid_constant__
#define __grid_constant__

template <class T>
inline T __ldg(const T* p) {
  return *p;
}
// A real warp barrier (full mask only): a lane past it sees every lane's earlier stores.
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) ::tt::cuda::emu::fail("__syncwarp with a partial mask");
  ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kWarpSync);
}

namespace tt::cuda::emu {

// This emulator's tensor map: a dense (rows, heads, cols) tensor of elem_bytes elements, and boxes
// of box_cols x 1 x box_rows (128 bytes a box row: the 128-byte swizzle), stored in the 128 bytes
// of a CUtensorMap.
struct EmuTensorMap {
  const unsigned char* base;
  int64_t row_stride_bytes, head_stride_bytes;
  int64_t rows;
  int heads, cols, box_rows, box_cols, elem_bytes;
};
static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap), "fits in a CUtensorMap");

inline CUtensorMap tensor_map_3d(const void* base, int elem_bytes, int64_t rows, int heads, int cols, int box_cols,
                                 int box_rows) {
  if (box_cols * elem_bytes != 128) fail("tensor map: a box row must be 128 bytes (the 128-byte swizzle)");
  // What the driver's encoder (cuTensorMapEncodeTiled) rejects.
  if (reinterpret_cast<uintptr_t>(base) % 16) fail("tensor map: base not 16-byte aligned");
  if ((int64_t)cols * elem_bytes % 16) fail("tensor map: row strides must be multiples of 16 bytes");
  if (box_rows < 1 || box_rows > 256) fail("tensor map: box rows outside [1, 256]");
  CUtensorMap m;
  std::memset(&m, 0, sizeof m);
  const EmuTensorMap e{static_cast<const unsigned char*>(base), (int64_t)heads * cols * elem_bytes,
                       (int64_t)cols * elem_bytes, rows, heads, cols, box_rows, box_cols, elem_bytes};
  std::memcpy(&m, &e, sizeof e);
  return m;
}

// The attention's maps: bf16 (rows, heads, HS), boxes of 64 columns.
inline CUtensorMap tensor_map(const void* base, int rows, int heads, int HS, int box_rows) {
  return tensor_map_3d(base, 2, rows, heads, HS, 64, box_rows);
}

// A barrier in block b's dynamic shared memory, or a static __shared__ one (a host static here,
// see warp_emulator.h's __shared__), by address.
inline MbarState& mbar_state(BlockState& b, const void* bar) {
  const auto* p = static_cast<const unsigned char*>(bar);
  if (reinterpret_cast<uintptr_t>(p) % 8) fail("mbarrier not 8-byte aligned");
  const unsigned char* buf = b.smem.data();
  if (p >= buf && p < buf + b.smem.size() && (p < b.base || p + 8 > b.base + b.smem_size))
    fail("mbarrier outside the dynamic shared memory");
  return b.mbar[reinterpret_cast<uintptr_t>(p)];
}
inline MbarState& mbar_state(const void* bar) { return mbar_state(*block(), bar); }

// A phase completes once every arrival and every announced byte is in. Bytes may come before
// their announcement (a cluster peer's multicast copy can land before this block's expect_tx),
// while an arrival is still pending.
inline void mbar_complete_if_done(BlockState& b, MbarState& m) {
  if (m.pending < 0 || (m.pending == 0 && m.tx < 0)) fail("mbarrier: more arrivals or bytes than announced");
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1;
    m.pending = m.count;
    b.epoch++;
  }
}
inline void mbar_complete_if_done(MbarState& m) { mbar_complete_if_done(*block(), m); }

// Where `p`, an address in this block's shared memory, is in block `to`'s (the same offset:
// multicast copies and their barriers).
template <class T>
inline T* peer_smem(BlockState& to, T* p) {
  BlockState& from = *block();
  const auto off = reinterpret_cast<unsigned char*>(p) - from.window;
  if (off < 0 || off >= (std::ptrdiff_t)(from.smem.size() - (from.window - from.smem.data())))
    fail("a cluster address outside the block's shared memory (a static __shared__ variable?)");
  return reinterpret_cast<T*>(to.window + off);
}

// Byte offset `a` in shared memory after the 128-byte swizzle (bits [4:6] ^= bits [7:9]).
inline uint32_t swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }

inline float smem_bf16(uint32_t off) {
  BlockState& b = *block();
  if (off < b.offset || off + 2 > b.offset + b.smem_size) fail("wgmma operand outside smem");
  uint16_t u;
  std::memcpy(&u, b.window + off, 2);
  const uint32_t w = (uint32_t)u << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

// Element (mn, k) of an operand described by `desc`: K-major (mn rows of 128 bytes, k along the
// row) or MN-major (k rows, mn along the row, 64-element atoms LBO apart).
inline float desc_element(uint64_t desc, bool mn_major, int mn, int k) {
  if ((desc >> 62) != 1) fail("wgmma descriptor: expected the 128-byte swizzle layout");
  if (((desc >> 49) & 7) != 0) fail("wgmma descriptor: non-zero base offset");
  const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
  const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
  uint32_t a;
  if (!mn_major) {
    a = start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2;
  } else {
    a = start + (mn / 64) * lbo + (mn % 64) * 2 + (k / 8) * sbo + (k % 8) * 128;
  }
  return smem_bf16(swizzle128(a));
}

// The warpgroup MMA of 128 arrived threads: D (64 x N) (+)= A (64 x 16) B (16 x N).
inline void run_wgmma(Fiber* lane) {
  const WgmmaOperands& w0 = lane[0].wg;
  const int N = w0.n;
  for (int l = 1; l < 128; l++) {
    const WgmmaOperands& w = lane[l].wg;
    if (w.n != N || w.rs != w0.rs || w.ta != w0.ta || w.tb != w0.tb || w.accumulate != w0.accumulate ||
        w.desc_b != w0.desc_b || (!w0.rs && w.desc_a != w0.desc_a))
      fail("wgmma: the warpgroup's threads issued different MMAs");
  }
  static thread_local double A[64][16], B[16][256];
  for (int m = 0; m < 64; m++)
    for (int k = 0; k < 16; k++) A[m][k] = w0.rs ? 0.0 : desc_element(w0.desc_a, w0.ta != 0, m, k);
  if (w0.rs) {  // the mma.m16n8k16 A fragment of each warp, rows 16 w ..
    for (int l = 0; l < 128; l++) {
      const int wp = l / 32, g = (l % 32) / 4, t = l % 4;
      const uint32_t* a = lane[l].wg.a;
      const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
      for (int r = 0; r < 4; r++) {
        A[16 * wp + ar[r]][ac[r]] = bf16_lo(a[r]);
        A[16 * wp + ar[r]][ac[r] + 1] = bf16_hi(a[r]);
      }
    }
  }
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < N; n++) B[k][n] = desc_element(w0.desc_b, w0.tb != 0, n, k);
  for (int l = 0; l < 128; l++) {
    const int wp = l / 32, g = (l % 32) / 4, t = l % 4;
    float* d = lane[l].wg.d;
    for (int i = 0; i < N / 2; i++) {
      const int row = 16 * wp + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
      double s = w0.accumulate ? (double)d[i] : 0.0;
      for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
      d[i] = (float)s;
    }
  }
}

inline bool install_wgmma() {
  warpgroup_op() = run_wgmma;
  return true;
}
inline const bool kWgmmaInstalled = install_wgmma();

}  // namespace tt::cuda::emu

namespace tt::cuda::attn::sm90 {

template <int N>
struct Wgmma {
  template <int TA, int TB>
  static void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    auto& f = ::tt::cuda::emu::self();
    f.wg = ::tt::cuda::emu::WgmmaOperands{N, false, accumulate, TA, TB, desc_a, desc_b, {}, d};
    ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kWgmma);
  }
  template <int TB>
  static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
    auto& f = ::tt::cuda::emu::self();
    f.wg = ::tt::cuda::emu::WgmmaOperands{N, true, accumulate, 0, TB, 0, desc_b, {a[0], a[1], a[2], a[3]}, d};
    ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kWgmma);
  }
};

inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int kPending>
inline void wgmma_wait() {}
template <int K>
inline void fence_regs(float (&)[K]) {}
inline void fence_async_smem() {}
inline uint64_t opaque(uint64_t d) { return d; }
template <int N>
inline void setmaxnreg_inc() {}
template <int N>
inline void setmaxnreg_dec() {}

inline void named_arrive(int id, int threads) {
  auto& nb = ::tt::cuda::emu::block()->named[id];
  if (id <= 0 || id >= 16) ::tt::cuda::emu::fail("named barrier id outside 1..15");
  if (nb.arrived == 0) nb.expected = threads;
  if (nb.expected != threads) ::tt::cuda::emu::fail("named barrier used with different thread counts");
  if (++nb.arrived == threads) {
    nb.arrived = 0;
    nb.generation++;
    ::tt::cuda::emu::block()->epoch++;
  }
}
inline void named_barrier(int id, int threads) {
  const uint64_t gen = ::tt::cuda::emu::block()->named[id].generation;
  named_arrive(id, threads);
  while (::tt::cuda::emu::block()->named[id].generation == gen) ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kYield);
}
inline void named_barrier_arrive(int id, int threads) { named_arrive(id, threads); }

inline void mbar_init(uint64_t* bar, int count) {
  auto& m = ::tt::cuda::emu::mbar_state(bar);
  m = ::tt::cuda::emu::MbarState{count, count, 0, 0};
}
inline void fence_barrier_init() {}
inline void mbar_arrive(uint64_t* bar) {
  auto& m = ::tt::cuda::emu::mbar_state(bar);
  m.pending--;
  ::tt::cuda::emu::block()->epoch++;
  ::tt::cuda::emu::mbar_complete_if_done(m);
}
inline void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  ::tt::cuda::emu::mbar_state(bar).tx += bytes;
  mbar_arrive(bar);
}
// A phase's copies land when a waiter finds every arrival in (the latest moment a real copy can
// complete), also when the arrivals come while it waits.
inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  for (;;) {
    auto& m = ::tt::cuda::emu::mbar_state(bar);
    if (m.phase != (int)parity) return;
    if (m.pending == 0 && !m.copies.empty()) {  // land this phase's copies
      auto copies = std::move(m.copies);
      m.copies.clear();
      for (auto& c : copies) c();
      continue;
    }
    ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kYield);
  }
}

inline void complete_tx(::tt::cuda::emu::BlockState& b, uint64_t* bar, uint32_t bytes) {
  auto& m = ::tt::cuda::emu::mbar_state(b, bar);
  m.tx -= bytes;
  ::tt::cuda::emu::mbar_complete_if_done(b, m);
}
inline void complete_tx(uint64_t* bar, uint32_t bytes) { complete_tx(*::tt::cuda::emu::block(), bar, bytes); }

// A TMA box into block `to` at shared address dst completing `bar` (to's own): landed at issue or
// at the first wait on bar (land_copies_at_issue).
inline void tma_box(::tt::cuda::emu::BlockState& to, const ::tt::cuda::emu::EmuTensorMap& t, uint32_t dst, int c0,
                    int c1, int c2, uint64_t* bar) {
  const uint32_t box_bytes = (uint32_t)(t.box_rows * t.box_cols * t.elem_bytes);
  auto copy = [&to, t, dst, c0, c1, c2, bar, box_bytes] {
    const int e = t.elem_bytes;
    for (int r = 0; r < t.box_rows; r++)
      for (int c = 0; c < t.box_cols; c++) {
        const uint32_t a = ::tt::cuda::emu::swizzle128(dst + (r * t.box_cols + c) * e);
        const int64_t row = (int64_t)c2 + r;
        unsigned char v[4] = {};  // rows outside the tensor read as zeros
        if (row >= 0 && row < t.rows)
          std::memcpy(v, t.base + row * t.row_stride_bytes + c1 * t.head_stride_bytes + (int64_t)(c0 + c) * e, e);
        std::memcpy(to.window + a, v, e);
      }
    complete_tx(to, bar, box_bytes);
  };
  if (::tt::cuda::emu::land_copies_at_issue()) {
    copy();
  } else {
    ::tt::cuda::emu::mbar_state(to, bar).copies.push_back(copy);
  }
}

// The map of a TMA box into this block's shared memory at smem, checked (what the hardware or the
// driver rejects: an unaligned swizzled destination, a box outside the tensor's columns or heads
// or outside shared memory); dst its shared address.
inline ::tt::cuda::emu::EmuTensorMap checked_box(void* smem, const CUtensorMap* map, int c0, int c1, uint32_t* dst) {
  ::tt::cuda::emu::EmuTensorMap t;
  std::memcpy(&t, map, sizeof t);
  *dst = smem_addr(smem);
  if (*dst % 1024) ::tt::cuda::emu::fail("TMA destination not 1024-byte aligned (128-byte swizzle)");
  if (c0 < 0 || c0 + t.box_cols > t.cols || c1 < 0 || c1 >= t.heads) ::tt::cuda::emu::fail("TMA box outside columns/heads");
  const uint32_t box_bytes = (uint32_t)(t.box_rows * t.box_cols * t.elem_bytes);
  const auto& blk = *::tt::cuda::emu::block();
  if (*dst + box_bytes > blk.offset + blk.smem_size) ::tt::cuda::emu::fail("TMA box outside smem");
  return t;
}

inline void tma_load_3d(void* smem, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  uint32_t dst = 0;
  const ::tt::cuda::emu::EmuTensorMap t = checked_box(smem, map, c0, c1, &dst);
  tma_box(*::tt::cuda::emu::block(), t, dst, c0, c1, c2, bar);
}

// The same box into every block of the cluster whose rank is a bit of mask, at the same offsets.
inline void tma_load_3d_multicast(void* smem, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar,
                                  uint16_t mask) {
  auto& blk = *::tt::cuda::emu::block();
  if (!blk.cluster) ::tt::cuda::emu::fail("multicast outside a cluster launch");
  const int n = (int)blk.cluster->blocks.size();
  if (mask == 0 || (n < 16 && (mask >> n) != 0)) ::tt::cuda::emu::fail("multicast mask names no block or one past the cluster");
  uint32_t dst = 0;
  const ::tt::cuda::emu::EmuTensorMap t = checked_box(smem, map, c0, c1, &dst);
  for (int r = 0; r < n; r++)
    if (mask >> r & 1) {
      auto& to = *blk.cluster->blocks[r];
      if (to.finished) ::tt::cuda::emu::fail("multicast into a block that has exited (no cluster barrier before its exit?)");
      tma_box(to, t, dst, c0, c1, c2, ::tt::cuda::emu::peer_smem(to, bar));
    }
}

// --- Thread block clusters (warp_emulator.h's launch_cluster) ---
inline uint32_t cluster_ctarank() { return (uint32_t)::tt::cuda::emu::block()->cluster_rank; }
inline void cluster_arrive() {
  auto& f = ::tt::cuda::emu::self();
  auto* c = ::tt::cuda::emu::block()->cluster;
  if (!c) ::tt::cuda::emu::fail("cluster barrier outside a cluster launch");
  if (f.cluster_arrived) ::tt::cuda::emu::fail("cluster barrier: a second arrive before this thread's wait");
  f.cluster_arrived = true;
  f.cluster_generation = c->generation;
  if (++c->arrived == c->threads) {
    c->arrived = 0;
    c->generation++;
    for (auto* b : c->blocks) b->epoch++;
  }
}
inline void cluster_wait() {
  auto& f = ::tt::cuda::emu::self();
  auto* c = ::tt::cuda::emu::block()->cluster;
  if (!f.cluster_arrived) ::tt::cuda::emu::fail("cluster barrier: a wait without this thread's arrive");
  while (c->generation == f.cluster_generation) ::tt::cuda::emu::suspend(::tt::cuda::emu::Op::kYield);
  f.cluster_arrived = false;
}

template <int ROWS, int HS>
inline void tma_load_tile(bf16* s, const CUtensorMap* map, int head, int row0, uint64_t* bar) {
  for (int a = 0; a < HS / 64; ++a) tma_load_3d(s + a * ROWS * 64, map, a * 64, head, row0, bar);
}

inline void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  const uint32_t dst = smem_addr(smem);
  if (bytes % 16 || dst % 16 || reinterpret_cast<uintptr_t>(gmem) % 16) ::tt::cuda::emu::fail("bulk copy not 16-byte aligned");
  const auto& blk = *::tt::cuda::emu::block();
  if (dst + bytes > blk.offset + blk.smem_size) ::tt::cuda::emu::fail("bulk copy outside smem");
  auto copy = [&to = *::tt::cuda::emu::block(), smem, gmem, bytes, bar] {
    std::memcpy(smem, gmem, bytes);
    complete_tx(to, bar, bytes);
  };
  if (::tt::cuda::emu::land_copies_at_issue()) {
    copy();
  } else {
    ::tt::cuda::emu::mbar_state(bar).copies.push_back(copy);
  }
}

inline void red_add_v4_f32(float* gmem, float a, float b, float c, float d) {
  if (reinterpret_cast<uintptr_t>(gmem) % 16) ::tt::cuda::emu::fail("vector reduction not 16-byte aligned");
  gmem[0] += a;
  gmem[1] += b;
  gmem[2] += c;
  gmem[3] += d;
}

}  // namespace tt::cuda::attn::sm90
