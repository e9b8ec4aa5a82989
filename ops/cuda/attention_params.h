// Kernel arguments of the CUDA tree attention (private to ops/cuda/attention*): one params struct
// of pointers, sizes, 64-bit strides and scalars; the backward struct extends the forward one.
// attention.cc checks shapes, fills them (make_*_params) and dispatches on the head dim; each
// attention_{fwd,bwd}_hdim*.cu instantiates one launcher.
#pragma once

#include <cuda.h>  // CUtensorMap (the struct only; no driver call here)
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ops/cuda/attention.h"

namespace tt::cuda {

struct AttnExtParams {
  const bf16* k;  // (len, NKV, HS)
  const bf16* v;  // (len, NKV, HS)
  float* dk;      // (len, NKV, HS) += in fp32, or null
  float* dv;      // (len, NKV, HS) += in fp32, or null
  int len;
  int q_begin;
  int q_end;
  uint64_t heads;  // bit g: KV head g reads it (ExternalKV::heads)
};

// Tensor maps (TMA descriptors) of the kernels, filled by attention.cc (tensor_map): 3-D views
// (HS, heads, rows) of a (rows, heads, HS) bf16 tensor, boxes of 64 columns x 1 head x `box rows`,
// 128-byte swizzle, rows past the end read as zeros.
// Key boxes are one forward key tile: 128 rows, 64 at head dim 256 (sm90::FwdConfig::BN).
constexpr int tma_key_rows(int HS) { return HS > 128 ? 64 : 128; }
constexpr int kTmaQueryRows = 64;  // = sm90::BwdConfig::BM
struct AttnTmaps {
  CUtensorMap k, v;                   // tree K, V: boxes of tma_key_rows(HS) rows (a forward key tile)
  CUtensorMap ext_k[kMaxExternalKV];  // prefix K, V: likewise
  CUtensorMap ext_v[kMaxExternalKV];
  CUtensorMap q, dout;                // Q, dO: boxes of 64 rows (a backward query step; the
                                      // forward's 128-row Q tile is two)
};

struct AttnFwdParams {
  const bf16* q;  // (N, NH, HS)
  const bf16* k;  // (N, NKV, HS)
  const bf16* v;  // (N, NKV, HS)
  bf16* out;      // (N, NH, HS)
  float* lse;     // (N, NH)
  // Element strides between consecutive tokens and heads; the last dim is contiguous.
  int64_t q_row_stride, q_head_stride;
  int64_t k_row_stride, k_head_stride;  // also v and the external prefixes
  int64_t o_row_stride, o_head_stride;  // also dout and dq
  int n, nh, nkv, group;                // group = NH / NKV
  float scale;                          // 1 / sqrt(HS)
  float scale_log2;                     // scale * log2(e)
  TreeTiles tiles;
  int n_ext;
  AttnExtParams ext[kMaxExternalKV];
  AttnTmaps tm;
  int fwd_items;  // forward: (query tile, head) items per block, run back to back
};

// Kernel parameters past 4 KB need CUDA 12.1+ (the toolkit here: 13.0); 32764 bytes is the limit.
static_assert(sizeof(AttnFwdParams) <= 32764, "attention forward parameters past CUDA's kernel limit");

// The forward's (query tile of 128 rows, head) items and blocks.
constexpr int kFwdItemRows = 128;  // = sm90::FwdConfig::BM
__host__ __device__ inline int fwd_items_total(const AttnFwdParams& p) {
  return p.nh * ((p.n + kFwdItemRows - 1) / kFwdItemRows);
}
inline int fwd_blocks(const AttnFwdParams& p) { return (fwd_items_total(p) + p.fwd_items - 1) / p.fwd_items; }

struct AttnBwdParams : AttnFwdParams {
  const bf16* dout;  // (N, NH, HS)
  bf16* dq;          // (N, NH, HS)
  bf16* dk;          // (N, NKV, HS)
  bf16* dv;          // (N, NKV, HS)
  float* dq_accum;   // fp32, unscaled dS K sums: blocked (dq_blocked = 1), or (n_pad, NH, HS)
  float* lse_log2;   // (NH, n_pad) lse * log2(e); 0 on padding rows
  float* dsum;       // (NH, n_pad) D = dout . out; 0 on padding rows
  int n_pad;         // N rounded up to kRowPad
  int dq_blocked;    // 1 (what the backward writes): (NH, n_pad / 64, 2, 4, HS / 16, 32, 4), per
                     // 64-query block, two halves of the head dim (one per warpgroup), 4 warps of 16 rows, in wgmma
                     // accumulator order (a warp's vector reductions are contiguous); 0: row-major,
                     // which no kernel writes (removing the field would move the parameter offsets
                     // the backward kernel's machine code reads)
  int key_tiles;     // virtual key tiles of the backward (prefix tiles, then tree tiles)
  int head_group;    // KV heads per group of the backward's launch order (bwd_block_work)
};
static_assert(sizeof(AttnBwdParams) <= 32764, "attention backward parameters past CUDA's kernel limit");

// Items per block of the forward: a block's next item loads while it finishes one. H200,
// 2026-11-30 (docs/BENCHMARKS.md): 4 items 607-629 TF/s forward vs 575-609 with 1 on comb and
// causal, 2 in between; the rollouts +2-4% with 2 or 4.
constexpr int kFwdItemsPerBlock = 4;

// The backward launches KV heads in groups of NKV / kBwdHeadGroupDiv, each group's key tiles in
// order (heads fastest inside a group): the blocks running at once share their queries' Q/dO
// and dq_accum rows with more of their neighbours than with every head at once (the rollout
// streamed Q/dO and dq_accum from DRAM about 20 times over), while the tiles seen by the most
// queries of a group still start early enough (simulated on the public trees: no tail with 2).
constexpr int kBwdHeadGroupDiv = 2;
inline int bwd_head_group(int nkv) { return nkv >= kBwdHeadGroupDiv ? nkv / kBwdHeadGroupDiv : 1; }

// Rows of the (NH, n_pad) backward buffers: a multiple of every query tile.
constexpr int kRowPad = 128;

// Fills the params of a dense (N, heads, HS) layout; prefixes of no keys, or read by none of the
// NKV heads, are dropped (nothing to read, nothing to add). Shapes are checked by the caller (attention.cc).
// The tensor maps the kernels read, made by encode(base, rows, heads, HS, box_rows) ->
// CUtensorMap (attention.cc: the driver's encoder; the CPU emulation test: its own). Forward: Q,
// K, V and every prefix's K, V; backward: Q and dO.
template <class Encode>
void set_fwd_tensor_maps(AttnFwdParams& p, int HS, Encode&& encode) {
  p.tm.q = encode(p.q, p.n, p.nh, HS, kTmaQueryRows);
  const int key_rows = tma_key_rows(HS);
  p.tm.k = encode(p.k, p.n, p.nkv, HS, key_rows);
  p.tm.v = encode(p.v, p.n, p.nkv, HS, key_rows);
  for (int e = 0; e < p.n_ext; e++) {
    p.tm.ext_k[e] = encode(p.ext[e].k, p.ext[e].len, p.nkv, HS, key_rows);
    p.tm.ext_v[e] = encode(p.ext[e].v, p.ext[e].len, p.nkv, HS, key_rows);
  }
}
template <class Encode>
void set_bwd_tensor_maps(AttnBwdParams& p, int HS, Encode&& encode) {
  p.tm.q = encode(p.q, p.n, p.nh, HS, kTmaQueryRows);
  p.tm.dout = encode(p.dout, p.n, p.nh, HS, kTmaQueryRows);
}

inline AttnFwdParams make_fwd_params(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                     const TreeTiles& tiles, const ExternalKV* ext, int n_ext, int N, int NH,
                                     int NKV, int HS) {
  AttnFwdParams p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.q_row_stride = (int64_t)NH * HS;
  p.q_head_stride = HS;
  p.k_row_stride = (int64_t)NKV * HS;
  p.k_head_stride = HS;
  p.o_row_stride = (int64_t)NH * HS;
  p.o_head_stride = HS;
  p.n = N;
  p.nh = NH;
  p.nkv = NKV;
  p.group = NH / NKV;
  p.scale = (float)(1.0 / std::sqrt((double)HS));
  p.scale_log2 = (float)(1.4426950408889634 / std::sqrt((double)HS));
  p.tiles = tiles;
  p.fwd_items = kFwdItemsPerBlock;
  p.n_ext = 0;
  for (int e = 0; e < n_ext; e++) {
    if (ext[e].len == 0 || (ext[e].heads & all_kv_heads(NKV)) == 0) continue;
    p.ext[p.n_ext++] = AttnExtParams{ext[e].k,     ext[e].v,       ext[e].dk,    ext[e].dv,
                                     ext[e].len,   ext[e].q_begin, ext[e].q_end, ext[e].heads};
  }
  return p;
}

inline size_t bwd_align_up(size_t x) { return (x + 255) / 256 * 256; }

// Scratch of the backward: dq_accum (n_pad * NH * HS), lse_log2 and dsum (NH, n_pad), 256-byte
// aligned.
inline size_t bwd_workspace_bytes(int N, int NH, int HS) {
  if (N <= 0) return 0;
  const int n_pad = (N + kRowPad - 1) / kRowPad * kRowPad;
  return bwd_align_up((size_t)n_pad * NH * HS * sizeof(float)) + 2 * bwd_align_up((size_t)NH * n_pad * sizeof(float));
}

// The forward's params (out and lse as the backward's inputs) plus the gradients and scratch.
inline AttnBwdParams make_bwd_params(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                                     const float* lse, const bf16* q, const bf16* k, const bf16* v,
                                     const TreeTiles& tiles, const ExternalKV* ext, int n_ext, int N, int NH,
                                     int NKV, int HS, void* workspace) {
  AttnBwdParams p{};
  static_cast<AttnFwdParams&>(p) =
      make_fwd_params(const_cast<bf16*>(out), const_cast<float*>(lse), q, k, v, tiles, ext, n_ext, N, NH, NKV, HS);
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.n_pad = (N + kRowPad - 1) / kRowPad * kRowPad;
  char* base = static_cast<char*>(workspace);
  p.dq_accum = reinterpret_cast<float*>(base);
  base += bwd_align_up((size_t)p.n_pad * NH * HS * sizeof(float));
  p.lse_log2 = reinterpret_cast<float*>(base);
  base += bwd_align_up((size_t)NH * p.n_pad * sizeof(float));
  p.dsum = reinterpret_cast<float*>(base);
  return p;
}

// The backward's key tiles of BN keys and launch-order head groups (bwd_block_work); its grid is
// key_tiles * nkv blocks.
inline void set_bwd_schedule(AttnBwdParams& p, int BN) {
  p.key_tiles = (p.n + BN - 1) / BN;
  for (int e = 0; e < p.n_ext; ++e) p.key_tiles += (p.ext[e].len + BN - 1) / BN;
  p.head_group = bwd_head_group(p.nkv);
}

// Threads of attention_dq_convert_kernel for p's dq_accum layout.
inline int64_t dq_convert_threads(const AttnBwdParams& p, int HS) {
  return p.dq_blocked ? (int64_t)p.nh * p.n_pad * HS / 16 : (int64_t)p.n * p.nh * HS / 8;
}

template <int HS>
void run_attention_fwd(const AttnFwdParams& p, cudaStream_t stream);
template <int HS>
void run_attention_bwd(const AttnBwdParams& p, cudaStream_t stream);

}  // namespace tt::cuda
