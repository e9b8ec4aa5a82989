// Sampling from logits rows (see sampling.h): a cluster of blocks per row, each thread a strided
// share of its block's part of the row; (value, index) reductions take the larger value, the lower
// index on ties.
#include "ops/cuda/sampling.h"

#include <cooperative_groups.h>

#include <cfloat>

#include "base/check.h"
#include "ops/cpu/sampling.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kCluster = 8;  // blocks per row
constexpr int kBatch = 16;   // logits a thread loads at once

struct SampleParams {
  int32_t* token;
  double* logprob;
  const bf16* logits;
  const uint64_t* keys;
  int V;
  double temperature;
};

// The better of (a, ia) and (b, ib): larger value, then lower index.
template <class F>
__device__ __forceinline__ void pick(F& a, int& ia, F b, int ib) {
  if (b > a || (b == a && ib < ia)) a = b, ia = ib;
}

template <class F>
__device__ __forceinline__ void block_argmax(F& v, int& i, F* sv, int* si) {
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
#pragma unroll
  for (int o = detail::kWarp / 2; o > 0; o /= 2) pick(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  __syncthreads();
  if (lane == 0) sv[warp] = v, si[warp] = i;
  __syncthreads();
  v = lane < (int)(blockDim.x / detail::kWarp) ? sv[lane] : (F)-INFINITY;
  i = lane < (int)(blockDim.x / detail::kWarp) ? si[lane] : INT_MAX;
#pragma unroll
  for (int o = detail::kWarp / 2; o > 0; o /= 2) pick(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// A row's partial result over its share of the vocabulary.
struct Partial {
  float m, s, best;  // max, sum of exp(x - m), best logit
  int ib;            // its index
  double draw;       // best Gumbel-perturbed value (temperature > 0)
  int id;            // its index
};

// A cluster of kCluster consecutive blocks per row (blockIdx.x / kCluster; rows on x, which has
// no 65535 limit): block q takes the q-th share of the row, each thread a strided part of it; the
// blocks' partials meet in block 0 through distributed shared memory, in rank order
// (deterministic).
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads) sample_rows_kernel(SampleParams p) {
  __shared__ float red[detail::kWarp];
  __shared__ float sv[detail::kWarp];
  __shared__ double sd[detail::kWarp];
  __shared__ int si[detail::kWarp];
  __shared__ Partial part;
  detail::pdl_wait();  // the logits are the previous kernel's output
  cg::cluster_group cluster = cg::this_cluster();
  const int q = (int)cluster.block_rank(), r = blockIdx.x / kCluster, tid = threadIdx.x;
  const bf16* x = p.logits + (int64_t)r * p.V;
  const uint64_t key = p.keys[r];
  const int share = (p.V + kCluster - 1) / kCluster, lo = q * share, hi = min(p.V, lo + share);
  float m = -INFINITY, s = 0.f, best = -INFINITY;
  int ib = INT_MAX;
  double draw = -INFINITY;
  int id = INT_MAX;
  // kBatch of the thread's logits loaded together, then taken in order (one round trip a batch,
  // not one a logit; a row of 152k is two batches).
  for (int v0 = lo + tid; v0 < hi; v0 += kBatch * kThreads) {
    float xb[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; b++) {
      const int v = v0 + b * kThreads;
      xb[b] = v < hi ? __bfloat162float(x[v]) : 0.f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; b++) {
      const int v = v0 + b * kThreads;
      if (v >= hi) break;
      const float xv = xb[b];
      pick(best, ib, xv, v);
      if (xv > m) {
        s *= __expf(m - xv);
        m = xv;
      }
      s += __expf(xv - m);
      if (p.temperature > 0) {
        const double g = -log(-log(cpu::sample_uniform(key, v)));
        pick(draw, id, (double)xv / p.temperature + g, v);
      }
    }
  }
  const float M = detail::block_max(m, red);
  const float S = detail::block_sum(m == -INFINITY ? 0.f : s * __expf(m - M), red);
  block_argmax(best, ib, sv, si);
  if (p.temperature > 0) block_argmax(draw, id, sd, si);
  if (tid == 0) part = Partial{M, S, best, ib, draw, id};
  cluster.sync();
  if (q == 0 && tid == 0) {
    Partial all[kCluster];
    float Mt = -INFINITY;
    for (int k = 0; k < kCluster; k++) {
      all[k] = *cluster.map_shared_rank(&part, k);
      Mt = fmaxf(Mt, all[k].m);
    }
    float St = 0.f, bt = -INFINITY;
    int it = INT_MAX, dt_i = INT_MAX;
    double dt = -INFINITY;
    for (int k = 0; k < kCluster; k++) {
      if (all[k].m != -INFINITY) St += all[k].s * __expf(all[k].m - Mt);
      pick(bt, it, all[k].best, all[k].ib);
      pick(dt, dt_i, all[k].draw, all[k].id);
    }
    // A row of NaN logits (a forward that overflowed) picks nothing: token 0 and a NaN logprob, as
    // the CPU reference's, for the caller to refuse (never a read past the row).
    int tok = p.temperature > 0 ? dt_i : it;
    if (tok >= p.V) tok = it < p.V ? it : 0;
    p.token[r] = tok;
    p.logprob[r] = it < p.V ? (double)__bfloat162float(x[tok]) - ((double)Mt + log((double)St)) : (double)NAN;
  }
  cluster.sync();  // block 0 has read every block's partial
}

}  // namespace

void sample_rows(int32_t* token, double* logprob, const bf16* logits, int R, int V, double temperature,
                 const uint64_t* keys, cudaStream_t stream) {
  TT_CHECK(R >= 0 && R <= INT_MAX / kCluster && V > 0 && temperature >= 0, "sample_rows: R=", R, " V=", V,
           " temperature=", temperature, ", expected 0 <= R <= ", INT_MAX / kCluster, ", V > 0, temperature >= 0");
  if (R == 0) return;
  TT_CHECK(token && logprob && logits && keys, "sample_rows: null pointer");
  detail::launch_pdl(sample_rows_kernel, dim3((unsigned)kCluster * (unsigned)R), dim3(kThreads), 0, stream,
                     SampleParams{token, logprob, logits, keys, V, temperature});
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
