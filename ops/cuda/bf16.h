// bf16 on the host side of the CUDA backend. Host conversions round to nearest even with NaN kept
// a quiet NaN: the rule of model/safetensors.cc (BF16 writes) and of __float2bfloat16_rn on the
// device, so a float rounded here equals what a kernel stores for the same float.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tt::cuda {

using bf16 = __nv_bfloat16;

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The float nearest to f that bf16 represents (ties to even).
inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

inline bf16 host_float_to_bf16(float f) {
  __nv_bfloat16_raw r;
  r.x = float_to_bf16_bits(f);
  return bf16(r);
}

inline float host_bf16_to_float(bf16 b) {
  const __nv_bfloat16_raw r = b;
  return bf16_bits_to_float(r.x);
}

// dst (n) = round(src (n)); host memory.
inline void floats_to_bf16(bf16* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = host_float_to_bf16(src[i]);
}

// dst (n) = src (n) widened exactly; host memory.
inline void bf16_to_floats(float* dst, const bf16* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = host_bf16_to_float(src[i]);
}

}  // namespace tt::cuda
