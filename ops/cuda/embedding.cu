// Token embedding lookup and its deterministic scatter-add gradient (see embedding.h).
// Gradient contract: embedding_forward overwrites out (N, C); embedding_backward accumulates (+=)
// into dwte (V, C) fp32.
#include "ops/cuda/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

using detail::load_bf16;
using detail::load_f32;
using detail::store_bf16;
using detail::store_f32;

constexpr int kThreads = 256;

struct EmbeddingFwdParams {
  bf16* out;              // (N, C)
  const int32_t* tokens;  // (N)
  const bf16* wte;        // (V, C)
  int N, C, V;
};

struct EmbeddingBwdParams {
  float* dwte;                   // (V, C) +=
  const bf16* dout;              // (N, C)
  const uint32_t* sorted_tok;    // (N) tokens sorted ascending (negative ids sort last)
  const int32_t* sorted_row;     // (N) packed row of each sorted token, ascending within a token
  int N, C, V;
};

// One block per packed row; threads stride over the row's VEC-wide column groups.
template <int VEC>
__global__ void embedding_forward_kernel(EmbeddingFwdParams p) {
  const int n = blockIdx.x;
  const int tok = p.tokens[n];
  bf16* o = p.out + (int64_t)n * p.C;
  if (tok < 0 || tok >= p.V) {
    float nan[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) nan[k] = __int_as_float(0x7fc00000);
    for (int c = threadIdx.x * VEC; c < p.C; c += blockDim.x * VEC) store_bf16<VEC>(o + c, nan);
    return;
  }
  const bf16* row = p.wte + (int64_t)tok * p.C;
  for (int c = threadIdx.x * VEC; c < p.C; c += blockDim.x * VEC) {
    if constexpr (VEC == 8) {
      *reinterpret_cast<uint4*>(o + c) = *reinterpret_cast<const uint4*>(row + c);
    } else {
      o[c] = row[c];
    }
  }
}

__global__ void iota_kernel(int32_t* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = i;
}

// Grid (N, column tiles). Block i handles sorted position i only if it starts a run of equal
// tokens: it sums the run's rows in order (fp32) and adds the sum to dwte once.
template <int VEC>
__global__ void embedding_backward_kernel(EmbeddingBwdParams p) {
  const int i = blockIdx.x;
  const uint32_t tok = p.sorted_tok[i];
  if ((i > 0 && p.sorted_tok[i - 1] == tok) || tok >= (uint32_t)p.V) return;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (c >= p.C) return;
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; k++) acc[k] = 0.f;
  for (int j = i; j < p.N && p.sorted_tok[j] == tok; j++) {
    float g[VEC];
    load_bf16<VEC>(g, p.dout + (int64_t)p.sorted_row[j] * p.C + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] += g[k];
  }
  float* d = p.dwte + (int64_t)tok * p.C + c;
  float cur[VEC];
  load_f32<VEC>(cur, d);
#pragma unroll
  for (int k = 0; k < VEC; k++) cur[k] += acc[k];
  store_f32<VEC>(d, cur);
}

struct BwdLayout {
  int32_t* iota;
  uint32_t* sorted_tok;
  int32_t* sorted_row;
  void* sort_temp;
  size_t sort_temp_bytes;
};

BwdLayout carve_bwd(void* base, int N) {
  detail::WorkspaceCarver w(base);
  BwdLayout l{};
  l.iota = w.take<int32_t>(N);
  l.sorted_tok = w.take<uint32_t>(N);
  l.sorted_row = w.take<int32_t>(N);
  TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, l.sort_temp_bytes, (const uint32_t*)nullptr,
                                                (uint32_t*)nullptr, (const int32_t*)nullptr,
                                                (int32_t*)nullptr, N));
  l.sort_temp = w.take<char>(l.sort_temp_bytes);
  return l;
}

size_t bwd_bytes(int N) {
  detail::WorkspaceCarver w;
  w.take<int32_t>(N);
  w.take<uint32_t>(N);
  w.take<int32_t>(N);
  size_t temp = 0;
  TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, (const uint32_t*)nullptr, (uint32_t*)nullptr,
                                                (const int32_t*)nullptr, (int32_t*)nullptr, N));
  w.take<char>(temp);
  return w.bytes();
}

void launch_embedding_forward(const EmbeddingFwdParams& p, cudaStream_t stream) {
  const bool wide = p.C % 8 == 0 && detail::aligned16(p.out) && detail::aligned16(p.wte);
  TT_VEC_SWITCH(wide, VEC, [&] {
    embedding_forward_kernel<VEC><<<p.N, kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

void launch_embedding_backward(EmbeddingBwdParams p, const int32_t* tokens, const BwdLayout& l,
                               cudaStream_t stream) {
  iota_kernel<<<(p.N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(l.iota, p.N);
  TT_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = l.sort_temp_bytes;
  // All 32 bits: negative ids become large unsigned keys and sort after every valid id.
  TT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(l.sort_temp, temp_bytes,
                                                reinterpret_cast<const uint32_t*>(tokens), l.sorted_tok,
                                                l.iota, l.sorted_row, p.N, 0, 32, stream));
  p.sorted_tok = l.sorted_tok;
  p.sorted_row = l.sorted_row;
  const bool wide = p.C % 8 == 0 && detail::aligned16(p.dout) && detail::aligned16(p.dwte);
  TT_VEC_SWITCH(wide, VEC, [&] {
    const int groups = (p.C + VEC - 1) / VEC;
    const dim3 grid(p.N, (groups + kThreads - 1) / kThreads);
    embedding_backward_kernel<VEC><<<grid, kThreads, 0, stream>>>(p);
  });
  TT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, int V,
                       cudaStream_t stream) {
  TT_CHECK(N >= 0 && C > 0 && V > 0, "cuda::embedding_forward: expected N >= 0, C > 0, V > 0, got N=", N,
           " C=", C, " V=", V);
  if (N == 0) return;
  TT_CHECK(out && tokens && wte, "cuda::embedding_forward: null pointer (out, tokens or wte)");
  launch_embedding_forward(EmbeddingFwdParams{out, tokens, wte, N, C, V}, stream);
}

size_t embedding_backward_workspace_bytes(int N) { return N > 0 ? bwd_bytes(N) : 0; }

void embedding_backward(float* dwte, const bf16* dout, const int32_t* tokens, int N, int C, int V,
                        Workspace ws, cudaStream_t stream) {
  TT_CHECK(N >= 0 && C > 0 && V > 0, "cuda::embedding_backward: expected N >= 0, C > 0, V > 0, got N=", N,
           " C=", C, " V=", V);
  if (N == 0) return;
  TT_CHECK(dwte && dout && tokens, "cuda::embedding_backward: null pointer (dwte, dout or tokens)");
  detail::check_workspace(ws, bwd_bytes(N), "cuda::embedding_backward");
  const BwdLayout l = carve_bwd(ws.ptr, N);
  launch_embedding_backward(EmbeddingBwdParams{dwte, dout, nullptr, nullptr, N, C, V}, tokens, l,
                            stream);
}

}  // namespace tt::cuda
