// Sampling from logits rows (see sampling.h): one block per row, each thread a strided share of
// the row; (value, index) block reductions take the larger value, the lower index on ties.
#include "ops/cuda/sampling.h"

#include <cfloat>

#include "base/check.h"
#include "ops/cpu/sampling.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 1024;

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

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(SampleParams p) {
  __shared__ float red[detail::kWarp];
  __shared__ float sv[detail::kWarp];
  __shared__ double sd[detail::kWarp];
  __shared__ int si[detail::kWarp];
  const int r = blockIdx.x, tid = threadIdx.x;
  const bf16* x = p.logits + (int64_t)r * p.V;
  const uint64_t key = p.keys[r];
  float m = -INFINITY, s = 0.f, best = -INFINITY;
  int ib = INT_MAX;
  double draw = -INFINITY;
  int id = INT_MAX;
  for (int v = tid; v < p.V; v += kThreads) {
    const float xv = __bfloat162float(x[v]);
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
  const float M = detail::block_max(m, red);
  const float S = detail::block_sum(m == -INFINITY ? 0.f : s * __expf(m - M), red);
  block_argmax(best, ib, sv, si);
  int tok = ib;
  if (p.temperature > 0) {
    block_argmax(draw, id, sd, si);
    tok = id;
  }
  if (tid == 0) {
    p.token[r] = tok;
    p.logprob[r] = (double)__bfloat162float(x[tok]) - ((double)M + log((double)S));
  }
}

}  // namespace

void sample_rows(int32_t* token, double* logprob, const bf16* logits, int R, int V, double temperature,
                 const uint64_t* keys, cudaStream_t stream) {
  TT_CHECK(R >= 0 && V > 0 && temperature >= 0, "sample_rows: R=", R, " V=", V, " temperature=", temperature);
  if (R == 0) return;
  TT_CHECK(token && logprob && logits && keys, "sample_rows: null pointer");
  sample_rows_kernel<<<R, kThreads, 0, stream>>>(SampleParams{token, logprob, logits, keys, V, temperature});
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
