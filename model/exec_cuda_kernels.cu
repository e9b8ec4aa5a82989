// Elementwise glue kernels of the CUDA execution backend (see exec_cuda_kernels.h). Grid-stride loops;
// 8-wide (16-byte) accesses when every pointer is 16-byte aligned and the length a multiple of
// 8, else scalar.
#include "model/exec_cuda_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::model::detail {
namespace {

constexpr int kThreads = 256;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return (int)std::max<int64_t>(1, std::min<int64_t>(b, 132 * 16));
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return raw;
}

__global__ void f32_to_bf16_vec(bf16* __restrict__ out, const float* __restrict__ in, int64_t n8) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
    const float4 a = reinterpret_cast<const float4*>(in)[2 * i];
    const float4 b = reinterpret_cast<const float4*>(in)[2 * i + 1];
    const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    reinterpret_cast<uint4*>(out)[i] = pack8(f);
  }
}

__global__ void f32_to_bf16_scalar(bf16* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void residual_add_vec(bf16* __restrict__ out, const bf16* __restrict__ x, const float* __restrict__ y,
                                 int64_t n8) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
    float f[8];
    unpack8(reinterpret_cast<const uint4*>(x)[i], f);
    const float4 a = reinterpret_cast<const float4*>(y)[2 * i];
    const float4 b = reinterpret_cast<const float4*>(y)[2 * i + 1];
    f[0] += a.x, f[1] += a.y, f[2] += a.z, f[3] += a.w;
    f[4] += b.x, f[5] += b.y, f[6] += b.z, f[7] += b.w;
    reinterpret_cast<uint4*>(out)[i] = pack8(f);
  }
}

__global__ void residual_add_scalar(bf16* __restrict__ out, const bf16* __restrict__ x, const float* __restrict__ y,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + y[i]);
}

__global__ void add_inplace_f32(bf16* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + x[i]);
}

// One block per source row r: dst[rows[r]] += src[r] in fp32 (rows distinct within a call).
__global__ void add_rows_f32(float* __restrict__ dst, const int32_t* __restrict__ rows, const float* __restrict__ src,
                             int cols) {
  const int r = blockIdx.x;
  float* d = dst + (int64_t)rows[r] * cols;
  const float* s = src + (int64_t)r * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] += s[c];
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f32(float& d, float x) { d = x; }
__device__ __forceinline__ void from_f32(bf16& d, float x) { d = __float2bfloat16(x); }

template <class D, class S>
__global__ void add_rows_mixed(D* __restrict__ dst, const int32_t* __restrict__ dst_rows, const S* __restrict__ src,
                               const int32_t* __restrict__ src_rows, int cols) {
  const int i = blockIdx.x;
  D* d = dst + (int64_t)dst_rows[i] * cols;
  const S* x = src + (int64_t)src_rows[i] * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) from_f32(d[c], to_f32(d[c]) + to_f32(x[c]));
}

__global__ void add_cols_bf16(bf16* __restrict__ out, const bf16* __restrict__ in, int out_cols, int col0, int cols) {
  const int r = blockIdx.x;
  bf16* o = out + (int64_t)r * out_cols + col0;
  const bf16* x = in + (int64_t)r * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = __float2bfloat16(__bfloat162float(o[c]) + __bfloat162float(x[c]));
}

// One block per row: copies `cols` elements E (uint4 = 8 bf16, or one bf16) of row rows[r] (gather)
// or of row r (scatter).
template <class E, bool kScatter>
__global__ void move_rows(bf16* __restrict__ out, const bf16* __restrict__ in, const int32_t* __restrict__ rows,
                          int cols) {
  const int r = blockIdx.x;
  const int64_t src = kScatter ? r : rows[r];
  const int64_t dst = kScatter ? rows[r] : r;
  const E* s = reinterpret_cast<const E*>(in) + src * cols;
  E* d = reinterpret_cast<E*>(out) + dst * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

__device__ __forceinline__ uint64_t splitmix_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Pair k uses the generator's outputs 2k and 2k + 1: output j is mix(state + (j + 1) * gamma).
__global__ void init_normal_kernel(float* __restrict__ w, int64_t n, uint64_t state, double stddev) {
  const uint64_t kGamma = 0x9e3779b97f4a7c15ull;
  const double kTwoPi = 6.283185307179586476925286766559;
  const int64_t pairs = (n + 1) / 2;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < pairs; k += (int64_t)gridDim.x * blockDim.x) {
    const uint64_t z1 = splitmix_mix(state + (uint64_t)(2 * k + 1) * kGamma);
    const uint64_t z2 = splitmix_mix(state + (uint64_t)(2 * k + 2) * kGamma);
    const double u1 = 1.0 - double(z1 >> 11) * 0x1.0p-53;
    const double u2 = double(z2 >> 11) * 0x1.0p-53;
    const double r = __dsqrt_rn(__dmul_rn(-2.0, log(u1)));
    const double sr = __dmul_rn(stddev, r);
    w[2 * k] = (float)__dmul_rn(sr, cos(__dmul_rn(kTwoPi, u2)));
    if (2 * k + 1 < n) w[2 * k + 1] = (float)__dmul_rn(sr, sin(__dmul_rn(kTwoPi, u2)));
  }
}

__global__ void fill_kernel(float* __restrict__ w, int64_t n, float value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    w[i] = value;
}

}  // namespace

void f32_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  TT_CHECK(out && in, "model::detail::f32_to_bf16: null pointer");
  if (n % 8 == 0 && aligned16(out) && aligned16(in)) {
    f32_to_bf16_vec<<<blocks_for(n / 8), kThreads, 0, stream>>>(out, in, n / 8);
  } else {
    f32_to_bf16_scalar<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  }
  TT_CUDA_CHECK_LAUNCH();
}

void residual_add(bf16* out, const bf16* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  TT_CHECK(out && x && y, "model::detail::residual_add: null pointer");
  if (n % 8 == 0 && aligned16(out) && aligned16(x) && aligned16(y)) {
    residual_add_vec<<<blocks_for(n / 8), kThreads, 0, stream>>>(out, x, y, n / 8);
  } else {
    residual_add_scalar<<<blocks_for(n), kThreads, 0, stream>>>(out, x, y, n);
  }
  TT_CUDA_CHECK_LAUNCH();
}

void add_inplace(bf16* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  TT_CHECK(y && x, "model::detail::add_inplace: null pointer");
  add_inplace_f32<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  TT_CUDA_CHECK_LAUNCH();
}

void add_rows(float* dst, const int32_t* rows, const float* src, int R, int C, cudaStream_t stream) {
  if (R <= 0 || C <= 0) return;
  TT_CHECK(dst && rows && src, "model::detail::add_rows: null pointer");
  add_rows_f32<<<R, 128, 0, stream>>>(dst, rows, src, C);
  TT_CUDA_CHECK_LAUNCH();
}

template <class D, class S>
static void add_rows_impl(D* dst, const int32_t* dst_rows, const S* src, const int32_t* src_rows, int n, int C,
                          cudaStream_t stream) {
  if (n <= 0 || C <= 0) return;
  TT_CHECK(dst && dst_rows && src && src_rows, "model::detail::add_rows: null pointer");
  add_rows_mixed<D, S><<<n, 128, 0, stream>>>(dst, dst_rows, src, src_rows, C);
  TT_CUDA_CHECK_LAUNCH();
}

void add_rows(bf16* dst, const int32_t* dst_rows, const float* src, const int32_t* src_rows, int n, int C,
              cudaStream_t stream) {
  add_rows_impl(dst, dst_rows, src, src_rows, n, C, stream);
}

void add_rows(float* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int n, int C,
              cudaStream_t stream) {
  add_rows_impl(dst, dst_rows, src, src_rows, n, C, stream);
}

void add_rows(float* dst, const int32_t* dst_rows, const float* src, const int32_t* src_rows, int n, int C,
              cudaStream_t stream) {
  add_rows_impl(dst, dst_rows, src, src_rows, n, C, stream);
}

void add_cols(bf16* out, const bf16* in, int N, int out_cols, int col0, int cols, cudaStream_t stream) {
  if (N <= 0 || cols <= 0) return;
  TT_CHECK(out && in && col0 >= 0 && col0 + cols <= out_cols, "model::detail::add_cols: columns [", col0, ", +",
           cols, ") of rows of ", out_cols);
  add_cols_bf16<<<N, 128, 0, stream>>>(out, in, out_cols, col0, cols);
  TT_CUDA_CHECK_LAUNCH();
}

namespace {

template <bool kScatter>
void move(bf16* out, const bf16* in, const int32_t* rows, int R, int C, cudaStream_t stream) {
  if (R <= 0 || C <= 0) return;
  TT_CHECK(out && in && rows, "model::detail::gather/scatter_rows: null pointer");
  if (C % 8 == 0 && aligned16(out) && aligned16(in)) {
    move_rows<uint4, kScatter><<<R, 128, 0, stream>>>(out, in, rows, C / 8);
  } else {
    move_rows<bf16, kScatter><<<R, 128, 0, stream>>>(out, in, rows, C);
  }
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gather_rows(bf16* out, const bf16* in, const int32_t* rows, int R, int C, cudaStream_t stream) {
  move<false>(out, in, rows, R, C, stream);
}

void scatter_rows(bf16* out, const bf16* in, const int32_t* rows, int R, int C, cudaStream_t stream) {
  move<true>(out, in, rows, R, C, stream);
}

void init_normal(float* w, int64_t n, uint64_t state, double stddev, cudaStream_t stream) {
  if (n <= 0) return;
  init_normal_kernel<<<blocks_for((n + 1) / 2), kThreads, 0, stream>>>(w, n, state, stddev);
  TT_CUDA_CHECK_LAUNCH();
}

void fill(float* w, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, n, value);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::model::detail
