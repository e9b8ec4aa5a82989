// The Linear forward of a few rows and its fused forms (see gemv.h).
#include "ops/cuda/gemv.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps a block
constexpr int kWarps = kThreads / detail::kWarp;
constexpr int kCols = 2;       // weight rows per warp group
constexpr int kUnroll = 4;     // 16-byte vectors per lane and weight row in flight
constexpr int kStreamStepIC = kUnroll * detail::kWarp * 8;  // input columns a warp's step covers (one slice)
constexpr int64_t kTargetWarps = 4096;  // ~31 a multiprocessor on an H200: enough loads in flight

// What the groups' products become.
enum Mode : int {
  kStoreBf16,  // out_s = the products of segment s
  kStoreF32,
  kResidual,   // out_0 = res + products (bf16, one rounding)
  kSwiglu,     // group g: gate row g of w_0, up row g of w_1; h = silu(gate) up
};

struct Params {
  const bf16* x;  // (N, IC)
  int IC;
  int mode;
  int64_t groups;  // warp groups in all (set by launch): column pairs, or (kSwiglu) output columns
  int n_seg;
  const bf16* w[kGemvMaxSegments];
  void* out[kGemvMaxSegments];  // kSwiglu: gate, up (each may be null)
  int begin[kGemvMaxSegments + 1];  // segment s has the output columns [begin[s], begin[s + 1])
  const bf16* res;  // kResidual: (N, OC)
  bf16* h;          // kSwiglu: (N, I)
  GemvNorm norm;    // the fused norm (NORM kernels)
};

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

__device__ __forceinline__ float sum_squares8(uint4 a) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 u = __bfloat1622float2(x[i]);
    s += u.x * u.x;
    s += u.y * u.y;
  }
  return s;
}

// x rstd (w + offset), rounded (rmsnorm.h's order: x rstd first).
__device__ __forceinline__ uint4 normalize8(uint4 a, uint4 w, float rs, float offset) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&w);
  uint4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
    o[i] = __floats2bfloat162_rn(u.x * rs * (v.x + offset), u.y * rs * (v.y + offset));
  }
  return out;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The segment of output column o.
__device__ __forceinline__ int segment_of(const Params& p, int64_t o) {
  int s = 0;
  while (s + 1 < p.n_seg && o >= p.begin[s + 1]) ++s;
  return s;
}

template <bool NORM>
__device__ __forceinline__ uint4 load_x(const uint4* p) {
  if constexpr (NORM) return *p;  // shared memory
  else return __ldg(p);
}

// One step of a lane: its kUnroll weight vectors of each of the group's rows (from v, kStep
// apart), and their products with the same vectors of the R rows of x.
template <int kStep>
__device__ __forceinline__ void load_step(uint4 (&w)[kUnroll][kCols], const uint4* const (&wv)[kCols], int v) {
#pragma unroll
  for (int u = 0; u < kUnroll; u++)
#pragma unroll
    for (int c = 0; c < kCols; c++) w[u][c] = load_stream(wv[c] + v + u * kStep);
}

template <int kStep, int R, bool NORM>
__device__ __forceinline__ void add_step(float (&acc)[kCols][R], const uint4 (&w)[kUnroll][kCols], const uint4* xv,
                                         int V, int v) {
#pragma unroll
  for (int u = 0; u < kUnroll; u++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint4 xr = load_x<NORM>(xv + (int64_t)r * V + v + u * kStep);
#pragma unroll
      for (int c = 0; c < kCols; c++) acc[c][r] = dot8(w[u][c], xr, acc[c][r]);
    }
}

// The weight rows of group g (a column pair, or (kSwiglu) column g of the gate and the up
// projection); a column past the end re-reads the last one and is not stored.
__device__ __forceinline__ void weight_rows(const Params& p, int64_t g, const uint4* (&wv)[kCols]) {
  const int V = p.IC / 8;  // 16-byte vectors per row
  if (p.mode == kSwiglu) {
    wv[0] = reinterpret_cast<const uint4*>(p.w[0]) + g * V;
    wv[1] = reinterpret_cast<const uint4*>(p.w[1]) + g * V;
    return;
  }
  const int64_t total = p.begin[p.n_seg];
#pragma unroll
  for (int c = 0; c < kCols; c++) {
    const int64_t o = min(g * kCols + c, total - 1);
    const int s = segment_of(p, o);
    wv[c] = reinterpret_cast<const uint4*>(p.w[s]) + (o - p.begin[s]) * V;
  }
}

// NORM: the R rows of x normalized into shared memory (rmsnorm.h's formula; block 0 also writes
// n and rstd); every thread of the block calls it. Returns where the products read x from.
template <int R, bool NORM>
__device__ __forceinline__ const uint4* block_x(const Params& p, uint4* xsm) {
  const uint4* xv = reinterpret_cast<const uint4*>(p.x);
  if constexpr (NORM) {
    const int V = p.IC / 8;
    const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
    __shared__ float red[kWarps][R];
    float ss[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      ss[r] = 0.f;
      for (int v = threadIdx.x; v < V; v += kThreads) {
        const uint4 a = __ldg(xv + (int64_t)r * V + v);
        xsm[r * V + v] = a;
        ss[r] += sum_squares8(a);
      }
      ss[r] = detail::warp_sum(ss[r]);
      if (lane == 0) red[warp][r] = ss[r];
    }
    __syncthreads();
    const uint4* nw = reinterpret_cast<const uint4*>(p.norm.w);
#pragma unroll
    for (int r = 0; r < R; r++) {
      float t = 0.f;
#pragma unroll
      for (int k = 0; k < kWarps; k++) t += red[k][r];
      const float rs = rsqrtf(t / (float)p.IC + p.norm.eps);
      for (int v = threadIdx.x; v < V; v += kThreads) {
        const uint4 n = normalize8(xsm[r * V + v], __ldg(nw + v), rs, p.norm.w_offset);
        xsm[r * V + v] = n;
        if (blockIdx.x == 0 && p.norm.n) reinterpret_cast<uint4*>(p.norm.n)[(int64_t)r * V + v] = n;
      }
      if (blockIdx.x == 0 && threadIdx.x == 0 && p.norm.rstd) p.norm.rstd[r] = rs;
    }
    __syncthreads();
    xv = xsm;
  }
  return xv;
}

// kResidual (one segment): the residual terms of group g's columns, loaded by the lane that stores
// them as soon as the previous kernel is done, so that their round trip overlaps the products
// instead of following them.
template <int R>
__device__ __forceinline__ void load_residual(const Params& p, int64_t g, float (&res)[kCols][R]) {
  const int64_t oc = p.begin[1];
#pragma unroll
  for (int c = 0; c < kCols; c++)
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int64_t o = g * kCols + c;
      res[c][r] = o < oc ? __bfloat162float(p.res[(int64_t)r * oc + o]) : 0.f;
    }
}

// Group g's products (after the sums over lanes and slices) stored as the mode says; res: the
// residual terms (load_residual) in kResidual mode.
template <int R>
__device__ __forceinline__ void store_group(const Params& p, int64_t g, const float (&acc)[kCols][R],
                                            const float (&res)[kCols][R]) {
  if (p.mode == kSwiglu) {
    const int64_t I = p.begin[1];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const float gt = round_bf16(acc[0][r]), up = round_bf16(acc[1][r]);  // as the linears store them
      const int64_t i = (int64_t)r * I + g;
      if (p.out[0]) reinterpret_cast<bf16*>(p.out[0])[i] = __float2bfloat16_rn(gt);
      if (p.out[1]) reinterpret_cast<bf16*>(p.out[1])[i] = __float2bfloat16_rn(up);
      p.h[i] = __float2bfloat16_rn(gt * (1.f / (1.f + __expf(-gt))) * up);  // swiglu.h's formula
    }
    return;
  }
  const int64_t total = p.begin[p.n_seg];
#pragma unroll
  for (int c = 0; c < kCols; c++) {
    const int64_t o = g * kCols + c;
    if (o >= total) continue;
    const int s = segment_of(p, o);
    const int64_t oc = p.begin[s + 1] - p.begin[s], j = o - p.begin[s];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int64_t i = (int64_t)r * oc + j;
      if (p.mode == kStoreF32) {
        reinterpret_cast<float*>(p.out[s])[i] = acc[c][r];
      } else if (p.mode == kResidual) {
        reinterpret_cast<bf16*>(p.out[s])[i] = __float2bfloat16_rn(res[c][r] + acc[c][r]);
      } else {
        reinterpret_cast<bf16*>(p.out[s])[i] = __float2bfloat16_rn(acc[c][r]);
      }
    }
  }
}

// Block: kWarps warps = (kWarps / S) groups of kCols weight rows x S slices of IC; the S warps of
// a group interleave over the row in steps of 32 vectors, then their sums meet in shared memory
// and are added in slice order (deterministic). NORM: the rows of x are normalized into shared
// memory first (dynamic, R IC bf16).
template <int R, int S, bool NORM>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Params p) {
  constexpr int kGroups = kWarps / S, kStep = S * detail::kWarp;
  __shared__ float part[kWarps][kCols][R];
  extern __shared__ uint4 xsm[];
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int group = warp / S, slice = warp % S;
  const int64_t g = (int64_t)blockIdx.x * kGroups + group;
  const bool active = g < p.groups;
  const int V = p.IC / 8;  // 16-byte vectors per row
  const uint4* wv[kCols];
  weight_rows(p, active ? g : p.groups - 1, wv);
  // A lane's first step of weight vectors (kUnroll of each row, where it reads that many) is
  // loaded before waiting for the previous kernel (it does not depend on it): the weight stream
  // starts while that kernel drains. (Loading every vector a lane reads ahead was measured slower:
  // 1.70-1.77 vs 1.55 ms a batch-1 step on an H200; the early loads then compete with the small
  // kernels between the GEMVs.)
  int v = slice * detail::kWarp + lane;
  const bool first = active && v + (kUnroll - 1) * kStep < V;
  uint4 w0[kUnroll][kCols];
  if (first) load_step<kStep>(w0, wv, v);
  detail::pdl_trigger();  // the next kernel may launch (it waits for this one's completion)
  detail::pdl_wait();  // x (and res) are the previous kernel's output
  const uint4* xv = block_x<R, NORM>(p, xsm);
  float res[kCols][R] = {};
  if (p.mode == kResidual && active && lane == 0 && slice == 0) load_residual<R>(p, g, res);

  float acc[kCols][R];
#pragma unroll
  for (int c = 0; c < kCols; c++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[c][r] = 0.f;
  if (first) {
    add_step<kStep, R, NORM>(acc, w0, xv, V, v);
    v += kUnroll * kStep;
  }
  if (active) {
    for (; v + (kUnroll - 1) * kStep < V; v += kUnroll * kStep) {
      uint4 wr[kUnroll][kCols];
      load_step<kStep>(wr, wv, v);
      add_step<kStep, R, NORM>(acc, wr, xv, V, v);
    }
    for (; v < V; v += kStep) {
#pragma unroll
      for (int c = 0; c < kCols; c++) {
        const uint4 wr = load_stream(wv[c] + v);
#pragma unroll
        for (int r = 0; r < R; r++) acc[c][r] = dot8(wr, load_x<NORM>(xv + (int64_t)r * V + v), acc[c][r]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; c++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[c][r] = detail::warp_sum(acc[c][r]);
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
  if (lane != 0 || !active) return;
  store_group<R>(p, g, acc, res);
}

// One row of x, one slice, every row of w a whole number of steps (IC a multiple of kStreamStepIC):
// a grid of at most the blocks the GPU holds at once, each warp taking groups g, g + stride, ...
// and issuing the loads of its next step (the group's next, or the next group's first) before
// computing the current one, so a warp's weight stream does not pause at a group's sums or at a
// block's turnover, and the x norm runs once a block. The same products in the same order as
// gemv_kernel<1, 1, NORM>.
template <bool NORM>
__global__ void __launch_bounds__(kThreads, 2) gemv_stream_kernel(const Params p) {
  constexpr int kStep = detail::kWarp, kSpan = kUnroll * kStep;  // vectors a step covers
  extern __shared__ uint4 xsm[];
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int V = p.IC / 8, steps = V / kSpan;
  const int64_t stride = (int64_t)gridDim.x * kWarps;
  int64_t g = (int64_t)blockIdx.x * kWarps + warp;
  int st = 0;
  const uint4* wv[kCols];
  uint4 cur[kUnroll][kCols];
  if (g < p.groups) {
    weight_rows(p, g, wv);
    load_step<kStep>(cur, wv, lane);
  }
  detail::pdl_trigger();
  detail::pdl_wait();
  const uint4* xv = block_x<1, NORM>(p, xsm);
  float acc[kCols][1] = {};
  while (g < p.groups) {
    int64_t g2 = g;
    int st2 = st + 1;
    const uint4* wv2[kCols];
#pragma unroll
    for (int c = 0; c < kCols; c++) wv2[c] = wv[c];
    if (st2 == steps) {
      g2 += stride;
      st2 = 0;
      if (g2 < p.groups) weight_rows(p, g2, wv2);
    }
    uint4 nxt[kUnroll][kCols];
    if (g2 < p.groups) load_step<kStep>(nxt, wv2, st2 * kSpan + lane);
    add_step<kStep, 1, NORM>(acc, cur, xv, V, st * kSpan + lane);
    if (st == steps - 1) {
      float res[kCols][1] = {};
      if (p.mode == kResidual && lane == 0) load_residual<1>(p, g, res);  // in flight during the sums
#pragma unroll
      for (int c = 0; c < kCols; c++) acc[c][0] = detail::warp_sum(acc[c][0]);
      if (lane == 0) store_group<1>(p, g, acc, res);
#pragma unroll
      for (int c = 0; c < kCols; c++) acc[c][0] = 0.f;
    }
    g = g2;
    st = st2;
#pragma unroll
    for (int c = 0; c < kCols; c++) wv[c] = wv2[c];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int c = 0; c < kCols; c++) cur[u][c] = nxt[u][c];
  }
}

// Blocks of gemv_stream_kernel<NORM> the current device holds at once (cached per device).
template <bool NORM>
int stream_blocks(size_t smem) {
  return detail::once_per_device(smem, [&] {
    int dev = 0, per_sm = 0, sms = 0;
    TT_CUDA_CHECK(cudaGetDevice(&dev));
    TT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_stream_kernel<NORM>, kThreads, smem));
    TT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return std::max(1, per_sm * sms);
  });
}

// Slices per group: when the groups are fewer than half of kTargetWarps, enough slices to reach
// it (at most a block's warps, each lane at least one vector of a row). Measured on an H200 at
// one row (docs/BENCHMARKS.md): slicing the 1024- and 2048-column projections cut their time by a
// quarter to a third, slicing the 6144-column ones made them 10% slower.
int slices_for(int IC, int64_t groups) {
  if (groups >= kTargetWarps / 2) return 1;
  const int V = IC / 8;
  int S = 1;
  while (S < kWarps && groups * S < kTargetWarps && V >= 2 * S * detail::kWarp) S *= 2;
  return S;
}

template <int R, int S, bool NORM>
void launch_rs(const Params& p, cudaStream_t stream) {
  constexpr int kGroups = kWarps / S;
  const size_t smem = NORM ? sizeof(bf16) * (size_t)R * p.IC : 0;
  auto* kernel = gemv_kernel<R, S, NORM>;
  // The default limit (48 KB) counts the static part too (under 1 KB here): opt in above it.
  if (smem + 1024 > 48 * 1024) detail::opt_in_smem(kernel, kGemvNormSmemBytes);
  detail::launch_pdl(kernel, dim3((unsigned)((p.groups + kGroups - 1) / kGroups)), dim3(kThreads), smem, stream, p);
}

template <bool NORM>
void launch_stream(const Params& p, cudaStream_t stream) {
  const size_t smem = NORM ? sizeof(bf16) * (size_t)p.IC : 0;
  auto* kernel = gemv_stream_kernel<NORM>;
  if (smem + 1024 > 48 * 1024) detail::opt_in_smem(kernel, kGemvNormSmemBytes);
  const int64_t blocks = std::min<int64_t>((p.groups + kWarps - 1) / kWarps, stream_blocks<NORM>(smem));
  detail::launch_pdl(kernel, dim3((unsigned)blocks), dim3(kThreads), smem, stream, p);
}

template <int R, bool NORM>
void launch_r(const Params& p, cudaStream_t stream) {
  const int S = slices_for(p.IC, p.groups);
  // One row of whole steps: the streaming kernel where one slice serves, and for rows of at most
  // two steps (o_proj at batch 1) also where slices would: it has a warp's whole rows in flight at
  // once, the first step loaded before the wait. (Streaming longer rows unsliced too, down_proj's
  // six steps, was measured slower on an H200: 1.41-1.46 vs 1.34-1.41 ms a batch-1 step,
  // docs/BENCHMARKS.md.)
  if (R == 1 && p.IC % kStreamStepIC == 0 && (S == 1 || p.IC <= 2 * kStreamStepIC))
    return launch_stream<NORM>(p, stream);
  switch (S) {
    case 1: return launch_rs<R, 1, NORM>(p, stream);
    case 2: return launch_rs<R, 2, NORM>(p, stream);
    case 4: return launch_rs<R, 4, NORM>(p, stream);
    default: return launch_rs<R, 8, NORM>(p, stream);
  }
}

template <bool NORM>
void launch_n(const Params& p, int N, cudaStream_t stream) {
  switch (N) {
    case 1: return launch_r<1, NORM>(p, stream);
    case 2: return launch_r<2, NORM>(p, stream);
    case 3: return launch_r<3, NORM>(p, stream);
    case 4: return launch_r<4, NORM>(p, stream);
    case 5: return launch_r<5, NORM>(p, stream);
    case 6: return launch_r<6, NORM>(p, stream);
    case 7: return launch_r<7, NORM>(p, stream);
    default: return launch_r<8, NORM>(p, stream);
  }
}

void check_rows(const char* op, const void* x, int N, int IC) {
  TT_CHECK(N >= 0 && N <= kGemvMaxRows && IC > 0 && IC % 8 == 0 && detail::aligned16(x), op, ": N=", N, " IC=", IC,
           ", expected 0 <= N <= ", kGemvMaxRows, ", IC a positive multiple of 8 and x 16-byte aligned");
}

void check_weights(const char* op, const void* w, int64_t OC) {
  TT_CHECK(w != nullptr && detail::aligned16(w) && OC > 0, op, ": weights ", w, " with ", OC,
           " rows, expected 16-byte aligned weights and OC > 0");
}

// p.norm set: the fused norm (checked here).
void launch(Params& p, int N, cudaStream_t stream, const char* op) {
  if (N == 0) return;
  p.groups = p.mode == kSwiglu ? p.begin[1] : ((int64_t)p.begin[p.n_seg] + kCols - 1) / kCols;
  if (p.norm.w) {
    TT_CHECK(gemv_norm_supported(p.x, p.norm.w, p.norm.n, N, p.IC), op, ": a fused norm of ", N, " rows of ", p.IC,
             " needs 16-byte aligned x, norm weights and n and at most ", kGemvNormSmemBytes, " bytes of rows");
    launch_n<true>(p, N, stream);
  } else {
    launch_n<false>(p, N, stream);
  }
  TT_CUDA_CHECK_LAUNCH();
}

// The checked parameters of one output of OC columns: out = x w^T (mode), one group a column pair.
Params one_output(const char* op, int mode, void* out, const bf16* x, const bf16* w, int N, int IC, int OC) {
  check_rows(op, x, N, IC);
  check_weights(op, w, OC);
  TT_CHECK(out != nullptr, op, ": null out");
  Params p{};
  p.x = x;
  p.IC = IC;
  p.mode = mode;
  p.n_seg = 1;
  p.w[0] = w;
  p.out[0] = out;
  p.begin[1] = OC;
  return p;
}

template <class Out>
void forward(Out* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream) {
  const char* op = "cuda::gemv_forward";
  Params p = one_output(op, sizeof(Out) == 4 ? kStoreF32 : kStoreBf16, out, x, w, N, IC, OC);
  launch(p, N, stream, op);
}

}  // namespace

bool gemv_supported(const void* x, const void* w, int N, int IC) {
  return N <= kGemvMaxRows && IC % 8 == 0 && detail::aligned16(x) && detail::aligned16(w);
}

bool gemv_norm_supported(const void* x, const void* norm_w, const void* n, int N, int IC) {
  return N >= 1 && N <= kGemvMaxRows && IC > 0 && IC % 8 == 0 && detail::aligned16(x) &&
         detail::aligned16(norm_w) && detail::aligned16(n) &&
         sizeof(bf16) * (size_t)N * IC <= (size_t)kGemvNormSmemBytes;
}

void gemv_forward(bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream) {
  forward(out, x, w, N, IC, OC, stream);
}

void gemv_forward(float* out, const bf16* x, const bf16* w, int N, int IC, int OC, cudaStream_t stream) {
  forward(out, x, w, N, IC, OC, stream);
}

void gemv_split(const GemvSegment* segments, int n_segments, const bf16* x, const GemvNorm& norm, int N, int IC,
                cudaStream_t stream) {
  const char* op = "cuda::gemv_split";
  check_rows(op, x, N, IC);
  TT_CHECK(n_segments >= 1 && n_segments <= kGemvMaxSegments, op, ": ", n_segments, " segments, expected 1 to ",
           kGemvMaxSegments);
  Params p{};
  p.x = x;
  p.IC = IC;
  p.mode = kStoreBf16;
  p.n_seg = n_segments;
  p.norm = norm;
  int64_t total = 0;
  for (int s = 0; s < n_segments; ++s) {
    check_weights(op, segments[s].w, segments[s].OC);
    TT_CHECK(segments[s].out != nullptr, op, ": segment ", s, " has no output");
    p.w[s] = segments[s].w;
    p.out[s] = segments[s].out;
    p.begin[s] = (int)total;
    total += segments[s].OC;
  }
  TT_CHECK(total <= INT32_MAX, op, ": ", total, " output columns");
  p.begin[n_segments] = (int)total;
  launch(p, N, stream, op);
}

void gemv_swiglu(bf16* h, bf16* gate, bf16* up, const bf16* x, const GemvNorm& norm, const bf16* wg,
                 const bf16* wu, int N, int IC, int I, cudaStream_t stream) {
  const char* op = "cuda::gemv_swiglu";
  Params p = one_output(op, kSwiglu, h, x, wg, N, IC, I);  // h checked as the output
  check_weights(op, wu, I);
  p.w[1] = wu;
  p.out[0] = gate;  // gate and up: stored where set
  p.out[1] = up;
  p.h = h;
  p.norm = norm;
  launch(p, N, stream, op);
}

void gemv_residual(bf16* out, const bf16* res, const bf16* x, const bf16* w, int N, int IC, int OC,
                   cudaStream_t stream) {
  const char* op = "cuda::gemv_residual";
  Params p = one_output(op, kResidual, out, x, w, N, IC, OC);
  TT_CHECK(res != nullptr, op, ": null res");
  p.res = res;
  launch(p, N, stream, op);
}

}  // namespace tt::cuda
