// Rotary position embedding forward and backward (see rope.h), on bf16 or fp32 rows.
// Gradient contract: both rotate x (N, H, HS) in place; the backward by the inverse angle.
//
// One block per token: its HS/2 cos/sin pairs are computed once in fp64 into shared memory (an
// angle pos * inv_freq reaches thousands of radians at deep positions, where fp32 sin/cos of an
// fp32 angle would lose digits), then every head of the token is rotated with VEC-wide accesses.
#include "ops/cuda/rope.h"

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

using detail::load_row;
using detail::store_row;

constexpr int kThreads = 128;
constexpr int kMaxHalf = 512;  // HS <= 1024

template <class T>
struct RopeParams {
  T* x;                  // (N, H, HS) in place, bf16 or fp32
  const int32_t* pos;    // (N)
  int N, H, HS;
  double theta;
  double sign;           // +1 forward, -1 backward
  int R;                 // rotary dims: the first R of each head rotate (R = HS: all)
};

template <class T, int VEC>
__global__ void rope_kernel(RopeParams<T> p) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int n = blockIdx.x;
  const int half = p.R / 2;
  const int32_t pos = p.pos[n];
  for (int d = threadIdx.x; d < half; d += blockDim.x) {
    float s;
    detail::rope_cos_sin(&cs[d], &s, pos, d, p.R, p.theta);
    sn[d] = p.sign < 0 ? -s : s;
  }
  __syncthreads();
  const int groups = half / VEC;  // VEC-wide groups per head half
  T* xt = p.x + (int64_t)n * p.H * p.HS;
  for (int i = threadIdx.x; i < p.H * groups; i += blockDim.x) {
    const int h = i / groups, d = (i % groups) * VEC;
    T* x1p = xt + (int64_t)h * p.HS + d;
    T* x2p = x1p + half;
    float x1[VEC], x2[VEC], o1[VEC], o2[VEC];
    load_row<VEC>(x1, x1p);
    load_row<VEC>(x2, x2p);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      o1[k] = x1[k] * cs[d + k] - x2[k] * sn[d + k];
      o2[k] = x2[k] * cs[d + k] + x1[k] * sn[d + k];
    }
    store_row<VEC>(x1p, o1);
    store_row<VEC>(x2p, o2);
  }
}

// cs[n * half + rope_table_slot(d)] = (cos, sin) of position n's angle d.
__global__ void rope_table_kernel(float2* cs, const int32_t* pos, int N, int HS, double theta) {
  const int half = HS / 2;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (int64_t)N * half) return;
  const int n = (int)(i / half), d = (int)(i % half);
  float c, s;
  detail::rope_cos_sin(&c, &s, pos[n], d, HS, theta);
  cs[(int64_t)n * half + rope_table_slot(d, HS)] = make_float2(c, s);
}

template <class T>
void launch_rope(const RopeParams<T>& p, cudaStream_t stream) {
  // 8-wide accesses: 16 bytes of bf16, two 16-byte vectors of fp32 (every row and half stays aligned).
  const bool wide = (p.R / 2) % 8 == 0 && p.HS % 8 == 0 && detail::aligned16(p.x);
  TT_VEC_SWITCH(wide, VEC, [&] { rope_kernel<T, VEC><<<p.N, kThreads, 0, stream>>>(p); });
  TT_CUDA_CHECK_LAUNCH();
}

template <class T>
void rope(T* x, const int32_t* pos, int N, int H, int HS, double theta, double sign, const char* op,
          cudaStream_t stream, int rotary_dim) {
  TT_CHECK(N >= 0 && H > 0 && HS > 0 && HS % 2 == 0 && HS / 2 <= kMaxHalf, op,
           ": expected N >= 0, H > 0 and an even HS in [2, ", 2 * kMaxHalf, "], got N=", N, " H=", H,
           " HS=", HS);
  const int R = rotary_dim > 0 ? rotary_dim : HS;
  TT_CHECK(R % 2 == 0 && R <= HS, op, ": expected an even rotary_dim <= HS = ", HS, ", got ", rotary_dim);
  TT_CHECK(theta > 0, op, ": expected rope theta > 0, got ", theta);
  if (N == 0) return;
  TT_CHECK(x && pos, op, ": null pointer (x or pos)");
  launch_rope(RopeParams<T>{x, pos, N, H, HS, theta, sign, R}, stream);
}

}  // namespace

void rope_forward(bf16* x, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                  int rotary_dim) {
  rope(x, pos, N, H, HS, theta, 1.0, "cuda::rope_forward", stream, rotary_dim);
}

void rope_backward(bf16* dx, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                  int rotary_dim) {
  rope(dx, pos, N, H, HS, theta, -1.0, "cuda::rope_backward", stream, rotary_dim);
}

void rope_forward(float* x, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                  int rotary_dim) {
  rope(x, pos, N, H, HS, theta, 1.0, "cuda::rope_forward", stream, rotary_dim);
}

void rope_backward(float* dx, const int32_t* pos, int N, int H, int HS, double theta, cudaStream_t stream,
                  int rotary_dim) {
  rope(dx, pos, N, H, HS, theta, -1.0, "cuda::rope_backward", stream, rotary_dim);
}

void rope_table(float2* cs, const int32_t* pos, int N, int HS, double theta, cudaStream_t stream) {
  TT_CHECK(N >= 0 && HS > 0 && HS % 16 == 0,
           "cuda::rope_table: expected N >= 0 and HS a positive multiple of 16, got N=", N, " HS=", HS);
  TT_CHECK(theta > 0, "cuda::rope_table: expected rope theta > 0, got ", theta);
  if (N == 0) return;
  TT_CHECK(cs && pos, "cuda::rope_table: null pointer (cs or pos)");
  const int64_t n = (int64_t)N * (HS / 2);
  constexpr int kTableThreads = 256;
  rope_table_kernel<<<(unsigned)((n + kTableThreads - 1) / kTableThreads), kTableThreads, 0, stream>>>(cs, pos, N, HS,
                                                                                                   theta);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
