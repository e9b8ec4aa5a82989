// Thread-level primitives of the tree attention kernels (sm_80+ PTX): cp.async copies into shared
// memory, bf16 packing and stores, fp32 pair adds and bf16 pair dot products. attention_sm90.cuh
// (with attention_sm90_device.cuh) and attention_bwd_rows.cuh are written against exactly these
// names; tests/ops_cuda_attention/warp_emulator.h provides the same set on the CPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Declares `name` as the block's dynamic shared memory, an unsigned char array 16-byte aligned
// (the delta rule's kernels, gdn_rule.cuh). A declaration, not a call of dynamic_smem(): reached
// through a function's returned pointer, the compiler computed some of those kernels' shared
// addresses in 64 bits and unrolled a loop differently.
#define TT_EXTERN_SMEM_16(name) extern __shared__ __align__(16) unsigned char name[]

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

// 4 bytes global -> shared (zero-filled when src_bytes is 0).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
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

}  // namespace tt::cuda::attn
