// Weighted cross-entropy forward and backward over a target list, fused (see cross_entropy.h).
// Gradient contract: lse overwritten, *loss accumulated (+=), dlogits overwritten (zeros for rows
// without targets); dlogits may alias logits.
//
// Steps per call: (1) stable radix sort of the targets by source row (keys src, values the list
// index), then gather tok and w into sorted order; (2) one block per row: a pass over the row for
// the running max and sum of exp (fp32, per thread, then block reductions in a fixed order) gives
// lse; the row's targets are found by binary search in the sorted sources, their logits stashed
// before anything is written (so the gradient can overwrite the logits), and the row's loss summed
// in list order in fp64; a second pass writes dloss * c_r * softmax; after a barrier the target
// columns are rewritten as dloss * (c_r p_tok - sum of the weights of the row's targets with that
// token), computed in fp32 from the stash; (3) one block adds the row losses in a fixed order.
// A target whose token lies outside [0, V) makes the loss NaN.
//
// Row cache: in the fused call the first pass also keeps the row's leading columns (up to
// kCacheBytes, whole strides of the block) in shared memory, and the second pass reads them back
// from there. Each thread reads back only what it stored (both passes walk the same columns), so
// no barrier is needed. A 151936-token row is 297 KB; the rest of the row was read last in the
// first pass. Measured on an H200, 16384 x 151936 in place: 4.38 ms without the cache (53% of
// copy bandwidth; the forward pass alone: 1.37 ms), 4.06 ms with it (58%), the same with or
// without a branch inside the loops, so the re-read is not the main cost; not yet profiled (the
// fused kernel runs one 1024-thread block per SM: 44 registers).
#include "ops/cuda/cross_entropy.h"

#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

using detail::load_bf16;
using detail::store_bf16;

constexpr int kFwd = 1, kBwd = 2, kBoth = 3;
constexpr int kSmallThreads = 256, kLargeThreads = 1024;
constexpr int kLargeVocab = 16384;  // rows at least this long take 1024 threads
constexpr int kReduceThreads = 1024;
constexpr int kCacheBytes = 216 * 1024;  // dynamic shared memory: under the 227 KB per block limit

struct CeParams {
  double* loss;               // (1) +=
  float* lse;                 // (rows) out (forward modes)
  const float* lse_in;        // (rows) in (backward only)
  bf16* dlogits;              // (rows, V)
  const bf16* logits;         // (rows, V)
  const uint32_t* sorted_src; // (n_tgt) target source rows, ascending
  const int32_t* sorted_tok;  // (n_tgt) in sorted order
  const double* sorted_w;     // (n_tgt) in sorted order
  const double* sorted_c;     // (n_tgt) second weights in sorted order, or null
  float* stash;               // (n_tgt) logit of each target, in sorted order
  double* row_loss;           // (rows)
  double* row_c_loss;         // (rows) with sorted_c
  int n_tgt, row_begin, rows, V;
  int cached;                 // leading elements of a row kept in shared memory (fused mode)
  float dloss;
};

// First index i in [0, n) with a[i] >= key (n if none).
__device__ __forceinline__ int lower_bound_u32(const uint32_t* a, int n, uint32_t key) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (a[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

template <int MODE, int VEC>
__global__ void __launch_bounds__(kLargeThreads) ce_row_kernel(CeParams p) {
  extern __shared__ __align__(16) unsigned char cache_raw[];
  bf16* cache = reinterpret_cast<bf16*>(cache_raw);  // (cached) the row's leading elements
  __shared__ float red[detail::kWarp];
  __shared__ float row_c;  // c_r, the sum of the row's target weights
  const int r = blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint32_t grow = (uint32_t)(p.row_begin + r);
  const bf16* x = p.logits + (int64_t)r * p.V;
  const int b = lower_bound_u32(p.sorted_src, p.n_tgt, grow);
  const int e = lower_bound_u32(p.sorted_src, p.n_tgt, grow + 1);

  // This thread's columns are c = tid * VEC + i * stride; [0, cached) is a whole number of strides,
  // so each loop below is branch-free and the cached columns are the same in both passes.
  const int stride = nt * VEC;
  float lse;
  if constexpr ((MODE & kFwd) != 0) {
    float m = -INFINITY, s = 0.f;
    auto accumulate = [&](const float (&v)[VEC]) {
      float mv = v[0];
#pragma unroll
      for (int k = 1; k < VEC; k++) mv = fmaxf(mv, v[k]);
      if (mv > m) {
        s *= __expf(m - mv);
        m = mv;
      }
#pragma unroll
      for (int k = 0; k < VEC; k++) s += __expf(v[k] - m);
    };
#pragma unroll 4
    for (int c = tid * VEC; c < p.cached; c += stride) {
      float v[VEC];
      load_bf16<VEC>(v, x + c);
      store_bf16<VEC>(cache + c, v);  // exact: v holds bf16 values
      accumulate(v);
    }
#pragma unroll 4
    for (int c = p.cached + tid * VEC; c < p.V; c += stride) {
      float v[VEC];
      load_bf16<VEC>(v, x + c);
      accumulate(v);
    }
    const float M = detail::block_max(m, red);
    s = m == -INFINITY ? 0.f : s * __expf(m - M);
    const float S = detail::block_sum(s, red);
    lse = M + __logf(S);
    if (tid == 0) p.lse[r] = lse;
  } else {
    lse = p.lse_in[r];
  }

  // Stash the targets' logits before any write to the row (dlogits may alias logits).
  for (int i = b + tid; i < e; i += nt) {
    const int tok = p.sorted_tok[i];
    p.stash[i] = (tok >= 0 && tok < p.V) ? __bfloat162float(x[tok]) : __int_as_float(0x7fc00000);
  }
  __syncthreads();
  if (tid == 0) {
    double loss = 0.0, c = 0.0, c_loss = 0.0;
    for (int i = b; i < e; i++) {
      const double ce = (double)lse - (double)p.stash[i];
      loss += p.sorted_w[i] * ce;
      c += p.sorted_w[i];
      if (p.sorted_c) c_loss += p.sorted_c[i] * ce;
    }
    if constexpr ((MODE & kFwd) != 0) {
      p.row_loss[r] = loss;
      if (p.sorted_c) p.row_c_loss[r] = c_loss;
    }
    row_c = (float)c;
  }
  if constexpr ((MODE & kBwd) != 0) {
    bf16* d = p.dlogits + (int64_t)r * p.V;
    if (b == e) {
      float z[VEC];
#pragma unroll
      for (int k = 0; k < VEC; k++) z[k] = 0.f;
      for (int c = tid * VEC; c < p.V; c += nt * VEC) store_bf16<VEC>(d + c, z);
      return;
    }
    __syncthreads();  // row_c
    const float scale = p.dloss * row_c;
#pragma unroll 4
    for (int c = tid * VEC; c < p.cached; c += stride) {
      float v[VEC];
      load_bf16<VEC>(v, cache + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) v[k] = scale * __expf(v[k] - lse);
      store_bf16<VEC>(d + c, v);
    }
#pragma unroll 4
    for (int c = p.cached + tid * VEC; c < p.V; c += stride) {
      float v[VEC];
      load_bf16<VEC>(v, x + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) v[k] = scale * __expf(v[k] - lse);
      store_bf16<VEC>(d + c, v);
    }
    __syncthreads();  // the dense writes of the row precede the target-column rewrites
    for (int i = b + tid; i < e; i += nt) {
      const int tok = p.sorted_tok[i];
      if (tok < 0 || tok >= p.V) continue;
      double same = 0.0;  // weights of the row's targets with this token, in list order
      for (int j = b; j < e; j++)
        if (p.sorted_tok[j] == tok) same += p.sorted_w[j];
      d[tok] = __float2bfloat16_rn(p.dloss * (row_c * __expf(p.stash[i] - lse) - (float)same));
    }
  }
}

__global__ void iota_kernel(int32_t* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = i;
}

__global__ void gather_targets_kernel(int32_t* sorted_tok, double* sorted_w, double* sorted_c,
                                      const int32_t* sorted_idx, const int32_t* tok, const double* w,
                                      const double* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int t = sorted_idx[i];
  sorted_tok[i] = tok[t];
  sorted_w[i] = w[t];
  if (c) sorted_c[i] = c[t];
}

// One block: thread i adds rows i, i + blockDim, ... in order; then a fixed-order block sum. The
// same for the second weights' sums when c_loss is set.
__global__ void loss_reduce_kernel(double* loss, const double* row_loss, double* c_loss, const double* row_c_loss,
                                   int rows) {
  __shared__ double red[detail::kWarp];
  double s = 0.0, sc = 0.0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    s += row_loss[r];
    if (c_loss) sc += row_c_loss[r];
  }
  s = detail::block_sum(s, red);
  if (threadIdx.x == 0) *loss += s;
  if (c_loss) {
    sc = detail::block_sum(sc, red);
    if (threadIdx.x == 0) *c_loss += sc;
  }
}

struct CeLayout {
  int32_t* iota;
  uint32_t* sorted_src;
  int32_t* sorted_idx;
  int32_t* sorted_tok;
  double* sorted_w;
  double* sorted_c;
  float* stash;
  double* row_loss;
  double* row_c_loss;
  void* sort_temp;
  size_t sort_temp_bytes;
  size_t bytes;
};

CeLayout carve(void* base, int rows, int n_tgt) {
  detail::WorkspaceCarver w(base);
  CeLayout l{};
  l.iota = w.take<int32_t>(n_tgt);
  l.sorted_src = w.take<uint32_t>(n_tgt);
  l.sorted_idx = w.take<int32_t>(n_tgt);
  l.sorted_tok = w.take<int32_t>(n_tgt);
  l.sorted_w = w.take<double>(n_tgt);
  l.sorted_c = w.take<double>(n_tgt);
  l.stash = w.take<float>(n_tgt);
  l.row_loss = w.take<double>(rows);
  l.row_c_loss = w.take<double>(rows);
  l.sort_temp_bytes = 0;
  if (n_tgt > 0) {
    TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.sort_temp_bytes, (const uint32_t*)nullptr,
                                                  (uint32_t*)nullptr, (const int32_t*)nullptr,
                                                  (int32_t*)nullptr, n_tgt));
  }
  l.sort_temp = w.take<char>(l.sort_temp_bytes);
  l.bytes = w.bytes();
  return l;
}

void sort_targets(const CeTargets& tgt, const CeLayout& l, cudaStream_t stream) {
  if (tgt.n_tgt == 0) return;
  constexpr int kThreads = 256;
  const int blocks = (tgt.n_tgt + kThreads - 1) / kThreads;
  iota_kernel<<<blocks, kThreads, 0, stream>>>(l.iota, tgt.n_tgt);
  TT_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = l.sort_temp_bytes;
  // All 32 bits, stable: negative rows sort last as large unsigned keys and match no row.
  TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(l.sort_temp, temp_bytes, reinterpret_cast<const uint32_t*>(tgt.src),
                                                l.sorted_src, l.iota, l.sorted_idx, tgt.n_tgt, 0, 32, stream));
  gather_targets_kernel<<<blocks, kThreads, 0, stream>>>(l.sorted_tok, l.sorted_w, l.sorted_c, l.sorted_idx, tgt.tok,
                                                         tgt.w, tgt.c, tgt.n_tgt);
  TT_CUDA_CHECK_LAUNCH();
}

template <int MODE>
void launch_ce(CeParams p, const CeTargets& tgt, const CeLayout& l, cudaStream_t stream) {
  sort_targets(tgt, l, stream);
  p.sorted_src = l.sorted_src;
  p.sorted_tok = l.sorted_tok;
  p.sorted_w = l.sorted_w;
  p.sorted_c = tgt.c && tgt.n_tgt > 0 ? l.sorted_c : nullptr;
  p.stash = l.stash;
  p.row_loss = l.row_loss;
  p.row_c_loss = l.row_c_loss;
  const int threads = p.V >= kLargeVocab ? kLargeThreads : kSmallThreads;
  bool wide = p.V % 8 == 0 && detail::aligned16(p.logits);
  if constexpr ((MODE & kBwd) != 0) wide = wide && detail::aligned16(p.dlogits);
  TT_VEC_SWITCH(wide, VEC, [&] {
    // Only the fused mode reads a row twice; the cache holds whole strides of the block.
    const int stride = threads * VEC;
    p.cached = MODE == kBoth ? std::min(p.V, kCacheBytes / (int)sizeof(bf16)) / stride * stride : 0;
    const size_t smem = (size_t)p.cached * sizeof(bf16);
    if (smem > 48 * 1024)
      TT_CUDA_CHECK(cudaFuncSetAttribute(ce_row_kernel<MODE, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem));
    ce_row_kernel<MODE, VEC><<<p.rows, threads, smem, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
  if constexpr ((MODE & kFwd) != 0) {
    // Rows without the second weights' sums (c null, or no targets) hold no row_c_loss: only add
    // them when every row wrote one.
    double* c_loss = p.sorted_c ? tgt.c_loss : nullptr;
    loss_reduce_kernel<<<1, kReduceThreads, 0, stream>>>(p.loss, p.row_loss, c_loss, p.row_c_loss, p.rows);
    TT_CUDA_CHECK_LAUNCH();
  }
}

void check_args(const CeTargets& tgt, int row_begin, int rows, int V, const Workspace& ws, const char* op) {
  TT_CHECK(rows >= 0 && row_begin >= 0 && V > 0 && tgt.n_tgt >= 0, op,
           ": expected rows >= 0, row_begin >= 0, V > 0, n_tgt >= 0, got rows=", rows, " row_begin=", row_begin,
           " V=", V, " n_tgt=", tgt.n_tgt);
  TT_CHECK((int64_t)row_begin + rows < ((int64_t)1 << 31), op, ": row_begin + rows overflows int32");
  TT_CHECK(tgt.n_tgt == 0 || (tgt.src && tgt.tok && tgt.w), op, ": null target arrays with n_tgt=", tgt.n_tgt);
  TT_CHECK(tgt.c == nullptr || tgt.c_loss != nullptr, op, ": second weights without c_loss");
  detail::check_workspace(ws, cross_entropy_workspace_bytes(rows, tgt.n_tgt), op);
}

}  // namespace

size_t cross_entropy_workspace_bytes(int rows, int n_tgt) {
  return carve(nullptr, rows < 0 ? 0 : rows, n_tgt < 0 ? 0 : n_tgt).bytes;
}

void cross_entropy_forward(double* loss, float* lse, const bf16* logits, const CeTargets& tgt, int row_begin,
                           int rows, int V, Workspace ws, cudaStream_t stream) {
  check_args(tgt, row_begin, rows, V, ws, "cuda::cross_entropy_forward");
  if (rows == 0) return;
  TT_CHECK(loss && lse && logits, "cuda::cross_entropy_forward: null pointer (loss, lse or logits)");
  CeParams p{};
  p.loss = loss, p.lse = lse, p.logits = logits;
  p.n_tgt = tgt.n_tgt, p.row_begin = row_begin, p.rows = rows, p.V = V;
  launch_ce<kFwd>(p, tgt, carve(ws.ptr, rows, tgt.n_tgt), stream);
}

void cross_entropy_backward(bf16* dlogits, const bf16* logits, const float* lse, const CeTargets& tgt,
                            int row_begin, int rows, int V, float dloss, Workspace ws, cudaStream_t stream) {
  check_args(tgt, row_begin, rows, V, ws, "cuda::cross_entropy_backward");
  if (rows == 0) return;
  TT_CHECK(dlogits && logits && lse, "cuda::cross_entropy_backward: null pointer (dlogits, logits or lse)");
  CeParams p{};
  p.lse_in = lse, p.dlogits = dlogits, p.logits = logits;
  p.n_tgt = tgt.n_tgt, p.row_begin = row_begin, p.rows = rows, p.V = V, p.dloss = dloss;
  launch_ce<kBwd>(p, tgt, carve(ws.ptr, rows, tgt.n_tgt), stream);
}

void cross_entropy_forward_backward(double* loss, float* lse, bf16* dlogits, const bf16* logits,
                                    const CeTargets& tgt, int row_begin, int rows, int V, float dloss,
                                    Workspace ws, cudaStream_t stream) {
  check_args(tgt, row_begin, rows, V, ws, "cuda::cross_entropy_forward_backward");
  if (rows == 0) return;
  TT_CHECK(loss && lse && dlogits && logits,
           "cuda::cross_entropy_forward_backward: null pointer (loss, lse, dlogits or logits)");
  CeParams p{};
  p.loss = loss, p.lse = lse, p.dlogits = dlogits, p.logits = logits;
  p.n_tgt = tgt.n_tgt, p.row_begin = row_begin, p.rows = rows, p.V = V, p.dloss = dloss;
  launch_ce<kBoth>(p, tgt, carve(ws.ptr, rows, tgt.n_tgt), stream);
}

}  // namespace tt::cuda
