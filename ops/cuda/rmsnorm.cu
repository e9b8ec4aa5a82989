// RMSNorm forward and backward (see rmsnorm.h).
// Gradient contract: forward overwrites out (rows, C) and rstd (rows); backward accumulates (+=)
// into dx (rows, C) bf16 and dw (C) fp32.
//
// With r = rstd and n = x r:  dx_c += r (dout_c w_c - x_c r^2 mean_k(dout_k w_k x_k)),
// dw_c += sum_rows dout_c n_c. Forward and dx: one warp per row (rows are short: C = 128 for the
// q/k norm, a few thousand for the hidden size). dw: stage 1 gives each block a fixed chunk of
// rows and writes per-chunk column sums (G, C) to the workspace; stage 2 adds the G chunk sums of
// each column in a fixed order, so the result does not depend on scheduling.
#include "ops/cuda/rmsnorm.h"

#include <algorithm>

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

using detail::load_bf16;
using detail::load_f32;
using detail::store_bf16;
using detail::store_f32;
using detail::warp_sum;

constexpr int kRowThreads = 256;                       // 8 rows (warps) per block
constexpr int kRowsPerWarpBlock = kRowThreads / detail::kWarp;
constexpr int kPartialThreads = 256;                   // stage-1 block (bx * by)
constexpr int kMaxChunks = 1024;                       // G, the number of row chunks
constexpr int kMinRowsPerChunk = 32;
constexpr int kReduceCols = 32, kReduceLanes = 8;      // stage-2 block

struct RmsnormFwdParams {
  bf16* out;        // (rows, C)
  float* rstd;      // (rows)
  const bf16* x;    // (rows, C)
  const bf16* w;    // (C)
  int rows, C;
  float eps;
};

struct RmsnormBwdParams {
  bf16* dx;            // (rows, C) +=, or null
  float* dw;           // (C) +=, or null
  float* partial;      // (G, C) stage-1 column sums
  const bf16* dout;    // (rows, C)
  const bf16* x;       // (rows, C)
  const bf16* w;       // (C)
  const float* rstd;   // (rows)
  int rows, C;
  int chunks, rows_per_chunk;  // G and the rows of each chunk
};

template <int VEC>
__global__ void rmsnorm_forward_kernel(RmsnormFwdParams p) {
  const int lane = threadIdx.x % detail::kWarp;
  const int64_t row = (int64_t)blockIdx.x * kRowsPerWarpBlock + threadIdx.x / detail::kWarp;
  if (row >= p.rows) return;
  const bf16* x = p.x + row * p.C;
  float ss = 0.f;
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float v[VEC];
    load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) ss += v[k] * v[k];
  }
  ss = warp_sum(ss);
  const float rs = rsqrtf(ss / (float)p.C + p.eps);
  if (lane == 0) p.rstd[row] = rs;
  bf16* o = p.out + row * p.C;
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float v[VEC], w[VEC];
    load_bf16<VEC>(v, x + c);
    load_bf16<VEC>(w, p.w + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = v[k] * rs * w[k];
    store_bf16<VEC>(o + c, v);
  }
}

template <int VEC>
__global__ void rmsnorm_backward_dx_kernel(RmsnormBwdParams p) {
  const int lane = threadIdx.x % detail::kWarp;
  const int64_t row = (int64_t)blockIdx.x * kRowsPerWarpBlock + threadIdx.x / detail::kWarp;
  if (row >= p.rows) return;
  const bf16* x = p.x + row * p.C;
  const bf16* dout = p.dout + row * p.C;
  float dot = 0.f;  // sum_k dout_k w_k x_k
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float xv[VEC], dv[VEC], wv[VEC];
    load_bf16<VEC>(xv, x + c);
    load_bf16<VEC>(dv, dout + c);
    load_bf16<VEC>(wv, p.w + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) dot += dv[k] * wv[k] * xv[k];
  }
  dot = warp_sum(dot);
  const float rs = p.rstd[row];
  const float kcoef = rs * rs * dot / (float)p.C;
  bf16* dx = p.dx + row * p.C;
  for (int c = lane * VEC; c < p.C; c += detail::kWarp * VEC) {
    float xv[VEC], dv[VEC], wv[VEC], acc[VEC];
    load_bf16<VEC>(xv, x + c);
    load_bf16<VEC>(dv, dout + c);
    load_bf16<VEC>(wv, p.w + c);
    load_bf16<VEC>(acc, dx + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += rs * (dv[k] * wv[k] - xv[k] * kcoef);
    store_bf16<VEC>(dx + c, acc);
  }
}

// Grid (column tiles, G); block (bx, by): tx picks a VEC-wide column group, ty strides the chunk's
// rows. The by partial sums of a column are added in ty order.
template <int VEC>
__global__ void rmsnorm_dw_partial_kernel(RmsnormBwdParams p) {
  __shared__ float sums[kPartialThreads * VEC];
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int c = (blockIdx.x * bx + tx) * VEC;
  const int g = blockIdx.y;
  const int r0 = g * p.rows_per_chunk, r1 = min(p.rows, r0 + p.rows_per_chunk);
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; k++) acc[k] = 0.f;
  if (c < p.C) {
    for (int r = r0 + ty; r < r1; r += by) {
      float xv[VEC], dv[VEC];
      load_bf16<VEC>(xv, p.x + (int64_t)r * p.C + c);
      load_bf16<VEC>(dv, p.dout + (int64_t)r * p.C + c);
      const float rs = p.rstd[r];
#pragma unroll
      for (int k = 0; k < VEC; k++) acc[k] += dv[k] * (xv[k] * rs);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; k++) sums[(ty * bx + tx) * VEC + k] = acc[k];
  __syncthreads();
  if (ty != 0 || c >= p.C) return;
  for (int y = 1; y < by; y++) {
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += sums[(y * bx + tx) * VEC + k];
  }
  store_f32<VEC>(p.partial + (int64_t)g * p.C + c, acc);
}

// Block (kReduceCols, kReduceLanes): each lane sums every kReduceLanes-th chunk of its column, then
// lane sums are added in lane order and the total added to dw.
__global__ void rmsnorm_dw_reduce_kernel(RmsnormBwdParams p) {
  __shared__ float sums[kReduceLanes][kReduceCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kReduceCols + tx;
  float s = 0.f;
  if (c < p.C)
    for (int g = ty; g < p.chunks; g += kReduceLanes) s += p.partial[(int64_t)g * p.C + c];
  sums[ty][tx] = s;
  __syncthreads();
  if (ty != 0 || c >= p.C) return;
  for (int y = 1; y < kReduceLanes; y++) s += sums[y][tx];
  p.dw[c] += s;
}

int num_chunks(int rows) {
  return std::max(1, std::min(kMaxChunks, (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk));
}

void launch_rmsnorm_forward(const RmsnormFwdParams& p, cudaStream_t stream) {
  const bool wide = p.C % 8 == 0 && detail::aligned16(p.x) && detail::aligned16(p.w) && detail::aligned16(p.out);
  const int blocks = (p.rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
  TT_VEC_SWITCH(wide, VEC, [&] { rmsnorm_forward_kernel<VEC><<<blocks, kRowThreads, 0, stream>>>(p); });
  TT_CUDA_CHECK_LAUNCH();
}

void launch_rmsnorm_backward(const RmsnormBwdParams& p, cudaStream_t stream) {
  const bool wide = p.C % 8 == 0 && detail::aligned16(p.x) && detail::aligned16(p.w) &&
                    detail::aligned16(p.dout) && (!p.dx || detail::aligned16(p.dx));
  TT_VEC_SWITCH(wide, VEC, [&] {
    if (p.dx) {
      const int blocks = (p.rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
      rmsnorm_backward_dx_kernel<VEC><<<blocks, kRowThreads, 0, stream>>>(p);
      TT_CUDA_CHECK_LAUNCH();
    }
    if (p.dw) {
      const int groups = (p.C + VEC - 1) / VEC;
      int bx = 1;
      while (bx < groups && bx < kPartialThreads) bx *= 2;
      const dim3 block(bx, kPartialThreads / bx);
      const dim3 grid((groups + bx - 1) / bx, p.chunks);
      rmsnorm_dw_partial_kernel<VEC><<<grid, block, 0, stream>>>(p);
      TT_CUDA_CHECK_LAUNCH();
      rmsnorm_dw_reduce_kernel<<<(p.C + kReduceCols - 1) / kReduceCols, dim3(kReduceCols, kReduceLanes), 0,
                                 stream>>>(p);
      TT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int rows, int C, double eps,
                     cudaStream_t stream) {
  TT_CHECK(rows >= 0 && C > 0, "cuda::rmsnorm_forward: expected rows >= 0 and C > 0, got rows=", rows,
           " C=", C);
  TT_CHECK(eps >= 0, "cuda::rmsnorm_forward: expected eps >= 0, got ", eps);
  if (rows == 0) return;
  TT_CHECK(out && rstd && x && w, "cuda::rmsnorm_forward: null pointer (out, rstd, x or w)");
  launch_rmsnorm_forward(RmsnormFwdParams{out, rstd, x, w, rows, C, (float)eps}, stream);
}

size_t rmsnorm_backward_workspace_bytes(int rows, int C) {
  if (rows <= 0 || C <= 0) return 0;
  detail::WorkspaceCarver w;
  w.take<float>((size_t)num_chunks(rows) * C);
  return w.bytes();
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                      int rows, int C, Workspace ws, cudaStream_t stream) {
  TT_CHECK(rows >= 0 && C > 0, "cuda::rmsnorm_backward: expected rows >= 0 and C > 0, got rows=", rows,
           " C=", C);
  if (rows == 0 || (!dx && !dw)) return;
  TT_CHECK(dout && x && w && rstd, "cuda::rmsnorm_backward: null pointer (dout, x, w or rstd)");
  RmsnormBwdParams p{dx, dw, nullptr, dout, x, w, rstd, rows, C, 0, 0};
  if (dw) {
    detail::check_workspace(ws, rmsnorm_backward_workspace_bytes(rows, C), "cuda::rmsnorm_backward");
    detail::WorkspaceCarver carve(ws.ptr);
    p.chunks = num_chunks(rows);
    p.rows_per_chunk = (rows + p.chunks - 1) / p.chunks;
    p.partial = carve.take<float>((size_t)p.chunks * C);
  }
  launch_rmsnorm_backward(p, stream);
}

}  // namespace tt::cuda
