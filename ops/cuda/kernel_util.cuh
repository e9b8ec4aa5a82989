// Device helpers shared by the kernels of ops/cuda (private to the .cu files): vector loads and
// stores of bf16/fp32 as fp32 registers, deterministic warp/block reductions, workspace carving,
// and the one runtime-to-template switch for the vector width.
//
// Vector width: VEC = 8 bf16 (16-byte accesses) when the row length is a multiple of 8 and every
// pointer is 16-byte aligned, else VEC = 1 (scalar accesses, any length). Reductions combine
// values in a fixed tree order, so results do not vary between runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "ops/cuda/check.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda::detail {

constexpr int kWarp = 32;

// One element as fp32.
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const float* p) { return *p; }

// (VEC) bf16 at p -> fp32.
template <int VEC>
__device__ __forceinline__ void load_bf16(float (&out)[VEC], const __nv_bfloat16* p) {
  static_assert(VEC == 1 || VEC == 8, "bf16 vectors are 1 or 8 wide");
  if constexpr (VEC == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
    out[0] = __bfloat162float(*p);
  }
}

// fp32 (VEC) -> bf16 at p, round to nearest even.
template <int VEC>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* p, const float (&in)[VEC]) {
  static_assert(VEC == 1 || VEC == 8, "bf16 vectors are 1 or 8 wide");
  if constexpr (VEC == 8) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    *p = __float2bfloat16_rn(in[0]);
  }
}

// (VEC) fp32 at p (16-byte aligned when VEC == 8).
template <int VEC>
__device__ __forceinline__ void load_f32(float (&out)[VEC], const float* p) {
  if constexpr (VEC == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i++) out[i] = p[i];
  }
}

template <int VEC>
__device__ __forceinline__ void store_f32(float* p, const float (&in)[VEC]) {
  if constexpr (VEC == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i++) p[i] = in[i];
  }
}

// (VEC) elements of a bf16 or fp32 row <-> fp32 registers (the overload picks the width).
template <int VEC>
__device__ __forceinline__ void load_row(float (&out)[VEC], const __nv_bfloat16* p) {
  load_bf16<VEC>(out, p);
}
template <int VEC>
__device__ __forceinline__ void load_row(float (&out)[VEC], const float* p) {
  load_f32<VEC>(out, p);
}
template <int VEC>
__device__ __forceinline__ void store_row(__nv_bfloat16* p, const float (&in)[VEC]) {
  store_bf16<VEC>(p, in);
}
template <int VEC>
__device__ __forceinline__ void store_row(float* p, const float (&in)[VEC]) {
  store_f32<VEC>(p, in);
}

template <int VEC>
__device__ __forceinline__ void fill(float (&v)[VEC], float value) {
#pragma unroll
  for (int k = 0; k < VEC; k++) v[k] = value;
}

// An accumulating gradient's old value: (VEC) bf16 at p when `accumulate`, else zeros (p unread).
template <int VEC>
__device__ __forceinline__ void load_bf16_or_zero(float (&out)[VEC], const __nv_bfloat16* p, bool accumulate) {
  if (accumulate) {
    load_bf16<VEC>(out, p);
  } else {
    fill<VEC>(out, 0.f);
  }
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. `scratch` holds >= 32 T; blockDim.x is a
// multiple of 32. Contains __syncthreads: every thread of the block must call it.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n_warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n_warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// RoPE's cos and sin for element d < HS/2 at position pos: the angle pos * theta^(-2d/HS) and
// its cos / sin in fp64 (as ops/cpu/rope.h computes them), each rounded once to fp32. An angle
// reaches thousands of radians at deep positions, where fp32 sin/cos of an fp32 angle would lose
// digits.
__device__ __forceinline__ void rope_cos_sin(float* c, float* s, int32_t pos, int d, int HS, double theta) {
  const double inv_freq = pow(theta, -2.0 * d / HS);
  double sd, cd;
  sincos((double)pos * inv_freq, &sd, &cd);
  *c = (float)cd;
  *s = (float)sd;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Programmatic dependent launch (PDL), for the short kernels of a decode step. A kernel launched
// by launch_pdl may start while the kernel before it on the stream is still running: it calls
// pdl_wait() before it reads anything that kernel (or any before it) wrote, or writes anything they
// read; every such kernel waits (in every block), so completion stays ordered along the stream.
// The exceptions: the GEMVs (gemv.h) read weights before their wait, so no kernel may write
// weights with a PDL-launched GEMV right after it (AdamW's bf16 copy and set_params are followed by
// a host wait; every forward starts with ordinarily launched kernels); the decode attention
// (attention_decode.h) reads its prefixes' K/V and its work tables before its wait, so no kernel
// of the chain may write those (a decode step writes its new cache rows outside the prefixes it
// reads; the tables and the prefix pointer table are written by stream copies, which PDL never
// overlaps, before the first kernel that reads them).
// pdl_trigger() lets the next PDL-launched kernel start (once every block has called it or
// exited). Both are no-ops in a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// A launch configuration: PDL (as above) where `pdl`, and thread-block clusters of `cluster` blocks
// along x where cluster > 0. It points at its own attributes, so it is neither copied nor moved.
struct LaunchConfig {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2] = {};

  // cfg's fields by position (grid, block, shared memory, stream, attributes, their count): the
  // names gridDim and blockDim are macros where the CPU emulation tests compile this header.
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, int cluster = 0, bool pdl = true)
      : cfg{grid, block, smem, stream, attr, 0} {
    if (cluster > 0) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs].val.clusterDim.x = (unsigned)cluster;
      attr[cfg.numAttrs].val.clusterDim.y = 1;
      attr[cfg.numAttrs].val.clusterDim.z = 1;
      cfg.numAttrs++;
    }
    if (pdl) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      cfg.numAttrs++;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// launch_pdl with the grid's blocks in clusters of `cluster` along x (0: no clusters).
template <class... Params, class... Args>
void launch_pdl_cluster(void (*kernel)(Params...), int cluster, dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
  const LaunchConfig c(grid, block, smem, stream, cluster);
  TT_CUDA_CHECK(cudaLaunchKernelEx(&c.cfg, kernel, std::forward<Args>(args)...));
}

template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  launch_pdl_cluster(kernel, 0, grid, block, smem, stream, std::forward<Args>(args)...);
}

// What compute() gives on the current device for `key`, computed once per (device, key) and kept:
// host queries (occupancies, cluster fits) a launch path should not repeat. Each call site (its
// lambda's type) has its own table.
template <class Key, class F>
auto once_per_device(const Key& key, F&& compute) {
  using T = decltype(compute());
  static std::mutex mu;
  static std::map<std::pair<int, Key>, T> known;
  int dev = 0;
  TT_CUDA_CHECK(cudaGetDevice(&dev));
  const auto k = std::make_pair(dev, key);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(k);
  if (it != known.end()) return it->second;
  const T value = compute();
  known.emplace(k, value);
  return value;
}

// Sets a kernel's function attribute on the current device unless this function last set it to
// the same value there: attributes are per device, and setting one at every launch is a driver
// call on the decode step's host path (a few per layer).
inline void set_attribute_once(const void* kernel, cudaFuncAttribute attr, int value) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> last;
  int dev = 0;
  TT_CUDA_CHECK(cudaGetDevice(&dev));
  const auto key = std::make_tuple(dev, kernel, (int)attr);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = last.find(key);
  if (it != last.end() && it->second == value) return;
  TT_CUDA_CHECK(cudaFuncSetAttribute(kernel, attr, value));
  last[key] = value;
}

// Opts a kernel in to `bytes` of dynamic shared memory (above the default 48 KB, static part
// counted), once per device.
template <class... Params>
void opt_in_smem(void (*kernel)(Params...), size_t bytes) {
  set_attribute_once(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

// Carves 256-byte-aligned pieces out of a workspace; with ptr null it only counts bytes, so
// `<op>_workspace_bytes` and the op share one layout.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base = nullptr) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(size_t n) {
    off_ = (off_ + 255) / 256 * 256;
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += n * sizeof(T);
    return p;
  }
  size_t bytes() const { return (off_ + 255) / 256 * 256; }

 private:
  char* base_;
  size_t off_ = 0;
};

// Throws tt::Error unless ws holds `need` bytes at a 256-byte-aligned address.
inline void check_workspace(const Workspace& ws, size_t need, const char* op) {
  if (need == 0) return;
  TT_CHECK(ws.ptr && ws.bytes >= need, op, ": workspace of ", ws.bytes, " bytes, expected at least ",
           need);
  TT_CHECK((reinterpret_cast<uintptr_t>(ws.ptr) & 255u) == 0, op,
           ": workspace must be 256-byte aligned (allocator blocks are)");
}

}  // namespace tt::cuda::detail

// Runs the lambda body with `constexpr int VEC` = 8 when `wide` holds, else 1: the one place
// where the vector width becomes a template parameter.
#define TT_VEC_SWITCH(wide, VEC, ...) \
  [&] {                               \
    if (wide) {                       \
      constexpr int VEC = 8;          \
      return __VA_ARGS__();           \
    } else {                          \
      constexpr int VEC = 1;          \
      return __VA_ARGS__();           \
    }                                 \
  }()
