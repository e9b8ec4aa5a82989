// Warp-level tensor-core primitives (sm_80+ PTX, the fragment layouts of the PTX ISA for
// mma.m16n8k16): ldmatrix loads of bf16 tiles from shared memory and the bf16 mma with fp32
// accumulators. Used by the decode attention (attention_decode.cu) and the Gated DeltaNet's chunk
// products (gdn.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/attention_device.cuh"

namespace tt::cuda::mma {

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(attn::smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(attn::smem_addr(p)));
}

// Two transposed 8 x 8 tiles (the B fragment of one n8 tile): addresses from lanes 0-15.
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(attn::smem_addr(p)));
}

// c += a b: m16n8k16, bf16 inputs, fp32 accumulators (the PTX ISA's fragment layouts).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace tt::cuda::mma
