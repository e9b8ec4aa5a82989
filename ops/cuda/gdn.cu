// Gated DeltaNet row ops on DFS-packed trees, CUDA (see gdn.h).
//
// Layout of the work: the conv runs a block per row (its taps walked once by one thread into
// shared memory, channels across the threads); row-wise norms a warp per row; the gates a thread
// per element. Sums over rows (the weight gradients) take partial sums per chunk of kChunkRows
// rows, then reduce_partials adds the chunks in order: deterministic.
#include "ops/cuda/gdn.h"

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;
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
__device__ __forceinline__ float ld(const bf16* p) { return __bfloat162float(*p); }

int chunks_of(int rows) { return (rows + kChunkRows - 1) / kChunkRows; }

// out[e] += sum over g < chunks of partial[g n + e] (in g order).
__global__ void reduce_partials_kernel(float* out, const float* partial, int chunks, int n) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  float s = 0.f;
  for (int g = 0; g < chunks; ++g) s += partial[(int64_t)g * n + e];
  out[e] += s;
}

void reduce_partials(float* out, const float* partial, int chunks, int n, cudaStream_t stream) {
  if (n == 0) return;
  reduce_partials_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(out, partial, chunks, n);
  TT_CUDA_CHECK_LAUNCH();
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
__global__ void conv_dx_kernel(bf16* dx, const float* da, const bf16* w, const int32_t* pos,
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
    bf16* o = dx + (int64_t)r * C + c;
    *o = __float2bfloat16(accumulate ? ld(o) + acc : acc);
  }
}

// partial[g][c][j] = sum over the chunk's rows i of x[tap_j(i), c] da[i, c].
__global__ void conv_dw_partial_kernel(float* partial, const float* da, const bf16* x, const int32_t* prev, int N,
                                       int C, int K) {
  __shared__ int32_t taps[kChunkRows * kMaxTaps];
  const int g = blockIdx.x, r0 = g * kChunkRows, rows = min(kChunkRows, N - r0);
  for (int t = threadIdx.x; t < rows; t += blockDim.x) walk_taps(taps + t * K, r0 + t, prev, K);
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    for (int j = 0; j < K; ++j) {
      float s = 0.f;
      for (int t = 0; t < rows; ++t) {
        const int32_t src = taps[t * K + j];
        if (src >= 0) s = fmaf(ld(x + (int64_t)src * C + c), da[(int64_t)(r0 + t) * C + c], s);
      }
      partial[((int64_t)g * C + c) * K + j] = s;
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

__global__ void gates_forward_kernel(bf16* g, bf16* beta, const bf16* a, const bf16* b, const bf16* A_log,
                                     const bf16* dt_bias, int64_t n, int H) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int h = (int)(e % H);
  beta[e] = __float2bfloat16(sigmoidf(ld(b + e)));
  g[e] = __float2bfloat16(-__expf(ld(A_log + h)) * softplusf(ld(a + e) + ld(dt_bias + h)));
}

__global__ void gates_backward_kernel(bf16* da, bf16* db, const bf16* dg, const bf16* dbeta, const bf16* a,
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
__global__ void gates_partial_kernel(float* partial, const bf16* dg, const bf16* a, const bf16* A_log,
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

// ---- The gated delta rule, chunked ----

struct RuleParams {
  GdnPlan::Device plan;
  const bf16 *q, *k, *v, *g, *beta;
  const float* init;
  float *U, *W, *gam, *vnew, *sin, *node_end;
  bf16* o;
  int nk, nv, dk, dv;
  float scale;
  int num_chunks;
};

// Per (chunk, value head): gamma (the in-chunk cumulative log decay), A = strictly_lower(beta_r
// k_r . k_s exp(gamma_r - gamma_s)), then U = (I + A)^-1 (beta v) and W = (I + A)^-1 (beta
// exp(gamma) k) by forward substitution, each thread owning columns of [U | W].
__global__ void rule_prep_kernel(RuleParams p) {
  extern __shared__ float sm[];
  const int c = blockIdx.x, h = blockIdx.y, kh = h / (p.nv / p.nk);
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c], dk = p.dk, dv = p.dv, X = dv + dk;
  const int ks = dk + 1;                   // padded rows: A's dot products read 32 rows at once
  float* Ks = sm;                          // (64, dk + 1)
  float* A = Ks + kGdnChunk * ks;          // (64, 64)
  float* gam = A + kGdnChunk * kGdnChunk;  // (64)
  float* bet = gam + kGdnChunk;            // (64)
  float* Xs = bet + kGdnChunk;             // (64, dv + dk): U | W
  for (int e = threadIdx.x; e < L * dk; e += blockDim.x)
    Ks[(e / dk) * ks + e % dk] = ld(p.k + ((int64_t)(r0 + e / dk) * p.nk + kh) * dk + e % dk);
  for (int r = threadIdx.x; r < L; r += blockDim.x) {
    bet[r] = ld(p.beta + (int64_t)(r0 + r) * p.nv + h);
    gam[r] = ld(p.g + (int64_t)(r0 + r) * p.nv + h);
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int r = 1; r < L; ++r) gam[r] += gam[r - 1];
  __syncthreads();
  for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
    const int r = e / L, s = e % L;
    float a = 0.f;
    if (s < r) {
      for (int i = 0; i < dk; ++i) a = fmaf(Ks[r * ks + i], Ks[s * ks + i], a);
      a *= bet[r] * __expf(gam[r] - gam[s]);
    }
    A[r * kGdnChunk + s] = a;
  }
  __syncthreads();
  for (int col = threadIdx.x; col < X; col += blockDim.x) {
    for (int r = 0; r < L; ++r) {
      float x = bet[r] * (col < dv ? ld(p.v + ((int64_t)(r0 + r) * p.nv + h) * dv + col)
                                   : __expf(gam[r]) * Ks[r * ks + col - dv]);
      for (int s = 0; s < r; ++s) x = fmaf(-A[r * kGdnChunk + s], Xs[s * X + col], x);
      Xs[r * X + col] = x;
      const int64_t row = (int64_t)(r0 + r) * p.nv + h;
      if (col < dv) p.U[row * dv + col] = x;
      else p.W[row * dk + col - dv] = x;
    }
  }
  for (int r = threadIdx.x; r < L; r += blockDim.x) p.gam[(int64_t)(r0 + r) * p.nv + h] = gam[r];
}

// The chunk's queries (times q_scale) and keys into padded rows (dk + 1: the dot products read 32
// rows at once), by the whole block.
__device__ __forceinline__ void load_chunk_qk(float* Qs, float* Ks, const RuleParams& p, int r0, int L, int kh,
                                              float q_scale) {
  const int dk = p.dk, ks = dk + 1;
  for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
    const int64_t at = ((int64_t)(r0 + e / dk) * p.nk + kh) * dk + e % dk;
    Qs[(e / dk) * ks + e % dk] = q_scale * ld(p.q + at);
    Ks[(e / dk) * ks + e % dk] = ld(p.k + at);
  }
}

// P (64, 64) = (q_a . k_b) e^(gam_a - gam_b) for b <= a, 0 above the diagonal (after load_chunk_qk
// and gam are in shared memory and the block has synchronised).
__device__ __forceinline__ void decayed_qk(float* P, const float* Qs, const float* Ks, const float* gam, int L,
                                           int dk) {
  const int ks = dk + 1;
  for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
    const int a = e / L, b = e % L;
    float x = 0.f;
    if (b <= a) {
      for (int i = 0; i < dk; ++i) x = fmaf(Qs[a * ks + i], Ks[b * ks + i], x);
      x *= __expf(gam[a] - gam[b]);
    }
    P[a * kGdnChunk + b] = x;
  }
}

// A walking block's chunk operands: its W rows and keys (coalesced) and dec_s = e^(gam_L - gam_s).
__device__ __forceinline__ void load_walk_chunk(float* Wc, float* Kc, float* dec, const RuleParams& p, int r0, int L,
                                                int h, int kh, float gl) {
  const int dk = p.dk;
  for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
    const int r = e / dk, i = e % dk;
    Wc[e] = p.W[((int64_t)(r0 + r) * p.nv + h) * dk + i];
    Kc[e] = ld(p.k + ((int64_t)(r0 + r) * p.nk + kh) * dk + i);
  }
  for (int s = threadIdx.x; s < L; s += blockDim.x) dec[s] = __expf(gl - p.gam[(int64_t)(r0 + s) * p.nv + h]);
}

constexpr int kWalkCols = 32;                        // state columns per walking block (a lane each)
constexpr int kWalkWarps = kThreads / kWalkCols;     // 8
constexpr int kWalkRowsV = kGdnChunk / kWalkWarps;   // v_new rows per thread
constexpr int kWalkRowsS = 128 / kWalkWarps;         // state rows per thread (dk <= 128)

// Per (value head, 32 state columns): the chunks in packed order. A node's first chunk starts
// from its parent's end state (node_end, written earlier by this block: parents come first), or
// its root's init; each chunk stores the state it starts from (sin) and v_new = U - W S, then
// S <- exp(gamma_L) S + sum_s exp(gamma_L - gamma_s) k_s v_new_s^T; a node's last chunk stores
// its end state.
__global__ void rule_walk_kernel(RuleParams p) {
  extern __shared__ float sm[];
  const int h = blockIdx.x, j0 = blockIdx.y * kWalkCols, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv;
  float* S = sm;                            // (dk, 32)
  float* Vn = S + dk * kWalkCols;           // (64, 32)
  float* dec = Vn + kGdnChunk * kWalkCols;  // (64) exp(gamma_L - gamma_s)
  float* Wc = dec + kGdnChunk;              // (64, dk) the chunk's W rows
  float* Kc = Wc + kGdnChunk * dk;          // (64, dk) its keys
  const int64_t SS = (int64_t)dk * dv;
  for (int c = 0; c < p.num_chunks; ++c) {
    const int n = p.plan.chunk_node[c], flags = p.plan.chunk_flags[c];
    const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c];
    if (flags & 1) {
      const int parent = p.plan.node_parent[n], root = p.plan.node_root[n];
      const float* src = parent >= 0 ? p.node_end + ((int64_t)parent * p.nv + h) * SS
                                     : (p.init && root >= 0 ? p.init + ((int64_t)root * p.nv + h) * SS : nullptr);
      for (int e = threadIdx.x; e < dk * kWalkCols; e += blockDim.x)
        S[e] = src ? src[(int64_t)(e / kWalkCols) * dv + j0 + e % kWalkCols] : 0.f;
      __syncthreads();
    }
    float* sin = p.sin + ((int64_t)c * p.nv + h) * SS;
    for (int e = threadIdx.x; e < dk * kWalkCols; e += blockDim.x)
      sin[(int64_t)(e / kWalkCols) * dv + j0 + e % kWalkCols] = S[e];
    const float gl = p.gam[(int64_t)(r0 + L - 1) * p.nv + h];
    load_walk_chunk(Wc, Kc, dec, p, r0, L, h, kh, gl);
    __syncthreads();
    // Register tiles: a warp owns rows w, w + 8, ... (of v_new) or state rows (of S), a lane one
    // column, so each thread runs 8 or dk / 8 independent accumulations.
    const int w = threadIdx.x / kWalkCols, jj = threadIdx.x % kWalkCols;
    {
      float acc[kWalkRowsV];
#pragma unroll
      for (int t = 0; t < kWalkRowsV; ++t) {
        const int r = w + kWalkWarps * t;
        acc[t] = r < L ? p.U[((int64_t)(r0 + r) * p.nv + h) * dv + j0 + jj] : 0.f;
      }
      for (int i = 0; i < dk; ++i) {
        const float sv = S[i * kWalkCols + jj];
#pragma unroll
        for (int t = 0; t < kWalkRowsV; ++t) acc[t] = fmaf(-Wc[(w + kWalkWarps * t) * dk + i], sv, acc[t]);
      }
#pragma unroll
      for (int t = 0; t < kWalkRowsV; ++t) {
        const int r = w + kWalkWarps * t;
        if (r < L) {
          Vn[r * kWalkCols + jj] = acc[t];
          p.vnew[((int64_t)(r0 + r) * p.nv + h) * dv + j0 + jj] = acc[t];
        }
      }
    }
    __syncthreads();
    {
      float acc[kWalkRowsS];
      const float el = __expf(gl);
#pragma unroll
      for (int t = 0; t < kWalkRowsS; ++t) {
        const int i = w + kWalkWarps * t;
        acc[t] = i < dk ? el * S[i * kWalkCols + jj] : 0.f;
      }
      for (int s = 0; s < L; ++s) {
        const float v = dec[s] * Vn[s * kWalkCols + jj];
#pragma unroll
        for (int t = 0; t < kWalkRowsS; ++t) {
          const int i = w + kWalkWarps * t;
          if (i < dk) acc[t] = fmaf(Kc[s * dk + i], v, acc[t]);
        }
      }
#pragma unroll
      for (int t = 0; t < kWalkRowsS; ++t) {
        const int i = w + kWalkWarps * t;
        if (i < dk) S[i * kWalkCols + jj] = acc[t];
      }
    }
    __syncthreads();
    if (flags & 2) {
      float* dst = p.node_end + ((int64_t)n * p.nv + h) * SS;
      for (int e = threadIdx.x; e < dk * kWalkCols; e += blockDim.x)
        dst[(int64_t)(e / kWalkCols) * dv + j0 + e % kWalkCols] = S[e];
      __syncthreads();
    }
  }
}

// Per (chunk, value head): o_r = scale (exp(gamma_r) q_r^T S_in + sum_{s <= r} (q_r . k_s)
// exp(gamma_r - gamma_s) v_new_s).
__global__ void rule_out_kernel(RuleParams p) {
  extern __shared__ float sm[];
  const int c = blockIdx.x, h = blockIdx.y, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c];
  const int ks = dk + 1;                   // padded rows (see rule_prep_kernel)
  float* Qs = sm;                          // (64, dk + 1)
  float* Ks = Qs + kGdnChunk * ks;         // (64, dk + 1)
  float* P = Ks + kGdnChunk * ks;          // (64, 64)
  float* gam = P + kGdnChunk * kGdnChunk;  // (64)
  float* Ss = gam + kGdnChunk;             // (dk, dv) the state entering the chunk
  float* Vs = Ss + dk * dv;                // (64, dv) its v_new
  load_chunk_qk(Qs, Ks, p, r0, L, kh, 1.f);
  const float* sin = p.sin + ((int64_t)c * p.nv + h) * dk * dv;
  for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) Ss[e] = sin[e];
  for (int e = threadIdx.x; e < L * dv; e += blockDim.x)
    Vs[e] = p.vnew[((int64_t)(r0 + e / dv) * p.nv + h) * dv + e % dv];
  for (int r = threadIdx.x; r < L; r += blockDim.x) gam[r] = p.gam[(int64_t)(r0 + r) * p.nv + h];
  __syncthreads();
  decayed_qk(P, Qs, Ks, gam, L, dk);
  __syncthreads();
  // Register tiles: a thread owns column j and rows g, g + G, ... (G = 256 / dv row groups).
  const int G = blockDim.x / dv, j = threadIdx.x % dv, g0 = threadIdx.x / dv, rows = kGdnChunk / G;
  constexpr int kMaxRows = kGdnChunk / (kThreads / 128);  // 32 at dv = 128; fewer rows for smaller dv
  if (g0 >= G) return;
  float acc[kMaxRows];
#pragma unroll
  for (int t = 0; t < kMaxRows; ++t) acc[t] = 0.f;
  for (int i = 0; i < dk; ++i) {
    const float sv = Ss[i * dv + j];
#pragma unroll
    for (int t = 0; t < kMaxRows; ++t)
      if (t < rows) acc[t] = fmaf(Qs[(g0 + G * t) * ks + i], sv, acc[t]);
  }
#pragma unroll
  for (int t = 0; t < kMaxRows; ++t)
    if (t < rows && g0 + G * t < L) acc[t] *= __expf(gam[g0 + G * t]);
  for (int s = 0; s < L; ++s) {
    const float v = Vs[s * dv + j];
#pragma unroll
    for (int t = 0; t < kMaxRows; ++t)
      if (t < rows) acc[t] = fmaf(P[(g0 + G * t) * kGdnChunk + s], v, acc[t]);  // P is 0 past the diagonal
  }
#pragma unroll
  for (int t = 0; t < kMaxRows; ++t) {
    const int r = g0 + G * t;
    if (t < rows && r < L) p.o[((int64_t)(r0 + r) * p.nv + h) * dv + j] = __float2bfloat16(p.scale * acc[t]);
  }
}

// ---- The gated delta rule's backward (ops/cpu/gdn.h gdn_tree_backward_chunked) ----

struct RuleBwdParams {
  RuleParams f;                 // the forward's tensors and recomputed intermediates (U, W, gam, vnew, sin)
  const bf16* d_o;              // (N, nv, dv)
  const float* d_end;           // (num_nodes, nv, dk, dv) or null
  float* d_init;                // (num_roots, nv, dk, dv) or null, +=
  float *dvn, *qo, *dsout, *acc;  // (N nv dv), (chunks nv dk dv), (chunks nv dk dv), (nodes nv dk dv)
  float *db1, *db2;             // (N nv dv), (N nv dk): M^-T dv_new, M^-T dW
  float *gq, *gk;               // (N, nv, dk) per value head
  bf16 *dv, *dg, *dbeta;        // outputs
  bool accumulate;
};

// Per (chunk, value head): dvn_b = sum_{a >= b} (q~_a . k_b) e^(gam_a - gam_b) dO_a (the walk adds
// the end-state term) and qo = sum_a e^(gam_a) q~_a dO_a^T (dk, dv), q~ = scale q.
__global__ void rule_bwd_local_kernel(RuleBwdParams b) {
  extern __shared__ float sm[];
  const RuleParams& p = b.f;
  const int c = blockIdx.x, h = blockIdx.y, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv, ks = dk + 1;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c];
  float* Qs = sm;                          // (64, dk + 1) q~
  float* Ks = Qs + kGdnChunk * ks;         // (64, dk + 1)
  float* P = Ks + kGdnChunk * ks;          // (64, 64) (q~_a . k_b) e^(gam_a - gam_b), b <= a
  float* gam = P + kGdnChunk * kGdnChunk;  // (64)
  load_chunk_qk(Qs, Ks, p, r0, L, kh, p.scale);
  for (int r = threadIdx.x; r < L; r += blockDim.x) gam[r] = p.gam[(int64_t)(r0 + r) * p.nv + h];
  __syncthreads();
  decayed_qk(P, Qs, Ks, gam, L, dk);
  __syncthreads();
  for (int e = threadIdx.x; e < L * dv; e += blockDim.x) {
    const int bb = e / dv, j = e % dv;
    float x = 0.f;
    for (int a = bb; a < L; ++a) x = fmaf(P[a * kGdnChunk + bb], ld(b.d_o + ((int64_t)(r0 + a) * p.nv + h) * dv + j), x);
    b.dvn[((int64_t)(r0 + bb) * p.nv + h) * dv + j] = x;
  }
  float* qo = b.qo + ((int64_t)c * p.nv + h) * dk * dv;
  for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) {
    const int i = e / dv, j = e % dv;
    float x = 0.f;
    for (int a = 0; a < L; ++a)
      x = fmaf(__expf(gam[a]) * Qs[a * ks + i], ld(b.d_o + ((int64_t)(r0 + a) * p.nv + h) * dv + j), x);
    qo[e] = x;
  }
}

// Per (value head, 32 state columns): the chunks in reverse packed order carrying dS, the gradient
// of the chunk's end state. A node's last chunk starts from d_end plus its child nodes' initial-
// state gradients (acc, complete: children come later in packed order); each chunk stores dS
// (dsout), adds e^(gam_L - gam_b) k_b^T dS to dvn, and passes dS_in = e^(gam_L) dS + qo - W^T dvn
// back; a node's first chunk adds dS_in to its parent's acc (or its root's d_init).
__global__ void rule_bwd_walk_kernel(RuleBwdParams b) {
  extern __shared__ float sm[];
  const RuleParams& p = b.f;
  const int h = blockIdx.x, j0 = blockIdx.y * kWalkCols, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv;
  float* dS = sm;                           // (dk, 32)
  float* Dv = dS + dk * kWalkCols;          // (64, 32) dvn
  float* dec = Dv + kGdnChunk * kWalkCols;  // (64)
  float* Wc = dec + kGdnChunk;              // (64, dk)
  float* Kc = Wc + kGdnChunk * dk;          // (64, dk)
  const int64_t SS = (int64_t)dk * dv;
  const int w = threadIdx.x / kWalkCols, jj = threadIdx.x % kWalkCols;
  for (int c = p.num_chunks - 1; c >= 0; --c) {
    const int n = p.plan.chunk_node[c], flags = p.plan.chunk_flags[c];
    const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c];
    if (flags & 2) {
      const float* acc = b.acc + ((int64_t)n * p.nv + h) * SS;
      const float* de = b.d_end ? b.d_end + ((int64_t)n * p.nv + h) * SS : nullptr;
      for (int e = threadIdx.x; e < dk * kWalkCols; e += blockDim.x) {
        const int64_t at = (int64_t)(e / kWalkCols) * dv + j0 + e % kWalkCols;
        dS[e] = acc[at] + (de ? de[at] : 0.f);
      }
      __syncthreads();
    }
    float* so = b.dsout + ((int64_t)c * p.nv + h) * SS;
    for (int e = threadIdx.x; e < dk * kWalkCols; e += blockDim.x)
      so[(int64_t)(e / kWalkCols) * dv + j0 + e % kWalkCols] = dS[e];
    const float gl = p.gam[(int64_t)(r0 + L - 1) * p.nv + h];
    load_walk_chunk(Wc, Kc, dec, p, r0, L, h, kh, gl);
    __syncthreads();
    for (int t = 0; t < kWalkRowsV; ++t) {  // dvn_b += e^(gam_L - gam_b) (k_b^T dS)
      const int r = w + kWalkWarps * t;
      if (r >= L) continue;
      float x = 0.f;
      for (int i = 0; i < dk; ++i) x = fmaf(Kc[r * dk + i], dS[i * kWalkCols + jj], x);
      const int64_t at = ((int64_t)(r0 + r) * p.nv + h) * dv + j0 + jj;
      const float y = b.dvn[at] + dec[r] * x;
      b.dvn[at] = y;
      Dv[r * kWalkCols + jj] = y;
    }
    __syncthreads();
    const float* qo = b.qo + ((int64_t)c * p.nv + h) * SS;
    const float el = __expf(gl);
    for (int t = 0; t < kWalkRowsS; ++t) {  // dS_in = e^(gam_L) dS + qo - W^T dvn
      const int i = w + kWalkWarps * t;
      if (i >= dk) continue;
      float x = el * dS[i * kWalkCols + jj] + qo[(int64_t)i * dv + j0 + jj];
      for (int s = 0; s < L; ++s) x = fmaf(-Wc[s * dk + i], Dv[s * kWalkCols + jj], x);
      dS[i * kWalkCols + jj] = x;
    }
    __syncthreads();
    if (flags & 1) {
      const int parent = p.plan.node_parent[n], root = p.plan.node_root[n];
      float* dst = parent >= 0 ? b.acc + ((int64_t)parent * p.nv + h) * SS
                               : (b.d_init && root >= 0 ? b.d_init + ((int64_t)root * p.nv + h) * SS : nullptr);
      if (dst)
        for (int e = threadIdx.x; e < dk * kWalkCols; e += blockDim.x)
          dst[(int64_t)(e / kWalkCols) * dv + j0 + e % kWalkCols] += dS[e];
      __syncthreads();
    }
  }
}

// Per (chunk, value head): the gradients of the chunk's inputs (see ops/cpu/gdn.h
// gdn_tree_backward_chunked). q~ and k gradients go to per-value-head fp32 buffers (gq, gk), summed
// over each key head's group afterwards.
__global__ void rule_bwd_grad_kernel(RuleBwdParams b) {
  extern __shared__ float sm[];
  const RuleParams& p = b.f;
  const int c = blockIdx.x, h = blockIdx.y, kh = h / (p.nv / p.nk), dk = p.dk, dv = p.dv, ks = dk + 1;
  const int r0 = p.plan.chunk_row0[c], L = p.plan.chunk_len[c], C = kGdnChunk;
  float* Qs = sm;                   // (64, dk + 1) q~
  float* Ks = Qs + C * ks;          // (64, dk + 1)
  float* A = Ks + C * ks;           // (64, 64) beta_a e^(gam_a - gam_b) k_a . k_b, b < a
  float* QK = A + C * C;            // (64, 64) q~_a . k_b
  float* DOV = QK + C * C;          // (64, 64) dO_a . v_new_b
  float* DA = DOV + C * C;          // (64, 64) pair terms for dgam, then dA
  float* gam = DA + C * C;          // (64)
  float* bet = gam + C;             // (64)
  float* dgam = bet + C;            // (64)
  float* tend = dgam + C;           // (64) e^(gam_L - gam_a) k_a^T dS v_new_a
  const float* S = p.sin + ((int64_t)c * p.nv + h) * dk * dv;
  const float* dS = b.dsout + ((int64_t)c * p.nv + h) * dk * dv;
  auto rowi = [&](int a) { return (int64_t)(r0 + a) * p.nv + h; };
  load_chunk_qk(Qs, Ks, p, r0, L, kh, p.scale);
  for (int r = threadIdx.x; r < L; r += blockDim.x) {
    gam[r] = p.gam[rowi(r)];
    bet[r] = ld(p.beta + rowi(r));
    dgam[r] = 0.f;
  }
  __syncthreads();
  const float gl = gam[L - 1];
  for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
    const int a = e / L, bb = e % L;
    float kk = 0.f, qk = 0.f, dov = 0.f;
    for (int i = 0; i < dk; ++i) {
      kk = fmaf(Ks[a * ks + i], Ks[bb * ks + i], kk);
      qk = fmaf(Qs[a * ks + i], Ks[bb * ks + i], qk);
    }
    for (int j = 0; j < dv; ++j) dov = fmaf(ld(b.d_o + rowi(a) * dv + j), p.vnew[rowi(bb) * dv + j], dov);
    A[a * C + bb] = bb < a ? bet[a] * __expf(gam[a] - gam[bb]) * kk : 0.f;
    QK[a * C + bb] = qk;
    DOV[a * C + bb] = dov;
  }
  __syncthreads();
  // dB1 = M^-T dvn, dB2 = M^-T dW with dW_a = -dvn_a S^T: one column per thread, rows last to first.
  for (int col = threadIdx.x; col < dv + dk; col += blockDim.x) {
    for (int a = L - 1; a >= 0; --a) {
      float x;
      if (col < dv) {
        x = b.dvn[rowi(a) * dv + col];
        for (int bb = a + 1; bb < L; ++bb) x = fmaf(-A[bb * C + a], b.db1[rowi(bb) * dv + col], x);
        b.db1[rowi(a) * dv + col] = x;
      } else {
        const int e = col - dv;
        x = 0.f;
        for (int j = 0; j < dv; ++j) x = fmaf(-b.dvn[rowi(a) * dv + j], S[(int64_t)e * dv + j], x);
        for (int bb = a + 1; bb < L; ++bb) x = fmaf(-A[bb * C + a], b.db2[rowi(bb) * dk + e], x);
        b.db2[rowi(a) * dk + e] = x;
      }
    }
  }
  __syncthreads();
  // Pair terms: DA[a][b] = dA_ab (b < a); dgam pairs from the outputs and from A.
  for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
    const int a = e / L, bb = e % L;
    float pair = 0.f, da = 0.f;
    if (bb <= a) pair = QK[a * C + bb] * __expf(gam[a] - gam[bb]) * DOV[a * C + bb];
    if (bb < a) {
      for (int j = 0; j < dv; ++j) da = fmaf(-b.db1[rowi(a) * dv + j], p.U[rowi(bb) * dv + j], da);
      for (int i = 0; i < dk; ++i) da = fmaf(-b.db2[rowi(a) * dk + i], p.W[rowi(bb) * dk + i], da);
      pair += da * A[a * C + bb];
    }
    QK[a * C + bb] = pair;  // QK is read no more: reuse it for the pair terms
    DA[a * C + bb] = da;
  }
  __syncthreads();
  // Per row a: its gradients. Row terms of dgam first (each row by one thread, in a fixed order).
  for (int a = threadIdx.x; a < L; a += blockDim.x) {
    float x = 0.f;
    for (int bb = 0; bb < L; ++bb) x += QK[a * C + bb] - QK[bb * C + a];
    // e^(gam_a) q~_a . (S dO_a)
    float qsd = 0.f;
    for (int i = 0; i < dk; ++i) {
      float sd = 0.f;
      for (int j = 0; j < dv; ++j) sd = fmaf(S[(int64_t)i * dv + j], ld(b.d_o + rowi(a) * dv + j), sd);
      qsd = fmaf(Qs[a * ks + i], sd, qsd);
    }
    x += __expf(gam[a]) * qsd;
    // The end state: -e^(gam_L - gam_a) k_a^T dS v_new_a here, its sum at row L - 1, and e^(gam_L) <S, dS>.
    float kdsv = 0.f;
    for (int i = 0; i < dk; ++i) {
      float t = 0.f;
      for (int j = 0; j < dv; ++j) t = fmaf(dS[(int64_t)i * dv + j], p.vnew[rowi(a) * dv + j], t);
      kdsv = fmaf(Ks[a * ks + i], t, kdsv);
    }
    const float te = __expf(gl - gam[a]) * kdsv;
    tend[a] = te;
    x -= te;
    // B2: beta_a e^(gam_a) dB2_a . k_a.
    float b2k = 0.f;
    for (int i = 0; i < dk; ++i) b2k = fmaf(b.db2[rowi(a) * dk + i], Ks[a * ks + i], b2k);
    x += bet[a] * __expf(gam[a]) * b2k;
    dgam[a] = x;
    // dbeta_a = dB1_a . v_a + e^(gam_a) dB2_a . k_a + sum_{b < a} dA_ab e^(gam_a - gam_b) k_a . k_b.
    float db = __expf(gam[a]) * b2k;
    for (int j = 0; j < dv; ++j) {
      const float d1 = b.db1[rowi(a) * dv + j];
      db = fmaf(d1, ld(p.v + rowi(a) * dv + j), db);
      const int64_t at = rowi(a) * dv + j;
      const float g = bet[a] * d1;
      b.dv[at] = __float2bfloat16(b.accumulate ? ld(b.dv + at) + g : g);
    }
    for (int bb = 0; bb < a; ++bb) db += DA[a * C + bb] * (bet[a] > 0.f || bet[a] < 0.f ? A[a * C + bb] / bet[a] : 0.f);
    b.dbeta[rowi(a)] = __float2bfloat16(b.accumulate ? ld(b.dbeta + rowi(a)) + db : db);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the end-state terms that land on row L - 1
    float s = 0.f;
    for (int64_t e = 0; e < (int64_t)dk * dv; ++e) s = fmaf(S[e], dS[e], s);
    float t = 0.f;
    for (int a = 0; a < L; ++a) t += tend[a];
    dgam[L - 1] += __expf(gl) * s + t;
    // dg_t = sum_{a >= t} dgam_a.
    float acc = 0.f;
    for (int a = L - 1; a >= 0; --a) {
      acc += dgam[a];
      const int64_t at = rowi(a);
      b.dg[at] = __float2bfloat16(b.accumulate ? ld(b.dg + at) + acc : acc);
    }
  }
  // dq~_a = e^(gam_a) S dO_a + sum_{b <= a} e^(gam_a - gam_b) dov_ab k_b;
  // dk_b = sum_{a >= b} e^(gam_a - gam_b) dov_ab q~_a + e^(gam_L - gam_b) dS v_new_b
  //        + beta_b e^(gam_b) dB2_b + sum_{a > b} dA_ab beta_a e^(gam_a - gam_b) k_a
  //        + sum_{c < b} dA_bc beta_b e^(gam_b - gam_c) k_c.
  for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
    const int a = e / dk, i = e % dk;
    float sd = 0.f, dsv = 0.f;
    for (int j = 0; j < dv; ++j) {
      sd = fmaf(S[(int64_t)i * dv + j], ld(b.d_o + rowi(a) * dv + j), sd);
      dsv = fmaf(dS[(int64_t)i * dv + j], p.vnew[rowi(a) * dv + j], dsv);
    }
    float xq = __expf(gam[a]) * sd;
    for (int bb = 0; bb <= a; ++bb) xq = fmaf(__expf(gam[a] - gam[bb]) * DOV[a * C + bb], Ks[bb * ks + i], xq);
    b.gq[rowi(a) * dk + i] = xq;  // q~'s gradient; scaled into dq by the group reduction
    float xk = __expf(gl - gam[a]) * dsv + bet[a] * __expf(gam[a]) * b.db2[rowi(a) * dk + i];
    for (int r = a; r < L; ++r) xk = fmaf(__expf(gam[r] - gam[a]) * DOV[r * C + a], Qs[r * ks + i], xk);
    for (int r = a + 1; r < L; ++r) xk = fmaf(DA[r * C + a] * bet[r] * __expf(gam[r] - gam[a]), Ks[r * ks + i], xk);
    for (int cc = 0; cc < a; ++cc) xk = fmaf(DA[a * C + cc] * bet[a] * __expf(gam[a] - gam[cc]), Ks[cc * ks + i], xk);
    b.gk[rowi(a) * dk + i] = xk;
  }
}

// dq (+)= scale sum over the key head's value heads of gq; dk likewise (no scale).
__global__ void rule_bwd_group_kernel(bf16* dq, bf16* dk, const float* gq, const float* gk, int N, int nk, int nv, int D,
                                      float scale, bool accumulate) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (int64_t)N * nk * D) return;
  const int i = (int)(e % D), kh = (int)(e / D % nk), row = (int)(e / D / nk), r = nv / nk;
  float xq = 0.f, xk = 0.f;
  for (int h = kh * r; h < (kh + 1) * r; ++h) {
    xq += gq[((int64_t)row * nv + h) * D + i];
    xk += gk[((int64_t)row * nv + h) * D + i];
  }
  xq *= scale;
  dq[e] = __float2bfloat16(accumulate ? ld(dq + e) + xq : xq);
  dk[e] = __float2bfloat16(accumulate ? ld(dk + e) + xk : xk);
}

struct RuleScratch {
  float *U, *W, *gam, *vnew, *sin, *node_end;
  size_t bytes;
  RuleScratch(const GdnPlan& plan, int nv, int dk, int dv, bool end_given, void* base) {
    detail::WorkspaceCarver w(base);
    const size_t rows = (size_t)plan.rows() * nv, SS = (size_t)dk * dv;
    U = w.take<float>(rows * dv);
    W = w.take<float>(rows * dk);
    gam = w.take<float>(rows);
    vnew = w.take<float>(rows * dv);
    sin = w.take<float>((size_t)plan.num_chunks() * nv * SS);
    node_end = w.take<float>(end_given ? 0 : (size_t)plan.num_nodes() * nv * SS);
    bytes = w.bytes();
  }
};

struct RuleBwdScratch {
  RuleScratch f;
  float *dvn, *qo, *dsout, *acc, *db1, *db2, *gq, *gk;
  size_t bytes;
  RuleBwdScratch(const GdnPlan& plan, int nv, int dk, int dv, void* base) : f(plan, nv, dk, dv, false, base) {
    detail::WorkspaceCarver w(base ? static_cast<char*>(base) + f.bytes : nullptr);
    const size_t rows = (size_t)plan.rows() * nv, SS = (size_t)dk * dv, per_chunk = (size_t)plan.num_chunks() * nv * SS;
    dvn = w.take<float>(rows * dv);
    qo = w.take<float>(per_chunk);
    dsout = w.take<float>(per_chunk);
    acc = w.take<float>((size_t)plan.num_nodes() * nv * SS);
    db1 = w.take<float>(rows * dv);
    db2 = w.take<float>(rows * dk);
    gq = w.take<float>(rows * dk);
    gk = w.take<float>(rows * dk);
    bytes = f.bytes + w.bytes();
  }
};

int warp_blocks(int rows) { return (rows + kThreads / detail::kWarp - 1) / (kThreads / detail::kWarp); }

void check_rows(int rows, int D, const char* op) {
  TT_CHECK(rows >= 0 && D > 0, op, ": expected rows >= 0 and D > 0, got rows=", rows, " D=", D);
}

}  // namespace

void gdn_path_prev(int32_t* prev, const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent,
                   int num_nodes, cudaStream_t stream) {
  TT_CHECK(num_nodes >= 0, "gdn_path_prev: num_nodes = ", num_nodes);
  if (num_nodes == 0) return;
  path_prev_kernel<<<num_nodes, 128, 0, stream>>>(prev, node_start, node_len, node_parent);
  TT_CUDA_CHECK_LAUNCH();
}

void conv1d_silu_forward(bf16* out, const bf16* x, const bf16* w, const int32_t* prev, int N, int C, int K,
                         cudaStream_t stream) {
  TT_CHECK(N >= 0 && C > 0 && K > 0 && K <= kMaxTaps, "conv1d_silu_forward: expected N >= 0, C > 0, 0 < K <= ",
           kMaxTaps, ", got N=", N, " C=", C, " K=", K);
  if (N == 0) return;
  conv_forward_kernel<<<N, kThreads, 0, stream>>>(out, x, w, prev, C, K);
  TT_CUDA_CHECK_LAUNCH();
}

size_t conv1d_silu_backward_workspace_bytes(int N, int C, int K) { return ConvScratch(N, C, K, nullptr).bytes; }

void conv1d_silu_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const int32_t* prev,
                          const int32_t* pos, const int32_t* subtree_end, int N, int C, int K, Workspace ws,
                          cudaStream_t stream, bool accumulate) {
  TT_CHECK(N >= 0 && C > 0 && K > 0 && K <= kMaxTaps, "conv1d_silu_backward: expected N >= 0, C > 0, 0 < K <= ",
           kMaxTaps, ", got N=", N, " C=", C, " K=", K);
  if (N == 0 || (!dx && !dw)) return;
  const ConvScratch s(N, C, K, ws.ptr);
  detail::check_workspace(ws, s.bytes, "conv1d_silu_backward");
  conv_da_kernel<<<N, kThreads, 0, stream>>>(s.da, dout, x, w, prev, C, K);
  TT_CUDA_CHECK_LAUNCH();
  if (dx) {
    conv_dx_kernel<<<N, kThreads, 0, stream>>>(dx, s.da, w, pos, subtree_end, C, K, accumulate);
    TT_CUDA_CHECK_LAUNCH();
  }
  if (dw) {
    conv_dw_partial_kernel<<<chunks_of(N), kThreads, 0, stream>>>(s.partial, s.da, x, prev, N, C, K);
    TT_CUDA_CHECK_LAUNCH();
    reduce_partials(dw, s.partial, chunks_of(N), C * K, stream);
  }
}

void l2norm_forward(bf16* y, float* rstd, const bf16* x, int rows, int D, double eps, cudaStream_t stream) {
  check_rows(rows, D, "l2norm_forward");
  if (rows == 0) return;
  l2norm_forward_kernel<<<warp_blocks(rows), kThreads, 0, stream>>>(y, rstd, x, rows, D, (float)eps);
  TT_CUDA_CHECK_LAUNCH();
}

void l2norm_backward(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, int rows, int D, cudaStream_t stream,
                     bool accumulate) {
  check_rows(rows, D, "l2norm_backward");
  if (rows == 0) return;
  l2norm_backward_kernel<<<warp_blocks(rows), kThreads, 0, stream>>>(dx, dy, x, rstd, rows, D, accumulate);
  TT_CUDA_CHECK_LAUNCH();
}

void gated_rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* z, const bf16* w, int rows, int D,
                           double eps, cudaStream_t stream) {
  check_rows(rows, D, "gated_rmsnorm_forward");
  if (rows == 0) return;
  gated_rmsnorm_forward_kernel<<<warp_blocks(rows), kThreads, 0, stream>>>(y, rstd, x, z, w, rows, D, (float)eps);
  TT_CUDA_CHECK_LAUNCH();
}

size_t gated_rmsnorm_backward_workspace_bytes(int rows, int D) {
  detail::WorkspaceCarver c;
  c.take<float>((size_t)chunks_of(rows) * D);
  return c.bytes();
}

void gated_rmsnorm_backward(bf16* dx, bf16* dz, float* dw, const bf16* dy, const bf16* x, const bf16* z,
                            const bf16* w, const float* rstd, int rows, int D, Workspace ws, cudaStream_t stream,
                            bool accumulate) {
  check_rows(rows, D, "gated_rmsnorm_backward");
  if (rows == 0) return;
  if (dx || dz) {
    gated_rmsnorm_backward_kernel<<<warp_blocks(rows), kThreads, 0, stream>>>(dx, dz, dy, x, z, w, rstd, rows, D,
                                                                              accumulate);
    TT_CUDA_CHECK_LAUNCH();
  }
  if (dw) {
    detail::check_workspace(ws, gated_rmsnorm_backward_workspace_bytes(rows, D), "gated_rmsnorm_backward");
    float* partial = detail::WorkspaceCarver(ws.ptr).take<float>((size_t)chunks_of(rows) * D);
    gated_rmsnorm_dw_partial_kernel<<<chunks_of(rows), 128, 0, stream>>>(partial, dy, x, z, rstd, rows, D);
    TT_CUDA_CHECK_LAUNCH();
    reduce_partials(dw, partial, chunks_of(rows), D, stream);
  }
}

void gdn_gates_forward(bf16* g, bf16* beta, const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N,
                       int H, cudaStream_t stream) {
  check_rows(N, H, "gdn_gates_forward");
  const int64_t n = (int64_t)N * H;
  if (n == 0) return;
  gates_forward_kernel<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(g, beta, a, b, A_log,
                                                                                          dt_bias, n, H);
  TT_CUDA_CHECK_LAUNCH();
}

size_t gdn_gates_backward_workspace_bytes(int N, int H) {
  detail::WorkspaceCarver c;
  c.take<float>((size_t)2 * chunks_of(N) * H);
  return c.bytes();
}

void gdn_gates_backward(bf16* da, bf16* db, float* dA_log, float* ddt_bias, const bf16* dg, const bf16* dbeta,
                        const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N, int H,
                        Workspace ws, cudaStream_t stream) {
  check_rows(N, H, "gdn_gates_backward");
  const int64_t n = (int64_t)N * H;
  if (n == 0) return;
  gates_backward_kernel<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(da, db, dg, dbeta, a, b,
                                                                                           A_log, dt_bias, n, H);
  TT_CUDA_CHECK_LAUNCH();
  if (dA_log || ddt_bias) {
    detail::check_workspace(ws, gdn_gates_backward_workspace_bytes(N, H), "gdn_gates_backward");
    const int chunks = chunks_of(N);
    float* partial = detail::WorkspaceCarver(ws.ptr).take<float>((size_t)2 * chunks * H);
    gates_partial_kernel<<<chunks, 128, 0, stream>>>(partial, dg, a, A_log, dt_bias, N, H, chunks);
    TT_CUDA_CHECK_LAUNCH();
    if (dA_log) reduce_partials(dA_log, partial, chunks, H, stream);
    if (ddt_bias) reduce_partials(ddt_bias, partial + (size_t)chunks * H, chunks, H, stream);
  }
}

void GdnPlan::make(const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent, int num_nodes) {
  TT_CHECK(num_nodes >= 0, "GdnPlan: num_nodes = ", num_nodes);
  std::vector<int32_t> row0, len, node, flags, root(num_nodes, -1);
  int32_t next = 0;
  roots_ = 0;
  for (int n = 0; n < num_nodes; ++n) {
    TT_CHECK(node_start[n] == next && node_len[n] > 0, "GdnPlan: node ", n, " must start at ", next,
             " with a positive length, got start ", node_start[n], " len ", node_len[n]);
    TT_CHECK(node_parent[n] >= -1 && node_parent[n] < n, "GdnPlan: node ", n, " has parent ", node_parent[n],
             " (expected -1 or an earlier node)");
    if (node_parent[n] < 0) root[n] = roots_++;
    for (int32_t c0 = 0; c0 < node_len[n]; c0 += kGdnChunk) {
      row0.push_back(node_start[n] + c0);
      len.push_back(std::min<int32_t>(kGdnChunk, node_len[n] - c0));
      node.push_back(n);
      flags.push_back((c0 == 0 ? 1 : 0) | (c0 + kGdnChunk >= node_len[n] ? 2 : 0));
    }
    next += node_len[n];
  }
  chunks_ = (int)row0.size();
  nodes_ = num_nodes;
  N_ = next;
  host_.clear();
  for (const std::vector<int32_t>* t : {&row0, &len, &node, &flags}) host_.insert(host_.end(), t->begin(), t->end());
  host_.insert(host_.end(), node_parent, node_parent + num_nodes);
  host_.insert(host_.end(), root.begin(), root.end());
  dev_ = Device{};
}

void GdnPlan::upload(void* tables, cudaStream_t stream) {
  if (host_.empty()) return;
  TT_CUDA_CHECK(cudaMemcpyAsync(tables, host_.data(), table_bytes(), cudaMemcpyHostToDevice, stream));
  const int32_t* t = static_cast<const int32_t*>(tables);
  dev_.chunk_row0 = t;
  dev_.chunk_len = t + chunks_;
  dev_.chunk_node = t + 2 * chunks_;
  dev_.chunk_flags = t + 3 * chunks_;
  dev_.node_parent = t + 4 * chunks_;
  dev_.node_root = t + 4 * chunks_ + nodes_;
}

size_t gdn_forward_workspace_bytes(const GdnPlan& plan, int nv, int dk, int dv, bool end_given) {
  return RuleScratch(plan, nv, dk, dv, end_given, nullptr).bytes;
}

namespace {

void check_rule_shape(int nk, int nv, int dk, int dv, const char* op) {
  TT_CHECK(nk > 0 && nv > 0 && nv % nk == 0 && dk > 0 && dk <= 128 && dv > 0 && dv <= 128 && dv % kWalkCols == 0,
           op, ": expected nv a positive multiple of nk, dk in [1, 128], dv a multiple of ", kWalkCols,
           " in [32, 128], got nk=", nk, " nv=", nv, " dk=", dk, " dv=", dv);
}

RuleParams rule_params(const bf16* q, const bf16* k, const bf16* v, const bf16* g, const bf16* beta, const float* init,
                       const GdnPlan& plan, int nk, int nv, int dk, int dv, double scale, const RuleScratch& s,
                       float* end) {
  RuleParams p;
  p.plan = plan.device();
  p.q = q, p.k = k, p.v = v, p.g = g, p.beta = beta;
  p.init = init;
  p.U = s.U, p.W = s.W, p.gam = s.gam, p.vnew = s.vnew, p.sin = s.sin;
  p.node_end = end ? end : s.node_end;
  p.o = nullptr;
  p.nk = nk, p.nv = nv, p.dk = dk, p.dv = dv;
  p.scale = (float)scale;
  p.num_chunks = plan.num_chunks();
  return p;
}

// The forward's first two kernels: U, W and gam per chunk, then the walk (sin, vnew, node ends).
void rule_prep_and_walk(const RuleParams& p, cudaStream_t stream) {
  const int dk = p.dk, dv = p.dv;
  const size_t prep_smem = sizeof(float) * ((size_t)kGdnChunk * (dk + 1) + kGdnChunk * kGdnChunk + 2 * kGdnChunk +
                                            (size_t)kGdnChunk * (dv + dk));
  const size_t walk_smem =
      sizeof(float) * ((size_t)dk * kWalkCols + kGdnChunk * kWalkCols + kGdnChunk + 2 * (size_t)kGdnChunk * dk);
  TT_CUDA_CHECK(cudaFuncSetAttribute(rule_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem));
  TT_CUDA_CHECK(cudaFuncSetAttribute(rule_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)walk_smem));
  rule_prep_kernel<<<dim3(p.num_chunks, p.nv), kThreads, prep_smem, stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();
  rule_walk_kernel<<<dim3(p.nv, dv / kWalkCols), kThreads, walk_smem, stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t gdn_backward_workspace_bytes(const GdnPlan& plan, int nv, int dk, int dv) {
  return RuleBwdScratch(plan, nv, dk, dv, nullptr).bytes;
}

void gdn_backward(bf16* dq, bf16* dk, bf16* dv, bf16* dg, bf16* dbeta, float* d_init, const bf16* d_o,
                  const float* d_end, const bf16* q, const bf16* k, const bf16* v, const bf16* g, const bf16* beta,
                  const float* init, const GdnPlan& plan, int nk, int nv, int dk_, int dv_, double scale, Workspace ws,
                  cudaStream_t stream, bool accumulate) {
  check_rule_shape(nk, nv, dk_, dv_, "gdn_backward");
  if (plan.num_chunks() == 0) return;
  TT_CHECK(plan.device().chunk_row0, "gdn_backward: the plan's tables are not uploaded");
  const RuleBwdScratch s(plan, nv, dk_, dv_, ws.ptr);
  detail::check_workspace(ws, s.bytes, "gdn_backward");
  RuleBwdParams b;
  b.f = rule_params(q, k, v, g, beta, init, plan, nk, nv, dk_, dv_, scale, s.f, nullptr);
  b.d_o = d_o;
  b.d_end = d_end;
  b.d_init = d_init;
  b.dvn = s.dvn, b.qo = s.qo, b.dsout = s.dsout, b.acc = s.acc, b.db1 = s.db1, b.db2 = s.db2, b.gq = s.gq,
  b.gk = s.gk;
  b.dv = dv, b.dg = dg, b.dbeta = dbeta;
  b.accumulate = accumulate;
  rule_prep_and_walk(b.f, stream);  // the forward again: U, W, gam, v_new, the entering states
  TT_CUDA_CHECK(cudaMemsetAsync(s.acc, 0, sizeof(float) * (size_t)plan.num_nodes() * nv * dk_ * dv_, stream));
  const dim3 per_chunk(plan.num_chunks(), nv);
  const size_t local_smem = sizeof(float) * (2 * (size_t)kGdnChunk * (dk_ + 1) + kGdnChunk * kGdnChunk + kGdnChunk);
  const size_t walk_smem =
      sizeof(float) * ((size_t)dk_ * kWalkCols + kGdnChunk * kWalkCols + kGdnChunk + 2 * (size_t)kGdnChunk * dk_);
  const size_t grad_smem =
      sizeof(float) * (2 * (size_t)kGdnChunk * (dk_ + 1) + 4 * kGdnChunk * kGdnChunk + 4 * kGdnChunk);
  TT_CUDA_CHECK(cudaFuncSetAttribute(rule_bwd_local_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)local_smem));
  TT_CUDA_CHECK(cudaFuncSetAttribute(rule_bwd_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)walk_smem));
  TT_CUDA_CHECK(cudaFuncSetAttribute(rule_bwd_grad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)grad_smem));
  rule_bwd_local_kernel<<<per_chunk, kThreads, local_smem, stream>>>(b);
  TT_CUDA_CHECK_LAUNCH();
  rule_bwd_walk_kernel<<<dim3(nv, dv_ / kWalkCols), kThreads, walk_smem, stream>>>(b);
  TT_CUDA_CHECK_LAUNCH();
  rule_bwd_grad_kernel<<<per_chunk, kThreads, grad_smem, stream>>>(b);
  TT_CUDA_CHECK_LAUNCH();
  const int64_t n = (int64_t)plan.rows() * nk * dk_;
  rule_bwd_group_kernel<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      dq, dk, s.gq, s.gk, plan.rows(), nk, nv, dk_, (float)scale, accumulate);
  TT_CUDA_CHECK_LAUNCH();
}

void gdn_forward(bf16* o, float* end, const bf16* q, const bf16* k, const bf16* v, const bf16* g, const bf16* beta,
                 const float* init, const GdnPlan& plan, int nk, int nv, int dk, int dv, double scale, Workspace ws,
                 cudaStream_t stream) {
  check_rule_shape(nk, nv, dk, dv, "gdn_forward");
  if (plan.num_chunks() == 0) return;
  TT_CHECK(plan.device().chunk_row0, "gdn_forward: the plan's tables are not uploaded");
  const RuleScratch s(plan, nv, dk, dv, end != nullptr, ws.ptr);
  detail::check_workspace(ws, s.bytes, "gdn_forward");
  RuleParams p = rule_params(q, k, v, g, beta, init, plan, nk, nv, dk, dv, scale, s, end);
  p.o = o;
  rule_prep_and_walk(p, stream);
  const size_t out_smem = sizeof(float) * (2 * (size_t)kGdnChunk * (dk + 1) + kGdnChunk * kGdnChunk + kGdnChunk +
                                           (size_t)dk * dv + (size_t)kGdnChunk * dv);
  TT_CUDA_CHECK(cudaFuncSetAttribute(rule_out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)out_smem));
  rule_out_kernel<<<dim3(plan.num_chunks(), nv), kThreads, out_smem, stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
