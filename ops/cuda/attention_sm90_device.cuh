// Hopper primitives of the wgmma attention kernels (attention_sm90.cuh): the warpgroup MMA
// protocol, named barriers, register reallocation, mbarriers, TMA and bulk copies, each one PTX
// instruction. attention_sm90.cuh is written against exactly these names (and wgmma.cuh);
// tests/ops_cuda_attention/wgmma_emulator.h provides the same set on the CPU.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention_device.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tt::cuda::attn::sm90 {

// --- Warpgroup MMA protocol ------------------------------------------------------------------

// Orders this thread's register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMA.
template <int K>
__device__ __forceinline__ void fence_regs(float (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Makes this thread's completed generic-proxy shared-memory writes (cp.async, st.shared) visible
// to the async proxy (wgmma operand reads); precedes the barrier.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Barrier among `threads` threads (named barrier `id`, 1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the producer side of a bar.sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Register budget of this warpgroup from here on (the kernel has a cap at entry:
// __launch_bounds__(threads, 1)); the sum over warpgroups must fit the register file.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// A descriptor the compiler cannot hoist: the operands' descriptors are a base plus constants,
// and letting the compiler precompute all of them for a loop costs dozens of registers.
__device__ __forceinline__ uint64_t opaque(uint64_t d) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(d));
  return d;
}

// --- mbarriers and the tensor memory accelerator (TMA) -----------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// One plain arrival (release: this thread's earlier accesses are ordered before the phase ends).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Makes initialised barriers visible to the async proxy (TMA); precedes the barrier after init.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA transactions to complete this phase.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// One box of a tensor map (attention_params.h AttnTmaps) at coordinates (c0, c1, c2) into shared
// memory, completing on `bar`. The map must live in kernel parameter space (__grid_constant__).
__device__ __forceinline__ void tma_load_3d(void* smem, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}
// A (ROWS, HS) tile of rows [row0, row0 + ROWS) of `head`: HS / 64 boxes of 64 columns, all
// completing on `bar` (one thread; the caller announces the bytes with mbar_expect_tx).
template <int ROWS, int HS>
__device__ __forceinline__ void tma_load_tile(bf16* s, const CUtensorMap* map, int head, int row0, uint64_t* bar) {
#pragma unroll
  for (int a = 0; a < HS / 64; ++a) tma_load_3d(s + a * ROWS * 64, map, a * 64, head, row0, bar);
}

// --- Thread block clusters ---------------------------------------------------------------------

// This block's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The cluster barrier, split: every thread of every block of the cluster arrives (release: its
// earlier shared-memory reads and writes are ordered before), then waits (acquire) until all have.
// Each arrive is followed by this thread's wait before its next arrive.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
// One box of a tensor map, as tma_load_3d, written at the same shared-memory offset in every block
// of the cluster whose rank is a bit of `mask`, each completing `bar` at the same offset in that
// block (whose expect_tx announces the bytes of every box it receives, from any block).
__device__ __forceinline__ void tma_load_3d_multicast(void* smem, const CUtensorMap* map, int c0, int c1, int c2,
                                                      uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}

// `bytes` (a multiple of 16) from global to shared memory by the copy engine, completing on `bar`.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// gmem[0..4) += (a, b, c, d): one vector reduction in L2 (sm_90; gmem 16-byte aligned).
__device__ __forceinline__ void red_add_v4_f32(float* gmem, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

}  // namespace tt::cuda::attn::sm90
