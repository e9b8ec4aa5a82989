// The Linear forward of a few rows (see gemv.h).
#include "ops/cuda/gemv.h"

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps a block
constexpr int kCols = 2;       // output columns per warp
constexpr int kUnroll = 4;     // 16-byte vectors per lane and column in flight
constexpr int64_t kTargetWarps = 4096;  // ~31 a multiprocessor on an H200: enough loads in flight

// A weight vector read once: no L1 allocation (the weights stream; x stays cached).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
    acc = fmaf(u.x, v.x, acc);
    acc = fmaf(u.y, v.y, acc);
  }
  return acc;
}

__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }

// Block: kWarps warps = (kWarps / S) column groups of kCols columns x S slices of IC; the S warps
// of a group interleave over the row in steps of 32 vectors, then their sums meet in shared
// memory and are added in slice order (deterministic).
template <int R, int S, class Out>
__global__ void __launch_bounds__(kThreads) gemv_kernel(Out* __restrict__ out, const bf16* __restrict__ x,
                                                        const bf16* __restrict__ w, int IC, int OC) {
  constexpr int kWarps = kThreads / detail::kWarp, kGroups = kWarps / S, kStep = S * detail::kWarp;
  __shared__ float part[kWarps][kCols][R];
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int group = warp / S, slice = warp % S;
  const int64_t o0 = ((int64_t)blockIdx.x * kGroups + group) * kCols;
  const int V = IC / 8;  // 16-byte vectors per row
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4* wv[kCols];
#pragma unroll
  for (int c = 0; c < kCols; c++)  // a column past OC re-reads the last one and is not stored
    wv[c] = reinterpret_cast<const uint4*>(w) + (o0 + c < OC ? o0 + c : (int64_t)OC - 1) * V;
  float acc[kCols][R];
#pragma unroll
  for (int c = 0; c < kCols; c++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[c][r] = 0.f;
  if (o0 < OC) {
    int v = slice * detail::kWarp + lane;
    for (; v + (kUnroll - 1) * kStep < V; v += kUnroll * kStep) {
      uint4 wr[kUnroll][kCols];
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
#pragma unroll
        for (int c = 0; c < kCols; c++) wr[u][c] = load_stream(wv[c] + v + u * kStep);
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
          const uint4 xr = __ldg(xv + (int64_t)r * V + v + u * kStep);
#pragma unroll
          for (int c = 0; c < kCols; c++) acc[c][r] = dot8(wr[u][c], xr, acc[c][r]);
        }
    }
    for (; v < V; v += kStep) {
#pragma unroll
      for (int c = 0; c < kCols; c++) {
        const uint4 wr = load_stream(wv[c] + v);
#pragma unroll
        for (int r = 0; r < R; r++) acc[c][r] = dot8(wr, __ldg(xv + (int64_t)r * V + v), acc[c][r]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; c++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      float t = acc[c][r];
#pragma unroll
      for (int off = detail::kWarp / 2; off > 0; off /= 2) t += __shfl_xor_sync(0xffffffffu, t, off);
      acc[c][r] = t;
    }
  if constexpr (S > 1) {
    if (lane == 0)
#pragma unroll
      for (int c = 0; c < kCols; c++)
#pragma unroll
        for (int r = 0; r < R; r++) part[warp][c][r] = acc[c][r];
    __syncthreads();
    if (slice != 0) return;
    if (lane == 0)
#pragma unroll
      for (int c = 0; c < kCols; c++)
#pragma unroll
        for (int r = 0; r < R; r++) {
          float t = part[warp][c][r];
#pragma unroll
          for (int k = 1; k < S; k++) t += part[warp + k][c][r];
          acc[c][r] = t;
        }
  }
  if (lane == 0 && o0 < OC) {
#pragma unroll
    for (int c = 0; c < kCols; c++)
      if (o0 + c < OC)
#pragma unroll
        for (int r = 0; r < R; r++) store_out(out + (int64_t)r * OC + o0 + c, acc[c][r]);
  }
}

// Slices per column group: when the column groups are fewer than half of kTargetWarps, enough
// slices to reach it (at most a block's warps, each lane at least one vector of a row). Measured
// on an H200 at one row (docs/BENCHMARKS.md): slicing the 1024- and 2048-column projections cut
// their time by a quarter to a third, slicing the 6144-column ones made them 10% slower.
int slices_for(int IC, int OC) {
  const int64_t groups = ((int64_t)OC + kCols - 1) / kCols;
  if (groups >= kTargetWarps / 2) return 1;
  const int V = IC / 8;
  int S = 1;
  while (S < kThreads / detail::kWarp && groups * S < kTargetWarps && V >= 2 * S * detail::kWarp) S *= 2;
  return S;
}

template <int R, int S, class Out>
void launch_rs(Out* out, const bf16* x, const bf16* w, int IC, int OC, cudaStream_t stream) {
  constexpr int kGroups = kThreads / detail::kWarp / S;
  const int64_t groups = ((int64_t)OC + kCols - 1) / kCols;
  const unsigned blocks = (unsigned)((groups + kGroups - 1) / kGroups);
  gemv_kernel<R, S, Out><<<blocks, kThreads, 0, stream>>>(out, x, w, IC, OC);
}

template <int R, class Out>
void launch_r(Out* out, const bf16* x, const bf16* w, int IC, int OC, cudaStream_t stream) {
  switch (slices_for(IC, OC)) {
    case 1: return launch_rs<R, 1>(out, x, w, IC, OC, stream);
    case 2: return launch_rs<R, 2>(out, x, w, IC, OC, stream);
    case 4: return launch_rs<R, 4>(out, x, w, IC, OC, stream);
    default: return launch_rs<R, 8>(out, x, w, IC, OC, stream);
  }
}

template <class Out>
void launch(Out* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream) {
  TT_CHECK(N >= 0 && N <= kGemvMaxRows && IC > 0 && OC > 0, "cuda::gemv_forward: N=", N, " IC=", IC, " OC=", OC,
           ", expected 0 <= N <= ", kGemvMaxRows, " and positive IC, OC");
  TT_CHECK(gemv_supported(x, w, N, IC), "cuda::gemv_forward: IC=", IC,
           " must be a multiple of 8 and x, w 16-byte aligned");
  TT_CHECK(out != nullptr, "cuda::gemv_forward: null out");
  switch (N) {
    case 0: return;
    case 1: launch_r<1>(out, x, w, IC, OC, stream); break;
    case 2: launch_r<2>(out, x, w, IC, OC, stream); break;
    case 3: launch_r<3>(out, x, w, IC, OC, stream); break;
    case 4: launch_r<4>(out, x, w, IC, OC, stream); break;
    case 5: launch_r<5>(out, x, w, IC, OC, stream); break;
    case 6: launch_r<6>(out, x, w, IC, OC, stream); break;
    case 7: launch_r<7>(out, x, w, IC, OC, stream); break;
    default: launch_r<8>(out, x, w, IC, OC, stream); break;
  }
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_supported(const void* x, const void* w, int N, int IC) {
  return N <= kGemvMaxRows && IC % 8 == 0 && detail::aligned16(x) && detail::aligned16(w);
}

void gemv_forward(bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream) {
  launch(out, x, w, N, IC, OC, stream);
}

void gemv_forward(float* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream) {
  launch(out, x, w, N, IC, OC, stream);
}

}  // namespace tt::cuda
