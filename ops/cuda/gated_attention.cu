// Qwen3.5's gated attention, CUDA (see gated_attention.h).
#include "ops/cuda/gated_attention.h"

#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

__global__ void gate_forward_kernel(bf16* y, const bf16* x, const bf16* gate, int64_t n) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e < n) y[e] = __float2bfloat16(__bfloat162float(x[e]) * sigmoidf(__bfloat162float(gate[e])));
}

// Reads dy before writing dx, so dx may alias dy (one element per thread).
__global__ void gate_backward_kernel(bf16* dx, bf16* dgate, const bf16* dy, const bf16* x, const bf16* gate,
                                     int64_t n) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const float d = __bfloat162float(dy[e]), s = sigmoidf(__bfloat162float(gate[e]));
  dgate[e] = __float2bfloat16(d * __bfloat162float(x[e]) * s * (1.f - s));
  dx[e] = __float2bfloat16(d * s);
}

void check(int N, int H, int D, const char* op) {
  TT_CHECK(N >= 0 && H > 0 && D > 0, op, ": expected N >= 0, H > 0, D > 0, got N=", N, " H=", H, " D=", D);
}

// rows (N H) of `width` elements from src (pitch src_pitch elements) to dst (pitch dst_pitch).
void copy_rows(bf16* dst, int dst_pitch, const bf16* src, int src_pitch, int64_t rows, int width,
               cudaStream_t stream) {
  if (rows == 0) return;
  TT_CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(bf16) * (size_t)dst_pitch, src, sizeof(bf16) * (size_t)src_pitch,
                                  sizeof(bf16) * (size_t)width, (size_t)rows, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void split_heads(bf16* a, bf16* b, const bf16* ab, int N, int H, int D, cudaStream_t stream) {
  check(N, H, D, "split_heads");
  const int64_t rows = (int64_t)N * H;
  copy_rows(a, D, ab, 2 * D, rows, D, stream);
  copy_rows(b, D, ab + D, 2 * D, rows, D, stream);
}

void merge_heads(bf16* ab, const bf16* a, const bf16* b, int N, int H, int D, cudaStream_t stream) {
  check(N, H, D, "merge_heads");
  const int64_t rows = (int64_t)N * H;
  copy_rows(ab, 2 * D, a, D, rows, D, stream);
  copy_rows(ab + D, 2 * D, b, D, rows, D, stream);
}

void sigmoid_gate_forward(bf16* y, const bf16* x, const bf16* gate, int64_t n, cudaStream_t stream) {
  TT_CHECK(n >= 0, "sigmoid_gate_forward: n = ", n);
  if (n == 0) return;
  gate_forward_kernel<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(y, x, gate, n);
  TT_CUDA_CHECK_LAUNCH();
}

void sigmoid_gate_backward(bf16* dx, bf16* dgate, const bf16* dy, const bf16* x, const bf16* gate, int64_t n,
                           cudaStream_t stream) {
  TT_CHECK(n >= 0, "sigmoid_gate_backward: n = ", n);
  if (n == 0) return;
  gate_backward_kernel<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(dx, dgate, dy, x, gate, n);
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace tt::cuda
