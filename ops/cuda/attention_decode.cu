// The attention primitive's decode mode (see attention_decode.h): partial-softmax kernel over
// (key chunk, row group, KV head) items, then a merge per (row, query head) with the row's own key.
//
// Item table (built on the host, copied once per call into the workspace): prefix e's keys are cut
// into chunks of kChunk, its query range into groups of at most rows_per_item rows (so that
// rows x query heads per KV head <= kQMax). Per item and KV head the partial kernel stages each
// tile of kTile keys (K padded to an odd word stride, so the score loop reads shared memory without
// bank conflicts; V unpadded, read along the head dim) and keeps for each of its Q query vectors
// the running max m, sum l and the weighted values acc (fp32, online softmax). The merge kernel
// takes, for row i and query head h, every item holding row i (a CSR list) and the row's own key:
// M = max(m_j, s_own), out = (sum_j acc_j e^(m_j - M) + e^(s_own - M) v_own) / L,
// L = sum_j l_j e^(m_j - M) + e^(s_own - M), lse = M + log L. Deterministic: fixed orders.
#include "ops/cuda/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 128;  // partial kernel
constexpr int kTile = 64;      // keys per shared-memory tile
constexpr int kChunk = 256;    // keys per item
constexpr int kQMax = 16;      // query vectors (rows x heads of a KV head group) per item

struct DecodeItem {
  int prefix;      // index into the prefix table
  int key_begin;   // keys [key_begin, key_end) of that prefix
  int key_end;
  int row0;        // rows [row0, row0 + nrows) of the batch
  int nrows;
};

struct DecodePrefix {
  const bf16* k;  // (len, NKV, HS)
  const bf16* v;
};

// The host-side plan of one call: the tables and where they go in the workspace.
struct Plan {
  std::vector<DecodePrefix> prefixes;
  std::vector<DecodeItem> items;
  std::vector<int> row_ptr;  // (N + 1) CSR over row_refs
  std::vector<int2> row_refs;  // (item, local row)
  int rows_per_item = 1;
};

Plan make_plan(const ExternalKV* ext, int n_ext, int N, int G) {
  Plan p;
  p.rows_per_item = std::max(1, kQMax / G);
  std::vector<std::vector<int2>> per_row(N);
  for (int e = 0; e < n_ext; e++) {
    p.prefixes.push_back(DecodePrefix{ext[e].k, ext[e].v});
    if (ext[e].len == 0 || ext[e].q_begin == ext[e].q_end) continue;
    for (int k0 = 0; k0 < ext[e].len; k0 += kChunk) {
      for (int r0 = ext[e].q_begin; r0 < ext[e].q_end; r0 += p.rows_per_item) {
        DecodeItem it;
        it.prefix = e;
        it.key_begin = k0;
        it.key_end = std::min(ext[e].len, k0 + kChunk);
        it.row0 = r0;
        it.nrows = std::min(p.rows_per_item, ext[e].q_end - r0);
        for (int r = 0; r < it.nrows; r++) per_row[r0 + r].push_back(int2{(int)p.items.size(), r});
        p.items.push_back(it);
      }
    }
  }
  p.row_ptr.assign(1, 0);
  for (int i = 0; i < N; i++) {
    p.row_refs.insert(p.row_refs.end(), per_row[i].begin(), per_row[i].end());
    p.row_ptr.push_back((int)p.row_refs.size());
  }
  return p;
}

// Workspace layout: the tables (one host image, one copy), then the partials.
struct Layout {
  DecodePrefix* prefixes;
  DecodeItem* items;
  int* row_ptr;
  int2* row_refs;
  size_t table_bytes;
  float* m;    // (items, NKV, kQMax)
  float* l;    // (items, NKV, kQMax)
  float* acc;  // (items, NKV, kQMax, HS)
  size_t bytes;

  Layout(const Plan& p, int NKV, int HS, void* base) {
    detail::WorkspaceCarver c(base);
    prefixes = c.take<DecodePrefix>(p.prefixes.size());
    items = c.take<DecodeItem>(p.items.size());
    row_ptr = c.take<int>(p.row_ptr.size());
    row_refs = c.take<int2>(p.row_refs.size());
    table_bytes = c.bytes();
    const size_t slots = p.items.size() * (size_t)NKV * kQMax;
    m = c.take<float>(slots);
    l = c.take<float>(slots);
    acc = c.take<float>(slots * HS);
    bytes = c.bytes();
  }
};

struct PartialParams {
  const bf16* q;  // (N, NH, HS)
  const DecodePrefix* prefixes;
  const DecodeItem* items;
  float* m;
  float* l;
  float* acc;
  int NH, NKV, G;
  float scale;
};

// One item (blockIdx.x) and KV head (blockIdx.y).
template <int HS>
__global__ void __launch_bounds__(kThreads) decode_partial_kernel(PartialParams p) {
  constexpr int KS = HS + 2;  // K row stride in bf16: an odd number of 4-byte words
  __shared__ float q_s[kQMax][HS];
  __shared__ __align__(16) bf16 k_s[kTile][KS];
  __shared__ __align__(16) bf16 v_s[kTile][HS];
  __shared__ float s_s[kQMax][kTile];
  __shared__ float m_s[kQMax], l_s[kQMax], alpha_s[kQMax];
  const int tid = threadIdx.x, lane = tid % detail::kWarp, warp = tid / detail::kWarp;
  const DecodeItem it = p.items[blockIdx.x];
  const int g = blockIdx.y, NKV = p.NKV, G = p.G;
  const int Q = it.nrows * G;  // query vectors: local row r, head g G + gg at r G + gg
  const DecodePrefix pre = p.prefixes[it.prefix];

  for (int e = tid; e < Q * HS; e += kThreads) {
    const int qi = e / HS, d = e % HS;
    const int row = it.row0 + qi / G, h = g * G + qi % G;
    q_s[qi][d] = __bfloat162float(p.q[((int64_t)row * p.NH + h) * HS + d]);
  }
  if (tid < kQMax) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  constexpr int kAcc = kQMax * HS / kThreads;  // accumulators per thread (unused slots stay 0)
  float acc[kAcc];
#pragma unroll
  for (int j = 0; j < kAcc; j++) acc[j] = 0.f;

  for (int t0 = it.key_begin; t0 < it.key_end; t0 += kTile) {
    const int nk = min(kTile, it.key_end - t0);
    __syncthreads();  // the previous tile is consumed; q_s and the stats are written
    // Stage K and V of keys [t0, t0 + nk) for KV head g, 4 bytes a thread.
    for (int w = tid; w < nk * (HS / 2); w += kThreads) {
      const int key = w / (HS / 2), d = 2 * (w % (HS / 2));
      const int64_t off = ((int64_t)(t0 + key) * NKV + g) * HS + d;
      *reinterpret_cast<__nv_bfloat162*>(&k_s[key][d]) = *reinterpret_cast<const __nv_bfloat162*>(pre.k + off);
      *reinterpret_cast<__nv_bfloat162*>(&v_s[key][d]) = *reinterpret_cast<const __nv_bfloat162*>(pre.v + off);
    }
    __syncthreads();
    // Scores of every (query vector, key).
    for (int e = tid; e < Q * kTile; e += kThreads) {
      const int qi = e / kTile, key = e % kTile;
      float s = -INFINITY;
      if (key < nk) {
        float a = 0.f;
#pragma unroll 8
        for (int d = 0; d < HS; d += 2) {
          const float2 kk = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&k_s[key][d]));
          a = fmaf(q_s[qi][d], kk.x, a);
          a = fmaf(q_s[qi][d + 1], kk.y, a);
        }
        s = a * p.scale;
      }
      s_s[qi][key] = s;
    }
    __syncthreads();
    // Online softmax: a warp per query vector.
    for (int qi = warp; qi < Q; qi += kThreads / detail::kWarp) {
      const float a = s_s[qi][lane], b = s_s[qi][lane + 32];
      const float mt = detail::warp_max(fmaxf(a, b));
      const float m_old = m_s[qi], m_new = fmaxf(m_old, mt);
      const float pa = a == -INFINITY ? 0.f : __expf(a - m_new), pb = b == -INFINITY ? 0.f : __expf(b - m_new);
      s_s[qi][lane] = pa;
      s_s[qi][lane + 32] = pb;
      const float sum = detail::warp_sum(pa + pb);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
        alpha_s[qi] = alpha;
        l_s[qi] = l_s[qi] * alpha + sum;
        m_s[qi] = m_new;
      }
    }
    __syncthreads();
    // Weighted values.
#pragma unroll
    for (int j = 0; j < kAcc; j++) {
      const int e = tid + j * kThreads, qi = e / HS, d = e % HS;
      if (qi >= Q) continue;
      float a = acc[j] * alpha_s[qi];
      for (int key = 0; key < nk; key++) a = fmaf(s_s[qi][key], __bfloat162float(v_s[key][d]), a);
      acc[j] = a;
    }
  }
  const int64_t slot0 = ((int64_t)blockIdx.x * NKV + g) * kQMax;
#pragma unroll
  for (int j = 0; j < kAcc; j++) {
    const int e = tid + j * kThreads, qi = e / HS, d = e % HS;
    if (qi < Q) p.acc[(slot0 + qi) * HS + d] = acc[j];
  }
  __syncthreads();
  if (tid < Q) {
    p.m[slot0 + tid] = m_s[tid];
    p.l[slot0 + tid] = l_s[tid];
  }
}

struct MergeParams {
  bf16* out;      // (N, NH, HS)
  float* lse;     // (N, NH)
  const bf16* q;  // (N, NH, HS)
  const bf16* k;  // (N, NKV, HS) own keys
  const bf16* v;
  const int* row_ptr;
  const int2* row_refs;
  const DecodeItem* items;
  const float* m;
  const float* l;
  const float* acc;
  int NH, NKV, G;
  float scale;
};

// Row blockIdx.x, query head blockIdx.y; a thread per head-dim element.
template <int HS>
__global__ void __launch_bounds__(HS) decode_merge_kernel(MergeParams p) {
  __shared__ float red[detail::kWarp];
  const int i = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int g = h / p.G, gg = h % p.G;
  const float qd = __bfloat162float(p.q[((int64_t)i * p.NH + h) * HS + d]);
  const int64_t kv = ((int64_t)i * p.NKV + g) * HS + d;
  const float s_own = detail::block_sum(qd * __bfloat162float(p.k[kv]), red) * p.scale;
  float M = s_own;
  for (int r = p.row_ptr[i]; r < p.row_ptr[i + 1]; r++) {
    const int2 ref = p.row_refs[r];
    M = fmaxf(M, p.m[((int64_t)ref.x * p.NKV + g) * kQMax + ref.y * p.G + gg]);
  }
  const float w_own = __expf(s_own - M);
  float L = w_own, o = w_own * __bfloat162float(p.v[kv]);
  for (int r = p.row_ptr[i]; r < p.row_ptr[i + 1]; r++) {
    const int2 ref = p.row_refs[r];
    const int64_t slot = ((int64_t)ref.x * p.NKV + g) * kQMax + ref.y * p.G + gg;
    const float w = __expf(p.m[slot] - M);
    L = fmaf(p.l[slot], w, L);
    o = fmaf(p.acc[slot * HS + d], w, o);
  }
  p.out[((int64_t)i * p.NH + h) * HS + d] = __float2bfloat16_rn(o / L);
  if (d == 0) p.lse[(int64_t)i * p.NH + h] = M + logf(L);
}

void check_args(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  const char* op = "attention_decode_forward";
  TT_CHECK(N >= 0 && NH > 0 && NKV > 0 && NH % NKV == 0, op, ": expected N >= 0 and NH a positive multiple of NKV, got N=",
           N, " NH=", NH, " NKV=", NKV);
  TT_CHECK(HS == 64 || HS == 128, op, ": head dim HS=", HS, ", expected 64 or 128");
  TT_CHECK(NH / NKV <= kQMax, op, ": ", NH / NKV, " query heads per KV head, at most ", kQMax);
  TT_CHECK(n_ext == 0 || ext != nullptr, op, ": n_ext=", n_ext, " with a null prefix list");
  for (int e = 0; e < n_ext; e++) {
    const ExternalKV& x = ext[e];
    TT_CHECK(x.len >= 0 && 0 <= x.q_begin && x.q_begin <= x.q_end && x.q_end <= N, op, ": prefix ", e, " has len ",
             x.len, " and query range [", x.q_begin, ", ", x.q_end, "), expected len >= 0 and a range within [0, ", N,
             ")");
    TT_CHECK(x.len == 0 || (x.k && x.v && detail::aligned16(x.k) && detail::aligned16(x.v)), op, ": prefix ", e,
             " has a null or unaligned k or v (16 bytes)");
  }
}

}  // namespace

size_t attention_decode_workspace_bytes(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  return Layout(make_plan(ext, n_ext, N, NH / NKV), NKV, HS, nullptr).bytes;
}

void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, Workspace ws, cudaStream_t stream) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  if (N == 0) return;
  TT_CHECK(out && lse && q && k && v, "attention_decode_forward: null tensor");
  const int G = NH / NKV;
  const Plan plan = make_plan(ext, n_ext, N, G);
  const Layout sizes(plan, NKV, HS, nullptr);
  detail::check_workspace(ws, sizes.bytes, "attention_decode_forward");
  const Layout lay(plan, NKV, HS, ws.ptr);
  // The tables' host image at the workspace's offsets; one copy (pageable: staged on return).
  std::vector<char> image(sizes.table_bytes);
  {
    const Layout img(plan, NKV, HS, image.data());
    std::copy(plan.prefixes.begin(), plan.prefixes.end(), img.prefixes);
    std::copy(plan.items.begin(), plan.items.end(), img.items);
    std::copy(plan.row_ptr.begin(), plan.row_ptr.end(), img.row_ptr);
    std::copy(plan.row_refs.begin(), plan.row_refs.end(), img.row_refs);
  }
  TT_CUDA_CHECK(cudaMemcpyAsync(ws.ptr, image.data(), image.size(), cudaMemcpyHostToDevice, stream));
  const float scale = 1.0f / std::sqrt((float)HS);
  auto launch = [&](auto hs) {
    constexpr int kHS = decltype(hs)::value;
    if (!plan.items.empty()) {
      PartialParams pp{q, lay.prefixes, lay.items, lay.m, lay.l, lay.acc, NH, NKV, G, scale};
      decode_partial_kernel<kHS><<<dim3((unsigned)plan.items.size(), NKV), kThreads, 0, stream>>>(pp);
      TT_CUDA_CHECK_LAUNCH();
    }
    MergeParams mp{out, lse, q, k, v, lay.row_ptr, lay.row_refs, lay.items, lay.m, lay.l, lay.acc, NH, NKV, G, scale};
    decode_merge_kernel<kHS><<<dim3(N, NH), kHS, 0, stream>>>(mp);
    TT_CUDA_CHECK_LAUNCH();
  };
  if (HS == 64) {
    launch(std::integral_constant<int, 64>{});
  } else {
    launch(std::integral_constant<int, 128>{});
  }
}

}  // namespace tt::cuda
