// Segment retrieval, CUDA (see retrieval.h). Per long-range KV head g: a kernel scores every pool
// row into a 64-bit sort key (the fp32 score's bits made order-preserving, then the row
// complemented, so one descending radix sort puts the higher score first and, on equal scores,
// the lower row), CUB's radix sort orders the keys, and the first R rows, sorted ascending, are
// the selection.
#include "ops/cuda/retrieval.h"

#include <cub/device/device_radix_sort.cuh>

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxQ = 16 * 256;  // G x HS floats of the query group in shared memory

__device__ __forceinline__ uint32_t order_bits(float s) {  // monotone: a < b  <=>  bits(a) < bits(b)
  const uint32_t u = __float_as_uint(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Warp per pool row: score = sum over h in g's group of q_h . k_{row, g}.
__global__ void score_keys_kernel(uint64_t* keys, const bf16* q, const bf16* pool_k, int P, int NL, int HS, int G,
                                  int g, int slot) {
  __shared__ float qs[kMaxQ];
  for (int e = threadIdx.x; e < G * HS; e += blockDim.x)
    qs[e] = __bfloat162float(q[(int64_t)g * G * HS + e]);  // heads g G .. g G + G - 1 are contiguous
  __syncthreads();
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int row = blockIdx.x * (kThreads / detail::kWarp) + warp;
  if (row >= P) return;
  const bf16* k = pool_k + ((int64_t)row * NL + slot) * HS;
  float s = 0.f;
  for (int d = lane; d < HS; d += detail::kWarp) {
    const float kd = __bfloat162float(k[d]);
    for (int h = 0; h < G; ++h) s = fmaf(qs[h * HS + d], kd, s);
  }
  s = detail::warp_sum(s);
  if (lane == 0) keys[row] = ((uint64_t)order_bits(s) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)row);
}

__global__ void top_rows_kernel(int32_t* rows, const uint64_t* sorted, int R) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < R) rows[r] = (int32_t)(0xFFFFFFFFu - (uint32_t)(sorted[r] & 0xFFFFFFFFull));
}

__global__ void gather_kernel(bf16* out, const bf16* pool, const int32_t* idx, int R, int NKV, int HS,
                              uint64_t heads) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (int64_t)R * NKV * HS) return;
  const int d = (int)(e % HS), g = (int)(e / HS % NKV), r = (int)(e / HS / NKV);
  const int NL = __popcll(heads), slot = __popcll(heads & ((1ull << g) - 1));
  out[e] = ((heads >> g) & 1) ? pool[((int64_t)idx[(int64_t)g * R + r] * NL + slot) * HS + d] : __float2bfloat16(0.f);
}

struct Scratch {
  uint64_t* keys_in;
  uint64_t* keys_out;
  int32_t* top;
  void* temp;
  size_t temp_bytes;
  size_t bytes;
  Scratch(int P, int R, void* base) {
    size_t sort_keys = 0, sort_rows = 0;
    TT_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort_keys, (const uint64_t*)nullptr,
                                                           (uint64_t*)nullptr, P));
    TT_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, sort_rows, (const int32_t*)nullptr, (int32_t*)nullptr, R));
    temp_bytes = sort_keys > sort_rows ? sort_keys : sort_rows;
    detail::WorkspaceCarver c(base);
    keys_in = c.take<uint64_t>(P);
    keys_out = c.take<uint64_t>(P);
    top = c.take<int32_t>(R);
    temp = c.take<char>(temp_bytes);
    bytes = c.bytes();
  }
};

}  // namespace

size_t retrieval_select_workspace_bytes(int P, int R) { return Scratch(P, R, nullptr).bytes; }

void retrieval_select(int32_t* idx, const bf16* q, const bf16* pool_k, int P, int NH, int NKV, int HS,
                      uint64_t heads, int R, Workspace ws, cudaStream_t stream) {
  TT_CHECK(P >= 0 && NH > 0 && NKV > 0 && NH % NKV == 0 && HS > 0 && NKV <= 64, "retrieval_select: P=", P, " NH=", NH,
           " NKV=", NKV, " HS=", HS, ", expected NH a multiple of NKV <= 64");
  TT_CHECK(R >= 0 && R <= P, "retrieval_select: R=", R, " rows of a pool of ", P);
  const int G = NH / NKV, NL = __builtin_popcountll(heads);
  TT_CHECK(G * HS <= kMaxQ, "retrieval_select: ", G, " query heads of ", HS, " per KV head, at most ", kMaxQ,
           " values");
  if (R == 0) return;
  Scratch s(P, R, ws.ptr);
  detail::check_workspace(ws, s.bytes, "retrieval_select");
  for (int g = 0, slot = 0; g < NKV; ++g) {
    int32_t* out = idx + (int64_t)g * R;
    if (!((heads >> g) & 1)) {
      TT_CUDA_CHECK(cudaMemsetAsync(out, 0xFF, sizeof(int32_t) * (size_t)R, stream));  // -1
      continue;
    }
    const int rows_per_block = kThreads / detail::kWarp;
    score_keys_kernel<<<(P + rows_per_block - 1) / rows_per_block, kThreads, 0, stream>>>(s.keys_in, q, pool_k, P,
                                                                                          NL, HS, G, g, slot++);
    TT_CUDA_CHECK(cudaGetLastError());
    size_t temp = s.temp_bytes;
    TT_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(s.temp, temp, s.keys_in, s.keys_out, P, 0, 64, stream));
    top_rows_kernel<<<(R + 255) / 256, 256, 0, stream>>>(s.top, s.keys_out, R);
    TT_CUDA_CHECK(cudaGetLastError());
    temp = s.temp_bytes;
    TT_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(s.temp, temp, s.top, out, R, 0, 32, stream));
  }
}

void retrieval_gather(bf16* out, const bf16* pool, const int32_t* idx, int R, int NKV, int HS, uint64_t heads,
                      cudaStream_t stream) {
  const int64_t n = (int64_t)R * NKV * HS;
  if (n == 0) return;
  gather_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, pool, idx, R, NKV, HS, heads);
  TT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tt::cuda
