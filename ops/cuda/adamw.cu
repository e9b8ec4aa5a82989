// Multi-tensor AdamW, global gradient norm and clip scale (see adamw.h).
// Gradient contract: grad read only; param (fp32 master), param_bf16, m, v updated in place.
//
// adamw_update: one block per chunk of the chunk table (a piece of one tensor, so one decay flag
// per block); 16-byte accesses on the chunk's aligned interior, scalar head and tail elements.
// sum_squares: stage 1 gives each of G blocks (G fixed by n) a fixed grid-stride share of x and
// sums squares in fp64 with a fixed-order block reduction; stage 2 adds the G block sums in order.
#include "ops/cuda/adamw.h"

#include <algorithm>
#include <cmath>

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kNormBlocks = 1024;  // G at most; stage 2 is one block of this many threads
constexpr int64_t kNormElemsPerBlock = (int64_t)kThreads * 4 * 4;

struct AdamWKernelParams {
  float* param;             // (P)
  bf16* param_bf16;         // (P) or null
  const float* grad;        // (P)
  float* m;                 // (P)
  float* v;                 // (P)
  const AdamWChunk* chunks; // (n_chunks)
  const float* grad_scale_dev;
  int* nonfinite;           // (1) or null: set when an updated value is not finite
  float grad_scale, beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;          // lr / (1 - beta1^step)
  float inv_bc2_sqrt;       // 1 / sqrt(1 - beta2^step)
  float eps;
  float decay_factor;       // 1 - lr * weight_decay
};

struct Elem {
  float param, m, v;
};

__device__ __forceinline__ Elem adamw_elem(float param, float grad, float m, float v, float scale, float decay,
                                           const AdamWKernelParams& p) {
  const float g = grad * scale;
  m = p.beta1 * m + p.one_minus_beta1 * g;
  v = p.beta2 * v + p.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) * p.inv_bc2_sqrt + p.eps;
  return Elem{param * decay - p.step_size * m / denom, m, v};
}

__device__ __forceinline__ bool finite(const Elem& e) { return isfinite(e.param) && isfinite(e.m) && isfinite(e.v); }

__device__ __forceinline__ void adamw_scalar(const AdamWKernelParams& p, int64_t i, float scale, float decay,
                                             bool& bad) {
  const Elem e = adamw_elem(p.param[i], p.grad[i], p.m[i], p.v[i], scale, decay, p);
  bad |= !finite(e);
  p.param[i] = e.param;
  p.m[i] = e.m;
  p.v[i] = e.v;
  if (p.param_bf16) p.param_bf16[i] = __float2bfloat16_rn(e.param);
}

template <bool kVec4>
__global__ void adamw_kernel(AdamWKernelParams p) {
  const AdamWChunk ch = p.chunks[blockIdx.x];
  const float decay = ch.decay ? p.decay_factor : 1.f;
  const float scale = p.grad_scale_dev ? p.grad_scale * *p.grad_scale_dev : p.grad_scale;
  const int tid = threadIdx.x, nt = blockDim.x;
  bool bad = false;
  if constexpr (!kVec4) {
    for (int i = tid; i < ch.len; i += nt) adamw_scalar(p, ch.offset + i, scale, decay, bad);
  } else {
    const int head = min(ch.len, (int)((4 - (ch.offset & 3)) & 3));
    const int64_t body = ch.offset + head;  // multiple of 4
    const int n_vec = (ch.len - head) / 4;
    const int tail = (ch.len - head) % 4;
    if (tid < head) adamw_scalar(p, ch.offset + tid, scale, decay, bad);
    if (tid < tail) adamw_scalar(p, body + 4 * (int64_t)n_vec + tid, scale, decay, bad);
    for (int i = tid; i < n_vec; i += nt) {
      const int64_t j = body + 4 * (int64_t)i;
      float4 pw = *reinterpret_cast<const float4*>(p.param + j);
      const float4 gw = *reinterpret_cast<const float4*>(p.grad + j);
      float4 mw = *reinterpret_cast<const float4*>(p.m + j);
      float4 vw = *reinterpret_cast<const float4*>(p.v + j);
      Elem e;
      e = adamw_elem(pw.x, gw.x, mw.x, vw.x, scale, decay, p), pw.x = e.param, mw.x = e.m, vw.x = e.v, bad |= !finite(e);
      e = adamw_elem(pw.y, gw.y, mw.y, vw.y, scale, decay, p), pw.y = e.param, mw.y = e.m, vw.y = e.v, bad |= !finite(e);
      e = adamw_elem(pw.z, gw.z, mw.z, vw.z, scale, decay, p), pw.z = e.param, mw.z = e.m, vw.z = e.v, bad |= !finite(e);
      e = adamw_elem(pw.w, gw.w, mw.w, vw.w, scale, decay, p), pw.w = e.param, mw.w = e.m, vw.w = e.v, bad |= !finite(e);
      *reinterpret_cast<float4*>(p.param + j) = pw;
      *reinterpret_cast<float4*>(p.m + j) = mw;
      *reinterpret_cast<float4*>(p.v + j) = vw;
      if (p.param_bf16) {
        uint2 raw;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
        h[0] = __floats2bfloat162_rn(pw.x, pw.y);
        h[1] = __floats2bfloat162_rn(pw.z, pw.w);
        *reinterpret_cast<uint2*>(p.param_bf16 + j) = raw;
      }
    }
  }
  if (bad && p.nonfinite) atomicOr(p.nonfinite, 1);
}

struct NormParams {
  double* out;         // (1)
  double* partial;     // (G)
  const float* x;      // (n)
  int64_t n;
  int blocks;          // G
};

template <bool kVec4>
__global__ void sum_squares_partial_kernel(NormParams p) {
  __shared__ double red[detail::kWarp];
  const int64_t stride = (int64_t)p.blocks * blockDim.x;
  double s = 0.0;
  if constexpr (kVec4) {
    const int64_t n_vec = p.n / 4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
      const float4 v = reinterpret_cast<const float4*>(p.x)[i];
      s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    if (blockIdx.x == 0 && threadIdx.x < p.n % 4) {
      const double v = p.x[n_vec * 4 + threadIdx.x];
      s += v * v;
    }
  } else {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
      const double v = p.x[i];
      s += v * v;
    }
  }
  s = detail::block_sum(s, red);
  if (threadIdx.x == 0) p.partial[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(NormParams p) {
  __shared__ double red[detail::kWarp];
  double s = threadIdx.x < p.blocks ? p.partial[threadIdx.x] : 0.0;
  s = detail::block_sum(s, red);
  if (threadIdx.x == 0) *p.out = s;
}

__global__ void clip_scale_kernel(float* scale, double* norm, const double* sumsq, double max_norm) {
  const double nrm = sqrt(*sumsq);
  if (norm) *norm = nrm;
  double s = 1.0;
  if (max_norm > 0) {
    const double c = max_norm / (nrm + 1e-6);
    if (c < 1.0) s = c;
  }
  *scale = (float)s;
}

int norm_blocks(int64_t n) {
  return (int)std::max<int64_t>(1, std::min<int64_t>(kNormBlocks, (n + kNormElemsPerBlock - 1) / kNormElemsPerBlock));
}

bool aligned(const void* ptr, uintptr_t a) { return (reinterpret_cast<uintptr_t>(ptr) & (a - 1)) == 0; }

void launch_adamw(const AdamWKernelParams& p, int n_chunks, cudaStream_t stream) {
  const bool vec4 = aligned(p.param, 16) && aligned(p.grad, 16) && aligned(p.m, 16) && aligned(p.v, 16) &&
                    (!p.param_bf16 || aligned(p.param_bf16, 8));
  if (vec4) {
    adamw_kernel<true><<<n_chunks, kThreads, 0, stream>>>(p);
  } else {
    adamw_kernel<false><<<n_chunks, kThreads, 0, stream>>>(p);
  }
  TT_CUDA_CHECK_LAUNCH();
}

void launch_sum_squares(const NormParams& p, cudaStream_t stream) {
  if (aligned(p.x, 16)) {
    sum_squares_partial_kernel<true><<<p.blocks, kThreads, 0, stream>>>(p);
  } else {
    sum_squares_partial_kernel<false><<<p.blocks, kThreads, 0, stream>>>(p);
  }
  TT_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kNormBlocks, 0, stream>>>(p);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::vector<AdamWChunk> adamw_chunks(const std::vector<AdamWTensor>& tensors, int64_t chunk_elems) {
  TT_CHECK(chunk_elems > 0 && chunk_elems < ((int64_t)1 << 31), "cuda::adamw_chunks: chunk_elems=", chunk_elems,
           ", expected in [1, 2^31)");
  std::vector<AdamWChunk> out;
  for (size_t i = 0; i < tensors.size(); i++) {
    const AdamWTensor& t = tensors[i];
    TT_CHECK(t.offset >= 0 && t.numel >= 0, "cuda::adamw_chunks: tensor ", i, " has offset ", t.offset,
             " and numel ", t.numel, ", expected both >= 0");
    for (int64_t o = 0; o < t.numel; o += chunk_elems) {
      out.push_back(AdamWChunk{t.offset + o, (int32_t)std::min(chunk_elems, t.numel - o), t.decay ? 1 : 0});
    }
  }
  return out;
}

void adamw_update(float* param, bf16* param_bf16, const float* grad, float* m, float* v, const AdamWChunk* chunks,
                  int n_chunks, const AdamWParams& p, const float* grad_scale_dev, cudaStream_t stream,
                  int* nonfinite) {
  TT_CHECK(n_chunks >= 0, "cuda::adamw_update: expected n_chunks >= 0, got ", n_chunks);
  TT_CHECK(p.step >= 1, "cuda::adamw_update: step is 1-based, got ", p.step);
  TT_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1,
           "cuda::adamw_update: expected betas in [0, 1), got beta1=", p.beta1, " beta2=", p.beta2);
  if (n_chunks == 0) return;
  TT_CHECK(param && grad && m && v && chunks, "cuda::adamw_update: null pointer (param, grad, m, v or chunks)");
  AdamWKernelParams k{};
  k.param = param, k.param_bf16 = param_bf16, k.grad = grad, k.m = m, k.v = v, k.chunks = chunks;
  k.grad_scale_dev = grad_scale_dev;
  k.nonfinite = nonfinite;
  k.grad_scale = (float)p.grad_scale;
  k.beta1 = (float)p.beta1, k.beta2 = (float)p.beta2;
  k.one_minus_beta1 = (float)(1.0 - p.beta1), k.one_minus_beta2 = (float)(1.0 - p.beta2);
  k.step_size = (float)(p.lr / (1.0 - std::pow(p.beta1, (double)p.step)));
  k.inv_bc2_sqrt = (float)(1.0 / std::sqrt(1.0 - std::pow(p.beta2, (double)p.step)));
  k.eps = (float)p.eps;
  k.decay_factor = (float)(1.0 - p.lr * p.weight_decay);
  launch_adamw(k, n_chunks, stream);
}

size_t sum_squares_workspace_bytes(int64_t n) {
  detail::WorkspaceCarver w;
  w.take<double>(norm_blocks(n));
  return w.bytes();
}

void sum_squares(double* out, const float* x, int64_t n, Workspace ws, cudaStream_t stream) {
  TT_CHECK(n >= 0, "cuda::sum_squares: expected n >= 0, got ", n);
  TT_CHECK(out && (n == 0 || x), "cuda::sum_squares: null pointer (out or x)");
  detail::check_workspace(ws, sum_squares_workspace_bytes(n), "cuda::sum_squares");
  detail::WorkspaceCarver carve(ws.ptr);
  NormParams p{out, nullptr, x, n, norm_blocks(n)};
  p.partial = carve.take<double>(p.blocks);
  launch_sum_squares(p, stream);
}

void clip_scale(float* scale, double* norm, const double* sumsq, double max_norm, cudaStream_t stream) {
  TT_CHECK(scale && sumsq, "cuda::clip_scale: null pointer (scale or sumsq)");
  clip_scale_kernel<<<1, 1, 0, stream>>>(scale, norm, sumsq, max_norm);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
