// The attention primitive's decode mode (see attention_decode.h): partial-softmax kernel over
// (key chunk, row group, KV head) items, then a merge per (row, query head) with the row's own key.
//
// Item table (built on the host, copied once per call into the workspace): prefix e's keys are cut
// into chunks, its query range into groups of at most rows_per_item rows (so that rows x query
// heads per KV head <= kQMax). The chunk is the smallest power of two >= kTile whose (item, KV
// head) blocks number at most kTargetBlocks: a batch-1 step at 1k context still spreads over the
// GPU (128 blocks of one tile), a long or wide one keeps its partials few. Per item and KV head
// the partial kernel stages each tile of kTile keys with 16-byte loads, the next tile's loads in
// flight while the current one is computed (K padded to an odd word stride, so the score loop
// reads shared memory without bank conflicts; V unpadded, read along the head dim), and keeps for
// each of its Q query vectors the running max m, sum l and the weighted values acc (fp32, online
// softmax). The merge kernel
// takes, for row i and query head h, every item holding row i (a CSR list) and the row's own key:
// M = max(m_j, s_own), out = (sum_j acc_j e^(m_j - M) + e^(s_own - M) v_own) / L,
// L = sum_j l_j e^(m_j - M) + e^(s_own - M), lse = M + log L. Deterministic: fixed orders.
#include "ops/cuda/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"

namespace tt::cuda {
namespace {

constexpr int kThreads = 128;  // partial kernel
constexpr int kTile = 64;      // keys per shared-memory tile, and the smallest chunk
constexpr int kTargetBlocks = 512;  // partial-kernel blocks the chunk size aims at (at most)
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

Plan make_plan(const ExternalKV* ext, int n_ext, int N, int G, int NKV) {
  Plan p;
  p.rows_per_item = std::max(1, kQMax / G);
  int chunk = kTile;
  while (chunk < (1 << 24) && blocks_for(ext, n_ext, p.rows_per_item, NKV, chunk) > kTargetBlocks) chunk *= 2;
  p.chunk = chunk;
  std::vector<std::vector<int2>> per_row(N);
  for (int e = 0; e < n_ext; e++) {
    p.prefixes.push_back(DecodePrefix{ext[e].k, ext[e].v, ext[e].heads});
    if (ext[e].len == 0 || ext[e].q_begin == ext[e].q_end) continue;
    for (int k0 = 0; k0 < ext[e].len; k0 += chunk) {
      for (int r0 = ext[e].q_begin; r0 < ext[e].q_end; r0 += p.rows_per_item) {
        DecodeItem it;
        it.prefix = e;
        it.key_begin = k0;
        it.key_end = std::min(ext[e].len, k0 + chunk);
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
    const size_t slots = p.items.size() * (size_t)NKV * kQMax;
    m = c.take<float>(slots);
    l = c.take<float>(slots);
    acc = c.take<float>(slots * HS);
    bytes = c.bytes();
  }
};

struct PartialParams {
  const bf16* q;  // (N, NH, HS)
  const DecodePrefix* prefixes;  // (n_ext) device table, when n_ext > kDecodeByValue
  DecodePrefix by_value[kDecodeByValue];  // the prefixes, when n_ext <= kDecodeByValue
  int n_by_value;                         // n_ext when the prefixes come by value, else 0
  const DecodeItem* items;
  float* m;
  float* l;
  float* acc;
  int NH, NKV, G;
  float scale;
};

// One item (blockIdx.x) and KV head (blockIdx.y). Keys go through shared memory kTile at a time;
// at head dim 256, half as many, and the query vectors stay bf16 (their values are bf16 anyway),
// so the tiles fit the 48 KB of static shared memory and the tile's K/V registers.
template <int HS>
__global__ void __launch_bounds__(kThreads) decode_partial_kernel(const __grid_constant__ PartialParams p) {
  constexpr int kTileK = HS > 128 ? kTile / 2 : kTile;  // keys per shared-memory tile
  constexpr int kLanesKeys = kTileK / detail::kWarp;     // a lane's keys of a tile in the softmax
  using QT = std::conditional_t<(HS > 128), bf16, float>;
  constexpr int KS = HS + 2;  // K row stride in bf16: an odd number of 4-byte words
  __shared__ QT q_s[kQMax][HS];
  __shared__ __align__(16) bf16 k_s[kTileK][KS];
  detail::pdl_wait();  // q is the previous kernel's output (launched by launch_pdl)
  detail::pdl_trigger();
  __shared__ __align__(16) bf16 v_s[kTileK][HS];
  __shared__ float s_s[kQMax][kTileK];
  __shared__ float m_s[kQMax], l_s[kQMax], alpha_s[kQMax];
  const int tid = threadIdx.x, lane = tid % detail::kWarp, warp = tid / detail::kWarp;
  const DecodeItem it = p.items[blockIdx.x];
  const int g = blockIdx.y, NKV = p.NKV, G = p.G;
  const int Q = it.nrows * G;  // query vectors: local row r, head g G + gg at r G + gg
  const DecodePrefix pre = p.n_by_value ? p.by_value[it.prefix] : p.prefixes[it.prefix];
  const int64_t slot0 = ((int64_t)blockIdx.x * NKV + g) * kQMax;
  if (!((pre.heads >> g) & 1)) {  // outside the prefix's head set: an empty partial (m = -inf, l = 0)
    for (int e = tid; e < Q * HS; e += kThreads) p.acc[slot0 * HS + e] = 0.f;
    if (tid < Q) {
      p.m[slot0 + tid] = -INFINITY;
      p.l[slot0 + tid] = 0.f;
    }
    return;
  }

  for (int e = tid; e < Q * HS; e += kThreads) {
    const int qi = e / HS, d = e % HS;
    const int row = it.row0 + qi / G, h = g * G + qi % G;
    q_s[qi][d] = p.q[((int64_t)row * p.NH + h) * HS + d];
  }
  if (tid < kQMax) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  constexpr int kAcc = kQMax * HS / kThreads;  // accumulators per thread (unused slots stay 0)
  float acc[kAcc];
#pragma unroll
  for (int j = 0; j < kAcc; j++) acc[j] = 0.f;

  // A tile's K and V for KV head g: kLoads 16-byte vectors of each per thread, held in registers
  // from their load (issued a tile ahead) to their store into shared memory.
  constexpr int kVecs = HS / 8;                     // 16-byte vectors per key row
  constexpr int kLoads = kTileK * kVecs / kThreads;  // per thread and tensor
  static_assert(kTileK * kVecs % kThreads == 0, "tile vectors must split evenly over the threads");
  uint4 kr[kLoads], vr[kLoads];
  auto load = [&](int t0, int nk) {
#pragma unroll
    for (int j = 0; j < kLoads; j++) {
      const int w = tid + j * kThreads, key = w / kVecs, c = w % kVecs;
      if (key < nk) {
        const int64_t off = ((int64_t)(t0 + key) * NKV + g) * HS + 8 * c;
        kr[j] = *reinterpret_cast<const uint4*>(pre.k + off);
        vr[j] = *reinterpret_cast<const uint4*>(pre.v + off);
      } else {
        kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  load(it.key_begin, min(kTileK, it.key_end - it.key_begin));
  for (int t0 = it.key_begin; t0 < it.key_end; t0 += kTileK) {
    const int nk = min(kTileK, it.key_end - t0);
    __syncthreads();  // the previous tile is consumed; q_s and the stats are written
#pragma unroll
    for (int j = 0; j < kLoads; j++) {
      const int w = tid + j * kThreads, key = w / kVecs, c = w % kVecs;
      uint32_t* kw = reinterpret_cast<uint32_t*>(&k_s[key][8 * c]);  // 4-byte aligned rows (odd word stride)
      kw[0] = kr[j].x;
      kw[1] = kr[j].y;
      kw[2] = kr[j].z;
      kw[3] = kr[j].w;
      *reinterpret_cast<uint4*>(&v_s[key][8 * c]) = vr[j];
    }
    __syncthreads();
    if (t0 + kTileK < it.key_end) load(t0 + kTileK, min(kTileK, it.key_end - t0 - kTileK));  // in flight meanwhile
    // Scores of every (query vector, key).
    for (int e = tid; e < Q * kTileK; e += kThreads) {
      const int qi = e / kTileK, key = e % kTileK;
      float s = -INFINITY;
      if (key < nk) {
        float a = 0.f;
#pragma unroll 8
        for (int d = 0; d < HS; d += 2) {
          const float2 kk = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&k_s[key][d]));
          a = fmaf((float)q_s[qi][d], kk.x, a);
          a = fmaf((float)q_s[qi][d + 1], kk.y, a);
        }
        s = a * p.scale;
      }
      s_s[qi][key] = s;
    }
    __syncthreads();
    // Online softmax: a warp per query vector.
    for (int qi = warp; qi < Q; qi += kThreads / detail::kWarp) {
      float sv[kLanesKeys], mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < kLanesKeys; c++) {
        sv[c] = s_s[qi][lane + c * detail::kWarp];
        mx = fmaxf(mx, sv[c]);
      }
      const float mt = detail::warp_max(mx);
      const float m_old = m_s[qi], m_new = fmaxf(m_old, mt);
      float part = 0.f;
#pragma unroll
      for (int c = 0; c < kLanesKeys; c++) {
        const float pc = sv[c] == -INFINITY ? 0.f : __expf(sv[c] - m_new);
        s_s[qi][lane + c * detail::kWarp] = pc;
        part += pc;
      }
      const float sum = detail::warp_sum(part);
      __syncwarp();  // every lane has read m_s[qi] before lane 0 rewrites it
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
  detail::pdl_trigger();  // the next kernel (an o_proj GEMV) may start fetching its weights
  detail::pdl_wait();     // the partials
  const int i = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int g = h / p.G, gg = h % p.G;
  const float qd = __bfloat162float(p.q[((int64_t)i * p.NH + h) * HS + d]);
  const int64_t kv = ((int64_t)i * p.NKV + g) * HS + d;
  const float s_own = detail::block_sum(qd * __bfloat162float(p.k[kv]), red) * p.scale;
  float M = s_own;
  const int r0 = p.row_ptr[i], r1 = p.row_ptr[i + 1];
#pragma unroll 8
  for (int r = r0; r < r1; r++) {  // unrolled: the partials' loads overlap
    const int2 ref = p.row_refs[r];
    M = fmaxf(M, p.m[((int64_t)ref.x * p.NKV + g) * kQMax + ref.y * p.G + gg]);
  }
  const float w_own = __expf(s_own - M);
  float L = w_own, o = w_own * __bfloat162float(p.v[kv]);
#pragma unroll 8
  for (int r = r0; r < r1; r++) {
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

size_t AttentionDecodePlan::table_bytes() const { return Tables(impl_->plan, nullptr).bytes; }

size_t AttentionDecodePlan::workspace_bytes() const {
  if (impl_->sig.size() < 5) return 0;
  return CallSpace(impl_->plan, impl_->sig[2], impl_->sig[3], nullptr).bytes;
}

void AttentionDecodePlan::make(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  Impl& m = *impl_;
  m.plan = make_plan(ext, n_ext, N, NH / NKV, NKV);
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

void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, const AttentionDecodePlan& plan, Workspace ws,
                              cudaStream_t stream) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  TT_CHECK(plan.matches(ext, n_ext, N, NH, NKV, HS),
           "attention_decode_forward: the plan was built for other shapes, prefix lengths or query ranges");
  if (N == 0) return;
  TT_CHECK(out && lse && q && k && v, "attention_decode_forward: null tensor");
  const AttentionDecodePlan::Impl& m = *plan.impl_;
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
  pp.NH = NH;
  pp.NKV = NKV;
  pp.G = G;
  pp.scale = 1.0f / std::sqrt((float)HS);
  auto launch = [&](auto hs) {
    constexpr int kHS = decltype(hs)::value;
    if (!m.plan.items.empty()) {
      detail::launch_pdl(decode_partial_kernel<kHS>, dim3((unsigned)m.plan.items.size(), NKV), dim3(kThreads), 0,
                         stream, pp);
      TT_CUDA_CHECK_LAUNCH();
    }
    MergeParams mp{out, lse, q, k, v, m.row_ptr, m.row_refs, m.items, cs.m, cs.l, cs.acc, NH, NKV, G, pp.scale};
    detail::launch_pdl(decode_merge_kernel<kHS>, dim3(N, NH), dim3(kHS), 0, stream, mp);
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

size_t attention_decode_workspace_bytes(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  check_args(ext, n_ext, N, NH, NKV, HS);
  const Plan p = make_plan(ext, n_ext, N, NH / NKV, NKV);
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
