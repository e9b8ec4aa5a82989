// The Gated DeltaNet's row ops on DFS-packed trees (ops/cuda/gdn.h): path_prev, the conv1d +
// SiLU with per-node context, the L2 norm, the gated RMSNorm and the gates, forward and backward;
// their kernels and the host sequences that launch them over a Runner, as gdn_rule.cuh's (which
// says what a Runner is; gdn.cu launches on a stream, tests/ops_cuda/gdn_emulated_test.cc on the
// CPU emulator). Written against kernel_util.cuh, which the includer brings in first.
//
// Layout of the work: the conv runs a block per row (its taps walked once by one thread into
// shared memory, channels across the threads); row-wise norms a warp per row; the gates a thread
// per element. Sums over rows (the weight gradients) take partial sums per chunk of kChunkRows
// rows, then reduce_partials adds the chunks in order: deterministic.
#pragma once

#include <cstdint>

#include "base/check.h"
#include "ops/cuda/gdn.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {
namespace {

using detail::ld;

// The row ops' blocks (path_prev's and the norm's and gates' partial sums: 128).
constexpr int kRowThreads = 256;
constexpr int kChunkRows = 64;
constexpr int kMaxTaps = 64;

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float siluf(float x) { return x * sigmoidf(x); }
__device__ __forceinline__ float dsiluf(float x) {
  const float s = sigmoidf(x);
  return s * (1.f + x * (1.f - s));
}
// log(1 + e^x) without overflow; its derivative is sigmoid(x).
__device__ __forceinline__ float softplusf(float x) { return x > 0.f ? x + log1pf(__expf(-x)) : log1pf(__expf(x)); }

int chunks_of(int rows) { return (rows + kChunkRows - 1) / kChunkRows; }

// out[e] += sum over g < chunks of partial[g n + e] (in g order).
__global__ void reduce_partials_kernel(float* out, const float* partial, int chunks, int n) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  float s = 0.f;
  for (int g = 0; g < chunks; ++g) s += partial[(int64_t)g * n + e];
  out[e] += s;
}

template <class Runner>
void reduce_partials(Runner& run, float* out, const float* partial, int chunks, int n) {
  if (n == 0) return;
  run.launch(reduce_partials_kernel, dim3((n + kRowThreads - 1) / kRowThreads), kRowThreads, 0, out, partial, chunks,
             n);
}

__global__ void path_prev_kernel(int32_t* prev, const int32_t* start, const int32_t* len, const int32_t* parent) {
  const int n = blockIdx.x;
  const int s = start[n], l = len[n], p = parent[n];
  for (int j = threadIdx.x; j < l; j += blockDim.x)
    prev[s + j] = j > 0 ? s + j - 1 : (p < 0 ? -1 : start[p] + len[p] - 1);
}

// taps[j] (K): the row of conv tap j of row i (j = K - 1: i itself), -1 past the root.
__device__ __forceinline__ void walk_taps(int32_t* taps, int i, const int32_t* prev, int K) {
  int32_t r = i;
  for (int j = K - 1; j >= 0; --j) {
    taps[j] = r;
    if (r >= 0) r = prev[r];
  }
}

__device__ __forceinline__ float conv_pre(const int32_t* taps, const bf16* x, const bf16* w, int c, int C, int K) {
  float a = 0.f;
  for (int j = 0; j < K; ++j)
    if (taps[j] >= 0) a = fmaf(ld(w + (int64_t)c * K + j), ld(x + (int64_t)taps[j] * C + c), a);
  return a;
}

__global__ void conv_forward_kernel(bf16* out, const bf16* x, const bf16* w, const int32_t* prev, int C, int K) {
  __shared__ int32_t taps[kMaxTaps];
  const int i = blockIdx.x;
  if (threadIdx.x == 0) walk_taps(taps, i, prev, K);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    out[(int64_t)i * C + c] = __float2bfloat16(siluf(conv_pre(taps, x, w, c, C, K)));
}

// da (N, C) fp32 = dout silu'(pre).
__global__ void conv_da_kernel(float* da, const bf16* dout, const bf16* x, const bf16* w, const int32_t* prev, int C,
                               int K) {
  __shared__ int32_t taps[kMaxTaps];
  const int i = blockIdx.x;
  if (threadIdx.x == 0) walk_taps(taps, i, prev, K);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    da[(int64_t)i * C + c] = ld(dout + (int64_t)i * C + c) * dsiluf(conv_pre(taps, x, w, c, C, K));
}

// dx[r, c] (+)= sum over r's descendants d at distance m < K of w[c, K - 1 - m] da[d, c]: the rows
// after r in its subtree, a subtree whose first row is K or more deeper skipped whole.
__device__ __forceinline__ void st(bf16* p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ void st(float* p, float x) { *p = x; }

template <class T>
__global__ void conv_dx_kernel(T* dx, const float* da, const bf16* w, const int32_t* pos,
                               const int32_t* subtree_end, int C, int K, bool accumulate) {
  const int r = blockIdx.x;
  const int end = subtree_end[r], p0 = pos[r];
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int d = r; d < end;) {
      const int m = pos[d] - p0;
      if (m >= K) {
        d = subtree_end[d];
        continue;
      }
      acc = fmaf(ld(w + (int64_t)c * K + (K - 1 - m)), da[(int64_t)d * C + c], acc);
      ++d;
    }
    T* o = dx + (int64_t)r * C + c;
    st(o, accumulate ? ld(o) + acc : acc);
  }
}

// partial[g][c][j] = sum over the chunk's rows i of x[tap_j(i), c] da[i, c], the rows in order.
// A thread keeps its channel's K sums in registers (K <= KT), so da is read once a row, not once
// a tap (the taps' x rows are the chunk's own and its neighbours': cached).
template <int KT>
__global__ void conv_dw_partial_kernel(float* partial, const float* da, const bf16* x, const int32_t* prev, int N,
                                       int C, int K) {
  __shared__ int32_t taps[kChunkRows * kMaxTaps];
  const int g = blockIdx.x, r0 = g * kChunkRows, rows = min(kChunkRows, N - r0);
  for (int t = threadIdx.x; t < rows; t += blockDim.x) walk_taps(taps + t * K, r0 + t, prev, K);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s[KT];
#pragma unroll
    for (int j = 0; j < KT; ++j) s[j] = 0.f;
    for (int t = 0; t < rows; ++t) {
      const float d = da[(int64_t)(r0 + t) * C + c];
#pragma unroll
      for (int j = 0; j < KT; ++j) {
        const int32_t src = j < K ? taps[t * K + j] : -1;
        if (src >= 0) s[j] = fmaf(ld(x + (int64_t)src * C + c), d, s[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < KT; ++j)
      if (j < K) partial[((int64_t)g * C + c) * K + j] = s[j];
  }
}

struct ConvScratch {
  float* da;
  float* partial;
  size_t bytes;
  ConvScratch(int N, int C, int K, void* base) {
    detail::WorkspaceCarver w(base);
    da = w.take<float>((size_t)N * C);
    partial = w.take<float>((size_t)chunks_of(N) * C * K);
    bytes = w.bytes();
  }
};

// Warp per row: y = x rstd, rstd = rsqrt(sum x^2 + eps).
__global__ void l2norm_forward_kernel(bf16* y, float* rstd, const bf16* x, int rows, int D, float eps) {
  const int row = blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
  const int lane = threadIdx.x % detail::kWarp;
  if (row >= rows) return;
  const bf16* xr = x + (int64_t)row * D;
  float ss = 0.f;
  for (int c = lane; c < D; c += detail::kWarp) ss = fmaf(ld(xr + c), ld(xr + c), ss);
  const float rs = rsqrtf(detail::warp_sum(ss) + eps);
  for (int c = lane; c < D; c += detail::kWarp) y[(int64_t)row * D + c] = __float2bfloat16(ld(xr + c) * rs);
  if (lane == 0) rstd[row] = rs;
}

__global__ void l2norm_backward_kernel(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, int rows, int D,
                                       bool accumulate) {
  const int row = blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
  const int lane = threadIdx.x % detail::kWarp;
  if (row >= rows) return;
  const int64_t o = (int64_t)row * D;
  const float rs = rstd[row];
  float dot = 0.f;  // y . dy
  for (int c = lane; c < D; c += detail::kWarp) dot = fmaf(ld(x + o + c) * rs, ld(dy + o + c), dot);
  dot = detail::warp_sum(dot);
  for (int c = lane; c < D; c += detail::kWarp) {
    const float g = rs * (ld(dy + o + c) - ld(x + o + c) * rs * dot);
    dx[o + c] = __float2bfloat16(accumulate ? ld(dx + o + c) + g : g);
  }
}

__global__ void gated_rmsnorm_forward_kernel(bf16* y, float* rstd, const bf16* x, const bf16* z, const bf16* w,
                                             int rows, int D, float eps) {
  const int row = blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
  const int lane = threadIdx.x % detail::kWarp;
  if (row >= rows) return;
  const int64_t o = (int64_t)row * D;
  float ss = 0.f;
  for (int c = lane; c < D; c += detail::kWarp) ss = fmaf(ld(x + o + c), ld(x + o + c), ss);
  const float rs = rsqrtf(detail::warp_sum(ss) / D + eps);
  for (int c = lane; c < D; c += detail::kWarp)
    y[o + c] = __float2bfloat16(ld(w + c) * ld(x + o + c) * rs * siluf(ld(z + o + c)));
  if (lane == 0) rstd[row] = rs;
}

__global__ void gated_rmsnorm_backward_kernel(bf16* dx, bf16* dz, const bf16* dy, const bf16* x, const bf16* z,
                                              const bf16* w, const float* rstd, int rows, int D, bool accumulate) {
  const int row = blockIdx.x * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
  const int lane = threadIdx.x % detail::kWarp;
  if (row >= rows) return;
  const int64_t o = (int64_t)row * D;
  const float rs = rstd[row];
  float dot = 0.f;  // sum_c dn_c n_c
  for (int c = lane; c < D; c += detail::kWarp)
    dot = fmaf(ld(dy + o + c) * ld(w + c) * siluf(ld(z + o + c)), ld(x + o + c) * rs, dot);
  dot = detail::warp_sum(dot) / D;
  for (int c = lane; c < D; c += detail::kWarp) {
    const float n = ld(x + o + c) * rs, zc = ld(z + o + c), d = ld(dy + o + c), wc = ld(w + c);
    if (dz) {
      const float g = d * wc * n * dsiluf(zc);
      dz[o + c] = __float2bfloat16(accumulate ? ld(dz + o + c) + g : g);
    }
    if (dx) {
      const float g = rs * (d * wc * siluf(zc) - n * dot);
      dx[o + c] = __float2bfloat16(accumulate ? ld(dx + o + c) + g : g);
    }
  }
}

// partial[g][c] = sum over the chunk's rows of dy n silu(z).
__global__ void gated_rmsnorm_dw_partial_kernel(float* partial, const bf16* dy, const bf16* x, const bf16* z,
                                                const float* rstd, int rows, int D) {
  const int g = blockIdx.x, r0 = g * kChunkRows, n = min(kChunkRows, rows - r0);
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float s = 0.f;
    for (int t = 0; t < n; ++t) {
      const int64_t e = (int64_t)(r0 + t) * D + c;
      s = fmaf(ld(dy + e), ld(x + e) * rstd[r0 + t] * siluf(ld(z + e)), s);
    }
    partial[(int64_t)g * D + c] = s;
  }
}

__global__ void gates_forward_kernel(float* g, bf16* beta, const bf16* a, const bf16* b, const bf16* A_log,
                                     const bf16* dt_bias, int64_t n, int H) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int h = (int)(e % H);
  beta[e] = __float2bfloat16(sigmoidf(ld(b + e)));
  g[e] = -__expf(ld(A_log + h)) * softplusf(ld(a + e) + ld(dt_bias + h));
}

__global__ void gates_backward_kernel(bf16* da, bf16* db, const float* dg, const float* dbeta, const bf16* a,
                                      const bf16* b, const bf16* A_log, const bf16* dt_bias, int64_t n, int H) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int h = (int)(e % H);
  const float sb = sigmoidf(ld(b + e));
  db[e] = __float2bfloat16(ld(dbeta + e) * sb * (1.f - sb));
  da[e] = __float2bfloat16(-ld(dg + e) * __expf(ld(A_log + h)) * sigmoidf(ld(a + e) + ld(dt_bias + h)));
}

// partial[g][h] (dA_log) and partial[chunks + g][h] (ddt_bias): the chunk's sums of dg g_value and
// of da (recomputed in fp32, not from the rounded bf16 da).
__global__ void gates_partial_kernel(float* partial, const float* dg, const bf16* a, const bf16* A_log,
                                     const bf16* dt_bias, int N, int H, int chunks) {
  const int g = blockIdx.x, r0 = g * kChunkRows, n = min(kChunkRows, N - r0);
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    const float A = __expf(ld(A_log + h)), bias = ld(dt_bias + h);
    float sA = 0.f, sdt = 0.f;
    for (int t = 0; t < n; ++t) {
      const int64_t e = (int64_t)(r0 + t) * H + h;
      const float xv = ld(a + e) + bias, d = ld(dg + e);
      sA = fmaf(d, -A * softplusf(xv), sA);  // d g / d A_log = g
      sdt = fmaf(-d * A, sigmoidf(xv), sdt);
    }
    partial[(int64_t)g * H + h] = sA;
    partial[(int64_t)(chunks + g) * H + h] = sdt;
  }
}


int warp_blocks(int rows) { return (rows + kRowThreads / detail::kWarp - 1) / (kRowThreads / detail::kWarp); }

void check_rows(int rows, int D, const char* op) {
  TT_CHECK(rows >= 0 && D > 0, op, ": expected rows >= 0 and D > 0, got rows=", rows, " D=", D);
}

// ---- The row ops' sequences (gdn.h says what each computes) ----

template <class Runner>
void path_prev_on(Runner& run, int32_t* prev, const int32_t* node_start, const int32_t* node_len,
                  const int32_t* node_parent, int num_nodes) {
  TT_CHECK(num_nodes >= 0, "gdn_path_prev: num_nodes = ", num_nodes);
  if (num_nodes == 0) return;
  run.launch(path_prev_kernel, dim3(num_nodes), 128, 0, prev, node_start, node_len, node_parent);
}

void check_conv(int N, int C, int K, const char* op) {
  TT_CHECK(N >= 0 && C > 0 && K > 0 && K <= kMaxTaps, op, ": expected N >= 0, C > 0, 0 < K <= ", kMaxTaps,
           ", got N=", N, " C=", C, " K=", K);
}

template <class Runner>
void conv_forward_on(Runner& run, bf16* out, const bf16* x, const bf16* w, const int32_t* prev, int N, int C, int K) {
  check_conv(N, C, K, "conv1d_silu_forward");
  if (N == 0) return;
  run.launch(conv_forward_kernel, dim3(N), kRowThreads, 0, out, x, w, prev, C, K);
}

template <class Runner, class T>
void conv_backward_on(Runner& run, T* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                      const int32_t* prev, const int32_t* pos, const int32_t* subtree_end, int N, int C, int K,
                      Workspace ws, bool accumulate) {
  check_conv(N, C, K, "conv1d_silu_backward");
  if (N == 0 || (!dx && !dw)) return;
  const ConvScratch s(N, C, K, ws.ptr);
  detail::check_workspace(ws, s.bytes, "conv1d_silu_backward");
  run.launch(conv_da_kernel, dim3(N), kRowThreads, 0, s.da, dout, x, w, prev, C, K);
  if (dx) run.launch(conv_dx_kernel<T>, dim3(N), kRowThreads, 0, dx, s.da, w, pos, subtree_end, C, K,
                     accumulate);
  if (dw) {
    auto dw_partial = K <= 4 ? conv_dw_partial_kernel<4> : K <= 8 ? conv_dw_partial_kernel<8>
                    : K <= 16 ? conv_dw_partial_kernel<16> : conv_dw_partial_kernel<kMaxTaps>;
    run.launch(dw_partial, dim3(chunks_of(N)), kRowThreads, 0, s.partial, s.da, x, prev, N, C, K);
    reduce_partials(run, dw, s.partial, chunks_of(N), C * K);
  }
}

template <class Runner>
void l2norm_forward_on(Runner& run, bf16* y, float* rstd, const bf16* x, int rows, int D, double eps) {
  check_rows(rows, D, "l2norm_forward");
  if (rows == 0) return;
  run.launch(l2norm_forward_kernel, dim3(warp_blocks(rows)), kRowThreads, 0, y, rstd, x, rows, D, (float)eps);
}

template <class Runner>
void l2norm_backward_on(Runner& run, bf16* dx, const bf16* dy, const bf16* x, const float* rstd, int rows, int D,
                        bool accumulate) {
  check_rows(rows, D, "l2norm_backward");
  if (rows == 0) return;
  run.launch(l2norm_backward_kernel, dim3(warp_blocks(rows)), kRowThreads, 0, dx, dy, x, rstd, rows, D, accumulate);
}

template <class Runner>
void gated_rmsnorm_forward_on(Runner& run, bf16* y, float* rstd, const bf16* x, const bf16* z, const bf16* w, int rows,
                              int D, double eps) {
  check_rows(rows, D, "gated_rmsnorm_forward");
  if (rows == 0) return;
  run.launch(gated_rmsnorm_forward_kernel, dim3(warp_blocks(rows)), kRowThreads, 0, y, rstd, x, z, w, rows, D,
             (float)eps);
}

size_t gated_rmsnorm_workspace(int rows, int D) {
  detail::WorkspaceCarver c;
  c.take<float>((size_t)chunks_of(rows) * D);
  return c.bytes();
}

template <class Runner>
void gated_rmsnorm_backward_on(Runner& run, bf16* dx, bf16* dz, float* dw, const bf16* dy, const bf16* x,
                               const bf16* z, const bf16* w, const float* rstd, int rows, int D, Workspace ws,
                               bool accumulate) {
  check_rows(rows, D, "gated_rmsnorm_backward");
  if (rows == 0) return;
  if (dx || dz)
    run.launch(gated_rmsnorm_backward_kernel, dim3(warp_blocks(rows)), kRowThreads, 0, dx, dz, dy, x, z, w, rstd, rows,
               D, accumulate);
  if (dw) {
    detail::check_workspace(ws, gated_rmsnorm_workspace(rows, D), "gated_rmsnorm_backward");
    float* partial = detail::WorkspaceCarver(ws.ptr).take<float>((size_t)chunks_of(rows) * D);
    run.launch(gated_rmsnorm_dw_partial_kernel, dim3(chunks_of(rows)), 128, 0, partial, dy, x, z, rstd, rows, D);
    reduce_partials(run, dw, partial, chunks_of(rows), D);
  }
}

template <class Runner>
void gates_forward_on(Runner& run, float* g, bf16* beta, const bf16* a, const bf16* b, const bf16* A_log,
                      const bf16* dt_bias, int N, int H) {
  check_rows(N, H, "gdn_gates_forward");
  const int64_t n = (int64_t)N * H;
  if (n == 0) return;
  run.launch(gates_forward_kernel, dim3((unsigned)((n + kRowThreads - 1) / kRowThreads)), kRowThreads, 0, g, beta, a, b,
             A_log, dt_bias, n, H);
}

size_t gates_workspace(int N, int H) {
  detail::WorkspaceCarver c;
  c.take<float>((size_t)2 * chunks_of(N) * H);
  return c.bytes();
}

template <class Runner>
void gates_backward_on(Runner& run, bf16* da, bf16* db, float* dA_log, float* ddt_bias, const float* dg,
                       const float* dbeta, const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N,
                       int H, Workspace ws) {
  check_rows(N, H, "gdn_gates_backward");
  const int64_t n = (int64_t)N * H;
  if (n == 0) return;
  run.launch(gates_backward_kernel, dim3((unsigned)((n + kRowThreads - 1) / kRowThreads)), kRowThreads, 0, da, db, dg,
             dbeta, a, b, A_log, dt_bias, n, H);
  if (dA_log || ddt_bias) {
    detail::check_workspace(ws, gates_workspace(N, H), "gdn_gates_backward");
    const int chunks = chunks_of(N);
    float* partial = detail::WorkspaceCarver(ws.ptr).take<float>((size_t)2 * chunks * H);
    run.launch(gates_partial_kernel, dim3(chunks), 128, 0, partial, dg, a, A_log, dt_bias, N, H, chunks);
    if (dA_log) reduce_partials(run, dA_log, partial, chunks, H);
    if (ddt_bias) reduce_partials(run, ddt_bias, partial + (size_t)chunks * H, chunks, H);
  }
}

}  // namespace
}  // namespace tt::cuda
