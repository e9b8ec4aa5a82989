// Warp-level primitives of the tree attention kernels (sm_80+ PTX): cp.async, ldmatrix and the
// bf16 tensor-core mma m16n8k16 with fp32 accumulators. attention_kernels.cuh is written against
// exactly these names; tests/ops_cuda_attention/warp_emulator.h provides the same set on the CPU.
//
// Fragment layouts (lane = 4 * g + t, g = lane / 4, t = lane % 4), PTX ISA "mma.m16n8k16":
//   A (16x16, row-major) a[0..3]: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B (16x8, "col")      b[0..1]: (2t..2t+1, g), (2t+8..2t+9, g)
//   C (16x8, fp32)       c[0..3]: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tt::cuda::attn {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char tt_attn_smem[];
  return tt_attn_smem;
}

// 16 bytes global -> shared; the first src_bytes are copied, the rest zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes));
}

// 4 bytes global -> shared (src_bytes 4 or 0, then zero-filled).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, r[m] receives
// (row g, cols 2t..2t+1) of it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// The same, transposed: r[m] receives (rows 2t..2t+1, col g) of matrix m.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// d (16x8 fp32) += a (16x16 bf16) * b (16x8 bf16).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16x2, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// dst[0..1] = (x, y) rounded to bf16; dst 4-byte aligned.
__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}

// dst[0] += x, dst[1] += y in fp32 (one writer per element); dst 8-byte aligned.
__device__ __forceinline__ void add_f32x2(float* dst, float x, float y) {
  float2 old = *reinterpret_cast<const float2*>(dst);
  old.x += x;
  old.y += y;
  *reinterpret_cast<float2*>(dst) = old;
}

// a[0] b[0] + a[1] b[1] in fp32; a, b 4-byte aligned.
__device__ __forceinline__ float dot_bf16x2(const __nv_bfloat16* a, const __nv_bfloat16* b) {
  const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(a));
  const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(b));
  return x.x * y.x + x.y * y.y;
}

__device__ __forceinline__ void atomic_add_f32x2(float* addr, float x, float y) {
  atomicAdd(reinterpret_cast<float2*>(addr), make_float2(x, y));
}

}  // namespace tt::cuda::attn
