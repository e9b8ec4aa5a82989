// The vision tower's ops on the GPU (see vision.h).
//   LayerNorm forward / dx: one warp per row, fp32 two-pass statistics from registers-free
//     re-reads (rows of the tower are at most a few thousand wide and stay in L1).
//   Column sums (dw, db, bias gradients): stage 1, per chunk of kChunkRows rows, one thread per
//     column sums its chunk in row order into an fp32 partial (coalesced across columns); stage 2,
//     one thread per column adds the chunks' partials in chunk order into the gradient.
//   Elementwise ops: one element per thread, grid-sized on int64 counts. Row moves: one block
//   per row. Throughput is not tuned yet (scalar bf16 accesses): the tower's GEMMs dominate.
#include "ops/cuda/vision.h"

#include <cuda_bf16.h>

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunkRows = 64;  // rows per stage-1 partial of a column sum

__device__ __forceinline__ float ld(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

unsigned blocks_for(int64_t n, int per_block) { return (unsigned)((n + per_block - 1) / per_block); }
int chunks(int rows) { return (rows + kChunkRows - 1) / kChunkRows; }

// ---- LayerNorm ----

__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w,
                                         const bf16* b, int rows, int C, float eps) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const bf16* xr = x + r * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += ld(xr + c);
  const float mu = detail::warp_sum(s) / (float)C;
  float v = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float d = ld(xr + c) - mu;
    v += d * d;
  }
  const float rs = rsqrtf(detail::warp_sum(v) / (float)C + eps);
  bf16* o = out + r * C;
  for (int c = lane; c < C; c += 32) st(o + c, (ld(xr + c) - mu) * rs * ld(w + c) + ld(b + c));
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout w.
__global__ void layernorm_dx_kernel(bf16* dx, const bf16* dout, const bf16* x, const bf16* w, const float* mean,
                                    const float* rstd, int rows, int C, bool accumulate) {
  const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const bf16 *xr = x + r * C, *dr = dout + r * C;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0.f, sgx = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float g = ld(dr + c) * ld(w + c), xh = (ld(xr + c) - mu) * rs;
    sg += g;
    sgx += g * xh;
  }
  const float mg = detail::warp_sum(sg) / (float)C, mgx = detail::warp_sum(sgx) / (float)C;
  bf16* o = dx + r * C;
  for (int c = lane; c < C; c += 32) {
    const float g = ld(dr + c) * ld(w + c), xh = (ld(xr + c) - mu) * rs;
    float d = rs * (g - mg - xh * mgx);
    if (accumulate) d += ld(o + c);
    st(o + c, d);
  }
}

// Stage 1 of the column sums: partial_w[k][c] = sum over chunk k of dout xhat (when x is given),
// partial_b[k][c] = sum over chunk k of dout. Grid (column blocks, chunks).
__global__ void column_partials_kernel(float* partial_w, float* partial_b, const bf16* dout, const bf16* x,
                                       const float* mean, const float* rstd, int rows, int C) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int k = blockIdx.y, r0 = k * kChunkRows, r1 = min(rows, r0 + kChunkRows);
  float sw = 0.f, sb = 0.f;
  for (int r = r0; r < r1; ++r) {
    const float d = ld(dout + (int64_t)r * C + c);
    sb += d;
    if (x) sw += d * (ld(x + (int64_t)r * C + c) - mean[r]) * rstd[r];
  }
  if (partial_w) partial_w[(int64_t)k * C + c] = sw;
  partial_b[(int64_t)k * C + c] = sb;
}

// Stage 2: grad[c] += sum over chunks in order.
__global__ void column_reduce_kernel(float* grad, const float* partial, int n_chunks, int C) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.f;
  for (int k = 0; k < n_chunks; ++k) s += partial[(int64_t)k * C + c];
  grad[c] += s;
}

// ---- GELU ----

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// tanh form: x (1 + tanh(u)) / 2 = x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3), with
// sigmoid and 1 - sigmoid each from one __expf of a non-positive argument (no cancellation, no
// overflow; --use_fast_math would make tanhf the hardware approximation, 2^-11 relative).
// Exact form: x erfc(-x / sqrt 2) / 2 (no cancellation for negative x).
__device__ __forceinline__ void sigmoid_pair(float z, float& s, float& oms) {
  const float e = __expf(-fabsf(z));  // <= 1
  const float big = 1.f / (1.f + e), small = e / (1.f + e);
  s = z >= 0.f ? big : small;
  oms = z >= 0.f ? small : big;
}

__device__ __forceinline__ float gelu(float x, bool tanh_approx) {
  if (tanh_approx) {
    float s, oms;
    sigmoid_pair(2.f * kSqrt2OverPi * (x + kGeluC * x * x * x), s, oms);
    return x * s;
  }
  return 0.5f * x * erfcf(-x * kInvSqrt2);
}

__device__ __forceinline__ float gelu_grad(float x, bool tanh_approx) {
  if (tanh_approx) {
    float s, oms;
    sigmoid_pair(2.f * kSqrt2OverPi * (x + kGeluC * x * x * x), s, oms);
    return s + x * s * oms * 2.f * kSqrt2OverPi * (1.f + 3.f * kGeluC * x * x);
  }
  return 0.5f * erfcf(-x * kInvSqrt2) + x * kInvSqrt2Pi * __expf(-0.5f * x * x);
}

__global__ void gelu_forward_kernel(bf16* y, const bf16* x, int64_t n, bool tanh_approx) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) st(y + i, gelu(ld(x + i), tanh_approx));
}

__global__ void gelu_backward_kernel(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_approx,
                                     bool accumulate) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float d = gelu_grad(ld(x + i), tanh_approx) * ld(dy + i);
  if (accumulate) d += ld(dx + i);
  st(dx + i, d);
}

// ---- biases ----

__global__ void bias_add_bf16_kernel(bf16* out, const bf16* b, int64_t n, int C) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) st(out + i, ld(out + i) + ld(b + i % C));
}

__global__ void bias_add_f32_kernel(float* out, const bf16* b, int64_t n, int C) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += ld(b + i % C);
}

// ---- rows (one block per row) ----

__global__ void copy_rows_kernel(bf16* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int C) {
  const int64_t i = blockIdx.x;
  bf16* d = dst + (int64_t)dst_rows[i] * C;
  const bf16* s = src + (int64_t)src_rows[i] * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) d[c] = s[c];
}

__global__ void zero_rows_kernel(bf16* dst, const int32_t* rows, int C) {
  bf16* d = dst + (int64_t)rows[blockIdx.x] * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) st(d + c, 0.f);
}

__global__ void sum_rows_kernel(bf16* dst, const bf16* src, const int32_t* offsets, const int32_t* src_rows, int C) {
  const int64_t r = blockIdx.x;
  const int k0 = offsets[r], k1 = offsets[r + 1];
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.f;
    for (int k = k0; k < k1; ++k) s += ld(src + (int64_t)src_rows[k] * C + c);
    st(dst + r * C + c, s);
  }
}

// ---- patchify: one thread per output element (f, patch, channel, dy, dx) ----

__global__ void patchify_kernel(bf16* out, const float* pixels, int64_t n, int S, int p) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int K = 3 * p * p, G = S / p;
  const int64_t row = i / K;
  const int e = (int)(i % K), ch = e / (p * p), dy = e / p % p, dx = e % p;
  const int64_t f = row / ((int64_t)G * G);
  const int patch = (int)(row % ((int64_t)G * G)), py = patch / G, px = patch % G;
  st(out + i, pixels[((f * 3 + ch) * S + py * p + dy) * (int64_t)S + px * p + dx]);
}

void check_rows(const char* op, int rows, int C) {
  TT_CHECK(rows >= 0 && C >= 0, op, ": rows=", rows, " C=", C, ", expected non-negative sizes");
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w, const bf16* b, int rows,
                       int C, double eps, cudaStream_t stream) {
  check_rows("layernorm_forward", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(out && mean && rstd && x && w && b, "layernorm_forward: null pointer");
  TT_CHECK(eps >= 0, "layernorm_forward: eps=", eps, ", expected >= 0");
  layernorm_forward_kernel<<<blocks_for((int64_t)rows * 32, kThreads), kThreads, 0, stream>>>(out, mean, rstd, x, w,
                                                                                             b, rows, C, (float)eps);
  TT_CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_workspace_bytes(int rows, int C) {
  return rows <= 0 || C <= 0 ? 0 : 2 * (size_t)chunks(rows) * C * sizeof(float) + 512;
}

void layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x, const bf16* w,
                        const float* mean, const float* rstd, int rows, int C, bool accumulate_dx, Workspace ws,
                        cudaStream_t stream) {
  check_rows("layernorm_backward", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(dout && x && w && mean && rstd, "layernorm_backward: null input pointer");
  if (dx) {
    layernorm_dx_kernel<<<blocks_for((int64_t)rows * 32, kThreads), kThreads, 0, stream>>>(dx, dout, x, w, mean, rstd,
                                                                                          rows, C, accumulate_dx);
    TT_CUDA_CHECK_LAUNCH();
  }
  if (!dw && !db) return;
  detail::check_workspace(ws, layernorm_backward_workspace_bytes(rows, C), "layernorm_backward");
  const int nk = chunks(rows);
  float* pw = static_cast<float*>(ws.ptr);
  float* pb = pw + (size_t)nk * C;
  const dim3 grid(blocks_for(C, kThreads), (unsigned)nk);
  column_partials_kernel<<<grid, kThreads, 0, stream>>>(pw, pb, dout, x, mean, rstd, rows, C);
  TT_CUDA_CHECK_LAUNCH();
  if (dw) {
    column_reduce_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream>>>(dw, pw, nk, C);
    TT_CUDA_CHECK_LAUNCH();
  }
  if (db) {
    column_reduce_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream>>>(db, pb, nk, C);
    TT_CUDA_CHECK_LAUNCH();
  }
}

void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh, cudaStream_t stream) {
  TT_CHECK(n >= 0, "gelu_forward: n=", n, ", expected >= 0");
  if (n == 0) return;
  TT_CHECK(y && x, "gelu_forward: null pointer");
  gelu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, x, n, tanh);
  TT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh, bool accumulate,
                   cudaStream_t stream) {
  TT_CHECK(n >= 0, "gelu_backward: n=", n, ", expected >= 0");
  if (n == 0) return;
  TT_CHECK(dx && dy && x, "gelu_backward: null pointer");
  gelu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dx, dy, x, n, tanh, accumulate);
  TT_CUDA_CHECK_LAUNCH();
}

void bias_add(bf16* out, const bf16* b, int rows, int C, cudaStream_t stream) {
  check_rows("bias_add", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(out && b, "bias_add: null pointer");
  const int64_t n = (int64_t)rows * C;
  bias_add_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, b, n, C);
  TT_CUDA_CHECK_LAUNCH();
}

void bias_add(float* out, const bf16* b, int rows, int C, cudaStream_t stream) {
  check_rows("bias_add", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(out && b, "bias_add: null pointer");
  const int64_t n = (int64_t)rows * C;
  bias_add_f32_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, b, n, C);
  TT_CUDA_CHECK_LAUNCH();
}

size_t bias_backward_workspace_bytes(int rows, int C) {
  return rows <= 0 || C <= 0 ? 0 : (size_t)chunks(rows) * C * sizeof(float) + 256;
}

void bias_backward(float* db, const bf16* dout, int rows, int C, Workspace ws, cudaStream_t stream) {
  check_rows("bias_backward", rows, C);
  if (rows == 0 || C == 0) return;
  TT_CHECK(db && dout, "bias_backward: null pointer");
  detail::check_workspace(ws, bias_backward_workspace_bytes(rows, C), "bias_backward");
  const int nk = chunks(rows);
  float* pb = static_cast<float*>(ws.ptr);
  const dim3 grid(blocks_for(C, kThreads), (unsigned)nk);
  column_partials_kernel<<<grid, kThreads, 0, stream>>>(nullptr, pb, dout, nullptr, nullptr, nullptr, rows, C);
  TT_CUDA_CHECK_LAUNCH();
  column_reduce_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream>>>(db, pb, nk, C);
  TT_CUDA_CHECK_LAUNCH();
}

void copy_rows(bf16* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int n, int C,
               cudaStream_t stream) {
  check_rows("copy_rows", n, C);
  if (n == 0 || C == 0) return;
  TT_CHECK(dst && dst_rows && src && src_rows, "copy_rows: null pointer");
  copy_rows_kernel<<<(unsigned)n, kThreads, 0, stream>>>(dst, dst_rows, src, src_rows, C);
  TT_CUDA_CHECK_LAUNCH();
}

void sum_rows(bf16* dst, const bf16* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C,
              cudaStream_t stream) {
  check_rows("sum_rows", n_dst, C);
  if (n_dst == 0 || C == 0) return;
  TT_CHECK(dst && offsets, "sum_rows: null pointer");
  sum_rows_kernel<<<(unsigned)n_dst, kThreads, 0, stream>>>(dst, src, offsets, src_rows, C);
  TT_CUDA_CHECK_LAUNCH();
}

void zero_rows(bf16* dst, const int32_t* rows, int n, int C, cudaStream_t stream) {
  check_rows("zero_rows", n, C);
  if (n == 0 || C == 0) return;
  TT_CHECK(dst && rows, "zero_rows: null pointer");
  zero_rows_kernel<<<(unsigned)n, kThreads, 0, stream>>>(dst, rows, C);
  TT_CUDA_CHECK_LAUNCH();
}

void patchify(bf16* out, const float* pixels, int F, int S, int patch, cudaStream_t stream) {
  TT_CHECK(F >= 0 && S >= 1 && patch >= 1, "patchify: F=", F, " S=", S, " patch=", patch,
           ", expected F >= 0 and positive sizes");
  TT_CHECK(S % patch == 0, "patchify: image size ", S, " is not a multiple of the patch size ", patch);
  if (F == 0) return;
  TT_CHECK(out && pixels, "patchify: null pointer");
  const int64_t n = (int64_t)F * 3 * S * S;  // as many patch elements as pixels
  patchify_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, pixels, n, S, patch);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
