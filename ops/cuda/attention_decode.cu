// The attention primitive's decode mode (see attention_decode.h): partial-softmax kernel over
// (key chunk, row group, KV head) items, then a merge per (row, query head) with the row's own key.
//
// Item table (built on the host, copied once per call into the workspace): prefix e's keys are cut
// into chunks, its query range into groups of at most rows_per_item rows (so that rows x query
// heads per KV head <= kQMax, one m16 tile). The chunk is the smallest power of two >= kTile whose
// (item, KV head) blocks number at most kTargetBlocks: a batch-1 step at 1k context still spreads
// over the GPU (128 blocks of one tile), a long or wide one keeps its partials few. Per item and
// KV head the partial kernel streams the chunk's keys through shared memory by cp.async, a tile of
// kTile keys in flight while the previous one is computed (the first before the PDL wait: a step's
// kernels never write the prefixes it reads), and computes S = Q K^T and P V on tensor cores, each
// of its four warps over 16 keys of a tile with its own online softmax (max m, sum l, weighted
// values acc, fp32), the warps' partials combined at the end. The merge kernel takes, for row i
// and query head h, every item holding row i (a CSR list) and the row's own key:
// M = max(m_j, s_own), out = (sum_j acc_j e^(m_j - M) + e^(s_own - M) v_own) / L,
// L = sum_j l_j e^(m_j - M) + e^(s_own - M), lse = M + log L. Deterministic: fixed orders.
// Roundings: P to bf16 before P V (as in the tree kernels; l sums the fp32 P), then out.
// Clustered plans (every row group's items one thread-block cluster of at most kMaxCluster blocks):
// the partial blocks keep (m, l, acc) in shared memory and merge them across the cluster with the
// same formula, each block a slice of the group's output elements; no merge kernel runs.
#include "ops/cuda/attention_decode.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "ops/cuda/attention_device.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/qk_norm_rope_row.cuh"
#include "ops/cuda/mma_sm80.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 128;  // partial kernel
constexpr int kWarps = kThreads / detail::kWarp;
constexpr int kTile = 64;      // keys per shared-memory tile (16 per warp), and the smallest chunk
constexpr int kStages = 2;     // tile buffers: one tile in flight while one is computed
constexpr int kTargetBlocks = 512;  // partial-kernel blocks the chunk size aims at (at most)
constexpr int kQMax = 16;      // query vectors (rows x heads of a KV head group) per item: one m16 tile
constexpr int kRowPad = 8;     // elements past HS in a shared-memory row (16 bytes of bf16: ldmatrix without conflicts)
constexpr int kMaxCluster = 16;  // blocks of a merging cluster (above 8: non-portable, checked per device)
constexpr int kClusterTiles = 2;  // a clustered plan doubles its chunk up to this many tiles to fit a cluster

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
  uint64_t heads;  // the KV heads that read it (ExternalKV::heads)
};

// The host-side plan of one call: the tables and where they go in the workspace.
struct Plan {
  std::vector<DecodePrefix> prefixes;
  std::vector<DecodeItem> items;
  std::vector<int> row_ptr;  // (N + 1) CSR over row_refs
  std::vector<int2> row_refs;  // (item, local row)
  int rows_per_item = 1;
  int chunk = kTile;  // keys per item
  int cluster = 0;    // > 0: each row group's items are `cluster` consecutive ones, merged in a cluster
};

// Partial-kernel blocks of a chunk size: (chunks x row groups) per visible prefix, x NKV.
int64_t blocks_for(const ExternalKV* ext, int n_ext, int rows_per_item, int NKV, int64_t chunk) {
  int64_t items = 0;
  for (int e = 0; e < n_ext; e++) {
    if (ext[e].len == 0 || ext[e].q_begin == ext[e].q_end) continue;
    const int64_t groups = (ext[e].q_end - ext[e].q_begin + rows_per_item - 1) / rows_per_item;
    items += (ext[e].len + chunk - 1) / chunk * groups;
  }
  return items * NKV;
}

// The clustered layout's query ranges: when the ranges of the prefixes that hold keys are, pair by
// pair, equal or disjoint and cover every row, the distinct ones in order of first appearance, each
// with the prefixes that have it; else empty (a row's partials then come from prefixes of other
// row groupings, or a row reads only its own key: the merge kernel's general case).
using Ranges = std::vector<std::pair<int2, std::vector<int>>>;  // (q range, its prefixes)

Ranges cluster_ranges(const ExternalKV* ext, int n_ext, int N) {
  Ranges ranges;
  std::vector<char> covered(N, 0);
  for (int e = 0; e < n_ext; e++) {
    if (ext[e].len == 0 || ext[e].q_begin == ext[e].q_end) continue;
    const int2 r{ext[e].q_begin, ext[e].q_end};
    bool found = false;
    for (auto& x : ranges) {
      if (x.first.x == r.x && x.first.y == r.y) {
        x.second.push_back(e);
        found = true;
      } else if (r.x < x.first.y && x.first.x < r.y) {
        return {};  // overlapping, not equal
      }
    }
    if (!found) ranges.push_back({r, {e}});
    for (int i = r.x; i < r.y; i++) covered[i] = 1;
  }
  for (int i = 0; i < N; i++)
    if (!covered[i]) return {};
  return ranges;
}

// Items a row group of each range has at a chunk size (the clustered layout's cluster size).
int cluster_items(const Ranges& ranges, const ExternalKV* ext, int chunk) {
  int64_t most = 0;
  for (const auto& r : ranges) {
    int64_t n = 0;
    for (int e : r.second) n += (ext[e].len + chunk - 1) / chunk;
    most = std::max(most, n);
  }
  return (int)std::min<int64_t>(most, INT32_MAX);
}

Plan make_plan(const ExternalKV* ext, int n_ext, int N, int G, int NKV, int max_cluster) {
  Plan p;
  p.rows_per_item = std::max(1, kQMax / G);
  int chunk = kTile;
  while (chunk < (1 << 24) && blocks_for(ext, n_ext, p.rows_per_item, NKV, chunk) > kTargetBlocks) chunk *= 2;
  // Clustered when a row group's items fit one cluster with chunks of at most kClusterTiles tiles,
  // the chunk doubled to get there (a batch-1 step at ~1k context: 8 + 1 items of 128 keys); longer
  // contexts and wide batches keep their chunks and the merge kernel.
  // (Measured on an H200, docs/BENCHMARKS.md: chunks grown by 16 keys instead, 14 items of 80 at
  // ~1k, were no faster; a batch of 32 separate prompts clustered at its 512-key chunks was slower
  // than the merge kernel, 3.68-3.76 vs 3.57-3.62 ms a step.)
  Ranges ranges;
  if (chunk <= kClusterTiles * kTile) ranges = cluster_ranges(ext, n_ext, N);
  if (!ranges.empty()) {
    int c = chunk, n = cluster_items(ranges, ext, c);
    while (n > max_cluster && c < kClusterTiles * kTile) n = cluster_items(ranges, ext, c *= 2);
    if (n <= max_cluster) {
      chunk = c;
      p.cluster = n;
    }
  }
  p.chunk = chunk;
  for (int e = 0; e < n_ext; e++) p.prefixes.push_back(DecodePrefix{ext[e].k, ext[e].v, ext[e].heads});
  // Prefix e's items: each chunk of its keys with each row group starting in [r_begin, r_end).
  auto add_items = [&](int e, int r_begin, int r_end) {
    for (int k0 = 0; k0 < ext[e].len; k0 += chunk)
      for (int r0 = r_begin; r0 < r_end; r0 += p.rows_per_item)
        p.items.push_back(DecodeItem{e, k0, std::min(ext[e].len, k0 + chunk), r0,
                                     std::min(p.rows_per_item, ext[e].q_end - r0)});
  };
  if (p.cluster) {  // each row group's items consecutive, padded with empty ones to the cluster size
    for (const auto& r : ranges)
      for (int r0 = r.first.x; r0 < r.first.y; r0 += p.rows_per_item) {
        const size_t first = p.items.size();
        for (int e : r.second) add_items(e, r0, r0 + 1);
        while (p.items.size() < first + p.cluster) {
          DecodeItem pad = p.items[first];
          pad.key_begin = pad.key_end = 0;
          p.items.push_back(pad);
        }
      }
  } else {
    for (int e = 0; e < n_ext; e++)
      if (ext[e].q_begin < ext[e].q_end) add_items(e, ext[e].q_begin, ext[e].q_end);
  }
  std::vector<std::vector<int2>> per_row(N);
  for (size_t it = 0; it < p.items.size(); it++)
    for (int r = 0; r < p.items[it].nrows; r++) per_row[p.items[it].row0 + r].push_back(int2{(int)it, r});
  p.row_ptr.assign(1, 0);
  for (int i = 0; i < N; i++) {
    p.row_refs.insert(p.row_refs.end(), per_row[i].begin(), per_row[i].end());
    p.row_ptr.push_back((int)p.row_refs.size());
  }
  return p;
}

// The tables' layout (one host image, one copy), and the per-call workspace: the prefix
// pointer table (past kDecodeByValue prefixes), then the partials.
struct Tables {
  DecodeItem* items;
  int* row_ptr;
  int2* row_refs;
  size_t bytes;

  Tables(const Plan& p, void* base) {
    detail::WorkspaceCarver c(base);
    items = c.take<DecodeItem>(p.items.size());
    row_ptr = c.take<int>(p.row_ptr.size());
    row_refs = c.take<int2>(p.row_refs.size());
    bytes = c.bytes();
  }
};

struct CallSpace {
  DecodePrefix* prefixes;  // (n_ext) when n_ext > kDecodeByValue
  float* m;    // (items, NKV, kQMax)
  float* l;    // (items, NKV, kQMax)
  float* acc;  // (items, NKV, kQMax, HS)
  size_t bytes;

  CallSpace(const Plan& p, int NKV, int HS, void* base) {
    detail::WorkspaceCarver c(base);
    prefixes = c.take<DecodePrefix>(p.prefixes.size() > (size_t)kDecodeByValue ? p.prefixes.size() : 0);
    const size_t slots = p.cluster ? 0 : p.items.size() * (size_t)NKV * kQMax;  // clustered: in shared memory
    m = c.take<float>(slots);
    l = c.take<float>(slots);
    acc = c.take<float>(slots * HS);
    bytes = c.bytes();
  }
};

struct MergeParams {
  bf16* out;      // (N, NH, HS)
  float* lse;     // (N, NH)
  const bf16* q;  // (N, NH, HS)
  const bf16* k;  // (N, NKV, HS) own keys
  const bf16* v;
  const int* row_ptr;
  const int2* row_refs;
  const float* m;
  const float* l;
  const float* acc;
  int NH, NKV, G;
  float scale;
};

constexpr int kMergeThreads = 128;
constexpr int kMergeWarps = kMergeThreads / detail::kWarp;

// Row blockIdx.x, query head blockIdx.y; kMergeThreads threads. The row's partials are taken
// kMergeThreads at a time: a thread reads one partial's m and l (its weight e^(m - M) to shared
// memory), then each warp sums a quarter of them with 16-byte loads (a warp covers 128 elements of
// a partial's acc row), all its loads independent, and the warps' sums meet in shared memory.
template <int HS>
__global__ void __launch_bounds__(kMergeThreads) decode_merge_kernel(const __grid_constant__ MergeParams p) {
  constexpr int kChunks = (HS / 4 + detail::kWarp - 1) / detail::kWarp;  // float4s per lane and partial
  constexpr int kUnroll = HS == 64 ? 4 : 8;  // partials in flight per warp (8 spills at HS 64)
  __shared__ float red[detail::kWarp];
  __shared__ float w_s[kMergeThreads];
  __shared__ int64_t slot_s[kMergeThreads];
  __shared__ __align__(16) float o_s[kMergeWarps][HS];
  detail::pdl_trigger();  // the next kernel (an o_proj GEMV) may start fetching its weights
  const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid % detail::kWarp;
  const int warp = tid / detail::kWarp, g = h / p.G, gg = h % p.G;
  // The CSR tables were uploaded before the step's kernels: read before the wait.
  const int r0 = p.row_ptr[i], n = p.row_ptr[i + 1] - r0;
  auto slot_of = [&p, r0, g, gg](int r) {  // partial slot of the row's r-th partial
    const int2 ref = p.row_refs[r0 + r];
    return ((int64_t)ref.x * p.NKV + g) * kQMax + ref.y * p.G + gg;
  };
  const int64_t slot_first = tid < n ? slot_of(tid) : 0;
  detail::pdl_wait();  // the partials, q and the own k, v
  const int64_t own = ((int64_t)i * p.NKV + g) * HS;
  float qk = 0.f;
  for (int d = tid; d < HS; d += kMergeThreads)
    qk += __bfloat162float(p.q[((int64_t)i * p.NH + h) * HS + d]) * __bfloat162float(p.k[own + d]);
  const float m_first = tid < n ? p.m[slot_first] : -INFINITY;
  const float l_first = tid < n ? p.l[slot_first] : 0.f;
  float mx = m_first;
  for (int r = kMergeThreads + tid; r < n; r += kMergeThreads) mx = fmaxf(mx, p.m[slot_of(r)]);
  const float s_own = detail::block_sum(qk, red) * p.scale;
  const float M = fmaxf(s_own, detail::block_max(mx, red));
  float L = 0.f;
  float4 o[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; c++) o[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int base = 0; base < n; base += kMergeThreads) {
    float w = 0.f;
    int64_t slot = 0;
    if (base + tid < n) {
      slot = base == 0 ? slot_first : slot_of(base + tid);
      w = __expf((base == 0 ? m_first : p.m[slot]) - M);  // a partial of no keys (m = -inf) weighs 0
      L = fmaf(base == 0 ? l_first : p.l[slot], w, L);
    }
    __syncthreads();  // the previous round's weights are read
    w_s[tid] = w;
    slot_s[tid] = slot;
    __syncthreads();
    const int cnt = min(kMergeThreads, n - base);
#pragma unroll(kUnroll)
    for (int j = warp; j < cnt; j += kMergeWarps) {
      const float* a = p.acc + slot_s[j] * HS;
      const float wj = w_s[j];
#pragma unroll
      for (int c = 0; c < kChunks; c++) {
        const int e = 4 * (lane + detail::kWarp * c);
        if (e < HS) {
          const float4 x = *reinterpret_cast<const float4*>(a + e);
          o[c].x = fmaf(x.x, wj, o[c].x);
          o[c].y = fmaf(x.y, wj, o[c].y);
          o[c].z = fmaf(x.z, wj, o[c].z);
          o[c].w = fmaf(x.w, wj, o[c].w);
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    const int e = 4 * (lane + detail::kWarp * c);
    if (e < HS) *reinterpret_cast<float4*>(&o_s[warp][e]) = o[c];
  }
  const float w_own = __expf(s_own - M);
  L = detail::block_sum(L, red) + w_own;  // its barriers also order o_s
  for (int d = tid; d < HS; d += kMergeThreads) {
    float a = w_own * __bfloat162float(p.v[own + d]);
#pragma unroll
    for (int w = 0; w < kMergeWarps; w++) a += o_s[w][d];
    p.out[((int64_t)i * p.NH + h) * HS + d] = __float2bfloat16_rn(a / L);
  }
  if (tid == 0) p.lse[(int64_t)i * p.NH + h] = M + logf(L);
}

struct PartialParams {
  const bf16* q;  // (N, NH, HS)
  const DecodePrefix* prefixes;  // (n_ext) device table, when n_ext > kDecodeByValue
  DecodePrefix by_value[kDecodeByValue];  // the prefixes, when n_ext <= kDecodeByValue
  int n_by_value;                         // n_ext when the prefixes come by value, else 0
  const DecodeItem* items;
  float* m;  // the partials (the merge kernel's input; unused when clustered)
  float* l;
  float* acc;
  bf16* out;  // clustered: the merged rows (N, NH, HS) and lse (N, NH), and the rows' own keys
  float* lse;
  const bf16* k_own;  // (N, NKV, HS)
  const bf16* v_own;
  int NH, NKV, G;
  float scale;
  DecodeQkNorm norm;  // clustered, norm.q_pre set: q and k_own are normalized here (see load_qk_norm)
};

// The clustered kernel's query vectors (q_s rows < Q; zero past them) and own key rows (ko_s) from
// q_pre / k_pre through the q/k norm and RoPE (qk_norm_rope_row: the q/k norm kernel's values);
// the cluster's first block (store) also writes q, k, their rstd and the cache rows. LANES lanes a
// vector, every lane of a warp in each pass (the row function shuffles).
template <int HS>
__device__ __forceinline__ void load_qk_norm(const PartialParams& p, const DecodeItem& it, int g, bool store,
                                             bf16* q_s, bf16* ko_s) {
  constexpr int KS = HS + kRowPad, LANES = HS / 8, kPerWarp = detail::kWarp / LANES;
  const DecodeQkNorm& n = p.norm;
  const int G = p.G, Q = it.nrows * G, n_vec = Q + it.nrows;
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp, sub = lane % LANES;
  for (int e = threadIdx.x; e < (kQMax - Q) * (HS / 8); e += kThreads)  // rows past the item's vectors
    *reinterpret_cast<uint4*>(q_s + (Q + e / (HS / 8)) * KS + 8 * (e % (HS / 8))) = make_uint4(0, 0, 0, 0);
  for (int base = warp * kPerWarp; base < n_vec; base += kWarps * kPerWarp) {
    const int vi = base + lane / LANES;
    const bool valid = vi < n_vec, is_q = vi < Q;
    const int row = it.row0 + (is_q ? vi / G : vi - Q);
    const int64_t hrow = is_q ? (int64_t)row * p.NH + g * G + vi % G : (int64_t)row * p.NKV + g;  // (row, head)
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float2 cs[8];
    if (valid) detail::load_bf16<8>(v, (is_q ? n.q_pre : n.k_pre) + hrow * HS + 8 * sub);
    detail::load_cos_sin<LANES>(cs, n.rope_cs + (int64_t)(valid ? row : 0) * (HS / 2), sub);
    const float rs = detail::qk_norm_rope_row<LANES>(v, cs, is_q ? n.q_w : n.k_w, n.w_offset, n.eps, sub);
    if (!valid) continue;
    detail::store_bf16<8>((is_q ? q_s + vi * KS : ko_s + (vi - Q) * KS) + 8 * sub, v);
    if (!store) continue;
    detail::store_bf16<8>((is_q ? n.q : n.k) + hrow * HS + 8 * sub, v);
    if (sub == 0) (is_q ? n.q_rstd : n.k_rstd)[hrow] = rs;
    if (!is_q && n.store_k) {  // the cache rows (qk_norm_rope_pair's layout)
      const int64_t dst = ((int64_t)n.store_rows[row] * p.NKV + g) * HS + 8 * sub;
      detail::store_bf16<8>(n.store_k + dst, v);
      *reinterpret_cast<uint4*>(n.store_v + dst) = *reinterpret_cast<const uint4*>(p.v_own + hrow * HS + 8 * sub);
    }
  }
}

// Bytes of dynamic shared memory of the partial kernel: K and V tile buffers, the item's query
// rows, and (clustered) its rows' own keys and values.
template <int HS, bool kCluster>
constexpr size_t partial_smem_bytes() {
  return sizeof(bf16) * (size_t)(2 * kStages * kTile + (kCluster ? 3 : 1) * kQMax) * (HS + kRowPad);
}

// One item (blockIdx.x) and KV head (blockIdx.y), four warps. The item's keys pass through shared
// memory kTile at a time (cp.async into kStages buffers, all of them issued before the PDL wait,
// since no kernel of a decode step writes the prefixes it reads; each next tile issued as soon as
// its buffer is computed). Each warp takes 16 keys of a tile: S = Q K^T for the item's query
// vectors (rows of one m16 tile, rows >= Q zero) and P V on tensor cores (mma m16n8k16, bf16 in,
// fp32 out), with its own online softmax (m, l per row); at the end the four warps' partials are
// combined in shared memory into the item's (m, l, acc). Rows of K, V and Q are padded by 16 bytes
// so that ldmatrix reads them without bank conflicts.
// kCluster: the blocks of a row group's items form one thread-block cluster (consecutive
// blockIdx.x); each keeps its partial in shared memory and, after a cluster barrier, merges a
// slice of the group's output elements from every block's partial (distributed shared memory) and
// the rows' own keys, the merge kernel's formula (no merge kernel, no partials in global memory).
template <int HS, bool kCluster>
__global__ void __launch_bounds__(kThreads) decode_partial_kernel(const __grid_constant__ PartialParams p) {
  constexpr int KS = HS + kRowPad;  // row stride of the K, V and Q tiles (bf16)
  constexpr int kVecs = HS / 8;     // 16-byte vectors per key row
  constexpr int kLoads = kTile * kVecs / kThreads;  // per thread, tensor and tile
  static_assert(kTile * kVecs % kThreads == 0 && kTile == 16 * kWarps, "a warp takes 16 keys of a tile");
  constexpr int OS = HS + kRowPad;  // row stride of the fp32 combine buffer
  static_assert(kWarps * kQMax * OS * 4 <= 2 * kStages * kTile * KS * 2, "the combine buffer reuses the tiles");
  extern __shared__ __align__(16) unsigned char decode_smem[];
  bf16* k_s = reinterpret_cast<bf16*>(decode_smem);  // (kStages, kTile, KS)
  bf16* v_s = k_s + kStages * kTile * KS;            // (kStages, kTile, KS)
  bf16* q_s = v_s + kStages * kTile * KS;            // (kQMax, KS)
  bf16* ko_s = q_s + kQMax * KS;                     // kCluster: (kQMax, KS) the rows' own keys
  bf16* vo_s = ko_s + kQMax * KS;                    // and values
  __shared__ float m_w[kWarps][kQMax], l_w[kWarps][kQMax];
  const int tid = threadIdx.x, lane = tid % detail::kWarp, warp = tid / detail::kWarp;
  const int gq = lane / 4, tq = lane % 4;  // a fragment's row (and row + 8) and column pair
  // The item table and the prefixes' K/V are no kernel of this step's output: read before the wait.
  const DecodeItem it = p.items[blockIdx.x];
  const int g = blockIdx.y, NKV = p.NKV, G = p.G;
  const int Q = it.nrows * G;  // query vectors: local row r, head g G + gg at r G + gg
  const DecodePrefix pre = p.n_by_value ? p.by_value[it.prefix] : p.prefixes[it.prefix];
  const int64_t slot0 = ((int64_t)blockIdx.x * NKV + g) * kQMax;
  const bool reads = (pre.heads >> g) & 1;  // else outside the prefix's head set: an empty partial
  const int n_keys = it.key_end - it.key_begin, n_tiles = reads ? (n_keys + kTile - 1) / kTile : 0;
  auto load_tile = [&](int t) {  // tile t into buffer t % kStages; keys past the item zero-filled
    const int t0 = it.key_begin + t * kTile, nk = min(kTile, it.key_end - t0);
    bf16* ks = k_s + (t % kStages) * kTile * KS;
    bf16* vs = v_s + (t % kStages) * kTile * KS;
#pragma unroll
    for (int j = 0; j < kLoads; j++) {
      const int w = tid + j * kThreads, key = w / kVecs, c = w % kVecs;
      const bool in = key < nk;
      const int64_t off = ((int64_t)(t0 + (in ? key : 0)) * NKV + g) * HS + 8 * c;
      attn::cp_async_16(ks + key * KS + 8 * c, pre.k + off, in ? 16 : 0);
      attn::cp_async_16(vs + key * KS + 8 * c, pre.v + off, in ? 16 : 0);
    }
  };
#pragma unroll
  for (int t = 0; t < kStages; t++) {
    if (t < n_tiles) load_tile(t);
    attn::cp_async_commit();
  }
  detail::pdl_wait();  // q is the previous kernel's output (launched by launch_pdl)
  detail::pdl_trigger();
  if (!kCluster && !reads) {  // m = -inf, l = 0 (written after the wait: the previous layer's merge read them)
    for (int e = tid; e < Q * HS; e += kThreads) p.acc[slot0 * HS + e] = 0.f;
    if (tid < Q) {
      p.m[slot0 + tid] = -INFINITY;
      p.l[slot0 + tid] = 0.f;
    }
    return;
  }
  bool fused = false;
  if constexpr (kCluster) {
    fused = p.norm.q_pre != nullptr;
    if (fused) load_qk_norm<HS>(p, it, g, cooperative_groups::this_cluster().block_rank() == 0, q_s, ko_s);
  }
  if (!fused) {
    for (int e = tid; e < kQMax * kVecs; e += kThreads) {  // Q rows, zero past the item's vectors
      const int qi = e / kVecs, c = e % kVecs;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (qi < Q) {
        const int row = it.row0 + qi / G, h = g * G + qi % G;
        x = *reinterpret_cast<const uint4*>(p.q + ((int64_t)row * p.NH + h) * HS + 8 * c);
      }
      *reinterpret_cast<uint4*>(q_s + qi * KS + 8 * c) = x;
    }
  }
  if constexpr (kCluster) {  // the rows' own keys (unless normalized above) and values (the merge's last term)
    for (int e = tid; e < it.nrows * kVecs; e += kThreads) {
      const int r = e / kVecs, c = e % kVecs;
      const int64_t off = ((int64_t)(it.row0 + r) * NKV + g) * HS + 8 * c;
      if (!fused) *reinterpret_cast<uint4*>(ko_s + r * KS + 8 * c) = *reinterpret_cast<const uint4*>(p.k_own + off);
      *reinterpret_cast<uint4*>(vo_s + r * KS + 8 * c) = *reinterpret_cast<const uint4*>(p.v_own + off);
    }
  }

  // This warp's state: o[j] holds dims 8 j + 2 tq (+1) of rows gq ([0], [1]) and gq + 8 ([2], [3]);
  // m and l of rows gq and gq + 8 (l summed over this thread's columns only until the end).
  float o[HS / 8][4];
#pragma unroll
  for (int j = 0; j < HS / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
  for (int t = 0; t < n_tiles; t++) {
    attn::cp_async_wait<kStages - 1>();
    __syncthreads();  // tile t has landed for every thread (and q)
    const int nk = min(kTile, n_keys - t * kTile) - 16 * warp;  // this warp's keys in the tile
    if (nk > 0) {
      const bf16* ks = k_s + (t % kStages) * kTile * KS + 16 * warp * KS;
      const bf16* vs = v_s + (t % kStages) * kTile * KS + 16 * warp * KS;
      // S (16 rows x 16 keys): s[n] holds keys 8 n + 2 tq (+1) of rows gq and gq + 8.
      float s[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4], b[4];
        mma::ldsm_x4(a, q_s + (lane % 8 + 8 * (lane / 8 % 2)) * KS + 16 * kk + 8 * (lane / 16));
        mma::ldsm_x4(b, ks + (lane % 8 + 8 * (lane / 16)) * KS + 16 * kk + 8 * (lane / 8 % 2));
        mma::mma_16816(s[0], a, b[0], b[1]);
        mma::mma_16816(s[1], a, b[2], b[3]);
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const float x = 8 * n + 2 * tq + (c & 1) < nk ? s[n][c] * p.scale : -INFINITY;
          s[n][c] = x;
          mx[c / 2] = fmaxf(mx[c / 2], x);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {  // key 0 of the warp's keys is valid: the new max is finite
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m_r[r], mx[r]);
        alpha[r] = __expf(m_r[r] - m_new);  // 0 while m_r is -inf
        m_r[r] = m_new;
        l_r[r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < 2; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          s[n][c] = __expf(s[n][c] - m_r[c / 2]);  // masked keys: exp(-inf) = 0
          l_r[c / 2] += s[n][c];
        }
      // P (16 rows x 16 keys) as the A fragment of P V; V's fragments by transposing loads.
      const uint32_t pa[4] = {attn::pack_bf16x2(s[0][0], s[0][1]), attn::pack_bf16x2(s[0][2], s[0][3]),
                              attn::pack_bf16x2(s[1][0], s[1][1]), attn::pack_bf16x2(s[1][2], s[1][3])};
#pragma unroll
      for (int j = 0; j < HS / 8; j++) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
      }
#pragma unroll
      for (int jj = 0; jj < HS / 16; jj++) {
        uint32_t b[4];
        mma::ldsm_x4_trans(b, vs + (lane % 8 + 8 * (lane / 8 % 2)) * KS + 16 * jj + 8 * (lane / 16));
        mma::mma_16816(o[2 * jj], pa, b[0], b[1]);
        mma::mma_16816(o[2 * jj + 1], pa, b[2], b[3]);
      }
    }
    if (t + kStages < n_tiles) {
      __syncthreads();  // every warp is done with tile t's buffer
      load_tile(t + kStages);
    }
    attn::cp_async_commit();
  }

  // Combine the warps: M = max_w m_w, acc = sum_w o_w e^(m_w - M), l = sum_w l_w e^(m_w - M).
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
    l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
  }
  if (tq == 0) {
    m_w[warp][gq] = m_r[0];
    m_w[warp][gq + 8] = m_r[1];
    l_w[warp][gq] = l_r[0];
    l_w[warp][gq + 8] = l_r[1];
  }
  attn::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the tiles (their buffers become o_s) and its stats are stored
  float* o_s = reinterpret_cast<float*>(decode_smem);  // (kWarps, kQMax, OS)
  float f[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, m_w[w][gq + 8 * r]);
    f[r] = m_r[r] == -INFINITY ? 0.f : __expf(m_r[r] - M);
  }
  float* ow = o_s + warp * kQMax * OS;
#pragma unroll
  for (int j = 0; j < HS / 8; j++) {
    *reinterpret_cast<float2*>(ow + gq * OS + 8 * j + 2 * tq) = make_float2(o[j][0] * f[0], o[j][1] * f[0]);
    *reinterpret_cast<float2*>(ow + (gq + 8) * OS + 8 * j + 2 * tq) = make_float2(o[j][2] * f[1], o[j][3] * f[1]);
  }
  __syncthreads();
  // The block's partial: acc into global memory, or (clustered) into warp 0's rows of o_s (each
  // element read and written by one thread).
  for (int e = tid; e < Q * HS; e += kThreads) {
    const int qi = e / HS, d = e % HS;
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) a += o_s[(w * kQMax + qi) * OS + d];
    if constexpr (kCluster) o_s[qi * OS + d] = a;
    else p.acc[(slot0 + qi) * HS + d] = a;
  }
  __shared__ float m_b[kQMax], l_b[kQMax];
  if (tid < Q) {
    float M = -INFINITY, L = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, m_w[w][tid]);
#pragma unroll
    for (int w = 0; w < kWarps; w++)
      if (m_w[w][tid] != -INFINITY) L += l_w[w][tid] * __expf(m_w[w][tid] - M);
    if constexpr (kCluster) {
      m_b[tid] = M;
      l_b[tid] = L;
    } else {
      p.m[slot0 + tid] = M;
      p.l[slot0 + tid] = L;
    }
  }
  if constexpr (kCluster) {
    // The merge (as decode_merge_kernel): M = max(s_own, m_j), L = sum_j l_j e^(m_j - M) +
    // e^(s_own - M), out = (e^(s_own - M) v_own + sum_j acc_j e^(m_j - M)) / L, j over the cluster's
    // blocks in rank order. s_own of each query vector: one warp a vector, from shared memory.
    __shared__ float s_own[kQMax], w_s[kMaxCluster][kQMax], wo_s[kQMax], L_s[kQMax];
    for (int qi = warp; qi < Q; qi += kWarps) {
      float qk = 0.f;
      for (int d = lane; d < HS; d += detail::kWarp)
        qk += __bfloat162float(q_s[qi * KS + d]) * __bfloat162float(ko_s[qi / G * KS + d]);
      qk = detail::warp_sum(qk);
      if (lane == 0) s_own[qi] = qk * p.scale;
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    cluster.sync();  // every block's partial and s_own are in its shared memory
    if (tid < Q) {
      float mj[kMaxCluster];
#pragma unroll
      for (int j = 0; j < kMaxCluster; j++) mj[j] = j < C ? *cluster.map_shared_rank(&m_b[tid], j) : -INFINITY;
      float M = s_own[tid];
#pragma unroll
      for (int j = 0; j < kMaxCluster; j++) M = fmaxf(M, mj[j]);
      float L = 0.f;
#pragma unroll
      for (int j = 0; j < kMaxCluster; j++) {
        if (j >= C) break;
        const float w = __expf(mj[j] - M);  // a partial of no keys (m = -inf) weighs 0
        w_s[j][tid] = w;
        L = fmaf(*cluster.map_shared_rank(&l_b[tid], j), w, L);
      }
      wo_s[tid] = __expf(s_own[tid] - M);
      L += wo_s[tid];
      L_s[tid] = L;
      if (rank == 0) p.lse[(int64_t)(it.row0 + tid / G) * p.NH + g * G + tid % G] = M + logf(L);
    }
    __syncthreads();
    const int total = Q * HS, per = (total + C - 1) / C, end = min(total, (rank + 1) * per);
    for (int e = rank * per + tid; e < end; e += kThreads) {
      const int qi = e / HS, d = e % HS;
      float a = wo_s[qi] * __bfloat162float(vo_s[qi / G * KS + d]);
#pragma unroll 4
      for (int j = 0; j < C; j++) a = fmaf(*cluster.map_shared_rank(o_s + qi * OS + d, j), w_s[j][qi], a);
      p.out[((int64_t)(it.row0 + qi / G) * p.NH + g * G + qi % G) * HS + d] = __float2bfloat16_rn(a / L_s[qi]);
    }
    cluster.sync();  // no block leaves while another reads its shared memory
  }
}

void check_args(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  const char* op = "attention_decode_forward";
  TT_CHECK(N >= 0 && NH > 0 && NKV > 0 && NH % NKV == 0, op, ": expected N >= 0 and NH a positive multiple of NKV, got N=",
           N, " NH=", NH, " NKV=", NKV);
  TT_CHECK(HS == 64 || HS == 128 || HS == 256, op, ": head dim HS=", HS, ", expected 64, 128 or 256");
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

// The clustered kernel's attributes on the current device (set once per device).
template <int HS>
void set_cluster_attributes(int cluster) {
  auto* kernel = decode_partial_kernel<HS, true>;
  detail::opt_in_smem(kernel, partial_smem_bytes<HS, true>());
  if (cluster > 8)
    detail::set_attribute_once(reinterpret_cast<const void*>(kernel), cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

// Whether the current device co-schedules a cluster of this many clustered partial blocks (more
// than 8 is non-portable; the blocks' shared memory decides how many fit a GPC). Cached per device.
bool cluster_fits(int HS, int cluster) {
  return detail::once_per_device(std::make_pair(HS, cluster), [&] {
    int n = 0;
    auto query = [&](auto hs) {
      constexpr int kHS = decltype(hs)::value;
      set_cluster_attributes<kHS>(cluster);
      const detail::LaunchConfig c(dim3(cluster), dim3(kThreads), partial_smem_bytes<kHS, true>(), nullptr, cluster,
                                   /*pdl=*/false);
      TT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, decode_partial_kernel<kHS, true>, &c.cfg));
    };
    if (HS == 64) query(std::integral_constant<int, 64>{});
    else if (HS == 128) query(std::integral_constant<int, 128>{});
    else query(std::integral_constant<int, 256>{});
    return n > 0;
  });
}

// make_plan with the largest cluster the device takes: 16 blocks, else 8 (portable), else none.
Plan plan_for(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  Plan p = make_plan(ext, n_ext, N, NH / NKV, NKV, kMaxCluster);
  if (p.cluster > 8 && !cluster_fits(HS, p.cluster)) p = make_plan(ext, n_ext, N, NH / NKV, NKV, 8);
  if (p.cluster > 0 && !cluster_fits(HS, p.cluster)) p = make_plan(ext, n_ext, N, NH / NKV, NKV, 0);
  return p;
}

}  // namespace

struct AttentionDecodePlan::Impl {
  Plan plan;
  std::vector<int> sig;  // N, NH, NKV, HS, n_ext, then (len, q_begin, q_end) per prefix
  const DecodeItem* items = nullptr;
  const int* row_ptr = nullptr;
  const int2* row_refs = nullptr;
  std::vector<char> image;  // the tables' host image (kept until the copy has surely run)
};

namespace {

std::vector<int> signature(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  std::vector<int> s = {N, NH, NKV, HS, n_ext};
  for (int e = 0; e < n_ext; e++) s.insert(s.end(), {ext[e].len, ext[e].q_begin, ext[e].q_end});
  return s;
}

}  // namespace

AttentionDecodePlan::AttentionDecodePlan() : impl_(std::make_unique<Impl>()) {}
AttentionDecodePlan::~AttentionDecodePlan() = default;
AttentionDecodePlan::AttentionDecodePlan(AttentionDecodePlan&&) noexcept = default;
AttentionDecodePlan& AttentionDecodePlan::operator=(AttentionDecodePlan&&) noexcept = default;

bool AttentionDecodePlan::matches(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) const {
  return impl_->items != nullptr && impl_->sig == signature(ext, n_ext, N, NH, NKV, HS);
}

int AttentionDecodePlan::cluster_size() const { return impl_->plan.cluster; }

size_t AttentionDecodePlan::table_bytes() const { return Tables(impl_->plan, nullptr).bytes; }

size_t AttentionDecodePlan::workspace_bytes() const {
  if (impl_->sig.size() < 5) return 0;
  return CallSpace(impl_->plan, impl_->sig[2], impl_->sig[3], nullptr).bytes;
}

void AttentionDecodePlan::make(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  Impl& m = *impl_;
  m.plan = plan_for(ext, n_ext, N, NH, NKV, HS);
  m.sig = signature(ext, n_ext, N, NH, NKV, HS);
  m.items = nullptr;
}

void AttentionDecodePlan::upload(void* tables, cudaStream_t stream) {
  Impl& m = *impl_;
  TT_CHECK(m.sig.size() >= 5, "AttentionDecodePlan::upload before make");
  const Tables sizes(m.plan, nullptr);
  TT_CHECK(tables != nullptr || sizes.bytes == 0, "AttentionDecodePlan::build: null table storage");
  m.image.assign(sizes.bytes, 0);
  const Tables img(m.plan, m.image.data());
  std::copy(m.plan.items.begin(), m.plan.items.end(), img.items);
  std::copy(m.plan.row_ptr.begin(), m.plan.row_ptr.end(), img.row_ptr);
  std::copy(m.plan.row_refs.begin(), m.plan.row_refs.end(), img.row_refs);
  // Pageable source: staged before the call returns (the image also outlives it).
  if (sizes.bytes) TT_CUDA_CHECK(cudaMemcpyAsync(tables, m.image.data(), sizes.bytes, cudaMemcpyHostToDevice, stream));
  const Tables dev(m.plan, tables);
  m.items = dev.items;
  m.row_ptr = dev.row_ptr;
  m.row_refs = dev.row_refs;
}

namespace {

// Both forms of attention_decode_forward with a plan (norm: the fused q/k norm, or null; its
// arguments checked by the caller).
void decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const DecodeQkNorm* norm,
                    const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS,
                    const AttentionDecodePlan::Impl& m, Workspace ws, cudaStream_t stream) {
  const int G = NH / NKV;
  const CallSpace sizes(m.plan, NKV, HS, nullptr);
  detail::check_workspace(ws, sizes.bytes, "attention_decode_forward");
  const CallSpace cs(m.plan, NKV, HS, ws.ptr);
  PartialParams pp{};
  pp.q = q;
  if (n_ext <= kDecodeByValue) {
    for (int e = 0; e < n_ext; e++) pp.by_value[e] = DecodePrefix{ext[e].k, ext[e].v, ext[e].heads};
    pp.n_by_value = n_ext;
  } else {  // a table of this layer's pointers (pageable: staged before the call returns)
    std::vector<DecodePrefix> table(n_ext);
    for (int e = 0; e < n_ext; e++) table[e] = DecodePrefix{ext[e].k, ext[e].v, ext[e].heads};
    TT_CUDA_CHECK(cudaMemcpyAsync(cs.prefixes, table.data(), sizeof(DecodePrefix) * n_ext, cudaMemcpyHostToDevice,
                                  stream));
    pp.prefixes = cs.prefixes;
  }
  pp.items = m.items;
  pp.m = cs.m;
  pp.l = cs.l;
  pp.acc = cs.acc;
  pp.out = out;
  pp.lse = lse;
  pp.k_own = k;
  pp.v_own = v;
  pp.NH = NH;
  pp.NKV = NKV;
  pp.G = G;
  pp.scale = 1.0f / std::sqrt((float)HS);
  if (norm) pp.norm = *norm;
  const MergeParams mp{out, lse, q, k, v, m.row_ptr, m.row_refs, cs.m, cs.l, cs.acc, NH, NKV, G, pp.scale};
  auto launch = [&](auto hs) {
    constexpr int kHS = decltype(hs)::value;
    if (m.plan.cluster) {  // each row group's items one cluster: partials merged in place
      set_cluster_attributes<kHS>(m.plan.cluster);
      detail::launch_pdl_cluster(decode_partial_kernel<kHS, true>, m.plan.cluster,
                                 dim3((unsigned)m.plan.items.size(), NKV), dim3(kThreads),
                                 partial_smem_bytes<kHS, true>(), stream, pp);
      TT_CUDA_CHECK_LAUNCH();
      return;
    }
    if (!m.plan.items.empty()) {
      constexpr size_t smem = partial_smem_bytes<kHS, false>();
      detail::opt_in_smem(decode_partial_kernel<kHS, false>, smem);  // above the default 48 KB
      detail::launch_pdl(decode_partial_kernel<kHS, false>, dim3((unsigned)m.plan.items.size(), NKV), dim3(kThreads),
                         smem, stream, pp);
      TT_CUDA_CHECK_LAUNCH();
    }
    detail::launch_pdl(decode_merge_kernel<kHS>, dim3(N, NH), dim3(kMergeThreads), 0, stream, mp);
    TT_CUDA_CHECK_LAUNCH();
  };
  if (HS == 64) {
    launch(std::integral_constant<int, 64>{});
  } else if (HS == 128) {
    launch(std::integral_constant<int, 128>{});
  } else {
    launch(std::integral_constant<int, 256>{});
  }
}

}  // namespace

void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, const AttentionDecodePlan& plan, Workspace ws,
                              cudaStream_t stream) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  TT_CHECK(plan.matches(ext, n_ext, N, NH, NKV, HS),
           "attention_decode_forward: the plan was built for other shapes, prefix lengths or query ranges");
  if (N == 0) return;
  TT_CHECK(out && lse && q && k && v, "attention_decode_forward: null tensor");
  TT_CHECK(detail::aligned16(q), "attention_decode_forward: q is not 16-byte aligned");
  decode_forward(out, lse, q, k, v, nullptr, ext, n_ext, N, NH, NKV, HS, *plan.impl_, ws, stream);
}

void attention_decode_forward(bf16* out, float* lse, const DecodeQkNorm& n, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, const AttentionDecodePlan& plan, Workspace ws,
                              cudaStream_t stream) {
  const char* op = "attention_decode_forward (q/k norm)";
  check_args(ext, n_ext, N, NH, NKV, HS);
  TT_CHECK(plan.matches(ext, n_ext, N, NH, NKV, HS), op,
           ": the plan was built for other shapes, prefix lengths or query ranges");
  TT_CHECK(plan.cluster_size() > 0, op, ": the plan is not clustered (cluster_size() 0): run qk_norm_rope_pair first");
  if (N == 0) return;
  TT_CHECK(out && lse && v && n.q && n.q_rstd && n.q_pre && n.q_w && n.k && n.k_rstd && n.k_pre && n.k_w && n.rope_cs,
           op, ": null tensor");
  TT_CHECK(n.eps >= 0, op, ": eps=", n.eps, ", expected >= 0");
  TT_CHECK(!n.store_k || (n.store_v && n.store_rows), op, ": store_k without store_v or store_rows");
  for (const void* ptr : {(const void*)n.q, (const void*)n.q_pre, (const void*)n.q_w, (const void*)n.k,
                          (const void*)n.k_pre, (const void*)n.k_w, (const void*)v, (const void*)n.store_k,
                          (const void*)n.store_v})
    TT_CHECK(!ptr || detail::aligned16(ptr), op, ": a row tensor or norm weight is not 16-byte aligned");
  decode_forward(out, lse, n.q, n.k, v, &n, ext, n_ext, N, NH, NKV, HS, *plan.impl_, ws, stream);
}

size_t attention_decode_workspace_bytes(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  const Plan p = plan_for(ext, n_ext, N, NH, NKV, HS);
  return Tables(p, nullptr).bytes + CallSpace(p, NKV, HS, nullptr).bytes;
}

void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, Workspace ws, cudaStream_t stream) {
  AttentionDecodePlan plan;
  plan.make(ext, n_ext, N, NH, NKV, HS);
  const size_t t = plan.table_bytes();
  detail::check_workspace(ws, t + plan.workspace_bytes(), "attention_decode_forward");
  plan.upload(ws.ptr, stream);
  attention_decode_forward(out, lse, q, k, v, ext, n_ext, N, NH, NKV, HS, plan,
                           Workspace{static_cast<char*>(ws.ptr) + t, ws.bytes - t}, stream);
  // The plan's host image must outlive the pageable copy's staging, which the copy call did.
}

}  // namespace tt::cuda
