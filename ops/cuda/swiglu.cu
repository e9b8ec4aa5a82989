// SwiGLU forward and backward (see swiglu.h).
// Gradient contract: forward overwrites out; backward overwrites dgate and dup.
// With s = sigmoid(g): out = g s u;  dgate = dout u (s + g s (1 - s));  dup = dout g s.
// Elementwise, one VEC-wide group per thread; each thread reads its inputs before writing, so
// the gradients may overwrite gate and up in place.
#include "ops/cuda/swiglu.h"

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

using detail::load_bf16;
using detail::store_bf16;

constexpr int kThreads = 256;

struct SwigluFwdParams {
  bf16* out;          // (n)
  const bf16* gate;   // (n)
  const bf16* up;     // (n)
  int64_t n;
};

struct SwigluBwdParams : SwigluFwdParams {
  bf16* dgate;        // (n)
  bf16* dup;          // (n)
  const bf16* dout;   // (n)
};

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

template <int VEC>
__global__ void swiglu_forward_kernel(SwigluFwdParams p) {
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= p.n) return;
  float g[VEC], u[VEC], o[VEC];
  load_bf16<VEC>(g, p.gate + i);
  load_bf16<VEC>(u, p.up + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) o[k] = g[k] * sigmoid(g[k]) * u[k];
  store_bf16<VEC>(p.out + i, o);
}

template <int VEC>
__global__ void swiglu_backward_kernel(SwigluBwdParams p) {
  const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= p.n) return;
  float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
  load_bf16<VEC>(g, p.gate + i);
  load_bf16<VEC>(u, p.up + i);
  load_bf16<VEC>(d, p.dout + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    const float s = sigmoid(g[k]);
    dg[k] = d[k] * u[k] * (s + g[k] * s * (1.f - s));
    du[k] = d[k] * g[k] * s;
  }
  store_bf16<VEC>(p.dgate + i, dg);
  store_bf16<VEC>(p.dup + i, du);
}

int64_t num_blocks(int64_t n, int vec) { return (n + (int64_t)kThreads * vec - 1) / ((int64_t)kThreads * vec); }

void launch_swiglu_forward(const SwigluFwdParams& p, cudaStream_t stream) {
  const bool wide = p.n % 8 == 0 && detail::aligned16(p.out) && detail::aligned16(p.gate) && detail::aligned16(p.up);
  TT_VEC_SWITCH(wide, VEC, [&] {
    swiglu_forward_kernel<VEC><<<(unsigned)num_blocks(p.n, VEC), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void launch_swiglu_backward(const SwigluBwdParams& p, cudaStream_t stream) {
  const bool wide = p.n % 8 == 0 && detail::aligned16(p.gate) && detail::aligned16(p.up) &&
                    detail::aligned16(p.dout) && detail::aligned16(p.dgate) && detail::aligned16(p.dup);
  TT_VEC_SWITCH(wide, VEC, [&] {
    swiglu_backward_kernel<VEC><<<(unsigned)num_blocks(p.n, VEC), kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void check_n(int64_t n, const char* op) {
  TT_CHECK(n >= 0, op, ": expected n >= 0, got ", n);
  TT_CHECK(n / kThreads < (int64_t)1 << 31, op, ": n=", n, " exceeds the grid limit");
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream) {
  check_n(n, "cuda::swiglu_forward");
  if (n == 0) return;
  TT_CHECK(out && gate && up, "cuda::swiglu_forward: null pointer (out, gate or up)");
  launch_swiglu_forward(SwigluFwdParams{out, gate, up, n}, stream);
}

void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                     cudaStream_t stream) {
  check_n(n, "cuda::swiglu_backward");
  if (n == 0) return;
  TT_CHECK(dgate && dup && dout && gate && up, "cuda::swiglu_backward: null pointer (dgate, dup, dout, gate or up)");
  SwigluBwdParams p;
  static_cast<SwigluFwdParams&>(p) = SwigluFwdParams{nullptr, gate, up, n};
  p.dgate = dgate;
  p.dup = dup;
  p.dout = dout;
  launch_swiglu_backward(p, stream);
}

}  // namespace tt::cuda
